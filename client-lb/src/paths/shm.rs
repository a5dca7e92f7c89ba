//! The shared-memory rung: the node is the local one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::shm::{PoolConfig, ShmDir, ShmPool};
use infermesh_transport::{Path, ShmTransport};
use tonic::{Code, Response};

use super::peer::Peer;
use super::transport::{BoxFuture, PathError, Placed, Transport};
use crate::balancer::NodeId;

/// Shared memory with an agent on this host.
pub struct ShmRung {
    pool: ShmPool,
    /// Smaller requests go inline.
    min_bytes: usize,
    per_node: Mutex<HashMap<NodeId, ShmTransport>>,
}

impl ShmRung {
    /// A pool of `pool_bytes` in `dir` (`/dev/shm` when `None`), used for
    /// requests of at least `min_bytes`.
    pub fn new(pool_bytes: u64, min_bytes: usize, dir: Option<std::path::PathBuf>) -> Self {
        let mut config = PoolConfig {
            max_total_bytes: pool_bytes,
            ..PoolConfig::default()
        };
        if let Some(dir) = dir {
            config.dir = ShmDir::new(dir);
        }
        ShmRung {
            pool: ShmPool::new(config),
            min_bytes,
            per_node: Mutex::new(HashMap::new()),
        }
    }

    fn transport(&self, node: &str) -> ShmTransport {
        self.per_node
            .lock()
            .expect("shm lock")
            .entry(node.to_string())
            .or_insert_with(|| ShmTransport::new(self.pool.clone(), node))
            .clone()
    }

    /// One call on shared memory: inputs copied into a pooled region, or
    /// (`placed`) referenced where the caller built them.
    async fn send(
        &self,
        peer: &Peer,
        req: &ModelInferRequest,
        placed: Option<&Placed>,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, PathError> {
        let transport = self.transport(&peer.node);
        let mut client = peer.grpc();
        // An INVALID_ARGUMENT may mean the agent no longer knows our
        // region (our connection was re-established, so the registration
        // is gone): register afresh and send once more.
        for again in [false, true] {
            let mut staged_req = req.clone();
            let staged = match placed {
                Some(p) => transport.stage_in_place(&mut staged_req, &p.lease, &p.layout),
                None => transport.stage(&mut staged_req),
            };
            let mut staged = staged.map_err(|e| PathError::Broken(e.to_string()))?;
            if let Some(reg) = staged.needs_register() {
                match client.system_shared_memory_register(reg.to_request()).await {
                    Ok(_) => {}
                    Err(s) if s.code() == Code::AlreadyExists => {}
                    Err(s) => {
                        return Err(PathError::Broken(format!(
                            "registering the region: {}",
                            s.message()
                        )));
                    }
                }
                staged.mark_registered();
            }
            let mut request = tonic::Request::new(staged_req);
            request.set_timeout(timeout);
            crate::trace::inject(request.metadata_mut());
            match client.model_infer(request).await {
                Ok(mut resp) => {
                    transport
                        .complete(staged, resp.get_mut())
                        .map_err(|e| PathError::Broken(e.to_string()))?;
                    return Ok(resp);
                }
                Err(s) if s.code() == Code::InvalidArgument => {
                    transport.forget_registrations();
                    if again {
                        return Err(PathError::Suspect(s));
                    }
                }
                Err(s) => return Err(PathError::Status(s)),
            }
        }
        unreachable!("the loop returns")
    }
}

impl Transport for ShmRung {
    fn path(&self) -> Path {
        Path::Shm
    }

    fn reaches(&self, peer: &Peer) -> bool {
        peer.local
    }

    fn suits(&self, req: &ModelInferRequest) -> bool {
        // Only raw tensors travel in a region (see `ShmTransport::stage`).
        let tensor_bytes: usize = req.raw_input_contents.iter().map(|b| b.len()).sum();
        tensor_bytes >= self.min_bytes
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.send(peer, req, None, timeout))
    }

    fn call_placed<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        placed: &'a Placed,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.send(peer, req, Some(placed), timeout))
    }

    fn shm_pool(&self) -> Option<ShmPool> {
        Some(self.pool.clone())
    }

    fn forget(&self, node: &str) {
        self.per_node.lock().expect("shm lock").remove(node);
    }
}
