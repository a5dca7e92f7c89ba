//! A client behind on reading its answers (issue 24's backlog guard),
//! in-process: one `h2` connection whose answers wait unread for its
//! windows, more than the connection's send buffer (16 MiB) of them. A new
//! request on it waits for the client to read (backpressure) and is served
//! once it does; one whose client does not read within the wait
//! (`limits.read_timeout`) is refused RESOURCE_EXHAUSTED, and the worker
//! never sees it. Before, the request was refused at once: `infermesh
//! bench` at 16 × 16 MiB, a client that reads as fast as it can, got a few
//! RESOURCE_EXHAUSTED per run (BENCHMARKS.md).
//!
//! On the real clock, as `cut_through_tests` (whose helpers these are) and
//! for its reason: the backlog takes 20 MiB of uploads through `h2`'s
//! client. The waits are for events (a slot given back, a request
//! admitted); `PATIENCE` only bounds a failure.

use std::time::Duration;

use bytes::Bytes;
use infermesh_proto::inference::ModelInferResponse;
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
use infermesh_testworker::{WorkerOptions, dense};
use prost::Message;

use super::cut_through_tests::{
    PATIENCE, answer, framed, read_answer, send, setup_worker, slots_free, start,
};
use super::tests::{config, request};
use super::*;

/// Answers left unread: together over the connection's send buffer
/// (16 MiB), four of them under it, each within a stream's (4 MiB), so
/// that each is taken off the worker whole.
const UNREAD: usize = 5;
/// Rows of each `identity` request (and answer): 4 MiB less 64 KiB.
const ROWS: usize = ((4 << 20) - (64 << 10)) / (dense::IN_FEATURES * 4);

/// An agent serving `dense` and `identity` with a worker of 8 slots and
/// `read_timeout` (the longest a request waits for its client to read);
/// uploads are not demoted.
fn cfg(read_timeout: Duration) -> AgentConfig {
    let mut cfg = config(8, 8);
    cfg.workers[0].models.push("identity".into());
    cfg.limits.cut_through_grace = Duration::from_secs(3600);
    cfg.limits.read_timeout = read_timeout;
    cfg
}

fn input(i: usize) -> Vec<f32> {
    (0..ROWS * dense::IN_FEATURES)
        .map(|j| ((i + j) % 97) as f32)
        .collect()
}

/// An agent and a connection to it with
/// [`UNREAD`] answers waiting unread (the agent has sent what the
/// client's 64 KiB windows let it), so that it is backlogged; the answers'
/// streams and what each must carry.
async fn backlogged(
    read_timeout: Duration,
) -> (
    Agent,
    h2::client::SendRequest<Bytes>,
    Vec<(h2::RecvStream, Vec<f32>)>,
) {
    let options = WorkerOptions {
        models: vec!["dense".into(), "identity".into()],
        ..WorkerOptions::default()
    };
    let (agent, _worker, mut h2) =
        setup_worker(cfg(read_timeout), options, h2::client::Builder::new()).await;
    let mut calls = Vec::new();
    for i in 0..UNREAD {
        let input = input(i);
        let (resp, mut body) = start(&mut h2, &framed(&request("identity", &input))).await;
        send(&mut body, &[], true).await;
        calls.push((resp, input));
    }
    let mut unread = Vec::new();
    for (resp, input) in calls {
        let resp = tokio::time::timeout(PATIENCE, resp)
            .await
            .expect("the answer's head")
            .unwrap();
        assert!(
            resp.headers().get("grpc-status").is_none(),
            "answered with an error: {:?}",
            resp.headers()
        );
        unread.push((resp.into_body(), input));
    }
    // Each answer is in its stream's buffer once its slot is back.
    slots_free(&agent).await;
    (agent, h2, unread)
}

/// Reads every unread answer at once (one alone would wait for the
/// connection window that the others' unread bytes hold) and checks it.
async fn read_all(unread: Vec<(h2::RecvStream, Vec<f32>)>) {
    let reads = unread.into_iter().map(|(body, input)| async move {
        let (status, data) = read_answer(body).await;
        assert_eq!(status, "0");
        let out = ModelInferResponse::decode(&data[5..]).unwrap();
        assert!(
            out.raw_output_contents[0][..] == f32_to_raw(&input)[..],
            "the identity answer is the input"
        );
    });
    tokio::time::timeout(PATIENCE, futures_util::future::join_all(reads))
        .await
        .expect("the client reads every answer");
}

/// Sends a small `dense` request on `h2` and waits until the agent has
/// taken it in (admitted, waiting for the client), failing if it was
/// answered first.
async fn request_waits(
    agent: &Agent,
    h2: &mut h2::client::SendRequest<Bytes>,
    input: &[f32],
) -> h2::client::ResponseFuture {
    let before = agent.pool().load().in_flight;
    let (resp, mut body) = start(h2, &framed(&request("dense", input))).await;
    send(&mut body, &[], true).await;
    let mut resp = resp;
    let admitted = async {
        while agent.pool().load().in_flight == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        answered = &mut resp => {
            let head = answered.unwrap();
            panic!(
                "answered at once while the client was behind on reading: {:?}",
                head.headers()
            );
        }
        waited = tokio::time::timeout(PATIENCE, admitted) => {
            waited.expect("the request reaches the agent");
        }
    }
    // Ready now only if it was answered in the same moment.
    assert!(
        futures_util::FutureExt::now_or_never(&mut resp).is_none(),
        "answered at once while the client was behind on reading"
    );
    resp
}

/// A client that reads as fast as it can but has more than 16 MiB of
/// answers waiting for it: its next request waits, and is served once the
/// client reads. (Failed before: RESOURCE_EXHAUSTED at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_client_to_read_and_is_then_served() {
    let (agent, mut h2, unread) = backlogged(Duration::from_secs(3600)).await;
    let before = agent.pool().worker_load(0).1;
    let small = [0.25; 16];
    let resp = request_waits(&agent, &mut h2, &small).await;
    assert_eq!(
        agent.pool().worker_load(0).1,
        before,
        "no work reaches the worker while the client is behind"
    );
    read_all(unread).await;
    let (status, message) = tokio::time::timeout(PATIENCE, answer(resp))
        .await
        .expect("answered once the client read");
    assert_eq!(status, "0", "served once the client read");
    let text = agent.metrics().render(agent.pool());
    assert!(
        text.contains("infermesh_backlog_waits_total 1\n")
            && text.contains("infermesh_backlog_refusals_total 0\n"),
        "one wait, no refusal counted"
    );
    let out = ModelInferResponse::decode(&message[5..]).unwrap();
    assert_eq!(
        raw_to_f32(&out.raw_output_contents[0]).unwrap(),
        dense::forward(&small)
    );
    agent.stop().await;
}

/// A client that does not read: its next request waits `read_timeout`,
/// then is refused RESOURCE_EXHAUSTED without reaching the worker; the
/// connection serves on once the client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_does_not_read_within_the_wait_is_refused() {
    let wait = Duration::from_secs(2);
    let (agent, mut h2, unread) = backlogged(wait).await;
    let before = agent.pool().worker_load(0).1;
    let sent = tokio::time::Instant::now();
    let resp = request_waits(&agent, &mut h2, &[0.5; 16]).await;
    let resp = tokio::time::timeout(PATIENCE, resp)
        .await
        .expect("refused after the wait")
        .unwrap();
    assert_eq!(resp.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED");
    let text = agent.metrics().render(agent.pool());
    assert!(
        text.contains("infermesh_backlog_waits_total 1\n")
            && text.contains("infermesh_backlog_refusals_total 1\n"),
        "the wait and the refusal counted"
    );
    // A lower bound the agent's timer guarantees (it starts after the
    // request was sent), not a speed: refused after the wait, not at once.
    assert!(
        sent.elapsed() >= wait,
        "refused {:?} after it was sent, before the wait ended",
        sent.elapsed()
    );
    let message = resp.headers()["grpc-message"].to_str().unwrap();
    assert!(
        message.replace("%20", " ").contains("not reading"),
        "{message}"
    );
    assert_eq!(
        agent.pool().worker_load(0).1,
        before,
        "the worker never saw it"
    );
    read_all(unread).await;
    let (resp, mut body) = start(&mut h2, &framed(&request("dense", &[0.5; 16]))).await;
    send(&mut body, &[], true).await;
    assert_eq!(answer(resp).await.0, "0", "the connection serves on");
    agent.stop().await;
}
