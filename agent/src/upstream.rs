//! The HTTP/2 connection plain inference requests are forwarded on.
//!
//! One per worker process, on the `h2` crate directly rather than tonic's
//! `Channel` or hyper's client: both put the request through an extra task
//! (a tower buffer, or hyper's dispatch task plus a spawned response task)
//! before it reaches the socket. Here the request's own task opens the
//! stream and awaits the response; only the connection's I/O runs in a task
//! of its own. The connection is made on first use and made again (once per
//! request) when the worker has closed it. See docs/DECISIONS.md.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;

/// Time to open a connection to a local worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 receive windows towards the worker (the same as the front's).
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// Why a request could not be sent to the worker.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The TCP connection could not be made.
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, #[source] std::io::Error),
    /// The HTTP/2 connection failed (handshake, reset, closed by the worker).
    #[error("HTTP/2 to the worker: {0}")]
    H2(#[from] h2::Error),
}

/// A (re)connecting HTTP/2 client to one worker process.
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    address: SocketAddr,
    /// `ModelInfer`'s URI on this worker.
    infer_uri: http::Uri,
    tasks: TaskTracker,
    /// The current connection, with its generation.
    current: Mutex<Option<(u64, SendRequest<Bytes>)>>,
    /// Held while connecting, so concurrent requests make one connection.
    connecting: tokio::sync::Mutex<u64>,
}

impl Upstream {
    /// A client for the worker at `address`; its connection tasks are
    /// spawned on `tasks`.
    pub fn new(address: SocketAddr, tasks: TaskTracker) -> Self {
        Self {
            inner: Arc::new(Inner {
                address,
                infer_uri: format!("http://{address}{}", crate::grpc::MODEL_INFER_PATH)
                    .parse()
                    .expect("an address and a path make a URI"),
                tasks,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(0),
            }),
        }
    }

    /// The worker's address.
    pub fn address(&self) -> SocketAddr {
        self.inner.address
    }

    /// `ModelInfer`'s URI on this worker.
    pub fn infer_uri(&self) -> &http::Uri {
        &self.inner.infer_uri
    }

    /// Opens a stream with `head` and sends `body` as its only data; returns
    /// the response future. Reconnects once if the cached connection is gone.
    pub async fn send(
        &self,
        head: http::Request<()>,
        body: Bytes,
    ) -> Result<ResponseFuture, UpstreamError> {
        let (generation, sender) = match self.cached() {
            Some(c) => c,
            // Boxed (here and below): connecting is rare and its future
            // large; every request's future would carry its size.
            None => Box::pin(self.connect(None)).await?,
        };
        let mut sender = match sender.ready().await {
            Ok(s) => s,
            Err(_) => {
                let (_, s) = Box::pin(self.connect(Some(generation))).await?;
                s.ready().await?
            }
        };
        let end = body.is_empty();
        let (response, mut stream) = sender.send_request(head, end)?;
        if !end {
            // Bounded by the front's message limit; h2 sends it as the
            // worker's window allows.
            stream.send_data(body, true)?;
        }
        Ok(response)
    }

    fn cached(&self) -> Option<(u64, SendRequest<Bytes>)> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes a new connection unless one newer than `stale` exists already.
    async fn connect(
        &self,
        stale: Option<u64>,
    ) -> Result<(u64, SendRequest<Bytes>), UpstreamError> {
        let mut made = self.inner.connecting.lock().await;
        if let Some((generation, sender)) = self.cached() {
            if Some(generation) != stale {
                return Ok((generation, sender));
            }
        }
        let address = self.inner.address;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
            .map_err(|e| UpstreamError::Connect(address, e))?;
        let _ = tcp.set_nodelay(true);
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(tcp)
            .await?;
        self.inner.tasks.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%address, error = %e, "connection to worker ended");
            }
        });
        *made += 1;
        let entry = (*made, sender);
        *self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(entry.clone());
        Ok(entry)
    }
}
