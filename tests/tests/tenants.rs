//! Issue 26: two tenants sharing one node. One agent, one test worker
//! serving `hi` and `lo` (4 slots, 20 ms a request); `hi` belongs to tenant
//! `high` (priority 1, half the node), `lo` to `low` (priority 20, the other
//! half); the queue holds 16 requests per model.
//!
//! While `low` floods the node (24 callers: the worker, the queue and then
//! some, so that `low` is shed), none of `high`'s requests fail, and each
//! overtakes the `low` requests queued when it came: `low` requests sent
//! before a `high` one are answered after it, about a queue's worth each
//! time. With first-come first-served dispatch (the same agent without
//! `[[tenants]]`) a `high` request waits behind them instead, and overtakes
//! at most the few already inside the worker. Then `high` goes quiet and
//! `low` takes the whole worker. No timing thresholds: the assertions count
//! who was answered before whom, and whether slots were lent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{InferParameter, ModelInferRequest};
use infermesh_tests::{Agent, dense, eventually, testworker};
use tonic::Code;
use tonic::transport::Channel;

const QUEUE: usize = 16;
const SLOTS: u32 = 4;
const LOW_CALLERS: usize = 24;
const HIGH_CALLERS: usize = 2;
const HIGH_REQUESTS: usize = 30;

fn agent() -> Agent {
    Agent::builder()
        .config(format!(
            "[queue]\ncapacity = {QUEUE}\n\
             [[tenants]]\nname = \"high\"\nmodels = [\"hi\"]\npriority = 1\nshare = 0.5\n\
             [[tenants]]\nname = \"low\"\nmodels = [\"lo\"]\npriority = 20\nshare = 0.5\n\
             [[workers]]\ncommand = \"{}\"\n",
            testworker(&format!(
                "--model hi --model lo --service-time-ms 20 --concurrency {SLOTS}"
            ))
        ))
        .spawn()
}

fn request(model: &str, seed: u32) -> ModelInferRequest {
    let mut req = dense::request(&dense::input(1, seed), true);
    req.model_name = model.into();
    req
}

/// When a request was sent and when its answer came.
type Span = (Instant, Instant);

/// The value of the metric line starting with `series ` in `text`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `low`'s callers: each sends `lo` requests one after another until
/// `stop`, recording the span of each answered one; a request shed with
/// RESOURCE_EXHAUSTED must carry the retry hint, and its caller pauses
/// (a client told to go elsewhere, with nowhere else to go).
struct Flood {
    stop: Arc<AtomicBool>,
    shed: Arc<AtomicU64>,
    answered: Arc<Mutex<Vec<Span>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(client: &GrpcInferenceServiceClient<Channel>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let shed = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..LOW_CALLERS)
            .map(|i| {
                let (mut client, stop, shed, answered) =
                    (client.clone(), stop.clone(), shed.clone(), answered.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        match client.model_infer(request("lo", i as u32)).await {
                            Ok(_) => answered.lock().unwrap().push((sent, Instant::now())),
                            Err(s) if s.code() == Code::ResourceExhausted => {
                                assert!(
                                    s.metadata().get("grpc-retry-pushback-ms").is_some(),
                                    "a shed request without a retry hint: {s:?}"
                                );
                                shed.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(s) => panic!("a low request failed otherwise: {s:?}"),
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            shed,
            answered,
            tasks,
        }
    }

    async fn stop(self) -> Vec<Span> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a low caller panicked");
        }
        Arc::try_unwrap(self.answered)
            .expect("the callers are done")
            .into_inner()
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_overtakes_a_low_priority_flood_and_low_gets_the_idle_node() {
    let agent = agent();
    agent.wait_ready().await;
    let client = agent.client().await;

    // Triton's `priority` parameter reaches the scheduler: a number is
    // taken, anything else refused as Triton refuses it.
    let mut with_priority = request("hi", 0);
    with_priority.parameters.insert(
        "priority".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::Uint64Param(1)),
        },
    );
    client
        .clone()
        .model_infer(with_priority.clone())
        .await
        .unwrap();
    with_priority.parameters.insert(
        "priority".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam("1".into())),
        },
    );
    let refused = client.clone().model_infer(with_priority).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // Low floods until its queue overflows.
    let flood = Flood::start(&client);
    let shed = flood.shed.clone();
    eventually("low's queue overflows", || async {
        (shed.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;

    // High sends its requests; none fails.
    let high: Vec<Span> = {
        let callers: Vec<_> = (0..HIGH_CALLERS)
            .map(|i| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut spans = Vec::new();
                    for n in 0..HIGH_REQUESTS {
                        let sent = Instant::now();
                        let r = client
                            .model_infer(request("hi", (i * 100 + n) as u32))
                            .await;
                        if let Err(s) = r {
                            panic!("high request {n} of caller {i} failed: {s:?}");
                        }
                        spans.push((sent, Instant::now()));
                    }
                    spans
                })
            })
            .collect();
        let mut all = Vec::new();
        for c in callers {
            all.extend(c.await.expect("a high caller panicked"));
        }
        all
    };

    // High is quiet: low takes every slot of the worker, not only its half.
    eventually("low holds the whole worker", || async {
        let text = agent.metrics().await;
        let held = metric(&text, "infermesh_tenant_inflight{tenant=\"low\"}")?;
        (held >= f64::from(SLOTS)).then_some(())
    })
    .await;
    let low = flood.stop().await;

    // Each high request overtook the low ones queued when it came.
    let overtaken: Vec<usize> = high
        .iter()
        .map(|&(h_sent, h_done)| {
            low.iter()
                .filter(|&&(sent, done)| sent < h_sent && done > h_done)
                .count()
        })
        .collect();
    let mean = overtaken.iter().sum::<usize>() as f64 / overtaken.len() as f64;
    eprintln!(
        "{} high requests, low answered {} and shed {}; low requests each high one overtook: mean {mean:.1}, {overtaken:?}",
        high.len(),
        low.len(),
        shed.load(Ordering::Relaxed)
    );
    assert!(
        mean >= QUEUE as f64 / 2.0,
        "high requests overtook {mean:.1} queued low requests on average, not about a queue's worth ({QUEUE})"
    );

    let text = agent.metrics().await;
    let count = |series: &str| metric(&text, series).unwrap_or_else(|| panic!("no {series}"));
    assert_eq!(
        count("infermesh_tenant_admitted_total{tenant=\"high\"}"),
        (1 + HIGH_CALLERS * HIGH_REQUESTS) as f64
    );
    for reason in ["queue_full", "evicted", "rate"] {
        let series = format!("infermesh_tenant_shed_total{{tenant=\"high\",reason=\"{reason}\"}}");
        assert_eq!(count(&series), 0.0, "{series}");
    }
    assert!(count("infermesh_tenant_shed_total{tenant=\"low\",reason=\"queue_full\"}") > 0.0);
}
