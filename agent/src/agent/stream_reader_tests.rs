//! `ModelStreamInfer` clients that send requests and never read the
//! answers (the streaming twin of issue 24's slow readers): they must not
//! hold the worker's slots away from other clients.

use infermesh_testworker::WorkerOptions;

use super::cut_through_tests::{PATIENCE, framed, grpc_call, send, setup_worker};
use super::tests::{client, config, request};

/// Opens a `ModelStreamInfer` call on `h2` and sends `n` requests of
/// `input` on it from a task of its own (they stop going out when the agent
/// stops reading them), without reading anything back.
fn unread_stream(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    input: &[f32],
    n: usize,
) -> (h2::client::ResponseFuture, tokio::task::JoinHandle<()>) {
    let (resp, mut body) = h2
        .send_request(grpc_call("ModelStreamInfer"), false)
        .unwrap();
    let one = framed(&request("dense", input));
    let sending = tokio::spawn(async move {
        for _ in 0..n {
            send(&mut body, &one, false).await;
        }
        std::future::pending::<()>().await;
    });
    (resp, sending)
}

/// Two streams of 1 MiB requests (256 KiB answers) on a connection whose
/// client grants 1 KiB of window per stream and never reads: the answers
/// back up until the agent's response side is full. A good client on its
/// own connection is still served: the streams hold no worker slot while
/// their answers wait. (Failed before: the stream's driver stopped reading
/// the worker's answers once the client stopped reading, and the requests
/// admitted meanwhile kept all four slots until the stream was reset.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_read_hold_no_slot_a_good_client_needs() {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(1024);
    let (agent, _worker, mut h2) =
        setup_worker(config(4, 64), WorkerOptions::default(), builder).await;
    let input: Vec<f32> = (0..(1 << 20) / 4).map(|i| (i % 13) as f32).collect();
    let before = agent.pool().worker_load(0).1;
    let unread: Vec<_> = (0..2).map(|_| unread_stream(&mut h2, &input, 64)).collect();
    // Wait until the streams' answers have backed up: the worker served
    // more than the agent's response side holds for one stream.
    tokio::time::timeout(PATIENCE, async {
        while agent.pool().worker_load(0).1 < before + 40 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the streams' requests reach the worker");
    let mut good = client(&agent).await;
    for i in 0..10 {
        tokio::time::timeout(PATIENCE, good.model_infer(request("dense", &[0.5; 16])))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "good request {i} not served; permits held: {}",
                    agent.pool().worker_load(0).0
                )
            })
            .unwrap();
    }
    for (_, sending) in unread {
        sending.abort();
    }
    agent.stop().await;
}
