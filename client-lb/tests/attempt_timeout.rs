//! The per-attempt timeout moves a stalled call to another node; with no
//! other node to move to it would only fail the call early, so there the
//! attempt gets the whole deadline (tokio's paused clock, an in-process
//! transport whose answers slow down on cue).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{InProcess, request};
use infermesh_client::Client;

const A: &str = "127.0.0.1:1";
const B: &str = "127.0.0.1:2";

async fn client(nodes: &str, transport: Arc<InProcess>) -> Client {
    let client = Client::builder()
        .registry(format!("static://{nodes}"))
        .deadline(Duration::from_secs(10))
        .seed(5)
        .transport(transport)
        .build()
        .await
        .unwrap();
    // Past the slow start.
    tokio::time::sleep(Duration::from_secs(30)).await;
    client
}

/// Both nodes answer in 2 ms until told otherwise.
fn slow() -> Arc<InProcess> {
    let fast = Duration::from_millis(2);
    Arc::new(InProcess::new(&[(A, fast), (B, fast)]))
}

#[tokio::test(start_paused = true)]
async fn a_one_node_call_slower_than_its_attempt_timeout_still_succeeds() {
    let transport = slow();
    let client = client(A, transport.clone()).await;
    // Teach the client that the node answers in 2 ms: its per-attempt
    // timeout is then the floor (250 ms).
    for _ in 0..50 {
        client.infer(request()).await.unwrap();
    }
    // Now one answer takes 2 s: well past the per-attempt timeout, well
    // within the 10 s deadline. With nowhere else to go, the call waits.
    transport.set_all(Duration::from_secs(2));
    client
        .infer(request())
        .await
        .expect("the call is given the whole deadline");
    assert_eq!(transport.answered(A), 51);
    let stats = client.node_stats();
    assert_eq!((stats[A].attempts, stats[A].timeouts), (51, 0));
}

#[tokio::test(start_paused = true)]
async fn with_another_node_a_stalled_attempt_moves_there() {
    let transport = slow();
    let client = client(&format!("{A},{B}"), transport.clone()).await;
    for _ in 0..100 {
        client.infer(request()).await.unwrap();
    }
    let before = transport.answered(A) + transport.answered(B);
    assert_eq!(before, 100);
    // Every answer now takes 2 s: the first attempt times out at its
    // per-attempt timeout and the call moves to the other node, whose
    // attempt is the last and may use the rest of the deadline.
    transport.set_all(Duration::from_secs(2));
    let result = client.infer(request()).await;
    assert!(result.is_ok(), "{result:?}");
    let stats = client.node_stats();
    let attempts: u64 = stats.values().map(|s| s.attempts).sum();
    let timeouts: u64 = stats.values().map(|s| s.timeouts).sum();
    assert_eq!(
        (attempts, timeouts),
        (102, 1),
        "one timed-out attempt, then one on the other node"
    );
}
