//! The OIP port: accepting connections, serving HTTP/2 on them, routing
//! each request.
//!
//! The agent runs its own accept loop and serves HTTP/2 with the `h2` crate
//! directly, rather than through tonic's server and hyper, so that every
//! resource a client can take is bounded, every task is tracked, and the
//! hop stays lean: a connection's requests run inside the connection's own
//! task (no task per request, no wake-up to reach the socket), and a
//! response's headers, data and trailers leave in one write (hyper's body
//! pipe waits for stream capacity through the connection task first, which
//! costs a second write per response; see docs/DECISIONS.md):
//!
//! - **connections**: at most `max_connections` at once (by default well
//!   below the process's file-descriptor limit, leaving room for worker
//!   restarts, the admin port and ZooKeeper); at the limit the loop stops
//!   accepting until one closes, and an accept error such as EMFILE backs
//!   off instead of spinning;
//! - **per connection**: `max_concurrent_streams`, HTTP/2 receive windows,
//!   header list size, a handshake timeout (the first byte must arrive), an
//!   idle timeout (no new request for that long: GOAWAY), keep-alive pings
//!   that close dead peers;
//! - **per request**: `ModelInfer` bodies are bounded by
//!   [`crate::forward::BodyLimits`]; other unary calls by a 4 MiB message
//!   limit and the read timeout; stream messages by `max_message_bytes`.
//!
//! Routing: `ModelInfer` goes to the pass-through path
//! ([`crate::forward`]); everything else to the tonic services (the OIP
//! [`crate::front::Front`], the RDMA queue-pair exchange), whose responses get
//! the load report in their trailers too.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use h2::RecvStream;
use h2::SendStream;
use h2::server::SendResponse;
use http::{Request, Response};
use http_body::{Body, Frame};
use infermesh_backoff::{Backoff, BackoffPolicy};
use tokio::io::BufWriter;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;
use tonic::service::Routes;
use tower::ServiceExt;

use crate::conn::{ConnInfo, FirstByteDeadline, OnClose};
use crate::forward::InferPath;
use crate::grpc::{MODEL_INFER_PATH, status_response};
use crate::pool::Pool;
use crate::trailer::{FrontBody, add_report};

/// The path of `ModelStreamInfer`.
pub const MODEL_STREAM_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// Limits of the OIP port.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 receive window per stream.
    pub stream_window: u32,
    /// HTTP/2 receive window per connection.
    pub connection_window: u32,
    /// Largest header list.
    pub max_header_list_size: u32,
    /// A new connection must send its first byte within this.
    pub handshake_timeout: Duration,
    /// A connection with no new request for this long is closed (GOAWAY;
    /// streams still open finish).
    pub idle_timeout: Duration,
    /// Interval of HTTP/2 pings on a connection; a peer that does not
    /// answer within `keepalive_timeout` is disconnected.
    pub keepalive_interval: Duration,
    /// See `keepalive_interval`.
    pub keepalive_timeout: Duration,
}

/// What the port serves.
#[derive(Clone)]
pub struct Oip {
    /// `ModelInfer`.
    pub infer: InferPath,
    /// `ModelStreamInfer` (the OIP service with the large message limit).
    pub streams: Routes,
    /// Every other call (the OIP service with a small message limit, RDMA).
    pub calls: Routes,
    /// Whose load the responses report.
    pub pool: Arc<Pool>,
    /// Longest unary call other than `ModelInfer`.
    pub call_timeout: Duration,
}

/// Shutdown signals of the port.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Stop accepting; tell connections to finish (GOAWAY).
    pub graceful: CancellationToken,
    /// Drop whatever is still open.
    pub hard: CancellationToken,
}

/// Serves `listener` until `shutdown.graceful` fires and its connections
/// are done (or `shutdown.hard` fires). Connection and stream tasks are
/// spawned on `tasks`. With `tls`, every connection is TLS (ALPN `h2`): the
/// handshake runs in the connection's task within `handshake_timeout`.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    oip: Oip,
    limits: ServerLimits,
    on_close: OnClose,
    shutdown: Shutdown,
    tasks: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let ids = AtomicU64::new(1);
    let mut backoff = Backoff::new(BackoffPolicy::new(
        Duration::from_millis(5),
        Duration::from_secs(1),
    ));
    let mut rng = rand_seed();
    let mut at_limit_logged = false;
    loop {
        if permits.available_permits() == 0 && !at_limit_logged {
            tracing::warn!(
                max_connections = limits.max_connections,
                "connection limit reached: not accepting until a connection closes"
            );
            at_limit_logged = true;
        }
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => p.expect("never closed"),
            _ = shutdown.graceful.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.graceful.cancelled() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => {
                backoff.reset();
                a
            }
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS...: the process or the host is out
                // of something; retrying at once would spin.
                let wait = backoff.next_delay(&mut rng);
                tracing::warn!(error = %e, retry_in = ?wait, "cannot accept a connection");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    _ = shutdown.graceful.cancelled() => return,
                }
            }
        };
        at_limit_logged = false;
        let info = ConnInfo {
            id: ids.fetch_add(1, Ordering::Relaxed),
            remote: Some(remote),
        };
        let conn = connection(
            tcp,
            tls.clone(),
            info,
            oip.clone(),
            limits,
            shutdown.clone(),
            permit,
            Arc::clone(&on_close),
        );
        tasks.spawn(conn);
    }
}

/// Jitter for the accept backoff; not security-relevant.
fn rand_seed() -> rand::rngs::SmallRng {
    use rand::SeedableRng;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    rand::rngs::SmallRng::seed_from_u64(nanos)
}

/// Bytes of frames gathered into one write: a full 16 KiB DATA frame and
/// what precedes it. See [`Gathering`].
const WRITE_BUFFER: usize = 17 << 10;

pin_project_lite::pin_project! {
    /// The connection as `h2` sees it: written through a buffer that `h2`'s
    /// flush empties, and not vectored. `h2` queues a DATA payload too big
    /// to copy as a separate buffer and must write it before it can queue
    /// the next frame, so a small response (headers, data, trailers) would
    /// take two writes; on a non-vectored transport `h2` copies payloads up
    /// to 1 KiB instead (256 bytes when vectored), and the buffer here
    /// merges larger payloads with their frame headers. `h2` flushes at the
    /// end of every write cycle, so nothing waits in the buffer.
    struct Gathering<T> {
        #[pin]
        inner: T,
    }
}

#[allow(non_snake_case)]
fn Gathering<T>(inner: T) -> Gathering<T> {
    Gathering { inner }
}

impl<T: tokio::io::AsyncRead> tokio::io::AsyncRead for Gathering<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite> tokio::io::AsyncWrite for Gathering<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Response bytes a stream may send ahead of its flow-control window (h2
/// buffers them): small responses then leave with their headers in one
/// write; beyond it, each chunk waits for window.
const EAGER_BYTES: usize = 64 << 10;

#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    info: ConnInfo,
    oip: Oip,
    limits: ServerLimits,
    shutdown: Shutdown,
    _permit: OwnedSemaphorePermit,
    on_close: OnClose,
) {
    let id = info.id;
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let io = FirstByteDeadline::new(tcp, limits.handshake_timeout);
    match tls {
        None => serve_connection(io, info, oip, limits, shutdown).await,
        Some(acceptor) => {
            if let Some(tls) = crate::tls::accept(&acceptor, io, limits.handshake_timeout).await {
                serve_connection(tls, info, oip, limits, shutdown).await;
            }
        }
    }
    on_close(id);
}

async fn serve_connection<T>(
    io: T,
    info: ConnInfo,
    oip: Oip,
    limits: ServerLimits,
    shutdown: Shutdown,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let id = info.id;
    let handshake = h2::server::Builder::new()
        .initial_window_size(limits.stream_window)
        .initial_connection_window_size(limits.connection_window)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_size)
        .max_pending_accept_reset_streams(MAX_PENDING_RESETS)
        .handshake::<_, Bytes>(Gathering(BufWriter::with_capacity(WRITE_BUFFER, io)));
    let mut conn = match tokio::time::timeout(limits.handshake_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(conn = id, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(conn = id, "HTTP/2 handshake timed out");
            return;
        }
    };
    let mut keepalive = Keepalive::new(
        conn.ping_pong(),
        limits.keepalive_interval,
        limits.keepalive_timeout,
    );
    // Shared by this connection's requests: one reference count per
    // request instead of one per field.
    let oip = Arc::new(oip);
    let opened = Instant::now();
    let mut last_request = Instant::now();
    let mut requests = FuturesUnordered::new();
    let mut closing = false;
    loop {
        let idle_at = last_request + limits.idle_timeout;
        tokio::select! {
            accepted = conn.accept() => match accepted {
                Some(Ok((req, respond))) => {
                    last_request = Instant::now();
                    requests.push(handle(Arc::clone(&oip), info.clone(), req, respond, &shutdown.hard));
                }
                Some(Err(e)) => {
                    tracing::debug!(conn = id, error = %e, "connection ended");
                    break;
                }
                None => break,
            },
            Some(()) = requests.next(), if !requests.is_empty() => {}
            _ = shutdown.graceful.cancelled(), if !closing => {
                conn.graceful_shutdown();
                closing = true;
            }
            _ = shutdown.hard.cancelled() => break,
            _ = tokio::time::sleep_until(idle_at.into()), if !closing && requests.is_empty() => {
                tracing::debug!(conn = id, idle = ?limits.idle_timeout, "closing an idle connection");
                conn.graceful_shutdown();
                closing = true;
            }
            () = std::future::poll_fn(|cx| keepalive.poll_dead(cx)) => {
                tracing::debug!(conn = id, "peer did not answer a ping; closing");
                break;
            }
        }
    }
    tracing::trace!(conn = id, open_for = ?opened.elapsed(), "connection closed");
}

/// Most streams a client may reset before the agent has accepted them
/// (the "rapid reset" attack) before the connection is closed. Not small:
/// while the agent itself stalls (a pause, CPU starvation), a client's
/// timed-out attempts pile up in the socket as opened-then-reset streams
/// and are all read at once when it runs again: 8 callers timing out every
/// 30 ms during a 1 s stall leave about 270. With h2's default (20), or the
/// 64 used before, the agent then closed the connection of a well-behaved
/// client, failing its requests in flight. An attacker still cannot make
/// the agent hold more than this many dead streams per connection.
const MAX_PENDING_RESETS: usize = 1024;

/// Keep-alive pings of one connection, as a state that outlives the turns
/// of the connection's `select!` loop (whose branches are dropped and made
/// again on every turn). Before, the wait for a ping's answer was such a
/// branch: a request finishing while a ping was out dropped it, the next
/// turn sent a second ping while the first was pending, h2 refused it, and
/// the agent closed the connection as dead — every busy connection once per
/// `keepalive_interval`, failing the requests in flight on it
/// (`hostile_clients::keepalive_pings_do_not_close_a_busy_connection`).
struct Keepalive {
    ping: Option<h2::PingPong>,
    interval: Duration,
    timeout: Duration,
    /// A ping is out and its answer is awaited.
    waiting: bool,
    /// Fires when the next ping is due, or (waiting) when the answer is late.
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Keepalive {
    fn new(ping: Option<h2::PingPong>, interval: Duration, timeout: Duration) -> Self {
        Self {
            ping,
            interval,
            timeout,
            waiting: false,
            timer: Box::pin(tokio::time::sleep(interval)),
        }
    }

    /// Sends pings when due and takes their answers; ready when the peer is
    /// dead (no answer within `timeout`, or the connection refused the ping).
    fn poll_dead(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(ping) = self.ping.as_mut() else {
            return Poll::Pending;
        };
        loop {
            if self.waiting {
                match ping.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.waiting = false;
                        let next = tokio::time::Instant::now() + self.interval;
                        self.timer.as_mut().reset(next);
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => {}
                }
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.waiting {
                return Poll::Ready(());
            }
            if ping.send_ping(h2::Ping::opaque()).is_err() {
                return Poll::Ready(());
            }
            self.waiting = true;
            let late = tokio::time::Instant::now() + self.timeout;
            self.timer.as_mut().reset(late);
        }
    }
}

/// Serves one request on its stream: routes it, sends the response.
async fn handle(
    oip: Arc<Oip>,
    info: ConnInfo,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    hard: &CancellationToken,
) {
    let mut req = req.map(RequestBody);
    req.extensions_mut().insert(info);
    let resp = tokio::select! {
        r = oip.route(req) => r,
        _ = hard.cancelled() => status_response(
            Status::unavailable("the agent is stopping"),
            &oip.pool,
        ),
    };
    let (head, body) = resp.into_parts();
    let end = body.is_end_stream();
    let Ok(send) = respond.send_response(Response::from_parts(head, ()), end) else {
        return;
    };
    if !end {
        pipe(body, send).await;
    }
}

/// Sends `body` on `send`: data within the flow-control window (after the
/// first [`EAGER_BYTES`]), in pieces no larger than the capacity h2 grants,
/// then trailers.
async fn pipe(mut body: FrontBody, mut send: SendStream<Bytes>) {
    let mut eager = EAGER_BYTES;
    loop {
        let frame = std::future::poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            Pin::new(&mut body).poll_frame(cx)
        })
        .await;
        let frame = match frame {
            None => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed");
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(mut data) => {
                if data.len() <= eager {
                    eager -= data.len();
                    if send.send_data(data, false).is_err() {
                        return;
                    }
                    continue;
                }
                // Beyond the eager bytes, send what the window allows at a
                // time: h2 never grants more capacity than its send buffer
                // (400 KiB), so waiting for a whole larger frame would wait
                // forever (a rewritten shared-memory response is one frame).
                while !data.is_empty() {
                    send.reserve_capacity(data.len());
                    let granted = loop {
                        let cap = send.capacity();
                        if cap > 0 {
                            break cap;
                        }
                        match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                            Some(Ok(_)) => {}
                            _ => return,
                        }
                    };
                    let chunk = data.split_to(granted.min(data.len()));
                    if send.send_data(chunk, false).is_err() {
                        return;
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = send.send_trailers(trailers);
                }
                return;
            }
        }
    }
}

/// A request body read from its h2 stream, giving flow-control window back
/// as it is read.
pub struct RequestBody(RecvStream);

impl Body for RequestBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let recv = &mut self.0;
        match ready!(recv.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = recv.flow_control().release_capacity(data.len());
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            None => {}
        }
        Poll::Ready(match ready!(recv.poll_trailers(cx)) {
            Ok(Some(t)) => Some(Ok(Frame::trailers(t))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

impl Oip {
    /// Answers one request.
    pub async fn route(&self, req: Request<RequestBody>) -> Response<FrontBody> {
        match req.uri().path() {
            MODEL_INFER_PATH => self.infer.call(req).await,
            // Boxed: the other paths' futures are large, and every request's
            // future is as large as its largest path (moved on every request).
            MODEL_STREAM_INFER_PATH => Box::pin(self.tonic(self.streams.clone(), req)).await,
            _ => {
                let call = Box::pin(self.tonic(self.calls.clone(), req));
                match tokio::time::timeout(self.call_timeout, call).await {
                    Ok(resp) => resp,
                    Err(_) => status_response(
                        Status::deadline_exceeded("the call did not complete within call_timeout"),
                        &self.pool,
                    ),
                }
            }
        }
    }

    async fn tonic(&self, routes: Routes, req: Request<RequestBody>) -> Response<FrontBody> {
        let resp = match routes.oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let (mut head, body) = resp.into_parts();
        if head.headers.contains_key("grpc-status") {
            // Trailers-only response: the status is in the headers.
            add_report(&self.pool, &mut head.headers);
        }
        Response::from_parts(
            head,
            FrontBody::Tonic {
                inner: body,
                pool: Arc::clone(&self.pool),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server-side HTTP/2 connection over an in-memory pipe, its
    /// keep-alive, and the client's end (`answer`: whether the client's
    /// connection task runs, which answers pings).
    async fn pair(
        interval: Duration,
        timeout: Duration,
        answer: bool,
    ) -> (
        h2::server::Connection<tokio::io::DuplexStream, Bytes>,
        Keepalive,
    ) {
        let (a, b) = tokio::io::duplex(64 << 10);
        tokio::spawn(async move {
            let (_send, conn) = h2::client::handshake(b).await.unwrap();
            if answer {
                let _ = conn.await;
            } else {
                // Holds the connection open without ever reading again.
                std::future::pending::<()>().await;
            }
        });
        let mut server = h2::server::handshake(a).await.unwrap();
        let keepalive = Keepalive::new(server.ping_pong(), interval, timeout);
        (server, keepalive)
    }

    /// A connection loop whose turns come every millisecond (as on a busy
    /// connection) keeps a peer that answers its pings for ten intervals.
    /// The earlier keep-alive (an awaiting branch of the loop) fails this:
    /// it took the peer for dead at the first ping.
    #[tokio::test(start_paused = true)]
    async fn a_busy_loop_keeps_a_peer_that_answers_pings() {
        let (mut conn, mut keepalive) =
            pair(Duration::from_secs(30), Duration::from_secs(20), true).await;
        let end = tokio::time::Instant::now() + Duration::from_secs(300);
        loop {
            tokio::select! {
                _ = conn.accept() => panic!("the client opened nothing"),
                () = std::future::poll_fn(|cx| keepalive.poll_dead(cx)) => {
                    panic!("a live peer was taken for dead")
                }
                // Another branch winning every turn, as requests do.
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            if tokio::time::Instant::now() >= end {
                break;
            }
        }
    }

    /// A peer that never answers is found dead one interval plus one
    /// timeout after the connection started, on a busy loop too.
    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_answer_is_found_dead_after_the_timeout() {
        let (mut conn, mut keepalive) =
            pair(Duration::from_secs(30), Duration::from_secs(20), false).await;
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = conn.accept() => {}
                () = std::future::poll_fn(|cx| keepalive.poll_dead(cx)) => break,
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
        assert_eq!(
            started.elapsed().as_secs(),
            50,
            "dead after interval + timeout"
        );
    }
}
