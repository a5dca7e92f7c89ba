//! Client connections of the OIP port, each with an id.
//!
//! Shared-memory regions and RDMA queue pairs a client registers belong to
//! its connection (see [`crate::transports::shm`]): a client can only use and unregister
//! its own, and when the connection closes they are forgotten. The server
//! ([`crate::serving::server`]) numbers each accepted connection and hands
//! its [`ConnInfo`] to every request: to the pass-through as an argument,
//! to the tonic services in the request's extensions ([`owner`]).
//!
//! [`FirstByteDeadline`] closes a connection that sends nothing within the
//! handshake timeout after being accepted (a connection that never starts
//! HTTP/2 would otherwise hold a file descriptor forever).
//!
//! [`Backlog`] says whether a connection's client is behind on reading its
//! responses (set by the connection's driver) and wakes the requests that
//! wait for it to catch up (`serving::forward`: backpressure, not refusal,
//! for a client that reads; docs/DECISIONS.md, "A client behind on reading
//! waits").

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// What a request knows about its connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique per accepted connection in this agent (never 0).
    pub id: u64,
    /// The peer.
    pub remote: Option<SocketAddr>,
    /// Whether the client is behind on reading its responses (set by the
    /// connection's driver, awaited by requests before they take a worker).
    pub backlog: Arc<Backlog>,
}

impl ConnInfo {
    /// A connection's info, not backlogged.
    pub fn new(id: u64, remote: Option<SocketAddr>) -> Self {
        Self {
            id,
            remote,
            backlog: Arc::default(),
        }
    }

    /// Whether the client has more response bytes waiting than it may.
    pub fn is_backlogged(&self) -> bool {
        self.backlog.is_set()
    }
}

/// A client behind on reading its responses: more bytes wait for its
/// HTTP/2 windows than its connection's send buffer. A flag for the
/// requests' checks, and a wake-up for those waiting for it to clear.
#[derive(Debug, Default)]
pub struct Backlog {
    set: AtomicBool,
    cleared: Notify,
}

impl Backlog {
    /// Records whether the client is behind; clearing it wakes every
    /// request waiting in [`Backlog::cleared_by`].
    pub fn set(&self, backlogged: bool) {
        self.set.store(backlogged, Ordering::Relaxed);
        if !backlogged {
            self.cleared.notify_waiters();
        }
    }

    /// Whether the client is behind.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Relaxed)
    }

    /// Waits until the backlog is clear (true), or until `until` while it
    /// is not (false).
    pub async fn cleared_by(&self, until: Instant) -> bool {
        let cleared = crate::condition::until(&self.cleared, || !self.is_set());
        tokio::time::timeout_at(until, cleared).await.is_ok() || !self.is_set()
    }
}

/// Called with a connection's id when it closes.
pub type OnClose = Arc<dyn Fn(u64) + Send + Sync>;

/// The connection id of a request (0 when it came another way, e.g. tests
/// serving the front directly).
pub fn owner<T>(req: &tonic::Request<T>) -> u64 {
    req.extensions().get::<ConnInfo>().map_or(0, |c| c.id)
}

pin_project_lite::pin_project! {
    /// An I/O stream that fails reads with `TimedOut` unless its first byte
    /// arrives within a deadline.
    pub struct FirstByteDeadline<T> {
        #[pin]
        io: T,
        deadline: Option<Pin<Box<Sleep>>>,
    }
}

impl<T> FirstByteDeadline<T> {
    /// Wraps `io`; its first byte must arrive within `within`.
    pub fn new(io: T, within: Duration) -> Self {
        Self {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<T: AsyncRead> AsyncRead for FirstByteDeadline<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        match (&polled, this.deadline.as_mut()) {
            (_, None) => {}
            (Poll::Ready(Ok(())), Some(_)) if buf.filled().len() > before => *this.deadline = None,
            (Poll::Ready(_), Some(_)) => {}
            (Poll::Pending, Some(deadline)) => {
                if deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no bytes from the client within the handshake timeout",
                    )));
                }
            }
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for FirstByteDeadline<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn silent_peers_time_out_and_talking_ones_do_not() {
        let (a, _b) = tokio::io::duplex(64);
        let mut silent = FirstByteDeadline::new(a, Duration::from_secs(10));
        let mut buf = [0u8; 8];
        let err = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let (a, mut b) = tokio::io::duplex(64);
        let mut talking = FirstByteDeadline::new(a, Duration::from_secs(10));
        b.write_all(b"hi").await.unwrap();
        assert_eq!(talking.read(&mut buf).await.unwrap(), 2);
        // Later silence is the idle timeout's business, not this one's.
        let read = tokio::time::timeout(Duration::from_secs(60), talking.read(&mut buf)).await;
        assert!(read.is_err(), "still waiting, no error");
    }

    /// The wake-up of requests waiting for a client to read: clearing the
    /// backlog ends their wait with no timer involved (the paused clock
    /// does not move); a backlog that stays ends it at its bound, with the
    /// client still behind.
    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_the_backlog_clears_or_at_its_bound() {
        let backlog = Arc::new(Backlog::default());
        let start = Instant::now();
        assert!(backlog.cleared_by(start).await, "not backlogged: no wait");

        backlog.set(true);
        let waiting = tokio::spawn({
            let backlog = Arc::clone(&backlog);
            async move { backlog.cleared_by(start + Duration::from_secs(30)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits while backlogged");
        backlog.set(true);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "still backlogged: waits on");
        backlog.set(false);
        assert!(waiting.await.unwrap(), "cleared");
        assert_eq!(start.elapsed(), Duration::ZERO, "woken, not timed out");

        backlog.set(true);
        let bound = start + Duration::from_secs(30);
        assert!(!backlog.cleared_by(bound).await, "still backlogged");
        assert_eq!(Instant::now(), bound, "given up at the bound");
    }
}
