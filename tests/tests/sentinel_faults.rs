//! The sentinel end to end: for each fault — a CUDA crash, Triton's sticky
//! CUDA error, a hang, an application Xid (31, blamed on the worker's pid as
//! the driver's kernel log line blames it) and a GPU-fatal Xid (79) —
//! under a constant request stream through an agent with two workers, the
//! agent stops routing to the failed worker, restarts it (or quarantines
//! it), and the worker serves again. No request sent after detection fails,
//! and requests caught on the failed worker end with UNAVAILABLE, not a hang.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::admin::{
    InjectGpuEventRequest, RestartWorkerRequest, WorkerStatus, inject_gpu_event_request,
};
use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};
use infermesh_tests::{Agent, dense, eventually, testworker};
use tonic::Code;

/// Two workers on fake GPUs 0 and 1, with fast probes so a hang is found quickly.
fn config() -> String {
    format!(
        r#"
# Pinned, so the weight reads as the share of workers routable.
weight = 1.0

[sentinel]
probe_interval = "100ms"
probe_timeout = "300ms"
backoff_base = "100ms"

[gpu]
backend = "fake"
fake_devices = 2

[[workers]]
id = "w0"
command = "{w}"
gpu = 0
stop_grace = "2s"

[[workers]]
id = "w1"
command = "{w}"
gpu = 1
stop_grace = "2s"
"#,
        w = testworker("--service-time-ms 2")
    )
}

struct Outcome {
    /// Microseconds since the Unix epoch, comparable with the agent's events.
    sent: u64,
    code: Code,
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Closed-loop load through the agent until `stop`.
fn start_load(agent: &Agent, stop: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Vec<Outcome>>> {
    (0..4)
        .map(|i| {
            let addr = format!("http://{}", agent.oip);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut client = GrpcInferenceServiceClient::connect(addr).await.unwrap();
                let input = dense::input(2, i);
                let mut out = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let sent = unix_micros();
                    let mut req = tonic::Request::new(dense::request(&input, true));
                    // Long enough never to fire unless a request hangs.
                    req.set_timeout(Duration::from_secs(20));
                    let code = match client.model_infer(req).await {
                        Ok(resp) => {
                            assert_eq!(dense::output(resp.get_ref()).0, dense::forward(&input));
                            Code::Ok
                        }
                        Err(s) => s.code(),
                    };
                    out.push(Outcome { sent, code });
                }
                out
            })
        })
        .collect()
}

async fn worker(agent: &Agent, id: &str) -> WorkerStatus {
    agent
        .status()
        .await
        .workers
        .into_iter()
        .find(|w| w.id == id)
        .unwrap()
}

/// Sends a request with `infermesh_fault=kind` straight to the worker.
fn trigger_on_worker(address: String, kind: &'static str) {
    tokio::spawn(async move {
        let mut client = GrpcInferenceServiceClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        let mut req = dense::request(&dense::input(1, 0), true);
        req.parameters.insert(
            "infermesh_fault".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(kind.into())),
            },
        );
        // The worker crashes, errs or hangs: the answer does not matter.
        let _ = client.model_infer(req).await;
    });
}

async fn inject_xid(agent: &Agent, gpu: u32, xid: u32, pid: Option<u32>) {
    let mut admin = agent.admin().await;
    admin
        .inject_gpu_event(InjectGpuEventRequest {
            gpu,
            kind: Some(inject_gpu_event_request::Kind::Xid(xid)),
            pid,
        })
        .await
        .unwrap();
}

enum Expect {
    Restart,
    Quarantine,
}

/// Runs load, fires `fault` at w0, and checks the sentinel's contract.
/// `reasons`: the fault reasons the agent may report (a crash is seen either
/// as its CUDA message on stderr or as the exit, whichever is read first).
async fn fault_under_load(
    fault: impl AsyncFnOnce(&Agent, &WorkerStatus),
    expect: Expect,
    reasons: &[&str],
) {
    let agent = Agent::builder().config(config()).start().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&agent, Arc::clone(&stop));
    eventually("load reaches both workers", || async {
        let s = agent.status().await;
        s.workers.iter().all(|w| w.requests > 5).then_some(())
    })
    .await;

    let before = worker(&agent, "w0").await;
    let t0 = unix_micros();
    fault(&agent, &before).await;
    // The agent's own event log: a restart can be over before a poll of the
    // worker's state would see it.
    let detected = eventually("the agent stops routing to w0", || async {
        let w = worker(&agent, "w0").await;
        w.events
            .iter()
            .find(|e| e.kind == "stop_routing" && e.unix_micros >= t0)
            .map(|e| e.unix_micros)
    })
    .await;

    let after = match expect {
        Expect::Restart => {
            let w = eventually("w0 restarted and routable again", || async {
                let w = worker(&agent, "w0").await;
                let resumed = w
                    .events
                    .iter()
                    .any(|e| e.kind == "resume_routing" && e.unix_micros > detected);
                (resumed && w.routable && w.pid != before.pid).then_some(w)
            })
            .await;
            assert_eq!(
                w.restarts,
                before.restarts + 1,
                "one restart per fault: {:#?}",
                w.events
            );
            eventually("w0 serves again", || async {
                (worker(&agent, "w0").await.requests > w.requests + 5).then_some(())
            })
            .await;
            w
        }
        Expect::Quarantine => {
            let w = eventually("w0 quarantined", || async {
                let w = worker(&agent, "w0").await;
                (w.state == "quarantined" && w.pid == 0).then_some(w)
            })
            .await;
            let status = agent.status().await;
            assert_eq!(
                status.state, "degraded",
                "a quarantined GPU marks the node degraded"
            );
            assert_eq!(
                status.weight, 0.5,
                "weight follows the share of routable workers"
            );
            let w1 = worker(&agent, "w1").await.requests;
            eventually("w1 keeps serving", || async {
                (worker(&agent, "w1").await.requests > w1 + 20).then_some(())
            })
            .await;
            assert_eq!(
                worker(&agent, "w0").await.restarts,
                before.restarts,
                "a quarantined worker is not restarted"
            );
            w
        }
    };
    assert!(
        reasons.iter().any(|r| after.last_fault.starts_with(r)),
        "last fault '{}' should start with one of {reasons:?}",
        after.last_fault
    );

    stop.store(true, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for task in load {
        outcomes.extend(task.await.unwrap());
    }
    let mut codes: HashMap<Code, usize> = HashMap::new();
    for o in &outcomes {
        *codes.entry(o.code).or_default() += 1;
    }
    let failed_after: Vec<_> = outcomes
        .iter()
        .filter(|o| o.sent > detected && o.code != Code::Ok)
        .collect();
    assert!(
        failed_after.is_empty(),
        "{} requests sent after detection failed: {codes:?}",
        failed_after.len()
    );
    for (code, n) in &codes {
        assert!(
            matches!(code, Code::Ok | Code::Unavailable),
            "{n} requests ended with {code:?}; failures must be UNAVAILABLE (retryable), never a hang: {codes:?}"
        );
    }
    let served_after = outcomes
        .iter()
        .filter(|o| o.sent > detected && o.code == Code::Ok)
        .count();
    assert!(
        served_after > 0,
        "load kept being served after detection: {codes:?}"
    );
}

#[tokio::test]
async fn cuda_crash_is_detected_and_the_worker_restarted() {
    fault_under_load(
        async |_, w| trigger_on_worker(w.address.clone(), "cuda-crash"),
        Expect::Restart,
        &["fault_pattern", "exit"],
    )
    .await;
}

#[tokio::test]
async fn sticky_cuda_error_is_detected_and_the_worker_restarted() {
    fault_under_load(
        async |_, w| trigger_on_worker(w.address.clone(), "cuda-sticky"),
        Expect::Restart,
        &["fault_pattern"],
    )
    .await;
}

#[tokio::test]
async fn hang_is_detected_by_the_probe_and_the_worker_restarted() {
    fault_under_load(
        async |_, w| trigger_on_worker(w.address.clone(), "hang"),
        Expect::Restart,
        &["hang"],
    )
    .await;
}

#[tokio::test]
async fn application_xid_restarts_the_worker_it_names() {
    fault_under_load(
        async |agent, w| inject_xid(agent, 0, 31, Some(w.pid)).await,
        Expect::Restart,
        &["xid"],
    )
    .await;
}

#[tokio::test]
async fn fatal_xid_quarantines_the_gpu() {
    fault_under_load(
        async |agent, _| inject_xid(agent, 0, 79, None).await,
        Expect::Quarantine,
        &["xid 79"],
    )
    .await;
}

#[tokio::test]
async fn operator_restart_through_the_admin_api() {
    let agent = Agent::builder().config(config()).start().await;
    let before = worker(&agent, "w1").await;
    let mut admin = agent.admin().await;
    admin
        .restart_worker(RestartWorkerRequest {
            worker: "w1".into(),
        })
        .await
        .unwrap();
    let after = eventually("w1 restarted", || async {
        let w = worker(&agent, "w1").await;
        (w.routable && w.pid != before.pid).then_some(w)
    })
    .await;
    assert_eq!(after.restarts, before.restarts + 1);
    let err = admin
        .restart_worker(RestartWorkerRequest {
            worker: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn xid_injection_needs_the_fake_backend() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let mut admin = agent.admin().await;
    let err = admin
        .inject_gpu_event(InjectGpuEventRequest {
            gpu: 0,
            kind: Some(inject_gpu_event_request::Kind::Xid(31)),
            pid: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
}
