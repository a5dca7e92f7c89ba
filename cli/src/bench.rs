//! `infermesh bench`: closed-loop ModelInfer load against one OIP endpoint
//! (an agent or a worker), reporting throughput and hdrhistogram latency
//! percentiles.
//!
//! Each of `--concurrency` tasks sends one request at a time over a shared
//! HTTP/2 connection for `--duration` after a warm-up. The input is the
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
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{ModelInferRequest, ServerLiveRequest, ServerReadyRequest};
use infermesh_proto::tensor::f32_to_raw;
use infermesh_proto::tls::ClientTls;
use serde::Serialize;
use tonic::transport::Channel;

use crate::exit;

/// Bytes in one row of the dense model's input (16 × FP32).
const ROW_BYTES: usize = 64;

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
    /// Requests in flight at once (closed loop).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
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
    /// (shared memory, falls back to grpc if it breaks), quic (a QUIC stream
    /// per request, with --registry and --tls-ca: falls back to grpc), grpc
    /// (inline), auto (the ladder's choice).
    /// Lists OUTPUT0 as a requested output, so outputs take the same path;
    /// use `--model identity` to move the same bytes both ways. Also measures
    /// a plain memcpy of the same size as the physical limit.
    #[arg(long, value_enum)]
    transport: Option<TransportArg>,
    /// TLS to the agents (`--tls-ca` also turns it on for --target).
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// Print one JSON object as the last line (stable fields: requests, errors,
    /// duration_s, throughput_rps, bytes_per_s, latency_ms.{p50,p90,p99,p999}
    /// of successful requests, latency_all_ms.{...} of all requests, failed
    /// ones included).
    #[arg(long)]
    json: bool,
}

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TransportArg {
    Shm,
    Quic,
    Grpc,
    Auto,
}

impl TransportArg {
    fn paths(self) -> infermesh_client::PathsConfig {
        use infermesh_transport::Path;
        let prefer = match self {
            TransportArg::Shm => vec![Path::Shm, Path::Grpc],
            TransportArg::Quic => vec![Path::Quic, Path::Grpc],
            TransportArg::Grpc => vec![Path::Grpc],
            TransportArg::Auto => return infermesh_client::PathsConfig::default(),
        };
        infermesh_client::PathsConfig {
            prefer,
            // Chosen explicitly: every request takes it, however small.
            shm_min_bytes: 0,
            ..Default::default()
        }
    }
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

/// The `--json` report.
#[derive(Debug, Serialize)]
struct Report {
    target: String,
    model: String,
    concurrency: u32,
    size_bytes: usize,
    requests: u64,
    errors: u64,
    errors_by_code: BTreeMap<String, u64>,
    /// Successful requests per node (through the client library only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    requests_by_node: BTreeMap<String, u64>,
    /// When the client library last sent an attempt to each node (Unix ms).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    last_attempt_unix_ms_by_node: BTreeMap<String, u64>,
    duration_s: f64,
    throughput_rps: f64,
    /// Input tensor bytes sent per second by successful requests.
    bytes_per_s: f64,
    /// Successful requests only.
    latency_ms: Latency,
    /// All requests, failed ones included (time until the error).
    latency_all_ms: Latency,
    /// With --transport: the transport asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    transport: Option<String>,
    /// With --transport: requests per path (attempts, successes, failures,
    /// fallbacks to the next path down).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    paths: BTreeMap<String, serde_json::Value>,
    /// With --transport: a plain memcpy of the same size, bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    memcpy_bytes_per_s: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    mean: f64,
}

#[derive(Default)]
struct TaskResult {
    hist: Option<Histogram<u64>>,
    hist_all: Option<Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    nodes: BTreeMap<String, u64>,
}

/// Who the load goes to: endpoints in turn, or the fleet through the client library.
#[derive(Clone)]
enum Caller {
    Direct(Arc<[GrpcInferenceServiceClient<Channel>]>, Arc<AtomicU64>),
    Mesh(infermesh_client::Client),
}

impl Caller {
    /// One request; `Ok(node)` names the node when the client library chose it.
    async fn call(
        &self,
        req: ModelInferRequest,
        timeout: Duration,
    ) -> Result<Option<String>, String> {
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
                    .map(|_| node)
                    .map_err(|s| status_code_name(&s))
            }
            Caller::Mesh(c) => {
                c.infer_on(req)
                    .await
                    .map(|(_, node)| Some(node))
                    .map_err(|e| match e {
                        infermesh_client::ClientError::Status(s) => status_code_name(&s),
                        infermesh_client::ClientError::NoNode { .. } => "NoNode".to_string(),
                        other => format!("{:?}", other.code()),
                    })
            }
        }
    }
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

/// Waits up to `patience` for the client library to know a serving node.
async fn wait_for_nodes(
    client: &infermesh_client::Client,
    patience: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + patience.max(Duration::from_secs(5));
    while client.nodes().is_empty() {
        if Instant::now() >= deadline {
            return Err("no node registered for the service".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub fn main(args: BenchArgs) -> i32 {
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
            if let Err(code) = direct(target, args.size_bytes as usize, args.wait_ready, None).await
            {
                return code;
            }
            let client = infermesh_client::Client::builder()
                .registry(format!("static://{target}"))
                .local_node(target.clone())
                .deadline(deadline)
                .transports(args.transport.expect("checked").paths())
                .build()
                .await;
            match client {
                Ok(c) => Caller::Mesh(c),
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
            if let Some(transport) = args.transport {
                builder = builder.transports(transport.paths());
            }
            match builder.build().await {
                Ok(c) => {
                    if let Err(e) = wait_for_nodes(&c, args.wait_ready).await {
                        eprintln!("error: {target_name}: {e}");
                        return exit::UNAVAILABLE;
                    }
                    Caller::Mesh(c)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit::USAGE;
                }
            }
        }
        (None, None) => unreachable!("clap requires --target or --registry"),
    };

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
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (caller, request, done) = (caller.clone(), request.clone(), Arc::clone(&done));
            let timeout = deadline;
            tokio::spawn(async move {
                let mut result = TaskResult {
                    hist: Some(new_histogram()),
                    hist_all: Some(new_histogram()),
                    ..Default::default()
                };
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    let outcome = caller.call(request.clone(), timeout).await;
                    let took = sent.elapsed();
                    if sent < measure_from {
                        continue;
                    }
                    let us = (took.as_micros() as u64).max(1);
                    result
                        .hist_all
                        .as_mut()
                        .expect("histogram")
                        .saturating_record(us);
                    match outcome {
                        Ok(node) => {
                            result
                                .hist
                                .as_mut()
                                .expect("histogram")
                                .saturating_record(us);
                            if let Some(node) = node {
                                *result.nodes.entry(node).or_default() += 1;
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(code) => {
                            *result.errors.entry(code).or_default() += 1;
                        }
                    }
                }
                result
            })
        })
        .collect();
    // The client forgets a node that leaves membership: note each node's
    // last attempt while the load runs, so that one that left still shows.
    let last_attempts = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    if let Caller::Mesh(c) = &caller {
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
        concurrency: args.concurrency,
        size_bytes,
        requests,
        errors: error_count,
        errors_by_code: errors,
        requests_by_node: nodes,
        last_attempt_unix_ms_by_node: match &caller {
            Caller::Mesh(c) => {
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
        transport: args.transport.map(|t| format!("{t:?}").to_lowercase()),
        paths: match (&caller, args.transport) {
            (Caller::Mesh(c), Some(_)) => c
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

fn print_human(r: &Report) {
    println!(
        "target {}  model {}  concurrency {}  payload {} B ({} rows)",
        r.target,
        r.model,
        r.concurrency,
        r.size_bytes,
        r.size_bytes / ROW_BYTES
    );
    println!(
        "requests {}  errors {}  duration {:.2} s",
        r.requests, r.errors, r.duration_s
    );
    for (code, n) in &r.errors_by_code {
        println!("  {code}: {n}");
    }
    for (node, n) in &r.requests_by_node {
        println!("  node {node}: {n} requests");
    }
    println!(
        "throughput {:.1} req/s  {:.2} MiB/s",
        r.throughput_rps,
        r.bytes_per_s / (1024.0 * 1024.0)
    );
    if let Some(t) = &r.transport {
        let paths: Vec<String> = r.paths.iter().map(|(p, v)| format!("{p} {v}")).collect();
        println!("transport {t}: {}", paths.join("  "));
    }
    if let Some(m) = r.memcpy_bytes_per_s {
        println!(
            "memcpy of the same size: {:.2} MiB/s (transport reaches {:.1}% of it)",
            m / (1024.0 * 1024.0),
            100.0 * r.bytes_per_s / m
        );
    }
    for (label, l) in [
        ("successes   ", &r.latency_ms),
        ("all requests", &r.latency_all_ms),
    ] {
        println!(
            "latency ms, {label}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p999 {:.3}  max {:.3}  mean {:.3}",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        );
    }
}
