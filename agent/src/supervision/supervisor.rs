//! The driver of one worker: it feeds the worker's [`Sentinel`] with what
//! happens (process exits, fault lines, probe results, GPU faults, request
//! errors, operator requests, time) and carries out the actions it returns
//! (stop/resume routing, SIGTERM → SIGKILL, spawn). All policy is in the
//! sentinel; this file only does I/O.
//!
//! It is the **only writer** of the worker's state: it keeps a
//! [`WorkerSnapshot`], publishes it after every change and then tells the
//! pool ([`Pool::worker_changed`]), so routing changes take effect before
//! the supervisor awaits anything else. Its inputs arrive through the
//! worker's inbox ([`crate::worker::inbox`]): control messages first (they are never
//! dropped), coalesced reports after. It ends when `cancel` fires, after
//! stopping the worker (SIGTERM, SIGKILL after `stop_grace`).
//!
//! Probing: while the worker starts, `ServerLive`, its models (learned with
//! `RepositoryIndex` when not configured), `ModelReady` and `ModelMetadata`
//! are polled every 25 ms until ready, then its health checks gate it. Once
//! ready, a liveness probe (`ServerLive` + `ModelReady`) runs every
//! `probe_interval` on the [`Prober`]'s thread, over a connection of its
//! own; one not answered within `probe_timeout` (timed there, so a busy
//! agent is not taken for a hung worker) is reported as a timeout (a hang). While it serves, the progress of its requests
//! ([`Pool::progress`]) is fed to the sentinel every
//! [`PROGRESS_INTERVAL`] for the stall watchdog; when the sentinel gives up
//! on a stuck process its requests in flight are aborted
//! ([`Process::abort`]), so their callers are answered at once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_health::Verdict;
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{
    ModelConfigRequest, ModelMetadataRequest, ModelReadyRequest, RepositoryIndexRequest,
    ServerLiveRequest,
};
use infermesh_sentinel::{
    Action, Event, FaultPatterns, FaultReason, Notice, Sentinel, SentinelConfig, State,
};
use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Channel;

use crate::config::HealthConfig;
use crate::dispatch::pool::Pool;
use crate::metrics::Metrics;
use crate::supervision::health;
use crate::supervision::launch::{Exit, Launched, Launcher, OutputSink};
use crate::supervision::prober::Prober;
use crate::supervision::spawn::describe;
use crate::worker::inbox::{Control, Input, MAX_ERRORS_PER_WAKE, ProcessReports};
use crate::worker::state::{Process, Worker, WorkerDriver, WorkerSnapshot};
use crate::worker::upstream::Upstream;
use crate::worker::worker_log::HealthRecord;

/// Why the requests on a worker the sentinel gave up on are failed.
pub(crate) const ABORTED: &str = "it stopped answering requests and is being restarted";

/// Interval between readiness probes while a worker starts.
const READY_POLL: Duration = Duration::from_millis(25);
/// Timeout of one startup readiness call.
const STARTUP_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Retry interval of the startup gate while a health check fails (checks
/// are heavier than the 25 ms readiness poll).
const HEALTH_GATE_RETRY: Duration = Duration::from_secs(1);
/// How often a serving worker's progress is fed to the stall watchdog: a
/// stall is caught within its window plus this.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// What a supervisor needs besides its worker.
#[derive(Clone)]
pub struct Context {
    /// The pool the worker belongs to.
    pub pool: Arc<Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Largest gRPC message.
    pub max_message_bytes: usize,
    /// Fault patterns for worker output.
    pub patterns: Arc<FaultPatterns>,
    /// Sentinel policy (the startup timeout comes from the worker spec).
    pub sentinel: SentinelConfig,
    /// Liveness probe interval.
    pub probe_interval: Duration,
    /// Liveness probe timeout.
    pub probe_timeout: Duration,
    /// Where liveness probes run ([`Prober`]: on a thread of their own).
    pub prober: Arc<Prober>,
    /// Health checks and their schedule.
    pub health: Arc<HealthConfig>,
    /// Starts worker processes.
    pub launcher: Arc<dyn Launcher>,
    /// Where connection tasks to workers are tracked.
    pub tasks: TaskTracker,
    /// HTTP/2 connections to each worker process ([`Upstream`]).
    pub worker_connections: usize,
}

enum ProbeKind {
    Startup,
    Liveness,
}

struct ProbeResult {
    generation: u64,
    kind: ProbeKind,
    ok: bool,
    /// Startup only: live and ready, but a health check failed.
    unhealthy: bool,
    /// Startup only: the models the worker listed, when it was asked.
    models: Option<Vec<String>>,
    /// Startup only: the verdicts of the gate's health checks.
    verdicts: Vec<Verdict>,
}

type ProbeFuture = Pin<Box<dyn Future<Output = ProbeResult> + Send>>;

/// The verdicts of one health round, for the process of `generation`.
struct HealthRound {
    generation: u64,
    verdicts: Vec<Verdict>,
}

type HealthFuture = Pin<Box<dyn Future<Output = HealthRound> + Send>>;

/// Runs `worker` until `cancel` fires, then stops it and returns.
pub async fn supervise(
    worker: Arc<Worker>,
    driver: WorkerDriver,
    ctx: Context,
    seed: u64,
    cancel: CancellationToken,
) {
    let config = SentinelConfig {
        startup_timeout: worker.spec.startup_timeout,
        stall: worker.spec.stall,
        ..ctx.sentinel.clone()
    };
    let mut progress = tokio::time::interval(PROGRESS_INTERVAL);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let snap = WorkerSnapshot::clone(&worker.snapshot());
    let mut s = Supervisor {
        sentinel: Sentinel::new(config, seed),
        worker,
        driver,
        ctx,
        snap,
        dirty: false,
        child: None,
        generation: 0,
        spawned_at: None,
        kill_at: None,
        next_probe: None,
        probe: None,
        probe_client: None,
        next_health: None,
        health: None,
        health_waiting: Vec::new(),
        rng: seed ^ 0x9e37_79b9_7f4a_7c15,
        progress,
    };
    let actions = s.sentinel.start(now());
    s.execute_all(actions);
    s.publish();
    s.run(cancel).await;
}

struct Supervisor {
    worker: Arc<Worker>,
    driver: WorkerDriver,
    ctx: Context,
    sentinel: Sentinel,
    /// What is published; `dirty` once it changed since the last publish.
    snap: WorkerSnapshot,
    dirty: bool,
    child: Option<Box<dyn Launched>>,
    /// Incremented per spawn, so a probe of an earlier process is ignored.
    generation: u64,
    spawned_at: Option<Instant>,
    /// When to SIGKILL a process that got SIGTERM.
    kill_at: Option<Instant>,
    next_probe: Option<Instant>,
    probe: Option<ProbeFuture>,
    /// The current process's client for liveness probes and health rounds,
    /// its connection driven by the prober's runtime; `None`: the
    /// process's own client ([`Supervisor::prober_client`]).
    probe_client: Option<GrpcInferenceServiceClient<Channel>>,
    next_health: Option<Instant>,
    health: Option<HealthFuture>,
    /// Callers of `RunHealthChecks` waiting for the running round.
    health_waiting: Vec<oneshot::Sender<Vec<Verdict>>>,
    /// splitmix64 state for the health-check jitter.
    rng: u64,
    /// Ticks of the stall watchdog's progress feed.
    progress: tokio::time::Interval,
}

impl Supervisor {
    async fn run(&mut self, cancel: CancellationToken) {
        loop {
            let wake = [
                self.sentinel.poll_timeout(),
                self.kill_at,
                self.next_probe,
                self.next_health,
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.stop().await;
                    return;
                }
                input = self.driver.inbox.recv() => match input {
                    Input::Control(c) => self.control(c),
                    Input::Reports(r) => self.reports(r),
                    Input::Closed => {}
                },
                exit = wait(&mut self.child) => self.exited(exit),
                result = poll(&mut self.probe) => {
                    self.probe = None;
                    self.on_probe(result);
                }
                round = poll(&mut self.health) => {
                    self.health = None;
                    self.on_health(round);
                }
                _ = self.progress.tick(), if self.watching() => {
                    let progress = self.ctx.pool.progress(self.worker.index);
                    self.feed(Event::Progress(progress));
                }
                _ = sleep_until(wake) => self.on_timer(),
            }
            self.publish();
        }
    }

    /// Publishes the snapshot if it changed, then lets the pool act on it.
    fn publish(&mut self) {
        if std::mem::take(&mut self.dirty) {
            self.driver
                .publisher
                .send_replace(Arc::new(self.snap.clone()));
            self.ctx.pool.worker_changed(self.worker.index);
        }
    }

    fn update(&mut self, f: impl FnOnce(&mut WorkerSnapshot)) {
        f(&mut self.snap);
        self.dirty = true;
    }

    /// Whether the stall watchdog looks at this worker now: it serves.
    fn watching(&self) -> bool {
        self.child.is_some()
            && self.worker.spec.stall != infermesh_sentinel::StallWindow::Off
            && matches!(
                self.sentinel.state(),
                State::Ready | State::Degraded | State::Draining
            )
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid())
    }

    fn control(&mut self, c: Control) {
        match c {
            Control::Sentinel(event) => self.feed(event),
            Control::Process { pid, event } => {
                if self.pid() == Some(pid) {
                    self.feed(event);
                } else {
                    tracing::debug!(worker = %self.worker.id(), pid, ?event, "report about a former process ignored");
                }
            }
            Control::RunHealthChecks(reply) => {
                let serving = matches!(
                    self.sentinel.state(),
                    State::Ready | State::Degraded | State::Draining
                );
                if !serving {
                    let _ = reply.send(Vec::new());
                    return;
                }
                self.health_waiting.push(reply);
                if self.health.is_none() {
                    self.next_health = None;
                    self.start_health();
                }
            }
        }
    }

    fn reports(&mut self, reports: Vec<ProcessReports>) {
        for r in reports {
            if self.pid() != Some(r.pid) {
                tracing::debug!(worker = %self.worker.id(), pid = r.pid, "reports about a former process ignored");
                continue;
            }
            if let Some((pattern, line)) = r.fault {
                self.feed(Event::FaultLine { pattern, line });
            }
            for _ in 0..r.errors.min(MAX_ERRORS_PER_WAKE) {
                self.feed(Event::RequestError);
            }
        }
    }

    fn feed(&mut self, event: Event) {
        let actions = self.sentinel.handle(now(), event);
        self.execute_all(actions);
    }

    fn execute_all(&mut self, actions: Vec<Action>) {
        let mut queue = VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            if let Some(event) = self.execute(action) {
                queue.extend(self.sentinel.handle(now(), event));
            }
        }
    }

    /// Carries out one action; returns the event it produced, if any.
    fn execute(&mut self, action: Action) -> Option<Event> {
        let id = self.worker.id().to_string();
        let log = Arc::clone(&self.driver.log);
        match action {
            Action::StopRouting => {
                self.update(|s| s.routable = false);
                // Now, not at the end of this round of actions.
                self.publish();
                log.push_event("stop_routing", String::new());
                tracing::warn!(worker = %id, "stopped routing to worker");
            }
            Action::ResumeRouting => {
                self.update(|s| s.routable = true);
                log.push_event("resume_routing", String::new());
                tracing::info!(worker = %id, "routing to worker");
            }
            Action::AbortInFlight => {
                if let Some(process) = &self.snap.process {
                    process.abort.cancel();
                    process.upstream.abort(ABORTED);
                    let (in_flight, _) = self.ctx.pool.worker_load(self.worker.index);
                    tracing::warn!(worker = %id, pid = process.pid, in_flight, "answering the requests in flight on the stuck worker with UNAVAILABLE");
                    log.push_event("abort_in_flight", format!("{in_flight} request(s)"));
                }
            }
            Action::Kill { grace } => {
                if let Some(child) = self.child.as_mut() {
                    child.signal(Signal::SIGTERM);
                    self.kill_at = Some(now() + grace);
                    tracing::warn!(worker = %id, pid = child.pid(), ?grace, "stopping worker (SIGTERM, SIGKILL after grace)");
                }
            }
            Action::Spawn => return Some(self.spawn()),
            Action::SetState(state) => {
                let startup_ms = match state {
                    State::Ready | State::Degraded | State::Draining => {
                        if self.next_probe.is_none() && self.probe.is_none() {
                            self.next_probe = Some(now() + self.ctx.probe_interval);
                        }
                        if self.next_health.is_none() && self.health.is_none() {
                            self.schedule_health();
                        }
                        self.spawned_at.map_or(0, |at| {
                            now().saturating_duration_since(at).as_millis() as u64
                        })
                    }
                    _ => 0,
                };
                self.update(|s| {
                    s.state = state;
                    s.startup_ms = startup_ms;
                });
                log.push_event("state", state.as_str().to_string());
                tracing::info!(worker = %id, state = state.as_str(), "worker state");
            }
            Action::Emit(notice) => self.notice(notice),
        }
        None
    }

    fn notice(&mut self, notice: Notice) {
        let id = self.worker.id().to_string();
        let log = Arc::clone(&self.driver.log);
        match notice {
            // An operator's restart is not a fault: it is counted in
            // `worker_restarts{reason="operator"}` only and leaves `last_fault` alone.
            Notice::Fault {
                reason: FaultReason::Operator,
                detail,
            } => {
                tracing::info!(worker = %id, %detail, "operator restart: stopping the worker");
                log.push_event("operator", detail);
            }
            Notice::Fault { reason, detail } => {
                tracing::error!(worker = %id, reason = reason.as_label(), %detail, "worker fault detected");
                self.ctx.metrics.worker_fault(&id, reason.as_label());
                let fault = format!("{}: {detail}", reason.as_label());
                log.push_event("fault", fault.clone());
                self.update(|s| s.last_fault = Some(fault));
            }
            Notice::Restart { reason, delay } => {
                tracing::warn!(worker = %id, reason = reason.as_label(), ?delay, "restarting worker");
                self.ctx.metrics.worker_restarted(&id, reason.as_label());
                self.update(|s| s.restarts += 1);
                log.push_event("restart", format!("{} after {delay:?}", reason.as_label()));
            }
            Notice::Quarantine { xid, detail } => {
                tracing::error!(
                    worker = %id, xid, gpu = ?self.worker.spec.gpu, %detail,
                    "GPU quarantined: not restarting the worker; the GPU needs a reset"
                );
                let fault = format!("xid {xid}: {detail}");
                log.push_event("quarantine", fault.clone());
                self.update(|s| s.last_fault = Some(fault));
            }
            Notice::Suspect { xid, window } => {
                tracing::warn!(
                    worker = %id, xid, gpu = ?self.worker.spec.gpu, ?window,
                    "GPU Xid named no process: worker suspect; a failure within the window restarts it"
                );
                log.push_event(
                    "suspect",
                    format!("xid {xid} on its GPU named no process; suspect for {window:?}"),
                );
            }
            Notice::Recovered => {
                tracing::info!(worker = %id, "worker recovered");
                log.push_event("recovered", String::new());
            }
            Notice::Stable => {
                tracing::info!(worker = %id, "worker stable; crash-loop backoff reset");
                log.push_event("stable", String::new());
            }
        }
    }

    fn spawn(&mut self) -> Event {
        let id = self.worker.id().to_string();
        let output = OutputSink {
            worker: Arc::from(id.as_str()),
            patterns: Arc::clone(&self.ctx.patterns),
            log: Arc::clone(&self.driver.log),
            reporter: self.driver.reporter.clone(),
        };
        match self.ctx.launcher.launch(&self.worker.spec, output) {
            Ok(child) => {
                let (pid, address) = (child.pid(), child.address());
                tracing::info!(
                    worker = %id, pid, %address,
                    command = %self.worker.spec.command, "worker started"
                );
                self.generation += 1;
                self.child = Some(child);
                self.spawned_at = Some(now());
                let process = Arc::new(Process {
                    pid,
                    address,
                    client: client(address, self.ctx.max_message_bytes),
                    upstream: Upstream::new(
                        address,
                        self.ctx.tasks.clone(),
                        self.ctx.worker_connections,
                    ),
                    abort: CancellationToken::new(),
                    open_uploads: Default::default(),
                });
                self.update(|s| s.process = Some(process));
                self.driver.log.push_event("spawned", format!("pid {pid}"));
                self.probe = None;
                self.probe_client = self.ctx.prober.client(address, self.ctx.max_message_bytes);
                self.next_probe = Some(now());
                self.health = None;
                self.next_health = None;
                Event::Spawned
            }
            Err(e) => {
                tracing::error!(worker = %id, command = %self.worker.spec.command, error = %e, "cannot start worker");
                self.update(|s| s.last_exit = Some(format!("spawn failed: {e}")));
                Event::SpawnFailed {
                    error: e.to_string(),
                }
            }
        }
    }

    fn exited(&mut self, exit: Exit) {
        let pid = self.pid().unwrap_or_default();
        self.child = None;
        let how = describe(exit.code, exit.signal);
        tracing::warn!(worker = %self.worker.id(), pid, exit = %how, "worker exited");
        self.driver.log.push_event("exited", how.clone());
        self.ctx.metrics.worker_exited(self.worker.id());
        self.update(|s| {
            s.process = None;
            s.last_exit = Some(how);
        });
        // Answer anyone waiting for a round of a process that is gone.
        self.health = None;
        self.answer_health(Vec::new());
        self.kill_at = None;
        self.feed(Event::Exited {
            code: exit.code,
            signal: exit.signal,
        });
    }

    fn on_timer(&mut self) {
        let now = now();
        if self.kill_at.is_some_and(|t| t <= now) {
            self.kill_at = None;
            if let Some(child) = self.child.as_mut() {
                tracing::warn!(worker = %self.worker.id(), pid = child.pid(), "worker ignored SIGTERM; sending SIGKILL");
                child.signal(Signal::SIGKILL);
            }
        }
        if self.next_probe.is_some_and(|t| t <= now) {
            self.next_probe = None;
            self.start_probe();
        }
        if self.next_health.is_some_and(|t| t <= now) {
            self.next_health = None;
            self.start_health();
        }
        self.feed(Event::Tick);
    }

    fn start_probe(&mut self) {
        let Some(process) = self.snap.process.clone().filter(|_| self.child.is_some()) else {
            return;
        };
        let generation = self.generation;
        let pool = Arc::clone(&self.ctx.pool);
        let timeout = self.ctx.probe_timeout;
        let health = Arc::clone(&self.ctx.health);
        let metrics = Arc::clone(&self.ctx.metrics);
        let snap = self.snap.clone();
        let id = self.worker.id().to_string();
        let index = self.worker.index;
        self.probe = match self.sentinel.state() {
            State::Starting => Some(Box::pin(async move {
                let client = process.client.clone();
                let (ready, models) = startup_ready(&id, &snap, &pool, client.clone()).await;
                if ready {
                    let served = models.as_deref().or(snap.models.as_deref()).unwrap_or(&[]);
                    if let Some(n) = parallelism(served, client.clone()).await {
                        pool.hint_parallelism(index, n);
                    }
                }
                // The startup gate: a worker that answers but computes
                // wrong results must not take traffic.
                let snap = WorkerSnapshot {
                    models: models.clone().map(Arc::from).or(snap.models),
                    ..snap
                };
                let verdicts = if ready {
                    health::run_round(&health, &id, &snap, &metrics, client).await
                } else {
                    Vec::new()
                };
                let healthy = verdicts.iter().all(|v| v.pass);
                ProbeResult {
                    generation,
                    kind: ProbeKind::Startup,
                    ok: ready && healthy,
                    unhealthy: !healthy,
                    models,
                    verdicts,
                }
            })),
            State::Ready | State::Degraded | State::Draining => {
                let models = snap.models.clone().unwrap_or_else(|| Arc::from(Vec::new()));
                let prober = Arc::clone(&self.ctx.prober);
                let client = self.prober_client(&process);
                Some(Box::pin(async move {
                    // Timed on the prober's thread: a verdict of the
                    // worker, however busy this runtime is.
                    let ok = prober.live(client, models, timeout).await;
                    ProbeResult {
                        generation,
                        kind: ProbeKind::Liveness,
                        ok,
                        unhealthy: false,
                        models: None,
                        verdicts: Vec::new(),
                    }
                }))
            }
            _ => None,
        };
    }

    fn on_probe(&mut self, result: ProbeResult) {
        if result.generation != self.generation || self.child.is_none() {
            return;
        }
        if let Some(models) = result.models {
            self.update(|s| s.models = Some(Arc::from(models)));
        }
        if !result.verdicts.is_empty() {
            self.driver
                .log
                .record_health(result.verdicts.into_iter().map(HealthRecord::now));
        }
        let now = now();
        match result.kind {
            ProbeKind::Startup if result.ok => {
                self.next_probe = Some(now + self.ctx.probe_interval);
                self.feed(Event::BecameReady);
            }
            ProbeKind::Startup => {
                if self.sentinel.state() == State::Starting {
                    let retry = if result.unhealthy {
                        HEALTH_GATE_RETRY
                    } else {
                        READY_POLL
                    };
                    self.next_probe = Some(now + retry);
                }
            }
            ProbeKind::Liveness => {
                self.next_probe = Some(now + self.ctx.probe_interval);
                // A probe of a process that has just died fails at once
                // (connection refused): that is an exit, not a hang; the
                // exit branch reports it next.
                if !result.ok && self.child.as_mut().is_some_and(|c| c.has_exited()) {
                    return;
                }
                if !result.ok {
                    tracing::warn!(worker = %self.worker.id(), timeout = ?self.ctx.probe_timeout, "liveness probe failed");
                }
                self.feed(if result.ok {
                    Event::ProbeOk
                } else {
                    Event::ProbeTimeout
                });
            }
        }
    }

    /// Schedules the next periodic health round, if the worker has checks.
    fn schedule_health(&mut self) {
        let cfg = &self.ctx.health;
        if !health::has_checks(cfg, &self.snap) {
            return;
        }
        let jitter_ns = cfg.jitter.as_nanos() as u64;
        let extra = if jitter_ns == 0 {
            0
        } else {
            splitmix64(&mut self.rng) % jitter_ns
        };
        self.next_health = Some(now() + cfg.interval + Duration::from_nanos(extra));
    }

    /// The client liveness probes and health rounds of `process` use: the
    /// one the prober's runtime drives, or (an inline prober) its own.
    fn prober_client(&self, process: &Process) -> GrpcInferenceServiceClient<Channel> {
        self.probe_client
            .clone()
            .unwrap_or_else(|| process.client.clone())
    }

    fn start_health(&mut self) {
        let serving = matches!(
            self.sentinel.state(),
            State::Ready | State::Degraded | State::Draining
        );
        let process = self.snap.process.clone().filter(|_| self.child.is_some());
        let Some(process) = process.filter(|_| serving) else {
            self.answer_health(Vec::new());
            return;
        };
        let generation = self.generation;
        let cfg = Arc::clone(&self.ctx.health);
        let metrics = Arc::clone(&self.ctx.metrics);
        let snap = self.snap.clone();
        let id = self.worker.id().to_string();
        // On the prober's thread and connection, as liveness probes: a
        // check timing out must say the worker is slow, not the agent.
        let prober = Arc::clone(&self.ctx.prober);
        let client = self.prober_client(&process);
        self.health = Some(Box::pin(async move {
            let round = async move { health::run_round(&cfg, &id, &snap, &metrics, client).await };
            HealthRound {
                generation,
                verdicts: prober.run(round).await.unwrap_or_default(),
            }
        }));
    }

    fn on_health(&mut self, round: HealthRound) {
        if round.generation != self.generation || self.child.is_none() {
            self.answer_health(Vec::new());
            return;
        }
        self.driver
            .log
            .record_health(round.verdicts.iter().cloned().map(HealthRecord::now));
        self.schedule_health();
        if let Some(event) = health::round_event(&round.verdicts) {
            self.feed(event);
        }
        self.answer_health(round.verdicts);
    }

    fn answer_health(&mut self, verdicts: Vec<Verdict>) {
        for reply in self.health_waiting.drain(..) {
            let _ = reply.send(verdicts.clone());
        }
    }

    /// The agent is stopping: no more traffic, SIGTERM, SIGKILL after grace.
    async fn stop(&mut self) {
        self.update(|s| s.routable = false);
        self.publish();
        self.answer_health(Vec::new());
        if let Some(mut child) = self.child.take() {
            let pid = child.pid();
            child.signal(Signal::SIGTERM);
            if tokio::time::timeout(self.worker.spec.stop_grace, child.wait())
                .await
                .is_err()
            {
                tracing::warn!(worker = %self.worker.id(), pid, "worker ignored SIGTERM; sending SIGKILL");
                child.signal(Signal::SIGKILL);
                child.wait().await;
            }
            self.update(|s| {
                s.process = None;
                s.last_exit = Some("stopped by agent".into());
            });
            self.publish();
            tracing::info!(worker = %self.worker.id(), "worker stopped");
        }
    }
}

async fn wait(child: &mut Option<Box<dyn Launched>>) -> Exit {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

async fn poll<T>(f: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// One step of splitmix64 (Steele et al.): enough randomness for jitter.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The supervisor's clock: tokio's, which is the system's except under a
/// paused test clock, where the sentinel's timers then run in virtual time
/// like the sleeps that wait for them.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

fn client(
    address: std::net::SocketAddr,
    max_message_bytes: usize,
) -> GrpcInferenceServiceClient<Channel> {
    infermesh_proto::oip_client(
        &address.to_string(),
        Duration::from_secs(2),
        max_message_bytes,
    )
    .expect("a socket address is a valid URI")
}

/// One startup readiness check: live, models known and ready, metadata
/// cached in the pool's model table. Returns whether ready, and the models
/// the worker listed if it had to be asked.
async fn startup_ready(
    id: &str,
    snap: &WorkerSnapshot,
    pool: &Pool,
    mut client: GrpcInferenceServiceClient<Channel>,
) -> (bool, Option<Vec<String>>) {
    let call = |fut| tokio::time::timeout(STARTUP_CALL_TIMEOUT, fut);
    match call(client.server_live(ServerLiveRequest {})).await {
        Ok(Ok(r)) if r.get_ref().live => {}
        _ => return (false, None),
    }
    let (models, listed): (Vec<String>, _) = match &snap.models {
        Some(m) => (m.to_vec(), None),
        None => match tokio::time::timeout(
            STARTUP_CALL_TIMEOUT,
            client.repository_index(RepositoryIndexRequest::default()),
        )
        .await
        {
            Ok(Ok(r)) => {
                let models: Vec<String> =
                    r.into_inner().models.into_iter().map(|m| m.name).collect();
                if models.is_empty() {
                    return (false, None);
                }
                (models.clone(), Some(models))
            }
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::error!(
                    worker = %id,
                    "the worker does not list its models (RepositoryIndex); set `models` for it in the config"
                );
                return (false, None);
            }
            _ => return (false, None),
        },
    };
    for model in &models {
        let req = ModelReadyRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(STARTUP_CALL_TIMEOUT, client.model_ready(req)).await {
            Ok(Ok(r)) if r.get_ref().ready => {}
            _ => return (false, listed),
        }
    }
    for model in &models {
        let req = ModelMetadataRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(STARTUP_CALL_TIMEOUT, client.model_metadata(req)).await {
            Ok(Ok(r)) => {
                if let Err(e) = pool.models().set_metadata(r.into_inner()) {
                    tracing::warn!(worker = %id, model = %model.escape_debug(), error = %e, "model not served");
                }
            }
            _ => return (false, listed),
        }
    }
    (true, listed)
}

/// How many requests the worker says it runs at once, from its models'
/// configurations (Triton's ModelConfig extension): the largest over its
/// models, since they share the worker's GPU. `None` when it does not say
/// (no such RPC, as with most non-Triton servers).
async fn parallelism(
    models: &[String],
    mut client: GrpcInferenceServiceClient<Channel>,
) -> Option<usize> {
    let mut most = None;
    for model in models {
        let req = ModelConfigRequest {
            name: model.clone(),
            version: String::new(),
        };
        let Ok(Ok(r)) = tokio::time::timeout(STARTUP_CALL_TIMEOUT, client.model_config(req)).await
        else {
            continue;
        };
        if let Some(n) = r
            .into_inner()
            .config
            .as_ref()
            .and_then(crate::worker::concurrency::parallelism)
        {
            most = Some(most.map_or(n, |m: usize| m.max(n)));
        }
    }
    most
}

/// One liveness check: the server is live and its models are ready.
#[cfg(test)]
mod tests;
