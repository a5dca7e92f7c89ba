//! The per-attempt timeout moves a stalled call to another node; with no
//! other node to move to it would only fail the call early, so there the
//! attempt gets the whole deadline (tokio's paused clock, an in-process
//! transport whose answers slow down on cue).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use infermesh_client::paths::BoxFuture;
use infermesh_client::{Client, PathError, Peer, Transport};
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::Path;

const A: &str = "127.0.0.1:1";
const B: &str = "127.0.0.1:2";

/// Answers after `service_ms` (changeable), counting answers per node.
struct Slow {
    service_ms: AtomicU64,
    answered_a: AtomicU64,
    answered_b: AtomicU64,
}

impl Transport for Slow {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        _req: &'a ModelInferRequest,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<tonic::Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            let ms = self.service_ms.load(Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let count = if peer.node == A {
                &self.answered_a
            } else {
                &self.answered_b
            };
            count.fetch_add(1, Ordering::Relaxed);
            Ok(tonic::Response::new(ModelInferResponse::default()))
        })
    }
}

fn request() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "dense".into(),
        ..Default::default()
    }
}

async fn client(nodes: &str, transport: Arc<Slow>) -> Client {
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

fn slow() -> Arc<Slow> {
    Arc::new(Slow {
        service_ms: AtomicU64::new(2),
        answered_a: AtomicU64::new(0),
        answered_b: AtomicU64::new(0),
    })
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
    transport.service_ms.store(2_000, Ordering::Relaxed);
    client
        .infer(request())
        .await
        .expect("the call is given the whole deadline");
    assert_eq!(transport.answered_a.load(Ordering::Relaxed), 51);
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
    let before =
        transport.answered_a.load(Ordering::Relaxed) + transport.answered_b.load(Ordering::Relaxed);
    assert_eq!(before, 100);
    // Every answer now takes 2 s: the first attempt times out at its
    // per-attempt timeout and the call moves to the other node, whose
    // attempt is the last and may use the rest of the deadline.
    transport.service_ms.store(2_000, Ordering::Relaxed);
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
