//! The client: discovery → balancer → one gRPC connection per node, with a
//! deadline per call and retries to a different node within a budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_proto::load::LoadReport as WireLoadReport;
use infermesh_proto::registry::{NodeRecord, NodeState as WireState, RegistryUrl};
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
use infermesh_proto::{DEFAULT_MAX_MESSAGE_BYTES, GrpcInferenceServiceClient};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::balancer::{
    Balancer, BalancerConfig, LoadReport, NodeInfo, NodeState, Outcome, PickError,
};
use crate::discovery::{self, Discovery, Membership};
use crate::paths::{Paths, PathsConfig, Peer};
use crate::retry_budget::RetryBudget;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The registry URL is malformed.
    #[error(transparent)]
    Registry(#[from] infermesh_proto::registry::RegistryUrlError),
    /// No node can take the request (none known, all draining or ejected).
    #[error("no node available for service '{service}': {detail}")]
    NoNode {
        /// Service.
        service: String,
        /// Why.
        detail: String,
    },
    /// The node answered with an error (after any retries).
    #[error("{0}")]
    Status(#[from] Status),
    /// A typed helper got an output it could not read.
    #[error("unexpected response: {0}")]
    BadResponse(String),
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    registry: String,
    service: String,
    deadline: Duration,
    max_attempts: usize,
    budget: (f64, f64),
    balancer: BalancerConfig,
    seed: u64,
    paths: PathsConfig,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            registry: "static://127.0.0.1:8001".into(),
            service: "default".into(),
            deadline: Duration::from_secs(10),
            max_attempts: 3,
            budget: (0.2, 10.0),
            balancer: BalancerConfig::default(),
            paths: PathsConfig::default(),
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        }
    }
}

impl ClientBuilder {
    /// Registry URL: `zk://host:port[,...][/chroot]` or `static://host:port,...`.
    pub fn registry(mut self, url: impl Into<String>) -> Self {
        self.registry = url.into();
        self
    }

    /// Service name.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = service.into();
        self
    }

    /// This host's node id (preferred while healthy and not overloaded).
    pub fn local_node(mut self, node_id: impl Into<String>) -> Self {
        self.balancer.local_node = Some(node_id.into());
        self
    }

    /// Deadline of each call, retries included (default 10 s).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Attempts per call, the first included (default 3).
    pub fn max_attempts(mut self, n: usize) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Retry budget: `ratio` of requests plus `per_sec` (default 0.2 + 10/s).
    pub fn retry_budget(mut self, ratio: f64, per_sec: f64) -> Self {
        self.budget = (ratio, per_sec);
        self
    }

    /// Balancer tuning.
    pub fn balancer(mut self, config: BalancerConfig) -> Self {
        let local = self.balancer.local_node.take();
        self.balancer = config;
        if self.balancer.local_node.is_none() {
            self.balancer.local_node = local;
        }
        self
    }

    /// Seed of the balancer's randomness (for reproducible runs).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Transports: preference order, shared-memory pool size, re-probe
    /// time (see [`crate::paths`]). Default: shared memory to the local
    /// node, gRPC inline otherwise.
    pub fn transports(mut self, config: PathsConfig) -> Self {
        self.paths = config;
        self
    }

    /// Starts discovery and returns the client. With ZooKeeper, membership
    /// arrives in the background; calls before it fail with [`ClientError::NoNode`].
    pub async fn build(self) -> Result<Client, ClientError> {
        let url: RegistryUrl = self.registry.parse()?;
        let discovery = discovery::open(&url, &self.service);
        let inner = Arc::new(Inner {
            stats: Mutex::new(HashMap::new()),
            balancer: Mutex::new(Balancer::new(self.balancer.clone(), self.seed)),
            nodes: Mutex::new(HashMap::new()),
            budget: Mutex::new(RetryBudget::new(self.budget.0, self.budget.1)),
            membership: discovery.subscribe(),
            paths: Paths::new(&self.paths),
            config: self,
        });
        let follower = tokio::spawn(follow(Arc::clone(&inner), discovery.subscribe()));
        inner.apply(&inner.membership.borrow().clone());
        Ok(Client {
            inner,
            _discovery: discovery,
            _follower: Arc::new(AbortOnDrop(follower)),
        })
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A client of one service. Cheap to clone; clones share connections and
/// balancing state.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    _discovery: Arc<dyn Discovery>,
    _follower: Arc<AbortOnDrop>,
}

/// What the client has sent to one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    /// Attempts sent (retries included).
    pub attempts: u64,
    /// Attempts that failed.
    pub failures: u64,
    /// When the last attempt was sent, milliseconds since the Unix epoch.
    pub last_attempt_unix_ms: u64,
}

/// A node's record and the connection to it.
struct NodeConn {
    record: NodeRecord,
    client: GrpcInferenceServiceClient<Channel>,
    channel: Channel,
}

struct Inner {
    stats: Mutex<HashMap<String, NodeStats>>,
    balancer: Mutex<Balancer>,
    nodes: Mutex<HashMap<String, NodeConn>>,
    budget: Mutex<RetryBudget>,
    membership: watch::Receiver<Arc<Membership>>,
    paths: Paths,
    config: ClientBuilder,
}

async fn follow(inner: Arc<Inner>, mut rx: watch::Receiver<Arc<Membership>>) {
    while rx.changed().await.is_ok() {
        let m = rx.borrow_and_update().clone();
        inner.apply(&m);
    }
}

/// One connection per node: the OIP client, and the channel under it for
/// the RDMA control path.
fn channel(addr: &str) -> (GrpcInferenceServiceClient<Channel>, Channel) {
    let channel = infermesh_proto::channel::oip_channel(addr, Duration::from_secs(1))
        .expect("validated address");
    let client = GrpcInferenceServiceClient::new(channel.clone())
        .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES);
    (client, channel)
}

impl Inner {
    /// Feeds a membership snapshot to the balancer and the connection pool.
    fn apply(&self, m: &Membership) {
        let infos = m
            .nodes
            .iter()
            .map(|r| NodeInfo {
                id: r.node_id.clone(),
                weight: r.weight,
                state: match r.state {
                    WireState::Serving => NodeState::Serving,
                    WireState::Draining => NodeState::Draining,
                    WireState::Degraded => NodeState::Degraded,
                },
                zone: r.zone.clone(),
            })
            .collect();
        self.balancer
            .lock()
            .expect("balancer lock")
            .set_nodes(Instant::now(), infos);
        let mut nodes = self.nodes.lock().expect("nodes lock");
        nodes.retain(|id, _| m.nodes.iter().any(|r| &r.node_id == id));
        for r in &m.nodes {
            let same = nodes
                .get(&r.node_id)
                .is_some_and(|old| old.record.endpoints.grpc == r.endpoints.grpc);
            if same {
                nodes.get_mut(&r.node_id).expect("present").record = r.clone();
            } else {
                let (client, channel) = channel(&r.endpoints.grpc);
                nodes.insert(
                    r.node_id.clone(),
                    NodeConn {
                        record: r.clone(),
                        client,
                        channel,
                    },
                );
            }
        }
    }

    fn record_attempt(&self, node: &str) {
        let mut stats = self.stats.lock().expect("stats lock");
        let s = stats.entry(node.to_string()).or_default();
        s.attempts += 1;
        s.last_attempt_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
    }

    fn no_node(&self, e: PickError) -> ClientError {
        let known = self.nodes.lock().expect("nodes lock").len();
        ClientError::NoNode {
            service: self.config.service.clone(),
            detail: match e {
                PickError::NoNodes => "no node is registered".to_string(),
                PickError::AllUnavailable => {
                    format!("all {known} node(s) are draining, ejected or already tried")
                }
            },
        }
    }
}

/// How an error counts for the node that produced it, and whether to retry
/// it on another node.
fn classify(status: &Status) -> (Outcome, bool) {
    // tonic reports a connection broken mid-request (the node died) as
    // UNKNOWN with the transport error as its source; a status the node sent
    // has no source. Inference requests are safe to run again, so a broken
    // connection is retried like a refused one.
    if status.code() == Code::Unknown && std::error::Error::source(status).is_some() {
        return (Outcome::Failure, true);
    }
    match status.code() {
        // The node is down, unreachable or restarting its worker: retry elsewhere.
        Code::Unavailable => (Outcome::Failure, true),
        // The node is full: retry elsewhere, but it is healthy.
        Code::ResourceExhausted => (Outcome::Neutral, true),
        Code::Internal | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled => {
            (Outcome::Failure, false)
        }
        // The caller's mistake: says nothing about the node.
        _ => (Outcome::Neutral, false),
    }
}

impl Client {
    /// A builder.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The nodes currently known.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.inner.membership.borrow().nodes.clone()
    }

    /// Requests per transport path: attempts, successes, failures and
    /// fallbacks to the next path down.
    pub fn path_counters(&self) -> infermesh_transport::LadderCounters {
        self.inner.paths.counters()
    }

    /// What the client has sent to each node so far.
    pub fn node_stats(&self) -> HashMap<String, NodeStats> {
        self.inner.stats.lock().expect("stats lock").clone()
    }

    /// A snapshot of membership and its freshness.
    pub fn membership(&self) -> Arc<Membership> {
        self.inner.membership.borrow().clone()
    }

    /// Sends `req` to the best node; on UNAVAILABLE, RESOURCE_EXHAUSTED or a
    /// connection error retries on a different node while the deadline and
    /// the retry budget allow. Returns the response and the node that gave it.
    pub async fn infer_on(
        &self,
        req: ModelInferRequest,
    ) -> Result<(ModelInferResponse, String), ClientError> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.config.deadline;
        let mut tried: Vec<String> = Vec::new();
        let mut last_error: Option<Status> = None;
        inner
            .budget
            .lock()
            .expect("budget lock")
            .on_request(Instant::now());
        loop {
            let now = Instant::now();
            let pick = inner
                .balancer
                .lock()
                .expect("balancer lock")
                .pick(now, &tried);
            let node = match (pick, last_error.take()) {
                (Ok(p), _) => p.node,
                // Nowhere left to retry: the caller gets the real error.
                (Err(_), Some(status)) => return Err(ClientError::Status(status)),
                (Err(e), None) => return Err(inner.no_node(e)),
            };
            let Some((mut client, channel, rdma)) =
                inner.nodes.lock().expect("nodes lock").get(&node).map(|n| {
                    let rdma = n.record.endpoints.rdma.is_some();
                    (n.client.clone(), n.channel.clone(), rdma)
                })
            else {
                tried.push(node);
                continue;
            };
            inner
                .balancer
                .lock()
                .expect("balancer lock")
                .on_send(now, &node);
            inner.record_attempt(&node);
            let timeout = deadline
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            let local = inner.config.balancer.local_node.as_deref() == Some(node.as_str());
            let peer = Peer {
                node: &node,
                local,
                rdma,
                channel: &channel,
            };
            let result = inner.paths.call(peer, &mut client, &req, timeout).await;
            let latency = now.elapsed();
            let done = Instant::now();
            match result {
                Ok(resp) => {
                    let mut b = inner.balancer.lock().expect("balancer lock");
                    b.on_response(done, &node, latency, Outcome::Success);
                    if let Some(r) = WireLoadReport::from_metadata(resp.metadata()) {
                        let report = LoadReport {
                            in_flight: r.in_flight,
                            queued: r.queued,
                            busy_ratio: r.busy_ratio,
                            weight: r.weight,
                        };
                        b.on_load_report(done, &node, report);
                    }
                    return Ok((resp.into_inner(), node));
                }
                Err(status) => {
                    inner
                        .stats
                        .lock()
                        .expect("stats lock")
                        .entry(node.clone())
                        .or_default()
                        .failures += 1;
                    let (outcome, retryable) = classify(&status);
                    inner
                        .balancer
                        .lock()
                        .expect("balancer lock")
                        .on_response(done, &node, latency, outcome);
                    let time_left = Instant::now() < deadline;
                    let attempts_left = tried.len() + 1 < inner.config.max_attempts;
                    if retryable
                        && time_left
                        && attempts_left
                        && inner.budget.lock().expect("budget lock").try_retry(done)
                    {
                        tracing::debug!(%node, code = ?status.code(), "retrying on another node");
                        tried.push(node);
                        last_error = Some(status);
                        continue;
                    }
                    return Err(ClientError::Status(status));
                }
            }
        }
    }

    /// [`Client::infer_on`] without the node id.
    pub async fn infer(&self, req: ModelInferRequest) -> Result<ModelInferResponse, ClientError> {
        self.infer_on(req).await.map(|(r, _)| r)
    }

    /// Typed helper for single-input, single-output FP32 models: sends
    /// `input` (row-major, `shape`) as `input_name` and returns the first
    /// output's values.
    pub async fn infer_f32(
        &self,
        model: &str,
        input_name: &str,
        shape: &[i64],
        input: &[f32],
    ) -> Result<Vec<f32>, ClientError> {
        let req = ModelInferRequest {
            model_name: model.to_string(),
            inputs: vec![InferInputTensor {
                name: input_name.to_string(),
                datatype: "FP32".into(),
                shape: shape.to_vec(),
                ..Default::default()
            }],
            raw_input_contents: vec![f32_to_raw(input).into()],
            ..Default::default()
        };
        let resp = self.infer(req).await?;
        if let Some(raw) = resp.raw_output_contents.first() {
            return raw_to_f32(raw)
                .ok_or_else(|| ClientError::BadResponse("output is not FP32".into()));
        }
        resp.outputs
            .first()
            .and_then(|o| o.contents.as_ref())
            .map(|c| c.fp32_contents.clone())
            .ok_or_else(|| ClientError::BadResponse("no output".into()))
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.inner.config.service)
            .field("registry", &self.inner.config.registry)
            .finish()
    }
}
