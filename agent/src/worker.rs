//! One supervised worker process as the rest of the agent sees it: its
//! state, its connection, its load, and its last output lines.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use infermesh_proto::GrpcInferenceServiceClient;
use tonic::transport::Channel;

use infermesh_sentinel::{Event, State};
use tokio::sync::mpsc;

use crate::config::WorkerSpec;
use crate::health::HealthRecord;
use crate::shm::WorkerShm;

/// Lines of worker output kept for the admin API.
pub const OUTPUT_RING_LINES: usize = 200;

/// Events kept per worker for the admin API.
pub const EVENT_RING: usize = 64;

/// Something the sentinel did or saw, stamped with wall-clock time.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEvent {
    /// Microseconds since the Unix epoch.
    pub unix_micros: u64,
    /// `fault`, `stop_routing`, `resume_routing`, `restart`, `quarantine`,
    /// `spawned`, `ready`, `exited`, `stable`.
    pub kind: &'static str,
    /// Details.
    pub detail: String,
}

/// An input for the worker's driver, from anywhere in the agent.
#[derive(Debug)]
pub enum Input {
    /// An event for the worker's sentinel.
    Sentinel(Event),
    /// An event about one process of the worker (its output, its answers).
    /// Dropped when that process is no longer the current one, so a late
    /// report about a dead process never counts against its replacement.
    Process {
        /// The process the event is about.
        pid: u32,
        /// The event.
        event: Event,
    },
    /// The agent is stopping: stop the worker and end the driver.
    Stop,
}

fn state_to_u8(s: State) -> u8 {
    State::ALL.iter().position(|x| *x == s).unwrap_or(0) as u8
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
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
    routable: AtomicBool,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    restarts: AtomicU64,
    startup_ms: AtomicU64,
    process: RwLock<Option<Process>>,
    models: RwLock<Option<Arc<[String]>>>,
    last_exit: Mutex<Option<String>>,
    last_fault: Mutex<Option<String>>,
    output: Mutex<VecDeque<String>>,
    events: Mutex<VecDeque<WorkerEvent>>,
    health: Mutex<Vec<HealthRecord>>,
    shm: Mutex<WorkerShm>,
    inputs: mpsc::Sender<Input>,
}

impl Worker {
    /// A worker not yet spawned, and the receiving end of its inputs (for
    /// its driver). Models given in the spec are known at once.
    pub fn new(spec: WorkerSpec) -> (Arc<Self>, mpsc::Receiver<Input>) {
        let models = (!spec.models.is_empty()).then(|| Arc::from(spec.models.clone()));
        let (inputs, rx) = mpsc::channel(1024);
        let worker = Arc::new(Self {
            spec,
            state: AtomicU8::new(state_to_u8(State::Starting)),
            routable: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            startup_ms: AtomicU64::new(0),
            process: RwLock::new(None),
            models: RwLock::new(models),
            last_exit: Mutex::new(None),
            last_fault: Mutex::new(None),
            output: Mutex::new(VecDeque::with_capacity(OUTPUT_RING_LINES)),
            events: Mutex::new(VecDeque::with_capacity(EVENT_RING)),
            health: Mutex::new(Vec::new()),
            shm: Mutex::new(WorkerShm::default()),
            inputs,
        });
        (worker, rx)
    }

    /// Sends an input to the worker's driver without waiting. Inputs are
    /// dropped when the driver is gone or 1024 are pending (it is far behind,
    /// and what it already has will restart the worker).
    pub fn report(&self, input: Input) {
        let _ = self.inputs.try_send(input);
    }

    /// Whether new requests may be sent to it (the sentinel says so).
    pub fn routable(&self) -> bool {
        self.routable.load(Ordering::Acquire)
    }

    pub(crate) fn set_routable(&self, routable: bool) {
        self.routable.store(routable, Ordering::Release);
    }

    /// Restarts scheduled since the agent started.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    pub(crate) fn count_restart(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Spawn-to-ready time of the current process (0 if not ready).
    pub fn startup_ms(&self) -> u64 {
        self.startup_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn set_startup_ms(&self, ms: u64) {
        self.startup_ms.store(ms, Ordering::Relaxed);
    }

    /// The last fault, as "reason: detail".
    pub fn last_fault(&self) -> Option<String> {
        self.last_fault.lock().expect("worker lock").clone()
    }

    pub(crate) fn set_last_fault(&self, fault: String) {
        *self.last_fault.lock().expect("worker lock") = Some(fault);
    }

    /// Records a sentinel event with the current wall-clock time.
    pub(crate) fn push_event(&self, kind: &'static str, detail: String) {
        let mut ring = self.events.lock().expect("worker lock");
        if ring.len() == EVENT_RING {
            ring.pop_front();
        }
        ring.push_back(WorkerEvent {
            unix_micros: now_micros(),
            kind,
            detail,
        });
    }

    /// The newest events, oldest first.
    pub fn events(&self) -> Vec<WorkerEvent> {
        self.events
            .lock()
            .expect("worker lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Keeps the newest verdict of each (check, model).
    pub(crate) fn record_health(&self, records: impl IntoIterator<Item = HealthRecord>) {
        let mut kept = self.health.lock().expect("worker lock");
        for r in records {
            let same = |k: &HealthRecord| {
                k.verdict.check == r.verdict.check && k.verdict.model == r.verdict.model
            };
            match kept.iter_mut().find(|k| same(k)) {
                Some(k) => *k = r,
                None => kept.push(r),
            }
        }
    }

    /// The newest verdict of each health check that has run.
    pub fn health(&self) -> Vec<HealthRecord> {
        self.health.lock().expect("worker lock").clone()
    }

    /// Runs `f` on what the agent knows of the worker's shared memory.
    pub(crate) fn shm<R>(&self, f: impl FnOnce(&mut WorkerShm) -> R) -> R {
        f(&mut self.shm.lock().expect("worker lock"))
    }

    /// Worker id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// Current sentinel state.
    pub fn state(&self) -> State {
        State::ALL[self.state.load(Ordering::Acquire) as usize]
    }

    pub(crate) fn set_state(&self, state: State) {
        self.state.store(state_to_u8(state), Ordering::Release);
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

    /// How it last ended, if it has.
    pub fn last_exit(&self) -> Option<String> {
        self.last_exit.lock().expect("worker lock").clone()
    }

    /// Records how the process ended.
    pub(crate) fn record_exit(&self, how: String) {
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
