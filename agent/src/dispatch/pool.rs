//! The pool of local workers and the admission path of every request.
//!
//! A request is first *admitted* ([`Pool::admit`]: counted in the node's
//! in-flight, which drives the busy ratio and the load report), then
//! *dispatched* ([`Pool::acquire`]): it takes a permit of the ready worker
//! hosting its model with the fewest requests in flight (ties broken by a
//! rotating start). How many permits a worker has is its adaptive
//! concurrency limit ([`crate::worker::concurrency`]: learned from its latencies,
//! at most its `max_inflight`), updated as its requests complete. When
//! every such worker is full (or its tenant may not take the free permit:
//! [`crate::dispatch::tenant`]) it waits in its model's queue, bounded by
//! `queue.capacity`; a full queue is refused at once with
//! RESOURCE_EXHAUSTED and a retry hint so the client retries elsewhere
//! instead of waiting, and a request whose deadline passes in the queue
//! gets DEADLINE_EXCEEDED. A model with no ready worker is never queued
//! for: UNAVAILABLE at once, and queued requests are failed the moment the
//! last worker for their model stops being routable.
//!
//! **Hand-off.** A finished request ([`Lease`] dropped) gives its permit
//! directly to the best waiter that worker can serve: with one tenant (no
//! `[[tenants]]`), the oldest across the queues of the models it hosts,
//! Triton's request `priority` first; with several, in the order of
//! [`crate::dispatch::tenant`] (below their share first, then tenant priority,
//! request priority, arrival). One wake-up per completion, and newcomers
//! cannot overtake queued requests — a new request only takes a free
//! permit when nobody is queued for its model. All of it is one small
//! critical section under one lock ([`sched`]).
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

use crate::config::Weight;
use crate::dispatch::busy::{BusyWindow, RateWindow};
use crate::dispatch::capacity;
use crate::dispatch::models::{ModelId, Models};
use crate::dispatch::tenant::{Book, TenantStats, Tenants, request_level};
use crate::error::AgentError;
use crate::worker::concurrency::{Dispatch, Limiter};
use crate::worker::state::{Process, Worker};

mod sched;

use sched::{Pick, Sched, Slot, Waiter};

/// How old the slow figures of a response's load report may be
/// ([`Pool::report`]): one bucket of the busy window.
pub const REPORT_REFRESH: Duration = crate::dispatch::busy::BUCKET;

/// The load report of one response ([`Pool::report`]).
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// In flight and queued now; busy ratio and weight of `snapshot`.
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
    /// (a number when all are ready, or the live capacity); every model
    /// belongs to one tenant with the whole node (plain FIFO).
    pub fn new(
        workers: Vec<Arc<Worker>>,
        weight: impl Into<Weight>,
        queue_capacity: usize,
    ) -> Arc<Self> {
        Self::with_tenants(workers, weight, queue_capacity, Tenants::default())
    }

    /// A pool whose models belong to `tenants` (see [`crate::dispatch::tenant`]).
    pub fn with_tenants(
        workers: Vec<Arc<Worker>>,
        weight: impl Into<Weight>,
        queue_capacity: usize,
        tenants: Tenants,
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
                model_tenant: Vec::new(),
                book: Book::new(tenants),
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
        self.acquire_prioritized(model, pin, deadline, None).await
    }

    /// [`Pool::acquire`] for a request with Triton's `priority` parameter
    /// (1 first; `None` or 0: its tenant's `default_request_priority`),
    /// its tenant's rate and share applied ([`crate::dispatch::tenant`]).
    pub async fn acquire_prioritized(
        self: &Arc<Self>,
        model: ModelId,
        pin: Option<usize>,
        deadline: Option<Instant>,
        priority: Option<u64>,
    ) -> Result<Lease, AgentError> {
        let (seq, rx) = {
            let mut s = lock(&self.sched);
            if s.closed {
                return Err(AgentError::ShuttingDown);
            }
            let now = watchdog_clock(Instant::now());
            let t = s.tenant(model);
            let pick = s.pick(model, pin, t, now);
            if let Pick::NoneReady = pick {
                return Err(self.no_ready_worker(model));
            }
            if let Err(retry_after) = s.book.arrive(t, now) {
                let spec = s.book.tenants().spec(t);
                return Err(AgentError::RateLimited {
                    tenant: spec.name.clone(),
                    rate: spec.rate.unwrap_or_default(),
                    retry_after,
                });
            }
            let nobody_waits = s.queues.get(model.index()).is_none_or(VecDeque::is_empty);
            if let Pick::Got(w) = pick {
                if nobody_waits {
                    return Ok(s.lease(self, w, model));
                }
            }
            let (tx, rx) = oneshot::channel();
            let seq = s.next_seq;
            s.next_seq += 1;
            let default = s.book.tenants().spec(t).default_request_priority;
            let waiter = Waiter {
                seq,
                level: request_level(priority, default),
                pin,
                tx,
            };
            s.enqueue(self, model, self.queue_capacity, waiter)?;
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
            if s.model_tenant.len() < max {
                let start = s.model_tenant.len();
                let owners: Vec<usize> = (start..max)
                    .map(|i| s.book.tenants().of(&self.models.name(ModelId(i as u32))))
                    .collect();
                s.model_tenant.extend(owners);
            }
        }
        if s.slots[index].routable != routable {
            // The weight changes by this worker's share: in the next report.
            s.snapshot = None;
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
            let mut all = Vec::new();
            for m in 0..s.queues.len() {
                let t = s.tenant(ModelId(m as u32));
                let q = std::mem::take(&mut s.queues[m]);
                for w in q {
                    s.book.waiting(t, false);
                    all.push(w);
                }
            }
            all
        };
        for w in waiters {
            let _ = w.tx.send(Err(AgentError::ShuttingDown));
        }
    }

    fn release(
        self: &Arc<Self>,
        worker: usize,
        tenant: usize,
        dispatch: Dispatch,
        served: bool,
        answered: Answer,
    ) {
        let mut s = lock(&self.sched);
        s.book.released(tenant);
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
            Answer::Answered(started) => slot
                .progress
                .answered(at, at.saturating_duration_since(started)),
            Answer::Withdrawn => slot.progress.withdrawn(),
            Answer::Abandoned => slot.progress.abandoned(at),
        }
        let routable = slot.routable;
        if s.book.tenants().trivial() {
            if routable {
                s.hand_off(self, worker);
            }
        } else {
            s.hand_off_all(self);
        }
    }

    /// Each tenant's name and counts (admitted, shed, in flight, queued).
    pub fn tenant_stats(&self) -> Vec<(String, TenantStats)> {
        let s = lock(&self.sched);
        let tenants = s.book.tenants();
        s.book
            .stats()
            .into_iter()
            .enumerate()
            .map(|(t, st)| (tenants.spec(t).name.clone(), st))
            .collect()
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
        let mut changed = false;
        for (i, slot) in s.slots.iter_mut().enumerate() {
            let factor = health.get(i).copied().unwrap_or(1.0);
            changed |= slot.health != factor;
            slot.health = factor;
        }
        if changed {
            // The weight follows the factors: in the next report.
            s.snapshot = None;
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

    /// The load report a response carries: in flight and queued as they
    /// are now; busy ratio, rate and weight from a snapshot taken at most
    /// [`REPORT_REFRESH`] ago (the first two are 10 s windows). A worker
    /// that becomes routable or stops being so, or a change of health
    /// factor, drops the snapshot, so that change is in the next response
    /// — a node that just became ready is not passed over as weight 0. The
    /// learned capacity (the auto weight) is not followed sooner than
    /// [`REPORT_REFRESH`]: it moves with the requests that ran alone (at
    /// concurrency 1 every request is one), and renewing the snapshot on
    /// each move re-encoded the whole report on every response (~3k
    /// instructions per request; BENCHMARKS.md).
    ///
    /// A snapshot's values repeat on every response until the next one, so
    /// HPACK sends them as an index into the connection's table instead of
    /// Huffman-coding them on every response, and the ORCA value is encoded
    /// once per snapshot; see `load_report.rs`.
    pub fn report(&self) -> Report {
        let mut s = lock(&self.sched);
        let now = Instant::now();
        let (snapshot, rps) = match s.snapshot {
            Some((at, report, rps)) if now.saturating_duration_since(at) < REPORT_REFRESH => {
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
        s.leave(self.model, self.seq);
        drop(s);
        // A permit handed over after the deadline fired is given back when
        // `rx` (and the lease in it) drops, after the lock is released.
        self.rx.close();
    }
}

/// How a permit's request ended, for the stall watchdog.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// The worker answered a request dispatched at this instant.
    Answered(Instant),
    /// Taken back before the worker had the whole request.
    Withdrawn,
    /// Left without an answer (the caller went, the connection broke).
    Abandoned,
}

/// A permit on one worker, handed to the next waiter (or freed) on drop.
#[derive(Debug)]
pub struct Lease {
    pool: Arc<Pool>,
    worker: usize,
    model: ModelId,
    /// The model's tenant.
    tenant: usize,
    process: Arc<Process>,
    /// False for a lease taken back inside the pool's lock.
    armed: bool,
    /// The worker answered the request (see [`Lease::served`]).
    served: bool,
    /// The worker answered, with any status (see [`Lease::answered`]).
    answered: bool,
    /// Taken back before the worker had the whole request (see
    /// [`Lease::withdrawn`]).
    withdrawn: bool,
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

    /// The worker's permits now (its concurrency limit).
    pub fn limit(&self) -> usize {
        lock(&self.pool.sched).slots[self.worker].limiter.limit()
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

    /// The request is taken back before the worker had all of it (a
    /// cut-through upload whose body was late, [`crate::serving::forward`]):
    /// the stall watchdog does not count its time as the worker's.
    pub fn withdrawn(&mut self) {
        self.withdrawn = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            let answered = match (self.answered, self.withdrawn) {
                (true, _) => Answer::Answered(self.started),
                (false, true) => Answer::Withdrawn,
                (false, false) => Answer::Abandoned,
            };
            self.pool.release(
                self.worker,
                self.tenant,
                self.dispatch,
                self.served,
                answered,
            );
        }
    }
}

#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;
