//! The OIP port: accepting connections, serving HTTP/2 on them, routing
//! each request.
//!
//! The agent runs its own accept loop and serves HTTP/2 itself (the
//! protocol state in [`infermesh_http2::server`], the I/O in the connection's driver here),
//! rather than through tonic's server, hyper or `h2`, so that every
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
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::future::Future;
use std::io::IoSlice;
use std::sync::Mutex;
use std::task::Waker;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use http::{Request, Response};
use http_body::{Body, Frame};
use infermesh_backoff::{Backoff, BackoffPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tokio_util::task::TaskTracker;
use tonic::Status;
use tonic::service::Routes;
use tower::ServiceExt;

use crate::conn::{ConnInfo, FirstByteDeadline, OnClose};
use crate::forward::InferPath;
use crate::grpc::{MODEL_INFER_PATH, status_response};
use crate::pool::Pool;
use crate::trailer::{FrontBody, add_report};
use infermesh_http2::code;

use infermesh_http2::server::{Conn, Settings, StreamError};

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

/// Unwritten bytes beyond which a connection stops reading from its
/// client (a client that sends but does not read, e.g. a PING flood).
const OUT_HIGH: usize = 1 << 20;
/// Bytes read from a socket at a time (at least).
const READ_CHUNK: usize = 32 << 10;

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
        None => serve_connection(io, info, Arc::new(oip), limits, shutdown).await,
        Some(acceptor) => {
            if let Some(tls) = crate::tls::accept(&acceptor, io, limits.handshake_timeout).await {
                serve_connection(tls, info, Arc::new(oip), limits, shutdown).await;
            }
        }
    }
    on_close(id);
}

/// A connection's state, shared by its driver and its requests (which run
/// inside the driver's task, and whose bodies may be read elsewhere).
pub(crate) struct Shared {
    inner: Mutex<Inner>,
}

struct Inner {
    conn: Conn,
    /// The driver's waker, woken when output is queued from outside its
    /// poll.
    driver: Option<Waker>,
    /// The driver is polling (and writes what is queued before it waits).
    polling: bool,
}

impl Shared {
    /// Runs `f` on the connection; wakes whoever it says, and the driver
    /// if output was queued while it is not polling.
    fn with<R>(&self, f: impl FnOnce(&mut Conn, &mut Vec<Waker>) -> R) -> R {
        let mut wake = Vec::new();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut inner.conn, &mut wake);
        let driver = match inner.polling || inner.conn.out.is_empty() {
            true => None,
            false => inner.driver.take(),
        };
        drop(inner);
        wake.into_iter().chain(driver).for_each(Waker::wake);
        r
    }
}

/// Serves HTTP/2 on `io` until the connection ends: the client leaves,
/// breaks the protocol, stops answering pings, idles out, or the agent
/// shuts down. Requests are answered by `router`.
async fn serve_connection<T, R>(
    io: T,
    info: ConnInfo,
    router: Arc<R>,
    limits: ServerLimits,
    shutdown: Shutdown,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: Router,
{
    let id = info.id;
    let opened = Instant::now();
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            conn: Conn::new(Settings {
                response_names: crate::trailer::RESPONSE_NAMES,
                known_paths: &[MODEL_INFER_PATH],
                max_streams: limits.max_concurrent_streams,
                stream_window: limits.stream_window,
                connection_window: limits.connection_window,
                max_header_list: limits.max_header_list_size,
            }),
            driver: None,
            polling: false,
        }),
    });
    let now = tokio::time::Instant::now();
    let mut driver = Driver {
        io,
        read: BytesMut::with_capacity(READ_CHUNK),
        shared: Arc::clone(&shared),
        // Shared by this connection's requests: one reference count per
        // request instead of one per field.
        router,
        info,
        requests: FuturesUnordered::new(),
        limits,
        graceful: Box::pin(shutdown.graceful.cancelled_owned()),
        hard: Box::pin(shutdown.hard.cancelled_owned()),
        closing: false,
        last_request: now,
        deadline: Box::pin(tokio::time::sleep_until(now + limits.handshake_timeout)),
        keepalive: Box::pin(tokio::time::sleep_until(now + limits.keepalive_interval)),
        ping_out: false,
        unflushed: false,
    };
    let end = std::future::poll_fn(|cx| driver.poll(cx)).await;
    tracing::debug!(conn = id, open_for = ?opened.elapsed(), "connection closed: {end}");
}

/// A request's future, as the driver runs it.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The I/O of one connection: reads frames into the [`Conn`], runs its
/// requests, writes what they answer, keeps time (handshake, idle,
/// keep-alive). One task per connection; requests are futures inside it.
struct Driver<T, R> {
    io: T,
    read: BytesMut,
    shared: Arc<Shared>,
    router: Arc<R>,
    info: ConnInfo,
    requests: FuturesUnordered<Call>,
    limits: ServerLimits,
    graceful: Pin<Box<WaitForCancellationFutureOwned>>,
    hard: Pin<Box<WaitForCancellationFutureOwned>>,
    /// GOAWAY sent (shutdown or idle): open streams finish, then it ends.
    closing: bool,
    last_request: tokio::time::Instant,
    /// The handshake's deadline until the client's SETTINGS arrive; then
    /// the idle timeout's.
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// When the next keep-alive ping is due, or (`ping_out`) its answer.
    keepalive: Pin<Box<tokio::time::Sleep>>,
    ping_out: bool,
    /// Bytes were written and not flushed (TLS).
    unflushed: bool,
}

impl<T, R> Driver<T, R>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: Router,
{
    /// Ready (with why) when the connection is over.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<&'static str> {
        if self.hard.as_mut().poll(cx).is_ready() {
            return Poll::Ready("the agent stopped");
        }
        if !self.closing && self.graceful.as_mut().poll(cx).is_ready() {
            self.closing = true;
            self.shared.with(|c, _| c.go_away());
        }
        loop {
            let mut progress = false;
            // Read, unless the client is not reading what it gets.
            let reading = self.shared.with(|c, _| c.out.len() < OUT_HIGH);
            if reading {
                if self.read.capacity() - self.read.len() < READ_CHUNK / 2 {
                    self.read.reserve(READ_CHUNK);
                }
                match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read) {
                    Poll::Ready(Ok(0)) => return Poll::Ready("the client closed it"),
                    Poll::Ready(Ok(_)) => {
                        progress = true;
                        self.on_read();
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(conn = self.info.id, error = %e, "read failed");
                        return Poll::Ready("a read failed");
                    }
                    Poll::Pending => {}
                }
            }
            // Run the requests, then write what is queued.
            self.shared
                .inner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .polling = true;
            // Requests that write to a worker in this pass leave together.
            crate::upstream::corked(|| {
                while let Poll::Ready(Some(())) = self.requests.poll_next_unpin(cx) {}
            });
            let mut inner = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.polling = false;
            let conn = &mut inner.conn;
            while !conn.out.is_empty() {
                let mut slices = [IoSlice::new(&[]); 16];
                let n = conn.out.slices(&mut slices);
                match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready("the socket took no bytes"),
                    Poll::Ready(Ok(n)) => {
                        conn.out.advance(n);
                        self.unflushed = true;
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(conn = self.info.id, error = %e, "write failed");
                        return Poll::Ready("a write failed");
                    }
                    Poll::Pending => break,
                }
            }
            if self.unflushed && conn.out.is_empty() {
                match Pin::new(&mut self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(_)) => return Poll::Ready("a write failed"),
                    Poll::Pending => {}
                }
            }
            if let Some(why) = conn.failed() {
                if conn.out.is_empty() || !reading {
                    return Poll::Ready(why);
                }
            }
            if conn.out.is_empty() && conn.is_finished() {
                return Poll::Ready(if self.closing {
                    "closed (GOAWAY)"
                } else {
                    "the client went away"
                });
            }
            if self.ping_out && conn.take_pong() {
                self.ping_out = false;
                let next = tokio::time::Instant::now() + self.limits.keepalive_interval;
                self.keepalive.as_mut().reset(next);
            }
            let settled = conn.is_settled();
            let idle = conn.open_streams() == 0;
            if !progress {
                inner.driver = match inner.driver.take() {
                    Some(w) if w.will_wake(cx.waker()) => Some(w),
                    _ => Some(cx.waker().clone()),
                };
                drop(inner);
                return self.poll_timers(cx, settled, idle);
            }
        }
    }

    /// Hands what was read to the connection and starts new requests.
    fn on_read(&mut self) {
        let mut accepted = Vec::new();
        let read = &mut self.read;
        self.shared.with(|c, wake| {
            c.on_read(read, wake);
            while let Some(req) = c.accept() {
                accepted.push(req);
            }
        });
        if accepted.is_empty() {
            return;
        }
        self.last_request = tokio::time::Instant::now();
        for (id, req) in accepted {
            let call = Cancellable {
                shared: Arc::clone(&self.shared),
                id,
                inner: handle(
                    Arc::clone(&self.router),
                    self.info.clone(),
                    Arc::clone(&self.shared),
                    id,
                    req,
                ),
            };
            self.requests.push(Box::pin(call));
        }
    }

    /// The handshake, idle and keep-alive timers; ready when the
    /// connection must end.
    fn poll_timers(
        &mut self,
        cx: &mut Context<'_>,
        settled: bool,
        idle: bool,
    ) -> Poll<&'static str> {
        let now = tokio::time::Instant::now();
        if self.deadline.as_mut().poll(cx).is_ready() {
            if !settled {
                return Poll::Ready("no HTTP/2 handshake within handshake_timeout");
            }
            let idle_at = self.last_request + self.limits.idle_timeout;
            if idle && !self.closing && idle_at <= now {
                tracing::debug!(conn = self.info.id, idle = ?self.limits.idle_timeout, "closing an idle connection");
                self.closing = true;
                self.shared.with(|c, _| c.go_away());
                cx.waker().wake_by_ref();
            } else {
                let next = idle_at.max(now + Duration::from_millis(1));
                self.deadline.as_mut().reset(next);
                let _ = self.deadline.as_mut().poll(cx);
            }
        }
        if !self.limits.keepalive_interval.is_zero() && self.keepalive.as_mut().poll(cx).is_ready()
        {
            if self.ping_out {
                return Poll::Ready("the client did not answer a ping");
            }
            self.ping_out = self.shared.with(|c, _| c.ping());
            self.keepalive
                .as_mut()
                .reset(now + self.limits.keepalive_timeout);
            let _ = self.keepalive.as_mut().poll(cx);
        }
        Poll::Pending
    }
}

impl<T, R> Drop for Driver<T, R> {
    fn drop(&mut self) {
        // Bodies read elsewhere (streams) see the connection gone.
        self.shared.with(|c, wake| c.close_all(wake));
    }
}

pin_project_lite::pin_project! {
    /// A request's future, dropped when the client resets its stream (the
    /// request then leaves a queue, or cancels its call to the worker).
    struct Cancellable<F> {
        shared: Arc<Shared>,
        id: u32,
        #[pin]
        inner: F,
    }
}

impl<F: Future<Output = ()>> Future for Cancellable<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let id = *this.id;
        if this.shared.with(|c, _| c.poll_reset(id, cx.waker())) {
            return Poll::Ready(());
        }
        this.inner.poll(cx)
    }
}

/// Tells the connection a request's handler is over, however it ended.
struct Finish<'a> {
    shared: &'a Shared,
    id: u32,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let id = self.id;
        self.shared.with(|c, wake| c.finish(id, wake));
    }
}

/// Serves one request on its stream: routes it, sends the response.
async fn handle<R: Router>(
    router: Arc<R>,
    info: ConnInfo,
    shared: Arc<Shared>,
    id: u32,
    req: Request<()>,
) {
    let _finish = Finish {
        shared: &shared,
        id,
    };
    let mut req = req.map(|()| RequestBody {
        shared: Arc::clone(&shared),
        id,
    });
    req.extensions_mut().insert(info);
    let resp = router.route(req).await;
    let (head, body) = resp.into_parts();
    let end = body.is_end_stream();
    shared.with(|c, _| c.send_head(id, head.status.as_u16(), &head.headers, end));
    if !end {
        pipe(body, &shared, id).await;
    }
}

/// Sends `body` on stream `id`: data as the client's windows allow (at
/// most [`infermesh_http2::server::EAGER_BYTES`] queued ahead of them), then trailers.
async fn pipe(mut body: FrontBody, shared: &Shared, id: u32) {
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let frame = match frame {
            None => {
                shared.with(|c, wake| c.send_end(id, None, wake));
                return;
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "response body failed");
                shared.with(|c, wake| c.send_reset(id, code::INTERNAL_ERROR, wake));
                return;
            }
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                shared.with(|c, wake| c.send_data(id, data, wake));
                let ready = std::future::poll_fn(|cx| {
                    match shared.with(|c, _| c.poll_send_ready(id, cx.waker())) {
                        Some(ready) => Poll::Ready(ready),
                        None => Poll::Pending,
                    }
                })
                .await;
                if !ready {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    shared.with(|c, wake| c.send_end(id, Some(&trailers), wake));
                }
                return;
            }
        }
    }
}

/// A request body, read from its stream; window goes back to the client
/// as it is read.
pub struct RequestBody {
    shared: Arc<Shared>,
    id: u32,
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        let id = self.id;
        match self.shared.with(|c, _| c.poll_data(id, cx.waker())) {
            Some(Some(Ok(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Some(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Some(None) => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        let id = self.id;
        self.shared.with(|c, _| c.is_end_stream(id))
    }
}

/// What a connection's requests are answered by: the OIP port's routes
/// ([`Oip`]), or a stand-in in tests.
pub trait Router: Send + Sync + 'static {
    /// Answers one request.
    fn route(&self, req: Request<RequestBody>) -> impl Future<Output = Response<FrontBody>> + Send;
}

impl Router for Oip {
    fn route(&self, req: Request<RequestBody>) -> impl Future<Output = Response<FrontBody>> + Send {
        Oip::route(self, req)
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
    //! The connection driver in-process, under tokio's paused clock, with
    //! `h2`'s client (a peer we did not write) over an in-memory pipe.

    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::Notify;

    /// Answers with the request's body as its message; `/hang` never
    /// answers, and counts its requests dropped.
    #[derive(Default)]
    struct Echo {
        dropped: Arc<AtomicUsize>,
        drop_seen: Arc<Notify>,
    }

    struct OnDrop(Arc<AtomicUsize>, Arc<Notify>);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.notify_one();
        }
    }

    impl Router for Echo {
        fn route(
            &self,
            req: Request<RequestBody>,
        ) -> impl Future<Output = Response<FrontBody>> + Send {
            let guard = (req.uri().path() == "/hang")
                .then(|| OnDrop(Arc::clone(&self.dropped), Arc::clone(&self.drop_seen)));
            async move {
                if let Some(_guard) = guard {
                    std::future::pending::<()>().await;
                }
                let mut body = req.into_body();
                let mut data = BytesMut::new();
                while let Some(frame) =
                    std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                {
                    if let Ok(d) = frame.unwrap().into_data() {
                        data.extend_from_slice(&d);
                    }
                }
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                // A load-report name, its value the body, as the agent's
                // trailers carry a report that changes.
                let echo = http::HeaderValue::from_bytes(&data).unwrap();
                trailers.insert("infermesh-busy", echo);
                let mut resp = Response::new(FrontBody::Message {
                    data: Some(data.freeze()),
                    trailers: Some(trailers),
                });
                resp.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/grpc"),
                );
                resp
            }
        }
    }

    fn limits() -> ServerLimits {
        ServerLimits {
            max_connections: 10,
            max_concurrent_streams: 100,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            max_header_list_size: 16 << 10,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
        }
    }

    fn shutdown() -> Shutdown {
        Shutdown {
            graceful: CancellationToken::new(),
            hard: CancellationToken::new(),
        }
    }

    /// A connection served with `limits` by `router`; the client's end.
    fn serve(
        limits: ServerLimits,
        router: Arc<Echo>,
        shutdown: Shutdown,
    ) -> (tokio::io::DuplexStream, tokio::task::JoinHandle<Duration>) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let info = ConnInfo {
            id: 1,
            remote: None,
        };
        let served = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            serve_connection(a, info, router, limits, shutdown).await;
            started.elapsed()
        });
        (b, served)
    }

    fn request(path: &str) -> Request<()> {
        Request::post(format!("http://agent{path}"))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    }

    async fn call(client: &mut h2::client::SendRequest<Bytes>, body: &'static [u8]) -> Bytes {
        let mut ready = client.clone().ready().await.unwrap();
        let (resp, mut send) = ready.send_request(request("/echo"), false).unwrap();
        send.send_data(Bytes::from_static(body), true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        let mut body = resp.into_body();
        let mut got = BytesMut::new();
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            let _ = body.flow_control().release_capacity(d.len());
            got.extend_from_slice(&d);
        }
        let trailers = body.trailers().await.unwrap().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["infermesh-busy"].as_bytes(), &got[..]);
        got.freeze()
    }

    /// Response heads and trailers name their fields by index in the
    /// client's HPACK table after the first response: a real client
    /// (`h2`) reads every response, with the default table, none, and room
    /// for one entry. (`h2` does not hold the agent to the size it set;
    /// `infermesh_http2::server`'s tests decode with one that does.)
    #[tokio::test(start_paused = true)]
    async fn a_real_client_reads_responses_with_indexed_fields() {
        for size in [None, Some(0), Some(60)] {
            let (io, _served) = serve(limits(), Arc::new(Echo::default()), shutdown());
            let mut builder = h2::client::Builder::new();
            if let Some(size) = size {
                builder.header_table_size(size);
            }
            let (mut client, conn) = builder.handshake(io).await.unwrap();
            tokio::spawn(conn);
            for body in [&b"0.5"[..], b"0.5", b"0.25", b"1"] {
                assert_eq!(&call(&mut client, body).await[..], body, "table {size:?}");
            }
        }
    }

    /// Requests answered on a connection whose client answers pings: it
    /// stays open across ten keep-alive intervals (the earlier keep-alive
    /// closed every busy connection once per interval).
    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_whose_client_answers_pings_stays_open() {
        let (io, served) = serve(limits(), Arc::new(Echo::default()), shutdown());
        let (mut client, conn) = h2::client::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let end = tokio::time::Instant::now() + Duration::from_secs(300);
        while tokio::time::Instant::now() < end {
            assert_eq!(&call(&mut client, b"ping?").await[..], b"ping?");
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        assert!(!served.is_finished(), "the connection was closed");
    }

    /// A client that never answers is dropped one interval plus one
    /// timeout after the connection began.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_answer_pings_is_dropped_after_the_timeout() {
        let (io, served) = serve(limits(), Arc::new(Echo::default()), shutdown());
        let (_client, mut conn) = h2::client::handshake(io).await.unwrap();
        // The client's preface and SETTINGS go out; then its connection is
        // never polled again.
        let _ = tokio::time::timeout(Duration::from_millis(1), &mut conn).await;
        assert_eq!(served.await.unwrap(), Duration::from_secs(50));
        // One that never sends its preface is dropped at the handshake
        // timeout.
        let (_io, served) = serve(limits(), Arc::new(Echo::default()), shutdown());
        assert_eq!(served.await.unwrap(), limits().handshake_timeout);
    }

    /// With no request for `idle_timeout`, the agent sends GOAWAY and the
    /// connection ends.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let limits = ServerLimits {
            idle_timeout: Duration::from_secs(45),
            keepalive_interval: Duration::from_secs(10),
            ..limits()
        };
        let (io, served) = serve(limits, Arc::new(Echo::default()), shutdown());
        let (mut client, conn) = h2::client::handshake(io).await.unwrap();
        let conn = tokio::spawn(conn);
        tokio::time::sleep(Duration::from_secs(20)).await;
        call(&mut client, b"x").await;
        assert_eq!(served.await.unwrap(), Duration::from_secs(65));
        conn.await.unwrap().unwrap();
    }

    /// A stream the client resets drops its request's future at once (a
    /// request waiting in a queue leaves it).
    #[tokio::test(start_paused = true)]
    async fn a_stream_the_client_resets_drops_its_request() {
        let echo = Arc::new(Echo::default());
        let (io, _served) = serve(limits(), Arc::clone(&echo), shutdown());
        let (client, conn) = h2::client::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let mut ready = client.ready().await.unwrap();
        let (resp, send) = ready.send_request(request("/hang"), true).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(echo.dropped.load(Ordering::SeqCst), 0);
        drop((resp, send));
        echo.drop_seen.notified().await;
        assert_eq!(echo.dropped.load(Ordering::SeqCst), 1);
        // And the connection serves on.
        let mut ready = ready.ready().await.unwrap();
        assert_eq!(&call(&mut ready, b"after").await[..], b"after");
    }

    /// Graceful shutdown: GOAWAY, the request in flight is answered, the
    /// connection then ends.
    #[tokio::test(start_paused = true)]
    async fn a_graceful_shutdown_lets_the_request_in_flight_finish() {
        let stop = shutdown();
        let (io, served) = serve(limits(), Arc::new(Echo::default()), stop.clone());
        let (client, conn) = h2::client::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let mut ready = client.ready().await.unwrap();
        let (resp, mut send) = ready.send_request(request("/echo"), false).unwrap();
        send.send_data(Bytes::from_static(b"part"), false).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        stop.graceful.cancel();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!served.is_finished(), "a request is in flight");
        send.send_data(Bytes::from_static(b"-end"), true).unwrap();
        let resp = resp.await.unwrap();
        let mut body = resp.into_body();
        assert_eq!(&body.data().await.unwrap().unwrap()[..], b"part-end");
        served.await.unwrap();
    }
}
