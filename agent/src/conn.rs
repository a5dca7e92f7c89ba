//! Client connections of the OIP front, each with an id.
//!
//! Shared-memory regions a client registers belong to its connection (see
//! [`crate::shm`]): a client can only use and unregister its own, and when
//! the connection closes its regions are forgotten. This wraps each accepted
//! TCP stream so the id travels with every request (`ConnInfo` in the
//! request's extensions) and the close is noticed (drop of the stream).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Connected;

/// What a request knows about its connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique per accepted connection in this agent (never 0).
    pub id: u64,
    /// The peer.
    pub remote: Option<SocketAddr>,
}

/// Called with a connection's id when it closes.
pub type OnClose = Arc<dyn Fn(u64) + Send + Sync>;

/// An accepted connection.
pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    on_close: OnClose,
}

impl Drop for Conn {
    fn drop(&mut self) {
        (self.on_close)(self.info.id);
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The accepted connections of `listener` (TCP_NODELAY set), numbered.
pub fn incoming(
    listener: TcpListener,
    on_close: OnClose,
) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
    let next = Arc::new(AtomicU64::new(1));
    TcpListenerStream::new(listener).map(move |accepted| {
        let io = accepted?;
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let info = ConnInfo {
            id: next.fetch_add(1, Ordering::Relaxed),
            remote: io.peer_addr().ok(),
        };
        Ok(Conn {
            io,
            info,
            on_close: Arc::clone(&on_close),
        })
    })
}

/// The connection id of a request (0 when it came another way, e.g. tests
/// serving the front directly).
pub fn owner<T>(req: &tonic::Request<T>) -> u64 {
    req.extensions().get::<ConnInfo>().map_or(0, |c| c.id)
}
