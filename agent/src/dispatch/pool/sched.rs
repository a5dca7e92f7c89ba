//! The dispatch state under the pool's lock: each worker's permits and
//! limiter, each model's queue, the tenants' book, and the choices made
//! over them — which worker a request gets ([`Sched::pick`]), which waiter
//! a free permit goes to ([`Sched::hand_off`]), who is shed when a queue is
//! full ([`Sched::enqueue`]). See [`crate::dispatch::tenant`] for the order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_proto::load::LoadReport;
use infermesh_sentinel::ProgressMeter;
use tokio::sync::oneshot;

use super::{Lease, Pool, watchdog_clock};
use crate::dispatch::busy::{BusyWindow, RateWindow};
use crate::dispatch::models::ModelId;
use crate::dispatch::tenant::{Book, ShedReason};
use crate::error::AgentError;
use crate::worker::concurrency::Limiter;
use crate::worker::state::Process;

#[derive(Debug)]
pub(super) struct Sched {
    pub(super) slots: Vec<Slot>,
    /// One queue per model id, ordered by (request level, arrival).
    pub(super) queues: Vec<VecDeque<Waiter>>,
    /// The tenant of each model id.
    pub(super) model_tenant: Vec<usize>,
    pub(super) book: Book,
    pub(super) queued: usize,
    pub(super) in_flight: u64,
    pub(super) busy: BusyWindow,
    /// Requests completed per second (ORCA's `rps_fractional`).
    pub(super) completions: RateWindow,
    /// The last [`Pool::report`] snapshot and when it was taken.
    pub(super) snapshot: Option<(Instant, LoadReport, f64)>,
    pub(super) next_seq: u64,
    pub(super) cursor: usize,
    pub(super) routable: usize,
    pub(super) closed: bool,
}

/// What dispatch knows of one worker (copied from its snapshot).
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) routable: bool,
    pub(super) models: Vec<ModelId>,
    pub(super) process: Option<Arc<Process>>,
    pub(super) in_flight: usize,
    pub(super) requests: u64,
    /// How many permits it has: learned, at most `max_inflight`; and the
    /// capacity that follows.
    pub(super) limiter: Limiter,
    /// Health factor of the worker's GPU and the host (`capacity`).
    pub(super) health: f64,
    /// Requests outstanding and answered, for the stall watchdog.
    pub(super) progress: ProgressMeter,
}

impl Slot {
    /// Requests it serves at once (its learned concurrency, else its limit).
    fn parallel(&self) -> usize {
        self.limiter
            .concurrency()
            .map_or(self.limiter.limit(), |c| c.round().max(1.0) as usize)
    }
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) seq: u64,
    /// Its `priority` level (smaller first).
    pub(super) level: u64,
    /// Only a permit of this worker will do (a stream pinned to it).
    pub(super) pin: Option<usize>,
    pub(super) tx: oneshot::Sender<Result<Lease, AgentError>>,
}

pub(super) enum Pick {
    Got(usize),
    AllBusy,
    NoneReady,
}

impl Sched {
    /// The node's slots: requests its routable workers serve at once.
    pub(super) fn node_slots(&self) -> f64 {
        self.slots
            .iter()
            .filter(|s| s.routable)
            .map(|s| s.parallel() as f64)
            .sum()
    }

    /// Whether `worker` serves a model of tenant `t`.
    fn serves_tenant(&self, worker: usize, t: usize) -> bool {
        self.slots[worker]
            .models
            .iter()
            .any(|m| self.model_tenant.get(m.index()) == Some(&t))
    }

    /// Slots of the routable workers serving tenant `u` (each worker's
    /// parallel slots, within its limit, headroom not counted): in all, and
    /// free.
    fn slots_of(&self, u: usize) -> (usize, usize) {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].routable && self.serves_tenant(i, u))
            .fold((0, 0), |(all, free), i| {
                let slot = &self.slots[i];
                let n = slot.parallel().min(slot.limiter.limit());
                (all + n, free + n.saturating_sub(slot.in_flight))
            })
    }

    /// Whether a request of tenant `t` may take a permit of `worker` now:
    /// one is free, and `t` is below its share, or leaves the worker's
    /// headroom to the other active tenants it serves and their standby
    /// slots free (see [`crate::dispatch::tenant`], "Lending").
    fn may_take(&self, worker: usize, t: usize, now: Instant) -> bool {
        let slot = &self.slots[worker];
        if !slot.routable || slot.in_flight >= slot.limiter.limit() {
            return false;
        }
        let tenants = self.book.tenants();
        if tenants.trivial() {
            return true;
        }
        let node = self.node_slots();
        if !self.book.borrowing(t, node) {
            return true;
        }
        let within = slot.in_flight < slot.parallel().min(slot.limiter.limit());
        for u in (0..tenants.len()).filter(|&u| u != t) {
            if !self.serves_tenant(worker, u) || !self.book.active(u, now) {
                continue;
            }
            // A request of `u` sent into the headroom would wait inside the
            // worker behind the borrower's.
            if !within {
                return false;
            }
            let standby = self.book.standby(u, node, now);
            if standby == 0 {
                continue;
            }
            let (all, free) = self.slots_of(u);
            if free <= standby.min(all.saturating_sub(1)) {
                return false;
            }
        }
        true
    }

    /// The least-loaded routable worker hosting `model` with a permit
    /// tenant `t` may take ([`Sched::may_take`]).
    pub(super) fn pick(
        &mut self,
        model: ModelId,
        pin: Option<usize>,
        t: usize,
        now: Instant,
    ) -> Pick {
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
            if best.is_none_or(|(_, load)| slot.in_flight < load) && self.may_take(i, t, now) {
                best = Some((i, slot.in_flight));
            }
        }
        match (best, hosted) {
            (Some((i, _)), _) => Pick::Got(i),
            (None, true) => Pick::AllBusy,
            (None, false) => Pick::NoneReady,
        }
    }

    /// The tenant of `model`.
    pub(super) fn tenant(&self, model: ModelId) -> usize {
        self.model_tenant
            .get(model.index())
            .copied()
            .unwrap_or_else(|| self.book.tenants().default_tenant())
    }

    /// Puts a waiter of level `level` in `model`'s queue (bounded by
    /// `capacity`), in (level, arrival) order. A full queue sheds its last
    /// waiter if the newcomer outranks it, else refuses the newcomer; the
    /// error names how long the queue ahead takes to drain.
    pub(super) fn enqueue(
        &mut self,
        pool: &Pool,
        model: ModelId,
        capacity: usize,
        waiter: Waiter,
    ) -> Result<(), AgentError> {
        let t = self.tenant(model);
        let q = &mut self.queues[model.index()];
        if q.len() >= capacity {
            let outranks = q.back().is_some_and(|last| waiter.level < last.level);
            let retry_after = self.drain_time(model);
            if !outranks {
                self.book.shed(t, ShedReason::QueueFull);
                return Err(AgentError::QueueFull {
                    model: pool.models.name(model).to_string(),
                    capacity,
                    retry_after,
                });
            }
            let q = &mut self.queues[model.index()];
            let evicted = q.pop_back().expect("a full queue has a last waiter");
            self.queued -= 1;
            self.book.waiting(t, false);
            self.book.shed(t, ShedReason::Evicted);
            let _ = evicted.tx.send(Err(AgentError::Evicted {
                model: pool.models.name(model).to_string(),
                retry_after,
            }));
        }
        let q = &mut self.queues[model.index()];
        let at = q.partition_point(|w| (w.level, w.seq) <= (waiter.level, waiter.seq));
        q.insert(at, waiter);
        self.queued += 1;
        self.book.waiting(t, true);
        Ok(())
    }

    /// Roughly how long `model`'s queue takes to drain: its length over
    /// the capacity of the workers hosting it, within 1 ms .. 10 s.
    fn drain_time(&self, model: ModelId) -> Duration {
        let rate: f64 = self
            .slots
            .iter()
            .filter(|s| s.routable && s.models.contains(&model))
            .filter_map(|s| s.limiter.capacity())
            .sum();
        let queued = self.queues[model.index()].len() as f64;
        let secs = if rate > 0.0 { queued / rate } else { 1.0 };
        Duration::from_secs_f64(secs.clamp(0.001, 10.0))
    }

    pub(super) fn lease(&mut self, pool: &Arc<Pool>, worker: usize, model: ModelId) -> Lease {
        let tenant = self.tenant(model);
        self.book.dispatched(tenant);
        let slot = &mut self.slots[worker];
        slot.in_flight += 1;
        let started = watchdog_clock(Instant::now());
        let dispatch = slot.limiter.start(started);
        slot.progress.dispatched(started);
        Lease {
            pool: Arc::clone(pool),
            worker,
            model,
            tenant,
            process: Arc::clone(
                slot.process
                    .as_ref()
                    .expect("routable slots have a process"),
            ),
            armed: true,
            served: false,
            answered: false,
            withdrawn: false,
            started,
            dispatch,
        }
    }

    /// Gives `worker`'s free permits to the waiters it can serve, best
    /// [`crate::dispatch::tenant::Precedence`] first, as far as [`Sched::may_take`]
    /// lets their tenants.
    pub(super) fn hand_off(&mut self, pool: &Arc<Pool>, worker: usize) {
        let now = watchdog_clock(Instant::now());
        loop {
            let slot = &self.slots[worker];
            if !slot.routable || slot.in_flight >= slot.limiter.limit() {
                return;
            }
            let slots = self.node_slots();
            let best = slot
                .models
                .iter()
                .filter_map(|m| {
                    let q = self.queues.get(m.index())?;
                    let at = q.iter().position(|w| w.pin.is_none_or(|p| p == worker))?;
                    let t = self.tenant(*m);
                    if !self.may_take(worker, t, now) {
                        return None;
                    }
                    let key = self.book.precedence(t, slots, q[at].level, q[at].seq);
                    Some((key, *m, at))
                })
                .min_by_key(|c| c.0);
            let Some((_, model, at)) = best else { return };
            let waiter = self.queues[model.index()]
                .remove(at)
                .expect("position is in the queue");
            self.queued -= 1;
            let t = self.tenant(model);
            self.book.waiting(t, false);
            let lease = self.lease(pool, worker, model);
            if let Err(Ok(mut lease)) = waiter.tx.send(Ok(lease)) {
                // The waiter gave up just now: take the permit back without
                // re-entering this lock, and try the next one.
                lease.armed = false;
                self.book.released(lease.tenant);
                let slot = &mut self.slots[worker];
                slot.in_flight -= 1;
                slot.limiter.finish(now, lease.dispatch, false);
                slot.progress.abandoned(now);
            }
        }
    }

    /// Offers every routable worker's free permits: a permit given back
    /// changes its tenant's standing on every worker (below its share again,
    /// its reserve kept or lapsed), not only on the one it came from.
    pub(super) fn hand_off_all(&mut self, pool: &Arc<Pool>) {
        for w in 0..self.slots.len() {
            self.hand_off(pool, w);
        }
    }

    /// Takes the waiter `seq` out of `model`'s queue, if it is there.
    pub(super) fn leave(&mut self, model: ModelId, seq: u64) {
        let q = &mut self.queues[model.index()];
        if let Some(at) = q.iter().position(|w| w.seq == seq) {
            q.remove(at);
            self.queued -= 1;
            let t = self.tenant(model);
            self.book.waiting(t, false);
        }
    }

    /// After `worker` stopped being routable: fails queued requests that no
    /// routable worker can serve any more.
    pub(super) fn fail_stranded(&mut self, pool: &Pool, worker: usize) {
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
            let t = self.tenant(m);
            for w in stranded {
                self.book.waiting(t, false);
                let _ = w.tx.send(Err(pool.no_ready_worker(m)));
            }
        }
    }
}
