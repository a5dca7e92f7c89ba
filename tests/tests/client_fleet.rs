//! Issue 12: the client library in a fleet that is not uniform or not well.
//!
//! - Model-aware routing: two nodes of one service serving different models
//!   each get only the requests for their model (real ZooKeeper); a node
//!   that answers `NOT_FOUND` is passed over for that model and the request
//!   is retried elsewhere (a static list, whose records name no models); a
//!   model nobody serves fails at once with a typed error; what the client
//!   keeps per node goes when the node leaves.
//! - Hung nodes: one of three agents SIGSTOPped for 8 s under load (its TCP
//!   connections stay open): no request fails with a 2 s deadline, and
//!   traffic leaves the stopped node. The figures printed go to BENCHMARKS.md.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infermesh_client::{Client, ClientError};
use infermesh_proto::inference::ModelInferRequest;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, dense, eventually, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn zk_agent(zk: &Zk, service: &str, node: &str, worker_flags: &str, session: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"{service}\"\n\
             session_timeout = \"{session}\"\n[[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker(worker_flags)
        ))
        .spawn()
}

fn request(model: &str, input: &[f32]) -> ModelInferRequest {
    let mut req = dense::request(input, true);
    req.model_name = model.into();
    req
}

/// Sends `n` requests for `model`; every one must succeed with the right
/// answer. Returns the answers per node.
async fn send(client: &Client, model: &str, n: usize) -> HashMap<String, usize> {
    let input = dense::input(1, 4);
    let mut per_node = HashMap::new();
    for i in 0..n {
        let (resp, node) = client
            .infer_on(request(model, &input))
            .await
            .unwrap_or_else(|e| panic!("request {i} for {model} failed: {e}"));
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
        *per_node.entry(node).or_default() += 1;
    }
    per_node
}

#[tokio::test]
async fn requests_go_to_the_nodes_serving_their_model() {
    let zk = Zk::start().await;
    let a = zk_agent(&zk, "models", "node-dense", "--model dense", "2s");
    let b = zk_agent(&zk, "models", "node-other", "--model other", "2s");
    a.wait_ready().await;
    b.wait_ready().await;
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("models")
        .seed(5)
        .build()
        .await
        .unwrap();
    eventually(
        "the client sees both nodes with their models ready",
        || async {
            let m = client.membership();
            (m.nodes.len() == 2 && m.nodes.iter().all(|r| r.models.iter().any(|m| m.ready)))
                .then_some(())
        },
    )
    .await;
    let dense = send(&client, "dense", 100).await;
    let other = send(&client, "other", 100).await;
    assert_eq!(dense, HashMap::from([("node-dense".to_string(), 100)]));
    assert_eq!(other, HashMap::from([("node-other".to_string(), 100)]));
    let stats = client.node_stats();
    assert_eq!(
        stats["node-dense"].attempts, 100,
        "no request sent to the wrong node"
    );
    assert_eq!(
        stats["node-other"].attempts, 100,
        "no request sent to the wrong node"
    );

    match client.infer(request("missing", &dense::input(1, 0))).await {
        Err(ClientError::ModelNotFound { model, known, .. }) => {
            assert_eq!(model, "missing");
            assert!(
                known.contains("node-dense [dense]") && known.contains("node-other [other]"),
                "{known}"
            );
        }
        other => panic!("expected ModelNotFound, got {other:?}"),
    }

    // node-other leaves: what the client kept for it goes, and its model
    // is no longer served.
    drop(b);
    eventually("node-other leaves membership", || async {
        (client.membership().nodes.len() == 1).then_some(())
    })
    .await;
    eventually("the client forgets node-other", || async {
        (!client.node_stats().contains_key("node-other")).then_some(())
    })
    .await;
    match client.infer(request("other", &dense::input(1, 0))).await {
        Err(ClientError::ModelNotFound { model, .. }) => assert_eq!(model, "other"),
        other => panic!("expected ModelNotFound, got {other:?}"),
    }
    assert_eq!(send(&client, "dense", 10).await.len(), 1);
}

#[tokio::test]
async fn not_found_passes_the_node_over_for_that_model() {
    let a = Agent::builder()
        .worker(testworker("--model dense"))
        .start()
        .await;
    let b = Agent::builder()
        .worker(testworker("--model other"))
        .start()
        .await;
    // A static list advertises no models: only NOT_FOUND tells them apart.
    let client = Client::builder()
        .registry(format!("static://{},{}", a.oip, b.oip))
        .seed(9)
        .build()
        .await
        .unwrap();
    let other = send(&client, "other", 60).await;
    let dense = send(&client, "dense", 60).await;
    let (a_id, b_id) = (a.oip.to_string(), b.oip.to_string());
    assert_eq!(other, HashMap::from([(b_id.clone(), 60)]));
    assert_eq!(dense, HashMap::from([(a_id.clone(), 60)]));
    let stats = client.node_stats();
    // At most one NOT_FOUND per (node, model); none counts as a failure.
    assert!(stats[&a_id].attempts <= 61, "{stats:?}");
    assert!(stats[&b_id].attempts <= 61, "{stats:?}");
    assert_eq!(
        stats[&a_id].failures + stats[&b_id].failures,
        0,
        "{stats:?}"
    );
    match client.infer(request("missing", &dense::input(1, 0))).await {
        Err(ClientError::ModelNotFound { model, .. }) => assert_eq!(model, "missing"),
        other => panic!("expected ModelNotFound, got {other:?}"),
    }
}

/// One request as the load saw it.
struct Sample {
    sent: Instant,
    latency: Duration,
    ok: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_agent_under_load_fails_no_request() {
    const STALL: Duration = Duration::from_secs(8);
    let zk = Zk::start().await;
    // The session outlives the stall: the stopped node stays a member, so
    // only the client's own timeouts can take traffic off it.
    let agents: Vec<Agent> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| zk_agent(&zk, "hung", n, "--service-time-ms 2", "20s"))
        .collect();
    for a in &agents {
        a.wait_ready().await;
    }
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("hung")
        .deadline(Duration::from_secs(2))
        .seed(13)
        .build()
        .await
        .unwrap();
    eventually("the client sees the three nodes", || async {
        (client.membership().nodes.len() == 3).then_some(())
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let callers: Vec<_> = (0..8)
        .map(|i| {
            let (client, stop, samples) = (client.clone(), stop.clone(), samples.clone());
            tokio::spawn(async move {
                let input = dense::input(1, i);
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let result = client.infer(request("dense", &input)).await;
                    if let Err(e) = &result {
                        // What each node had seen by then tells which
                        // retry rule gave up (attempt limit, no other
                        // node, deadline or budget).
                        eprintln!(
                            "request failed after {:?}: {e:?}; per node: {:?}",
                            sent.elapsed(),
                            client.node_stats()
                        );
                    }
                    samples.lock().unwrap().push(Sample {
                        sent,
                        latency: sent.elapsed(),
                        ok: result.is_ok(),
                    });
                }
            })
        })
        .collect();
    eventually("every node takes load", || async {
        let s = client.node_stats();
        ["node-a", "node-b", "node-c"]
            .iter()
            .all(|n| s.get(*n).is_some_and(|n| n.attempts > 50))
            .then_some(())
    })
    .await;

    // Stop node-a; watch its attempt count through the stall.
    let pid = Pid::from_raw(agents[0].pid() as i32);
    let attempts_a = || client.node_stats().get("node-a").map_or(0, |s| s.attempts);
    let before = attempts_a();
    let timeouts_before = client.node_stats()["node-a"].timeouts;
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    let mut trace = vec![(Duration::ZERO, before)];
    // The stall's length is the experiment, not a wait for an event.
    while stopped.elapsed() < STALL {
        tokio::time::sleep(Duration::from_millis(50)).await;
        trace.push((stopped.elapsed(), attempts_a()));
    }
    let during_stall = attempts_a() - before;
    let timeouts_a = client.node_stats()["node-a"].timeouts - timeouts_before;
    kill(pid, Signal::SIGCONT).unwrap();

    // Traffic left at the last attempt before the first second without one.
    let left_at = trace
        .iter()
        .position(|&(t, n)| {
            trace
                .iter()
                .any(|&(u, m)| u >= t + Duration::from_secs(1) && m == n)
        })
        .map(|i| {
            let n = trace[i].1;
            trace.iter().find(|&&(_, m)| m == n).expect("present").0
        })
        .unwrap_or(STALL);

    eventually("node-a answers again after SIGCONT", || async {
        (client.node_stats()["node-a"].attempts > before + during_stall + 20).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }

    let samples = samples.lock().unwrap();
    let failed = samples.iter().filter(|s| !s.ok).count();
    let mut stall: Vec<Duration> = samples
        .iter()
        .filter(|s| s.sent >= stopped && s.sent < stopped + STALL)
        .map(|s| s.latency)
        .collect();
    stall.sort();
    let p = |q: f64| stall[((stall.len() as f64 * q) as usize).min(stall.len() - 1)];
    let mut calm: Vec<Duration> = samples
        .iter()
        .filter(|s| s.sent < stopped)
        .map(|s| s.latency)
        .collect();
    calm.sort();
    let calm_p99 = calm[((calm.len() as f64 * 0.99) as usize).min(calm.len() - 1)];
    println!(
        "SIGSTOP 8 s, 3 agents, 8 callers, deadline 2 s: {} requests in all, {failed} failed; \
         during the stall {} requests, {during_stall} attempts started on the stopped node, \
         {timeouts_a} attempts on it timed out (those in flight at the stop included), \
         traffic left it {:.2} s after SIGSTOP; latency during the stall p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms (p99 before the stall {:.1} ms)",
        samples.len(),
        stall.len(),
        left_at.as_secs_f64(),
        p(0.50).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
        stall.last().expect("requests in the stall").as_secs_f64() * 1e3,
        calm_p99.as_secs_f64() * 1e3,
    );
    assert_eq!(failed, 0, "no request fails while a node hangs");
    assert!(timeouts_a >= 1, "attempts on the stopped node timed out");
    assert!(
        (during_stall as usize) * 50 < stall.len(),
        "traffic leaves the stopped node: {during_stall} of {} attempts",
        stall.len()
    );
}
