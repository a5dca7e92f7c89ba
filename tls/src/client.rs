//! The client side of a TLS connection to an agent: the files
//! ([`TlsFiles`]), the settings they give ([`ClientTls`]), and a connector
//! for tonic channels ([`TlsConnector`]). The agent's certificate is checked
//! by the one [`Verifier`](crate::Verifier): the chain against the CA, then
//! the name dialled or else the record's host name.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::pem::{certified_key, parse_key, read_pem};
use crate::verify::{Ca, Verifier};
use crate::{ALPN_H2, provider};

/// Paths of a client's TLS files: the CA that signed the agents'
/// certificates and, for agents that require client certificates (mTLS),
/// the client's own certificate and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s), PEM.
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate chain, PEM.
    pub cert: Option<std::path::PathBuf>,
    /// Client private key, PEM.
    pub key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// The settings these files give: `None` without a CA (plaintext only);
    /// an error for unreadable files, a lone cert or key, a mismatched pair.
    pub fn load(&self) -> Result<Option<ClientTls>, String> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.key.is_some() {
                return Err("a TLS client certificate needs the CA too (--tls-ca)".into());
            }
            return Ok(None);
        };
        let ca = read_pem(ca, "TLS CA")?;
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((read_pem(c, "TLS cert")?, read_pem(k, "TLS key")?)),
            (None, None) => None,
            _ => return Err("give both a TLS client certificate and its key, or neither".into()),
        };
        ClientTls::from_pem(
            &ca,
            identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
        )
        .map(Some)
    }
}

/// A client's TLS settings: whom to trust, and what to present.
#[derive(Clone)]
pub struct ClientTls {
    ca: Arc<Ca>,
    identity: Option<Arc<Identity>>,
}

/// A client certificate chain and its key.
struct Identity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca)
            .field("client_cert", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// From PEM text: CA certificates, and optionally a certificate chain
    /// and key to present.
    pub fn from_pem(ca: &[u8], identity: Option<(&[u8], &[u8])>) -> Result<Self, String> {
        let ca = Arc::new(Ca::from_pem(ca, "TLS CA")?);
        let identity = match identity {
            Some((c, k)) => {
                // Checks that they go together.
                let pair = certified_key(c, k)?;
                Some(Arc::new(Identity {
                    certs: pair.cert,
                    key: parse_key(k, "key")?,
                }))
            }
            None => None,
        };
        Ok(Self { ca, identity })
    }

    /// A rustls client config for one agent: `also` is a second name its
    /// certificate may carry (the record's host name) when the address
    /// dialled is not in it; `alpn` the protocols offered.
    pub fn config(&self, also: Option<&str>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let also = also.and_then(|n| ServerName::try_from(n.to_string()).ok());
        let verifier = Arc::new(Verifier::new(
            Arc::clone(&self.ca),
            also.into_iter().collect(),
        ));
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &self.identity {
            Some(id) => builder
                .with_client_auth_cert(id.certs.clone(), id.key.clone_key())
                .expect("checked when loaded"),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// Whether a client certificate is presented.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }
}

/// Connects a tonic channel over TLS: TCP (`TCP_NODELAY`), the handshake
/// with the name the URI's host gives (an IP SAN for `ip:port`), ALPN `h2`.
#[derive(Clone)]
pub struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
}

impl TlsConnector {
    /// A connector with `tls`'s settings; `also` as in [`ClientTls::config`].
    pub fn new(tls: &ClientTls, also: Option<&str>) -> Self {
        Self {
            connector: tokio_rustls::TlsConnector::from(tls.config(also, &[ALPN_H2])),
        }
    }

    /// Dials `host:port` (`host` an IP or a name) and completes the handshake.
    pub async fn connect(&self, host: &str, port: u16) -> std::io::Result<TlsStream<TcpStream>> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let tcp = TcpStream::connect((host, port)).await?;
        let _ = tcp.set_nodelay(true);
        let tls = self.connector.connect(name, tcp).await?;
        if tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the server did not agree to HTTP/2 (ALPN h2)",
            ));
        }
        Ok(tls)
    }
}

impl tower::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().to_string();
            let port = uri.port_u16().unwrap_or(443);
            this.connect(&host, port).await.map(TokioIo::new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

    /// A CA (PEM) and a server certificate it signed for `sans`, as a
    /// rustls server config offering `h2`.
    fn ca_and_server(sans: &[&str]) -> (String, Arc<rustls::ServerConfig>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let pair = certified_key(cert.pem().as_bytes(), key.serialize_pem().as_bytes()).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                pair.cert.clone(),
                parse_key(key.serialize_pem().as_bytes(), "key").unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        (ca_pem, Arc::new(config))
    }

    /// Serves TLS handshakes on a loopback port; returns the port.
    async fn server(config: Arc<rustls::ServerConfig>) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        use tokio::io::AsyncReadExt;
                        let mut buf = [0u8; 1];
                        let _ = tls.read(&mut buf).await;
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn the_agent_is_verified_by_its_ip_or_by_the_records_host_name() {
        // A certificate with an IP SAN: dialling that IP verifies.
        let (ca, config) = ca_and_server(&["127.0.0.1"]);
        let tls = ClientTls::from_pem(ca.as_bytes(), None).unwrap();
        let port = server(config).await;
        TlsConnector::new(&tls, None)
            .connect("127.0.0.1", port)
            .await
            .unwrap();

        // A certificate naming only the host: the IP fails, unless the
        // record's host name is given as the second name.
        let (ca, config) = ca_and_server(&["gpu-7.example"]);
        let tls = ClientTls::from_pem(ca.as_bytes(), None).unwrap();
        let port = server(config).await;
        let err = TlsConnector::new(&tls, None)
            .connect("127.0.0.1", port)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not valid for name"), "{err}");
        TlsConnector::new(&tls, Some("gpu-7.example"))
            .connect("127.0.0.1", port)
            .await
            .unwrap();
        let err = TlsConnector::new(&tls, Some("gpu-8.example"))
            .connect("127.0.0.1", port)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not valid for name"), "{err}");
    }

    #[test]
    fn client_files_are_checked() {
        let err = TlsFiles {
            cert: Some("c.pem".into()),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(err.contains("needs the CA"), "{err}");
        assert!(TlsFiles::default().load().unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("infermesh-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, _) = ca_and_server(&["127.0.0.1"]);
        std::fs::write(dir.join("ca.pem"), ca).unwrap();
        let err = TlsFiles {
            ca: Some(dir.join("ca.pem")),
            key: Some(dir.join("ca.pem")),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(err.contains("both"), "{err}");
        let err = TlsFiles {
            ca: Some(dir.join("nope.pem")),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
        assert!(
            TlsFiles {
                ca: Some(dir.join("ca.pem")),
                ..Default::default()
            }
            .load()
            .unwrap()
            .is_some()
        );
    }
}
