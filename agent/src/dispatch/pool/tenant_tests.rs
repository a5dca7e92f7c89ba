//! Tenants and priorities in the dispatch path, under tokio's paused
//! clock: who gets a freed permit, what a borrower may hold, who is shed.
//! One worker of 4 slots (limit 5 with its headroom) serves `hi` (tenant
//! high: priority 1, half the node) and `lo` (tenant low: priority 20, the
//! other half), unless a test says otherwise.

use std::time::Duration;

use super::tests::{Fixture, spec};
use super::*;
use crate::config::TenantSpec;
use crate::dispatch::tenant::IDLE_AFTER;

fn tenant(name: &str, models: &[&str], priority: u32, share: f64, rate: Option<f64>) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        models: models.iter().map(|m| m.to_string()).collect(),
        priority,
        share,
        rate,
        default_request_priority: crate::dispatch::tenant::DEFAULT_REQUEST_PRIORITY,
    }
}

fn node(tenants: Vec<TenantSpec>, queue: usize) -> Fixture {
    let (w, driver) = Worker::new(spec("a", &["hi", "lo"], 64), 0);
    let pool = Pool::with_tenants(vec![w], 1.0, queue, Tenants::new(tenants));
    pool.hint_parallelism(0, 4);
    let f = Fixture {
        pool,
        drivers: vec![driver],
    };
    f.set_routable(0, true);
    f
}

fn high_and_low(queue: usize) -> Fixture {
    node(
        vec![
            tenant("high", &["hi"], 1, 0.5, None),
            tenant("low", &["lo"], 20, 0.5, None),
        ],
        queue,
    )
}

impl Fixture {
    fn ask(
        &self,
        model: &str,
        priority: Option<u64>,
    ) -> tokio::task::JoinHandle<Result<Lease, AgentError>> {
        let pool = Arc::clone(&self.pool);
        let m = self.model(model);
        tokio::spawn(async move { pool.acquire_prioritized(m, None, None, priority).await })
    }

    /// A permit for `model`, at once or after waiting.
    async fn take(&self, model: &str) -> Lease {
        let acquire = self
            .pool
            .acquire_prioritized(self.model(model), None, None, None);
        tokio::time::timeout(NEVER, acquire)
            .await
            .expect("never got a permit")
            .unwrap()
    }
}

/// `n` permits of `model`, taken one after another.
async fn take_many(f: &Fixture, model: &str, n: usize) -> Vec<Lease> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(f.take(model).await);
    }
    out
}

/// Longer than any test waits: under the paused clock it passes as soon as
/// every task waits, so a request never served fails its test at once
/// instead of hanging it.
const NEVER: Duration = Duration::from_secs(3600);

/// What a spawned request got.
async fn outcome(
    h: tokio::task::JoinHandle<Result<Lease, AgentError>>,
) -> Result<Lease, AgentError> {
    tokio::time::timeout(NEVER, h)
        .await
        .expect("the request was never answered")
        .unwrap()
}

/// Low fills the worker, both queue; the next freed permit goes to high,
/// though low's waiter came first. (FIFO dispatch gave it to low.)
#[tokio::test(start_paused = true)]
async fn a_freed_permit_goes_to_the_more_important_tenant_first() {
    let f = high_and_low(8);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(f.take("lo").await);
    }
    let low = f.ask("lo", None);
    f.until_queued(1).await;
    let high = f.ask("hi", None);
    f.until_queued(2).await;
    drop(held.pop());
    let got = outcome(high).await.unwrap();
    assert_eq!(got.model(), f.model("hi"));
    assert_eq!(f.pool.load().queued, 1, "low still waits");
    drop(got);
    // High is active: low, borrowing, may hold 3 of the 4 slots.
    drop(held.pop());
    assert_eq!(f.pool.load().queued, 1, "one slot is kept for high");
    drop(held.pop());
    let got = outcome(low).await.unwrap();
    assert_eq!(got.model(), f.model("lo"));
}

/// Two tenants of the same priority: the one below its share first, though
/// it asked last; then, both at their share, arrival order.
#[tokio::test(start_paused = true)]
async fn a_tenant_below_its_share_is_served_before_one_above_it() {
    let f = node(
        vec![
            tenant("a", &["hi"], 5, 0.5, None),
            tenant("b", &["lo"], 5, 0.5, None),
        ],
        8,
    );
    // a holds 4 (twice its share of 2), b 1: the worker is full (limit 5).
    let mut a = Vec::new();
    for _ in 0..4 {
        a.push(f.take("hi").await);
    }
    let _b = f.take("lo").await;
    let a_waits = f.ask("hi", None);
    f.until_queued(1).await;
    let b_waits = f.ask("lo", None);
    f.until_queued(2).await;
    drop(a.pop());
    let got = outcome(b_waits).await.unwrap();
    assert_eq!(got.model(), f.model("lo"), "b, below its share, first");
    // a's next needs a slot within the worker's four (b is active: no
    // headroom for a borrower).
    drop(a.pop());
    drop(a.pop());
    assert_eq!(outcome(a_waits).await.unwrap().model(), f.model("hi"));
}

/// Work-conserving: a tenant alone takes the whole worker, headroom
/// included, whatever its share.
#[tokio::test(start_paused = true)]
async fn idle_capacity_is_lent_to_a_lone_tenant() {
    let f = high_and_low(8);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(f.take("lo").await);
    }
    assert_eq!(f.in_flight(0), 5);
}

/// A borrower leaves one slot for an active tenant below its share — so
/// that tenant's next request runs at once instead of behind a round of
/// borrowed ones — and takes it, headroom included, once that tenant has
/// been quiet for IDLE_AFTER (seen at the next permit given back).
#[tokio::test(start_paused = true)]
async fn a_borrower_keeps_a_slot_free_for_an_active_tenant_until_it_is_quiet() {
    let f = high_and_low(8);
    // High was just served and answered.
    drop(f.take("hi").await);
    let mut low = Vec::new();
    for _ in 0..3 {
        low.push(f.take("lo").await);
    }
    // The fourth waits: one slot of the four kept for high, no headroom.
    let fourth = f.ask("lo", None);
    f.until_queued(1).await;
    assert_eq!(f.in_flight(0), 3);
    // High's next request runs at once.
    let h = f.take("hi").await;
    assert_eq!(f.in_flight(0), 4);
    drop(h);
    // A low request ends while high is still active: its permit goes to
    // the fourth, and the reserve still holds.
    drop(low.pop());
    low.push(outcome(fourth).await.unwrap());
    let fifth = f.ask("lo", None);
    f.until_queued(1).await;
    assert_eq!(f.in_flight(0), 3);
    // Quiet for IDLE_AFTER: the next permit given back lends everything.
    tokio::time::advance(IDLE_AFTER).await;
    drop(low.pop());
    low.push(outcome(fifth).await.unwrap());
    low.push(f.take("lo").await);
    low.push(f.take("lo").await);
    assert_eq!(f.in_flight(0), 5, "the headroom too");
}

/// A tenant at its share needs no standby slot, but a borrower still never
/// takes the headroom while it is active: that tenant's next request would
/// wait inside the worker behind the borrower's.
#[tokio::test(start_paused = true)]
async fn a_borrower_never_takes_the_headroom_of_a_worker_an_active_tenant_uses() {
    let f = high_and_low(8);
    let high = [f.take("hi").await, f.take("hi").await];
    let low = [f.take("lo").await, f.take("lo").await];
    assert_eq!(f.in_flight(0), 4, "each at its share of the 4 slots");
    // The fifth permit is headroom: not while high is active.
    let third = f.ask("lo", None);
    f.until_queued(1).await;
    // High's requests end: one slot stands by for it, low's third takes
    // the other; high's next runs at once.
    drop(high);
    let third = outcome(third).await.unwrap();
    assert_eq!(f.in_flight(0), 3);
    let again = f.take("hi").await;
    let fourth = f.ask("lo", None);
    f.until_queued(1).await;
    assert_eq!(f.in_flight(0), 4);
    // Quiet: the headroom too is lent.
    drop(again);
    tokio::time::advance(IDLE_AFTER).await;
    drop(low);
    let fourth = outcome(fourth).await.unwrap();
    let rest = take_many(&f, "lo", 3).await;
    assert_eq!(f.in_flight(0), 5);
    drop((third, fourth, rest));
}

/// The standby never takes the last slot of the workers serving a tenant:
/// a one-slot node is not held idle for a tenant that may come.
#[tokio::test(start_paused = true)]
async fn a_borrower_keeps_a_one_slot_nodes_slot() {
    // High has the whole node; `lo` belongs to `default`, with no share.
    let f = node(vec![tenant("high", &["hi"], 1, 1.0, None)], 8);
    f.pool.hint_parallelism(0, 1);
    drop(f.take("hi").await);
    // High is active (just answered) and below its share; low still runs.
    let l = f.take("lo").await;
    assert_eq!(f.in_flight(0), 1);
    // But not in the headroom: high's next request waits inside the worker
    // behind one request at most.
    let second = f.ask("lo", None);
    f.until_queued(1).await;
    let h = f.take("hi").await;
    assert_eq!(f.in_flight(0), 2);
    drop((l, h));
    outcome(second).await.unwrap();
}

/// With two one-slot workers, a borrower leaves one free for the tenant
/// below its share: the standby is node-wide, one slot, not one per worker.
#[tokio::test(start_paused = true)]
async fn the_standby_is_one_slot_of_the_node() {
    let (a, da) = Worker::new(spec("a", &["hi", "lo"], 64), 0);
    let (b, db) = Worker::new(spec("b", &["hi", "lo"], 64), 1);
    let tenants = vec![
        tenant("high", &["hi"], 1, 0.5, None),
        tenant("low", &["lo"], 20, 0.5, None),
    ];
    let pool = Pool::with_tenants(vec![a, b], 1.0, 8, Tenants::new(tenants));
    let f = Fixture {
        pool,
        drivers: vec![da, db],
    };
    for i in 0..2 {
        f.pool.hint_parallelism(i, 1);
        f.set_routable(i, true);
    }
    drop(f.take("hi").await);
    // Low's first is within its share; the second would take the last free
    // slot (or a headroom) while high is active.
    let first = f.take("lo").await;
    let waits = f.ask("lo", None);
    f.until_queued(1).await;
    assert_eq!(f.in_flight(0) + f.in_flight(1), 1);
    // High takes its slot at once; when both are done, low's waiter runs.
    let h = f.take("hi").await;
    assert_eq!(f.in_flight(0) + f.in_flight(1), 2);
    drop((h, first));
    let low = outcome(waits).await.unwrap();
    // High quiet for IDLE_AFTER: both slots lent.
    tokio::time::advance(IDLE_AFTER).await;
    let more = f.take("lo").await;
    assert_eq!(f.in_flight(0) + f.in_flight(1), 2);
    drop((low, more));
}

/// Within a tenant, Triton's `priority` parameter orders its waiters: 1
/// before the default (absent or 0) before 100; ties in arrival order.
#[tokio::test(start_paused = true)]
async fn a_requests_priority_orders_its_tenants_queue() {
    let f = high_and_low(8);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(f.take("hi").await);
    }
    let late = f.ask("hi", Some(100));
    f.until_queued(1).await;
    let plain = f.ask("hi", None);
    f.until_queued(2).await;
    let zero = f.ask("hi", Some(0));
    f.until_queued(3).await;
    let urgent = f.ask("hi", Some(1));
    f.until_queued(4).await;
    let mut order = Vec::new();
    for (name, h) in [
        ("urgent", urgent),
        ("plain", plain),
        ("zero", zero),
        ("late", late),
    ] {
        // One permit freed: the best waiter takes it (and keeps it).
        drop(held.pop());
        held.push(outcome(h).await.unwrap());
        order.push(name);
    }
    assert_eq!(order, ["urgent", "plain", "zero", "late"]);
}

/// A full queue: a newcomer that outranks the last waiter takes its place
/// (the last is shed), one that does not is refused; both answers carry a
/// retry hint.
#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_the_lowest_priority_waiter() {
    let f = high_and_low(2);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(f.take("hi").await);
    }
    let a = f.ask("hi", Some(5));
    f.until_queued(1).await;
    let b = f.ask("hi", Some(50));
    f.until_queued(2).await;
    // Not above the last (50): refused.
    let refused = f
        .pool
        .acquire_prioritized(f.model("hi"), None, None, Some(50))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, AgentError::QueueFull { .. }),
        "{refused:?}"
    );
    // Above it: b is shed, the newcomer queues.
    let c = f.ask("hi", Some(1));
    let shed = outcome(b).await.unwrap_err();
    assert!(matches!(shed, AgentError::Evicted { .. }), "{shed:?}");
    let status = tonic::Status::from(shed);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status
            .metadata()
            .get(crate::error::RETRY_PUSHBACK)
            .is_some()
    );
    drop(held.pop());
    outcome(c).await.unwrap();
    drop(held.pop());
    outcome(a).await.unwrap();
    let stats = f.pool.tenant_stats();
    assert_eq!(stats[0].0, "high");
    assert_eq!(stats[0].1.shed, [1, 0, 1]);
}

/// A tenant's rate: beyond it, RESOURCE_EXHAUSTED at once with the time to
/// its next token.
#[tokio::test(start_paused = true)]
async fn a_tenant_beyond_its_rate_is_refused_with_the_time_to_wait() {
    let f = node(vec![tenant("metered", &["hi"], 10, 0.5, Some(2.0))], 8);
    drop(f.take("hi").await);
    drop(f.take("hi").await);
    let err = f
        .pool
        .acquire_prioritized(f.model("hi"), None, None, None)
        .await
        .unwrap_err();
    let AgentError::RateLimited { retry_after, .. } = err else {
        panic!("{err:?}")
    };
    assert_eq!(retry_after, Duration::from_millis(500));
    tokio::time::advance(retry_after).await;
    drop(f.take("hi").await);
    // The other model (default tenant) is not metered.
    for _ in 0..5 {
        drop(f.take("lo").await);
    }
}
