//! A member node as the transports see it.

use std::time::Duration;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::registry::NodeRecord;
use infermesh_proto::{DEFAULT_MAX_MESSAGE_BYTES, channel::oip_channel_tls};
use infermesh_tls::ClientTls;
use tonic::transport::Channel;

use crate::balancer::NodeId;

/// A member node as the transports see it: its id, where it runs, and the
/// one HTTP/2 connection to it. Made once per node when it joins.
pub struct Peer {
    /// Node id.
    pub node: NodeId,
    /// It runs on this host (shared memory is possible).
    pub local: bool,
    /// It advertises an RDMA endpoint.
    pub rdma: bool,
    /// The address of its gRPC endpoint.
    pub grpc_addr: String,
    /// Its gRPC endpoint serves TLS (the connection is TLS).
    pub tls: bool,
    /// Its QUIC endpoint, when it offers one and this client has TLS
    /// settings (QUIC is TLS only).
    pub quic: Option<std::net::SocketAddr>,
    /// Its host name from the record, a second name its certificate may carry.
    pub host: Option<String>,
    /// The connection to it (the RDMA control path uses it too).
    pub channel: Channel,
    client: GrpcInferenceServiceClient<Channel>,
}

impl Peer {
    /// The peer for `record`, connecting lazily to its gRPC endpoint: over
    /// TLS when the record says so (then `tls` must be given; the agent's
    /// certificate must name the address's IP or the record's host).
    pub fn new(record: &NodeRecord, local: bool, tls: Option<&ClientTls>) -> Result<Self, String> {
        let tls = match (record.endpoints.tls, tls) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => {
                return Err(format!(
                    "node '{}' serves TLS and no TLS CA is configured (tls_ca, {})",
                    record.node_id,
                    infermesh_tls::ENV_CA
                ));
            }
        };
        let host = Some(record.host.as_str()).filter(|h| !h.is_empty());
        let channel = oip_channel_tls(&record.endpoints.grpc, Duration::from_secs(1), tls, host)
            .map_err(|e| format!("node '{}': {e}", record.node_id))?;
        let client = GrpcInferenceServiceClient::new(channel.clone())
            .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES);
        Ok(Peer {
            node: record.node_id.clone(),
            local,
            rdma: record.endpoints.rdma.is_some(),
            grpc_addr: record.endpoints.grpc.clone(),
            tls: tls.is_some(),
            quic: record
                .endpoints
                .quic
                .as_deref()
                .filter(|_| tls.is_some())
                .and_then(|q| q.parse().ok()),
            host: host.map(str::to_string),
            channel,
            client,
        })
    }

    /// Whether `record` can still be reached through this peer (same
    /// endpoints), so that its connection is kept.
    pub fn same_endpoints(&self, record: &NodeRecord) -> bool {
        self.grpc_addr == record.endpoints.grpc
            && self.rdma == record.endpoints.rdma.is_some()
            && self.tls == record.endpoints.tls
            && self.quic.map(|q| q.to_string()).as_deref()
                == record.endpoints.quic.as_deref().filter(|_| self.tls)
    }

    /// A handle on the inference service of the node.
    pub fn grpc(&self) -> GrpcInferenceServiceClient<Channel> {
        self.client.clone()
    }
}
