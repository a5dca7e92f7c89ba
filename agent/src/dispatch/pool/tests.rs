//! Dispatch under tokio's paused clock: permits, FIFO hand-off, deadlines,
//! cancellation, workers coming and going, shutdown.

use std::time::Duration;

use super::*;
use crate::config::WorkerSpec;
use crate::worker::state::WorkerDriver;

pub(super) struct Fixture {
    pub(super) pool: Arc<Pool>,
    pub(super) drivers: Vec<WorkerDriver>,
}

pub(super) fn spec(id: &str, models: &[&str], max_inflight: usize) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        command: "x".into(),
        argv: vec!["x".into()],
        env: Default::default(),
        gpu: None,
        models: models.iter().map(|m| m.to_string()).collect(),
        max_inflight,
        startup_timeout: Duration::from_secs(1),
        stop_grace: Duration::from_secs(1),
        stall: Default::default(),
    }
}

fn fixture(workers_spec: &[(&str, &[&str], usize)], queue: usize) -> Fixture {
    let (workers, drivers): (Vec<_>, Vec<_>) = workers_spec
        .iter()
        .enumerate()
        .map(|(i, (id, models, max))| Worker::new(spec(id, models, *max), i))
        .unzip();
    let pool = Pool::new(workers, 1.0, queue);
    // Each worker says it runs `max` at once: its limit from the start
    // (the adaptive limit has its own tests, in `concurrency`).
    for (i, (_, _, max)) in workers_spec.iter().enumerate() {
        pool.hint_parallelism(i, *max);
    }
    Fixture { pool, drivers }
}

impl Fixture {
    /// Publishes worker `i` as routable or not, as its supervisor would.
    pub(super) fn set_routable(&self, i: usize, routable: bool) {
        crate::testing::publish_routable(&self.pool, &self.drivers[i], i, routable);
    }

    pub(super) fn model(&self, name: &str) -> ModelId {
        self.pool.models().id(name).unwrap()
    }

    pub(super) fn in_flight(&self, i: usize) -> usize {
        self.pool.worker_load(i).0
    }

    /// Spawns a request that waits for a permit and reports which worker
    /// it got (holding the permit until told to let go).
    fn waiter(
        &self,
        model: &str,
        deadline: Option<Instant>,
    ) -> tokio::task::JoinHandle<Result<Lease, AgentError>> {
        let pool = Arc::clone(&self.pool);
        let m = self.model(model);
        tokio::spawn(async move { pool.acquire(m, None, deadline).await })
    }

    /// Lets the spawned requests run until `n` wait in the queue; fails the
    /// test if they never do (they were served or refused instead).
    pub(super) async fn until_queued(&self, n: u64) {
        for _ in 0..10_000 {
            if self.pool.load().queued == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{} queued, never {n}", self.pool.load().queued);
    }
}

#[tokio::test(start_paused = true)]
async fn picks_least_loaded_ready_worker_and_spreads_ties() {
    let f = fixture(&[("a", &["m"], 4), ("b", &["m"], 4)], 4);
    f.set_routable(0, true);
    f.set_routable(1, true);
    let m = f.model("m");
    let l1 = f.pool.acquire(m, None, None).await.unwrap();
    let l2 = f.pool.acquire(m, None, None).await.unwrap();
    assert_ne!(l1.worker().id(), l2.worker().id());
    assert_eq!((f.in_flight(0), f.in_flight(1)), (1, 1));
    drop((l1, l2));
    assert_eq!((f.in_flight(0), f.in_flight(1)), (0, 0));
    assert_eq!(f.pool.worker_load(0).1 + f.pool.worker_load(1).1, 2);
}

#[tokio::test(start_paused = true)]
async fn never_routes_to_a_worker_that_is_not_routable() {
    let f = fixture(&[("a", &["m"], 4), ("b", &["m"], 4)], 4);
    let m = f.model("m");
    assert!(matches!(
        f.pool.acquire(m, None, None).await,
        Err(AgentError::NoReadyWorker(_))
    ));
    f.set_routable(1, true);
    for _ in 0..8 {
        let l = f.pool.acquire(m, None, None).await.unwrap();
        assert_eq!(l.worker().id(), "b");
    }
    assert!(matches!(
        f.pool.unavailable_reason("other"),
        AgentError::UnknownModel(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn queued_requests_get_permits_in_arrival_order() {
    let f = fixture(&[("a", &["m"], 1)], 8);
    f.set_routable(0, true);
    let m = f.model("m");
    let mut held = f.pool.acquire(m, None, None).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let pool = Arc::clone(&f.pool);
        let tx = tx.clone();
        tokio::spawn(async move {
            let lease = pool.acquire(m, None, None).await.unwrap();
            tx.send((i, lease)).unwrap();
        });
        f.until_queued(i + 1).await;
    }
    for expected in 0..5 {
        drop(held);
        let (i, lease) = rx.recv().await.unwrap();
        assert_eq!(i, expected, "FIFO");
        held = lease;
    }
    drop(held);
    assert_eq!((f.in_flight(0), f.pool.load().queued), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_does_not_overtake_a_queued_request() {
    let f = fixture(&[("a", &["m"], 1)], 8);
    f.set_routable(0, true);
    let m = f.model("m");
    let held = f.pool.acquire(m, None, None).await.unwrap();
    let first = f.waiter("m", None);
    f.until_queued(1).await;
    drop(held);
    // The permit went to the queued request: a newcomer now has to queue.
    let second = f.waiter("m", None);
    f.until_queued(1).await;
    let lease = first.await.unwrap().unwrap();
    drop(lease);
    second.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_is_refused_at_once() {
    let f = fixture(&[("a", &["m"], 1)], 1);
    f.set_routable(0, true);
    let m = f.model("m");
    let _held = f.pool.acquire(m, None, None).await.unwrap();
    let _w = f.waiter("m", None);
    f.until_queued(1).await;
    assert!(matches!(
        f.pool.acquire(m, None, None).await,
        Err(AgentError::QueueFull { capacity: 1, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_the_wait_and_leaves_the_queue() {
    let f = fixture(&[("a", &["m"], 1)], 8);
    f.set_routable(0, true);
    let m = f.model("m");
    let held = f.pool.acquire(m, None, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_millis(50);
    assert!(matches!(
        f.pool.acquire(m, None, Some(deadline)).await,
        Err(AgentError::DeadlineInQueue(_))
    ));
    assert_eq!(f.pool.load().queued, 0);
    drop(held);
    assert_eq!(f.in_flight(0), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiters_leave_the_queue_and_leak_no_permit() {
    let f = fixture(&[("a", &["m"], 2)], 64);
    f.set_routable(0, true);
    let m = f.model("m");
    let held: Vec<_> = vec![
        f.pool.acquire(m, None, None).await.unwrap(),
        f.pool.acquire(m, None, None).await.unwrap(),
    ];
    let waiters: Vec<_> = (0..50).map(|_| f.waiter("m", None)).collect();
    f.until_queued(50).await;
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        let _ = w.await;
    }
    assert_eq!(f.pool.load().queued, 0);
    drop(held);
    assert_eq!(f.in_flight(0), 0);
    // Permits still work.
    drop(f.pool.acquire(m, None, None).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn waiters_fail_at_once_when_the_last_worker_for_their_model_goes() {
    let f = fixture(&[("a", &["m"], 1), ("b", &["other"], 1)], 8);
    f.set_routable(0, true);
    f.set_routable(1, true);
    let m = f.model("m");
    let held = f.pool.acquire(m, None, None).await.unwrap();
    let w = f.waiter("m", None);
    f.until_queued(1).await;
    f.set_routable(0, false);
    assert!(matches!(
        w.await.unwrap(),
        Err(AgentError::NoReadyWorker(_))
    ));
    assert_eq!(f.pool.load().queued, 0);
    drop(held);
    assert_eq!(f.in_flight(0), 0);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_becomes_ready_takes_queued_requests() {
    let f = fixture(&[("a", &["m"], 1), ("b", &["m"], 1)], 8);
    f.set_routable(0, true);
    let m = f.model("m");
    let _held = f.pool.acquire(m, None, None).await.unwrap();
    let w = f.waiter("m", None);
    f.until_queued(1).await;
    f.set_routable(1, true);
    assert_eq!(w.await.unwrap().unwrap().worker().id(), "b");
}

#[tokio::test(start_paused = true)]
async fn pinned_requests_only_take_their_workers_permits() {
    let f = fixture(&[("a", &["m"], 1), ("b", &["m"], 1)], 8);
    f.set_routable(0, true);
    f.set_routable(1, true);
    let m = f.model("m");
    let on_a = f.pool.acquire(m, Some(0), None).await.unwrap();
    assert_eq!(on_a.worker().id(), "a");
    let pool = Arc::clone(&f.pool);
    let pinned = tokio::spawn(async move { pool.acquire(m, Some(0), None).await });
    f.until_queued(1).await;
    // b is free, but the pinned request waits for a.
    let on_b = f.pool.acquire(m, None, None).await.unwrap();
    assert_eq!(on_b.worker().id(), "b");
    drop(on_a);
    assert_eq!(pinned.await.unwrap().unwrap().worker().id(), "a");
}

#[tokio::test(start_paused = true)]
async fn close_fails_every_queued_request_and_refuses_new_ones() {
    let f = fixture(&[("a", &["m"], 1)], 1000);
    f.set_routable(0, true);
    let m = f.model("m");
    let held = f.pool.acquire(m, None, None).await.unwrap();
    let waiters: Vec<_> = (0..1000).map(|_| f.waiter("m", None)).collect();
    f.until_queued(1000).await;
    f.pool.close();
    for w in waiters {
        assert!(matches!(w.await.unwrap(), Err(AgentError::ShuttingDown)));
    }
    assert!(matches!(
        f.pool.acquire(m, None, None).await,
        Err(AgentError::ShuttingDown)
    ));
    drop(held);
    assert_eq!((f.in_flight(0), f.pool.load().queued), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn weight_and_load_follow_routable_workers() {
    let f = fixture(&[("a", &["m"], 1), ("b", &["m"], 1)], 1);
    assert_eq!(f.pool.weight(), 0.0);
    f.set_routable(0, true);
    assert_eq!(f.pool.weight(), 0.5);
    assert!(f.pool.any_ready());
    let t = f.pool.admit();
    assert_eq!(f.pool.load().in_flight, 1);
    drop(t);
    assert_eq!(f.pool.load().in_flight, 0);
}

/// A response's report: in flight, queued and weight live, the rest from a
/// snapshot that a change of weight renews at once (no time passes here:
/// the std clock moves by microseconds, far inside `REPORT_REFRESH`).
#[tokio::test(start_paused = true)]
async fn a_report_carries_the_live_weight_and_load_and_repeats_the_rest() {
    let f = fixture(&[("a", &["m"], 1), ("b", &["m"], 1)], 1);
    let first = f.pool.report();
    assert_eq!(first.load.weight, 0.0);
    f.set_routable(0, true);
    let ready = f.pool.report();
    assert_eq!(ready.load.weight, 0.5, "a worker just ready counts at once");
    assert_eq!(ready.snapshot.weight, 0.5, "and the ORCA snapshot agrees");
    let t = f.pool.admit();
    let busy = f.pool.report();
    assert_eq!(busy.load.in_flight, 1, "in flight is live");
    assert_eq!(
        busy.snapshot, ready.snapshot,
        "the rest repeats until renewed"
    );
    drop(t);
    assert_eq!(f.pool.report().load.in_flight, 0);
}

/// The learned capacity (the auto weight) moves with the requests that ran
/// alone — at concurrency 1, every request is one. The report's snapshot
/// follows it at `REPORT_REFRESH`, not on every response (the report would
/// be taken and encoded anew each time); a change of health factor, like
/// one of routability, renews it at once. (The report reads the std clock,
/// which moves by microseconds here, far inside `REPORT_REFRESH`;
/// latencies are on tokio's.)
#[tokio::test(start_paused = true)]
async fn a_report_keeps_its_snapshot_while_the_learned_weight_moves() {
    let (workers, drivers): (Vec<_>, Vec<_>) =
        [Worker::new(spec("a", &["m"], 1), 0)].into_iter().unzip();
    let f = Fixture {
        pool: Pool::new(workers, Weight::Auto, 4),
        drivers,
    };
    f.set_routable(0, true);
    let m = f.model("m");
    let serve = |latency: Duration| {
        let pool = &f.pool;
        async move {
            let mut lease = pool.acquire(m, Some(0), None).await.unwrap();
            tokio::time::advance(latency).await;
            lease.served();
        }
    };
    for _ in 0..40 {
        serve(Duration::from_millis(10)).await;
    }
    let before = f.pool.report();
    assert_eq!(before.snapshot.weight, f.pool.weight());
    // Twice as slow for over half the samples the baseline is the median of.
    for _ in 0..=crate::worker::concurrency::SOLO_SAMPLES / 2 {
        serve(Duration::from_millis(20)).await;
    }
    let moved = f.pool.weight();
    assert!(
        moved < 0.9 * before.snapshot.weight,
        "{moved} after {before:?}"
    );
    let after = f.pool.report();
    assert_eq!(after.snapshot, before.snapshot, "the snapshot repeats");
    assert_eq!(after.load.weight, before.load.weight);
    f.pool.set_health(&[0.5]);
    let halved = f.pool.weight();
    assert!(
        (halved - 0.5 * moved).abs() < 0.002,
        "{halved} from {moved}"
    );
    let renewed = f.pool.report();
    assert_eq!(
        renewed.snapshot.weight, halved,
        "a health change is at once"
    );
    assert_eq!(renewed.load.weight, halved);
    f.pool.set_health(&[0.5]);
    assert_eq!(
        f.pool.report().snapshot,
        renewed.snapshot,
        "the same factor again"
    );
}

#[tokio::test(start_paused = true)]
async fn auto_weight_sums_the_measured_capacity_of_routable_workers() {
    let (workers, _drivers): (Vec<_>, Vec<_>) = [("a", 1), ("b", 1), ("c", 1)]
        .iter()
        .enumerate()
        .map(|(i, (id, max))| Worker::new(spec(id, &["m"], *max), i))
        .unzip();
    let f = Fixture {
        pool: Pool::new(workers, Weight::Auto, 4),
        drivers: _drivers,
    };
    // Nothing measured: the prior per routable worker.
    assert_eq!(f.pool.weight(), 0.0);
    f.set_routable(0, true);
    f.set_routable(1, true);
    assert_eq!(f.pool.weight(), 2.0 * capacity::PRIOR_PER_SLOT);
    // Worker a answers 40 requests of 10 ms, one at a time; b fails 40 (no
    // answer: no latency sample, so a worker failing fast does not look
    // fast).
    let m = f.model("m");
    for _ in 0..40 {
        let mut lease = f.pool.acquire(m, Some(0), None).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        lease.served();
        drop(lease);
        drop(f.pool.acquire(m, Some(1), None).await.unwrap());
    }
    let limits = f.pool.worker_limits();
    let Some(a) = limits[0].capacity else {
        panic!("a is measured: {limits:?}");
    };
    assert!((a - 100.0).abs() < 1.0, "one at a time, 10 ms each: {a}");
    assert_eq!(limits[0].unloaded, Some(Duration::from_millis(10)));
    assert_eq!((limits[1].capacity, limits[2].capacity), (None, None));
    // The weight is advertised in thousandths (as the trailer writes it).
    let milli = |x: f64| (x * 1000.0).round() / 1000.0;
    // b, routable but unmeasured, counts at a's value; c is not routable.
    assert_eq!(f.pool.weight(), milli(2.0 * a));
    assert_eq!(f.pool.load().weight, milli(2.0 * a));
    assert!((f.pool.score() - 3.0 * a).abs() < 1e-9);
    // Idle time holds the estimate; the health factors scale each worker.
    tokio::time::advance(Duration::from_secs(60)).await;
    f.pool.set_health(&[0.5, 1.0, 1.0]);
    assert_eq!(f.pool.worker_limits()[0].capacity, Some(a));
    assert_eq!(f.pool.weight(), milli(1.5 * a));
    f.set_routable(1, false);
    assert_eq!(f.pool.weight(), milli(0.5 * a));
}

/// A worker's permits are its adaptive limit: a worker that says it runs
/// 2 at once (max_inflight 8) gets 3 (2 + headroom) until measured.
#[tokio::test(start_paused = true)]
async fn the_limit_not_max_inflight_bounds_the_permits() {
    let f = fixture(&[("a", &["m"], 8)], 8);
    f.pool.hint_parallelism(0, 2);
    f.set_routable(0, true);
    let m = f.model("m");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(f.pool.acquire(m, None, None).await.unwrap());
    }
    let fourth = f.waiter("m", None);
    f.until_queued(1).await;
    assert_eq!(f.in_flight(0), 3);
    assert_eq!(f.pool.worker_limits()[0].limit, 3);
    drop(held.pop());
    let lease = fourth.await.unwrap().unwrap();
    assert_eq!(lease.worker().id(), "a");
}
