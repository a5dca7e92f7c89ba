//! The driver of one worker: it feeds the worker's [`Sentinel`] with what
//! happens (process exits, fault lines, probe results, GPU faults, request
//! errors, operator requests, time) and carries out the actions it returns
//! (stop/resume routing, SIGTERM → SIGKILL, spawn). All policy is in the
//! sentinel; this file only does I/O.
//!
//! Probing: while the worker starts, `ServerLive`, its models (learned with
//! `RepositoryIndex` when not configured), `ModelReady` and `ModelMetadata`
//! are polled every 25 ms until ready. Once ready, a liveness probe
//! (`ServerLive` + `ModelReady`) runs every `probe_interval`; one not
//! answered within `probe_timeout` is reported as a timeout (a hang).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{
    ModelMetadataRequest, ModelReadyRequest, RepositoryIndexRequest, ServerLiveRequest,
};
use infermesh_sentinel::{Action, Event, FaultPatterns, Notice, Sentinel, SentinelConfig, State};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::config::HealthConfig;
use crate::health;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::spawn::{self, describe};
use crate::worker::{Input, Process, Worker};

/// Interval between readiness probes while a worker starts.
const READY_POLL: Duration = Duration::from_millis(25);
/// Timeout of one startup readiness call.
const STARTUP_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a driver needs besides its worker.
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
    /// Health checks and their schedule.
    pub health: Arc<HealthConfig>,
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
}

type ProbeFuture = Pin<Box<dyn Future<Output = ProbeResult> + Send>>;

/// The verdicts of one periodic health round, for the process of `generation`.
struct HealthRound {
    generation: u64,
    verdicts: Vec<infermesh_health::Verdict>,
}

type HealthFuture = Pin<Box<dyn Future<Output = HealthRound> + Send>>;

/// Retry interval of the startup gate while a health check fails (checks
/// are heavier than the 25 ms readiness poll).
const HEALTH_GATE_RETRY: Duration = Duration::from_secs(1);

/// Runs `worker` until the agent sends [`Input::Stop`].
pub async fn supervise(
    worker: Arc<Worker>,
    ctx: Context,
    inputs: mpsc::Receiver<Input>,
    seed: u64,
) {
    let config = SentinelConfig {
        startup_timeout: worker.spec.startup_timeout,
        ..ctx.sentinel.clone()
    };
    let mut driver = Driver {
        sentinel: Sentinel::new(config, seed),
        worker,
        ctx,
        inputs,
        child: None,
        pid: None,
        generation: 0,
        spawned_at: None,
        kill_at: None,
        next_probe: None,
        probe: None,
        next_health: None,
        health: None,
        rng: seed ^ 0x9e37_79b9_7f4a_7c15,
    };
    let actions = driver.sentinel.start(Instant::now());
    driver.execute_all(actions);
    driver.run().await;
}

struct Driver {
    worker: Arc<Worker>,
    ctx: Context,
    sentinel: Sentinel,
    inputs: mpsc::Receiver<Input>,
    child: Option<Child>,
    pid: Option<u32>,
    /// Incremented per spawn, so a probe of an earlier process is ignored.
    generation: u64,
    spawned_at: Option<Instant>,
    /// When to SIGKILL a process that got SIGTERM.
    kill_at: Option<Instant>,
    next_probe: Option<Instant>,
    probe: Option<ProbeFuture>,
    next_health: Option<Instant>,
    health: Option<HealthFuture>,
    /// splitmix64 state for the health-check jitter.
    rng: u64,
}

impl Driver {
    async fn run(&mut self) {
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
                input = self.inputs.recv() => match input {
                    Some(Input::Sentinel(event)) => self.feed(event),
                    Some(Input::Process { pid, event }) => {
                        if self.pid == Some(pid) {
                            self.feed(event);
                        } else {
                            tracing::debug!(worker = %self.worker.id(), pid, ?event, "report about a former process ignored");
                        }
                    }
                    Some(Input::Stop) | None => {
                        self.stop().await;
                        return;
                    }
                },
                status = wait(&mut self.child) => {
                    self.child = None;
                    self.pid = None;
                    self.worker.set_process(None);
                    use std::os::unix::process::ExitStatusExt;
                    let (code, signal) = status.map(|s| (s.code(), s.signal())).unwrap_or((None, None));
                    let how = describe(code, signal);
                    tracing::warn!(worker = %self.worker.id(), exit = %how, "worker exited");
                    self.worker.record_exit(how.clone());
                    self.worker.push_event("exited", how);
                    self.ctx.metrics.worker_exited(self.worker.id());
                    self.kill_at = None;
                    self.feed(Event::Exited { code, signal });
                }
                result = poll_probe(&mut self.probe) => {
                    self.probe = None;
                    self.on_probe(result);
                }
                round = poll_health(&mut self.health) => {
                    self.health = None;
                    self.on_health(round);
                }
                _ = sleep_until(wake) => self.on_timer(),
            }
        }
    }

    fn feed(&mut self, event: Event) {
        let actions = self.sentinel.handle(Instant::now(), event);
        self.execute_all(actions);
    }

    fn execute_all(&mut self, actions: Vec<Action>) {
        let mut queue = VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            if let Some(event) = self.execute(action) {
                queue.extend(self.sentinel.handle(Instant::now(), event));
            }
        }
    }

    /// Carries out one action; returns the event it produced, if any.
    fn execute(&mut self, action: Action) -> Option<Event> {
        let id = self.worker.id().to_string();
        match action {
            Action::StopRouting => {
                self.worker.set_routable(false);
                self.ctx.pool.wake();
                self.worker.push_event("stop_routing", String::new());
                tracing::warn!(worker = %id, "stopped routing to worker");
            }
            Action::ResumeRouting => {
                self.worker.set_routable(true);
                self.ctx.pool.wake();
                self.worker.push_event("resume_routing", String::new());
                tracing::info!(worker = %id, "routing to worker");
            }
            Action::Kill { grace } => {
                if let Some(pid) = self.pid {
                    signal_group(pid, Signal::SIGTERM);
                    self.kill_at = Some(Instant::now() + grace);
                    tracing::warn!(worker = %id, pid, ?grace, "stopping worker (SIGTERM, SIGKILL after grace)");
                }
            }
            Action::Spawn => return Some(self.spawn()),
            Action::SetState(state) => {
                self.worker.set_state(state);
                self.worker.push_event("state", state.as_str().to_string());
                tracing::info!(worker = %id, state = state.as_str(), "worker state");
                match state {
                    State::Ready | State::Degraded | State::Draining => {
                        if let Some(at) = self.spawned_at {
                            self.worker.set_startup_ms(at.elapsed().as_millis() as u64);
                        }
                        if self.next_probe.is_none() && self.probe.is_none() {
                            self.next_probe = Some(Instant::now() + self.ctx.probe_interval);
                        }
                        if self.next_health.is_none() && self.health.is_none() {
                            self.schedule_health();
                        }
                    }
                    _ => self.worker.set_startup_ms(0),
                }
            }
            Action::Emit(notice) => self.notice(notice),
        }
        None
    }

    fn notice(&mut self, notice: Notice) {
        let id = self.worker.id().to_string();
        match notice {
            Notice::Fault { reason, detail } => {
                tracing::error!(worker = %id, reason = reason.as_label(), %detail, "worker fault detected");
                self.ctx.metrics.worker_fault(&id, reason.as_label());
                self.worker
                    .set_last_fault(format!("{}: {detail}", reason.as_label()));
                self.worker
                    .push_event("fault", format!("{}: {detail}", reason.as_label()));
            }
            Notice::Restart { reason, delay } => {
                tracing::warn!(worker = %id, reason = reason.as_label(), ?delay, "restarting worker");
                self.ctx.metrics.worker_restarted(&id, reason.as_label());
                self.worker.count_restart();
                self.worker
                    .push_event("restart", format!("{} after {delay:?}", reason.as_label()));
            }
            Notice::Quarantine { xid, detail } => {
                tracing::error!(
                    worker = %id, xid, gpu = ?self.worker.spec.gpu, %detail,
                    "GPU quarantined: not restarting the worker; the GPU needs a reset"
                );
                self.worker.set_last_fault(format!("xid {xid}: {detail}"));
                self.worker
                    .push_event("quarantine", format!("xid {xid}: {detail}"));
            }
            Notice::Recovered => {
                tracing::info!(worker = %id, "worker recovered");
                self.worker.push_event("recovered", String::new());
            }
            Notice::Stable => {
                tracing::info!(worker = %id, "worker stable; crash-loop backoff reset");
                self.worker.push_event("stable", String::new());
            }
        }
    }

    fn spawn(&mut self) -> Event {
        let id = self.worker.id().to_string();
        match spawn::spawn(&self.worker, &self.ctx.patterns) {
            Ok(spawned) => {
                tracing::info!(
                    worker = %id, pid = spawned.pid, address = %spawned.address,
                    command = %self.worker.spec.command, "worker started"
                );
                self.generation += 1;
                self.pid = Some(spawned.pid);
                self.child = Some(spawned.child);
                self.spawned_at = Some(Instant::now());
                self.worker.set_process(Some(Process {
                    pid: spawned.pid,
                    address: spawned.address,
                    client: client(spawned.address, self.ctx.max_message_bytes),
                }));
                self.worker
                    .push_event("spawned", format!("pid {}", spawned.pid));
                self.probe = None;
                self.next_probe = Some(Instant::now());
                self.health = None;
                self.next_health = None;
                Event::Spawned
            }
            Err(e) => {
                tracing::error!(worker = %id, command = %self.worker.spec.command, error = %e, "cannot start worker");
                self.worker.record_exit(format!("spawn failed: {e}"));
                Event::SpawnFailed {
                    error: e.to_string(),
                }
            }
        }
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        if self.kill_at.is_some_and(|t| t <= now) {
            self.kill_at = None;
            if let Some(pid) = self.pid {
                tracing::warn!(worker = %self.worker.id(), pid, "worker ignored SIGTERM; sending SIGKILL");
                signal_group(pid, Signal::SIGKILL);
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
        let Some(process) = self.worker.process().filter(|_| self.child.is_some()) else {
            return;
        };
        let generation = self.generation;
        let worker = Arc::clone(&self.worker);
        let pool = Arc::clone(&self.ctx.pool);
        let timeout = self.ctx.probe_timeout;
        let health = Arc::clone(&self.ctx.health);
        let metrics = Arc::clone(&self.ctx.metrics);
        self.probe = match self.sentinel.state() {
            State::Starting => Some(Box::pin(async move {
                let ready = startup_ready(&worker, &pool, process.client.clone()).await;
                // The startup gate: a worker that answers but computes
                // wrong results must not take traffic.
                let healthy = !ready
                    || health::run_round(&health, &worker, &metrics, process.client)
                        .await
                        .iter()
                        .all(|v| v.pass);
                ProbeResult {
                    generation,
                    kind: ProbeKind::Startup,
                    ok: ready && healthy,
                    unhealthy: !healthy,
                }
            })),
            State::Ready | State::Degraded | State::Draining => Some(Box::pin(async move {
                let ok = tokio::time::timeout(timeout, live(&worker, process.client))
                    .await
                    .unwrap_or(false);
                ProbeResult {
                    generation,
                    kind: ProbeKind::Liveness,
                    ok,
                    unhealthy: false,
                }
            })),
            _ => None,
        };
    }

    fn on_probe(&mut self, result: ProbeResult) {
        if result.generation != self.generation || self.child.is_none() {
            return;
        }
        let now = Instant::now();
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
                // (connection refused): that is an exit, not a hang. tokio
                // keeps the reaped status, so the exit branch reports it next.
                let exited = self
                    .child
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
                if !result.ok && exited {
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
        if !health::has_checks(cfg, &self.worker) {
            return;
        }
        let jitter_ns = cfg.jitter.as_nanos() as u64;
        let extra = if jitter_ns == 0 {
            0
        } else {
            splitmix64(&mut self.rng) % jitter_ns
        };
        self.next_health = Some(Instant::now() + cfg.interval + Duration::from_nanos(extra));
    }

    fn start_health(&mut self) {
        if !matches!(
            self.sentinel.state(),
            State::Ready | State::Degraded | State::Draining
        ) {
            return;
        }
        let Some(process) = self.worker.process().filter(|_| self.child.is_some()) else {
            return;
        };
        let generation = self.generation;
        let worker = Arc::clone(&self.worker);
        let cfg = Arc::clone(&self.ctx.health);
        let metrics = Arc::clone(&self.ctx.metrics);
        self.health = Some(Box::pin(async move {
            let verdicts = health::run_round(&cfg, &worker, &metrics, process.client).await;
            HealthRound {
                generation,
                verdicts,
            }
        }));
    }

    fn on_health(&mut self, round: HealthRound) {
        if round.generation != self.generation || self.child.is_none() {
            return;
        }
        self.schedule_health();
        if let Some(event) = health::round_event(&round.verdicts) {
            self.feed(event);
        }
    }

    /// The agent is stopping: no more traffic, SIGTERM, SIGKILL after grace.
    async fn stop(&mut self) {
        self.worker.set_routable(false);
        self.ctx.pool.wake();
        if let (Some(child), Some(pid)) = (self.child.as_mut(), self.pid) {
            signal_group(pid, Signal::SIGTERM);
            if tokio::time::timeout(self.worker.spec.stop_grace, child.wait())
                .await
                .is_err()
            {
                tracing::warn!(worker = %self.worker.id(), pid, "worker ignored SIGTERM; sending SIGKILL");
                signal_group(pid, Signal::SIGKILL);
                let _ = child.wait().await;
            }
            self.worker.record_exit("stopped by agent".into());
            self.worker.set_process(None);
            tracing::info!(worker = %self.worker.id(), "worker stopped");
        }
        self.child = None;
    }
}

fn signal_group(pid: u32, signal: Signal) {
    if let Err(e) = killpg(Pid::from_raw(pid as i32), signal) {
        tracing::debug!(pid, ?signal, error = %e, "signal to worker group failed (already gone?)");
    }
}

async fn wait(child: &mut Option<Child>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

async fn poll_probe(probe: &mut Option<ProbeFuture>) -> ProbeResult {
    match probe {
        Some(p) => p.await,
        None => std::future::pending().await,
    }
}

async fn poll_health(round: &mut Option<HealthFuture>) -> HealthRound {
    match round {
        Some(r) => r.await,
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

/// One startup readiness check: live, models known and ready, metadata cached.
async fn startup_ready(
    worker: &Worker,
    pool: &Pool,
    mut client: GrpcInferenceServiceClient<Channel>,
) -> bool {
    let call = |fut| tokio::time::timeout(STARTUP_CALL_TIMEOUT, fut);
    match call(client.server_live(ServerLiveRequest {})).await {
        Ok(Ok(r)) if r.get_ref().live => {}
        _ => return false,
    }
    if worker.models().is_none() {
        match tokio::time::timeout(
            STARTUP_CALL_TIMEOUT,
            client.repository_index(RepositoryIndexRequest::default()),
        )
        .await
        {
            Ok(Ok(r)) => {
                let models: Vec<String> =
                    r.into_inner().models.into_iter().map(|m| m.name).collect();
                if models.is_empty() {
                    return false;
                }
                worker.set_models(models);
            }
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::error!(
                    worker = %worker.id(),
                    "the worker does not list its models (RepositoryIndex); set `models` for it in the config"
                );
                return false;
            }
            _ => return false,
        }
    }
    let models = worker.models().unwrap_or_default();
    for model in models.iter() {
        let req = ModelReadyRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(STARTUP_CALL_TIMEOUT, client.model_ready(req)).await {
            Ok(Ok(r)) if r.get_ref().ready => {}
            _ => return false,
        }
    }
    for model in models.iter() {
        let req = ModelMetadataRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(STARTUP_CALL_TIMEOUT, client.model_metadata(req)).await {
            Ok(Ok(r)) => pool.set_metadata(r.into_inner()),
            _ => return false,
        }
    }
    true
}

/// One liveness check: the server is live and its models are ready.
async fn live(worker: &Worker, mut client: GrpcInferenceServiceClient<Channel>) -> bool {
    match client.server_live(ServerLiveRequest {}).await {
        Ok(r) if r.get_ref().live => {}
        _ => return false,
    }
    for model in worker.models().unwrap_or_default().iter() {
        let req = ModelReadyRequest {
            name: model.clone(),
            version: String::new(),
        };
        match client.model_ready(req).await {
            Ok(r) if r.get_ref().ready => {}
            _ => return false,
        }
    }
    true
}
