//! TLS on the agent's ports (`[tls]`, issue 13): one certificate for the
//! OIP port, the admin port and KServe HTTP, re-read when its files change,
//! and optionally required client certificates (mTLS) with an allow-list of
//! client names on the data plane.
//!
//! - **Reload**: every `reload_interval` the certificate and key files are
//!   read again; when their bytes changed and the new pair is valid, it
//!   replaces the old one for *new* handshakes (a [`ResolvesServerCert`]
//!   over an [`ArcSwap`]). Connections already open keep going. A new pair
//!   that does not load (a half-written Secret, a key of another
//!   certificate) is logged and the old one stays.
//! - **Client certificates** (`client_ca`): every port requires one signed
//!   by that CA, a file re-read like the certificate (a new CA that loads
//!   replaces the old one for new handshakes). The OIP port and KServe HTTP (the data plane) further
//!   require one of `allow_clients` among its DNS names when that list is
//!   set; the admin port does not (operators' tools use their own
//!   certificates; mutating calls need the admin token anyway). Both checks
//!   are the one verifier of `infermesh-tls` ([`Verifier`] over a
//!   reloadable [`Ca`]), the same the client library checks agents with.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use infermesh_tls::{ALPN_H2, ALPN_HTTP1, Ca, Verifier, certified_key, provider, read_pem};
use rustls::ServerConfig;
use rustls::pki_types::ServerName;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Most names in `allow_clients`.
pub const MAX_ALLOWED_CLIENTS: usize = 256;

/// Checked `[tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// CA of client certificates; set: clients must present one (mTLS).
    pub client_ca: Option<PathBuf>,
    /// DNS names of clients allowed on the data plane; empty: any client
    /// the CA signed.
    pub allow_clients: Vec<String>,
    /// How often the certificate files are read again.
    pub reload_interval: Duration,
    /// Plaintext `/livez` + `/readyz` only (Kubernetes probes under mTLS).
    pub probe_listen: Option<std::net::SocketAddr>,
}

/// Default `[tls] reload_interval`.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The agent's TLS: acceptors per port over one reloading certificate.
pub struct ServerTls {
    certs: Arc<Reloading>,
    /// The client CA (mTLS), re-read like the certificate.
    client_ca: Option<Arc<Ca>>,
    /// The OIP port (ALPN `h2`; allow-list applies).
    pub oip: TlsAcceptor,
    /// KServe HTTP (`h2`, `http/1.1`; allow-list applies).
    pub http: TlsAcceptor,
    /// The admin port (`h2`, `http/1.1`; any client certificate the CA signed).
    pub admin: TlsAcceptor,
    /// The QUIC rung (TLS 1.3 only, ALPN [`infermesh_proto::quic::ALPN`];
    /// allow-list applies).
    pub quic: Arc<ServerConfig>,
}

impl ServerTls {
    /// Loads the files; the error says which is wrong and why.
    pub fn load(settings: &TlsSettings) -> Result<Self, String> {
        let certs = Arc::new(Reloading::load(settings)?);
        let client_ca = match &settings.client_ca {
            None => None,
            Some(ca) => Some(Arc::new(Ca::load(ca, "tls.client_ca")?)),
        };
        let (data, admin) = match &client_ca {
            None => (None, None),
            Some(ca) => {
                // The one verifier (infermesh-tls): signed through the client
                // CA and, on the data plane, named in `allow_clients`.
                let verifier = |allow: Vec<ServerName<'static>>| -> Arc<dyn ClientCertVerifier> {
                    Arc::new(Verifier::new(Arc::clone(ca), allow))
                };
                let allow = settings
                    .allow_clients
                    .iter()
                    .map(|n| ServerName::try_from(n.clone()).expect("checked in config"))
                    .collect();
                (Some(verifier(allow)), Some(verifier(Vec::new())))
            }
        };
        let server_config =
            |verifier: Option<Arc<dyn ClientCertVerifier>>,
             alpn: &[&[u8]],
             versions: &[&'static rustls::SupportedProtocolVersion]| {
                let builder = ServerConfig::builder_with_provider(provider())
                    .with_protocol_versions(versions)
                    .expect("ring supports TLS 1.2 and 1.3");
                let builder = match verifier {
                    Some(v) => builder.with_client_cert_verifier(v),
                    None => builder.with_no_client_auth(),
                };
                let mut config = builder.with_cert_resolver(Arc::clone(&certs) as _);
                config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
                Arc::new(config)
            };
        let all = rustls::DEFAULT_VERSIONS;
        let config =
            |verifier, alpn: &[&[u8]]| TlsAcceptor::from(server_config(verifier, alpn, all));
        Ok(Self {
            oip: config(data.clone(), &[ALPN_H2]),
            http: config(data.clone(), &[ALPN_H2, ALPN_HTTP1]),
            admin: config(admin, &[ALPN_H2, ALPN_HTTP1]),
            quic: server_config(
                data,
                &[infermesh_proto::quic::ALPN],
                &[&rustls::version::TLS13],
            ),
            certs,
            client_ca,
        })
    }

    /// Re-reads the certificate files every `interval` until `stop`.
    pub async fn watch(&self, interval: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.cancelled() => return,
            }
            if let Some(ca) = &self.client_ca {
                let ca = Arc::clone(ca);
                let path = ca.path().map(|p| p.to_path_buf()).unwrap_or_default();
                match tokio::task::spawn_blocking(move || ca.reload()).await {
                    Ok(Ok(true)) => tracing::info!(
                        client_ca = %path.display(),
                        "TLS client CA reloaded: new connections are verified against it"
                    ),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(
                        error = %e,
                        "TLS client CA file changed but does not load; keeping the current CA"
                    ),
                    Err(e) => tracing::warn!(error = %e, "TLS client CA reload task failed"),
                }
            }
            let certs = Arc::clone(&self.certs);
            match tokio::task::spawn_blocking(move || certs.reload()).await {
                Ok(Ok(true)) => tracing::info!(
                    cert = %self.certs.cert.display(),
                    "TLS certificate reloaded: new connections use the new one"
                ),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(
                    error = %e,
                    "TLS certificate files changed but do not load; keeping the current certificate"
                ),
                Err(e) => tracing::warn!(error = %e, "TLS certificate reload task failed"),
            }
        }
    }

    /// Reads the files now; true if the certificate changed (tests).
    pub fn reload(&self) -> Result<bool, String> {
        self.certs.reload()
    }

    /// Reads the client CA file now; true if it changed (tests).
    pub fn reload_client_ca(&self) -> Result<bool, String> {
        self.client_ca.as_ref().map_or(Ok(false), |ca| ca.reload())
    }
}

/// The current certificate, and the file contents it came from.
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: ArcSwap<CertifiedKey>,
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Reloading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl Reloading {
    fn load(s: &TlsSettings) -> Result<Self, String> {
        let (cert, key) = (read_pem(&s.cert, "tls.cert")?, read_pem(&s.key, "tls.key")?);
        let pair = certified_key(&cert, &key).map_err(|e| {
            format!(
                "tls.cert {} / tls.key {}: {e}",
                s.cert.display(),
                s.key.display()
            )
        })?;
        Ok(Self {
            cert: s.cert.clone(),
            key: s.key.clone(),
            current: ArcSwap::from_pointee(pair),
            loaded: Mutex::new((cert, key)),
        })
    }

    fn reload(&self) -> Result<bool, String> {
        let (cert, key) = (
            read_pem(&self.cert, "tls.cert")?,
            read_pem(&self.key, "tls.key")?,
        );
        let mut loaded = self.loaded.lock().expect("not poisoned");
        if loaded.0 == cert && loaded.1 == key {
            return Ok(false);
        }
        let pair = certified_key(&cert, &key)?;
        self.current.store(Arc::new(pair));
        *loaded = (cert, key);
        Ok(true)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Accepts a TLS connection on `io` within `timeout`. A failed handshake
/// closes the connection gently (FIN, then what the client already sent is
/// read and dropped for a moment) so that the alert saying why —
/// `CertificateRequired`, `UnknownCA` — reaches the client instead of being
/// lost to a TCP reset.
pub async fn accept<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<IO>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(io).into_fallible()).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err((e, io))) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            linger(io).await;
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// How long a refused connection is drained before it is dropped.
const LINGER: Duration = Duration::from_millis(500);
/// Most bytes read from a refused connection.
const LINGER_BYTES: usize = 256 << 10;

async fn linger<IO>(mut io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let drain = async {
        let _ = io.shutdown().await;
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while total < LINGER_BYTES {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// An axum listener serving TLS: the handshakes run in their own tasks
/// (bounded by `timeout`), so one slow client does not hold up the others;
/// at most `max_pending` handshakes run at once.
pub struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        std::net::SocketAddr,
    )>,
    local: std::net::SocketAddr,
}

/// Handshakes in progress at once on an axum TLS port.
const MAX_PENDING_HANDSHAKES: usize = 64;

impl TlsListener {
    /// Accepts on `listener` with `acceptor` until `stop`; handshakes run
    /// on `tasks`.
    pub fn new(
        listener: tokio::net::TcpListener,
        acceptor: TlsAcceptor,
        timeout: Duration,
        stop: CancellationToken,
        tasks: tokio_util::task::TaskTracker,
    ) -> Self {
        let local = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (tx, rx) = tokio::sync::mpsc::channel(MAX_PENDING_HANDSHAKES);
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
        let spawner = tasks.clone();
        tasks.spawn(async move {
            loop {
                let permit = tokio::select! {
                    p = Arc::clone(&pending).acquire_owned() => p.expect("never closed"),
                    _ = stop.cancelled() => return,
                };
                let (tcp, remote) = tokio::select! {
                    a = listener.accept() => match a {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = stop.cancelled() => return,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                spawner.spawn(async move {
                    let _permit = permit;
                    if let Some(tls) = accept(&acceptor, tcp, timeout).await {
                        let _ = tx.send((tls, remote)).await;
                    }
                });
            }
        });
        Self { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop stopped (shutdown): wait for axum's own
            // graceful shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    /// A self-signed certificate for `name` and its key, as PEM files in `dir`.
    fn pair(dir: &std::path::Path, file: &str, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k, cert.der().to_vec())
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("infermesh-agent-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn settings(cert: PathBuf, key: PathBuf) -> TlsSettings {
        TlsSettings {
            cert,
            key,
            client_ca: None,
            allow_clients: vec![],
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            probe_listen: None,
        }
    }

    #[test]
    fn reload_swaps_a_valid_new_pair_and_keeps_the_old_one_otherwise() {
        let dir = scratch("reload");
        let (cert, key, first) = pair(&dir, "a", "agent.test");
        let tls = ServerTls::load(&settings(cert.clone(), key.clone())).unwrap();
        let current = || tls.certs.current.load().cert[0].to_vec();
        assert_eq!(current(), first);
        assert!(!tls.reload().unwrap(), "unchanged files: nothing to do");

        // A new key whose certificate has not been written yet: refused, the
        // old pair stays.
        let (_, other_key, _) = pair(&dir, "b", "agent.test");
        std::fs::copy(&other_key, &key).unwrap();
        let err = tls.reload().unwrap_err();
        assert!(err.contains("does not go with"), "{err}");
        assert_eq!(current(), first);

        // Then the certificate: the new pair is used.
        std::fs::copy(dir.join("b.pem"), &cert).unwrap();
        assert!(tls.reload().unwrap());
        assert_ne!(current(), first);

        // A half-written file: refused, the pair stays.
        std::fs::write(&cert, b"-----BEGIN CERTIFICATE-----\nAAAA").unwrap();
        assert!(tls.reload().is_err());
        assert_ne!(current(), first);
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = scratch("errors");
        let (cert, key, _) = pair(&dir, "a", "agent.test");
        let missing = dir.join("missing.pem");
        let err = ServerTls::load(&settings(missing, key.clone()))
            .err()
            .unwrap();
        assert!(err.starts_with("tls.cert: cannot read"), "{err}");
        let err = ServerTls::load(&settings(key.clone(), key.clone()))
            .err()
            .unwrap();
        assert!(err.contains("no CERTIFICATE"), "{err}");
        let err = ServerTls::load(&settings(cert.clone(), cert.clone()))
            .err()
            .unwrap();
        assert!(err.contains("no private key"), "{err}");
        let big = dir.join("big.pem");
        std::fs::write(&big, vec![b'A'; infermesh_tls::MAX_PEM_BYTES + 1]).unwrap();
        let err = ServerTls::load(&settings(big, key)).err().unwrap();
        assert!(err.contains("over"), "{err}");
    }
}
