//! The QUIC rung (issue 13): `ModelInfer` on one bidirectional QUIC stream
//! per request to agents that advertise `endpoints.quic`, over TLS 1.3 with
//! the client's TLS settings (the same CA, client certificate and name
//! checks as gRPC over TLS). Frames: [`infermesh_proto::quic`].
//!
//! One connection per node, opened on first use within
//! [`CONNECT_TIMEOUT`] (or half the attempt's time, if less), so a blocked
//! UDP port costs one short wait before the ladder falls back to gRPC; any
//! connection or stream failure is [`PathError::Broken`] and the request is
//! re-sent on gRPC.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_proto::quic::{ALPN, Answer, decode_response, encode_request_chunks};
use infermesh_tls::ClientTls;
use infermesh_transport::{Path, quic};
use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue, MetadataKey, MetadataMap};
use tonic::{Code, Response, Status};

use super::peer::Peer;
use super::transport::{BoxFuture, PathError, Transport};

/// Longest wait for a QUIC handshake before falling back.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest response accepted.
const MAX_MESSAGE_BYTES: usize = infermesh_proto::DEFAULT_MAX_MESSAGE_BYTES;

/// The QUIC rung.
pub struct QuicRung {
    tls: ClientTls,
    v4: OnceLock<Result<quinn::Endpoint, String>>,
    v6: OnceLock<Result<quinn::Endpoint, String>>,
    conns: Mutex<HashMap<String, quinn::Connection>>,
}

impl QuicRung {
    /// The rung with `tls`.
    pub fn new(tls: ClientTls) -> Self {
        QuicRung {
            tls,
            v4: OnceLock::new(),
            v6: OnceLock::new(),
            conns: Mutex::new(HashMap::new()),
        }
    }

    fn endpoint(&self, to: SocketAddr) -> Result<quinn::Endpoint, String> {
        let (cell, bind) = if to.is_ipv4() {
            (&self.v4, SocketAddr::from(([0, 0, 0, 0], 0)))
        } else {
            (&self.v6, SocketAddr::from(([0u16; 8], 0)))
        };
        cell.get_or_init(|| {
            quic::endpoint(bind, None).map_err(|e| format!("cannot open a UDP socket: {e}"))
        })
        .clone()
    }

    async fn connection(
        &self,
        peer: &Peer,
        timeout: Duration,
    ) -> Result<quinn::Connection, String> {
        if let Some(c) = self.conns.lock().expect("quic lock").get(&peer.node) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let addr = peer.quic.ok_or("the node offers no QUIC endpoint")?;
        let endpoint = self.endpoint(addr)?;
        let crypto = self.tls.config(peer.host.as_deref(), &[ALPN]);
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)
            .map_err(|e| format!("QUIC TLS configuration: {e}"))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quic::transport_config();
        transport.keep_alive_interval(Some(Duration::from_secs(10)));
        config.transport_config(Arc::new(transport));
        let connecting = endpoint
            .connect_with(config, addr, &addr.ip().to_string())
            .map_err(|e| format!("QUIC connect to {addr}: {e}"))?;
        let wait = CONNECT_TIMEOUT.min(timeout / 2);
        let conn = tokio::time::timeout(wait, connecting)
            .await
            .map_err(|_| format!("QUIC handshake with {addr} took over {wait:?}"))?
            .map_err(|e| format!("QUIC handshake with {addr}: {e}"))?;
        self.conns
            .lock()
            .expect("quic lock")
            .insert(peer.node.clone(), conn.clone());
        Ok(conn)
    }

    async fn infer(
        &self,
        peer: &Peer,
        req: &ModelInferRequest,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, PathError> {
        let conn = self
            .connection(peer, timeout)
            .await
            .map_err(PathError::Broken)?;
        let broken = |e: &dyn std::fmt::Display| {
            self.conns.lock().expect("quic lock").remove(&peer.node);
            PathError::Broken(format!("QUIC: {e}"))
        };
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| broken(&e))?;
        let timeout_ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        // The tensors go from the request's own buffers: no copy into a
        // frame first. Smaller requests first (`quic::stream_priority`).
        let mut chunks = encode_request_chunks(req, timeout_ms);
        let len = chunks.iter().map(|c| c.len()).sum();
        let _ = send.set_priority(quic::stream_priority(len));
        send.write_all_chunks(&mut chunks)
            .await
            .map_err(|e| broken(&e))?;
        send.finish().map_err(|e| broken(&e))?;
        let bytes = recv
            .read_to_end(MAX_MESSAGE_BYTES + (64 << 10))
            .await
            .map_err(|e| broken(&e))?;
        let (answer, report) =
            decode_response(bytes.into(), MAX_MESSAGE_BYTES).map_err(|e| broken(&e))?;
        match answer {
            Answer::Ok(resp) => {
                let mut resp = Response::new(resp);
                put_report(resp.metadata_mut(), report);
                Ok(resp)
            }
            Answer::Status(code, message) => {
                // With the report, as over gRPC: the retry layer tells an
                // agent's answer from a failed connection by it.
                let mut status = Status::new(Code::from(code), message);
                put_report(status.metadata_mut(), report);
                Err(PathError::Status(status))
            }
        }
    }
}

/// Puts the load report of a QUIC answer into gRPC metadata, where a gRPC
/// answer has it.
fn put_report<V: AsRef<[u8]>>(md: &mut MetadataMap, report: impl IntoIterator<Item = (String, V)>) {
    for (name, value) in report {
        let value = value.as_ref();
        if name.ends_with("-bin") {
            if let Ok(key) = MetadataKey::from_bytes(name.as_bytes()) {
                md.insert_bin(key, BinaryMetadataValue::from_bytes(value));
            }
        } else if let (Ok(key), Ok(v)) = (
            MetadataKey::from_bytes(name.as_bytes()),
            AsciiMetadataValue::try_from(value),
        ) {
            md.insert(key, v);
        }
    }
}

impl Transport for QuicRung {
    fn path(&self) -> Path {
        Path::Quic
    }

    fn reaches(&self, peer: &Peer) -> bool {
        peer.quic.is_some()
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.infer(peer, req, timeout))
    }

    fn forget(&self, node: &str) {
        if let Some(c) = self.conns.lock().expect("quic lock").remove(node) {
            c.close(0u32.into(), b"node left");
        }
    }
}

#[cfg(test)]
mod tests {
    use infermesh_proto::load::{INFLIGHT_KEY, LoadReport};
    use infermesh_proto::quic::encode_response;

    use super::*;

    /// An agent's error over QUIC keeps its load report, so that the retry
    /// layer takes it for the agent's answer, as over gRPC.
    #[test]
    fn a_status_over_quic_carries_the_agents_report() {
        let frame = encode_response(
            &Answer::Status(Code::Internal as i32, "worker failed".into()),
            &[(INFLIGHT_KEY, b"2")],
        );
        let (answer, report) = decode_response(frame, 1 << 20).unwrap();
        let Answer::Status(code, message) = answer else {
            panic!("a status")
        };
        let mut status = Status::new(Code::from(code), message);
        put_report(status.metadata_mut(), report);
        assert!(LoadReport::sent_in(status.metadata()));
        assert_eq!(status.metadata().get(INFLIGHT_KEY).unwrap(), "2");
    }
}
