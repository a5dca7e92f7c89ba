//! `infermesh agent`.

use std::path::PathBuf;

use clap::Args;
use infermesh_agent::{AgentConfig, RawConfig, RawWorker};

use crate::exit;
use crate::logging::LogFormat;

/// Run the agent. A config file is optional: the common settings are flags,
/// and flags override the file. Example:
///
///   infermesh agent --listen 127.0.0.1:8001 --admin-listen 127.0.0.1:8002
///     --worker "infermesh-testworker --listen 127.0.0.1:{port}"
///     --worker "infermesh-testworker --listen 127.0.0.1:{port}"
///
/// `{port}` is replaced by a free loopback port the agent picks for each
/// worker (also exported as INFERMESH_WORKER_PORT).
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// TOML config file (see configs/agent.toml for every option).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// OIP gRPC listen address [default: 127.0.0.1:8001].
    #[arg(long)]
    listen: Option<String>,
    /// Admin listen address: /metrics, /livez, /readyz, admin gRPC [default: 127.0.0.1:8002].
    #[arg(long)]
    admin_listen: Option<String>,
    /// KServe v2 HTTP/REST listen address (Triton's HTTP port is 8000), for
    /// tritonclient.http, perf_analyzer and curl [default: off].
    #[arg(long)]
    http_listen: Option<String>,
    /// This node's id [default: the host name].
    #[arg(long)]
    node_id: Option<String>,
    /// Threads of the agent's async runtime [default: one per CPU core]. On a
    /// host whose cores are busy with inference workers, fewer threads cut
    /// cross-thread wake-ups and latency.
    #[arg(long)]
    threads: Option<usize>,
    /// `auto`: advertise the live capacity (requests/s the ready workers can
    /// serve, measured); a number pins the capacity score (advertised weight =
    /// score × share of workers ready) [default: auto].
    #[arg(long)]
    weight: Option<infermesh_agent::config::RawWeight>,
    /// Registry to advertise this node in: zk://host:port[,host:port...][/chroot].
    #[arg(long, env = "INFERMESH_REGISTRY")]
    registry: Option<String>,
    /// File holding the bearer token that mutating admin calls (drain,
    /// undrain, restart, health, inject) must present. Without one they are refused.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding `user:password` for ZooKeeper's digest scheme: the node's
    /// records are then writable by that identity only, readable by anyone.
    #[arg(long, value_name = "FILE", env = "INFERMESH_REGISTRY_AUTH_FILE")]
    registry_auth_file: Option<PathBuf>,
    /// Service name in the registry [default: default].
    #[arg(long)]
    service: Option<String>,
    /// Zone (rack, availability zone) advertised in the registry.
    #[arg(long)]
    zone: Option<String>,
    /// RDMA path: auto (a real device if present), emulated (software, loopback
    /// only: tests and demos), off [default: auto].
    #[arg(long, value_name = "off|auto|emulated")]
    rdma: Option<String>,
    /// TLS certificate chain (PEM) of every port (OIP, admin, KServe HTTP);
    /// with --tls-key they serve TLS only. Re-read when the file changes.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA certificate (PEM) of client certificates: every port then requires
    /// one it signed (mTLS).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// A DNS name (SAN) of clients allowed on the OIP and KServe HTTP ports
    /// under mTLS (repeatable) [default: any client the CA signed].
    #[arg(long = "tls-allow-client", value_name = "NAME")]
    tls_allow_clients: Vec<String>,
    /// A worker command line (repeatable); added to the config file's workers.
    #[arg(long = "worker", value_name = "COMMAND LINE")]
    workers: Vec<String>,
    /// Check the configuration without starting anything: parse it, look up
    /// every worker program as the agent does (PATH, then next to this
    /// binary), check each worker's GPU, MIG instance and MPS share against
    /// the GPU backend, and try to bind the listen addresses. Prints every
    /// problem found; exits 0 if none, 78 for a bad config, a missing
    /// program or GPU slice, 69 when a listen address is taken.
    #[arg(long)]
    check_config: bool,
    /// Export OpenTelemetry traces over OTLP/gRPC to this collector, e.g.
    /// http://127.0.0.1:4317 [default: off].
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(long, value_enum, env = "INFERMESH_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// What `--check-config` found beyond parsing.
fn check_config(cfg: &AgentConfig) -> i32 {
    let mut config_problems = Vec::new();
    let mut warnings = Vec::new();
    for w in &cfg.workers {
        let Some(program) = w.argv.first() else {
            config_problems.push(format!("worker {}: empty command", w.id));
            continue;
        };
        // The agent's own lookup: PATH, then next to this binary.
        if infermesh_agent::supervision::spawn::resolve_program(program).is_none() {
            config_problems.push(format!(
                "worker {}: program {}",
                w.id,
                infermesh_agent::supervision::spawn::not_found(program)
            ));
        }
        if !w.argv.iter().any(|a| a.contains("{port}")) {
            warnings.push(format!(
                "worker {}: no {{port}} in its command; it must listen on the port in \
                 INFERMESH_WORKER_PORT or the agent cannot reach it",
                w.id
            ));
        }
    }
    // The GPU slices workers are pinned to, asked of the configured backend.
    if cfg.workers.iter().any(|w| w.gpu.is_some()) {
        let gpus = match infermesh_gpu::open(cfg.gpu_backend, cfg.fake_gpus) {
            Ok(gpus) => gpus,
            Err(e) => {
                warnings.push(format!(
                    "gpu.backend {}: {e}; GPU slices checked without telemetry",
                    cfg.gpu_backend
                ));
                std::sync::Arc::new(infermesh_gpu::NoTelemetry)
            }
        };
        let pipe_dir = std::env::var(infermesh_gpu::slice::PIPE_DIRECTORY_ENV).ok();
        let found = infermesh_agent::supervision::gpu::slices::check(
            &cfg.workers,
            gpus.as_ref(),
            pipe_dir.as_deref(),
        );
        config_problems.extend(found.errors);
        warnings.extend(found.notes);
    }
    let mut taken = Vec::new();
    for (what, addr) in [("listen", cfg.listen), ("admin_listen", cfg.admin_listen)] {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            taken.push(format!("{what}: cannot bind {addr}: {e}"));
        }
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    for p in config_problems.iter().chain(&taken) {
        eprintln!("error: {p}");
    }
    if !config_problems.is_empty() {
        return exit::CONFIG;
    }
    if !taken.is_empty() {
        return exit::UNAVAILABLE;
    }
    println!(
        "configuration OK: node {}, OIP on {}, admin on {}, {} worker(s){}",
        cfg.node_id,
        cfg.listen,
        cfg.admin_listen,
        cfg.workers.len(),
        match &cfg.tls {
            None => String::new(),
            Some(t) if t.client_ca.is_some() => ", TLS with client certificates".into(),
            Some(_) => ", TLS".into(),
        }
    );
    exit::OK
}

pub fn main(args: AgentArgs) -> i32 {
    let cfg = match load(&args) {
        Ok(cfg) => cfg,
        Err(e) => {
            crate::logging::init(args.log_format);
            eprintln!("error: {e}");
            return exit::CONFIG;
        }
    };
    if args.check_config || cfg.otlp_endpoint.is_none() {
        crate::logging::init(args.log_format);
    }
    if args.check_config {
        return check_config(&cfg);
    }
    // One thread: a current-thread runtime, which needs no work stealing,
    // no cross-thread wake-ups and no parking of idle workers.
    let mut builder = match cfg.threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = builder.enable_all().build().expect("tokio runtime");
    // The OTLP exporter's channel lives on the runtime.
    let tracer = match &cfg.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            let _in = runtime.enter();
            match infermesh_agent::trace::otlp(endpoint) {
                Ok(provider) => {
                    crate::logging::init_with(args.log_format, Some(provider.clone()));
                    tracing::info!(endpoint, "exporting traces over OTLP");
                    Some(provider)
                }
                Err(e) => {
                    crate::logging::init(args.log_format);
                    eprintln!("error: {e}");
                    return exit::CONFIG;
                }
            }
        }
    };
    let outcome = runtime.block_on(async {
        let outcome = infermesh_agent::run(cfg, shutdown_signal()).await;
        if let Some(provider) = tracer {
            // Flushes the last spans; blocking, and it needs the runtime.
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
        outcome
    });
    match outcome {
        Ok(()) => exit::OK,
        Err(e @ infermesh_agent::RunError::Bind { .. }) => {
            eprintln!("error: {e}");
            exit::UNAVAILABLE
        }
        Err(e @ (infermesh_agent::RunError::Advertise(_) | infermesh_agent::RunError::Tls(_))) => {
            eprintln!("error: {e}");
            exit::CONFIG
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::FAILURE
        }
    }
}

fn load(args: &AgentArgs) -> Result<AgentConfig, Box<dyn std::error::Error>> {
    let mut raw = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            RawConfig::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => RawConfig::default(),
    };
    // Relative paths in the file (health requests, exec checks, the token
    // file) resolve against the file's directory.
    raw.base_dir = args.config.as_ref().and_then(|p| p.parent()).map(|d| {
        if d.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            d.to_path_buf()
        }
    });
    if let Some(t) = &args.admin_token_file {
        // A flag's relative path is relative to where the command runs.
        raw.admin_token_file = Some(std::path::absolute(t).unwrap_or_else(|_| t.clone()));
    }
    // A flag's relative path is relative to where the command runs.
    let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    if let Some(c) = &args.tls_cert {
        raw.tls.cert = Some(absolute(c));
    }
    if let Some(k) = &args.tls_key {
        raw.tls.key = Some(absolute(k));
    }
    if let Some(c) = &args.tls_client_ca {
        raw.tls.client_ca = Some(absolute(c));
    }
    if !args.tls_allow_clients.is_empty() {
        raw.tls.allow_clients = args.tls_allow_clients.clone();
    }
    if let Some(l) = &args.listen {
        raw.listen = Some(l.clone());
    }
    if let Some(a) = &args.admin_listen {
        raw.admin_listen = Some(a.clone());
    }
    if let Some(h) = &args.http_listen {
        raw.http_listen = Some(h.clone());
    }
    if args.weight.is_some() {
        raw.weight = args.weight.clone();
    }
    if args.otlp_endpoint.is_some() {
        raw.otlp_endpoint = args.otlp_endpoint.clone();
    }
    if args.registry.is_some() {
        raw.registry.url = args.registry.clone();
    }
    if args.service.is_some() {
        raw.registry.service = args.service.clone();
    }
    if let Some(f) = &args.registry_auth_file {
        // A flag's relative path is relative to where the command runs.
        raw.registry.auth_file = Some(std::path::absolute(f).unwrap_or_else(|_| f.clone()));
    }
    if args.zone.is_some() {
        raw.registry.zone = args.zone.clone();
    }
    if args.threads.is_some() {
        raw.threads = args.threads;
    }
    if args.rdma.is_some() {
        raw.transport.rdma = args.rdma.clone();
    }
    if let Some(n) = &args.node_id {
        raw.node_id = Some(n.clone());
    }
    raw.workers
        .extend(args.workers.iter().map(|command| RawWorker {
            command: command.clone(),
            ..Default::default()
        }));
    let mut cfg = AgentConfig::from_raw(raw)?;
    // Workers start through `infermesh worker-shim` (cli/src/shim.rs), so
    // they die with the agent even behind a wrapper script.
    cfg.worker_shim = std::env::current_exe().ok();
    Ok(cfg)
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
