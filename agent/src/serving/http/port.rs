//! The KServe HTTP port's connections, bounded as the OIP port's are
//! (issue 24): at most `[limits] max_connections` at once through the
//! shared accept loop ([`BoundedListener`]), the first byte (and the TLS
//! handshake) within `handshake_timeout`, and a connection with no request
//! for `idle_timeout` closed gracefully — an HTTP/1.1 keep-alive
//! connection is closed, an HTTP/2 one gets GOAWAY; a request in flight
//! finishes first. The same values as the OIP port, from `[limits]`.
//!
//! hyper serves each connection (HTTP/1.1 and HTTP/2, as `axum::serve`
//! did); the timers are this module's, as `axum::serve` has none.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::serving::accept::{Admitted, BoundedListener};
use crate::transports::conn::FirstByteDeadline;

/// Timeouts of the port (`[limits]`, as on the OIP port).
#[derive(Debug, Clone, Copy)]
pub struct PortLimits {
    /// A new connection must send its first byte (and finish its TLS
    /// handshake) within this.
    pub handshake_timeout: Duration,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` fires and its connections are
/// done; connection tasks are spawned on `tasks`. With `tls`, every
/// connection is TLS, its handshake in the connection's task.
pub async fn serve(
    mut listener: BoundedListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: PortLimits,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    while let Some(admitted) = listener.accept(&stop).await {
        tasks.spawn(connection(
            admitted,
            tls.clone(),
            app.clone(),
            limits,
            stop.clone(),
        ));
    }
}

async fn connection(
    admitted: Admitted,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: PortLimits,
    stop: CancellationToken,
) {
    let Admitted { tcp, permit, .. } = admitted;
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let io = FirstByteDeadline::new(tcp, limits.handshake_timeout);
    match tls {
        None => serve_connection(io, app, limits.idle_timeout, stop).await,
        Some(acceptor) => {
            if let Some(tls) = crate::tls::accept(&acceptor, io, limits.handshake_timeout).await {
                serve_connection(tls, app, limits.idle_timeout, stop).await;
            }
        }
    }
    drop(permit);
}

/// Serves HTTP/1.1 or HTTP/2 on `io` until the client leaves, the
/// connection idles out, or `stop` fires (then it closes once the requests
/// in flight are answered).
async fn serve_connection<T>(io: T, app: Router, idle_timeout: Duration, stop: CancellationToken)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Mutex::new(Activity {
        in_flight: 0,
        last: Instant::now(),
    }));
    let service = TowerToHyperService::new(Tracked {
        app,
        activity: Arc::clone(&activity),
    });
    let builder = Builder::new(TokioExecutor::new());
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    let mut idle = pin!(tokio::time::sleep(idle_timeout));
    let mut closing = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "KServe HTTP connection ended with an error");
                }
                return;
            }
            _ = stop.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = idle.as_mut(), if !closing => {
                let now = Instant::now();
                let a = *activity.lock().unwrap_or_else(|e| e.into_inner());
                let idle_at = a.last + idle_timeout;
                if a.in_flight == 0 && idle_at <= now {
                    tracing::debug!(idle = ?idle_timeout, "closing an idle KServe HTTP connection");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                } else if a.in_flight > 0 {
                    // Look again a whole timeout from now: the request's
                    // end moves `last` at least that far.
                    idle.as_mut().reset(now + idle_timeout);
                } else {
                    idle.as_mut().reset(idle_at);
                }
            }
        }
    }
}

/// Requests in flight on a connection, and when one last started or ended.
#[derive(Debug, Clone, Copy)]
struct Activity {
    in_flight: u32,
    last: Instant,
}

/// The router, counting the connection's requests in flight.
#[derive(Clone)]
struct Tracked {
    app: Router,
    activity: Arc<Mutex<Activity>>,
}

/// A request counted in flight until dropped.
struct InFlight(Arc<Mutex<Activity>>);

impl InFlight {
    fn start(activity: &Arc<Mutex<Activity>>) -> Self {
        let mut a = activity.lock().unwrap_or_else(|e| e.into_inner());
        a.in_flight += 1;
        a.last = Instant::now();
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        a.in_flight -= 1;
        a.last = Instant::now();
    }
}

impl<B> tower::Service<http::Request<B>> for Tracked
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = InFlight::start(&self.activity);
        let app = self.app.clone();
        Box::pin(async move {
            let _in_flight = guard;
            app.oneshot(req.map(axum::body::Body::new)).await
        })
    }
}

#[cfg(test)]
mod tests;
