//! One worker as the rest of the agent sees it: a snapshot its supervisor
//! publishes, and nothing else to write.
//!
//! The supervisor ([`crate::supervision::supervisor`]) is the only writer of a worker's
//! state. It publishes a [`WorkerSnapshot`] on a `watch` channel whenever
//! something changes (state, routability, process, models, last fault); the
//! pool, front, admin API, metrics and registry only read it. Requests to the
//! supervisor go the other way, through the worker's inbox
//! ([`crate::worker::inbox`]). What the supervisor keeps as history (output lines,
//! events, health verdicts) is in [`crate::worker::worker_log`].

use std::net::SocketAddr;
use std::sync::Arc;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_sentinel::State;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::config::WorkerSpec;
use crate::worker::inbox::{Inbox, Reporter};
use crate::worker::upstream::Upstream;
use crate::worker::worker_log::WorkerLog;

/// A running worker process.
#[derive(Debug)]
pub struct Process {
    /// OS process id (also its process group id).
    pub pid: u32,
    /// Where it serves OIP.
    pub address: SocketAddr,
    /// gRPC client for everything but plain inference (probes, metadata,
    /// shared-memory registration, streams).
    pub client: GrpcInferenceServiceClient<Channel>,
    /// The HTTP/2 connection plain `ModelInfer` requests are forwarded on.
    pub upstream: Upstream,
    /// Cancelled when the sentinel gives up on this process's requests
    /// (it stalled or hung): callers waiting on it through `client` are
    /// answered at once. (Those on `upstream` are failed by
    /// [`Upstream::abort`], which costs the hot path nothing.)
    pub abort: CancellationToken,
    /// Requests forwarded to it whose bodies are still arriving (cut-through
    /// uploads, `serving::forward::cut_through`): they may hold all of its
    /// slots but one.
    pub open_uploads: std::sync::atomic::AtomicUsize,
}

/// What is true of a worker at one moment.
#[derive(Debug, Clone)]
pub struct WorkerSnapshot {
    /// Sentinel state.
    pub state: State,
    /// Whether new requests may be sent to it.
    pub routable: bool,
    /// The current process, once spawned and until it exits.
    pub process: Option<Arc<Process>>,
    /// Models it serves; `None` until known (configured or asked).
    pub models: Option<Arc<[String]>>,
    /// Restarts scheduled since the agent started.
    pub restarts: u64,
    /// Spawn-to-ready time of the current process (0 if not ready).
    pub startup_ms: u64,
    /// The last fault, as "reason: detail".
    pub last_fault: Option<String>,
    /// How the last process ended.
    pub last_exit: Option<String>,
}

impl WorkerSnapshot {
    fn initial(spec: &WorkerSpec) -> Self {
        Self {
            state: State::Starting,
            routable: false,
            process: None,
            models: (!spec.models.is_empty()).then(|| Arc::from(spec.models.clone())),
            restarts: 0,
            startup_ms: 0,
            last_fault: None,
            last_exit: None,
        }
    }

    /// Whether it serves `model` (false while its models are unknown).
    pub fn hosts(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_some_and(|m| m.iter().any(|x| x == model))
    }
}

/// A worker: its configuration, its published state, its log, and the way
/// to tell its supervisor something.
#[derive(Debug)]
pub struct Worker {
    /// How to run it.
    pub spec: WorkerSpec,
    /// Position in the pool.
    pub index: usize,
    snapshot: watch::Receiver<Arc<WorkerSnapshot>>,
    log: Arc<WorkerLog>,
    reporter: Reporter,
}

/// The supervisor's end of a worker: the only writer of its state.
#[derive(Debug)]
pub struct WorkerDriver {
    /// Publishes snapshots.
    pub publisher: watch::Sender<Arc<WorkerSnapshot>>,
    /// Control messages and coalesced reports for the supervisor.
    pub inbox: Inbox,
    /// The log the supervisor keeps.
    pub log: Arc<WorkerLog>,
    /// A reporter for the output readers the supervisor starts.
    pub reporter: Reporter,
}

impl Worker {
    /// A worker not yet spawned (`index` in the pool), and the supervisor's
    /// end. Models given in the spec are known at once.
    pub fn new(spec: WorkerSpec, index: usize) -> (Arc<Self>, WorkerDriver) {
        let (publisher, snapshot) = watch::channel(Arc::new(WorkerSnapshot::initial(&spec)));
        let (reporter, inbox) = crate::worker::inbox::channel();
        let log = Arc::new(WorkerLog::default());
        let worker = Arc::new(Self {
            spec,
            index,
            snapshot,
            log: Arc::clone(&log),
            reporter: reporter.clone(),
        });
        let driver = WorkerDriver {
            publisher,
            inbox,
            log,
            reporter,
        };
        (worker, driver)
    }

    /// Worker id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// The latest snapshot.
    pub fn snapshot(&self) -> Arc<WorkerSnapshot> {
        Arc::clone(&self.snapshot.borrow())
    }

    /// A receiver of every later snapshot.
    pub fn watch(&self) -> watch::Receiver<Arc<WorkerSnapshot>> {
        self.snapshot.clone()
    }

    /// Its log (output lines, events, health verdicts).
    pub fn log(&self) -> &WorkerLog {
        &self.log
    }

    /// Where to report to its supervisor.
    pub fn reporter(&self) -> &Reporter {
        &self.reporter
    }
}
