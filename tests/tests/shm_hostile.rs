//! Hostile shared-memory clients against a real agent and real test workers
//! (tracker issue 11, findings 1 and 5):
//!
//! - a client that truncates and re-extends its registered shm file while it
//!   sends requests gets clean errors; the agent (which copies for a
//!   `--no-shm` worker) and a worker that reads shm itself stay up — no
//!   `SIGBUS`, no restart — and another client keeps getting answers; the
//!   same for `identity`, which the worker serves by copying the input
//!   window into a mapping of the output window (issue 27);
//! - one client at its per-connection region limit, or the agent at its
//!   global one, gets `RESOURCE_EXHAUSTED` naming the limit while others
//!   still register and infer;
//! - a worker whose region table is full makes the agent copy inline rather
//!   than fail the request.
//!
//! The hostile client is this test process: it owns the shm file (plain file
//! I/O, never a mapping, so the truncation cannot fault the test itself).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{
    InferParameter, ModelInferRequest, SystemSharedMemoryRegisterRequest,
};
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
use infermesh_tests::{Agent, dense, process_alive, testworker};
use tonic::Code;
use tonic::transport::Channel;

/// Bytes of one `dense` row in and out.
const ROW_IN: u64 = 16 * 4;
const ROW_OUT: u64 = 4 * 4;

/// A file in /dev/shm owned by this test, removed on drop.
struct ShmFile {
    key: String,
    path: PathBuf,
    file: File,
}

impl ShmFile {
    fn create(tag: &str, len: u64) -> Self {
        let key = format!("/infermesh-hostile-{}-{tag}", std::process::id());
        let path = PathBuf::from(format!("/dev/shm{key}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("create shm file");
        file.set_len(len).unwrap();
        ShmFile { key, path, file }
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn int(v: u64) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v as i64)),
    }
}

fn string(v: &str) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(v.into())),
    }
}

/// What the hostile client asks for: `dense` (the worker reads the input
/// and writes the output through the descriptors) or `identity` (the
/// worker `pread`s the input window into its mapping of the output window).
#[derive(Clone, Copy)]
enum Served {
    Dense,
    Identity,
}

impl Served {
    fn model(self) -> &'static str {
        match self {
            Served::Dense => "dense",
            Served::Identity => "identity",
        }
    }

    /// Rows the hostile client sends: `identity`'s windows are 1 MiB, so
    /// that its copies take long enough for truncations to land in them.
    fn rows(self) -> u64 {
        match self {
            Served::Dense => 64,
            Served::Identity => 16384,
        }
    }

    /// Bytes of one output row.
    fn row_out(self) -> u64 {
        match self {
            Served::Dense => ROW_OUT,
            Served::Identity => ROW_IN,
        }
    }

    fn expected(self, input: &[f32]) -> Vec<f32> {
        match self {
            Served::Dense => dense::forward(input),
            Served::Identity => input.to_vec(),
        }
    }
}

/// A request for `served` of `rows` rows with INPUT0 at offset 0 of
/// `input_region` and OUTPUT0 at offset 0 of `output_region`.
fn shm_request(
    served: Served,
    rows: u64,
    input_region: &str,
    output_region: &str,
) -> ModelInferRequest {
    let params = |region: &str, size: u64| {
        [
            ("shared_memory_region".to_string(), string(region)),
            ("shared_memory_offset".to_string(), int(0)),
            ("shared_memory_byte_size".to_string(), int(size)),
        ]
        .into_iter()
        .collect()
    };
    ModelInferRequest {
        model_name: served.model().into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 16],
            parameters: params(input_region, rows * ROW_IN),
            contents: None,
        }],
        outputs: vec![InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            parameters: params(output_region, rows * served.row_out()),
        }],
        ..Default::default()
    }
}

async fn register(
    client: &mut GrpcInferenceServiceClient<Channel>,
    name: &str,
    key: &str,
    offset: u64,
    byte_size: u64,
) -> Result<(), tonic::Status> {
    client
        .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
            name: name.into(),
            key: key.into(),
            offset,
            byte_size,
        })
        .await
        .map(|_| ())
}

/// The agent's resident set size in KiB, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Sends `count` inline requests on a connection of its own, each checked.
async fn good_requests(agent: &Agent, count: usize) -> usize {
    let mut client = agent.client().await;
    let mut ok = 0;
    for i in 0..count {
        let input = dense::input(2, i as u32);
        let resp = client
            .model_infer(dense::request(&input, true))
            .await
            .expect("a good client's request succeeds");
        assert_eq!(dense::output(&resp.into_inner()).0, dense::forward(&input));
        ok += 1;
    }
    ok
}

async fn truncating_client_cannot_crash(worker_flags: &str, tag: &str, served: Served) {
    let agent = Agent::builder()
        .worker(testworker(worker_flags))
        .start()
        .await;
    let before = agent.status().await.workers[0].clone();
    let rss_before = rss_kib(agent.pid());

    let rows = served.rows();
    let len = rows * (ROW_IN + served.row_out());
    let shm = ShmFile::create(tag, len);
    let input = dense::input(rows as usize, 3);
    shm.file.write_all_at(&f32_to_raw(&input), 0).unwrap();
    let mut bad = agent.client().await;
    register(&mut bad, "in", &shm.key, 0, rows * ROW_IN)
        .await
        .unwrap();
    register(
        &mut bad,
        "out",
        &shm.key,
        rows * ROW_IN,
        rows * served.row_out(),
    )
    .await
    .unwrap();
    // A clean request first: the path works before the abuse.
    let resp = bad
        .model_infer(shm_request(served, rows, "in", "out"))
        .await
        .expect("a clean shared-memory request");
    assert!(resp.into_inner().raw_output_contents[0].is_empty());
    let mut out = vec![0u8; (rows * served.row_out()) as usize];
    shm.file.read_exact_at(&mut out, rows * ROW_IN).unwrap();
    assert_eq!(raw_to_f32(&out).unwrap(), served.expected(&input));

    let stop = Arc::new(AtomicBool::new(false));
    let truncator = {
        let (file, stop) = (shm.file.try_clone().unwrap(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut cycles = 0u64;
            while !stop.load(Ordering::Relaxed) {
                file.set_len(0).unwrap();
                file.set_len(len).unwrap();
                cycles += 1;
                std::thread::yield_now();
            }
            cycles
        })
    };
    let good = tokio::spawn({
        let agent_oip = agent.oip;
        async move {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{agent_oip}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = GrpcInferenceServiceClient::new(ch);
            let mut ok = 0;
            for i in 0..200u32 {
                let input = dense::input(2, i);
                let resp = client
                    .model_infer(dense::request(&input, true))
                    .await
                    .expect("a good client's request succeeds during the abuse");
                assert_eq!(dense::output(&resp.into_inner()).0, dense::forward(&input));
                ok += 1;
            }
            ok
        }
    });
    let (mut answered, mut refused) = (0, 0);
    for _ in 0..400 {
        match bad
            .model_infer(shm_request(served, rows, "in", "out"))
            .await
        {
            Ok(_) => answered += 1,
            Err(s) => {
                assert_eq!(
                    s.code(),
                    Code::InvalidArgument,
                    "the truncating client gets a clean error, not {s:?}"
                );
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let cycles = truncator.join().unwrap();
    assert_eq!(good.await.unwrap(), 200);

    assert!(process_alive(agent.pid()), "the agent is alive");
    let after = agent.status().await.workers[0].clone();
    assert_eq!(
        (after.pid, after.restarts, after.state.as_str()),
        (before.pid, before.restarts, "ready"),
        "the worker neither died nor restarted: last exit '{}', fault '{}'",
        after.last_exit,
        after.last_fault
    );
    assert!(process_alive(after.pid), "the worker is alive");
    assert_eq!(good_requests(&agent, 5).await, 5);
    eprintln!(
        "hostile truncation ({tag}): {answered} answered, {refused} INVALID_ARGUMENT, \
         {cycles} truncate/extend cycles; agent RSS {rss_before} KiB -> {} KiB",
        rss_kib(agent.pid())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncating_client_cannot_crash_an_agent_that_copies() {
    truncating_client_cannot_crash("--no-shm", "copy", Served::Dense).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncating_client_cannot_crash_a_worker_that_reads_shm() {
    truncating_client_cannot_crash("", "pass", Served::Dense).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncating_client_cannot_crash_a_worker_that_copies_between_its_regions() {
    truncating_client_cannot_crash(
        "--model dense --model identity",
        "identity",
        Served::Identity,
    )
    .await;
}

#[tokio::test]
async fn region_limits_leave_room_for_other_clients() {
    let agent = Agent::builder()
        .config(format!(
            "[shm]\nmax_regions_per_connection = 3\nmax_regions = 5\n\
             [[workers]]\ncommand = \"{}\"\n",
            testworker("")
        ))
        .start()
        .await;
    let rss_before = rss_kib(agent.pid());
    let shm = ShmFile::create("limits", 4096);
    let input = dense::input(1, 1);
    shm.file.write_all_at(&f32_to_raw(&input), 0).unwrap();

    let mut greedy = agent.client().await;
    for i in 0..3 {
        register(&mut greedy, &format!("r{i}"), &shm.key, 0, 4096)
            .await
            .unwrap();
    }
    let err = register(&mut greedy, "r3", &shm.key, 0, 4096)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("max_regions_per_connection"),
        "{err:?}"
    );

    // Another connection still registers and infers through shm.
    let mut other = agent.client().await;
    register(&mut other, "in", &shm.key, 0, 1024).await.unwrap();
    register(&mut other, "out", &shm.key, 1024, 1024)
        .await
        .unwrap();
    other
        .model_infer(shm_request(Served::Dense, 1, "in", "out"))
        .await
        .expect("the other client infers");
    let mut out = vec![0u8; ROW_OUT as usize];
    shm.file.read_exact_at(&mut out, 1024).unwrap();
    assert_eq!(raw_to_f32(&out).unwrap(), dense::forward(&input));

    // Five regions in all: the next connection meets the global limit.
    let mut third = agent.client().await;
    let err = register(&mut third, "x", &shm.key, 0, 64)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("(max_regions)"), "{err:?}");
    // It can still infer inline.
    assert_eq!(good_requests(&agent, 3).await, 3);

    // Closing the greedy connection frees its regions for others.
    drop(greedy);
    infermesh_tests::eventually("the greedy connection's regions are freed", || {
        let oip = agent.oip;
        let key = shm.key.clone();
        async move {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{oip}"))
                .ok()?
                .connect()
                .await
                .ok()?;
            let mut c = GrpcInferenceServiceClient::new(ch);
            register(&mut c, "x", &key, 0, 64).await.ok()
        }
    })
    .await;
    eprintln!(
        "region limits: agent RSS {rss_before} KiB -> {} KiB",
        rss_kib(agent.pid())
    );
}

#[tokio::test]
async fn a_full_worker_table_means_inline_copies_not_failures() {
    // The worker takes one region per connection; the agent registers every
    // client's regions over its one connection to the worker.
    let agent = Agent::builder()
        .worker(testworker("--max-shm-regions 1"))
        .start()
        .await;
    let shm = ShmFile::create("table", 4096);
    let input = dense::input(2, 5);
    shm.file.write_all_at(&f32_to_raw(&input), 0).unwrap();
    let mut clients = Vec::new();
    for c in 0..3 {
        let mut client = agent.client().await;
        register(&mut client, "in", &shm.key, 0, 2 * ROW_IN)
            .await
            .unwrap();
        let at = 1024 + c * 1024;
        register(&mut client, "out", &shm.key, at, 2 * ROW_OUT)
            .await
            .unwrap();
        clients.push((client, at));
    }
    for (client, at) in &mut clients {
        let resp = client
            .model_infer(shm_request(Served::Dense, 2, "in", "out"))
            .await
            .expect("a full worker table does not fail the request");
        assert!(resp.into_inner().raw_output_contents[0].is_empty());
        let mut out = vec![0u8; (2 * ROW_OUT) as usize];
        shm.file.read_exact_at(&mut out, *at).unwrap();
        assert_eq!(raw_to_f32(&out).unwrap(), dense::forward(&input));
    }
}

/// One hostile request shape, repeated, for the table in docs/HARDENING.md.
#[derive(Debug, Clone, Copy)]
enum Case {
    KeyOutsideShm,
    SymlinkKey,
    OverflowingWindow,
    HugeRegionName,
    WindowPastEndOfFile,
    UnknownRegion,
    OffsetPastWindow,
    NegativeShmSize,
    NegativeDimension,
    HugeTensorName,
    OutputWindowTooSmall,
}

impl Case {
    const ALL: [Case; 11] = [
        Case::KeyOutsideShm,
        Case::SymlinkKey,
        Case::OverflowingWindow,
        Case::HugeRegionName,
        Case::WindowPastEndOfFile,
        Case::UnknownRegion,
        Case::OffsetPastWindow,
        Case::NegativeShmSize,
        Case::NegativeDimension,
        Case::HugeTensorName,
        Case::OutputWindowTooSmall,
    ];

    async fn run(
        self,
        c: &mut GrpcInferenceServiceClient<Channel>,
        key: &str,
        link: &str,
    ) -> tonic::Status {
        let infer = |req: ModelInferRequest| {
            let mut c = c.clone();
            async move { c.model_infer(req).await.map(|_| ()) }
        };
        let result = match self {
            Case::KeyOutsideShm => register(c, "x", "/../../etc/passwd", 0, 16).await,
            Case::SymlinkKey => register(c, "x", link, 0, 16).await,
            Case::OverflowingWindow => register(c, "x", key, u64::MAX, 2).await,
            Case::HugeRegionName => register(c, &"n".repeat(1 << 20), key, 0, 16).await,
            Case::WindowPastEndOfFile => register(c, "x", key, 0, 1 << 20).await,
            Case::UnknownRegion => infer(shm_request(Served::Dense, 1, "nope", "nope")).await,
            Case::OffsetPastWindow => {
                let mut req = shm_request(Served::Dense, 1, "in", "out");
                req.inputs[0]
                    .parameters
                    .insert("shared_memory_offset".into(), int(1 << 40));
                infer(req).await
            }
            Case::NegativeShmSize => {
                let mut req = shm_request(Served::Dense, 1, "in", "out");
                req.inputs[0].parameters.insert(
                    "shared_memory_byte_size".into(),
                    InferParameter {
                        parameter_choice: Some(ParameterChoice::Int64Param(-64)),
                    },
                );
                infer(req).await
            }
            Case::NegativeDimension => {
                let mut req = dense::request(&dense::input(1, 0), true);
                req.inputs[0].shape = vec![-1, 16];
                infer(req).await
            }
            Case::HugeTensorName => {
                let mut req = dense::request(&dense::input(1, 0), true);
                req.inputs[0].name = "t".repeat(64 << 10);
                infer(req).await
            }
            Case::OutputWindowTooSmall => {
                let mut req = shm_request(Served::Dense, 1, "in", "out");
                req.outputs[0]
                    .parameters
                    .insert("shared_memory_byte_size".into(), int(ROW_OUT - 1));
                infer(req).await
            }
        };
        result.expect_err("a hostile request is refused")
    }
}

#[tokio::test]
async fn hostile_requests_get_clean_errors_and_leave_the_agent_serving() {
    for worker in ["", "--no-shm"] {
        let agent = Agent::builder().worker(testworker(worker)).start().await;
        let shm = ShmFile::create(&format!("cases{worker}"), 4096);
        shm.file
            .write_all_at(&f32_to_raw(&dense::input(1, 0)), 0)
            .unwrap();
        let link = format!("/infermesh-hostile-{}-link{worker}", std::process::id());
        let link_path = PathBuf::from(format!("/dev/shm{link}"));
        let _ = std::fs::remove_file(&link_path);
        std::os::unix::fs::symlink("/etc/hostname", &link_path).unwrap();
        let mut c = agent.client().await;
        register(&mut c, "in", &shm.key, 0, 1024).await.unwrap();
        register(&mut c, "out", &shm.key, 1024, 1024).await.unwrap();
        let pid = agent.pid();
        let mode = if worker.is_empty() {
            "pass-through"
        } else {
            "agent copies"
        };
        for case in Case::ALL {
            let before = rss_kib(pid);
            let mut last = None;
            for _ in 0..200 {
                let s = case.run(&mut c, &shm.key, &link).await;
                assert!(
                    matches!(s.code(), Code::InvalidArgument | Code::ResourceExhausted),
                    "{case:?}: {s:?}"
                );
                assert!(
                    s.message().len() < 1024,
                    "{case:?}: {} bytes",
                    s.message().len()
                );
                last = Some(s);
            }
            let s = last.unwrap();
            if matches!(case, Case::NegativeDimension) {
                assert!(s.message().contains("negative dimension"), "{s:?}");
            }
            let good = good_requests(&agent, 3).await;
            eprintln!(
                "| {case:?} ({mode}) | {:?} | {before} → {} | {good}/3 | {} |",
                s.code(),
                rss_kib(pid),
                s.message().chars().take(110).collect::<String>()
            );
        }
        let w = agent.status().await.workers[0].clone();
        assert_eq!(w.restarts, 0, "{w:?}");
        let _ = std::fs::remove_file(&link_path);
    }
}
