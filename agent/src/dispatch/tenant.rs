//! Tenants and priorities: which waiting request a free worker slot goes
//! to, and how much of a worker a tenant that is over its share may hold.
//! Sans-IO: the pool calls it under its lock with the time; it keeps each
//! tenant's live state (permits held, requests queued, last arrival, rate
//! tokens, counts for the metrics).
//!
//! **Order.** A free slot goes to the waiting request with the least
//! [`Precedence`]: first requests of tenants *below* their guaranteed share
//! (`share × the node's slots`, a slot being one request the worker serves
//! at once: its learned concurrency), then those above it; within each, the
//! more important tenant (smaller `priority`), then the tenant using the
//! least of its share, then the request's own priority (Triton's `priority`
//! parameter: 1 first), then arrival order. An absent or 0 `priority` counts
//! as the tenant's `default_request_priority` ([`DEFAULT_REQUEST_PRIORITY`]
//! unless configured; Triton's `default_priority_level`). A tenant's `default_request_priority` (10 unless
//! configured) stands for an absent or 0 `priority`.
//!
//! **Lending, and taking back.** Idle capacity is lent: a tenant may take
//! any free slot, beyond its share, while no other tenant needs it. A request
//! in flight cannot be taken back, so lending alone would leave a tenant
//! that returns from quiet waiting behind a whole round of borrowed
//! requests (up to one service time, 2× its latency). So a tenant at or
//! over its share (a *borrower*) keeps a [`Book::standby`] slot free for each
//! other tenant that is *active* (anything in flight or queued, or a
//! request within [`IDLE_AFTER`]) and below its share: it takes a slot only
//! while one more stays free on the workers serving that tenant. And it
//! never takes a worker's headroom (the requests the limit lets wait inside
//! the worker) while another active tenant is served there, at its share
//! or not: a request of that tenant waiting inside the worker would wait
//! behind the borrower's (this costs the borrower the headroom's overlap of
//! dispatch and service, not a slot). The standby never takes the last
//! slot of the workers serving the tenant (a one-slot node stays
//! work-conserving). When the other tenants are quiet the borrower gets
//! everything; the lapse of a standby is seen at the next permit given
//! back, and some permit is always out while a borrower waits.
//!
//! **Shedding.** A model's queue is bounded; when it is full, a request that
//! outranks the queue's last waiter (by its own priority) takes its place
//! and the last one is shed; otherwise the newcomer is. A tenant with a
//! `rate` is refused beyond it (a token bucket holding one second's worth).
//! Shed requests are answered RESOURCE_EXHAUSTED at once with a retry hint,
//! so clients go elsewhere.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::config::TenantSpec;

pub mod priority;

pub use priority::request_priority;

/// A tenant with nothing in flight or queued and no request for this long
/// is quiet: its share is lent without keeping a slot for it.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);

pub use crate::config::tenants::DEFAULT_REQUEST_PRIORITY;

/// Slots a borrower leaves free for each active tenant below its share.
pub const STANDBY_SLOTS: usize = 1;

/// The node's tenants, and which one owns each model.
#[derive(Debug, Clone)]
pub struct Tenants {
    specs: Vec<TenantSpec>,
    by_model: HashMap<String, usize>,
    default: usize,
}

impl Default for Tenants {
    fn default() -> Self {
        Self::new(vec![TenantSpec::whole_node()])
    }
}

impl Tenants {
    /// From checked specs; `default` (owner of unlisted models) is added if
    /// missing.
    pub fn new(mut specs: Vec<TenantSpec>) -> Self {
        let default_name = crate::config::tenants::DEFAULT_TENANT;
        let default = match specs.iter().position(|t| t.name == default_name) {
            Some(i) => i,
            None => {
                let share = if specs.is_empty() { 1.0 } else { 0.0 };
                specs.push(TenantSpec {
                    share,
                    ..TenantSpec::whole_node()
                });
                specs.len() - 1
            }
        };
        let by_model = specs
            .iter()
            .enumerate()
            .flat_map(|(i, t)| t.models.iter().map(move |m| (m.clone(), i)))
            .collect();
        Self {
            specs,
            by_model,
            default,
        }
    }

    /// The tenant owning `model`.
    pub fn of(&self, model: &str) -> usize {
        self.by_model.get(model).copied().unwrap_or(self.default)
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether there are none (never: `default` always exists).
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Tenant `t`.
    pub fn spec(&self, t: usize) -> &TenantSpec {
        &self.specs[t]
    }

    /// The tenant of models no tenant lists.
    pub fn default_tenant(&self) -> usize {
        self.default
    }

    /// Whether only `default` exists with the whole node: plain FIFO.
    pub fn trivial(&self) -> bool {
        self.specs.len() == 1
    }
}

/// The level of a request's `priority` parameter in a tenant whose
/// requests without one (or with 0) count as `default`: smaller first.
pub fn request_level(priority: Option<u64>, default: u64) -> u64 {
    match priority {
        None | Some(0) => default,
        Some(p) => p,
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Its model's queue was full and it did not outrank the last waiter.
    QueueFull,
    /// Its tenant is at its `rate`.
    Rate,
    /// It waited, and a request that outranks it took its place.
    Evicted,
}

impl ShedReason {
    /// All of them, in label order.
    pub const ALL: [ShedReason; 3] = [ShedReason::QueueFull, ShedReason::Rate, ShedReason::Evicted];

    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::Rate => "rate",
            ShedReason::Evicted => "evicted",
        }
    }
}

/// Who takes a free slot first: the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Precedence {
    /// At or above its share.
    borrowing: bool,
    /// The tenant's priority.
    priority: u32,
    /// Share of its guarantee in use, as ordered bits of an f64.
    usage: u64,
    /// The request's level.
    request: u64,
    /// Arrival order.
    seq: u64,
}

/// One tenant's counts, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Requests given a worker slot.
    pub admitted: u64,
    /// Requests refused, by [`ShedReason::ALL`] order.
    pub shed: [u64; 3],
    /// Permits held now.
    pub in_flight: usize,
    /// Requests waiting now.
    pub queued: usize,
}

#[derive(Debug, Clone, Default)]
struct State {
    stats: TenantStats,
    last_arrival: Option<Instant>,
    tokens: f64,
    refilled: Option<Instant>,
}

/// The tenants' live state.
#[derive(Debug, Clone)]
pub struct Book {
    tenants: Tenants,
    state: Vec<State>,
}

impl Book {
    /// Nothing in flight, every rate bucket full.
    pub fn new(tenants: Tenants) -> Self {
        let state = (0..tenants.len())
            .map(|t| State {
                tokens: tenants.spec(t).rate.unwrap_or(0.0),
                ..State::default()
            })
            .collect();
        Self { tenants, state }
    }

    /// The tenants.
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// A request of tenant `t` arrived at `now`: admitted (Ok) or refused
    /// by its rate, with the time until a token is there.
    pub fn arrive(&mut self, t: usize, now: Instant) -> Result<(), Duration> {
        let rate = self.tenants.spec(t).rate;
        let s = &mut self.state[t];
        s.last_arrival = Some(now);
        let Some(rate) = rate else { return Ok(()) };
        let elapsed = s
            .refilled
            .map_or(0.0, |r| now.saturating_duration_since(r).as_secs_f64());
        s.refilled = Some(now);
        s.tokens = (s.tokens + elapsed * rate).min(rate.max(1.0));
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            Ok(())
        } else {
            s.stats.shed[1] += 1;
            Err(Duration::from_secs_f64((1.0 - s.tokens) / rate))
        }
    }

    /// Whether `t` is at or above its share of `slots` (the node's slots).
    pub fn borrowing(&self, t: usize, slots: f64) -> bool {
        self.state[t].stats.in_flight as f64 >= self.tenants.spec(t).share * slots
    }

    /// Whether `t` has anything in flight or queued, or a request within
    /// [`IDLE_AFTER`].
    pub fn active(&self, t: usize, now: Instant) -> bool {
        let s = &self.state[t];
        s.stats.in_flight > 0
            || s.stats.queued > 0
            || s.last_arrival
                .is_some_and(|a| now.saturating_duration_since(a) < IDLE_AFTER)
    }

    /// The standing of a request of tenant `t` with level `request` that
    /// arrived `seq`-th.
    pub fn precedence(&self, t: usize, slots: f64, request: u64, seq: u64) -> Precedence {
        let spec = self.tenants.spec(t);
        let guaranteed = spec.share * slots;
        let used = self.state[t].stats.in_flight as f64;
        let usage = if guaranteed > 0.0 {
            used / guaranteed
        } else {
            f64::MAX
        };
        Precedence {
            borrowing: used >= guaranteed,
            priority: spec.priority,
            usage: usage.to_bits(),
            request,
            seq,
        }
    }

    /// Slots a borrower must leave free for tenant `u` (on the workers
    /// serving it): [`STANDBY_SLOTS`] while `u` is active and below its
    /// share of `slots`, at most what it misses of that share; else none.
    pub fn standby(&self, u: usize, slots: f64, now: Instant) -> usize {
        if !self.active(u, now) {
            return 0;
        }
        let missing = self.tenants.spec(u).share * slots - self.state[u].stats.in_flight as f64;
        if missing > 0.0 {
            (missing.ceil() as usize).min(STANDBY_SLOTS)
        } else {
            0
        }
    }

    /// A request of `t` took a permit.
    pub fn dispatched(&mut self, t: usize) {
        let s = &mut self.state[t].stats;
        s.in_flight += 1;
        s.admitted += 1;
    }

    /// A request of `t` gave its permit back.
    pub fn released(&mut self, t: usize) {
        let s = &mut self.state[t].stats;
        s.in_flight = s.in_flight.saturating_sub(1);
    }

    /// A request of `t` started (`true`) or stopped (`false`) waiting.
    pub fn waiting(&mut self, t: usize, waits: bool) {
        let s = &mut self.state[t].stats;
        if waits {
            s.queued += 1;
        } else {
            s.queued = s.queued.saturating_sub(1);
        }
    }

    /// A request of `t` was refused for `reason` (other than its rate,
    /// which [`Book::arrive`] counts).
    pub fn shed(&mut self, t: usize, reason: ShedReason) {
        let i = ShedReason::ALL
            .iter()
            .position(|r| *r == reason)
            .expect("a reason");
        self.state[t].stats.shed[i] += 1;
    }

    /// Every tenant's counts, in [`Tenants`] order.
    pub fn stats(&self) -> Vec<TenantStats> {
        self.state.iter().map(|s| s.stats).collect()
    }
}

#[cfg(test)]
mod tests;
