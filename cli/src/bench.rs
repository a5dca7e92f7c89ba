//! `infermesh bench`: closed-loop ModelInfer load against one OIP endpoint
//! (an agent or a worker), reporting throughput and hdrhistogram latency
//! percentiles.
//!
//! Each of `--concurrency` tasks sends one request at a time over a shared
//! HTTP/2 connection for `--duration` after a warm-up; with `--rate`,
//! requests leave at that rate whatever the answers ([`open_loop`]). The input is the
//! `dense` model's `INPUT0` (FP32 `[rows, 16]`, raw contents) sized to
//! `--size-bytes` (rounded down to whole 64-byte rows, at least one row).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use infermesh_client::discovery::Source;
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{ModelInferRequest, ServerLiveRequest, ServerReadyRequest};
use infermesh_proto::tensor::f32_to_raw;
use infermesh_tls::ClientTls;
use infermesh_transport::Path;
use tonic::transport::Channel;

use crate::exit;

mod open_loop;
mod report;
mod transport;

use report::{Latency, Report, print_human};
use transport::TransportArg;

/// Bytes in one row of the dense model's input (16 × FP32).
pub(crate) const ROW_BYTES: usize = 64;

/// Send ModelInfer load to an OIP endpoint and report throughput and latency.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// OIP gRPC endpoint, e.g. 127.0.0.1:8001 (an agent or a worker). Several,
    /// comma-separated, are called in turn (round robin: a baseline for the
    /// client library's balancing).
    /// Takes precedence over --registry / INFERMESH_REGISTRY.
    #[arg(long, required_unless_present = "registry")]
    target: Option<String>,
    /// Drive load through the client library instead: a registry URL
    /// (zk://host:port[/chroot] or static://host:port,...), as for the ops
    /// commands.
    #[arg(long, env = "INFERMESH_REGISTRY")]
    registry: Option<String>,
    /// Service to call through the registry, as for the ops commands.
    #[arg(long, env = "INFERMESH_SERVICE", default_value = infermesh_client::config::DEFAULT_SERVICE)]
    service: String,
    /// With --registry: this host's node id, preferred while healthy.
    #[arg(long, requires = "registry")]
    local_node: Option<String>,
    /// Model to call.
    #[arg(long, default_value = "dense")]
    model: String,
    /// Requests in flight at once (closed loop; default 1); with --rate, the
    /// most in flight at once (default 10000: a request due beyond it is not
    /// sent, and is counted under `NotSent`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: Option<u32>,
    /// Open loop: send this many requests per second, evenly spaced, whatever
    /// the answers (the load of callers outside the node: a steady service, a
    /// flood), instead of --concurrency callers one request at a time.
    #[arg(long, value_parser = open_loop::parse_rate)]
    rate: Option<f64>,
    /// How long to measure, e.g. 10s, 500ms, 1m.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Load sent before measuring starts (not counted).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Input tensor size in bytes (whole 64-byte rows of the dense model).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=(1u64 << 30)))]
    size_bytes: u64,
    /// Per-request deadline, retries included. Default: the client
    /// library's deadline (`ClientConfig::default().deadline`).
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Wait up to this long for the target to report ready before starting
    /// (for scripts that just started an agent). 0 = don't wait.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    wait_ready: Duration,
    /// Move tensors on this transport (with one --target, through the client
    /// library with the target as the local node; or with --registry): shm
    /// (shared memory; the agent must be on this host), rdma (with
    /// --registry; a node must advertise it), quic (a QUIC stream per
    /// request; with --registry and --tls-ca, a node must advertise it), grpc
    /// (inline), auto (the ladder's choice). Exits 69 before any load when
    /// the target does not offer the transport or the first request went
    /// over another path; the report counts requests per path that carried
    /// them (a path that breaks mid-run falls back to grpc, and is counted so).
    /// Lists OUTPUT0 as a requested output, so outputs take the same path;
    /// use `--model identity` to move the same bytes both ways. Also measures
    /// a plain memcpy of the same size as the physical limit.
    #[arg(long, value_enum)]
    transport: Option<TransportArg>,
    /// Through the client library (--transport or --registry): each request
    /// leases a region of the library's shared-memory pool, writes its input
    /// there (one copy, as a caller producing it in place would make at
    /// most) and reads the outputs where the worker left them
    /// (`Client::lease` and `infer_leased`: zero-copy to the local node).
    #[arg(long)]
    leased: bool,
    /// TLS to the agents (`--tls-ca` also turns it on for --target).
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// Print the report as one JSON object on stdout, and nothing else
    /// there (the text report goes to stderr). Stable fields: requests, errors,
    /// duration_s, throughput_rps, bytes_per_s, latency_ms.{p50,p90,p99,p999}
    /// of successful requests, latency_all_ms.{...} of all requests, failed
    /// ones included).
    #[arg(long)]
    json: bool,
}

/// Bytes per second of a plain memcpy of `size` bytes (one thread, ~0.5 s):
/// the physical limit a same-host transport is compared with.
fn memcpy_bandwidth(size: usize) -> f64 {
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    let started = Instant::now();
    let mut copies = 0u64;
    while started.elapsed() < Duration::from_millis(500) || copies < 3 {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        copies += 1;
    }
    copies as f64 * size as f64 / started.elapsed().as_secs_f64()
}

#[derive(Default)]
struct TaskResult {
    hist: Option<Histogram<u64>>,
    hist_all: Option<Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    nodes: BTreeMap<String, u64>,
    paths: BTreeMap<String, u64>,
}

impl TaskResult {
    /// Empty, with its histograms.
    fn new() -> Self {
        Self {
            hist: Some(new_histogram()),
            hist_all: Some(new_histogram()),
            ..Default::default()
        }
    }

    /// Counts one measured request that took `took`; a success also in
    /// `done`.
    fn record(&mut self, took: Duration, outcome: Result<Carried, Failed>, done: &AtomicU64) {
        let us = (took.as_micros() as u64).max(1);
        self.hist_all
            .as_mut()
            .expect("histogram")
            .saturating_record(us);
        match outcome {
            Ok(carried) => {
                self.hist.as_mut().expect("histogram").saturating_record(us);
                if let Some(node) = carried.node {
                    *self.nodes.entry(node).or_default() += 1;
                }
                let path = carried.path.map_or("unknown", |p| p.as_str());
                *self.paths.entry(path.to_string()).or_default() += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(failed) => {
                *self.errors.entry(failed.code).or_default() += 1;
            }
        }
    }
}

/// How one successful request travelled.
struct Carried {
    /// The node, when the client library chose it (or one of several targets).
    node: Option<String>,
    /// The transport path, when known.
    path: Option<Path>,
}

/// A failed request: its code (what it is counted under) and message.
struct Failed {
    code: String,
    message: String,
}

/// Who the load goes to: endpoints in turn, or the fleet through the client library.
#[derive(Clone)]
enum Caller {
    Direct(Arc<[GrpcInferenceServiceClient<Channel>]>, Arc<AtomicU64>),
    /// Through the client library; `true`: leased requests.
    Mesh(infermesh_client::Client, bool),
}

impl Caller {
    /// One request.
    async fn call(&self, req: ModelInferRequest, timeout: Duration) -> Result<Carried, Failed> {
        match self {
            Caller::Direct(clients, next) => {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize % clients.len();
                let mut r = tonic::Request::new(req);
                r.set_timeout(timeout);
                let node = (clients.len() > 1).then(|| format!("target-{i}"));
                clients[i]
                    .clone()
                    .model_infer(r)
                    .await
                    .map(|_| Carried {
                        node,
                        path: Some(Path::Grpc),
                    })
                    .map_err(|s| Failed {
                        code: status_code_name(&s),
                        message: s.message().to_string(),
                    })
            }
            Caller::Mesh(c, leased) => match *leased {
                true => leased_call(c, &req).await,
                false => c.infer_answered(req).await,
            }
            .map(|a| Carried {
                node: Some(a.node),
                path: a.path,
            })
            .map_err(|e| Failed {
                code: match &e {
                    infermesh_client::ClientError::Status(s) => status_code_name(s),
                    infermesh_client::ClientError::NoNode { .. } => "NoNode".to_string(),
                    other => format!("{:?}", other.code()),
                },
                message: e.to_string(),
            }),
        }
    }
}

/// One leased request shaped as `req` (its first input and requested
/// outputs): the input is written into the leased region, the outputs are
/// left where the worker wrote them (dropped unread, as `Direct` drops its
/// response).
async fn leased_call(
    client: &infermesh_client::Client,
    req: &ModelInferRequest,
) -> Result<infermesh_client::Answered, infermesh_client::ClientError> {
    use infermesh_client::{OutputSpec, TensorSpec};
    let input = &req.inputs[0];
    let datatype =
        infermesh_proto::tensor::DataType::parse(&input.datatype).expect("the bench sends FP32");
    let outputs: Vec<OutputSpec> = req
        .outputs
        .iter()
        .map(|o| OutputSpec::new(&o.name))
        .collect();
    let mut leased = client.lease(
        &req.model_name,
        &[TensorSpec::new(&input.name, datatype, &input.shape)],
        &outputs,
    )?;
    leased.input(0)?.copy_from_slice(&req.raw_input_contents[0]);
    client.infer_leased(leased).await
}

/// The name an error is counted under: its gRPC code, except that tonic's
/// own enforcement of the request's deadline (CANCELLED with
/// `TimeoutExpired` as the cause) is what it is, `DeadlineExceeded`.
fn status_code_name(s: &tonic::Status) -> String {
    let mut source = std::error::Error::source(s);
    for _ in 0..16 {
        match source {
            Some(e) if e.is::<tonic::TimeoutExpired>() => {
                return format!("{:?}", tonic::Code::DeadlineExceeded);
            }
            Some(e) => source = e.source(),
            None => break,
        }
    }
    format!("{:?}", s.code())
}

/// A client to one endpoint, checked live (or ready, with `patience`).
async fn direct(
    target: &str,
    size_bytes: usize,
    patience: Duration,
    tls: Option<&ClientTls>,
) -> Result<GrpcInferenceServiceClient<Channel>, i32> {
    let max = infermesh_proto::DEFAULT_MAX_MESSAGE_BYTES.max(size_bytes * 2);
    let channel =
        infermesh_proto::channel::oip_channel_tls(target, Duration::from_secs(5), tls, None)
            .map_err(|e| {
                eprintln!("error: --target {e}");
                exit::USAGE
            })?;
    let client = GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    wait_until_ready(&client, patience).await.map_err(|e| {
        eprintln!("error: {target}: {e}");
        exit::UNAVAILABLE
    })?;
    Ok(client)
}

/// Waits up to `patience` (at least 5 s) for the client library to know a
/// node; the error says whether the registry could not be read or has no
/// node for the service.
async fn wait_for_nodes(
    client: &infermesh_client::Client,
    registry: &str,
    service: &str,
    patience: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + patience.max(Duration::from_secs(5));
    while client.nodes().is_empty() {
        if Instant::now() >= deadline {
            let m = client.membership();
            return Err(match (&m.unreachable, m.source) {
                (Some(why), _) => format!("registry {registry} is unreachable: {why}"),
                (None, Source::Empty) => format!(
                    "registry {registry} did not answer within {:?}",
                    patience.max(Duration::from_secs(5))
                ),
                (None, _) => format!("no node registered for service '{service}' in {registry}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub fn main(args: BenchArgs) -> i32 {
    crate::say::json_on_stdout(args.json);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(run(args))
}

fn new_histogram() -> Histogram<u64> {
    // Microseconds, 1 µs .. 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

async fn run(args: BenchArgs) -> i32 {
    let deadline = args
        .timeout
        .unwrap_or(infermesh_client::ClientConfig::default().deadline);
    let target_name = args.target.clone().unwrap_or_else(|| {
        format!(
            "{} service {}",
            args.registry.as_deref().unwrap_or_default(),
            args.service
        )
    });
    let tls = match args.tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return e.code;
        }
    };
    let caller = match (&args.target, &args.registry) {
        (Some(target), _) if args.transport.is_some() => {
            let transport = args.transport.expect("checked");
            if target.contains(',') {
                eprintln!("error: --transport takes one --target (the local agent)");
                return exit::USAGE;
            }
            if tls.is_some() {
                eprintln!(
                    "error: --transport with --target is plaintext only; use --registry for TLS"
                );
                return exit::USAGE;
            }
            if let Err(e) = transport::check_target(transport, target) {
                eprintln!("error: {e}");
                return exit::UNAVAILABLE;
            }
            if let Err(code) = direct(target, args.size_bytes as usize, args.wait_ready, None).await
            {
                return code;
            }
            let client = infermesh_client::Client::builder()
                .registry(format!("static://{target}"))
                .local_node(target.clone())
                .deadline(deadline)
                .transports(transport.paths(None))
                .build()
                .await;
            match client {
                Ok(c) => Caller::Mesh(c, args.leased),
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit::USAGE;
                }
            }
        }
        (Some(targets), _) => {
            let mut clients = Vec::new();
            for target in targets.split(',') {
                match direct(
                    target,
                    args.size_bytes as usize,
                    args.wait_ready,
                    tls.as_ref(),
                )
                .await
                {
                    Ok(c) => clients.push(c),
                    Err(code) => return code,
                }
            }
            Caller::Direct(clients.into(), Arc::new(AtomicU64::new(0)))
        }
        (None, Some(registry)) => {
            let build = |paths: Option<infermesh_client::PathsConfig>| {
                let mut builder = infermesh_client::Client::builder()
                    .registry(registry.clone())
                    .service(args.service.clone())
                    .deadline(deadline);
                if let Some(local) = &args.local_node {
                    builder = builder.local_node(local.clone());
                }
                if let Some(t) = &tls {
                    builder = builder.tls(t.clone());
                }
                if let Some(paths) = paths {
                    builder = builder.transports(paths);
                }
                builder.build()
            };
            let connect = |paths| async {
                let c = build(paths).await.map_err(|e| {
                    eprintln!("error: {e}");
                    exit::USAGE
                })?;
                match wait_for_nodes(&c, registry, &args.service, args.wait_ready).await {
                    Ok(()) => Ok(c),
                    Err(e) => {
                        eprintln!("error: {e}");
                        Err(exit::UNAVAILABLE)
                    }
                }
            };
            let mut client = match connect(args.transport.map(|t| t.paths(None))).await {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Some(t) = args.transport {
                let offered = transport::check_nodes(
                    t,
                    &args.service,
                    &client.nodes(),
                    args.local_node.as_deref(),
                    tls.is_some(),
                )
                .await;
                match offered {
                    Err(e) => {
                        eprintln!("error: {e}");
                        return exit::UNAVAILABLE;
                    }
                    // RDMA: a client with the engine the nodes call for.
                    Ok(Some(engine)) => match connect(Some(t.paths(Some(engine)))).await {
                        Ok(c) => client = c,
                        Err(code) => return code,
                    },
                    Ok(None) => {}
                }
            }
            Caller::Mesh(client, args.leased)
        }
        (None, None) => unreachable!("clap requires --target or --registry"),
    };

    if args.leased && matches!(caller, Caller::Direct(..)) {
        eprintln!(
            "error: --leased goes through the client library: add --transport or use --registry"
        );
        return exit::USAGE;
    }
    let rows = (args.size_bytes as usize / ROW_BYTES).max(1);
    let input: Vec<f32> = (0..rows * 16)
        .map(|i| (i % 97) as f32 / 97.0 - 0.5)
        .collect();
    let request = ModelInferRequest {
        model_name: args.model.clone(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![f32_to_raw(&input).into()],
        outputs: if args.transport.is_some() {
            vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                ..Default::default()
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let size_bytes = rows * ROW_BYTES;
    // The first request must take the path asked for (see `transport`).
    if let Some(t) = args.transport {
        match caller.call(request.clone(), deadline).await {
            Ok(carried) => {
                if let Err(e) = transport::check_carried(t, carried.path) {
                    eprintln!("error: {e}");
                    return exit::UNAVAILABLE;
                }
            }
            Err(f) => {
                eprintln!(
                    "error: --transport {}: the first request failed ({}): {}",
                    t.name(),
                    f.code,
                    f.message
                );
                return exit::UNAVAILABLE;
            }
        }
    }
    let memcpy_bytes_per_s = args.transport.map(|_| memcpy_bandwidth(size_bytes));

    let progress = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let pb = ProgressBar::new(args.duration.as_millis() as u64);
        pb.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>4} [{bar:30}] {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        pb
    });
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let tasks: Vec<_> = match args.rate {
        Some(rate) => vec![tokio::spawn(open_loop::run(
            open_loop::Load {
                caller: caller.clone(),
                request: request.clone(),
                rate,
                max_in_flight: args.concurrency.unwrap_or(open_loop::DEFAULT_MAX_IN_FLIGHT)
                    as usize,
                timeout: deadline,
            },
            (measure_from, end),
            Arc::clone(&done),
        ))],
        None => (0..args.concurrency.unwrap_or(1))
            .map(|_| {
                let (caller, request, done) = (caller.clone(), request.clone(), Arc::clone(&done));
                let timeout = deadline;
                tokio::spawn(async move {
                    let mut result = TaskResult::new();
                    loop {
                        let sent = Instant::now();
                        if sent >= end {
                            break;
                        }
                        let outcome = caller.call(request.clone(), timeout).await;
                        let took = sent.elapsed();
                        if sent >= measure_from {
                            result.record(took, outcome, &done);
                        }
                    }
                    result
                })
            })
            .collect(),
    };
    // The client forgets a node that leaves membership: note each node's
    // last attempt while the load runs, so that one that left still shows.
    let last_attempts = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    if let Caller::Mesh(c, _) = &caller {
        let (c, last_attempts) = (c.clone(), Arc::clone(&last_attempts));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while Instant::now() < end {
                tick.tick().await;
                note_last_attempts(&c, &last_attempts);
            }
        });
    }
    if let Some(pb) = &progress {
        let pb = pb.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let measured = now.saturating_duration_since(measure_from);
                let n = done.load(Ordering::Relaxed);
                pb.set_position(measured.as_millis() as u64);
                let rps = n as f64 / measured.as_secs_f64().max(1e-3);
                pb.set_message(if now < measure_from {
                    "warming up".to_string()
                } else {
                    format!("{n} ok, {rps:.0} req/s")
                });
            }
        });
    }

    let mut hist = new_histogram();
    let mut hist_all = new_histogram();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
    let mut paths: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let r = t.await.expect("bench task panicked");
        if let Some(h) = r.hist {
            hist.add(h).expect("same histogram bounds");
        }
        if let Some(h) = r.hist_all {
            hist_all.add(h).expect("same histogram bounds");
        }
        for (code, n) in r.errors {
            *errors.entry(code).or_default() += n;
        }
        for (node, n) in r.nodes {
            *nodes.entry(node).or_default() += n;
        }
        for (path, n) in r.paths {
            *paths.entry(path).or_default() += n;
        }
    }
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    let duration_s = args.duration.as_secs_f64();
    let requests = hist.len();
    let error_count: u64 = errors.values().sum();
    let latency = |hist: &Histogram<u64>| {
        let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        Latency {
            p50: ms(0.50),
            p90: ms(0.90),
            p99: ms(0.99),
            p999: ms(0.999),
            max: hist.max() as f64 / 1000.0,
            mean: hist.mean() / 1000.0,
        }
    };
    let report = Report {
        target: target_name.clone(),
        model: args.model.clone(),
        concurrency: args.concurrency.unwrap_or(match args.rate {
            Some(_) => open_loop::DEFAULT_MAX_IN_FLIGHT,
            None => 1,
        }),
        rate_rps: args.rate,
        size_bytes,
        requests,
        errors: error_count,
        errors_by_code: errors,
        requests_by_node: nodes,
        requests_by_path: paths,
        last_attempt_unix_ms_by_node: match &caller {
            Caller::Mesh(c, _) => {
                note_last_attempts(c, &last_attempts);
                last_attempts.lock().expect("last attempts").clone()
            }
            Caller::Direct(..) => BTreeMap::new(),
        },
        duration_s,
        throughput_rps: requests as f64 / duration_s,
        bytes_per_s: (requests as f64 * size_bytes as f64) / duration_s,
        latency_ms: latency(&hist),
        latency_all_ms: latency(&hist_all),
        transport: args.transport.map(|t| t.name().to_string()),
        paths: match (&caller, args.transport) {
            (Caller::Mesh(c, _), Some(_)) => c
                .path_counters()
                .iter()
                .filter(|(_, n)| n.attempts > 0)
                .map(|(p, n)| {
                    let v = serde_json::json!({
                        "attempts": n.attempts, "successes": n.successes,
                        "failures": n.failures, "fallbacks": n.fallbacks,
                    });
                    (p.to_string(), v)
                })
                .collect(),
            _ => BTreeMap::new(),
        },
        memcpy_bytes_per_s,
    };
    print_human(&report);
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("report serializes")
        );
    }
    if report.requests == 0 {
        exit::FAILURE
    } else {
        exit::OK
    }
}

/// Merges the client's last attempt per node into `into`.
fn note_last_attempts(
    client: &infermesh_client::Client,
    into: &std::sync::Mutex<BTreeMap<String, u64>>,
) {
    let mut into = into.lock().expect("last attempts");
    for (node, s) in client.node_stats() {
        let t = into.entry(node).or_default();
        *t = (*t).max(s.last_attempt_unix_ms);
    }
}

/// Checks the target is live; with a non-zero `patience`, waits until it
/// reports ready.
async fn wait_until_ready(
    client: &GrpcInferenceServiceClient<Channel>,
    patience: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + patience;
    loop {
        let mut c = client.clone();
        let outcome = if patience.is_zero() {
            c.server_live(ServerLiveRequest {}).await.map(|_| true)
        } else {
            c.server_ready(ServerReadyRequest {})
                .await
                .map(|r| r.into_inner().ready)
        };
        match outcome {
            Ok(true) => return Ok(()),
            Ok(false) if Instant::now() >= deadline => {
                return Err(format!("not ready after {patience:?}"));
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("unreachable: {}", e.message()));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
