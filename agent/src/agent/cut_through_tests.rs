//! Cut-through forwarding, in-process: a large request goes to its worker
//! as it arrives ([`crate::serving::forward`]). The client is `h2`'s, so a
//! test can hold a request body half-sent, send one shorter or longer than
//! its gRPC header says, or reset it midway; the worker is the real test
//! worker, whose connections count the bytes they read
//! ([`crate::testing::FakeHandle::received`]). An upload whose body has not
//! all come within `limits.cut_through_grace` is demoted (its worker slot
//! given back, the rest read, then queued again): the last two tests; the
//! others set the grace out of their way.
//!
//! On the real clock, unlike the rest of the agent's in-process tests:
//! under the paused clock `h2`'s client left buffered DATA (and a reset)
//! unwritten until something else woke its connection task, while the
//! clock ran ahead, so the tests failed at random. The waits are for
//! events (bytes read, a slot given back); `PATIENCE` only bounds a
//! failure.

use std::time::Duration;

use bytes::Bytes;
use infermesh_proto::inference::ModelInferRequest;
use infermesh_proto::tensor::raw_to_f32;
use infermesh_testworker::{WorkerOptions, dense};
use prost::Message;

use super::tests::{client, config, request};
use super::*;
use crate::testing::FakeLauncher;

/// Rows of the `dense` input: 256 KiB, sixteen DATA frames or more.
const ROWS: usize = 4096;
/// What a test sends first and holds: 64 KiB, the head among it.
const FIRST: usize = 64 << 10;
/// Longer than any wait below could take with the worker answering.
pub(super) const PATIENCE: Duration = Duration::from_secs(10);

fn input() -> Vec<f32> {
    (0..ROWS * dense::IN_FEATURES)
        .map(|i| (i % 97) as f32 / 7.0)
        .collect()
}

/// `req` as a gRPC message: its 5-byte header, then its bytes.
pub(super) fn framed(req: &ModelInferRequest) -> Vec<u8> {
    let body = req.encode_to_vec();
    let mut f = vec![0];
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(&body);
    f
}

/// An agent, the handle on its one in-process worker, and an `h2`
/// connection to the agent.
pub(super) type Setup = (
    Agent,
    crate::testing::FakeHandle,
    h2::client::SendRequest<Bytes>,
);

/// An agent with one in-process worker (at most 4 requests at once), the
/// handle on that worker, and an `h2` connection to the agent.
async fn setup() -> Setup {
    setup_with(4, h2::client::Builder::new()).await
}

/// [`setup`] with a worker of `slots` and the `h2` connection made by
/// `builder`. The cut-through grace is an hour: these tests hold bodies
/// half-sent on purpose, and a demoted upload gives its slot back.
async fn setup_with(slots: usize, builder: h2::client::Builder) -> Setup {
    let mut cfg = config(slots, 8);
    cfg.limits.cut_through_grace = Duration::from_secs(3600);
    setup_config(cfg, builder).await
}

/// [`setup_with`] for the agent configured by `cfg`.
pub(super) async fn setup_config(cfg: AgentConfig, builder: h2::client::Builder) -> Setup {
    setup_worker(cfg, WorkerOptions::default(), builder).await
}

/// [`setup_config`] with a worker run with `options`.
pub(super) async fn setup_worker(
    cfg: AgentConfig,
    options: WorkerOptions,
    builder: h2::client::Builder,
) -> Setup {
    let launcher = FakeLauncher::new(options);
    let agent = Agent::start(cfg, launcher.clone()).await.unwrap();
    // Ready: the worker answers through the agent.
    let mut c = client(&agent).await;
    c.model_infer(request("dense", &[0.5; 16])).await.unwrap();
    let worker = launcher.launched()[0].clone();
    let tcp = tokio::net::TcpStream::connect(agent.listen())
        .await
        .unwrap();
    let (send, conn) = builder.handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    (agent, worker, send.ready().await.unwrap())
}

/// Starts a `ModelInfer` call whose body is `first` (not ended).
pub(super) async fn start(
    h2: &mut h2::client::SendRequest<Bytes>,
    first: &[u8],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let (resp, mut body) = h2.send_request(grpc_call("ModelInfer"), false).unwrap();
    send(&mut body, first, false).await;
    (resp, body)
}

/// The head of a call of the inference service's `method`.
pub(super) fn grpc_call(method: &str) -> http::Request<()> {
    http::Request::post(format!(
        "http://agent/inference.GRPCInferenceService/{method}"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap()
}

/// Sends `data` on `body` as the agent's windows allow (`h2` sends what
/// it buffers beyond them only when something else wakes its connection).
pub(super) async fn send(body: &mut h2::SendStream<Bytes>, data: &[u8], end: bool) {
    let mut data = Bytes::copy_from_slice(data);
    while !data.is_empty() {
        body.reserve_capacity(data.len());
        let n = std::future::poll_fn(|cx| body.poll_capacity(cx))
            .await
            .expect("capacity")
            .unwrap();
        body.send_data(data.split_to(n.min(data.len())), false)
            .unwrap();
    }
    if end {
        body.send_data(Bytes::new(), true).unwrap();
    }
}

/// The call's gRPC status and response message bytes.
pub(super) async fn answer(resp: h2::client::ResponseFuture) -> (String, Vec<u8>) {
    let resp = resp.await.unwrap();
    if let Some(status) = resp.headers().get("grpc-status") {
        return (status.to_str().unwrap().to_string(), Vec::new());
    }
    read_answer(resp.into_body()).await
}

/// An answer's body read whole (its window given back as it comes): its
/// trailers' gRPC status and its message bytes.
pub(super) async fn read_answer(mut body: h2::RecvStream) -> (String, Vec<u8>) {
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    let status = trailers["grpc-status"].to_str().unwrap().to_string();
    (status, data)
}

/// Waits until the worker has read `n` bytes more than `from`, or fails.
async fn worker_reads(worker: &crate::testing::FakeHandle, from: u64, n: usize, why: &str) {
    tokio::time::timeout(PATIENCE, worker.received_at_least(from + n as u64))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{why}: the worker read {} of {n} bytes",
                worker.received() - from
            )
        });
}

/// Waits until no request holds a slot of the worker, or fails.
pub(super) async fn slots_free(agent: &Agent) {
    tokio::time::timeout(PATIENCE, async {
        while agent.pool().worker_load(0).0 != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the worker's slot is given back");
}

/// The worker gets the request's HEADERS and first bytes while the rest of
/// the body is still held by the client, and the answer is exact once it
/// is sent: the agent does not wait for the whole body (issue 27: at 16 ×
/// 16 MiB the worker idled while interleaved requests arrived).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_reaches_the_worker_before_its_last_frame_is_sent() {
    let (agent, worker, mut h2) = setup().await;
    let input = input();
    let whole = framed(&request("dense", &input));
    let before = worker.received();
    let (resp, mut body) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "before the rest was sent").await;
    assert_eq!(agent.pool().worker_load(0).0, 1, "a slot is taken");
    send(&mut body, &whole[FIRST..], true).await;
    let (status, message) = answer(resp).await;
    assert_eq!(status, "0");
    let resp = infermesh_proto::inference::ModelInferResponse::decode(&message[5..]).unwrap();
    assert_eq!(
        raw_to_f32(&resp.raw_output_contents[0]).unwrap(),
        dense::forward(&input)
    );
    slots_free(&agent).await;
    agent.stop().await;
}

/// A body shorter or longer than its gRPC header says, found out after
/// the worker's stream was opened: INVALID_ARGUMENT, the worker's slot is
/// given back, and the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_or_longer_than_its_header_is_invalid_after_cut_through() {
    let (agent, worker, mut h2) = setup().await;
    let whole = framed(&request("dense", &input()));
    let mut long = whole.clone();
    long.extend_from_slice(&[0; 10]);
    let short = &whole[..whole.len() - 10];
    for (name, sent) in [("short", short), ("long", &long[..])] {
        let before = worker.received();
        let (resp, mut body) = start(&mut h2, &sent[..FIRST]).await;
        worker_reads(&worker, before, FIRST, name).await;
        send(&mut body, &sent[FIRST..], true).await;
        let (status, _) = answer(resp).await;
        assert_eq!(status, "3", "{name}: INVALID_ARGUMENT");
        slots_free(&agent).await;
        let mut c = client(&agent).await;
        c.model_infer(request("dense", &[0.5; 16])).await.unwrap();
    }
    agent.stop().await;
}

/// A client that resets its request midway, after the worker's stream was
/// opened, frees the worker's slot (the slot-pinning fixes of issue 24
/// hold for a request forwarded as it arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_mid_body_frees_the_worker_slot() {
    let (agent, worker, mut h2) = setup().await;
    let whole = framed(&request("dense", &input()));
    let before = worker.received();
    let (_resp, mut body) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "before the reset").await;
    assert_eq!(agent.pool().worker_load(0).0, 1, "a slot is taken");
    body.send_reset(h2::Reason::CANCEL);
    // The client goes on using its connection (which is also what makes
    // `h2`'s connection task write the reset out).
    let input = [0.25; 16];
    let small = framed(&request("dense", &input));
    let (resp, mut next) = start(&mut h2, &small).await;
    send(&mut next, &[], true).await;
    let (status, message) = answer(resp).await;
    assert_eq!(status, "0");
    let out = infermesh_proto::inference::ModelInferResponse::decode(&message[5..]).unwrap();
    assert_eq!(
        raw_to_f32(&out.raw_output_contents[0]).unwrap(),
        dense::forward(&input)
    );
    slots_free(&agent).await;
    assert_eq!(
        agent.stop().await,
        Stopped {
            requests_dropped: 0,
            tasks_left: 0
        }
    );
}

/// Requests waiting for a worker go on reading their bodies: the client's
/// connection window comes back only as bodies are read, so queued
/// requests holding 16 MiB of unread frames would starve the request that
/// has the worker, mid-body, until its deadline (found at 16 × 16 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_go_on_reading_so_the_one_with_a_worker_is_not_starved() {
    // Windows that take every answer at once: answers waiting for window
    // would be reset by the agent's send timeout as the paused clock runs.
    let mut builder = h2::client::Builder::new();
    builder
        .initial_window_size(16 << 20)
        .initial_connection_window_size(64 << 20);
    let (agent, worker, mut h2) = setup_with(1, builder).await;
    let whole = framed(&request("dense", &input()));
    let before = worker.received();
    let (first, mut body) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "the first request").await;
    // Five more, 3.5 MiB each (within the largest message), queued: more
    // than the client's 16 MiB connection window in all.
    let big: Vec<f32> = (0..(7 << 19) / 4).map(|i| (i % 13) as f32).collect();
    let big = framed(&request("dense", &big));
    let mut queued = Vec::new();
    for _ in 0..5 {
        let (resp, mut body) = start(&mut h2, &big[..FIRST]).await;
        send(&mut body, &big[FIRST..], true).await;
        queued.push((resp, body));
    }
    send(&mut body, &whole[FIRST..], true).await;
    let (status, _) = tokio::time::timeout(PATIENCE, answer(first))
        .await
        .expect("the first request is not starved by the queued ones");
    assert_eq!(status, "0");
    let (answers, _bodies): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
    for (status, _) in futures_util::future::join_all(answers.into_iter().map(answer)).await {
        assert_eq!(status, "0");
    }
    agent.stop().await;
}

/// Time between the bytes of a trickling client.
const TRICKLE_EVERY: Duration = Duration::from_millis(20);

/// An agent with a worker of `slots` and the default cut-through grace
/// (1 s), whose read timeout lies far beyond any test's length: only the
/// grace can take a trickling upload's worker slot back.
fn patient(slots: usize) -> AgentConfig {
    let mut cfg = config(slots, 8);
    cfg.limits.read_timeout = Duration::from_secs(3600);
    cfg
}

/// A client sending `rest` on `body` a byte at a time, never its last
/// byte, until stopped: what a hostile client does to hold an upload open.
struct Trickle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(h2::SendStream<Bytes>, usize)>,
}

impl Trickle {
    fn start(mut body: h2::SendStream<Bytes>, rest: Vec<u8>) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut sent = 0;
            while sent + 1 < rest.len() {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(TRICKLE_EVERY) => {}
                }
                send(&mut body, &rest[sent..=sent], false).await;
                sent += 1;
            }
            (body, sent)
        });
        Self { stop, task }
    }

    /// Stops trickling: the body and the bytes of `rest` it carried.
    async fn stop(self) -> (h2::SendStream<Bytes>, usize) {
        let _ = self.stop.send(());
        self.task.await.unwrap()
    }

    /// Stops trickling and sends the rest of `whole` (a request for
    /// `input`, started with its first [`FIRST`] bytes): its answer must
    /// be exact.
    async fn finish(self, whole: &[u8], resp: h2::client::ResponseFuture, input: &[f32]) {
        let (mut body, sent) = self.stop().await;
        send(&mut body, &whole[FIRST + sent..], true).await;
        let (status, message) = answer(resp).await;
        assert_eq!(status, "0");
        let resp = infermesh_proto::inference::ModelInferResponse::decode(&message[5..]).unwrap();
        assert_eq!(
            raw_to_f32(&resp.raw_output_contents[0]).unwrap(),
            dense::forward(input)
        );
    }
}

/// A client that sends a large request's head and then trickles its body
/// does not keep the worker's only slot from other requests: the upload
/// is demoted when it has not ended within the cut-through grace, and a
/// second request is served while the trickler's request is still open —
/// long before its read timeout (an hour here). Before: the second
/// request waited for the trickler's whole-body read timeout (30 s by
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_upload_does_not_keep_other_requests_from_the_worker() {
    let (agent, worker, mut h2) = setup_config(patient(1), h2::client::Builder::new()).await;
    let whole = framed(&request("dense", &input()));
    let before = worker.received();
    let (mut resp, body) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "the trickler's head").await;
    let trickle = Trickle::start(body, whole[FIRST..].to_vec());
    small_request_is_served(
        &agent,
        "the second request is served while the trickler holds its upload open",
    )
    .await;
    assert!(
        futures_util::FutureExt::now_or_never(&mut resp).is_none(),
        "the trickler's request is still open"
    );
    let (body, _) = trickle.stop().await;
    drop((body, resp));
    agent.stop().await;
}

/// A demoted upload is read to its end and then served from the frames
/// kept: a client on a slow link gets its exact answer, and the demotion
/// is counted once. The time the worker held the withdrawn upload is not
/// charged to it as waiting (the stall watchdog would otherwise take a
/// worker whose uploads trickle for a stuck one): the worker never had the
/// whole request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_upload_is_answered_exactly_once_its_body_has_come() {
    let (agent, worker, mut h2) = setup_config(patient(1), h2::client::Builder::new()).await;
    let input = input();
    let whole = framed(&request("dense", &input));
    let before = worker.received();
    let (mut resp, body) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "the head").await;
    let trickle = Trickle::start(body, whole[FIRST..].to_vec());
    // The demotion: the slot comes back while the body is still arriving.
    slots_free(&agent).await;
    assert!(
        futures_util::FutureExt::now_or_never(&mut resp).is_none(),
        "the demoted request is still open"
    );
    assert_eq!(
        agent.pool().progress(0).waiting,
        Duration::ZERO,
        "a withdrawn upload is not waiting charged to the worker"
    );
    trickle.finish(&whole, resp, &input).await;
    slots_free(&agent).await;
    let text = agent.metrics().render(agent.pool());
    assert!(
        text.contains("infermesh_cut_through_demotions_total 1\n"),
        "one demotion counted: {}",
        text.lines()
            .filter(|l| l.contains("demotion"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    agent.stop().await;
}

/// Waits until `n` demotions are counted, or fails.
async fn demotions(agent: &Agent, n: usize) {
    let line = format!("infermesh_cut_through_demotions_total {n}\n");
    tokio::time::timeout(PATIENCE, async {
        while !agent.metrics().render(agent.pool()).contains(&line) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} demotions counted"));
}

/// A request whose window closes while it waits for a worker, its body
/// still arriving, leaves the queue and reads on: when the slot comes back
/// it goes to a request that is all here, and the trickler never reaches
/// the worker. The window runs from the head, not from the slot, so a
/// burst of tricklers larger than the worker's slots costs one grace, not
/// one per wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickler_still_queued_when_its_window_closes_never_takes_the_worker() {
    let (agent, worker, mut h2) = setup_config(patient(1), h2::client::Builder::new()).await;
    let (model, _) = agent.pool().models().lookup("dense").unwrap();
    // The worker's only slot, held by the test.
    let held = agent.pool().acquire(model, None, None).await.unwrap();
    let input = input();
    let whole = framed(&request("dense", &input));
    let before = worker.received();
    let (mut resp, body) = start(&mut h2, &whole[..FIRST]).await;
    let trickle = Trickle::start(body, whole[FIRST..].to_vec());
    demotions(&agent, 1).await;
    drop(held);
    small_request_is_served(&agent, "the freed slot serves a request that is all here").await;
    assert!(
        worker.received() - before < FIRST as u64,
        "the trickler's request never reached the worker ({} bytes read)",
        worker.received() - before
    );
    assert!(
        futures_util::FutureExt::now_or_never(&mut resp).is_none(),
        "the trickler's request is still open"
    );
    trickle.finish(&whole, resp, &input).await;
    demotions(&agent, 1).await;
    agent.stop().await;
}

/// A small request that is all here is answered, and rightly, within
/// [`PATIENCE`] (`why`: what its being served shows).
async fn small_request_is_served(agent: &Agent, why: &str) {
    let mut c = client(agent).await;
    let small = [0.5; 16];
    let out = tokio::time::timeout(PATIENCE, c.model_infer(request("dense", &small)))
        .await
        .expect(why)
        .expect("answered")
        .into_inner();
    assert_eq!(
        raw_to_f32(&out.raw_output_contents[0]).unwrap(),
        dense::forward(&small)
    );
}

/// Unfinished uploads may hold all of a worker's slots but one: with two
/// slots and one upload open, a second upload that takes the other slot is
/// deferred (read whole first, its slot given back), and a request that is
/// all here is served while both uploads are still arriving — however long
/// their windows (an hour here). Without the cap the two uploads held both
/// slots until their windows closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_never_hold_a_workers_last_slot() {
    let (agent, worker, mut h2) = setup_with(2, h2::client::Builder::new()).await;
    let whole = framed(&request("dense", &input()));
    let before = worker.received();
    let (resp_a, body_a) = start(&mut h2, &whole[..FIRST]).await;
    worker_reads(&worker, before, FIRST, "the first upload's head").await;
    let trickle_a = Trickle::start(body_a, whole[FIRST..].to_vec());
    let (resp_b, body_b) = start(&mut h2, &whole[..FIRST]).await;
    let trickle_b = Trickle::start(body_b, whole[FIRST..].to_vec());
    // The second upload has taken the other slot, or has been deferred.
    let deferred = "infermesh_cut_through_deferrals_total 1\n";
    tokio::time::timeout(PATIENCE, async {
        while agent.pool().worker_load(0).0 < 2
            && !agent.metrics().render(agent.pool()).contains(deferred)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the second upload takes a slot or is deferred");
    small_request_is_served(
        &agent,
        "a request that is all here finds the slot uploads leave",
    )
    .await;
    assert!(agent.metrics().render(agent.pool()).contains(deferred));
    let input = input();
    trickle_a.finish(&whole, resp_a, &input).await;
    trickle_b.finish(&whole, resp_b, &input).await;
    slots_free(&agent).await;
    agent.stop().await;
}
