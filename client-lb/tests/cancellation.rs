//! Cancellation cannot leak load: 10,000 calls against two nodes, each
//! cancelled at a random point by a `select!` with a timer (seeded RNG,
//! tokio's paused clock, an in-process transport with fixed service times).
//! Afterwards both nodes' in-flight counts are zero and traffic is shared as
//! it was before the cancellations.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{InProcess, request};
use infermesh_client::Client;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

const A: &str = "127.0.0.1:1";
const B: &str = "127.0.0.1:2";

/// `calls` calls from 8 concurrent callers; with `cancel`, each call races
/// a timer of 0 to 6 ms. Returns (completed per node, cancelled).
async fn run(
    client: &Client,
    calls: usize,
    cancel: bool,
    seed: u64,
) -> (HashMap<String, u64>, u64) {
    let callers = 8;
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(seed + c as u64);
                let mut done: HashMap<String, u64> = HashMap::new();
                let mut cancelled = 0;
                for _ in 0..calls / callers {
                    let timer = Duration::from_micros(rng.random_range(0..6_000));
                    let call = client.infer_on(request());
                    let result = if cancel {
                        tokio::select! {
                            r = call => Some(r),
                            _ = tokio::time::sleep(timer) => None,
                        }
                    } else {
                        Some(call.await)
                    };
                    match result {
                        Some(Ok((_, node))) => *done.entry(node).or_default() += 1,
                        Some(Err(e)) => panic!("call failed: {e}"),
                        None => cancelled += 1,
                    }
                }
                (done, cancelled)
            })
        })
        .collect();
    let mut done: HashMap<String, u64> = HashMap::new();
    let mut cancelled = 0;
    for t in tasks {
        let (d, c) = t.await.unwrap();
        for (node, n) in d {
            *done.entry(node).or_default() += n;
        }
        cancelled += c;
    }
    (done, cancelled)
}

fn share_of_a(done: &HashMap<String, u64>) -> f64 {
    let a = done.get(A).copied().unwrap_or(0) as f64;
    let b = done.get(B).copied().unwrap_or(0) as f64;
    a / (a + b)
}

#[tokio::test(start_paused = true)]
async fn cancelled_calls_leave_no_load_behind() {
    // A takes 2 ms, B 4 ms.
    let transport = Arc::new(InProcess::new(&[
        (A, Duration::from_millis(2)),
        (B, Duration::from_millis(4)),
    ]));
    let client = Client::builder()
        .registry(format!("static://{A},{B}"))
        .seed(3)
        .transport(transport.clone())
        .build()
        .await
        .unwrap();
    // Past the slow start of both nodes.
    tokio::time::sleep(Duration::from_secs(30)).await;

    let (before, _) = run(&client, 2_000, false, 1).await;
    let (during, cancelled) = run(&client, 10_000, true, 2).await;
    let stats = client.node_stats();
    for node in [A, B] {
        assert_eq!(
            stats[node].in_flight, 0,
            "{node} keeps load after cancellations: {stats:?}"
        );
    }
    let (after, _) = run(&client, 2_000, false, 3).await;

    let completed: u64 = during.values().sum();
    println!(
        "cancelled {cancelled}, completed {completed}; share of A: before {:.3}, after {:.3}",
        share_of_a(&before),
        share_of_a(&after)
    );
    assert!(
        cancelled > 1_000 && completed > 1_000,
        "the timers cut calls at many points"
    );
    // A is twice as fast: it takes most of the traffic, B still a fair part,
    // and the cancellations changed nothing of that.
    assert!(share_of_a(&before) > 0.5 && share_of_a(&before) < 0.9);
    assert!(
        (share_of_a(&after) - share_of_a(&before)).abs() < 0.1,
        "traffic shared as before: {before:?} then {after:?}"
    );
    let stats = client.node_stats();
    assert_eq!(stats[A].in_flight + stats[B].in_flight, 0);
    assert_eq!(
        stats[A].failures + stats[B].failures,
        0,
        "a cancellation is no failure"
    );
}
