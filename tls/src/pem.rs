//! PEM files: read with a bound, parsed with errors that name the file.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ParsedCertificate;

use crate::provider;

/// Largest PEM file read (a certificate chain or a key): real ones are a
/// few KiB; a bigger file is not one.
pub const MAX_PEM_BYTES: usize = 1 << 20;

/// Reads a PEM file of at most [`MAX_PEM_BYTES`]; `what` names it in errors.
pub fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("{what}: cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what}: cannot read {}: {e}", path.display()))?;
    if bytes.len() > MAX_PEM_BYTES {
        return Err(format!(
            "{what}: {} is over {MAX_PEM_BYTES} bytes: not a PEM certificate or key",
            path.display()
        ));
    }
    Ok(bytes)
}

/// The certificates in PEM text; at least one.
pub fn parse_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no CERTIFICATE block in it"));
    }
    for c in &certs {
        ParsedCertificate::try_from(c).map_err(|e| format!("{what}: a bad certificate: {e}"))?;
    }
    Ok(certs)
}

/// The private key in PEM text (PKCS#8, PKCS#1 or SEC1).
pub fn parse_key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("{what}: no private key in it: {e}"))
}

/// A certificate chain and its key, checked to belong together.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::sign::CertifiedKey, String> {
    let certs = parse_certs(cert_pem, "certificate")?;
    let key = parse_key(key_pem, "key")?;
    rustls::sign::CertifiedKey::from_der(certs, key, &provider())
        .map_err(|e| format!("the key does not go with the certificate: {e}"))
}

/// A root store of the CA certificates in `pem`.
pub fn root_store(pem: &[u8], what: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in parse_certs(pem, what)? {
        roots
            .add(c)
            .map_err(|e| format!("{what}: not a usable CA certificate: {e}"))?;
    }
    Ok(roots)
}
