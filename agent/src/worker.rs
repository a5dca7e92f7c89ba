//! One supervised worker process as the rest of the agent sees it: its
//! state, its connection, its load, and its last output lines.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use infermesh_proto::GrpcInferenceServiceClient;
use tonic::transport::Channel;

use crate::config::WorkerSpec;

/// Lines of worker output kept for the admin API.
pub const OUTPUT_RING_LINES: usize = 200;

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WorkerState {
    /// Spawned, not ready yet: gets no traffic.
    Starting = 0,
    /// Live and its models ready: gets traffic.
    Ready = 1,
    /// The process ended (or never became ready): gets no traffic.
    Exited = 2,
}

impl WorkerState {
    /// Lower-case name used in the admin API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::Exited => "exited",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => WorkerState::Starting,
            1 => WorkerState::Ready,
            _ => WorkerState::Exited,
        }
    }
}

/// What is known about the running process once it is spawned.
#[derive(Debug, Clone)]
pub struct Process {
    /// OS process id (also its process group id).
    pub pid: u32,
    /// Where it serves OIP.
    pub address: SocketAddr,
    /// Client over one HTTP/2 connection to it.
    pub client: GrpcInferenceServiceClient<Channel>,
}

/// A worker: configuration plus live state shared by the supervisor, the
/// OIP front and the admin API.
#[derive(Debug)]
pub struct Worker {
    /// How to run it.
    pub spec: WorkerSpec,
    state: AtomicU8,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    exits: AtomicU64,
    process: RwLock<Option<Process>>,
    models: RwLock<Option<Arc<[String]>>>,
    last_exit: Mutex<Option<String>>,
    output: Mutex<VecDeque<String>>,
}

impl Worker {
    /// A worker not yet spawned. Models given in the spec are known at once.
    pub fn new(spec: WorkerSpec) -> Arc<Self> {
        let models = (!spec.models.is_empty()).then(|| Arc::from(spec.models.clone()));
        Arc::new(Self {
            spec,
            state: AtomicU8::new(WorkerState::Starting as u8),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            exits: AtomicU64::new(0),
            process: RwLock::new(None),
            models: RwLock::new(models),
            last_exit: Mutex::new(None),
            output: Mutex::new(VecDeque::with_capacity(OUTPUT_RING_LINES)),
        })
    }

    /// Worker id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// Current state.
    pub fn state(&self) -> WorkerState {
        WorkerState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, state: WorkerState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// The running process, once spawned.
    pub fn process(&self) -> Option<Process> {
        self.process.read().expect("worker lock").clone()
    }

    pub(crate) fn set_process(&self, p: Option<Process>) {
        *self.process.write().expect("worker lock") = p;
    }

    /// Models it serves; `None` while not yet asked.
    pub fn models(&self) -> Option<Arc<[String]>> {
        self.models.read().expect("worker lock").clone()
    }

    pub(crate) fn set_models(&self, models: Vec<String>) {
        *self.models.write().expect("worker lock") = Some(Arc::from(models));
    }

    /// Whether it serves `model` (false while its models are unknown).
    pub fn hosts(&self, model: &str) -> bool {
        self.models
            .read()
            .expect("worker lock")
            .as_ref()
            .is_some_and(|m| m.iter().any(|x| x == model))
    }

    /// Requests the agent has sent and not yet seen answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes a slot if fewer than `max_inflight` are in use.
    pub(crate) fn try_take_slot(&self) -> bool {
        let max = self.spec.max_inflight;
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    pub(crate) fn release_slot(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests routed to it and finished.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Times its process has ended.
    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }

    /// How it last ended, if it has.
    pub fn last_exit(&self) -> Option<String> {
        self.last_exit.lock().expect("worker lock").clone()
    }

    pub(crate) fn record_exit(&self, how: String) {
        self.exits.fetch_add(1, Ordering::Relaxed);
        *self.last_exit.lock().expect("worker lock") = Some(how);
    }

    /// Keeps a line of its output in the bounded ring.
    pub(crate) fn push_output(&self, line: String) {
        let mut ring = self.output.lock().expect("worker lock");
        if ring.len() == OUTPUT_RING_LINES {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    /// The last `n` output lines, oldest first.
    pub fn last_output(&self, n: usize) -> Vec<String> {
        let ring = self.output.lock().expect("worker lock");
        ring.iter()
            .skip(ring.len().saturating_sub(n))
            .cloned()
            .collect()
    }
}
