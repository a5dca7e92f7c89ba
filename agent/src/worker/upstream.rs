//! The HTTP/2 connections plain inference requests are forwarded on, made
//! on first use and made again when the worker has closed them. A worker
//! process gets a few (`[transport] worker_connections`, default 3): small
//! requests share the first, so that they leave in one `writev` and never
//! queue behind a large body; requests of [`LARGE_BODY`] or more go on
//! the others, each on the one with the fewest large requests open. A worker's
//! HTTP/2 server reads each connection on one task (hyper's and tonic's
//! do; grpc-core serialises a connection's transport too), so one
//! connection of large bodies keeps one of its threads busy decoding while
//! the others wait — nginx's `grpc_pass`, which opens a connection per
//! request, ran ahead of the agent and of a direct client for that reason
//! (BENCHMARKS.md, issue 27).
//!
//! The agent's own client (the upstream half of the frame-level relay in
//! docs/DECISIONS.md), not `h2`'s: a request's future encodes its HEADERS
//! (static table and literals only, see [`infermesh_http2::request`]) and DATA and writes them
//! itself, without waking another task; the connection's task only reads
//! and hands each stream's frames to the future waiting for them. The
//! protocol state is sans-IO: [`infermesh_http2::client`]. Under `h2` a request crossed the
//! connection task twice and paid for its stream store, locks and HPACK
//! table; see BENCHMARKS.md for what this saves.

use std::future::{Future, poll_fn};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use infermesh_http2::client::{Conn, Refusal};

use crate::alarm::Alarm;
pub use infermesh_http2::client::{Failure, ResponseHead};
pub use infermesh_http2::request::Metadata;

/// Time to open a connection to a local worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bytes read from the worker at a time.
const READ_BUFFER: usize = 64 << 10;
/// Times a request refused unprocessed is sent ([`Upstream::call`]).
const MAX_REFUSED: u32 = 4;
/// Buffers handed to one `writev`.
const MAX_SLICES: usize = 64;
/// A request whose body is this large (or still arriving) is large: it
/// goes on a connection of its own kind ([`Upstream::lane_for`]).
pub const LARGE_BODY: usize = 64 << 10;

/// Why a request could not be sent to the worker, or its answer not read.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The TCP connection could not be made.
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, #[source] std::io::Error),
    /// The stream or its connection failed.
    #[error(transparent)]
    Failed(#[from] Failure),
}

/// A (re)connecting HTTP/2 client to one worker process.
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    address: SocketAddr,
    authority: String,
    tasks: TaskTracker,
    /// The current connection of each lane: lane 0 carries small
    /// requests, lanes 1.. large ones ([`Upstream::lane_for`]).
    current: Mutex<Vec<Option<Arc<Shared>>>>,
    /// Large requests open on each lane (index 0 unused), whichever
    /// connection they are on.
    large_open: Box<[Arc<AtomicUsize>]>,
    /// Held while connecting, so concurrent requests make one connection.
    connecting: tokio::sync::Mutex<()>,
    /// Ends the connections' tasks when the worker's entry goes.
    closed: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// One connection: its state and socket, shared by its task and the
/// requests on it.
#[derive(Debug)]
struct Shared {
    conn: Mutex<Conn>,
    tcp: TcpStream,
    /// A write could not finish: the connection's task completes it.
    write_wanted: Notify,
    /// A stream ended: a request waiting for MAX_CONCURRENT_STREAMS retries.
    room: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Shared::flush`], or, inside [`corked`], once the batch is done.
    fn flush_soon(self: &Arc<Self>, conn: &mut Conn) {
        let held = CORK.with_borrow_mut(|cork| {
            if !cork.on {
                return false;
            }
            if !cork.held.iter().any(|s| Arc::ptr_eq(s, self)) {
                cork.held.push(Arc::clone(self));
            }
            true
        });
        if !held {
            self.flush(conn);
        }
    }

    /// Writes what `conn` has queued, as far as the socket takes it now;
    /// the rest is left to the connection's task.
    fn flush(&self, conn: &mut Conn) {
        while !conn.out().is_empty() {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = conn.out().slices(&mut slices);
            match self.tcp.try_write_vectored(&slices[..n]) {
                Ok(0) => {
                    conn.fail(
                        Failure::Connection("the socket closed".into()),
                        &mut Vec::new(),
                    );
                    return;
                }
                Ok(written) => conn.out().advance(written),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.write_wanted.notify_one();
                    return;
                }
                Err(e) => {
                    let mut wake = Vec::new();
                    conn.fail(Failure::Connection(e.to_string()), &mut wake);
                    wake.into_iter().for_each(Waker::wake);
                    return;
                }
            }
        }
    }
}

/// Worker connections written to inside [`corked`].
#[derive(Default)]
struct Cork {
    on: bool,
    held: Vec<Arc<Shared>>,
}

thread_local! {
    static CORK: std::cell::RefCell<Cork> = std::cell::RefCell::new(Cork::default());
}

/// Runs `f` (a client connection's driver polling its requests) with the
/// requests' writes to workers held back, then writes each worker
/// connection's queue once: the requests that arrived in one read leave in
/// one `writev` per worker instead of one each. At concurrency 16 the
/// agent made about one `writev` per request towards the worker, where
/// HAProxy batches (strace; BENCHMARKS.md). Per thread, so it holds
/// whichever runtime flavour polls the driver; nested calls join the
/// outer one.
pub fn corked<R>(f: impl FnOnce() -> R) -> R {
    struct Uncork;
    impl Drop for Uncork {
        fn drop(&mut self) {
            CORK.with_borrow_mut(|cork| {
                cork.on = false;
                for shared in cork.held.drain(..) {
                    shared.flush(&mut shared.lock());
                }
            });
        }
    }
    let outer = CORK.with_borrow_mut(|cork| !std::mem::replace(&mut cork.on, true));
    let _uncork = outer.then_some(Uncork);
    f()
}

impl Upstream {
    /// A client for the worker at `address` over at most `connections`
    /// connections (at least one; see the module docs); their tasks are
    /// spawned on `tasks`.
    pub fn new(address: SocketAddr, tasks: TaskTracker, connections: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                address,
                authority: address.to_string(),
                tasks,
                current: Mutex::new(vec![None; connections.max(1)]),
                large_open: (0..connections.max(1)).map(|_| Arc::default()).collect(),
                connecting: tokio::sync::Mutex::new(()),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// The worker's address.
    pub fn address(&self) -> SocketAddr {
        self.inner.address
    }

    /// Opens a `ModelInfer` stream with `meta` (the caller's metadata and
    /// deadline; pseudo-headers are added) and `body` as its only data, and
    /// writes them. Makes a new connection if the current one takes no
    /// streams.
    pub async fn send<'a>(
        &self,
        meta: impl Into<Metadata<'a>>,
        body: Bytes,
    ) -> Result<Exchange, UpstreamError> {
        self.send_chunks(meta, std::slice::from_ref(&body)).await
    }

    /// [`Upstream::send`] with a body made of `chunks` (the DATA frames a
    /// large request arrived in, sent on without a copy into one buffer).
    pub async fn send_chunks<'a>(
        &self,
        meta: impl Into<Metadata<'a>>,
        chunks: &[Bytes],
    ) -> Result<Exchange, UpstreamError> {
        self.open(meta.into(), chunks, false).await
    }

    /// Opens a stream with `meta` and the first `chunks` of a body still
    /// arriving (cut-through forwarding): [`Upload::push`] sends the rest as
    /// it comes, [`Upload::answer`] waits for the response head. A stream
    /// the worker refuses unprocessed is opened again with every chunk
    /// pushed so far (the caller keeps them: reference-counted, not
    /// copied), a few times at most, as [`Upstream::call`] does.
    pub async fn upload<'a>(
        &'a self,
        meta: impl Into<Metadata<'a>>,
        chunks: &[Bytes],
    ) -> Result<Upload<'a>, UpstreamError> {
        let meta = meta.into();
        let exchange = self.open(meta, chunks, true).await?;
        Ok(Upload {
            upstream: self,
            meta,
            exchange,
            tries: 1,
            ended: false,
        })
    }

    async fn open(
        &self,
        meta: Metadata<'_>,
        chunks: &[Bytes],
        body_open: bool,
    ) -> Result<Exchange, UpstreamError> {
        let mut fresh = false;
        let large = body_open || chunks.iter().map(Bytes::len).sum::<usize>() >= LARGE_BODY;
        loop {
            let (lane, place) = self.lane_for(large);
            let shared = match self.cached(lane) {
                Some(s) => s,
                None => {
                    fresh = true;
                    // Boxed: connecting is rare and its future large; every
                    // request's future would carry its size.
                    Box::pin(self.connect(lane)).await?
                }
            };
            let room = shared.room.notified();
            let opened = {
                let mut conn = shared.lock();
                let opened = match body_open {
                    true => conn.open_streaming(meta, chunks),
                    false => conn.open_chunks(meta, chunks),
                };
                if opened.is_ok() {
                    shared.flush_soon(&mut conn);
                }
                opened
            };
            match opened {
                Ok(id) => {
                    drop(room);
                    return Ok(Exchange {
                        shared,
                        id,
                        _place: place,
                    });
                }
                Err(Refusal::Full) => room.await,
                Err(Refusal::Closed) if !fresh => self.forget(lane, &shared),
                Err(Refusal::Closed) => {
                    return Err(
                        Failure::Connection("a new connection took no stream".into()).into(),
                    );
                }
            }
        }
    }

    /// Sends a request ([`Upstream::send`]) and waits for its response
    /// head. A stream the worker refused unprocessed (REFUSED_STREAM, or
    /// beyond a GOAWAY's last stream: e.g. sent before the worker's
    /// MAX_CONCURRENT_STREAMS arrived) is sent again, a few times at most.
    pub async fn call<'a>(
        &self,
        meta: impl Into<Metadata<'a>>,
        body: Bytes,
    ) -> Result<(Exchange, ResponseHead), UpstreamError> {
        self.call_chunks(meta, std::slice::from_ref(&body)).await
    }

    /// [`Upstream::call`] with a body made of `chunks`.
    pub async fn call_chunks<'a>(
        &self,
        meta: impl Into<Metadata<'a>>,
        chunks: &[Bytes],
    ) -> Result<(Exchange, ResponseHead), UpstreamError> {
        let meta = meta.into();
        let mut tries = 0;
        loop {
            tries += 1;
            let mut exchange = self.send_chunks(meta, chunks).await?;
            match exchange.head().await {
                Ok(head) => return Ok((exchange, head)),
                Err(UpstreamError::Failed(Failure::Refused)) if tries < MAX_REFUSED => {
                    tracing::debug!(address = %self.inner.address, "worker refused a stream; sending it again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fails every request in flight on the current connection at once
    /// with `why` (the sentinel gave up on the worker: it stopped
    /// answering); a later request makes a new connection.
    pub fn abort(&self, why: &str) {
        let current: Vec<_> = self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for shared in current {
            let mut wake = Vec::new();
            shared
                .lock()
                .fail(Failure::Connection(why.to_string()), &mut wake);
            shared.room.notify_waiters();
            wake.into_iter().for_each(Waker::wake);
        }
    }

    /// The lane a request goes on: small ones on lane 0, large ones on
    /// the other lane with the fewest large requests open (the first of
    /// equals), counted there until the [`Place`] drops — from now, so
    /// that a burst spreads while its first connections are still being
    /// made.
    fn lane_for(&self, large: bool) -> (usize, Option<Place>) {
        let lanes = &self.inner.large_open;
        if !large || lanes.len() == 1 {
            return (0, None);
        }
        // Under the lock: two requests never both take the emptiest lane.
        let _picking = self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let lane = (1..lanes.len())
            .min_by_key(|&l| lanes[l].load(Ordering::Relaxed))
            .unwrap_or(0);
        lanes[lane].fetch_add(1, Ordering::Relaxed);
        (lane, Some(Place(Arc::clone(&lanes[lane]))))
    }

    fn cached(&self, lane: usize) -> Option<Arc<Shared>> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[lane]
            .clone()
    }

    /// Drops `stale` as lane `lane`'s connection (if it still is).
    fn forget(&self, lane: usize, stale: &Arc<Shared>) {
        let mut current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current[lane]
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, stale))
        {
            current[lane] = None;
        }
    }

    /// Makes a new connection for `lane` unless another request has just
    /// made one.
    async fn connect(&self, lane: usize) -> Result<Arc<Shared>, UpstreamError> {
        let _made = self.inner.connecting.lock().await;
        if let Some(shared) = self.cached(lane) {
            return Ok(shared);
        }
        let address = self.inner.address;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            .map_err(|e| UpstreamError::Connect(address, e))?;
        let _ = tcp.set_nodelay(true);
        let shared = Arc::new(Shared {
            conn: Mutex::new(Conn::new(
                &self.inner.authority,
                infermesh_proto::MODEL_INFER_PATH,
            )),
            tcp,
            write_wanted: Notify::new(),
            room: Notify::new(),
        });
        shared.flush(&mut shared.lock());
        let task = Arc::clone(&shared);
        let closed = self.inner.closed.clone();
        self.inner.tasks.spawn(async move {
            if let Some(why) = drive(&task, &closed).await {
                tracing::debug!(%address, %why, "connection to worker ended");
            }
        });
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[lane] = Some(Arc::clone(&shared));
        Ok(shared)
    }
}

/// The connection's task: reads frames and hands them to their streams,
/// finishes writes the requests could not. Ends when the connection fails
/// or closes, or the worker's entry goes.
///
/// A poll function rather than a `select!` over fresh futures: that made
/// and dropped a readiness future, a notification and a cancellation
/// future on every read, about 2k instructions per request at
/// concurrency 1. The socket's readiness is polled directly; the
/// cancellation and the requests' call for a write ([`Shared::flush`])
/// are futures kept across passes and polled only when their [`Alarm`]
/// rang.
async fn drive(shared: &Shared, closed: &CancellationToken) -> Option<Failure> {
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    let mut wake = Vec::new();
    // A write is waiting for the socket. Reading goes on meanwhile: a
    // worker blocked writing to the agent may be what keeps it from
    // reading.
    let mut blocked = false;
    let mut alarm = Alarm::new();
    let mut cancelled = std::pin::pin!(closed.cancelled());
    let mut wanted = std::pin::pin!(shared.write_wanted.notified());
    let ended = poll_fn(|cx| {
        if alarm.take(cx) {
            let mut signals = alarm.context();
            if cancelled.as_mut().poll(&mut signals).is_ready() {
                return Poll::Ready(None);
            }
            if !blocked && wanted.as_mut().poll(&mut signals).is_ready() {
                blocked = true;
            }
        }
        loop {
            match shared.tcp.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Some(Failure::Connection(e.to_string())));
                }
                Poll::Pending => break,
            }
            if buf.capacity() - buf.len() < READ_BUFFER / 4 {
                buf.reserve(READ_BUFFER);
            }
            match read_some(&shared.tcp, &mut buf) {
                Ok(0) => {
                    let why = "the worker closed the connection";
                    return Poll::Ready(Some(Failure::Connection(why.into())));
                }
                Ok(_) => {
                    let mut conn = shared.lock();
                    conn.on_read(&mut buf, std::time::Instant::now(), &mut wake);
                    shared.flush(&mut conn);
                    let failed = conn.is_failed();
                    drop(conn);
                    wake.drain(..).for_each(Waker::wake);
                    if failed {
                        let why = "the worker broke the protocol";
                        return Poll::Ready(Some(Failure::Connection(why.into())));
                    }
                }
                // Readiness cleared: the next poll waits for new data.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Some(Failure::Connection(e.to_string()))),
            }
        }
        if blocked {
            match shared.tcp.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {
                    let mut conn = shared.lock();
                    shared.flush(&mut conn);
                    if conn.is_failed() {
                        let why = "writing to the worker failed";
                        return Poll::Ready(Some(Failure::Connection(why.into())));
                    }
                    drop(conn);
                    // Listen again. Still blocked: `flush` asked again (a
                    // stored permit), which the new future takes at once.
                    blocked = false;
                    wanted.set(shared.write_wanted.notified());
                    if wanted.as_mut().poll(&mut alarm.context()).is_ready() {
                        blocked = true;
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Some(Failure::Connection(e.to_string())));
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await?;
    let mut conn = shared.lock();
    conn.fail(ended.clone(), &mut wake);
    drop(conn);
    shared.room.notify_waiters();
    wake.into_iter().for_each(Waker::wake);
    Some(ended)
}

/// Reads what the socket holds into `buf`. A read that did not fill the
/// room given drained the socket, so its readiness is cleared as tokio's
/// own `poll_read` does: the next `readable()` waits for new data instead
/// of costing a `recvfrom` that answers EAGAIN once per response. (The
/// clear is tick-checked by tokio: data that arrived meanwhile has
/// raised a new event and is not lost.)
fn read_some(tcp: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut n = 0;
    let read = tcp.try_io(tokio::io::Interest::READABLE, || {
        n = tcp.try_read_buf(buf)?;
        if n > 0 && n < room {
            // Tells `try_io` to clear the readiness; the bytes are kept.
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && n > 0 => Ok(n),
        other => other,
    }
}

/// One request's stream: its answer is read from here. Dropping it before
/// the answer ended resets the stream.
#[derive(Debug)]
pub struct Exchange {
    shared: Arc<Shared>,
    id: u32,
    /// A large request's count on its lane.
    _place: Option<Place>,
}

/// A large request counted on its lane ([`Upstream::lane_for`]) while it
/// lives.
#[derive(Debug)]
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Exchange {
    /// The response's status and headers.
    pub async fn head(&mut self) -> Result<ResponseHead, UpstreamError> {
        poll_fn(|cx| self.poll(cx, |conn, id, waker| conn.poll_head(id, waker)))
            .await
            .map_err(UpstreamError::from)
    }

    /// Appends `chunk` to a body still arriving ([`Upstream::upload`]).
    fn push_body(&mut self, chunk: Bytes, last: bool) -> Result<(), Failure> {
        let mut conn = self.shared.lock();
        let pushed = conn.push_body(self.id, chunk, last);
        if !conn.out().is_empty() {
            self.shared.flush_soon(&mut conn);
        }
        pushed
    }

    /// The next response bytes; `None` at the end of the data.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, Failure>> {
        self.poll(cx, |conn, id, waker| conn.poll_data(id, waker))
    }

    /// The trailers, once [`Exchange::poll_data`] has returned `None`.
    pub fn trailers(&mut self) -> Option<HeaderMap> {
        self.shared.lock().take_trailers(self.id)
    }

    fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        step: impl FnOnce(&mut Conn, u32, &Waker) -> Option<Result<T, Failure>>,
    ) -> Poll<Result<T, Failure>> {
        let mut conn = self.shared.lock();
        let polled = step(&mut conn, self.id, cx.waker());
        // Taking data may owe the worker a window update.
        if !conn.out().is_empty() {
            self.shared.flush_soon(&mut conn);
        }
        match polled {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let mut conn = self.shared.lock();
        conn.close(self.id);
        if !conn.out().is_empty() {
            self.shared.flush_soon(&mut conn);
        }
        drop(conn);
        self.shared.room.notify_waiters();
    }
}

mod upload;
pub use upload::Upload;

#[cfg(test)]
mod tests;
