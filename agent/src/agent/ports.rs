//! Step 1 of the assembly: the certificate and every listening socket,
//! bound before anything runs, so that a taken port fails the start with
//! nothing to undo.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::RunError;
use crate::config::AgentConfig;
use crate::serving::quic::{self, QuicLimits};
use crate::tls::ServerTls;

/// The agent's TLS (`[tls]`), loaded; `None` without it.
pub(super) fn load_tls(cfg: &AgentConfig) -> Result<Option<Arc<ServerTls>>, RunError> {
    Ok(cfg
        .tls
        .as_ref()
        .map(ServerTls::load)
        .transpose()
        .map_err(RunError::Tls)?
        .map(Arc::new))
}

/// The bound listeners and the addresses they got.
pub(super) struct Ports {
    /// The client ports.
    pub client: ClientPorts,
    /// The operators' ports.
    pub admin: AdminPorts,
    /// Where the OIP port listens.
    pub listen: SocketAddr,
    /// Where the admin port listens.
    pub admin_listen: SocketAddr,
    /// Where KServe HTTP listens.
    pub http_listen: Option<SocketAddr>,
    /// Where the QUIC rung listens.
    pub quic_listen: Option<SocketAddr>,
}

/// The ports clients call.
pub(super) struct ClientPorts {
    /// The OIP gRPC port.
    pub oip: TcpListener,
    /// KServe HTTP, when configured.
    pub http: Option<TcpListener>,
    /// The QUIC rung's UDP endpoint, when on (TLS only).
    pub quic: Option<quinn::Endpoint>,
    /// The QUIC rung's limits (from `[limits]`).
    pub quic_limits: QuicLimits,
}

/// The ports operators and probes call.
pub(super) struct AdminPorts {
    /// The admin port.
    pub admin: TcpListener,
    /// Plaintext probes beside a TLS admin port, when configured.
    pub probe: Option<TcpListener>,
}

impl Ports {
    /// Binds every configured listener; the error names the one that failed.
    pub(super) async fn bind(cfg: &AgentConfig, tls: Option<&ServerTls>) -> Result<Self, RunError> {
        let bind = |addr, what| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Bind { addr, what, source })
        };
        let oip = bind(cfg.listen, "OIP gRPC").await?;
        let admin = bind(cfg.admin_listen, "admin").await?;
        let http = match cfg.http_listen {
            Some(a) => Some(bind(a, "KServe HTTP").await?),
            None => None,
        };
        let probe = match cfg.tls.as_ref().and_then(|t| t.probe_listen) {
            Some(a) => Some(bind(a, "probes").await?),
            None => None,
        };
        let quic_limits = QuicLimits {
            max_connections: cfg.limits.max_connections,
            max_streams: cfg.limits.max_concurrent_streams,
            max_message_bytes: cfg.max_message_bytes,
            idle_timeout: cfg.limits.idle_timeout,
            read_timeout: cfg.limits.read_timeout,
        };
        let quic = match (&cfg.quic, tls) {
            (Some(at), Some(t)) => {
                let addr = at.unwrap_or_else(|| oip.local_addr().unwrap_or(cfg.listen));
                Some(
                    quic::bind(addr, t, &quic_limits).map_err(|source| RunError::Bind {
                        addr,
                        what: "QUIC (UDP)",
                        source,
                    })?,
                )
            }
            _ => None,
        };
        Ok(Self {
            listen: oip.local_addr().unwrap_or(cfg.listen),
            admin_listen: admin.local_addr().unwrap_or(cfg.admin_listen),
            http_listen: http.as_ref().and_then(|l| l.local_addr().ok()),
            quic_listen: quic.as_ref().and_then(|e| e.local_addr().ok()),
            client: ClientPorts {
                oip,
                http,
                quic,
                quic_limits,
            },
            admin: AdminPorts { admin, probe },
        })
    }
}
