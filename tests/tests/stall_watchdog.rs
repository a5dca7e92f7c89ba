//! The stall watchdog across processes (issue 25): an agent with two real
//! test workers and DEFAULT settings, serving ~1 ms requests. One worker's
//! inference then blocks while its control plane (ServerLive, ModelReady)
//! keeps answering, so the liveness probe passes. The watchdog must fault
//! it (`stall`), answer its callers with UNAVAILABLE, and restart it, with
//! a window under 10 s derived from its service times, while the other
//! worker keeps serving untouched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::admin::WorkerStatus;
use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};
use infermesh_tests::{Agent, dense, eventually, testworker};
use tonic::Code;

async fn worker(agent: &Agent, id: &str) -> WorkerStatus {
    agent
        .status()
        .await
        .workers
        .into_iter()
        .find(|w| w.id == id)
        .unwrap()
}

#[tokio::test]
async fn a_stalled_worker_is_restarted_while_the_other_keeps_serving() {
    let config = format!(
        r#"
[[workers]]
id = "w0"
command = "{w}"
[[workers]]
id = "w1"
command = "{w}"
"#,
        w = testworker("--service-time-ms 1")
    );
    let agent = Agent::builder().config(config).start().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|i| {
            let addr = format!("http://{}", agent.oip);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut client = GrpcInferenceServiceClient::connect(addr).await.unwrap();
                let input = dense::input(1, i);
                let mut codes: HashMap<Code, u64> = HashMap::new();
                while !stop.load(Ordering::SeqCst) {
                    let mut req = tonic::Request::new(dense::request(&input, true));
                    // Far beyond the watchdog: only a hang would reach it.
                    req.set_timeout(Duration::from_secs(50));
                    let code = match client.model_infer(req).await {
                        Ok(_) => Code::Ok,
                        Err(s) => s.code(),
                    };
                    *codes.entry(code).or_default() += 1;
                }
                codes
            })
        })
        .collect();
    eventually(
        "both workers have served a few hundred requests",
        || async {
            let s = agent.status().await;
            s.workers.iter().all(|w| w.requests > 300).then_some(())
        },
    )
    .await;

    // w0's inference blocks from now on; its probes keep passing.
    let w0 = worker(&agent, "w0").await;
    let mut direct = GrpcInferenceServiceClient::connect(format!("http://{}", w0.address))
        .await
        .unwrap();
    let mut stall = dense::request(&dense::input(1, 9), true);
    stall.parameters.insert(
        "infermesh_fault".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam("stall".into())),
        },
    );
    tokio::spawn(async move { direct.model_infer(stall).await });

    let after = eventually("w0 faulted for a stall and restarted", || async {
        let w = worker(&agent, "w0").await;
        (w.restarts == w0.restarts + 1 && w.routable).then_some(w)
    })
    .await;
    assert!(
        after.last_fault.starts_with("stall: "),
        "{}",
        after.last_fault
    );
    // The default window for a ~1 ms model: the 5 s floor, under 10 s.
    assert!(
        after
            .last_fault
            .contains("(stall window 5s: max(floor 5s, 4 × p99"),
        "{}",
        after.last_fault
    );
    let kinds: Vec<&str> = after.events.iter().map(|e| e.kind.as_str()).collect();
    let fault_at = kinds.iter().rposition(|k| *k == "fault").unwrap();
    assert_eq!(
        &kinds[fault_at - 3..=fault_at],
        ["stop_routing", "abort_in_flight", "state", "fault"],
        "{kinds:?}"
    );
    // How long it took, from the agent's own event log (not asserted:
    // timings belong in BENCHMARKS.md).
    let stopped = after
        .events
        .iter()
        .rfind(|e| e.kind == "stop_routing")
        .unwrap()
        .unix_micros;
    let resumed = after
        .events
        .iter()
        .rfind(|e| e.kind == "resume_routing")
        .unwrap()
        .unix_micros;
    eprintln!(
        "stall caught: {}; serving again {} ms after detection",
        after.last_fault,
        resumed.saturating_sub(stopped) / 1000
    );

    // The other worker kept serving, untouched.
    let w1_before = worker(&agent, "w1").await;
    eventually("w1 keeps serving", || async {
        (worker(&agent, "w1").await.requests > w1_before.requests + 100).then_some(())
    })
    .await;
    let w1 = worker(&agent, "w1").await;
    assert_eq!(w1.restarts, 0);
    assert!(
        w1.events.iter().all(|e| e.kind != "fault"),
        "{:?}",
        w1.events
    );
    stop.store(true, Ordering::SeqCst);
    let mut codes: HashMap<Code, u64> = HashMap::new();
    for task in load {
        for (code, n) in task.await.unwrap() {
            *codes.entry(code).or_default() += n;
        }
    }
    // Callers caught on w0 were answered UNAVAILABLE (retryable), none
    // waited out their deadline.
    assert!(
        codes
            .keys()
            .all(|c| matches!(c, Code::Ok | Code::Unavailable)),
        "{codes:?}"
    );
    assert!(
        codes.get(&Code::Unavailable).is_some_and(|&n| n > 0),
        "{codes:?}"
    );
    let metrics = agent.metrics().await;
    assert!(
        metrics.contains(r#"infermesh_worker_faults_total{worker="w0",reason="stall"} 1"#),
        "{metrics}"
    );
}
