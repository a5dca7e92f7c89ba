//! Fixtures for end-to-end tests across processes.
//!
//! [`Agent::builder`] starts a real `infermesh agent` process with real
//! `infermesh-testworker` processes and stops them on drop (SIGKILL to the
//! agent; its workers die with it through their parent-death signal). The
//! binaries are built once per test run with `cargo build`, so
//! `cargo test --workspace` needs nothing else.
//!
//! Waiting is always on an observable condition (an RPC answer, a process
//! state) with a generous deadline, never a bare sleep.
#![forbid(unsafe_code)]

pub mod certs;
pub mod h2attack;
pub mod h2spec;
pub mod nghttpd;
pub mod py;
pub mod zk;

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::admin::admin_client::AdminClient;
use infermesh_proto::admin::{StatusRequest, StatusResponse};
use infermesh_proto::inference::ServerReadyRequest;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The admin token every test agent is started with (`--admin-token-file`).
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// An admin client that presents [`ADMIN_TOKEN`].
pub type Admin = AdminClient<
    InterceptedService<
        Channel,
        fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>,
    >,
>;

fn bearer(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().expect("ascii"),
    );
    Ok(req)
}

/// How long fixtures wait for a condition before failing the test.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "infermesh",
                "-p",
                "infermesh-testworker",
            ])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the binaries failed");
        // The test binary is target/<profile>/deps/<name>.
        let exe = std::env::current_exe().expect("test binary path");
        exe.parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf()
    })
}

/// Path of a workspace binary.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// A loopback port nobody listens on right now, and that this process has
/// not handed out before.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct loopback ports nobody listens on right now (held together
/// while chosen: two `free_port` calls may return the same port, which made
/// an agent's OIP and admin ports collide once in CI), none handed out
/// before by this process: a port chosen for one agent is free until that
/// agent binds it, and the kernel gave it to the next agent spawned beside
/// it once (`auto_weight`: "cannot listen on 127.0.0.1:39329 (admin)").
pub fn free_ports<const N: usize>() -> [u16; N] {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (mut held, mut skipped) = (Vec::new(), Vec::new());
    while held.len() < N {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // A port given before stays bound while looking further, so the
        // kernel moves on.
        if given.insert(port) {
            held.push(l);
        } else {
            skipped.push(l);
        }
    }
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// A plaintext HTTP/1.0 GET of `path` at `addr`; the whole response.
pub async fn http_get(addr: impl tokio::net::ToSocketAddrs, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Polls `check` until it returns `Some`, failing the test after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A command line for a test worker; `{port}` is filled in by the agent.
pub fn testworker(extra: &str) -> String {
    format!(
        "{} --listen 127.0.0.1:{{port}} {extra}",
        bin("infermesh-testworker").display()
    )
}

/// Builds an [`Agent`].
#[derive(Default)]
pub struct AgentBuilder {
    workers: Vec<String>,
    config: Option<String>,
}

impl AgentBuilder {
    /// Adds a worker command line.
    pub fn worker(mut self, command: impl Into<String>) -> Self {
        self.workers.push(command.into());
        self
    }

    /// Uses a TOML config (written to a file and passed with --config).
    pub fn config(mut self, toml: impl Into<String>) -> Self {
        self.config = Some(toml.into());
        self
    }

    /// Starts the agent and waits until it serves and all workers are ready.
    pub async fn start(self) -> Agent {
        let agent = self.spawn();
        agent.wait_ready().await;
        agent
    }

    /// Starts the agent without waiting.
    pub fn spawn(self) -> Agent {
        let [oip, admin] = free_ports();
        let dir = std::env::temp_dir().join(format!("infermesh-test-{}-{oip}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("agent.log");
        let token_file = dir.join("admin-token");
        std::fs::write(&token_file, format!("{ADMIN_TOKEN}\n")).unwrap();
        let mut cmd = Command::new(bin("infermesh"));
        cmd.arg("agent")
            .args(["--listen", &format!("127.0.0.1:{oip}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--admin-token-file")
            .arg(&token_file)
            // INFERMESH_TEST_AGENT_LOG sets the agents' filter when debugging
            // a test (e.g. `info,infermesh_agent::dispatch::pool=debug`).
            .env(
                "RUST_LOG",
                std::env::var("INFERMESH_TEST_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("agent.out")).unwrap())
            .stderr(std::fs::File::create(&log).unwrap());
        match &self.config {
            Some(toml) => {
                let path = dir.join("agent.toml");
                std::fs::write(&path, toml).unwrap();
                cmd.arg("--config").arg(path);
            }
            // Flags override the file, so the node id is only set without one.
            None => {
                cmd.args(["--node-id", "test-node"]);
            }
        }
        for w in &self.workers {
            cmd.args(["--worker", w]);
        }
        let child = cmd.spawn().expect("spawn infermesh agent");
        Agent {
            child: Some(child),
            oip: SocketAddr::from(([127, 0, 0, 1], oip)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            log,
            token_file,
            dir,
            workers: self.workers.len()
                + self
                    .config
                    .as_ref()
                    .map_or(0, |t| t.matches("[[workers]]").count()),
        }
    }
}

/// A running `infermesh agent` process.
pub struct Agent {
    child: Option<Child>,
    /// OIP gRPC address.
    pub oip: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
    /// The file holding [`ADMIN_TOKEN`].
    pub token_file: PathBuf,
    /// A scratch directory of this agent (config, logs, token).
    pub dir: PathBuf,
    workers: usize,
}

impl Agent {
    /// A builder.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// An OIP client to the agent.
    pub async fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.oip))
            .unwrap()
            .connect()
            .await
            .expect("connect to agent");
        GrpcInferenceServiceClient::new(ch)
    }

    /// An admin client presenting the agent's token.
    pub async fn admin(&self) -> Admin {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.admin))
            .unwrap()
            .connect()
            .await
            .expect("connect to the admin address");
        AdminClient::with_interceptor(ch, bearer as fn(_) -> _)
    }

    /// The admin address's `/metrics` text (HTTP/1.0, headers included).
    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// The agent's admin status.
    pub async fn status(&self) -> StatusResponse {
        self.try_status().await.expect("admin status")
    }

    /// The admin status, or `None` while the agent does not answer.
    pub async fn try_status(&self) -> Option<StatusResponse> {
        let mut admin = AdminClient::connect(format!("http://{}", self.admin))
            .await
            .ok()?;
        Some(admin.status(StatusRequest {}).await.ok()?.into_inner())
    }

    /// Waits until the agent is ready and every worker is `ready`.
    pub async fn wait_ready(&self) {
        let want = self.workers;
        eventually("agent and all workers ready", || async {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.oip))
                .ok()?
                .connect()
                .await
                .ok()?;
            let ready = GrpcInferenceServiceClient::new(ch)
                .server_ready(ServerReadyRequest {})
                .await
                .ok()?
                .into_inner()
                .ready;
            let status = self.try_status().await?;
            let all =
                status.workers.len() == want && status.workers.iter().all(|w| w.state == "ready");
            (ready && all).then_some(())
        })
        .await;
    }

    /// Sends SIGTERM and waits for the agent to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        child.wait().unwrap()
    }

    /// Waits for an agent that was sent SIGTERM (by the test) to exit.
    pub fn terminate_wait(&mut self) -> ExitStatus {
        self.child.take().expect("running").wait().unwrap()
    }

    /// Kills the agent with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- agent log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Whether a process with `pid` exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; Z = zombie, X = dead.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Requests for the test worker's `dense` model.
pub mod dense {
    use infermesh_proto::inference::model_infer_request::InferInputTensor;
    use infermesh_proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse};
    use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
    pub use infermesh_testworker::dense::forward;

    /// `rows` rows of deterministic input values.
    pub fn input(rows: usize, seed: u32) -> Vec<f32> {
        (0..rows * 16)
            .map(|i| ((i as u32 * 7 + seed * 13) % 41) as f32 / 20.0 - 1.0)
            .collect()
    }

    /// A request with `input` as raw or typed contents.
    pub fn request(input: &[f32], raw: bool) -> ModelInferRequest {
        let rows = (input.len() / 16) as i64;
        let mut tensor = InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![rows, 16],
            ..Default::default()
        };
        let mut req = ModelInferRequest {
            model_name: "dense".into(),
            id: "req-1".into(),
            ..Default::default()
        };
        if raw {
            req.raw_input_contents = vec![f32_to_raw(input).into()];
        } else {
            tensor.contents = Some(InferTensorContents {
                fp32_contents: input.to_vec(),
                ..Default::default()
            });
        }
        req.inputs = vec![tensor];
        req
    }

    /// The output values of a response, whichever form it used, and whether
    /// it was raw.
    pub fn output(resp: &ModelInferResponse) -> (Vec<f32>, bool) {
        if let Some(raw) = resp.raw_output_contents.first() {
            (raw_to_f32(raw).expect("raw output is FP32"), true)
        } else {
            let typed = resp.outputs[0]
                .contents
                .as_ref()
                .expect("typed output contents");
            (typed.fp32_contents.clone(), false)
        }
    }
}

/// Constant closed-loop load through the client library: `callers` tasks
/// each sending `dense` requests of `rows` rows one after another (built by
/// `make`), checking every answer against the model and counting failures.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the callers.
    pub fn start(
        client: &infermesh_client::Client,
        callers: u32,
        rows: usize,
        make: fn(&[f32]) -> infermesh_proto::inference::ModelInferRequest,
    ) -> Load {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tasks = (0..callers)
            .map(|i| {
                let (client, stop, sent, failed) =
                    (client.clone(), stop.clone(), sent.clone(), failed.clone());
                tokio::spawn(async move {
                    let input = dense::input(rows, i);
                    while !stop.load(Ordering::Relaxed) {
                        match client.infer(make(&input)).await {
                            Ok(r) => assert_eq!(dense::output(&r).0, dense::forward(&input)),
                            Err(e) => {
                                // The first few say why; a dead server must
                                // not fill the captured output (or spin).
                                if failed.fetch_add(1, Ordering::Relaxed) < 20 {
                                    eprintln!("request failed: {e}");
                                }
                                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            }
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Load {
            stop,
            sent,
            failed,
            tasks,
        }
    }

    /// Requests answered or failed so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the callers and returns how many requests failed.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load task panicked");
        }
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }
}
