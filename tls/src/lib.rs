//! TLS of infermesh's connections (issue 13), shared by the agent, the
//! client library and the CLI: rustls with the `ring` provider, PEM files
//! read with bounds and clear errors ([`pem`]), the one certificate
//! verifier both ends use ([`Verifier`] over a reloadable [`Ca`]), and the
//! client side of a TLS connection to an agent ([`ClientTls`],
//! [`TlsConnector`]).
//!
//! A client verifies the agent's certificate against the CA it was given
//! and against the agent's *name*: the IP address it dials (an IP SAN), or
//! else the host name the agent's record carries (a DNS SAN). The agent
//! verifies client certificates (mTLS) against its client CA and, on the
//! data plane, against an allow-list of names. The agent's own certificate
//! (re-read when its files change) and its listeners live in the agent.
#![forbid(unsafe_code)]

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

mod client;
pub mod pem;
mod verify;

pub use client::{ClientTls, TlsConnector, TlsFiles};
pub use pem::{MAX_PEM_BYTES, certified_key, parse_certs, parse_key, read_pem, root_store};
pub use verify::{Ca, Verifier};

/// ALPN of the OIP port: gRPC is HTTP/2 only.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN of HTTP ports that also speak HTTP/1.1 (admin, KServe HTTP).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Environment variables of the client library and the CLI.
pub const ENV_CA: &str = "INFERMESH_TLS_CA";
/// See [`ENV_CA`].
pub const ENV_CERT: &str = "INFERMESH_TLS_CERT";
/// See [`ENV_CA`].
pub const ENV_KEY: &str = "INFERMESH_TLS_KEY";

/// The crypto provider everywhere: `ring`.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
