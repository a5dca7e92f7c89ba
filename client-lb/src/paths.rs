//! The bottom of the client's stack: how a request's tensors reach the node
//! the balancer picked.
//!
//! Each way is a [`Transport`] — an object-safe trait (`dyn Transport`), one
//! implementation per rung:
//!
//! - [`ShmRung`] — the node is the local one (`ClientBuilder::local_node`):
//!   the inputs are written into a pooled POSIX shared-memory region,
//!   registered once with the agent (Triton's `SystemSharedMemoryRegister`),
//!   and the request carries references; outputs come back the same way.
//! - [`RdmaRung`] — the node advertises an RDMA endpoint and the client has
//!   an engine (`PathsConfig::rdma`): inputs are pulled by the agent with
//!   RDMA READ from registered buffers, outputs pushed with RDMA WRITE (see
//!   [`crate::rdma_path`]); it sets up a queue pair per node over the node's
//!   gRPC channel, which is why a transport gets the whole [`Peer`].
//! - [`GrpcRung`] — tensors inline in the request: the rung that always works.
//!
//! [`Fallback`] is the combinator over them, itself a [`Transport`]: it asks
//! the sans-IO [`Ladder`] which rung to use for the node, and when a rung
//! fails as a path ([`PathError::Broken`]) marks it broken for that node and
//! re-sends the *same* request on the next rung at once: no request fails
//! because a fast path broke. The ladder re-probes a broken rung after
//! `reprobe_after` (doubling while it keeps failing). A node's answer
//! ([`PathError::Status`]: UNAVAILABLE, RESOURCE_EXHAUSTED, ...) is not a
//! path failure; it goes up to the retry layer. Errors are told apart by
//! type, never by message text.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_proto::registry::NodeRecord;
use infermesh_proto::tls::ClientTls;
use infermesh_proto::{DEFAULT_MAX_MESSAGE_BYTES, channel::oip_channel_tls};
use infermesh_rdma::RdmaEngine;
use infermesh_transport::shm::{Layout, PoolConfig, SharedLease, ShmDir, ShmPool};
use infermesh_transport::{
    Ladder, LadderConfig, LadderCounters, Path, ShmTransport, Transport as _,
};
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::balancer::NodeId;
use crate::config::{DEFAULT_REPROBE_AFTER, DEFAULT_SHM_MIN_BYTES, DEFAULT_SHM_POOL_BYTES};
use crate::rdma_path::{RdmaPath, RdmaPathError};

/// A boxed, sendable future: what [`Transport::call`] returns, so that the
/// trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How the client picks transports.
#[derive(Debug, Clone)]
pub struct PathsConfig {
    /// Paths in order of preference (gRPC is always the last resort).
    pub prefer: Vec<Path>,
    /// Bytes of shared memory the client may hold in its pool.
    pub shm_pool_bytes: u64,
    /// Requests whose raw input tensors total fewer bytes go inline even to
    /// the local node ([`DEFAULT_SHM_MIN_BYTES`]; 0 = every request).
    pub shm_min_bytes: usize,
    /// First wait before a broken path is tried again.
    pub reprobe_after: Duration,
    /// The RDMA engine (`RdmaEngine::probe()` on a host with a verbs device,
    /// `RdmaEngine::emulated()` in tests); `None` = no RDMA path.
    pub rdma: Option<RdmaEngine>,
    /// Where shared-memory regions are created (`/dev/shm`; tests point it
    /// elsewhere).
    pub shm_dir: Option<std::path::PathBuf>,
    /// TLS to agents whose records say their ports serve TLS (issue 13);
    /// without it such agents are skipped with a warning.
    pub tls: Option<ClientTls>,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            prefer: vec![Path::Shm, Path::Rdma, Path::Grpc],
            shm_pool_bytes: DEFAULT_SHM_POOL_BYTES,
            shm_min_bytes: DEFAULT_SHM_MIN_BYTES,
            reprobe_after: DEFAULT_REPROBE_AFTER,
            shm_dir: None,
            rdma: None,
            tls: None,
        }
    }
}

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
                    infermesh_proto::tls::ENV_CA
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

/// Why a transport could not deliver a request.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The node answered with a gRPC status, or the connection failed: not
    /// a fault of the path; the retry layer decides.
    #[error(transparent)]
    Status(Status),
    /// This request cannot take this path (the path itself is fine): send
    /// it on the next rung.
    #[error("request not suited to this path: {0}")]
    NotApplicable(String),
    /// The path to this node failed: mark it broken, re-send on the next rung.
    #[error("path broken: {0}")]
    Broken(String),
    /// The node refused the request on this path as invalid even after the
    /// path was set up afresh: either the path or the request is at fault.
    /// The next rung decides: if it succeeds the path is marked broken, if
    /// it refuses too the caller gets its answer.
    #[error("refused on this path: {0}")]
    Suspect(Status),
}

/// One way of carrying a request to a node. Object-safe: the client holds
/// a `dyn Transport` (a [`Fallback`] over the rungs, or whatever a caller
/// passes to `ClientBuilder::transport`).
pub trait Transport: Send + Sync {
    /// The path this transport implements (a combinator answers with its
    /// last resort).
    fn path(&self) -> Path;

    /// Whether this transport can reach `peer` at all (shared memory only a
    /// local node, RDMA only a node that advertises it).
    fn reaches(&self, peer: &Peer) -> bool;

    /// Whether `req` is worth this path (a request too small for shared
    /// memory is not); one that is not goes down the ladder without
    /// counting as an attempt here.
    fn suits(&self, _req: &ModelInferRequest) -> bool {
        true
    }

    /// Sends `req` to `peer`; `timeout` is the attempt's time left (sent to
    /// the node as the gRPC deadline; the caller enforces it too).
    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>>;

    /// Sends a request whose raw inputs the caller built in place in a
    /// region of the client's shared-memory pool: `req`'s
    /// `raw_input_contents` are views of `placed`'s region. A path that
    /// reaches the region (shared memory to the local node) sends
    /// references to it and nothing is copied; any other path sends the
    /// inputs inline from the region, which is what this default does.
    fn call_placed<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        _placed: &'a Placed,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        self.call(peer, req, timeout)
    }

    /// The shared-memory pool callers lease regions from, when this
    /// transport sends from one (`Client::lease`).
    fn shm_pool(&self) -> Option<ShmPool> {
        None
    }

    /// Forgets what is kept for `node` (it left the membership).
    fn forget(&self, _node: &str) {}

    /// Per-path counters, for a transport that keeps them.
    fn counters(&self) -> LadderCounters {
        LadderCounters::default()
    }
}

/// Where a leased request's tensors lie: its region, shared with the views
/// of its inputs (and, once answered, of its outputs), and their windows.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The region.
    pub lease: SharedLease,
    /// One window per input and per requested output.
    pub layout: Layout,
}

/// Tensors inline in gRPC messages.
#[derive(Debug, Default)]
pub struct GrpcRung;

impl Transport for GrpcRung {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            let mut request = tonic::Request::new(req.clone());
            request.set_timeout(timeout);
            crate::trace::inject(request.metadata_mut());
            peer.grpc()
                .model_infer(request)
                .await
                .map_err(PathError::Status)
        })
    }
}

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

/// RDMA between hosts that both have a verbs device.
pub struct RdmaRung(RdmaPath);

impl RdmaRung {
    /// The rung over `engine`.
    pub fn new(engine: RdmaEngine) -> Self {
        RdmaRung(RdmaPath::new(engine))
    }
}

impl Transport for RdmaRung {
    fn path(&self) -> Path {
        Path::Rdma
    }

    fn reaches(&self, peer: &Peer) -> bool {
        peer.rdma
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            self.0
                .infer(&peer.node, peer.channel.clone(), req.clone(), timeout)
                .await
                .map_err(|e| match e {
                    RdmaPathError::Status(s) => PathError::Status(s),
                    RdmaPathError::NotApplicable(why) => PathError::NotApplicable(why),
                    RdmaPathError::PathBroken(why) => PathError::Broken(why),
                })
        })
    }

    fn forget(&self, node: &str) {
        self.0.forget(node);
    }
}

/// The transport ladder: rungs in order of preference, the last one always
/// [`GrpcRung`], with fallback to the next rung when one breaks.
pub struct Fallback {
    rungs: Vec<Box<dyn Transport>>,
    ladder: Mutex<Ladder>,
}

impl Fallback {
    /// Rungs as configured (`prefer` order; gRPC added last).
    pub fn new(config: &PathsConfig) -> Self {
        let mut rungs: Vec<Box<dyn Transport>> = Vec::new();
        for path in &config.prefer {
            match path {
                Path::Shm => rungs.push(Box::new(ShmRung::new(
                    config.shm_pool_bytes,
                    config.shm_min_bytes,
                    config.shm_dir.clone(),
                ))),
                Path::Rdma => {
                    if let Some(engine) = &config.rdma {
                        rungs.push(Box::new(RdmaRung::new(engine.clone())));
                    }
                }
                Path::Quic => {
                    if let Some(tls) = &config.tls {
                        rungs.push(Box::new(crate::quic_path::QuicRung::new(tls.clone())));
                    }
                }
                Path::Grpc => {}
            }
        }
        rungs.push(Box::new(GrpcRung));
        Self::with_rungs(rungs, config.reprobe_after)
    }

    /// A ladder over `rungs`, in order; a [`GrpcRung`] is added when the
    /// last is not gRPC.
    pub fn with_rungs(mut rungs: Vec<Box<dyn Transport>>, reprobe_after: Duration) -> Self {
        if rungs.last().is_none_or(|r| r.path() != Path::Grpc) {
            rungs.push(Box::new(GrpcRung));
        }
        let paths: Vec<Path> = rungs.iter().map(|r| r.path()).collect();
        let ladder = Ladder::new(LadderConfig {
            preference: paths.clone(),
            supported: paths,
            reprobe_after,
            ..LadderConfig::default()
        });
        Fallback {
            rungs,
            ladder: Mutex::new(ladder),
        }
    }

    fn index(&self, path: Path) -> usize {
        self.rungs
            .iter()
            .position(|r| r.path() == path)
            .unwrap_or(self.rungs.len() - 1)
    }

    fn ladder(&self) -> std::sync::MutexGuard<'_, Ladder> {
        self.ladder.lock().expect("ladder lock")
    }

    /// Sends `req` down the ladder from the rung it chooses for the node.
    async fn route(
        &self,
        peer: &Peer,
        req: &ModelInferRequest,
        placed: Option<&Placed>,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, PathError> {
        let node = peer.node.as_str();
        let mut advertised = [Path::Grpc; Path::ALL.len()];
        let mut n = 0;
        for rung in &self.rungs {
            if n < advertised.len() && rung.reaches(peer) && rung.suits(req) {
                advertised[n] = rung.path();
                n += 1;
            }
        }
        let mut path = self.ladder().choose(node, &advertised[..n], now());
        let mut suspect: Option<Path> = None;
        // Each step moves down the ladder: at most one call per rung.
        for _ in 0..self.rungs.len() {
            let index = self.index(path);
            let rung = &self.rungs[index];
            let next_down = || {
                self.rungs[index + 1..]
                    .iter()
                    .find(|r| r.reaches(peer) && r.suits(req))
                    .map_or(Path::Grpc, |r| r.path())
            };
            let sent = match placed {
                Some(p) => rung.call_placed(peer, req, p, timeout),
                None => rung.call(peer, req, timeout),
            };
            match sent.await {
                Ok(mut resp) => {
                    // Which path carried it, for callers that report it
                    // (`Client::infer_answered`).
                    resp.extensions_mut().insert(path);
                    let mut ladder = self.ladder();
                    if let Some(broken) = suspect {
                        ladder.on_failure(node, broken, now());
                        tracing::warn!(%node, path = %broken, "path refused a request another path accepted; marked broken");
                    }
                    ladder.on_success(node, path, now());
                    return Ok(resp);
                }
                Err(PathError::Status(s)) => return Err(PathError::Status(s)),
                Err(PathError::Suspect(s)) if path == Path::Grpc => {
                    return Err(PathError::Status(s));
                }
                Err(PathError::Suspect(_)) => {
                    suspect = Some(path);
                    path = next_down();
                }
                Err(PathError::NotApplicable(why)) => {
                    tracing::debug!(%node, %why, %path, "request not suited to the path; next one down");
                    path = next_down();
                }
                Err(PathError::Broken(reason)) if path != Path::Grpc => {
                    let next = self.ladder().on_failure(node, path, now());
                    tracing::warn!(%node, %reason, %path, fallback = %next, "path failed; re-sending the request");
                    path = next;
                }
                Err(e) => return Err(e),
            }
        }
        Err(PathError::Broken(format!(
            "no path to node '{node}' worked"
        )))
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl Transport for Fallback {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.route(peer, req, None, timeout))
    }

    fn call_placed<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        placed: &'a Placed,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.route(peer, req, Some(placed), timeout))
    }

    fn shm_pool(&self) -> Option<ShmPool> {
        self.rungs.iter().find_map(|r| r.shm_pool())
    }

    fn forget(&self, node: &str) {
        self.ladder().forget(node);
        for rung in &self.rungs {
            rung.forget(node);
        }
    }

    fn counters(&self) -> LadderCounters {
        self.ladder().counters()
    }
}
