//! The OIP port: accepting connections, serving HTTP/2 on them, routing
//! each request.
//!
//! The agent runs its own accept loop on hyper rather than tonic's server so
//! that every resource a client can take is bounded and every task is
//! tracked:
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

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use infermesh_backoff::{Backoff, BackoffPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
/// spawned on `tasks`.
pub async fn serve(
    listener: TcpListener,
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
            info,
            oip.clone(),
            limits,
            shutdown.clone(),
            tasks.clone(),
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

/// Spawns hyper's per-stream tasks on the tracker.
#[derive(Clone)]
struct TrackedExec(TaskTracker);

impl<F> hyper::rt::Executor<F> for TrackedExec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        self.0.spawn(fut);
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    info: ConnInfo,
    oip: Oip,
    limits: ServerLimits,
    shutdown: Shutdown,
    tasks: TaskTracker,
    _permit: OwnedSemaphorePermit,
    on_close: OnClose,
) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let id = info.id;
    let opened = Instant::now();
    let last_request = Arc::new(AtomicU64::new(0));
    let service = {
        let (last_request, hard) = (Arc::clone(&last_request), shutdown.hard.clone());
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            last_request.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
            req.extensions_mut().insert(info.clone());
            let (oip, hard) = (oip.clone(), hard.clone());
            async move {
                let resp = tokio::select! {
                    r = oip.route(req) => r,
                    _ = hard.cancelled() => status_response(
                        Status::unavailable("the agent is stopping"),
                        &oip.pool,
                    ),
                };
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TrackedExec(tasks));
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(limits.stream_window)
        .initial_connection_window_size(limits.connection_window)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_size)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout)
        .auto_date_header(false);
    let io = TokioIo::new(FirstByteDeadline::new(tcp, limits.handshake_timeout));
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let idle_at =
            Duration::from_millis(last_request.load(Ordering::Relaxed)) + limits.idle_timeout;
        tokio::select! {
            result = &mut conn => {
                if let Err(e) = result {
                    tracing::debug!(conn = id, error = %e, "connection ended");
                }
                break;
            }
            _ = shutdown.graceful.cancelled(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = shutdown.hard.cancelled() => break,
            _ = tokio::time::sleep_until((opened + idle_at).into()), if !closing => {
                // A request may have started while we slept.
                let last = Duration::from_millis(last_request.load(Ordering::Relaxed));
                if opened.elapsed() >= last + limits.idle_timeout {
                    tracing::debug!(conn = id, idle = ?limits.idle_timeout, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
    on_close(id);
}

impl Oip {
    /// Answers one request.
    pub async fn route(&self, req: Request<Incoming>) -> Response<FrontBody> {
        match req.uri().path() {
            MODEL_INFER_PATH => self.infer.call(req).await,
            MODEL_STREAM_INFER_PATH => self.tonic(self.streams.clone(), req).await,
            _ => {
                let call = self.tonic(self.calls.clone(), req);
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

    async fn tonic(&self, routes: Routes, req: Request<Incoming>) -> Response<FrontBody> {
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
