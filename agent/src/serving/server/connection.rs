//! One client connection of the OIP port: the I/O around its sans-IO
//! HTTP/2 state ([`infermesh_http2::server::Conn`]).
//!
//! One task per connection: the driver reads frames into the state, runs
//! the connection's requests as futures inside its own poll (no task per
//! request, no wake-up to reach the socket), writes what they answer, and
//! keeps time (handshake, idle, keep-alive, and the state's own timeouts:
//! a response waiting too long for window, the second GOAWAY). When it
//! ends it lingers: the socket's write side is shut and what the client
//! still sends is read and dropped for a moment, so that a client
//! mid-upload reads the GOAWAY instead of a reset.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use http::Request;
use http_body::{Body, Frame};
use infermesh_http2::code;
use infermesh_http2::server::{Conn, Settings, StreamError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::{Router, ServerLimits, Shutdown};
use crate::alarm::Alarm;
use crate::serving::front_body::FrontBody;
use crate::serving::grpc::MODEL_INFER_PATH;
use crate::transports::conn::ConnInfo;

/// Bytes read from a socket at a time (at least).
const READ_CHUNK: usize = 32 << 10;
/// The most read at a time: a connection whose reads fill the buffer
/// (large request bodies) reads in chunks growing up to this. Each read
/// ends inside a frame, and the frame's start is copied to the next
/// buffer (its frames are contiguous and shared, not copied, downstream),
/// so the read size sets how much of the traffic is copied once more:
/// half a 16 KiB frame per 32 KiB read was a quarter of it (7% of the
/// agent's cycles at 1 MiB x 16, BENCHMARKS.md). Not larger: with the
/// partial frame (< 16 KiB) a buffer stays within 128 KiB, mimalloc's
/// largest size class served from reused pages; 256 KiB buffers came
/// from fresh memory, and zeroing it cost more than the copy saved.
const MAX_READ_CHUNK: usize = 112 << 10;
const _: () = assert!(MAX_READ_CHUNK + (16 << 10) <= 128 << 10);
/// How long a connection that ended reads and drops what its client still
/// sends, and how much of it, before closing (lingering close).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;
/// Requests of one connection that run inside its driver's task; more at
/// once run as tasks of their own, so that a connection with many streams
/// (a gateway multiplexing its callers) can use more than one core. Below
/// it a request costs no wake-up between tasks (the common case, and the
/// reason requests run inline at all).
const INLINE_REQUESTS: usize = 32;

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
    /// Runs `f` on the connection for a request or a body; wakes whoever
    /// it says, and the driver if `f` queued output while the driver is
    /// not polling (it writes what is queued before it waits).
    fn with<R>(&self, f: impl FnOnce(&mut Conn, &mut Vec<Waker>) -> R) -> R {
        let mut wake = Vec::new();
        let mut inner = self.lock();
        let before = inner.conn.out().len();
        let r = f(&mut inner.conn, &mut wake);
        let driver = match inner.polling || inner.conn.out().len() <= before {
            true => None,
            false => inner.driver.take(),
        };
        drop(inner);
        wake.into_iter().chain(driver).for_each(Waker::wake);
        r
    }

    /// Runs `f` on the connection for its driver: wakes whoever it says,
    /// never the driver itself. (Waking itself whenever output was waiting
    /// made a driver whose client did not read spin: every pass woke the
    /// next.)
    fn drive<R>(&self, f: impl FnOnce(&mut Conn, &mut Vec<Waker>) -> R) -> R {
        let mut wake = Vec::new();
        let r = f(&mut self.lock().conn, &mut wake);
        wake.into_iter().for_each(Waker::wake);
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Orderly, or the client broke the protocol: linger before closing.
    Linger(&'static str),
    /// The socket failed, the client closed it, or the agent stopped.
    Close(&'static str),
}

/// Serves HTTP/2 on `io` until the connection ends: the client leaves,
/// breaks the protocol, stops answering pings, idles out, or the agent
/// shuts down. Requests are answered by `router`.
pub(super) async fn serve_connection<T, R>(
    io: T,
    info: ConnInfo,
    router: Arc<R>,
    limits: ServerLimits,
    shutdown: Shutdown,
) where
    T: AsyncRead + AsyncWrite + Unpin,
    R: Router,
{
    let id = info.id;
    let opened = tokio::time::Instant::now();
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            conn: Conn::new(
                Settings {
                    response_names: crate::serving::load_report::RESPONSE_NAMES,
                    known_paths: &[MODEL_INFER_PATH],
                    limits: limits.http2,
                },
                opened.into_std(),
            ),
            driver: None,
            polling: false,
        }),
    });
    let mut driver = Driver {
        io,
        read: BytesMut::with_capacity(READ_CHUNK),
        accepted: Vec::new(),
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
        last_request: opened,
        deadline: Box::pin(tokio::time::sleep_until(opened + limits.handshake_timeout)),
        keepalive: Box::pin(tokio::time::sleep_until(opened + limits.keepalive_interval)),
        ping_out: false,
        protocol: Box::pin(tokio::time::sleep_until(opened)),
        protocol_due: None,
        backlogged: false,
        unflushed: false,
        alarm: Alarm::new(),
        readable: Alarm::new(),
        read_again: true,
        read_chunk: READ_CHUNK,
    };
    let end = std::future::poll_fn(|cx| driver.poll(cx)).await;
    let why = match end {
        End::Linger(why) => {
            driver.linger().await;
            why
        }
        End::Close(why) => why,
    };
    tracing::debug!(conn = id, open_for = ?opened.elapsed(), "connection closed: {why}");
}

/// A request's future, as the driver runs it.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The I/O of one connection: reads frames into the [`Conn`], runs its
/// requests, writes what they answer, keeps time.
struct Driver<T, R> {
    io: T,
    read: BytesMut,
    /// Requests a read opened, on their way to `requests`.
    accepted: Vec<(u32, Request<()>)>,
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
    /// The connection state's own next timeout ([`Conn::next_timeout`]),
    /// and when it is set for.
    protocol: Pin<Box<tokio::time::Sleep>>,
    protocol_due: Option<Instant>,
    /// What `info.backlog` was last set to.
    backlogged: bool,
    /// Bytes were written and not flushed (TLS).
    unflushed: bool,
    /// The waker of `graceful`, `hard` and the sleeps, which are polled
    /// only when it was used.
    alarm: Alarm,
    /// The waker of the socket's reads (and the handshake deadline, which
    /// a read polls): the socket is read when it was used, or while the
    /// last read found bytes (`read_again`). At concurrency 1 three of a
    /// request's four reads found nothing, ~600 instructions per request.
    readable: Alarm,
    read_again: bool,
    /// What the next read reserves room for ([`next_read_chunk`]).
    read_chunk: usize,
}

impl<T, R> Driver<T, R>
where
    T: AsyncRead + AsyncWrite + Unpin,
    R: Router,
{
    /// Ready (with why) when the connection is over.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<End> {
        // The shutdown signals and timers, when one of them may have fired.
        let signalled = self.alarm.take(cx);
        let mut signals = self.alarm.context();
        if signalled && self.hard.as_mut().poll(&mut signals).is_ready() {
            return Poll::Ready(End::Close("the agent stopped"));
        }
        let now = tokio::time::Instant::now();
        let graceful =
            signalled && !self.closing && self.graceful.as_mut().poll(&mut signals).is_ready();
        self.closing |= graceful;
        self.shared.drive(|c, _| {
            c.set_time(now.into_std());
            if graceful {
                c.go_away();
            }
        });
        loop {
            let mut progress = false;
            // Read, unless the client is not reading what it gets.
            let write_buffer = self.limits.http2.write_buffer;
            let reading = self.shared.drive(|c, _| c.out().len() < write_buffer);
            // Only when the last read found bytes or the socket woke its
            // alarm since (most passes are for a worker's answer), and
            // once when reading resumes.
            if !reading {
                self.read_again = true;
            }
            if reading && (self.readable.take(cx) | self.read_again) {
                if self.read.capacity() - self.read.len() < self.read_chunk / 2 {
                    self.read.reserve(self.read_chunk);
                }
                let room = self.read.capacity() - self.read.len();
                let mut socket = self.readable.context();
                match tokio_util::io::poll_read_buf(
                    Pin::new(&mut self.io),
                    &mut socket,
                    &mut self.read,
                ) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(End::Close("the client closed it")),
                    Poll::Ready(Ok(n)) => {
                        self.read_chunk = next_read_chunk(self.read_chunk, n, room);
                        progress = true;
                        self.read_again = true;
                        self.on_read(now);
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(conn = self.info.id, error = %e, "read failed");
                        return Poll::Ready(End::Close("a read failed"));
                    }
                    Poll::Pending => self.read_again = false,
                }
            }
            // Run the requests, then write what is queued.
            self.shared.lock().polling = true;
            // Requests that write to a worker in this pass leave together.
            crate::worker::upstream::corked(|| {
                while let Poll::Ready(Some(())) = self.requests.poll_next_unpin(cx) {}
            });
            let mut inner = self.shared.lock();
            inner.polling = false;
            let conn = &mut inner.conn;
            let mut wake = Vec::new();
            while !conn.out().is_empty() {
                let mut slices = [IoSlice::new(&[]); 16];
                let n = conn.out().slices(&mut slices);
                match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(End::Close("the socket took no bytes"));
                    }
                    Poll::Ready(Ok(n)) => {
                        conn.out().advance(n);
                        self.unflushed = true;
                        // Data that waited for room in the write buffer.
                        conn.on_written(&mut wake);
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(conn = self.info.id, error = %e, "write failed");
                        return Poll::Ready(End::Close("a write failed"));
                    }
                    Poll::Pending => break,
                }
            }
            if self.unflushed && conn.out().is_empty() {
                match Pin::new(&mut self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(_)) => return Poll::Ready(End::Close("a write failed")),
                    Poll::Pending => {}
                }
            }
            if let Some(why) = conn.failed() {
                if conn.out().is_empty() || !reading {
                    return Poll::Ready(End::Linger(why));
                }
            }
            if conn.out().is_empty() && conn.is_finished() {
                return Poll::Ready(End::Linger(if self.closing {
                    "closed (GOAWAY)"
                } else {
                    "the client went away"
                }));
            }
            if self.ping_out && conn.take_pong() {
                self.ping_out = false;
                let next = tokio::time::Instant::now() + self.limits.keepalive_interval;
                self.keepalive.as_mut().reset(next);
                rearm(self.keepalive.as_mut(), &mut self.alarm.context());
            }
            let backlogged = conn.is_backlogged();
            if backlogged != self.backlogged {
                self.backlogged = backlogged;
                // Clearing it wakes the requests waiting for the client.
                self.info.backlog.set(backlogged);
            }
            let settled = conn.is_settled();
            let idle = conn.open_streams() == 0;
            let due = conn.next_timeout();
            if due.is_some_and(|due| due <= now.into_std()) {
                conn.on_timeout(now.into_std(), &mut wake);
                drop(inner);
                wake.into_iter().for_each(Waker::wake);
                continue;
            }
            if !reading && conn.out().len() < write_buffer {
                // The pass began with the write buffer full (so it did not
                // read) and the writes made room: read now. Going to sleep
                // here would leave what the client sent meanwhile (its
                // WINDOW_UPDATEs) unread until a timer woke the driver.
                drop(inner);
                wake.into_iter().for_each(Waker::wake);
                continue;
            }
            if !progress {
                inner.driver = match inner.driver.take() {
                    Some(w) if w.will_wake(cx.waker()) => Some(w),
                    _ => Some(cx.waker().clone()),
                };
                drop(inner);
                wake.into_iter().for_each(Waker::wake);
                return self.poll_timers(cx, now, settled, idle, due, signalled);
            }
            drop(inner);
            wake.into_iter().for_each(Waker::wake);
        }
    }

    /// Hands what was read to the connection and starts new requests.
    fn on_read(&mut self, now: tokio::time::Instant) {
        // Kept between reads: no vector allocated for each request.
        let mut accepted = std::mem::take(&mut self.accepted);
        let read = &mut self.read;
        self.shared.drive(|c, wake| {
            c.on_read(read, now.into_std(), wake);
            while let Some(req) = c.accept() {
                accepted.push(req);
            }
        });
        if accepted.is_empty() {
            self.accepted = accepted;
            return;
        }
        self.last_request = now;
        for (id, req) in accepted.drain(..) {
            let call = Cancellable {
                shared: Arc::clone(&self.shared),
                id,
                inner: handle(
                    Arc::clone(&self.router),
                    Arc::clone(&self.shared),
                    id,
                    req,
                    self.info.clone(),
                ),
            };
            if self.requests.len() < INLINE_REQUESTS {
                self.requests.push(Box::pin(call));
            } else {
                // Its stream keeps the connection open until it finishes
                // (the driver waits for every stream), and a connection
                // that ends resets it: it does not outlive the connection.
                tokio::spawn(call);
            }
        }
        self.accepted = accepted;
    }

    /// The handshake, idle, keep-alive and protocol timers (polled when
    /// `signalled`: one of them may have fired); ready when the connection
    /// must end.
    fn poll_timers(
        &mut self,
        cx: &mut Context<'_>,
        now: tokio::time::Instant,
        settled: bool,
        idle: bool,
        due: Option<Instant>,
        signalled: bool,
    ) -> Poll<End> {
        let mut timers = self.alarm.context();
        if due != self.protocol_due {
            self.protocol_due = due;
            if let Some(due) = due {
                self.protocol.as_mut().reset(due.into());
                rearm(self.protocol.as_mut(), &mut timers);
            }
        }
        if !signalled {
            return Poll::Pending;
        }
        if self.deadline.as_mut().poll(&mut timers).is_ready() {
            if !settled {
                return Poll::Ready(End::Close("no HTTP/2 handshake within handshake_timeout"));
            }
            let idle_at = self.last_request + self.limits.idle_timeout;
            if idle && !self.closing && idle_at <= now {
                tracing::debug!(conn = self.info.id, idle = ?self.limits.idle_timeout, "closing an idle connection");
                self.closing = true;
                self.shared.drive(|c, _| c.go_away());
                cx.waker().wake_by_ref();
            } else {
                // Not idle: look again a timeout after now (a connection
                // with a long request open is not woken every millisecond).
                let next = if idle_at > now {
                    idle_at
                } else {
                    now + self.limits.idle_timeout
                };
                self.deadline.as_mut().reset(next);
                rearm(self.deadline.as_mut(), &mut timers);
            }
        }
        if !self.limits.keepalive_interval.is_zero()
            && self.keepalive.as_mut().poll(&mut timers).is_ready()
        {
            if self.ping_out {
                return Poll::Ready(End::Close("the client did not answer a ping"));
            }
            self.ping_out = self.shared.drive(|c, _| c.ping());
            self.keepalive
                .as_mut()
                .reset(now + self.limits.keepalive_timeout);
            rearm(self.keepalive.as_mut(), &mut timers);
        }
        if self.protocol_due.is_some() && self.protocol.as_mut().poll(&mut timers).is_ready() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Shuts the write side and drops what the client still sends, for at
    /// most [`LINGER`] and [`LINGER_BYTES`] (or until it closes): closing
    /// a socket with unread bytes sends a reset, which can destroy the
    /// GOAWAY before the client reads it.
    async fn linger(&mut self) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let drain = async {
            if self.io.shutdown().await.is_err() {
                return;
            }
            let mut left = LINGER_BYTES;
            let mut buf = [0u8; 8192];
            while left > 0 {
                match self.io.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }
}

/// Polls a sleep just reset, so that it is registered with the alarm; one
/// already due rings it (the next pass polls the timers).
fn rearm(sleep: Pin<&mut tokio::time::Sleep>, timers: &mut Context<'_>) {
    if sleep.poll(timers).is_ready() {
        timers.waker().wake_by_ref();
    }
}

impl<T, R> Drop for Driver<T, R> {
    fn drop(&mut self) {
        // Bodies read elsewhere (streams) see the connection gone.
        self.shared.drive(|c, wake| c.close_all(wake));
    }
}

pin_project_lite::pin_project! {
    /// A request's future, dropped when its stream is reset (the request
    /// then leaves a queue, or cancels its call to the worker). However it
    /// ends — finished, reset before its first poll, or dropped with the
    /// connection — the connection is told its handler is over, so the
    /// stream never outlives it.
    struct Cancellable<F> {
        shared: Arc<Shared>,
        id: u32,
        #[pin]
        inner: F,
    }

    impl<F> PinnedDrop for Cancellable<F> {
        fn drop(this: Pin<&mut Self>) {
            let id = this.id;
            this.shared.with(|c, wake| c.finish(id, wake));
        }
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

/// Serves one request of connection `conn` on its stream: routes it,
/// sends the response.
async fn handle<R: Router>(
    router: Arc<R>,
    shared: Arc<Shared>,
    id: u32,
    req: Request<()>,
    conn: ConnInfo,
) {
    let req = req.map(|()| RequestBody {
        shared: Arc::clone(&shared),
        id,
    });
    let resp = router.route(req, conn).await;
    let (head, body) = resp.into_parts();
    let end = body.is_end_stream();
    shared.with(|c, _| c.send_head(id, head.status.as_u16(), &head.headers, end));
    if !end {
        pipe(body, &shared, id).await;
    }
}

/// Sends `body` on stream `id`: data as it comes, each stream queueing
/// at most [`infermesh_http2::Limits::stream_send_buffer`] beyond the
/// client's windows, then trailers. A response that fits is taken off the
/// worker whole (its permit freed when the worker answered, not when the
/// client has read it).
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

/// The read size after a read of `n` bytes into `room`: doubled (up to
/// [`MAX_READ_CHUNK`]) when the read filled the room, as the socket had
/// more; halved (down to [`READ_CHUNK`]) when it used less than an eighth;
/// else kept. hyper's adaptive read buffer does the same.
fn next_read_chunk(chunk: usize, n: usize, room: usize) -> usize {
    if n >= room {
        (chunk * 2).min(MAX_READ_CHUNK)
    } else if n < chunk / 8 {
        (chunk / 2).max(READ_CHUNK)
    } else {
        chunk
    }
}

#[cfg(test)]
mod read_chunk_tests {
    use super::*;

    #[test]
    fn reads_that_fill_the_buffer_grow_it_to_the_cap_and_small_ones_shrink_it() {
        let mut chunk = READ_CHUNK;
        for _ in 0..8 {
            chunk = next_read_chunk(chunk, chunk, chunk);
        }
        assert_eq!(chunk, MAX_READ_CHUNK);
        // A read that used some of the room keeps the size.
        assert_eq!(next_read_chunk(chunk, chunk / 2, chunk), chunk);
        // Small requests again: back down, never below the floor.
        for _ in 0..8 {
            chunk = next_read_chunk(chunk, 100, chunk);
        }
        assert_eq!(chunk, READ_CHUNK);
    }
}
