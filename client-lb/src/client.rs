//! The client as a stack of layers, top to bottom:
//!
//! 1. **retry** ([`Client::infer_on`]): one deadline per call; retries on a
//!    different node while the deadline, `max_attempts` and the
//!    [`RetryBudget`] allow; a node that answers `NOT_FOUND` for the model
//!    is marked and the call moves on without spending an attempt.
//! 2. **balancer** ([`Stack::start`]): picks a node for the request's model
//!    and counts it in flight in one step under one lock, returning an
//!    [`InFlight`] guard.
//! 3. **node** ([`Stack::attempt`]): one attempt on the picked node within
//!    its per-attempt timeout (from the node's latency, see
//!    [`BalancerConfig::attempt_timeout_factor`]); the guard records the
//!    outcome — success, failure, timeout — and, if the caller's future is
//!    dropped first, records a cancellation (neither) in its `Drop`.
//! 4. **transport** ([`Transport`]): by default the [`Fallback`] ladder
//!    shm → RDMA → gRPC.
//!
//! The layers are plain async functions over shared state rather than
//! `tower::Service`s: the balancer layer must see which nodes a call has
//! already tried and the model it names, and the node layer must hold a
//! guard across the transport call; with tower each would be a
//! request-type extension and a `poll_ready` per layer, for no gain in a
//! library whose stack is fixed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_proto::load::LoadReport as WireLoadReport;
use infermesh_proto::registry::{NodeRecord, NodeState as WireState, RegistryUrl};
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
use tokio::sync::watch;
use tonic::{Code, Status};
use tracing::Instrument;

use crate::balancer::{
    Balancer, BalancerConfig, LoadReport, NodeInfo, NodeState, Outcome, PickError, Ticket,
};
use crate::discovery::{self, Discovery, Membership, Source};
use crate::paths::{Fallback, PathError, PathsConfig, Peer, Placed, Transport};
use crate::retry_budget::RetryBudget;
use crate::verdict::{Verdict, classify};
use infermesh_transport::Path;

/// Registry used when the file names none: one agent on this machine.
pub const DEFAULT_REGISTRY: &str = "static://127.0.0.1:8001";
/// Service used when the file names none.
pub const DEFAULT_SERVICE: &str = "default";
/// Deadline of a call, retries included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
/// Attempts per call, the first included.
pub const DEFAULT_MAX_ATTEMPTS: usize = 3;
/// Retry budget: retries earned per request.
pub const DEFAULT_BUDGET_RATIO: f64 = 0.2;
/// Retry budget: retries earned per second regardless of traffic.
pub const DEFAULT_BUDGET_PER_SEC: f64 = 10.0;

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
    /// The registry cannot be read (nothing listens there, refused, timed
    /// out) and no membership was read before.
    #[error("registry {registry} is unreachable: {reason}")]
    RegistryUnreachable {
        /// The registry URL.
        registry: String,
        /// Its last error.
        reason: String,
    },
    /// No node of the service serves the model: none advertises it as
    /// ready, or every one that did answered `NOT_FOUND`.
    #[error("no node of service '{service}' serves model '{model}'; known: {known}")]
    ModelNotFound {
        /// Service.
        service: String,
        /// The model asked for.
        model: String,
        /// The nodes known and the models each advertises ready (at most
        /// 16 nodes listed).
        known: String,
    },
    /// The call's deadline passed before any node answered.
    #[error("deadline of {deadline:?} exceeded after {attempts} attempt(s){}", last.as_ref().map(|l| format!("; last error: {l}")).unwrap_or_default())]
    DeadlineExceeded {
        /// The call's deadline.
        deadline: Duration,
        /// Attempts sent.
        attempts: u32,
        /// The last attempt's error, if any.
        last: Option<String>,
    },
    /// The node answered with an error (after any retries).
    #[error("{0}")]
    Status(#[from] Status),
    /// A typed helper got an output it could not read.
    #[error("unexpected response: {0}")]
    BadResponse(String),
    /// A leased request cannot be laid out as asked (`Client::lease`: an
    /// unknown datatype or a bad shape; an input read as another type).
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// No shared memory could be leased (the pool is full, or `/dev/shm`
    /// refused the region).
    #[error("cannot lease shared memory: {0}")]
    Lease(#[source] infermesh_transport::ShmError),
}

impl ClientError {
    /// The gRPC code that best describes the error.
    pub fn code(&self) -> Code {
        match self {
            ClientError::Registry(_) => Code::InvalidArgument,
            ClientError::NoNode { .. } | ClientError::RegistryUnreachable { .. } => {
                Code::Unavailable
            }
            ClientError::ModelNotFound { .. } => Code::NotFound,
            ClientError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            ClientError::Status(s) => s.code(),
            ClientError::BadResponse(_) => Code::Internal,
            ClientError::BadRequest(_) => Code::InvalidArgument,
            ClientError::Lease(e) => e.to_status().code(),
        }
    }
}

/// Builds a [`Client`]. Defaults are those of [`crate::ClientConfig`].
#[derive(Clone)]
pub struct ClientBuilder {
    registry: String,
    service: String,
    deadline: Duration,
    max_attempts: usize,
    budget: (f64, f64),
    balancer: BalancerConfig,
    seed: u64,
    paths: PathsConfig,
    transport: Option<Arc<dyn Transport>>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("registry", &self.registry)
            .field("service", &self.service)
            .field("deadline", &self.deadline)
            .field("max_attempts", &self.max_attempts)
            .field("budget", &self.budget)
            .field("balancer", &self.balancer)
            .field("seed", &self.seed)
            .field("paths", &self.paths)
            .field("custom_transport", &self.transport.is_some())
            .finish()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            registry: DEFAULT_REGISTRY.into(),
            service: DEFAULT_SERVICE.into(),
            deadline: DEFAULT_DEADLINE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            budget: (DEFAULT_BUDGET_RATIO, DEFAULT_BUDGET_PER_SEC),
            balancer: BalancerConfig::default(),
            paths: PathsConfig::default(),
            transport: None,
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

    /// Deadline of each call, retries included.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Attempts per call, the first included.
    pub fn max_attempts(mut self, n: usize) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Retry budget: `ratio` of requests plus `per_sec`.
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
        let tls = self.paths.tls.take();
        self.paths = config;
        self.paths.tls = self.paths.tls.take().or(tls);
        self
    }

    /// TLS to agents whose records say they serve TLS: the CA that signed
    /// their certificates and, for agents requiring client certificates,
    /// this client's own (see [`infermesh_tls::TlsFiles`]).
    pub fn tls(mut self, tls: infermesh_tls::ClientTls) -> Self {
        self.paths.tls = Some(tls);
        self
    }

    /// Replaces the transport ladder with `transport` (an in-process
    /// transport for tests and benchmarks, or a ladder of one's own).
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Starts discovery and returns the client. With ZooKeeper, membership
    /// arrives in the background; a call before it waits for the registry's
    /// first membership within its deadline, and fails with
    /// [`ClientError::RegistryUnreachable`] (naming the registry) if the
    /// registry could not be read by then.
    pub async fn build(self) -> Result<Client, ClientError> {
        let url: RegistryUrl = self.registry.parse()?;
        let discovery = discovery::open(&url, &self.service);
        let transport = self
            .transport
            .clone()
            .unwrap_or_else(|| Arc::new(Fallback::new(&self.paths)));
        // Leases come from the pool the shared-memory rung sends from, so
        // that a leased request reaches the local node without a copy.
        let pool = transport
            .shm_pool()
            .unwrap_or_else(|| self.paths.own_pool());
        let stack = Arc::new(Stack {
            core: Mutex::new(Core {
                balancer: Balancer::new(self.balancer.clone(), self.seed),
                peers: HashMap::new(),
                stats: HashMap::new(),
                budget: RetryBudget::new(self.budget.0, self.budget.1),
            }),
            membership: discovery.subscribe(),
            transport,
            pool,
            config: self,
        });
        let follower = tokio::spawn(follow(Arc::clone(&stack), discovery.subscribe()));
        stack.apply(&stack.membership.borrow().clone());
        Ok(Client {
            stack,
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
    stack: Arc<Stack>,
    _discovery: Arc<dyn Discovery>,
    _follower: Arc<AbortOnDrop>,
}

/// What the client has sent to one node (a member; forgotten when it leaves).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    /// Attempts sent (retries included).
    pub attempts: u64,
    /// Attempts that failed (timeouts included).
    pub failures: u64,
    /// Attempts that ran past their per-attempt timeout.
    pub timeouts: u64,
    /// Attempts in flight now.
    pub in_flight: u64,
    /// When the last attempt was sent, milliseconds since the Unix epoch.
    pub last_attempt_unix_ms: u64,
}

/// A call's answer, with who answered and how it travelled.
#[derive(Debug, Clone)]
pub struct Answered {
    /// The response.
    pub response: ModelInferResponse,
    /// The node that gave it.
    pub node: String,
    /// The transport path that carried it, when the transport says (the
    /// [`Fallback`] ladder does; a transport of one's own may not).
    pub path: Option<Path>,
}

/// Everything the balancer layer changes, under one lock.
struct Core {
    balancer: Balancer,
    peers: HashMap<String, Arc<Peer>>,
    stats: HashMap<String, NodeStats>,
    budget: RetryBudget,
}

/// The client's layers and their shared state.
struct Stack {
    core: Mutex<Core>,
    membership: watch::Receiver<Arc<Membership>>,
    transport: Arc<dyn Transport>,
    /// Where `Client::lease` lends regions from.
    pool: infermesh_transport::ShmPool,
    config: ClientBuilder,
}

async fn follow(stack: Arc<Stack>, mut rx: watch::Receiver<Arc<Membership>>) {
    while rx.changed().await.is_ok() {
        let m = rx.borrow_and_update().clone();
        stack.apply(&m);
    }
}

/// The client's clock: tokio's, so that tests under a paused clock see
/// time move as the runtime does.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// An attempt counted in flight on a node. [`InFlight::finish`] records
/// its outcome; dropped unfinished (the caller's future was dropped), it
/// records a cancellation, which counts neither for nor against the node.
pub(crate) struct InFlight<'a> {
    stack: &'a Stack,
    ticket: Option<Ticket>,
    peer: Arc<Peer>,
}

impl InFlight<'_> {
    fn node(&self) -> &str {
        &self.peer.node
    }

    /// Records the outcome (and the load report of a response).
    fn finish(mut self, outcome: Outcome, report: Option<LoadReport>) {
        let ticket = self.ticket.take().expect("finished once");
        let done = now();
        let mut core = self.stack.lock();
        core.balancer.finish(done, &ticket, outcome);
        if let Some(report) = report {
            core.balancer.on_load_report(done, &ticket.node, report);
        }
        if matches!(outcome, Outcome::Failure | Outcome::TimedOut) {
            if let Some(s) = core.stats.get_mut(&ticket.node) {
                s.failures += 1;
                if outcome == Outcome::TimedOut {
                    s.timeouts += 1;
                }
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            // A panic elsewhere must not stop the count from coming down.
            let mut core = self.stack.core.lock().unwrap_or_else(|e| e.into_inner());
            core.balancer.finish(now(), &ticket, Outcome::Cancelled);
        }
    }
}

/// How one attempt ended, as the retry layer sees it.
enum Attempt {
    Done(Box<tonic::Response<ModelInferResponse>>),
    /// Try another node (spends an attempt and the retry budget).
    Retry(Status),
    /// The node does not have the model: try another node for free.
    ModelMissing(Status),
    /// The attempt ran past its per-attempt timeout.
    TimedOut,
    /// Give up with this error.
    Fatal(Status),
}

impl Stack {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().expect("client lock")
    }

    /// Feeds a membership snapshot to the balancer and the connections;
    /// forgets every per-node state of nodes that left.
    fn apply(&self, m: &Membership) {
        let local = self.config.balancer.local_node.as_deref();
        let mut gone = Vec::new();
        {
            let mut core = self.lock();
            let core = &mut *core;
            let mut infos = Vec::with_capacity(m.nodes.len());
            for r in &m.nodes {
                let keep = core
                    .peers
                    .get(&r.node_id)
                    .is_some_and(|p| p.same_endpoints(r));
                if !keep {
                    let tls = self.config.paths.tls.as_ref();
                    match Peer::new(r, local == Some(r.node_id.as_str()), tls) {
                        Ok(peer) => {
                            core.peers.insert(r.node_id.clone(), Arc::new(peer));
                        }
                        Err(e) => {
                            tracing::warn!(node = %r.node_id, error = %e, "node skipped: unusable endpoint");
                            core.peers.remove(&r.node_id);
                            continue;
                        }
                    }
                }
                infos.push(node_info(r));
            }
            core.balancer.set_nodes(now(), infos);
            core.peers.retain(|id, _| {
                let member = m.nodes.iter().any(|r| &r.node_id == id);
                if !member {
                    gone.push(id.clone());
                }
                member
            });
            core.stats
                .retain(|id, _| m.nodes.iter().any(|r| &r.node_id == id));
        }
        for node in gone {
            self.transport.forget(&node);
        }
    }

    /// The balancer layer: picks a node for `model`, never one in `tried`,
    /// and counts the attempt in flight there, under one lock.
    fn start(&self, tried: &[String], model: Option<&str>) -> Result<InFlight<'_>, PickError> {
        let mut core = self.lock();
        let ticket = core.balancer.start(now(), tried, model)?;
        let Some(peer) = core.peers.get(&ticket.node).cloned() else {
            // Only nodes with a peer are given to the balancer.
            unreachable!("a member without a connection");
        };
        let stats = core.stats.entry(ticket.node.clone()).or_default();
        stats.attempts += 1;
        stats.last_attempt_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Ok(InFlight {
            stack: self,
            ticket: Some(ticket),
            peer,
        })
    }

    /// The time the attempt on `node` may take: while another attempt
    /// could follow (on another node), the node's per-attempt timeout capped by half the
    /// call's time left (so that one stalled node cannot use up the whole
    /// deadline); the last attempt, and one to a node with no latency
    /// sample yet, gets all the time left.
    fn attempt_timeout(&self, node: &str, left: Duration, more_attempts: bool) -> Duration {
        if !more_attempts {
            return left;
        }
        match self.lock().balancer.attempt_timeout(node) {
            Some(t) => t.min(left / 2),
            None => left,
        }
    }

    /// The node layer: one attempt within `timeout`; the guard records how
    /// it ended.
    async fn attempt(
        &self,
        guard: InFlight<'_>,
        req: &ModelInferRequest,
        placed: Option<&Placed>,
        timeout: Duration,
    ) -> Attempt {
        let peer = Arc::clone(&guard.peer);
        let call = match placed {
            Some(p) => self.transport.call_placed(&peer, req, p, timeout),
            None => self.transport.call(&peer, req, timeout),
        };
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                guard.finish(Outcome::TimedOut, None);
                return Attempt::TimedOut;
            }
        };
        let status = match result {
            Ok(resp) => {
                let report = WireLoadReport::from_metadata(resp.metadata()).map(|r| LoadReport {
                    in_flight: r.in_flight,
                    queued: r.queued,
                    busy_ratio: r.busy_ratio,
                    weight: r.weight,
                });
                guard.finish(Outcome::Success, report);
                return Attempt::Done(Box::new(resp));
            }
            Err(PathError::Status(s) | PathError::Suspect(s)) => s,
            Err(e @ (PathError::Broken(_) | PathError::NotApplicable(_))) => {
                Status::unavailable(e.to_string())
            }
        };
        let (outcome, verdict) = classify(status);
        guard.finish(outcome, None);
        match verdict {
            Verdict::Retry(s) => Attempt::Retry(s),
            Verdict::ModelMissing(s) => Attempt::ModelMissing(s),
            Verdict::TimedOut => Attempt::TimedOut,
            Verdict::Fatal(s) => Attempt::Fatal(s),
        }
    }

    /// Whether discovery has not read the registry yet (it may be
    /// connecting, or retrying one that is unreachable).
    fn registry_pending(&self) -> bool {
        self.membership.borrow().source == Source::Empty
    }

    /// Waits up to `patience` for discovery's first membership and feeds it
    /// to the balancer; whether it came.
    async fn wait_for_registry(&self, patience: Duration) -> bool {
        let mut rx = self.membership.clone();
        let heard =
            tokio::time::timeout(patience, rx.wait_for(|m| m.source != Source::Empty)).await;
        match heard {
            Ok(Ok(m)) => {
                let m = m.clone();
                // The follower applies it too; applying is idempotent, and
                // the pick that follows must see it.
                self.apply(&m);
                true
            }
            _ => false,
        }
    }

    fn no_node(&self, e: PickError, model: Option<&str>) -> ClientError {
        let service = self.config.service.clone();
        match (e, model) {
            (PickError::NoModel, Some(model)) => ClientError::ModelNotFound {
                service,
                model: model.to_string(),
                known: known_models(&self.membership.borrow().nodes),
            },
            (PickError::NoNodes, _) => {
                let m = self.membership.borrow().clone();
                let registry = self.config.registry.clone();
                match (&m.unreachable, m.source) {
                    (Some(reason), _) => ClientError::RegistryUnreachable {
                        registry,
                        reason: reason.clone(),
                    },
                    (None, Source::Empty) => ClientError::NoNode {
                        service,
                        detail: format!("the registry {registry} has not answered yet"),
                    },
                    (None, _) => ClientError::NoNode {
                        service,
                        detail: "no node is registered".into(),
                    },
                }
            }
            _ => {
                let known = self.lock().peers.len();
                ClientError::NoNode {
                    service,
                    detail: format!("all {known} node(s) are draining, ejected or already tried"),
                }
            }
        }
    }
}

/// What discovery says about a node, for the balancer.
fn node_info(r: &NodeRecord) -> NodeInfo {
    NodeInfo {
        id: r.node_id.clone(),
        weight: r.weight,
        state: match r.state {
            WireState::Serving => NodeState::Serving,
            WireState::Draining => NodeState::Draining,
            WireState::Degraded => NodeState::Degraded,
        },
        zone: r.zone.clone(),
        // A node that lists no models (a static list) may be sent any.
        models: (!r.models.is_empty()).then(|| {
            r.models
                .iter()
                .filter(|m| m.ready)
                .map(|m| m.name.clone())
                .collect()
        }),
    }
}

/// `node-a [dense], node-b [other, x (not ready)]`, at most 16 nodes.
fn known_models(nodes: &[NodeRecord]) -> String {
    const MAX: usize = 16;
    if nodes.is_empty() {
        return "no nodes".into();
    }
    let mut out: Vec<String> = nodes
        .iter()
        .take(MAX)
        .map(|r| {
            let models: Vec<String> = r
                .models
                .iter()
                .map(|m| {
                    if m.ready {
                        m.name.clone()
                    } else {
                        format!("{} (not ready)", m.name)
                    }
                })
                .collect();
            format!("{} [{}]", r.node_id, models.join(", "))
        })
        .collect();
    if nodes.len() > MAX {
        out.push(format!("and {} more", nodes.len() - MAX));
    }
    out.join(", ")
}

impl Client {
    /// A builder.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The nodes currently known.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.stack.membership.borrow().nodes.clone()
    }

    /// Requests per transport path: attempts, successes, failures and
    /// fallbacks to the next path down.
    pub fn path_counters(&self) -> infermesh_transport::LadderCounters {
        self.stack.transport.counters()
    }

    /// What the client has sent to each member node so far.
    pub fn node_stats(&self) -> HashMap<String, NodeStats> {
        let core = self.stack.lock();
        let mut stats = core.stats.clone();
        for (node, s) in &mut stats {
            s.in_flight = core.balancer.in_flight(node).unwrap_or(0);
        }
        stats
    }

    /// A snapshot of membership and its freshness.
    pub fn membership(&self) -> Arc<Membership> {
        self.stack.membership.borrow().clone()
    }

    /// The shared-memory pool leases come from (its counters show the
    /// regions leased, views included).
    pub fn shm_pool(&self) -> &infermesh_transport::ShmPool {
        &self.stack.pool
    }

    /// Sends `req` to the best node serving its model; on UNAVAILABLE,
    /// RESOURCE_EXHAUSTED, a connection error or a per-attempt timeout
    /// retries on a different node while the deadline, `max_attempts` and
    /// the retry budget allow; on NOT_FOUND marks the model missing on that
    /// node and tries another. Returns the response and the node that gave it.
    pub async fn infer_on(
        &self,
        req: ModelInferRequest,
    ) -> Result<(ModelInferResponse, String), ClientError> {
        self.infer_answered(req).await.map(|a| (a.response, a.node))
    }

    /// [`Client::infer_on`], with the transport path that carried the
    /// answer as well.
    pub async fn infer_answered(&self, req: ModelInferRequest) -> Result<Answered, ClientError> {
        // A span per call (and one per attempt below): with an OpenTelemetry
        // layer installed, each attempt carries `traceparent` (crate::trace).
        let span = tracing::info_span!(
            "infermesh.infer",
            otel.kind = "client",
            model = %req.model_name,
        );
        self.infer_traced(req, None).instrument(span).await
    }

    /// The retry layer; `placed`: the request's inputs lie in a leased
    /// region (`Client::infer_leased`).
    pub(crate) async fn infer_traced(
        &self,
        req: ModelInferRequest,
        placed: Option<&Placed>,
    ) -> Result<Answered, ClientError> {
        let stack = &*self.stack;
        let config = &stack.config;
        let start = now();
        let deadline = start + config.deadline;
        let model = (!req.model_name.is_empty()).then_some(req.model_name.as_str());
        let mut tried: Vec<String> = Vec::new();
        // Attempts sent, and those counted against `max_attempts` (a
        // NOT_FOUND is not).
        let mut attempts = 0u32;
        let mut counted = 0usize;
        let mut last_error: Option<Status> = None;
        let mut timed_out = false;
        stack.lock().budget.on_request(start);
        loop {
            let left = deadline.saturating_duration_since(now());
            if left.is_zero() {
                return Err(ClientError::DeadlineExceeded {
                    deadline: config.deadline,
                    attempts,
                    last: last_error.map(|s| s.to_string()),
                });
            }
            let guard = match (stack.start(&tried, model), last_error.take()) {
                (Ok(guard), _) => guard,
                (Err(PickError::NoModel), _) => {
                    return Err(stack.no_node(PickError::NoModel, model));
                }
                // Nowhere left to retry: the caller gets the real error.
                (Err(_), _) if timed_out => {
                    return Err(ClientError::DeadlineExceeded {
                        deadline: config.deadline,
                        attempts,
                        last: None,
                    });
                }
                (Err(_), Some(status)) => return Err(ClientError::Status(status)),
                // The registry has not been read yet (connecting, or
                // unreachable so far): wait for it within the deadline, then
                // pick again; past the deadline the error says which.
                (Err(PickError::NoNodes), None) if stack.registry_pending() => {
                    if stack.wait_for_registry(left).await {
                        continue;
                    }
                    return Err(stack.no_node(PickError::NoNodes, model));
                }
                (Err(e), None) => return Err(stack.no_node(e, model)),
            };
            let node = guard.node().to_string();
            attempts += 1;
            counted += 1;
            // Another attempt can follow only if the limit allows one and
            // some other node could take it: with none (a one-node
            // service), a per-attempt timeout would only fail the call
            // early, so the attempt gets the whole time left.
            let more = counted < config.max_attempts
                && stack.lock().balancer.has_other(now(), &tried, &node, model);
            let timeout = stack
                .attempt_timeout(&node, left, more)
                .max(Duration::from_millis(1));
            let result = stack
                .attempt(guard, &req, placed, timeout)
                .instrument(tracing::info_span!(
                    "infermesh.attempt",
                    otel.kind = "client",
                    %node,
                    attempt = attempts,
                ))
                .await;
            let retry =
                |stack: &Stack| more && now() < deadline && stack.lock().budget.try_retry(now());
            match result {
                Attempt::Done(resp) => {
                    let path = resp.extensions().get::<Path>().copied();
                    return Ok(Answered {
                        response: resp.into_inner(),
                        node,
                        path,
                    });
                }
                Attempt::ModelMissing(status) => {
                    if let Some(model) = model {
                        stack.lock().balancer.model_missing(&node, model);
                    }
                    tracing::debug!(%node, ?model, "node does not have the model; trying another");
                    // Not an attempt against the limit: the node is now
                    // excluded for this model, so this cannot repeat forever.
                    counted -= 1;
                    tried.push(node);
                    last_error = Some(status);
                }
                Attempt::TimedOut => {
                    if !retry(stack) {
                        return Err(ClientError::DeadlineExceeded {
                            deadline: config.deadline,
                            attempts,
                            last: Some(format!(
                                "attempt on node '{node}' timed out after {timeout:?}"
                            )),
                        });
                    }
                    tracing::debug!(%node, ?timeout, "attempt timed out; retrying on another node");
                    timed_out = true;
                    tried.push(node);
                }
                Attempt::Retry(status) => {
                    if !retry(stack) {
                        tracing::debug!(
                            %node,
                            code = ?status.code(),
                            attempts,
                            more,
                            "attempt failed; no retry (attempt limit, no other node, deadline or retry budget)"
                        );
                        return Err(ClientError::Status(status));
                    }
                    tracing::debug!(%node, code = ?status.code(), "retrying on another node");
                    tried.push(node);
                    last_error = Some(status);
                }
                Attempt::Fatal(status) if status.code() == Code::DeadlineExceeded => {
                    return Err(ClientError::DeadlineExceeded {
                        deadline: config.deadline,
                        attempts,
                        last: Some(status.to_string()),
                    });
                }
                Attempt::Fatal(status) => return Err(ClientError::Status(status)),
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
            .field("service", &self.stack.config.service)
            .field("registry", &self.stack.config.registry)
            .finish()
    }
}
