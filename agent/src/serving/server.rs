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
//!   [`crate::serving::forward::BodyLimits`]; other unary calls by a 4 MiB message
//!   limit and the read timeout; stream messages by `max_message_bytes`.
//!
//! Routing: `ModelInfer` goes to the pass-through path
//! ([`crate::serving::forward`]); everything else to the tonic services (the OIP
//! [`crate::serving::front::Front`], the RDMA queue-pair exchange), whose responses get
//! the load report in their trailers too.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response};
use infermesh_http2::Limits;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;
use tonic::service::Routes;
use tower::ServiceExt;

use crate::dispatch::pool::Pool;
use crate::serving::accept::{Admitted, BoundedListener};
use crate::serving::forward::InferPath;
use crate::serving::front_body::FrontBody;
use crate::serving::grpc::{MODEL_INFER_PATH, status_response};
use crate::serving::load_report::add_report;
use crate::transports::conn::{ConnInfo, FirstByteDeadline, OnClose};

mod connection;

pub use connection::RequestBody;
use connection::serve_connection;

/// The path of `ModelStreamInfer`.
pub const MODEL_STREAM_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// Limits of the OIP port.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Each connection's HTTP/2 limits: streams, windows, header lists,
    /// and every bound against a hostile client.
    pub http2: Limits,
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
/// are done (or `shutdown.hard` fires). Connection tasks are spawned on
/// `tasks`; a connection runs its requests inside its own task, and those
/// past the first 32 at once on tasks of their own that it waits for
/// (`connection::INLINE_REQUESTS`). With `tls`, every connection is TLS (ALPN `h2`): the
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
    let mut listener = BoundedListener::new(listener, limits.max_connections, "OIP gRPC");
    let ids = AtomicU64::new(1);
    while let Some(Admitted {
        tcp,
        remote,
        permit,
    }) = listener.accept(&shutdown.graceful).await
    {
        let info = ConnInfo::new(ids.fetch_add(1, Ordering::Relaxed), Some(remote));
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

/// What a connection's requests are answered by: the OIP port's routes
/// ([`Oip`]), or a stand-in in tests.
pub trait Router: Send + Sync + 'static {
    /// Answers one request of connection `conn`.
    fn route(
        &self,
        req: Request<RequestBody>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<FrontBody>> + Send;
}

impl Router for Oip {
    fn route(
        &self,
        req: Request<RequestBody>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<FrontBody>> + Send {
        Oip::route(self, req, conn)
    }
}

impl Oip {
    /// Answers one request of connection `conn`. The pass-through takes
    /// `conn` as it is; the tonic services find it in the request's
    /// extensions (a map allocated per request, about 800 instructions, so
    /// only for them).
    pub async fn route(
        &self,
        mut req: Request<RequestBody>,
        conn: ConnInfo,
    ) -> Response<FrontBody> {
        if req.uri().path() == MODEL_INFER_PATH {
            return self.infer.call(req, Some(&conn)).await;
        }
        req.extensions_mut().insert(conn);
        match req.uri().path() {
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
mod tests;
