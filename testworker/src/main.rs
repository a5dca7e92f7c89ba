//! `infermesh-testworker`: see the library docs.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use infermesh_proto::{DEFAULT_MAX_MESSAGE_BYTES, GrpcInferenceServiceServer};
use infermesh_testworker::{FaultKind, TestWorker, WorkerOptions};

/// An Open Inference Protocol (KServe v2 / Triton gRPC) worker that computes
/// a small deterministic model on CPU, with fault injection for tests and
/// drills.
///
/// Every model it serves is the `dense` model: INPUT0 FP32 [batch, 16] →
/// OUTPUT0 FP32 [batch, 4], y = tanh(x·W/4 + b) with fixed weights (see the
/// crate docs) — except a model named `identity`, which returns INPUT0 (FP32,
/// any shape) unchanged as OUTPUT0. A request can also trigger a fault at
/// run time with the string parameter `infermesh_fault=KIND`. Tensors may
/// be passed in POSIX shared memory (Triton's system shared-memory
/// extension).
#[derive(Debug, Parser)]
#[command(name = "infermesh-testworker", version)]
struct Args {
    /// Address to serve OIP gRPC on. Default: 127.0.0.1:$INFERMESH_WORKER_PORT
    /// when an agent set it, else 127.0.0.1:8000.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Model name to serve (repeatable); `identity` echoes its input, any
    /// other name computes the dense model. Default: dense.
    #[arg(long = "model")]
    models: Vec<String>,
    /// Time each request holds a slot, in milliseconds (emulates GPU compute).
    #[arg(long, default_value_t = 0.0)]
    service_time_ms: f64,
    /// Slots: requests computed at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// Simulated model load time before the worker reports ready, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    startup_ms: f64,
    /// Fault to fire after --fault-after requests: cuda-crash, cuda-sticky, hang, stall, nan, slow.
    #[arg(long)]
    fault: Option<FaultKind>,
    /// Requests served before --fault fires.
    #[arg(long, default_value_t = 0, requires = "fault")]
    fault_after: u64,
    /// Answer the shared-memory RPCs with UNIMPLEMENTED, like a server
    /// without Triton's shared-memory extension (the agent then copies).
    #[arg(long)]
    no_shm: bool,
    /// Answer ModelConfig with UNIMPLEMENTED, like a server without Triton's
    /// extension: it then does not say how many requests it runs at once.
    #[arg(long)]
    no_model_config: bool,
    /// Shared-memory regions one client connection may register (a small
    /// table lets tests fill it).
    #[arg(long, default_value_t = infermesh_transport::shm::DEFAULT_MAX_REGIONS_PER_OWNER)]
    max_shm_regions: usize,
}

fn millis(name: &str, ms: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| format!("--{name} must be a finite, non-negative number of milliseconds"))
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let (service_time, startup) = match (
        millis("service-time-ms", args.service_time_ms),
        millis("startup-ms", args.startup_ms),
    ) {
        (Ok(s), Ok(u)) => (s, u),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            std::process::exit(64);
        }
    };
    let listen = args.listen.unwrap_or_else(|| {
        let port = std::env::var("INFERMESH_WORKER_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(8000u16);
        SocketAddr::from(([127, 0, 0, 1], port))
    });
    let models = if args.models.is_empty() {
        WorkerOptions::default().models
    } else {
        args.models
    };
    let worker = TestWorker::new(WorkerOptions {
        models: models.clone(),
        service_time,
        concurrency: args.concurrency as usize,
        startup,
        fault: args.fault,
        fault_after: args.fault_after,
        shm_rpcs: !args.no_shm,
        model_config: !args.no_model_config,
        shm: infermesh_transport::shm::RegistryConfig {
            max_regions_per_owner: args.max_shm_regions,
            ..Default::default()
        },
    });
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {listen}: {e}");
            std::process::exit(69);
        }
    };
    tracing::info!(%listen, ?models, ?service_time, concurrency = args.concurrency, "test worker serving");
    let service = GrpcInferenceServiceServer::new(worker)
        .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    if let Err(e) = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
    {
        eprintln!("error: server failed: {e}");
        std::process::exit(1);
    }
}
