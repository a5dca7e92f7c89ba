//! `infermesh drill`: inject faults into a running agent's workers under
//! load and measure how the sentinel handles them.
//!
//! For each injection the drill notes the wall-clock time, fires the fault
//! (a request with `infermesh_fault=KIND` sent straight to the victim worker,
//! or a fake GPU Xid through the admin API), then reads the agent's own event
//! log for that worker (admin `Status`, microsecond timestamps) to find when
//! it stopped routing to it and when it routed to it again. Meanwhile
//! `--concurrency` callers keep sending requests through the agent; every
//! failure is attributed to the injection window it fell in, and failures
//! sent after the agent stopped routing to the victim are counted apart —
//! that number must be 0.
//!
//! Each injection waits until every worker is routable and out of its crash
//! loop (no restart since its last `stable` event), so it measures the
//! response to one fault; give the agent a short `sentinel.stable_period`
//! (`scripts/drill.sh` uses 1 s) or the drill waits that long between
//! injections into the same worker. The drill reads the agent's period
//! (admin Status) and says so when it starts and when it waits; it cannot
//! change a running agent's.
//!
//! Needs an agent whose workers are `infermesh-testworker`s (for the
//! process faults) and `gpu.backend = "fake"` with `gpu = N` per worker (for
//! the Xid faults; the injected Xid 31 names the victim's pid, as the
//! driver's kernel log line does). A quarantine (Xid 79) is terminal, so it
//! runs at most once per GPU worker, always leaving one worker serving.
//! The real GPU faults (`device-assert`, `illegal-address`, `spin`) are
//! requests that `examples/torch-worker` answers with a real CUDA fault;
//! `scripts/gpu-drill.sh` runs them. Restarts of workers other than the
//! victim during an injection are counted as collateral: it must be 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use hdrhistogram::Histogram;
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::admin::{
    InjectGpuEventRequest, StatusRequest, WorkerStatus, inject_gpu_event_request,
};
use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::inference::{
    InferParameter, ModelInferRequest, infer_parameter::ParameterChoice,
};
use infermesh_proto::tensor::f32_to_raw;
use serde::Serialize;
use tonic::transport::Channel;

use crate::exit;
use crate::ops::Admin;
use crate::say::say;

/// The faults a drill can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    CudaCrash,
    CudaSticky,
    Hang,
    /// Inference blocks while the control plane answers.
    Stall,
    Xid31,
    Xid79,
    /// torch-worker: an out-of-bounds index on a CUDA tensor.
    DeviceAssert,
    /// torch-worker: a kernel storing through a wild pointer.
    IllegalAddress,
    /// torch-worker: a kernel spinning on `clock64()` for a bounded time.
    Spin,
}

impl Fault {
    /// The faults the test worker and the fake GPU backend make.
    const ALL: [Fault; 6] = [
        Fault::CudaCrash,
        Fault::CudaSticky,
        Fault::Hang,
        Fault::Stall,
        Fault::Xid31,
        Fault::Xid79,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::CudaCrash => "cuda-crash",
            Fault::CudaSticky => "cuda-sticky",
            Fault::Hang => "hang",
            Fault::Stall => "stall",
            Fault::Xid31 => "xid-31",
            Fault::Xid79 => "xid-79",
            Fault::DeviceAssert => "device-assert",
            Fault::IllegalAddress => "illegal-address",
            Fault::Spin => "spin",
        }
    }

    fn quarantines(self) -> bool {
        self == Fault::Xid79
    }
}

/// `infermesh drill --help`.
pub const ABOUT: &str = "\
Inject faults into a running agent's workers under load and report detection and recovery
times (needs test workers and, for the Xid faults, the fake GPU backend).

Before each injection the drill waits until every worker is routable and out of its crash loop:
a worker restarted by the previous injection must stay up for the agent's sentinel.stable_period
(60s by default) before the next. The drill reads that period from the agent and says so; it
cannot change it. Give the agent a short one for drills, e.g. in its config:

  [sentinel]
  stable_period = \"1s\"

(scripts/drill.sh starts its agent so). With --json, stdout holds the JSON report only.";

/// Inject faults under load and report detection and recovery times.
#[derive(Debug, Args)]
pub struct DrillArgs {
    /// The agent's OIP address (load goes through it).
    #[arg(long)]
    target: String,
    /// The agent's admin address.
    #[arg(long)]
    admin: String,
    /// File holding the agent's admin token (Xid injection is a mutating call).
    #[arg(
        long,
        alias = "token-file",
        env = "INFERMESH_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    admin_token_file: Option<std::path::PathBuf>,
    /// Faults to inject (repeatable). Default: all.
    #[arg(long = "fault", value_enum)]
    faults: Vec<Fault>,
    /// Injections per fault kind (quarantines: at most one per GPU worker but one).
    /// Before each, the drill waits until every worker is out of its crash
    /// loop: a restarted worker must stay up for the agent's
    /// `sentinel.stable_period` (60s by default), so give the agent a short
    /// one for drills (`scripts/drill.sh` uses 1s).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    count: u32,
    /// Callers sending load through the agent meanwhile.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// Model to call.
    #[arg(long, default_value = "dense")]
    model: String,
    /// Give up on one injection (and on the wait before it) after this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    patience: Duration,
    /// TLS to the agent (`--tls-ca` turns it on for both addresses).
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// Print the report as one JSON object on stdout, and nothing else
    /// there (the table goes to stderr).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct FaultReport {
    fault: &'static str,
    injections: u32,
    detected: u32,
    stop_routing_ms: Percentiles,
    serving_again_ms: Option<Percentiles>,
    serving_again_minus_startup_ms: Option<Percentiles>,
    requests: u64,
    failed: u64,
    failed_after_detection: u64,
    collateral_restarts: u64,
}

#[derive(Debug, Serialize, Clone, Copy)]
struct Percentiles {
    p50: f64,
    p99: f64,
    max: f64,
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |v: u64| v as f64 / 1000.0;
    Percentiles {
        p50: ms(h.value_at_quantile(0.5)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One finished load request: when it was sent and whether it failed.
struct Sample {
    sent_micros: u64,
    ok: bool,
}

pub fn main(args: DrillArgs) -> i32 {
    crate::say::json_on_stdout(args.json);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(run(args))
}

fn uri(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

async fn run(args: DrillArgs) -> i32 {
    let tls = match args.tls.load() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return e.code;
        }
    };
    let admin = match crate::ops::read_token(args.admin_token_file.as_ref()) {
        Ok(token) => {
            let dial = tls
                .as_ref()
                .map(|t| infermesh_tls::TlsConnector::new(t, None));
            crate::ops::connect(&args.admin, Duration::from_secs(5), token, dial).await
        }
        Err(e) => Err(e),
    };
    let admin = match admin {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return e.code;
        }
    };
    let oip = match infermesh_proto::channel::oip_channel_tls(
        &args.target,
        Duration::from_secs(5),
        tls.as_ref(),
        None,
    ) {
        Ok(c) => GrpcInferenceServiceClient::new(c),
        Err(e) => {
            eprintln!("error: --target '{}': {e}", args.target);
            return exit::USAGE;
        }
    };
    let faults = if args.faults.is_empty() {
        Fault::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    // What the drill will wait for between injections into one worker.
    let stable_period = match admin.clone().status(StatusRequest {}).await {
        Ok(s) => Duration::from_millis(s.into_inner().stable_period_ms),
        Err(e) => {
            eprintln!("error: admin Status of {}: {}", args.admin, e.message());
            return exit::UNAVAILABLE;
        }
    };
    eprintln!(
        "drill: {} fault kind(s) x {} injection(s); before each, every worker must be routable \
         and out of its crash loop: a restarted worker waits out the agent's \
         sentinel.stable_period ({}){}",
        faults.len(),
        args.count,
        humantime::format_duration(stable_period),
        if stable_period > Duration::from_secs(5) && args.count > 1 {
            "; that is the wait between injections into one worker. Give the agent a \
             shorter [sentinel] stable_period for drills (scripts/drill.sh uses 1s)"
        } else {
            ""
        }
    );
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..args.concurrency)
        .map(|_| {
            tokio::spawn(load_loop(
                oip.clone(),
                request(&args.model, None),
                Arc::clone(&samples),
                Arc::clone(&stop),
            ))
        })
        .collect();

    let mut reports = Vec::new();
    let mut failed = false;
    for fault in faults {
        match drill_one(&args, fault, admin.clone(), &samples, stable_period).await {
            Ok(r) => reports.push(r),
            Err(e) => {
                eprintln!("error: {} drill: {e}", fault.name());
                failed = true;
                break;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for l in load {
        let _ = l.await;
    }
    print_table(&reports);
    if args.json {
        println!("{}", serde_json::json!({ "faults": reports }));
    }
    let bad = reports
        .iter()
        .any(|r| r.failed_after_detection > 0 || r.detected < r.injections);
    if failed || bad {
        exit::FAILURE
    } else {
        exit::OK
    }
}

/// A 2-row request for the test worker's dense-shaped models, with the
/// `infermesh_fault` parameter set to `fault` if given (also used by the demo).
pub(crate) fn request(model: &str, fault: Option<&str>) -> ModelInferRequest {
    let input: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    let mut req = ModelInferRequest {
        model_name: model.to_string(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![2, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![f32_to_raw(&input).into()],
        ..Default::default()
    };
    if let Some(kind) = fault {
        req.parameters.insert(
            infermesh_proto::FAULT_PARAMETER.into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(kind.into())),
            },
        );
    }
    req
}

async fn load_loop(
    mut client: GrpcInferenceServiceClient<Channel>,
    req: ModelInferRequest,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let sent_micros = unix_micros();
        let mut r = tonic::Request::new(req.clone());
        r.set_timeout(Duration::from_secs(30));
        let ok = client.model_infer(r).await.is_ok();
        samples
            .lock()
            .expect("samples lock")
            .push(Sample { sent_micros, ok });
    }
}

async fn status(admin: &mut Admin) -> Result<Vec<WorkerStatus>, String> {
    admin
        .status(StatusRequest {})
        .await
        .map(|r| r.into_inner().workers)
        .map_err(|e| e.message().to_string())
}

/// Runs `args.count` injections of `fault` and summarizes them.
async fn drill_one(
    args: &DrillArgs,
    fault: Fault,
    mut admin: Admin,
    samples: &Mutex<Vec<Sample>>,
    stable_period: Duration,
) -> Result<FaultReport, String> {
    let (mut stop_h, mut again_h, mut net_h) = (histogram(), histogram(), histogram());
    let (mut injections, mut detected, mut collateral) = (0, 0, 0);
    let window_start = unix_micros();
    let mut detection_windows = Vec::new();
    for i in 0..args.count {
        let workers = wait_all_routable(&mut admin, args.patience, stable_period).await?;
        let candidates: Vec<_> = workers
            .iter()
            .filter(|w| {
                w.routable && (!matches!(fault, Fault::Xid31 | Fault::Xid79) || w.gpu.is_some())
            })
            .collect();
        if fault.quarantines() && candidates.len() < 2 {
            eprintln!(
                "{}: stopping after {injections} injection(s): a quarantine must leave a worker serving",
                fault.name()
            );
            break;
        }
        let Some(victim) = candidates
            .get(i as usize % candidates.len().max(1))
            .cloned()
            .cloned()
        else {
            return Err("no routable worker to inject into".into());
        };
        injections += 1;
        let t0 = unix_micros();
        inject(fault, &victim, &mut admin).await?;
        let deadline = Instant::now() + args.patience;
        let stopped = wait_for_event(&mut admin, &victim.id, "stop_routing", t0, deadline)
            .await?
            .map(|(at, _)| at);
        let Some(stopped) = stopped else {
            eprintln!(
                "{}: injection {} into {} was not detected within {:?}",
                fault.name(),
                i + 1,
                victim.id,
                args.patience
            );
            continue;
        };
        detected += 1;
        stop_h.saturating_record(stopped.saturating_sub(t0).max(1));
        if fault.quarantines() {
            detection_windows.push((stopped, u64::MAX));
            continue;
        }
        let resumed =
            wait_for_event(&mut admin, &victim.id, "resume_routing", stopped, deadline).await?;
        match resumed {
            Some((at, startup_ms)) => {
                collateral += restarts_of_others(&status(&mut admin).await?, &victim.id, t0, at);
                detection_windows.push((stopped, at));
                let again = at.saturating_sub(t0).max(1);
                again_h.saturating_record(again);
                net_h.saturating_record(again.saturating_sub(startup_ms * 1000).max(1));
            }
            None => {
                return Err(format!(
                    "{} did not serve again within {:?}",
                    victim.id, args.patience
                ));
            }
        }
    }
    let window_end = unix_micros();
    let samples = samples.lock().expect("samples lock");
    let in_window: Vec<_> = samples
        .iter()
        .filter(|s| s.sent_micros >= window_start && s.sent_micros <= window_end)
        .collect();
    // A request sent after the agent stopped routing to the victim must not
    // fail (it goes to a healthy worker).
    let failed_after = in_window
        .iter()
        .filter(|s| {
            !s.ok
                && detection_windows
                    .iter()
                    .any(|&(stop, end)| s.sent_micros > stop && s.sent_micros <= end)
        })
        .count() as u64;
    let restarts = !fault.quarantines() && detected > 0;
    Ok(FaultReport {
        fault: fault.name(),
        injections,
        detected,
        stop_routing_ms: percentiles(&stop_h),
        serving_again_ms: restarts.then(|| percentiles(&again_h)),
        serving_again_minus_startup_ms: restarts.then(|| percentiles(&net_h)),
        requests: in_window.len() as u64,
        failed: in_window.iter().filter(|s| !s.ok).count() as u64,
        failed_after_detection: failed_after,
        collateral_restarts: collateral,
    })
}

/// Restarts of workers other than `victim` between `from` and `to` (Unix µs).
fn restarts_of_others(workers: &[WorkerStatus], victim: &str, from: u64, to: u64) -> u64 {
    workers
        .iter()
        .filter(|w| w.id != victim)
        .flat_map(|w| &w.events)
        .filter(|e| e.kind == "restart" && (from..=to).contains(&e.unix_micros))
        .count() as u64
}

/// Polls the worker's event log until an event of `kind` at or after
/// `after` (Unix µs) shows up; returns its time and the worker's startup
/// time then, or `None` past `deadline`.
async fn wait_for_event(
    admin: &mut Admin,
    worker: &str,
    kind: &str,
    after: u64,
    deadline: Instant,
) -> Result<Option<(u64, u64)>, String> {
    loop {
        let w = find(&status(admin).await?, worker)?;
        if let Some(e) = w
            .events
            .iter()
            .find(|e| e.kind == kind && e.unix_micros >= after)
        {
            return Ok(Some((e.unix_micros, w.startup_ms)));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn find(workers: &[WorkerStatus], id: &str) -> Result<WorkerStatus, String> {
    workers
        .iter()
        .find(|w| w.id == id)
        .cloned()
        .ok_or_else(|| format!("worker {id} disappeared"))
}

/// Whether the worker is out of any crash loop: no restart since its last
/// `stable` event. Injecting into a worker still in its stable period would
/// measure the crash-loop backoff, not the response to one fault.
fn settled(w: &WorkerStatus) -> bool {
    w.events
        .iter()
        .rev()
        .find(|e| e.kind == "restart" || e.kind == "stable")
        .is_none_or(|e| e.kind == "stable")
}

/// Waits until every worker that is not quarantined is routable and settled;
/// says once what it waits for when a worker is still in its stable period.
async fn wait_all_routable(
    admin: &mut Admin,
    patience: Duration,
    stable_period: Duration,
) -> Result<Vec<WorkerStatus>, String> {
    let deadline = Instant::now() + patience;
    let mut said = false;
    loop {
        let workers = status(admin).await?;
        if workers
            .iter()
            .all(|w| (w.routable && settled(w)) || w.state == "quarantined")
        {
            return Ok(workers);
        }
        let unsettled: Vec<&str> = workers
            .iter()
            .filter(|w| w.routable && !settled(w))
            .map(|w| w.id.as_str())
            .collect();
        if !said && !unsettled.is_empty() {
            eprintln!(
                "waiting for {} to stay up for the agent's sentinel.stable_period ({}) after \
                 a restart, before the next injection",
                unsettled.join(", "),
                humantime::format_duration(stable_period)
            );
            said = true;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "workers not all ready after {patience:?}{}",
                if unsettled.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} still within sentinel.stable_period = {}; give the agent a \
                         shorter one, or the drill a longer --patience)",
                        unsettled.join(", "),
                        humantime::format_duration(stable_period)
                    )
                }
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn inject(fault: Fault, victim: &WorkerStatus, admin: &mut Admin) -> Result<(), String> {
    let xid = |code, pid| async move {
        let gpu = victim.gpu.ok_or("worker has no GPU")?;
        admin
            .inject_gpu_event(InjectGpuEventRequest {
                gpu,
                kind: Some(inject_gpu_event_request::Kind::Xid(code)),
                pid,
            })
            .await
            .map(|_| ())
            .map_err(|e| e.message().to_string())
    };
    match fault {
        // The driver names the faulting process of an application Xid.
        Fault::Xid31 => xid(31, Some(victim.pid)).await,
        Fault::Xid79 => xid(79, None).await,
        Fault::CudaCrash
        | Fault::CudaSticky
        | Fault::Hang
        | Fault::Stall
        | Fault::DeviceAssert
        | Fault::IllegalAddress
        | Fault::Spin => {
            let kind = fault.name();
            let channel = Channel::from_shared(uri(&victim.address))
                .map_err(|e| e.to_string())?
                .connect_lazy();
            let mut client = GrpcInferenceServiceClient::new(channel);
            let req = request(
                victim.models.first().map(String::as_str).unwrap_or("dense"),
                Some(kind),
            );
            // The answer (if any) does not matter: the worker crashes, errs or hangs.
            tokio::spawn(async move {
                let mut r = tonic::Request::new(req);
                r.set_timeout(Duration::from_secs(60));
                let _ = client.model_infer(r).await;
            });
            Ok(())
        }
    }
}

fn print_table(reports: &[FaultReport]) {
    let fmt = |p: Option<Percentiles>| {
        p.map_or("-".to_string(), |p| format!("{:.1} / {:.1}", p.p50, p.p99))
    };
    say!(
        "{:<15} {:>5} {:>9} {:>22} {:>22} {:>24} {:>9} {:>7} {:>16} {:>10}",
        "fault",
        "n",
        "detected",
        "stop routing p50/p99",
        "serving again p50/p99",
        "again−startup p50/p99",
        "requests",
        "failed",
        "failed after det.",
        "collateral"
    );
    for r in reports {
        say!(
            "{:<15} {:>5} {:>9} {:>19} ms {:>19} ms {:>21} ms {:>9} {:>7} {:>16} {:>10}",
            r.fault,
            r.injections,
            r.detected,
            fmt(Some(r.stop_routing_ms)),
            fmt(r.serving_again_ms),
            fmt(r.serving_again_minus_startup_ms),
            r.requests,
            r.failed,
            r.failed_after_detection,
            r.collateral_restarts
        );
    }
}
