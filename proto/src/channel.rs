//! The one way infermesh opens an OIP client: HTTP/2 with `TCP_NODELAY`,
//! windows large enough for megabyte tensors (4 MiB per stream, 16 MiB per
//! connection; the 64 KiB defaults throttle large tensors), and message
//! limits above tonic's 4 MiB default. Connects lazily: the first call dials.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::GrpcInferenceServiceClient;
use infermesh_tls::{ClientTls, TlsConnector};

/// An OIP client for `addr` (`host:port` or a URI). Errors name the address.
pub fn oip_client(
    addr: &str,
    connect_timeout: Duration,
    max_message_bytes: usize,
) -> Result<GrpcInferenceServiceClient<Channel>, String> {
    Ok(
        GrpcInferenceServiceClient::new(oip_channel(addr, connect_timeout)?)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes),
    )
}

/// The lazily connected channel [`oip_client`] wraps, for other services on
/// the same connection (e.g. the RDMA control path).
pub fn oip_channel(addr: &str, connect_timeout: Duration) -> Result<Channel, String> {
    Ok(oip_endpoint(addr, connect_timeout)?.connect_lazy())
}

/// [`oip_channel`] over TLS when `tls` is given (see [`infermesh_tls`]): the
/// agent's certificate must be valid for the address's host, or for
/// `also_name` (the record's host name).
pub fn oip_channel_tls(
    addr: &str,
    connect_timeout: Duration,
    tls: Option<&ClientTls>,
    also_name: Option<&str>,
) -> Result<Channel, String> {
    let endpoint = oip_endpoint(addr, connect_timeout)?;
    Ok(match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(TlsConnector::new(tls, also_name)),
    })
}

/// The endpoint of [`oip_channel`], for an eager `connect`.
pub fn oip_endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, String> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint =
        Endpoint::from_shared(uri).map_err(|e| format!("'{addr}' is not a valid address: {e}"))?;
    Ok(endpoint
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20)))
}
