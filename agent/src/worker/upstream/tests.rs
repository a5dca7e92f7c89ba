//! The agent's HTTP/2 client against a server it did not write (the `h2`
//! crate's), over loopback TCP.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BufMut;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderValue, Request, Response};
use tokio::net::TcpListener;

use super::*;

/// Which of the worker's connections (in the order they came) a request
/// arrived on: in its extensions.
#[derive(Debug, Clone, Copy)]
struct ConnIndex(usize);

/// A worker answering each request with `handler`; counts connections.
async fn worker<F, Fut>(builder: h2::server::Builder, handler: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(Request<RecvStream>, SendResponse<Bytes>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connections);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let index = ConnIndex(count.fetch_add(1, Ordering::SeqCst));
            let builder = builder.clone();
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut conn = builder.handshake::<_, Bytes>(tcp).await.unwrap();
                while let Some(Ok((mut req, respond))) = conn.accept().await {
                    req.extensions_mut().insert(index);
                    tokio::spawn(handler.clone()(req, respond));
                }
            });
        }
    });
    (address, connections)
}

/// Reads a request body whole.
async fn body(mut recv: RecvStream) -> Bytes {
    let mut all = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        all.put(chunk);
    }
    all.freeze()
}

/// Answers 200 with `data` and `grpc-status: 0` trailers.
fn answer(mut respond: SendResponse<Bytes>, data: Bytes) {
    let mut send = respond.send_response(Response::new(()), false).unwrap();
    send.send_data(data, false).unwrap();
    send.send_trailers(ok_trailers()).unwrap();
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

/// Sends `data` as the agent's windows allow.
async fn send_within_window(send: &mut h2::SendStream<Bytes>, mut data: Bytes) {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let n = poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap();
        send.send_data(data.split_to(n.min(data.len())), false)
            .unwrap();
    }
}

/// An echo worker: answers each request with its body.
async fn echo(builder: h2::server::Builder) -> (SocketAddr, Arc<AtomicUsize>) {
    worker(builder, |req: Request<RecvStream>, respond| async move {
        let data = body(req.into_body()).await;
        answer(respond, data);
    })
    .await
}

/// Reads an answer's data whole, and its trailers.
async fn read(exchange: &mut Exchange) -> Result<(Bytes, Option<HeaderMap>), Failure> {
    let mut all = BytesMut::new();
    while let Some(chunk) = poll_fn(|cx| exchange.poll_data(cx)).await? {
        all.put(chunk);
    }
    Ok((all.freeze(), exchange.trailers()))
}

fn client(address: SocketAddr) -> Upstream {
    Upstream::new(address, TaskTracker::new(), 1)
}

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn a_request_and_its_answer_cross_intact() {
    let (address, _) = worker(
        h2::server::Builder::new(),
        |req: Request<RecvStream>, respond| async move {
            let (parts, recv) = req.into_parts();
            assert_eq!(parts.method, http::Method::POST);
            assert_eq!(parts.uri.path(), infermesh_proto::MODEL_INFER_PATH);
            assert_eq!(parts.headers["te"], "trailers");
            assert_eq!(parts.headers["x-request-id"], "abc");
            let data = body(recv).await;
            answer(respond, data);
        },
    )
    .await;
    let upstream = client(address);
    let mut headers = HeaderMap::new();
    headers.insert("te", HeaderValue::from_static("trailers"));
    headers.insert("x-request-id", HeaderValue::from_static("abc"));
    for _ in 0..3 {
        let mut exchange = upstream.send(&headers, pattern(1000)).await.unwrap();
        let head = exchange.head().await.unwrap();
        assert_eq!(head.status, 200);
        assert!(!head.end);
        let (data, trailers) = read(&mut exchange).await.unwrap();
        assert_eq!(data, pattern(1000));
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
    }
}

/// 1 MiB through a worker whose stream window is 1,000 bytes: sent as the
/// worker's WINDOW_UPDATEs allow.
#[tokio::test]
async fn a_body_larger_than_the_workers_window_is_sent_as_it_opens() {
    let mut builder = h2::server::Builder::new();
    builder.initial_window_size(1000);
    let (address, _) = echo(builder).await;
    let upstream = client(address);
    let mut exchange = upstream
        .send(&HeaderMap::new(), pattern(1 << 20))
        .await
        .unwrap();
    assert_eq!(exchange.head().await.unwrap().status, 200);
    let (data, _) = read(&mut exchange).await.unwrap();
    assert_eq!(data, pattern(1 << 20));
}

/// A 40 MiB answer is more than the agent's stream and connection windows:
/// it arrives only if taking the data gives window back.
#[tokio::test]
async fn an_answer_larger_than_the_agents_windows_arrives_whole() {
    let big = pattern(40 << 20);
    let (address, _) = worker(h2::server::Builder::new(), {
        let big = big.clone();
        move |req: Request<RecvStream>, mut respond| {
            let big = big.clone();
            async move {
                drop(body(req.into_body()).await);
                let mut send = respond.send_response(Response::new(()), false).unwrap();
                send_within_window(&mut send, big).await;
                send.send_trailers(ok_trailers()).unwrap();
            }
        }
    })
    .await;
    let upstream = client(address);
    for _ in 0..2 {
        let mut exchange = upstream.send(&HeaderMap::new(), pattern(10)).await.unwrap();
        exchange.head().await.unwrap();
        let (data, trailers) = read(&mut exchange).await.unwrap();
        assert_eq!(data.len(), big.len());
        assert_eq!(data, big);
        assert!(trailers.is_some());
    }
}

/// A worker that answers while it reads (each chunk echoed at once), with a
/// request larger than the agent's windows and both sockets' buffers: both
/// directions are in flight at once, each within its flow control.
#[tokio::test]
async fn a_request_and_an_answer_in_flight_at_once_cross_intact() {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(32 << 20)
        .initial_connection_window_size(32 << 20);
    let (address, _) = worker(
        builder,
        |req: Request<RecvStream>, mut respond| async move {
            let mut recv = req.into_body();
            let mut send = respond.send_response(Response::new(()), false).unwrap();
            while let Some(chunk) = recv.data().await {
                let chunk = chunk.unwrap();
                let _ = recv.flow_control().release_capacity(chunk.len());
                send_within_window(&mut send, chunk).await;
            }
            send.send_trailers(ok_trailers()).unwrap();
        },
    )
    .await;
    let upstream = client(address);
    let (mut exchange, _) = upstream
        .call(&HeaderMap::new(), pattern(24 << 20))
        .await
        .unwrap();
    let (data, trailers) = read(&mut exchange).await.unwrap();
    assert_eq!(data.len(), 24 << 20);
    assert_eq!(data, pattern(24 << 20));
    assert!(trailers.is_some());
}

/// A request whose caller goes away is reset (CANCEL), and the worker sees
/// it.
#[tokio::test]
async fn dropping_an_exchange_resets_its_stream() {
    let (reset_tx, reset_rx) = tokio::sync::oneshot::channel();
    let reset_tx = Arc::new(Mutex::new(Some(reset_tx)));
    let (address, _) = worker(
        h2::server::Builder::new(),
        move |req: Request<RecvStream>, mut respond| {
            let reset_tx = Arc::clone(&reset_tx);
            async move {
                drop(body(req.into_body()).await);
                let reason = poll_fn(|cx| respond.poll_reset(cx)).await.unwrap();
                if let Some(tx) = reset_tx.lock().unwrap().take() {
                    let _ = tx.send(reason);
                }
            }
        },
    )
    .await;
    let upstream = client(address);
    let exchange = upstream.send(&HeaderMap::new(), pattern(10)).await.unwrap();
    drop(exchange);
    assert_eq!(reset_rx.await.unwrap(), h2::Reason::CANCEL);
}

/// A worker that closes its connection (a restart, an idle timeout) costs
/// no request: the next one makes a new connection.
#[tokio::test]
async fn a_closed_connection_is_made_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(tcp).await.unwrap();
                // One request per connection, then the connection closes.
                if let Some(Ok((req, respond))) = conn.accept().await {
                    let data = body(req.into_body()).await;
                    answer(respond, data);
                }
                conn.graceful_shutdown();
                while conn.accept().await.is_some() {}
            });
        }
    });
    let upstream = client(address);
    for i in 0..5 {
        // The closed connection is noticed by the time the next request
        // goes, or the request is refused and the next one reconnects.
        let mut result = None;
        for _ in 0..2 {
            let attempt = async {
                let mut exchange = upstream.send(&HeaderMap::new(), pattern(100 + i)).await?;
                exchange.head().await?;
                Ok::<_, UpstreamError>(read(&mut exchange).await?)
            };
            match attempt.await {
                Ok(r) => {
                    result = Some(r);
                    break;
                }
                Err(e) => assert!(
                    matches!(
                        e,
                        UpstreamError::Failed(Failure::Refused | Failure::Connection(_))
                    ),
                    "{e}"
                ),
            }
        }
        let (data, _) = result.expect("a second attempt goes on a new connection");
        assert_eq!(data, pattern(100 + i));
    }
}

/// A worker allowing one stream at a time still serves eight concurrent
/// requests: each waits for room.
#[tokio::test]
async fn requests_beyond_the_workers_stream_limit_wait_for_room() {
    let mut builder = h2::server::Builder::new();
    builder.max_concurrent_streams(1);
    let (address, connections) = echo(builder).await;
    let upstream = client(address);
    let mut calls = Vec::new();
    for i in 0..8 {
        let upstream = upstream.clone();
        calls.push(tokio::spawn(async move {
            // Sent before the worker's limit is known, a stream may be
            // refused; `call` sends it again.
            let (mut exchange, _) = upstream
                .call(&HeaderMap::new(), pattern(i + 1))
                .await
                .unwrap();
            read(&mut exchange).await.unwrap().0
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap(), pattern(i + 1));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "one connection");
}

/// An answer with its status in the headers ends the stream there.
#[tokio::test]
async fn a_trailers_only_answer_ends_at_its_headers() {
    let (address, _) = worker(
        h2::server::Builder::new(),
        |req: Request<RecvStream>, mut respond| async move {
            drop(body(req.into_body()).await);
            let mut resp = Response::new(());
            resp.headers_mut()
                .insert("grpc-status", HeaderValue::from_static("5"));
            respond.send_response(resp, true).unwrap();
        },
    )
    .await;
    let upstream = client(address);
    let mut exchange = upstream.send(&HeaderMap::new(), pattern(10)).await.unwrap();
    let head = exchange.head().await.unwrap();
    assert!(head.end);
    assert_eq!(head.headers["grpc-status"], "5");
}

/// Requests sent and polled inside [`corked`] stay queued until it ends
/// (then one write carries them all), and each is answered.
#[tokio::test]
async fn requests_sent_inside_a_cork_leave_together_when_it_ends() {
    let (address, _) = echo(h2::server::Builder::new()).await;
    let upstream = client(address);
    // The connection is made (outside the cork) and warm.
    let mut first = upstream.send(&HeaderMap::new(), pattern(10)).await.unwrap();
    read(&mut first).await.unwrap();
    drop(first);
    let shared = upstream.cached(0).expect("a connection");
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut exchanges = Vec::new();
    let headers = HeaderMap::new();
    corked(|| {
        for n in 1..=3 {
            let mut send = std::pin::pin!(upstream.send(&headers, pattern(100 * n)));
            match send.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(mut exchange)) => {
                    // Polling for the answer does not write either.
                    assert!(exchange.poll_data(&mut cx).is_pending());
                    exchanges.push(exchange);
                }
                other => panic!("not sent at once: {other:?}"),
            }
        }
        assert!(
            shared.lock().out().len() > 3 * 100,
            "the three requests wait in the queue"
        );
    });
    assert_eq!(shared.lock().out().len(), 0, "written when the cork ended");
    for (n, mut exchange) in (1..=3).zip(exchanges) {
        assert_eq!(exchange.head().await.unwrap().status, 200);
        assert_eq!(read(&mut exchange).await.unwrap().0, pattern(100 * n));
    }
}

/// A body sent as it arrives (cut-through): the worker reads the first
/// chunks before the rest is pushed, and the whole body arrives intact.
#[tokio::test]
async fn an_upload_reaches_the_worker_as_it_is_pushed() {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let first_tx = Arc::new(Mutex::new(Some(first_tx)));
    let (address, _) = worker(
        h2::server::Builder::new(),
        move |req: Request<RecvStream>, respond| {
            let first_tx = Arc::clone(&first_tx);
            async move {
                let mut recv = req.into_body();
                let mut all = BytesMut::new();
                while let Some(chunk) = recv.data().await {
                    let chunk = chunk.unwrap();
                    let _ = recv.flow_control().release_capacity(chunk.len());
                    all.put(chunk);
                    if all.len() >= 1000 {
                        if let Some(tx) = first_tx.lock().unwrap().take() {
                            let _ = tx.send(all.len());
                        }
                    }
                }
                answer(respond, all.freeze());
            }
        },
    )
    .await;
    let upstream = client(address);
    let headers = HeaderMap::new();
    let whole = pattern(100_000);
    let mut kept = vec![whole.slice(..1000)];
    let mut upload = upstream.upload(&headers, &kept).await.unwrap();
    assert_eq!(
        first_rx.await.unwrap(),
        1000,
        "read before the rest is pushed"
    );
    for at in (1000..100_000).step_by(30_000) {
        kept.push(whole.slice(at..(at + 30_000).min(100_000)));
        upload.push(&kept, false).await.unwrap();
    }
    upload.end(&kept).await.unwrap();
    let (mut exchange, head) = upload.answer(&kept).await.unwrap();
    assert_eq!(head.status, 200);
    let (data, _) = read(&mut exchange).await.unwrap();
    assert_eq!(data, whole);
}

/// An upload dropped before its body ended (a body longer or shorter than
/// its header, a client reset) resets the worker's stream.
#[tokio::test]
async fn dropping_an_upload_mid_body_resets_its_stream() {
    let (reset_tx, reset_rx) = tokio::sync::oneshot::channel();
    let reset_tx = Arc::new(Mutex::new(Some(reset_tx)));
    let (address, _) = worker(
        h2::server::Builder::new(),
        move |req: Request<RecvStream>, _respond| {
            let reset_tx = Arc::clone(&reset_tx);
            async move {
                let mut recv = req.into_body();
                let end = loop {
                    match recv.data().await {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break e.reason(),
                        None => break None,
                    }
                };
                if let Some(tx) = reset_tx.lock().unwrap().take() {
                    let _ = tx.send(end);
                }
            }
        },
    )
    .await;
    let upstream = client(address);
    let headers = HeaderMap::new();
    let upload = upstream.upload(&headers, &[pattern(100)]).await.unwrap();
    drop(upload);
    assert_eq!(reset_rx.await.unwrap(), Some(h2::Reason::CANCEL));
}

/// A worker that refuses the stream of a body still arriving
/// (REFUSED_STREAM: it processed nothing) gets it again, with every chunk
/// pushed so far and the rest after.
#[tokio::test]
async fn a_refused_upload_is_sent_again_with_what_was_pushed() {
    let refused = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&refused);
    let (address, _) = worker(
        h2::server::Builder::new(),
        move |req: Request<RecvStream>, mut respond| {
            let count = Arc::clone(&count);
            async move {
                if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    return;
                }
                let data = body(req.into_body()).await;
                answer(respond, data);
            }
        },
    )
    .await;
    let upstream = client(address);
    let headers = HeaderMap::new();
    let whole = pattern(50_000);
    let mut kept = vec![whole.slice(..100)];
    let mut upload = upstream.upload(&headers, &kept).await.unwrap();
    // Pushed until the refusal is seen (it comes back on its own time).
    let mut at = 100;
    while (refused.load(Ordering::SeqCst) == 0 && at < 40_000) || at < 20_000 {
        let end = (at + 1000).min(40_000);
        kept.push(whole.slice(at..end));
        upload.push(&kept, false).await.unwrap();
        at = end;
        tokio::task::yield_now().await;
    }
    kept.push(whole.slice(at..));
    upload.push(&kept, false).await.unwrap();
    upload.end(&kept).await.unwrap();
    let (mut exchange, head) = upload.answer(&kept).await.unwrap();
    assert_eq!(head.status, 200);
    let (data, _) = read(&mut exchange).await.unwrap();
    assert_eq!(data, whole);
    assert_eq!(
        refused.load(Ordering::SeqCst),
        2,
        "refused once, then served"
    );
}

/// Large requests go on the connections beyond the first, each to the one
/// with the fewest large requests open; small ones all share the first,
/// so they never queue behind a large body.
#[tokio::test]
async fn large_requests_spread_over_their_own_connections_and_small_ones_share_one() {
    let (address, connections) = worker(
        h2::server::Builder::new(),
        |req: Request<RecvStream>, respond| async move {
            let index = req.extensions().get::<ConnIndex>().unwrap().0;
            body(req.into_body()).await;
            answer(respond, Bytes::from(vec![index as u8]));
        },
    )
    .await;
    let upstream = Upstream::new(address, TaskTracker::new(), 3);
    let send = |len: usize| {
        let upstream = upstream.clone();
        async move {
            upstream
                .send(&HeaderMap::new(), pattern(len))
                .await
                .unwrap()
        }
    };
    let on = |mut exchange: Exchange| async move { read(&mut exchange).await.unwrap().0[0] };
    // Four large requests, all open at once: two on each large connection.
    let mut large = Vec::new();
    for _ in 0..4 {
        large.push(send(LARGE_BODY).await);
    }
    let small = [send(1).await, send(LARGE_BODY - 1).await, send(10).await];
    let mut small_on = Vec::new();
    for exchange in small {
        small_on.push(on(exchange).await);
    }
    assert!(small_on.iter().all(|&c| c == small_on[0]), "{small_on:?}");
    let [a, b, c, d] = <[Exchange; 4]>::try_from(large).unwrap();
    // Every other one on the same connection, neither the small ones'.
    let (b_on, d_on) = (on(b).await, on(d).await);
    assert_eq!(b_on, d_on);
    // b's connection has none open now, a's two: the next large request
    // goes to b's (the first of equals would have been a's).
    let next = send(1 << 20).await;
    let (a_on, c_on) = (on(a).await, on(c).await);
    assert_eq!(a_on, c_on);
    assert_ne!(a_on, b_on);
    assert!(a_on != small_on[0] && b_on != small_on[0]);
    assert_eq!(on(next).await, b_on, "the emptier large connection");
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}
