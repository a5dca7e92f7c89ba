//! The QUIC rung (`[transport] quic = "on"`, issue 13): `ModelInfer` on one
//! bidirectional QUIC stream per request, framed as
//! [`infermesh_proto::quic`] describes, over TLS 1.3 with the agent's
//! certificate (reloaded with it) and its client-certificate rules.
//!
//! Bounded like the OIP port: connections (`limits.max_connections`;
//! beyond it new ones are refused), streams per connection
//! (`limits.max_concurrent_streams`), request size (`max_message_bytes`),
//! idle connections (`limits.idle_timeout`), and the time to receive a
//! request (`limits.read_timeout`). Requests are served by the OIP front
//! ([`Front`]), so admission, queues, metrics and the load report are the
//! same as on gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use infermesh_proto::GrpcInferenceService;
use infermesh_proto::quic::{Answer, decode_request, encode_response};
use quinn::crypto::rustls::QuicServerConfig;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::front::Front;
use crate::pool::Pool;
use crate::server::Shutdown;
use crate::tls::ServerTls;
use crate::trailer::add_report;

/// Flow-control windows: a 16 MiB tensor in one stream's window, several
/// at once per connection.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

/// Limits of the QUIC endpoint.
#[derive(Debug, Clone, Copy)]
pub struct QuicLimits {
    /// Connections at once.
    pub max_connections: usize,
    /// Streams (requests) at once per connection.
    pub max_streams: u32,
    /// Largest request or response message.
    pub max_message_bytes: usize,
    /// A connection idle this long is closed.
    pub idle_timeout: Duration,
    /// Longest time to receive one request.
    pub read_timeout: Duration,
}

/// Binds the UDP endpoint at `addr` with `tls`'s QUIC configuration.
pub fn bind(
    addr: SocketAddr,
    tls: &ServerTls,
    limits: &QuicLimits,
) -> std::io::Result<quinn::Endpoint> {
    let crypto = QuicServerConfig::try_from(Arc::clone(&tls.quic))
        .map_err(|e| std::io::Error::other(format!("QUIC TLS configuration: {e}")))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(limits.max_streams.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(CONNECTION_WINDOW.into())
        .max_idle_timeout(limits.idle_timeout.try_into().ok());
    server.transport_config(Arc::new(transport));
    quinn::Endpoint::server(server, addr)
}

/// Serves `endpoint` until `shutdown.graceful` (no new connections or
/// streams; open streams finish) or `shutdown.hard`.
pub async fn serve(
    endpoint: quinn::Endpoint,
    front: Front,
    pool: Arc<Pool>,
    limits: QuicLimits,
    shutdown: Shutdown,
    tasks: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => return,
            },
            _ = shutdown.graceful.cancelled() => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::debug!(remote = %incoming.remote_address(), "QUIC connection limit reached: refused");
            incoming.refuse();
            continue;
        };
        let (front, pool, shutdown, spawner) = (
            front.clone(),
            Arc::clone(&pool),
            shutdown.clone(),
            tasks.clone(),
        );
        tasks.spawn(async move {
            let _permit = permit;
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC handshake failed");
                    return;
                }
            };
            connection(conn, front, pool, limits, shutdown, spawner).await;
        });
    }
    endpoint.set_server_config(None);
    tokio::select! {
        _ = endpoint.wait_idle() => {}
        _ = shutdown.hard.cancelled() => endpoint.close(0u32.into(), b"agent stopping"),
    }
}

async fn connection(
    conn: quinn::Connection,
    front: Front,
    pool: Arc<Pool>,
    limits: QuicLimits,
    shutdown: Shutdown,
    tasks: TaskTracker,
) {
    // This connection's streams, to let them finish before it closes.
    let streams = TaskTracker::new();
    loop {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC connection ended");
                    return;
                }
            },
            _ = shutdown.graceful.cancelled() => break,
        };
        let (front, pool, hard, mine) = (
            front.clone(),
            Arc::clone(&pool),
            shutdown.hard.clone(),
            streams.token(),
        );
        tasks.spawn(async move {
            tokio::select! {
                _ = stream(front, pool, limits, send, recv) => {}
                _ = hard.cancelled() => {}
            }
            drop(mine);
        });
    }
    // Stopping: no new streams; the open ones finish (or the hard stop
    // comes), then the connection closes.
    streams.close();
    tokio::select! {
        _ = streams.wait() => {}
        _ = shutdown.hard.cancelled() => {}
    }
    conn.close(0u32.into(), b"agent stopping");
}

async fn stream(
    front: Front,
    pool: Arc<Pool>,
    limits: QuicLimits,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let frame_limit = limits.max_message_bytes + 9;
    let read = tokio::time::timeout(limits.read_timeout, recv.read_to_end(frame_limit)).await;
    let answer = match read {
        Ok(Ok(bytes)) => match decode_request(bytes.into(), limits.max_message_bytes) {
            Ok((req, timeout_ms)) => {
                let mut request = tonic::Request::new(req);
                if timeout_ms > 0 {
                    request.set_timeout(Duration::from_millis(timeout_ms.into()));
                }
                match front.model_infer(request).await {
                    Ok(resp) => Answer::Ok(resp.into_inner()),
                    Err(s) => Answer::Status(s.code() as i32, s.message().to_string()),
                }
            }
            Err(e) => Answer::Status(tonic::Code::InvalidArgument as i32, e.to_string()),
        },
        Ok(Err(quinn::ReadToEndError::TooLong)) => Answer::Status(
            tonic::Code::ResourceExhausted as i32,
            format!(
                "request over max_message_bytes ({})",
                limits.max_message_bytes
            ),
        ),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "QUIC request not received");
            return;
        }
        Err(_) => Answer::Status(
            tonic::Code::DeadlineExceeded as i32,
            "the request did not arrive within read_timeout".into(),
        ),
    };
    let mut headers = HeaderMap::new();
    add_report(&pool, &mut headers);
    let report: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    if send
        .write_all(&encode_response(&answer, &report))
        .await
        .is_ok()
    {
        let _ = send.finish();
        // Wait until the peer has the bytes (or the stream is gone), so
        // that a closing connection does not cut the response short.
        let _ = send.stopped().await;
    }
}
