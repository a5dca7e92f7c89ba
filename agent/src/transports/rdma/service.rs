//! `infermesh.v1.Rdma`: the queue-pair exchange, served on the OIP address.

use std::sync::Arc;

use infermesh_proto::rdma::{ConnectRequest, ConnectResponse, Rdma};
use infermesh_rdma::EndpointInfo;
use tonic::{Request, Response, Status};

use super::RdmaPeers;
use crate::error::AgentError;
use crate::transports::conn;

/// Accepts clients' queue pairs for the connection that asks.
#[derive(Clone)]
pub struct RdmaService {
    peers: Arc<RdmaPeers>,
}

impl RdmaService {
    /// The service over `peers`.
    pub fn new(peers: Arc<RdmaPeers>) -> Self {
        Self { peers }
    }
}

#[tonic::async_trait]
impl Rdma for RdmaService {
    async fn connect_queue_pair(
        &self,
        req: Request<ConnectRequest>,
    ) -> Result<Response<ConnectResponse>, Status> {
        let owner = conn::owner(&req);
        let info = EndpointInfo::decode(&req.get_ref().endpoint)
            .map_err(|e| AgentError::RdmaRequest(e.to_string()))?;
        let qp = self
            .peers
            .accept(owner, &info)
            .await
            .map_err(|e| AgentError::RdmaPath(format!("accepting a queue pair: {e}")))?;
        tracing::debug!(owner, qpn = qp.qpn(), peer = ?info, "RDMA queue pair accepted");
        Ok(Response::new(ConnectResponse {
            endpoint: qp.local_info().encode(),
        }))
    }
}
