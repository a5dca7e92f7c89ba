//! The pool of local workers and the admission path of every request.
//!
//! A request is first *admitted* (counted in the node's in-flight, which
//! drives the busy ratio and the load report), then *dispatched*: it takes a
//! slot on the ready worker hosting its model with the fewest requests in
//! flight. When every such worker is at `max_inflight`, it waits in a bounded
//! per-model queue until a slot frees or its deadline passes; a full queue is
//! refused at once with RESOURCE_EXHAUSTED so the client retries elsewhere
//! instead of waiting. Requests are never queued for a model with no ready
//! worker: those get UNAVAILABLE at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use infermesh_proto::inference::ModelMetadataResponse;
use infermesh_proto::load::LoadReport;
use tokio::sync::Notify;

use crate::busy::BusyWindow;
use crate::error::AgentError;
use infermesh_sentinel::State;

use crate::worker::{Process, Worker};

/// All workers of this agent.
#[derive(Debug)]
pub struct Pool {
    workers: Vec<Arc<Worker>>,
    weight: f64,
    queue_capacity: usize,
    sched: Mutex<Sched>,
    slot_freed: Notify,
    metadata: RwLock<HashMap<String, Arc<ModelMetadataResponse>>>,
    stopping: AtomicBool,
    draining: AtomicBool,
    cursor: AtomicUsize,
}

#[derive(Debug, Default)]
struct Sched {
    in_flight: u64,
    queued: HashMap<String, usize>,
    busy: BusyWindow,
}

enum Pick {
    Got(Arc<Worker>),
    AllBusy,
    NoneReady,
    Unknown,
}

impl Pool {
    /// A pool over `workers`, advertising `weight` when all are ready.
    pub fn new(workers: Vec<Arc<Worker>>, weight: f64, queue_capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            workers,
            weight,
            queue_capacity,
            sched: Mutex::new(Sched::default()),
            slot_freed: Notify::new(),
            metadata: RwLock::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            cursor: AtomicUsize::new(0),
        })
    }

    /// The workers.
    pub fn workers(&self) -> &[Arc<Worker>] {
        &self.workers
    }

    /// Counts a request as in flight at this node until the ticket drops.
    pub fn admit(self: &Arc<Self>) -> Ticket {
        let mut s = self.sched.lock().expect("sched lock");
        if s.in_flight == 0 {
            s.busy.start(Instant::now());
        }
        s.in_flight += 1;
        Ticket {
            pool: Arc::clone(self),
        }
    }

    /// Wakes queued requests: a slot freed, or a worker changed state.
    pub(crate) fn wake(&self) {
        self.slot_freed.notify_waiters();
    }

    fn pick(&self, model: &str) -> Pick {
        // Candidates in a rotating order, so that ties (e.g. all idle) spread
        // over workers; the stable sort then puts the least loaded first. The
        // least loaded may fill up before we take its slot, so try in order.
        let n = self.workers.len();
        let offset = self.cursor.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let mut ready: Vec<&Arc<Worker>> = self
            .workers
            .iter()
            .cycle()
            .skip(offset)
            .take(n)
            .filter(|w| w.routable() && w.hosts(model))
            .collect();
        if ready.is_empty() {
            return self.none_ready(model);
        }
        ready.sort_by_key(|w| w.in_flight());
        match ready.into_iter().find(|w| w.try_take_slot()) {
            Some(w) => Pick::Got(Arc::clone(w)),
            None => Pick::AllBusy,
        }
    }

    /// With no ready worker for `model`: does any worker (maybe) host it?
    fn none_ready(&self, model: &str) -> Pick {
        let hosted = self.workers.iter().any(|w| w.hosts(model));
        // A worker still starting may not have told us its models yet.
        let unknown = self
            .workers
            .iter()
            .any(|w| w.models().is_none() && w.state() != State::Quarantined);
        if hosted || unknown {
            Pick::NoneReady
        } else {
            Pick::Unknown
        }
    }

    /// Models' metadata as the workers describe them.
    pub fn metadata(&self, model: &str) -> Option<Arc<ModelMetadataResponse>> {
        self.metadata
            .read()
            .expect("metadata lock")
            .get(model)
            .cloned()
    }

    pub(crate) fn set_metadata(&self, meta: ModelMetadataResponse) {
        let mut map = self.metadata.write().expect("metadata lock");
        if let Some(old) = map.get(&meta.name) {
            if old.inputs != meta.inputs || old.outputs != meta.outputs {
                tracing::warn!(model = %meta.name, "workers describe this model differently; keeping the newest description");
            }
        }
        map.insert(meta.name.clone(), Arc::new(meta));
    }

    /// Why `model` cannot be served right now, when it cannot.
    pub fn unavailable_reason(&self, model: &str) -> AgentError {
        match self.none_ready(model) {
            Pick::Unknown => AgentError::UnknownModel(model.to_string()),
            _ => AgentError::NoReadyWorker(model.to_string()),
        }
    }

    /// A ready worker hosting `model` (least loaded), for metadata-type calls
    /// that take no slot.
    pub fn any_ready_for(&self, model: &str) -> Option<Arc<Worker>> {
        self.workers
            .iter()
            .filter(|w| w.routable() && w.hosts(model))
            .min_by_key(|w| w.in_flight())
            .cloned()
    }

    /// Whether a GPU fault quarantined any worker (the node is degraded).
    pub fn degraded(&self) -> bool {
        self.workers.iter().any(|w| w.state() == State::Quarantined)
    }

    /// Whether any worker is ready.
    pub fn any_ready(&self) -> bool {
        self.workers.iter().any(|w| w.routable())
    }

    /// Whether `model` has a ready worker.
    pub fn model_ready(&self, model: &str) -> bool {
        self.any_ready_for(model).is_some()
    }

    /// Every model any worker serves, and whether it has a ready worker.
    pub fn models(&self) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = Vec::new();
        for w in &self.workers {
            for m in w.models().iter().flat_map(|m| m.iter()) {
                let ready = w.routable();
                match out.iter_mut().find(|(n, _)| n == m) {
                    Some(e) => e.1 |= ready,
                    None => out.push((m.clone(), ready)),
                }
            }
        }
        out
    }

    /// Configured weight × share of workers routable.
    pub fn weight(&self) -> f64 {
        if self.workers.is_empty() {
            return 0.0;
        }
        let ready = self.workers.iter().filter(|w| w.routable()).count();
        self.weight * ready as f64 / self.workers.len() as f64
    }

    /// The node's current load.
    pub fn load(&self) -> LoadReport {
        let mut s = self.sched.lock().expect("sched lock");
        let queued = s.queued.values().sum::<usize>() as u64;
        LoadReport {
            in_flight: s.in_flight,
            queued,
            busy_ratio: s.busy.ratio(Instant::now()),
            weight: self.weight(),
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

/// A request counted in the node's in-flight.
#[derive(Debug)]
pub struct Ticket {
    pool: Arc<Pool>,
}

impl Ticket {
    /// Waits for a slot on a ready worker hosting `model`, queueing (bounded)
    /// while all are busy, until `deadline`.
    pub async fn dispatch(
        &self,
        model: &str,
        deadline: Option<Instant>,
    ) -> Result<Lease, AgentError> {
        let pool = &self.pool;
        let mut queued: Option<QueueSpot<'_>> = None;
        loop {
            let freed = pool.slot_freed.notified();
            tokio::pin!(freed);
            // Register before looking, so a slot freed in between wakes us.
            freed.as_mut().enable();
            match pool.pick(model) {
                Pick::Got(worker) => {
                    return Ok(Lease {
                        pool: Arc::clone(pool),
                        worker,
                        model: model.to_string(),
                    });
                }
                Pick::Unknown => return Err(AgentError::UnknownModel(model.to_string())),
                Pick::NoneReady => return Err(AgentError::NoReadyWorker(model.to_string())),
                Pick::AllBusy => {}
            }
            if queued.is_none() {
                queued = Some(QueueSpot::take(pool, model)?);
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d.into(), freed).await.is_err() {
                        return Err(AgentError::DeadlineInQueue(model.to_string()));
                    }
                }
                None => freed.await,
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.pool.sched.lock().expect("sched lock");
        s.in_flight -= 1;
        if s.in_flight == 0 {
            s.busy.stop(Instant::now());
        }
    }
}

/// A place in a model's queue, given back on drop.
struct QueueSpot<'a> {
    pool: &'a Pool,
    model: String,
}

impl<'a> QueueSpot<'a> {
    fn take(pool: &'a Pool, model: &str) -> Result<Self, AgentError> {
        let mut s = pool.sched.lock().expect("sched lock");
        let n = s.queued.entry(model.to_string()).or_default();
        if *n >= pool.queue_capacity {
            return Err(AgentError::QueueFull {
                model: model.to_string(),
                capacity: pool.queue_capacity,
            });
        }
        *n += 1;
        Ok(Self {
            pool,
            model: model.to_string(),
        })
    }
}

impl Drop for QueueSpot<'_> {
    fn drop(&mut self) {
        let mut s = self.pool.sched.lock().expect("sched lock");
        if let Some(n) = s.queued.get_mut(&self.model) {
            *n -= 1;
        }
    }
}

/// A slot on one worker, released (and queued requests woken) on drop.
#[derive(Debug)]
pub struct Lease {
    pool: Arc<Pool>,
    worker: Arc<Worker>,
    model: String,
}

impl Lease {
    /// The worker holding the slot.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// Its process; [`AgentError::NoReadyWorker`] if it has just gone.
    pub fn process(&self) -> Result<Process, AgentError> {
        self.worker
            .process()
            .ok_or_else(|| AgentError::NoReadyWorker(self.model.clone()))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.worker.release_slot();
        self.pool.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerSpec;
    use std::time::Duration;

    fn worker(id: &str, models: &[&str], max_inflight: usize) -> Arc<Worker> {
        let (w, _inputs) = Worker::new(WorkerSpec {
            id: id.into(),
            command: "x".into(),
            argv: vec!["x".into()],
            env: Default::default(),
            gpu: None,
            models: models.iter().map(|m| m.to_string()).collect(),
            max_inflight,
            startup_timeout: Duration::from_secs(1),
            stop_grace: Duration::from_secs(1),
        });
        w
    }

    #[tokio::test]
    async fn picks_least_loaded_ready_worker() {
        let (a, b) = (worker("a", &["m"], 4), worker("b", &["m"], 4));
        a.set_routable(true);
        b.set_routable(true);
        let pool = Pool::new(vec![a.clone(), b.clone()], 1.0, 4);
        let t = pool.admit();
        let l1 = t.dispatch("m", None).await.unwrap();
        let l2 = t.dispatch("m", None).await.unwrap();
        assert_ne!(l1.worker().id(), l2.worker().id());
        assert_eq!((a.in_flight(), b.in_flight()), (1, 1));
        drop((l1, l2));
        assert_eq!((a.in_flight(), b.in_flight()), (0, 0));
    }

    #[tokio::test]
    async fn never_routes_to_starting_or_exited_workers() {
        let (a, b) = (worker("a", &["m"], 4), worker("b", &["m"], 4));
        a.set_state(State::Failed);
        let pool = Pool::new(vec![a, b], 1.0, 4);
        let t = pool.admit();
        assert!(matches!(
            t.dispatch("m", None).await,
            Err(AgentError::NoReadyWorker(_))
        ));
        assert!(matches!(
            t.dispatch("other", None).await,
            Err(AgentError::UnknownModel(_))
        ));
    }

    #[tokio::test]
    async fn full_queue_is_refused_and_queued_request_gets_the_freed_slot() {
        let a = worker("a", &["m"], 1);
        a.set_routable(true);
        let pool = Pool::new(vec![a], 1.0, 1);
        let t = pool.admit();
        let busy = t.dispatch("m", None).await.unwrap();
        let waiter = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                pool.admit()
                    .dispatch("m", None)
                    .await
                    .map(|l| l.worker().id().to_string())
            })
        };
        // Wait for the waiter to sit in the queue (an event we can observe).
        while pool.load().queued == 0 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            t.dispatch("m", None).await,
            Err(AgentError::QueueFull { .. })
        ));
        drop(busy);
        assert_eq!(waiter.await.unwrap().unwrap(), "a");
        assert_eq!(pool.load().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_ends_the_wait_in_queue() {
        let a = worker("a", &["m"], 1);
        a.set_routable(true);
        let pool = Pool::new(vec![a], 1.0, 8);
        let t = pool.admit();
        let _busy = t.dispatch("m", None).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(matches!(
            t.dispatch("m", Some(deadline)).await,
            Err(AgentError::DeadlineInQueue(_))
        ));
    }

    #[test]
    fn weight_scales_with_ready_share() {
        let (a, b) = (worker("a", &["m"], 1), worker("b", &["m"], 1));
        a.set_routable(true);
        let pool = Pool::new(vec![a, b], 2.0, 1);
        assert_eq!(pool.weight(), 1.0);
    }
}
