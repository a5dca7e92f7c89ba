//! The one certificate verifier, for both ends of a connection.
//!
//! A peer's certificate is checked twice: its chain by WebPKI against a CA
//! ([`Ca`]; the agent re-reads its client CA file, so the CA can change
//! under open ports), then its *name* against the names the peer may carry:
//!
//! - the agent's certificate, checked by a client: the name dialled (an IP
//!   SAN for an address), or else one of the extra names (the host name
//!   the agent's record carries);
//! - a client's certificate, checked by the agent: one of the allowed names
//!   (`[tls] allow_clients`), or any name when none are listed.
//!
//! Handshake signatures are checked with the provider's algorithms.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_name};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use crate::pem::{read_pem, root_store};
use crate::provider;

/// A CA: the chain checks it gives, rebuilt when its file's bytes change
/// and the new CA loads (a CA rotated by cert-manager or a Secret update).
pub struct Ca {
    /// Where it was read from, for [`Ca::reload`]; `None` for PEM text.
    path: Option<PathBuf>,
    /// Names the file in errors.
    what: String,
    chains: ArcSwap<Chains>,
    loaded: Mutex<Vec<u8>>,
}

/// WebPKI's chain checks over one root store: a server's certificate (for
/// the `serverAuth` purpose) and a client's (`clientAuth`).
struct Chains {
    server: Arc<WebPkiServerVerifier>,
    client: Arc<dyn ClientCertVerifier>,
}

impl Chains {
    fn build(pem: &[u8], what: &str) -> Result<Self, String> {
        let roots = Arc::new(root_store(pem, what)?);
        let server = WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| format!("{what}: {e}"))?;
        let client = WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(Self { server, client })
    }
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("what", &self.what)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// From PEM text; `what` names it in errors.
    pub fn from_pem(pem: &[u8], what: &str) -> Result<Self, String> {
        Ok(Self {
            path: None,
            what: what.to_string(),
            chains: ArcSwap::from_pointee(Chains::build(pem, what)?),
            loaded: Mutex::new(pem.to_vec()),
        })
    }

    /// From a PEM file, which [`Ca::reload`] reads again.
    pub fn load(path: &Path, what: &str) -> Result<Self, String> {
        let pem = read_pem(path, what)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            ..Self::from_pem(&pem, what)?
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again: true if its bytes changed and the new CA
    /// loaded (new handshakes are verified against it; connections already
    /// open keep going); an error (and the old CA kept) if it does not load.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let pem = read_pem(path, &self.what)?;
        let mut loaded = self.loaded.lock().expect("not poisoned");
        if *loaded == pem {
            return Ok(false);
        }
        self.chains
            .store(Arc::new(Chains::build(&pem, &self.what)?));
        *loaded = pem;
        Ok(true)
    }
}

/// A peer's certificate: signed through the [`Ca`], and valid for one of
/// `names` (see the module docs for what the names mean on each end).
#[derive(Debug)]
pub struct Verifier {
    ca: Arc<Ca>,
    names: Vec<ServerName<'static>>,
}

impl Verifier {
    /// Checks against `ca`, then `names`.
    pub fn new(ca: Arc<Ca>, names: Vec<ServerName<'static>>) -> Self {
        Self { ca, names }
    }

    /// Whether the certificate is valid for one of the names.
    fn names_one(&self, end_entity: &CertificateDer<'_>) -> Result<bool, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        Ok(self
            .names
            .iter()
            .any(|n| verify_server_name(&cert, n).is_ok()))
    }

    fn tls12(
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn tls13(
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn schemes() -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The agent's certificate, checked by a client: the name dialled, or else
/// one of the extra names.
impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let chains = self.ca.chains.load();
        match chains
            .server
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.names_one(end_entity)? => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Self::tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Self::tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
}

/// A client's certificate, checked by the agent: one of the allowed names,
/// or any when none are listed. Clients are offered no list of acceptable
/// CA names (the hint is optional in TLS; clients send their one
/// certificate).
impl ClientCertVerifier for Verifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified =
            self.ca
                .chains
                .load()
                .client
                .verify_client_cert(end_entity, intermediates, now)?;
        if self.names.is_empty() || self.names_one(end_entity)? {
            Ok(verified)
        } else {
            Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Self::tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Self::tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
}
