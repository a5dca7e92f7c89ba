//! The transport ladder on the client side: which path a request's tensors
//! take to the node the balancer picked.
//!
//! - **shm** — the node is the local one (`ClientBuilder::local_node`): the
//!   inputs are written into a pooled POSIX shared-memory region, registered
//!   once with the agent (Triton's `SystemSharedMemoryRegister`), and the
//!   request carries references; outputs come back the same way. No
//!   allocation per request once the pool is warm.
//! - **rdma** — the node advertises an RDMA endpoint and the client has an
//!   engine (`PathsConfig::rdma`): inputs are pulled by the agent with RDMA
//!   READ from registered buffers, outputs pushed with RDMA WRITE (see
//!   [`crate::rdma_path`]).
//! - **grpc** — tensors inline in the request: the path that always works.
//!
//! A path that fails (the region cannot be created, the agent refuses it, a
//! reference is rejected) is marked broken for that node by the sans-IO
//! [`Ladder`] and the *same* request is re-sent inline at once: no request
//! fails because a fast path broke. The ladder re-probes a broken path after
//! `reprobe_after` (doubling while it keeps failing). Ordinary gRPC errors
//! (UNAVAILABLE, RESOURCE_EXHAUSTED, ...) are not path failures; they go back
//! to the caller's retry logic.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_rdma::RdmaEngine;
use infermesh_transport::shm::{PoolConfig, ShmDir, ShmPool};
use infermesh_transport::{Ladder, LadderConfig, LadderCounters, Path, ShmTransport, Transport};
use tonic::transport::Channel;

use crate::rdma_path::{RdmaPath, RdmaPathError};
use tonic::{Code, Response, Status};

/// How the client picks transports.
#[derive(Debug, Clone)]
pub struct PathsConfig {
    /// Paths in order of preference (gRPC is always the last resort).
    pub prefer: Vec<Path>,
    /// Bytes of shared memory the client may hold in its pool.
    pub shm_pool_bytes: u64,
    /// First wait before a broken path is tried again.
    pub reprobe_after: Duration,
    /// The RDMA engine (`RdmaEngine::probe()` on a host with a verbs device,
    /// `RdmaEngine::emulated()` in tests); `None` = no RDMA path.
    pub rdma: Option<RdmaEngine>,
    /// Where shared-memory regions are created (`/dev/shm`; tests point it
    /// elsewhere).
    pub shm_dir: Option<std::path::PathBuf>,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            prefer: vec![Path::Shm, Path::Rdma, Path::Grpc],
            shm_pool_bytes: 256 << 20,
            reprobe_after: Duration::from_secs(30),
            shm_dir: None,
            rdma: None,
        }
    }
}

/// The client's transports and the ladder over them.
pub struct Paths {
    ladder: Mutex<Ladder>,
    rdma: Option<RdmaPath>,
    shm_pool: Option<ShmPool>,
    shm: Mutex<HashMap<String, ShmTransport>>,
}

/// The node a request goes to, as the transports need it.
#[derive(Clone, Copy)]
pub struct Peer<'a> {
    /// Node id.
    pub node: &'a str,
    /// It runs on this host (shared memory is possible).
    pub local: bool,
    /// It advertises an RDMA endpoint.
    pub rdma: bool,
    /// The connection to it (the RDMA control path uses it).
    pub channel: &'a Channel,
}

enum Attempt {
    /// The path itself failed: re-send inline.
    Broken(String),
    /// The node answered with an error: the caller's retry logic decides.
    Status(Status),
}

impl Paths {
    /// Transports as configured.
    pub fn new(config: &PathsConfig) -> Self {
        let shm_pool = config.prefer.contains(&Path::Shm).then(|| {
            let mut pool = PoolConfig {
                max_total_bytes: config.shm_pool_bytes,
                ..PoolConfig::default()
            };
            if let Some(dir) = &config.shm_dir {
                pool.dir = ShmDir::new(dir.clone());
            }
            ShmPool::new(pool)
        });
        let rdma = config
            .rdma
            .clone()
            .filter(|_| config.prefer.contains(&Path::Rdma))
            .map(RdmaPath::new);
        let mut supported = vec![Path::Shm, Path::Grpc];
        if rdma.is_some() {
            supported.push(Path::Rdma);
        }
        let ladder = Ladder::new(LadderConfig {
            preference: config.prefer.clone(),
            supported,
            reprobe_after: config.reprobe_after,
            ..LadderConfig::default()
        });
        Self {
            ladder: Mutex::new(ladder),
            rdma,
            shm_pool,
            shm: Mutex::new(HashMap::new()),
        }
    }

    /// Per-path counters (attempts, successes, failures, fallbacks).
    pub fn counters(&self) -> LadderCounters {
        self.ladder.lock().expect("ladder lock").counters()
    }

    /// Sends `req` to `peer` on the best path that works.
    pub async fn call(
        &self,
        peer: Peer<'_>,
        client: &mut GrpcInferenceServiceClient<Channel>,
        req: &ModelInferRequest,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let node = peer.node;
        let mut advertised = Vec::with_capacity(3);
        if peer.local && self.shm_pool.is_some() {
            advertised.push(Path::Shm);
        }
        if peer.rdma && self.rdma.is_some() {
            advertised.push(Path::Rdma);
        }
        advertised.push(Path::Grpc);
        let advertised = advertised.as_slice();
        let path =
            self.ladder
                .lock()
                .expect("ladder lock")
                .choose(node, advertised, Instant::now());
        if path == Path::Shm {
            match self.call_shm(node, client, req, timeout).await {
                Ok(resp) => {
                    self.ladder.lock().expect("ladder lock").on_success(
                        node,
                        Path::Shm,
                        Instant::now(),
                    );
                    return Ok(resp);
                }
                Err(Attempt::Status(s)) => return Err(s),
                Err(Attempt::Broken(reason)) => {
                    let next = self.ladder.lock().expect("ladder lock").on_failure(
                        node,
                        Path::Shm,
                        Instant::now(),
                    );
                    tracing::warn!(%node, %reason, fallback = %next, "shared-memory path failed; re-sending the request inline");
                }
            }
        }
        if path == Path::Rdma {
            let rdma = self.rdma.as_ref().expect("chosen only when configured");
            match rdma
                .infer(node, peer.channel.clone(), req.clone(), timeout)
                .await
            {
                Ok(resp) => {
                    self.ladder.lock().expect("ladder lock").on_success(
                        node,
                        Path::Rdma,
                        Instant::now(),
                    );
                    return Ok(resp);
                }
                Err(RdmaPathError::Status(s)) => return Err(s),
                Err(RdmaPathError::NotApplicable(why)) => {
                    tracing::debug!(%node, %why, "request not suited to RDMA; sending it inline");
                }
                Err(RdmaPathError::PathBroken(reason)) => {
                    let next = self.ladder.lock().expect("ladder lock").on_failure(
                        node,
                        Path::Rdma,
                        Instant::now(),
                    );
                    tracing::warn!(%node, %reason, fallback = %next, "RDMA path failed; re-sending the request inline");
                }
            }
        }
        let mut request = tonic::Request::new(req.clone());
        request.set_timeout(timeout);
        let result = client.model_infer(request).await;
        if result.is_ok() {
            self.ladder
                .lock()
                .expect("ladder lock")
                .on_success(node, Path::Grpc, Instant::now());
        }
        result
    }

    fn shm_transport(&self, node: &str) -> Option<ShmTransport> {
        let pool = self.shm_pool.as_ref()?;
        Some(
            self.shm
                .lock()
                .expect("shm lock")
                .entry(node.to_string())
                .or_insert_with(|| ShmTransport::new(pool.clone(), node))
                .clone(),
        )
    }

    async fn call_shm(
        &self,
        node: &str,
        client: &mut GrpcInferenceServiceClient<Channel>,
        req: &ModelInferRequest,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, Attempt> {
        let transport = self
            .shm_transport(node)
            .ok_or_else(|| Attempt::Broken("shared memory is off".into()))?;
        // One more try when the agent no longer knows our region (our
        // connection was re-established, so the registration is gone).
        for retry in [false, true] {
            let mut staged_req = req.clone();
            let mut staged = transport
                .stage(&mut staged_req)
                .map_err(|e| Attempt::Broken(e.to_string()))?;
            if let Some(reg) = staged.needs_register() {
                match client.system_shared_memory_register(reg.to_request()).await {
                    Ok(_) => {}
                    Err(s) if s.code() == Code::AlreadyExists => {}
                    Err(s) => {
                        return Err(Attempt::Broken(format!(
                            "registering the region: {}",
                            s.message()
                        )));
                    }
                }
                staged.mark_registered();
            }
            let mut request = tonic::Request::new(staged_req);
            request.set_timeout(timeout);
            match client.model_infer(request).await {
                Ok(mut resp) => {
                    transport
                        .complete(staged, resp.get_mut())
                        .map_err(|e| Attempt::Broken(e.to_string()))?;
                    return Ok(resp);
                }
                Err(s) if s.code() == Code::InvalidArgument && s.message().contains("region") => {
                    transport.forget_registrations();
                    if retry {
                        return Err(Attempt::Broken(s.message().to_string()));
                    }
                }
                Err(s) => return Err(Attempt::Status(s)),
            }
        }
        unreachable!("the loop returns")
    }
}
