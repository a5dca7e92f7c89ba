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

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// What a request knows about its connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique per accepted connection in this agent (never 0).
    pub id: u64,
    /// The peer.
    pub remote: Option<SocketAddr>,
    /// The client is not reading its responses: more bytes wait for its
    /// HTTP/2 windows than the connection's send buffer (set by the
    /// connection's driver, read by requests before they take a worker).
    pub backlogged: Arc<AtomicBool>,
}

impl ConnInfo {
    /// A connection's info, not backlogged.
    pub fn new(id: u64, remote: Option<SocketAddr>) -> Self {
        Self {
            id,
            remote,
            backlogged: Arc::default(),
        }
    }

    /// Whether the client has more response bytes waiting than it may.
    pub fn is_backlogged(&self) -> bool {
        self.backlogged.load(Ordering::Relaxed)
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
}
