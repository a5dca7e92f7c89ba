//! The pool of local workers and the admission path of every request.
//!
//! A request is first *admitted* ([`Pool::admit`]: counted in the node's
//! in-flight, which drives the busy ratio and the load report), then
//! *dispatched* ([`Pool::acquire`]): it takes a permit of the ready worker
//! hosting its model with the fewest requests in flight (ties broken by a
//! rotating start). How many permits a worker has is its adaptive
//! concurrency limit ([`crate::concurrency`]: learned from its latencies,
//! at most its `max_inflight`), updated as its requests complete. When every such worker is full
//! it waits in its model's FIFO queue, bounded by `queue.capacity`; a full
//! queue is refused at once with RESOURCE_EXHAUSTED so the client retries
//! elsewhere instead of waiting, and a request whose deadline passes in the
//! queue gets DEADLINE_EXCEEDED. A model with no ready worker is never
//! queued for: UNAVAILABLE at once, and queued requests are failed the
//! moment the last worker for their model stops being routable.
//!
//! **Hand-off.** A finished request ([`Lease`] dropped) gives its permit
//! directly to the oldest waiter that worker can serve (oldest across the
//! queues of the models it hosts): one wake-up per completion, FIFO order,
//! and newcomers cannot overtake queued requests — a new request only takes
//! a free permit when nobody is queued for its model. All of it is one small
//! critical section under one lock.
//!
//! Routability comes from the workers' snapshots: the supervisor publishes,
//! then calls [`Pool::worker_changed`], which copies what dispatch needs
//! (routable, models, process) and hands out or revokes accordingly.
//!
//! **Progress.** Each worker's [`ProgressMeter`] sees every permit taken
//! and given back, answered by the worker or abandoned; the supervisor
//! reads it ([`Pool::progress`]) for the stall watchdog.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use infermesh_proto::load::LoadReport;
use infermesh_sentinel::{Progress, ProgressMeter, State};
use tokio::sync::oneshot;

use crate::busy::{BusyWindow, RateWindow};
use crate::capacity;
use crate::concurrency::{Dispatch, Limiter};
use crate::config::Weight;
use crate::error::AgentError;
use crate::models::{ModelId, Models};
use crate::state::{Process, Worker};

/// How old the slow figures of a response's load report may be
/// ([`Pool::report`]): one bucket of the busy window.
pub const REPORT_REFRESH: Duration = crate::busy::BUCKET;

/// The load report of one response ([`Pool::report`]).
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// In flight, queued and weight now; busy ratio of `snapshot`.
    pub load: LoadReport,
    /// The whole report as last taken, at most [`REPORT_REFRESH`] ago.
    pub snapshot: LoadReport,
    /// Requests completed per second over the last 10 s, when `snapshot`
    /// was taken.
    pub rps: f64,
}

/// All workers of this agent and the dispatch state over them.
#[derive(Debug)]
pub struct Pool {
    workers: Vec<Arc<Worker>>,
    models: Models,
    weight: Weight,
    queue_capacity: usize,
    sched: Mutex<Sched>,
    stopping: AtomicBool,
    draining: AtomicBool,
    orca: AtomicBool,
}

#[derive(Debug)]
struct Sched {
    slots: Vec<Slot>,
    /// One FIFO per model id.
    queues: Vec<VecDeque<Waiter>>,
    queued: usize,
    in_flight: u64,
    busy: BusyWindow,
    /// Requests completed per second (ORCA's `rps_fractional`).
    completions: RateWindow,
    /// The last [`Pool::report`] snapshot and when it was taken.
    snapshot: Option<(Instant, LoadReport, f64)>,
    next_seq: u64,
    cursor: usize,
    routable: usize,
    closed: bool,
}

/// What dispatch knows of one worker (copied from its snapshot).
#[derive(Debug)]
struct Slot {
    routable: bool,
    models: Vec<ModelId>,
    process: Option<Arc<Process>>,
    in_flight: usize,
    requests: u64,
    /// How many permits it has: learned, at most `max_inflight`; and the
    /// capacity that follows.
    limiter: Limiter,
    /// Health factor of the worker's GPU and the host (`capacity`).
    health: f64,
    /// Requests outstanding and answered, for the stall watchdog.
    progress: ProgressMeter,
}

#[derive(Debug)]
struct Waiter {
    seq: u64,
    /// Only a permit of this worker will do (a stream pinned to it).
    pin: Option<usize>,
    tx: oneshot::Sender<Result<Lease, AgentError>>,
}

enum Pick {
    Got(usize),
    AllBusy,
    NoneReady,
}

fn lock(m: &Mutex<Sched>) -> MutexGuard<'_, Sched> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The stall watchdog's clock, given the time just read: under the agent's
/// own tests tokio's (so a paused clock drives the watchdog), otherwise
/// that time, so the hot path reads the clock once.
fn watchdog_clock(now: Instant) -> Instant {
    #[cfg(test)]
    {
        let _ = now;
        tokio::time::Instant::now().into_std()
    }
    #[cfg(not(test))]
    now
}

impl Pool {
    /// A pool over `workers` (each knowing its index), advertising `weight`
    /// (a number when all are ready, or the live capacity).
    pub fn new(
        workers: Vec<Arc<Worker>>,
        weight: impl Into<Weight>,
        queue_capacity: usize,
    ) -> Arc<Self> {
        let slots = workers
            .iter()
            .map(|w| Slot {
                limiter: Limiter::new(w.spec.max_inflight, w.index as u64 + 1),
                health: 1.0,
                routable: false,
                models: Vec::new(),
                process: None,
                in_flight: 0,
                requests: 0,
                progress: ProgressMeter::default(),
            })
            .collect();
        let pool = Arc::new(Self {
            workers,
            models: Models::default(),
            weight: weight.into(),
            queue_capacity,
            sched: Mutex::new(Sched {
                slots,
                queues: Vec::new(),
                queued: 0,
                in_flight: 0,
                busy: BusyWindow::default(),
                completions: RateWindow::default(),
                snapshot: None,
                next_seq: 0,
                cursor: 0,
                routable: 0,
                closed: false,
            }),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            orca: AtomicBool::new(false),
        });
        for w in &pool.workers {
            pool.worker_changed(w.index);
        }
        pool
    }

    /// The workers.
    pub fn workers(&self) -> &[Arc<Worker>] {
        &self.workers
    }

    /// The models the workers serve.
    pub fn models(&self) -> &Models {
        &self.models
    }

    /// Counts a request as in flight at this node until the ticket drops.
    pub fn admit(self: &Arc<Self>) -> Ticket {
        let mut s = lock(&self.sched);
        if s.in_flight == 0 {
            s.busy.start(Instant::now());
        }
        s.in_flight += 1;
        Ticket {
            pool: Arc::clone(self),
        }
    }

    /// Takes a permit on a ready worker hosting `model` (only worker `pin`
    /// if given), queueing while all are busy, until `deadline`.
    pub async fn acquire(
        self: &Arc<Self>,
        model: ModelId,
        pin: Option<usize>,
        deadline: Option<Instant>,
    ) -> Result<Lease, AgentError> {
        let (seq, rx) = {
            let mut s = lock(&self.sched);
            if s.closed {
                return Err(AgentError::ShuttingDown);
            }
            let pick = s.pick(model, pin);
            let nobody_waits = s.queues.get(model.index()).is_none_or(VecDeque::is_empty);
            match pick {
                Pick::Got(w) if nobody_waits => return Ok(s.lease(self, w, model)),
                Pick::NoneReady => return Err(self.no_ready_worker(model)),
                Pick::Got(_) | Pick::AllBusy => {}
            }
            if s.queues[model.index()].len() >= self.queue_capacity {
                return Err(AgentError::QueueFull {
                    model: self.models.name(model).to_string(),
                    capacity: self.queue_capacity,
                });
            }
            let (tx, rx) = oneshot::channel();
            let seq = s.next_seq;
            s.next_seq += 1;
            s.queues[model.index()].push_back(Waiter { seq, pin, tx });
            s.queued += 1;
            // A permit may be free on a worker the queue's head cannot use
            // (pinned elsewhere): hand out what can be handed out.
            if let Pick::Got(w) = pick {
                s.hand_off(self, w);
            }
            (seq, rx)
        };
        let mut spot = QueueSpot {
            pool: self,
            model,
            seq,
            rx,
        };
        let outcome = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), &mut spot.rx).await,
            None => Ok((&mut spot.rx).await),
        };
        match outcome {
            Ok(Ok(result)) => result,
            // The pool is gone: the agent is being torn down.
            Ok(Err(_)) => Err(AgentError::ShuttingDown),
            Err(_) => Err(AgentError::DeadlineInQueue(
                self.models.name(model).to_string(),
            )),
        }
    }

    fn no_ready_worker(&self, model: ModelId) -> AgentError {
        AgentError::NoReadyWorker(self.models.name(model).to_string())
    }

    /// Re-reads worker `index`'s snapshot: a worker that became routable
    /// takes queued requests, one that stopped fails those nobody else can
    /// take. Its supervisor calls this after each publish.
    pub fn worker_changed(self: &Arc<Self>, index: usize) {
        let snapshot = self.workers[index].snapshot();
        let mut models = Vec::new();
        for name in snapshot.models.iter().flat_map(|m| m.iter()) {
            match self.models.intern(name) {
                Ok(id) => models.push(id),
                Err(e) => {
                    tracing::warn!(worker = %self.workers[index].id(), model = %name.escape_debug(), error = %e, "model not served")
                }
            }
        }
        let routable = snapshot.routable && snapshot.process.is_some();
        let mut s = lock(&self.sched);
        if let Some(max) = models.iter().map(|m| m.index() + 1).max() {
            if s.queues.len() < max {
                s.queues.resize_with(max, VecDeque::new);
            }
        }
        let slot = &mut s.slots[index];
        let was = slot.routable;
        slot.routable = routable;
        slot.models = models;
        let fresh = match (&slot.process, &snapshot.process) {
            (Some(old), Some(new)) => !Arc::ptr_eq(old, new),
            (None, Some(_)) => true,
            _ => false,
        };
        if fresh {
            let now = watchdog_clock(Instant::now());
            slot.progress.new_process(now);
            slot.limiter.restarted(now);
        }
        slot.process = snapshot.process.clone();
        match (was, routable) {
            (false, true) => {
                s.routable += 1;
                s.hand_off(self, index);
            }
            (true, false) => {
                s.routable -= 1;
                s.fail_stranded(self, index);
            }
            _ => {}
        }
    }

    /// Refuses new requests and fails every queued one (shutdown).
    pub fn close(&self) {
        let waiters: Vec<Waiter> = {
            let mut s = lock(&self.sched);
            s.closed = true;
            s.queued = 0;
            s.queues.iter_mut().flat_map(|q| q.drain(..)).collect()
        };
        for w in waiters {
            let _ = w.tx.send(Err(AgentError::ShuttingDown));
        }
    }

    fn release(
        self: &Arc<Self>,
        worker: usize,
        dispatch: Dispatch,
        served: bool,
        answered: Option<Instant>,
    ) {
        let mut s = lock(&self.sched);
        let slot = &mut s.slots[worker];
        slot.in_flight -= 1;
        slot.requests += 1;
        let at = watchdog_clock(Instant::now());
        // Only answers are latency samples: a worker failing fast must not
        // look fast. The permit's time counts either way.
        let was = (slot.limiter.probing(), slot.limiter.limit());
        slot.limiter.finish(at, dispatch, served);
        if was != (slot.limiter.probing(), slot.limiter.limit()) {
            tracing::debug!(
                worker = %self.workers[worker].id(),
                limit = slot.limiter.limit(),
                probing = slot.limiter.probing(),
                concurrency = ?slot.limiter.concurrency(),
                unloaded = ?slot.limiter.unloaded(),
                capacity = ?slot.limiter.capacity(),
                "concurrency limit"
            );
        }
        match answered {
            Some(started) => slot
                .progress
                .answered(at, at.saturating_duration_since(started)),
            None => slot.progress.abandoned(at),
        }
        if slot.routable {
            s.hand_off(self, worker);
        }
    }

    /// Whether a GPU fault quarantined any worker (the node is degraded).
    pub fn degraded(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.snapshot().state == State::Quarantined)
    }

    /// Whether any worker is ready.
    pub fn any_ready(&self) -> bool {
        lock(&self.sched).routable > 0
    }

    /// A ready worker hosting `model` (least loaded) and its process, for
    /// calls that take no permit.
    pub fn any_ready_for(&self, model: &str) -> Option<(Arc<Worker>, Arc<Process>)> {
        let id = self.models.id(model)?;
        let s = lock(&self.sched);
        let (i, slot) = s
            .slots
            .iter()
            .enumerate()
            .filter(|(_, sl)| sl.routable && sl.models.contains(&id))
            .min_by_key(|(_, sl)| sl.in_flight)?;
        Some((
            Arc::clone(&self.workers[i]),
            Arc::clone(slot.process.as_ref()?),
        ))
    }

    /// Whether `model` has a ready worker.
    pub fn model_ready(&self, model: &str) -> bool {
        self.any_ready_for(model).is_some()
    }

    /// Why `model` cannot be served right now, when it cannot: unknown on
    /// this node (NOT_FOUND), or hosted but without a ready worker.
    pub fn unavailable_reason(&self, model: &str) -> AgentError {
        let hosted = self.models.id(model).is_some();
        // A worker still starting may not have told us its models yet.
        let unknown = self.workers.iter().any(|w| {
            let s = w.snapshot();
            s.models.is_none() && s.state != State::Quarantined
        });
        if hosted || unknown {
            AgentError::NoReadyWorker(crate::error::echo(model))
        } else {
            AgentError::UnknownModel(crate::error::echo(model))
        }
    }

    /// Every model any worker serves, and whether it has a ready worker.
    pub fn model_readiness(&self) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = Vec::new();
        for w in &self.workers {
            let snap = w.snapshot();
            for m in snap.models.iter().flat_map(|m| m.iter()) {
                match out.iter_mut().find(|(n, _)| n == m) {
                    Some(e) => e.1 |= snap.routable,
                    None => out.push((m.clone(), snap.routable)),
                }
            }
        }
        out
    }

    /// What the stall watchdog sees of worker `index` now.
    pub fn progress(&self, index: usize) -> Progress {
        lock(&self.sched).slots[index]
            .progress
            .observe(watchdog_clock(Instant::now()))
    }

    /// Worker `index` sent part of an answer (a streamed response) without
    /// finishing a request.
    pub fn progressed(&self, index: usize) {
        lock(&self.sched).slots[index]
            .progress
            .progressed(watchdog_clock(Instant::now()));
    }

    /// Requests in flight on worker `index` and requests it has finished.
    pub fn worker_load(&self, index: usize) -> (usize, u64) {
        let s = lock(&self.sched);
        (s.slots[index].in_flight, s.slots[index].requests)
    }

    /// The advertised weight: the configured number × share of workers
    /// routable, or (`weight = "auto"`) the live capacity of the routable
    /// workers in requests per second (see [`capacity`]).
    pub fn weight(&self) -> f64 {
        self.weight_with(&lock(&self.sched))
    }

    fn weight_with(&self, s: &Sched) -> f64 {
        if self.workers.is_empty() {
            return 0.0;
        }
        match self.weight {
            Weight::Fixed(w) => w * s.routable as f64 / self.workers.len() as f64,
            // In thousandths, as the trailer writes it, so every encoding of
            // the report (trailer, ORCA, registry) carries the same number.
            Weight::Auto => {
                let w = capacity::node_capacity(s.slots.iter().map(|sl| {
                    (
                        sl.limiter.capacity(),
                        sl.routable,
                        sl.health,
                        sl.limiter.concurrency().unwrap_or(1.0),
                    )
                }));
                (w * 1000.0).round() / 1000.0
            }
        }
    }

    /// The capacity score: the configured number, or the live capacity of
    /// all workers, ready or not.
    pub fn score(&self) -> f64 {
        match self.weight {
            Weight::Fixed(w) => w,
            Weight::Auto => capacity::node_capacity(lock(&self.sched).slots.iter().map(|sl| {
                (
                    sl.limiter.capacity(),
                    true,
                    1.0,
                    sl.limiter.concurrency().unwrap_or(1.0),
                )
            })),
        }
    }

    /// Sets each worker's health factor (`health[i]` for worker `i`;
    /// missing ones are 1), every [`capacity::TICK`].
    pub fn set_health(&self, health: &[f64]) {
        let mut s = lock(&self.sched);
        for (i, slot) in s.slots.iter_mut().enumerate() {
            slot.health = health.get(i).copied().unwrap_or(1.0);
        }
    }

    /// Worker `index` says how many requests it runs at once (its
    /// ModelConfig): the starting point of its limit until measured.
    pub fn hint_parallelism(self: &Arc<Self>, index: usize, parallelism: usize) {
        let mut s = lock(&self.sched);
        s.slots[index].limiter.hint(parallelism);
        if s.slots[index].routable {
            s.hand_off(self, index);
        }
    }

    /// Each worker's limit, learned concurrency, unloaded latency and
    /// capacity in requests per second (the last three once measured).
    pub fn worker_limits(&self) -> Vec<WorkerLimit> {
        lock(&self.sched)
            .slots
            .iter()
            .map(|sl| WorkerLimit {
                limit: sl.limiter.limit(),
                probing: sl.limiter.probing(),
                concurrency: sl.limiter.concurrency(),
                unloaded: sl.limiter.unloaded(),
                capacity: sl.limiter.capacity(),
            })
            .collect()
    }

    /// The node's current load.
    pub fn load(&self) -> LoadReport {
        self.load_and_rate().0
    }

    /// The node's current load and its requests completed per second over
    /// the last 10 s, under one lock.
    pub fn load_and_rate(&self) -> (LoadReport, f64) {
        let mut s = lock(&self.sched);
        self.take_load(&mut s, Instant::now())
    }

    fn take_load(&self, s: &mut Sched, now: Instant) -> (LoadReport, f64) {
        let report = LoadReport {
            in_flight: s.in_flight,
            queued: s.queued as u64,
            busy_ratio: s.busy.ratio(now),
            weight: self.weight_with(s),
        };
        (report, s.completions.per_second(now))
    }

    /// The load report a response carries: in flight, queued and weight as
    /// they are now; busy ratio and rate from a snapshot taken at most
    /// [`REPORT_REFRESH`] ago (both are 10 s windows). A change of weight
    /// (a worker ready or gone, a new capacity step) takes a new snapshot at
    /// once, so a client never reads a stale weight — a node that just
    /// became ready is not passed over as weight 0.
    ///
    /// A snapshot's values repeat on every response until the next one, so
    /// HPACK sends them as an index into the connection's table instead of
    /// Huffman-coding them on every response; see `load_report.rs`.
    pub fn report(&self) -> Report {
        let mut s = lock(&self.sched);
        let now = Instant::now();
        let weight = self.weight_with(&s);
        let (snapshot, rps) = match s.snapshot {
            Some((at, report, rps))
                if report.weight == weight
                    && now.saturating_duration_since(at) < REPORT_REFRESH =>
            {
                (report, rps)
            }
            _ => {
                let (report, rps) = self.take_load(&mut s, now);
                s.snapshot = Some((now, report, rps));
                (report, rps)
            }
        };
        Report {
            load: LoadReport {
                in_flight: s.in_flight,
                queued: s.queued as u64,
                ..snapshot
            },
            snapshot,
            rps,
        }
    }

    /// Marks the agent as stopping (readiness turns false).
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether the agent is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether responses carry the ORCA load report (`[transport] orca`).
    pub fn set_orca(&self, on: bool) {
        self.orca.store(on, Ordering::Relaxed);
    }

    /// Whether responses carry the ORCA load report.
    pub fn orca(&self) -> bool {
        self.orca.load(Ordering::Relaxed)
    }

    /// Marks the node drained by an operator (or not). Requests are still
    /// served; the registry record and readiness tell clients to go elsewhere.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::SeqCst);
    }

    /// Whether an operator drained the node.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

impl Sched {
    /// The least-loaded routable worker hosting `model` with a free permit.
    fn pick(&mut self, model: ModelId, pin: Option<usize>) -> Pick {
        let n = self.slots.len();
        let offset = self.cursor;
        self.cursor = self.cursor.wrapping_add(1);
        let mut best: Option<(usize, usize)> = None;
        let mut hosted = false;
        for k in 0..n {
            let i = (offset + k) % n.max(1);
            let slot = &self.slots[i];
            if !slot.routable || !slot.models.contains(&model) || pin.is_some_and(|p| p != i) {
                continue;
            }
            hosted = true;
            if slot.in_flight < slot.limiter.limit()
                && best.is_none_or(|(_, load)| slot.in_flight < load)
            {
                best = Some((i, slot.in_flight));
            }
        }
        match (best, hosted) {
            (Some((i, _)), _) => Pick::Got(i),
            (None, true) => Pick::AllBusy,
            (None, false) => Pick::NoneReady,
        }
    }

    fn lease(&mut self, pool: &Arc<Pool>, worker: usize, model: ModelId) -> Lease {
        let slot = &mut self.slots[worker];
        slot.in_flight += 1;
        let started = watchdog_clock(Instant::now());
        let dispatch = slot.limiter.start(started);
        slot.progress.dispatched(started);
        Lease {
            pool: Arc::clone(pool),
            worker,
            model,
            process: Arc::clone(
                slot.process
                    .as_ref()
                    .expect("routable slots have a process"),
            ),
            armed: true,
            served: false,
            answered: false,
            started,
            dispatch,
        }
    }

    /// Gives `worker`'s free permits to the oldest waiters it can serve.
    fn hand_off(&mut self, pool: &Arc<Pool>, worker: usize) {
        loop {
            let slot = &self.slots[worker];
            if !slot.routable || slot.in_flight >= slot.limiter.limit() {
                return;
            }
            let oldest = slot
                .models
                .iter()
                .filter_map(|m| {
                    let q = self.queues.get(m.index())?;
                    let at = q.iter().position(|w| w.pin.is_none_or(|p| p == worker))?;
                    Some((q[at].seq, *m, at))
                })
                .min();
            let Some((_, model, at)) = oldest else { return };
            let waiter = self.queues[model.index()]
                .remove(at)
                .expect("position is in the queue");
            self.queued -= 1;
            let lease = self.lease(pool, worker, model);
            if let Err(Ok(mut lease)) = waiter.tx.send(Ok(lease)) {
                // The waiter gave up just now: take the permit back without
                // re-entering this lock, and try the next one.
                lease.armed = false;
                let slot = &mut self.slots[worker];
                slot.in_flight -= 1;
                let now = watchdog_clock(Instant::now());
                slot.limiter.finish(now, lease.dispatch, false);
                slot.progress.abandoned(now);
            }
        }
    }

    /// After `worker` stopped being routable: fails queued requests that no
    /// routable worker can serve any more.
    fn fail_stranded(&mut self, pool: &Pool, worker: usize) {
        for m in self.slots[worker].models.clone() {
            let served = self
                .slots
                .iter()
                .any(|sl| sl.routable && sl.models.contains(&m));
            let q = &mut self.queues[m.index()];
            let stranded: Vec<Waiter> = if served {
                // Only those pinned to this worker.
                let mut pinned = Vec::new();
                let mut rest = VecDeque::with_capacity(q.len());
                for w in q.drain(..) {
                    if w.pin == Some(worker) {
                        pinned.push(w);
                    } else {
                        rest.push_back(w);
                    }
                }
                *q = rest;
                pinned
            } else {
                q.drain(..).collect()
            };
            self.queued -= stranded.len();
            for w in stranded {
                let _ = w.tx.send(Err(pool.no_ready_worker(m)));
            }
        }
    }
}

/// One worker's concurrency limit as [`Pool::worker_limits`] reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerLimit {
    /// Permits it has now.
    pub limit: usize,
    /// Whether a probe of its unloaded latency holds the limit at 1.
    pub probing: bool,
    /// Requests it serves at once, once known.
    pub concurrency: Option<f64>,
    /// Its latency with nothing else in flight, once measured.
    pub unloaded: Option<Duration>,
    /// Requests per second it can serve, once both are known.
    pub capacity: Option<f64>,
}

/// A request counted in the node's in-flight.
#[derive(Debug)]
pub struct Ticket {
    pool: Arc<Pool>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = lock(&self.pool.sched);
        let now = Instant::now();
        s.in_flight -= 1;
        s.completions.record(now);
        if s.in_flight == 0 {
            s.busy.stop(now);
        }
    }
}

/// A place in a model's queue; leaving it (deadline, cancellation) takes
/// the request out of the queue at once.
struct QueueSpot<'a> {
    pool: &'a Pool,
    model: ModelId,
    seq: u64,
    rx: oneshot::Receiver<Result<Lease, AgentError>>,
}

impl Drop for QueueSpot<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.pool.sched);
        let q = &mut s.queues[self.model.index()];
        if let Some(at) = q.iter().position(|w| w.seq == self.seq) {
            q.remove(at);
            s.queued -= 1;
        }
        drop(s);
        // A permit handed over after the deadline fired is given back when
        // `rx` (and the lease in it) drops, after the lock is released.
        self.rx.close();
    }
}

/// A permit on one worker, handed to the next waiter (or freed) on drop.
#[derive(Debug)]
pub struct Lease {
    pool: Arc<Pool>,
    worker: usize,
    model: ModelId,
    process: Arc<Process>,
    /// False for a lease taken back inside the pool's lock.
    armed: bool,
    /// The worker answered the request (see [`Lease::served`]).
    served: bool,
    /// The worker answered, with any status (see [`Lease::answered`]).
    answered: bool,
    /// When the permit was taken, on the watchdog's clock.
    started: Instant,
    /// Its place in the worker's limiter.
    dispatch: Dispatch,
}

impl Lease {
    /// The worker holding the permit.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.pool.workers[self.worker]
    }

    /// The model the permit was taken for.
    pub fn model(&self) -> ModelId {
        self.model
    }

    /// The worker's process when the permit was taken.
    pub fn process(&self) -> &Arc<Process> {
        &self.process
    }

    /// The worker answered: the request counts as a completion in the
    /// worker's live capacity when the permit is freed.
    pub fn served(&mut self) {
        self.served = true;
        self.answered = true;
    }

    /// The worker answered, maybe with an error: it is making progress
    /// (the stall watchdog), though the answer does not count as a
    /// completion for its capacity unless [`Lease::served`].
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            let answered = self.answered.then_some(self.started);
            self.pool
                .release(self.worker, self.dispatch, self.served, answered);
        }
    }
}

#[cfg(test)]
mod tests;
