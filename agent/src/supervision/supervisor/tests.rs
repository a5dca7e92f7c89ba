//! The supervisor in-process, under tokio's paused clock, with in-process
//! workers ([`crate::testing`]).

use std::time::Duration;

use infermesh_sentinel::{Event, GpuFaultSeverity, SentinelConfig, State};
use infermesh_testworker::WorkerOptions;
use tokio::task::JoinHandle;

use super::*;
use crate::config::WorkerSpec;
use crate::testing::FakeLauncher;
use crate::worker::inbox::Control;

struct Harness {
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    worker: Arc<Worker>,
    launcher: Arc<FakeLauncher>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

fn spec(stop_grace: Duration, startup_timeout: Duration) -> WorkerSpec {
    WorkerSpec {
        id: "w0".into(),
        command: "fake".into(),
        argv: vec!["fake".into()],
        env: Default::default(),
        gpu: Some(crate::config::GpuSlice::whole(
            crate::config::WorkerGpu::Index(0),
        )),
        models: vec!["dense".into()],
        max_inflight: 4,
        startup_timeout,
        stop_grace,
        stall: Default::default(),
    }
}

fn start(launcher: Arc<FakeLauncher>, stop_grace: Duration) -> Harness {
    start_with(launcher, spec(stop_grace, Duration::from_secs(30)))
}

fn start_with(launcher: Arc<FakeLauncher>, spec: WorkerSpec) -> Harness {
    let (worker, driver) = Worker::new(spec, 0);
    let pool = Pool::new(vec![Arc::clone(&worker)], 1.0, 8);
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pool: Arc::clone(&pool),
        metrics: Arc::clone(&metrics),
        max_message_bytes: 1 << 20,
        patterns: Arc::new(FaultPatterns::defaults()),
        sentinel: SentinelConfig {
            backoff_base: Duration::from_secs(1),
            ..SentinelConfig::default()
        },
        probe_interval: Duration::from_secs(1),
        probe_timeout: Duration::from_secs(1),
        prober: crate::supervision::prober::Prober::inline(),
        health: Arc::new(HealthConfig::default()),
        launcher: Arc::clone(&launcher) as Arc<dyn Launcher>,
        tasks: TaskTracker::new(),
        worker_connections: 1,
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(supervise(
        Arc::clone(&worker),
        driver,
        ctx,
        7,
        cancel.clone(),
    ));
    Harness {
        pool,
        metrics,
        worker,
        launcher,
        cancel,
        task,
    }
}

impl Harness {
    async fn until(&self, what: impl Fn(&WorkerSnapshot) -> bool) -> Arc<WorkerSnapshot> {
        let mut rx = self.worker.watch();
        let snap = rx.wait_for(|s| what(s)).await.expect("supervisor alive");
        Arc::clone(&snap)
    }

    async fn ready(&self) -> Arc<WorkerSnapshot> {
        self.until(|s| s.routable).await
    }
}

fn killed_by(signal: i32) -> Exit {
    Exit {
        code: None,
        signal: Some(signal),
    }
}

#[tokio::test(start_paused = true)]
async fn a_started_worker_becomes_routable_with_its_models() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    let snap = h.ready().await;
    assert_eq!(snap.state, State::Ready);
    assert_eq!(snap.models.as_deref(), Some(&["dense".to_string()][..]));
    assert!(h.pool.any_ready());
    assert!(
        h.pool.models().metadata("dense").is_some(),
        "metadata cached"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_stops_routing_at_once_and_restarts_the_worker() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    let first = h.ready().await;
    let pid = first.process.as_ref().unwrap().pid;
    h.launcher.launched()[0].die(killed_by(11));
    // The first snapshot after the exit already takes it out of rotation.
    let gone = h
        .until(|s| s.process.is_none() || s.process.as_ref().unwrap().pid != pid)
        .await;
    assert!(!gone.routable);
    let again = h.until(|s| s.routable && s.restarts == 1).await;
    assert_ne!(again.process.as_ref().unwrap().pid, pid);
    assert_eq!(h.launcher.launched().len(), 2);
    assert!(again.last_exit.as_deref().unwrap().contains("signal 11"));
}

#[tokio::test(start_paused = true)]
async fn a_gpu_quarantine_wins_over_a_flood_of_request_errors() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    let snap = h.ready().await;
    let pid = snap.process.as_ref().unwrap().pid;
    let reporter = h.worker.reporter();
    // A dying GPU: every request fails, and the Xid arrives in the middle.
    for _ in 0..100_000 {
        reporter.request_error(pid);
    }
    reporter.control(Control::Sentinel(Event::GpuFault {
        xid: 79,
        severity: GpuFaultSeverity::Quarantine,
        pid: None,
    }));
    for _ in 0..100_000 {
        reporter.request_error(pid);
    }
    let q = h.until(|s| s.state == State::Quarantined).await;
    assert!(!q.routable);
    assert!(q.last_fault.as_deref().unwrap().contains("xid 79"));
    // Quarantine is terminal: let a long time pass, nothing is restarted.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let later = h.worker.snapshot();
    assert_eq!(later.state, State::Quarantined);
    assert_eq!(
        h.launcher.launched().len(),
        1,
        "the GPU is not restarted in a loop"
    );
    assert!(h.launcher.launched()[0].is_dead(), "its worker was stopped");
}

#[tokio::test(start_paused = true)]
async fn output_fault_lines_fail_the_process_that_printed_them() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    h.ready().await;
    let p = h.launcher.launched()[0].clone();
    // A line about an earlier process is ignored.
    p.output.line(
        p.pid + 1000,
        "stderr",
        "CUDA error: an illegal memory access",
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(h.worker.snapshot().routable);
    p.output.line(
        p.pid,
        "stderr",
        "CUDA error: an illegal memory access was encountered",
    );
    let failed = h.until(|s| !s.routable).await;
    assert!(
        failed
            .last_fault
            .as_deref()
            .unwrap()
            .contains("illegal memory access")
    );
    h.until(|s| s.routable && s.restarts == 1).await;
    assert!(
        h.worker
            .log()
            .last_output(10)
            .iter()
            .any(|l| l.contains("illegal"))
    );
}

#[tokio::test(start_paused = true)]
async fn health_checks_run_on_demand_through_the_inbox() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    h.ready().await;
    // No checks configured: an empty round, answered at once.
    let (tx, rx) = tokio::sync::oneshot::channel();
    h.worker.reporter().control(Control::RunHealthChecks(tx));
    assert!(rx.await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_the_worker_with_sigterm() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    h.ready().await;
    let started = tokio::time::Instant::now();
    h.cancel.cancel();
    h.task.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "SIGTERM is obeyed at once"
    );
    let snap = h.worker.snapshot();
    assert!(!snap.routable && snap.process.is_none());
    assert_eq!(snap.last_exit.as_deref(), Some("stopped by agent"));
    assert!(h.launcher.launched()[0].is_dead());
}

#[tokio::test(start_paused = true)]
async fn a_worker_ignoring_sigterm_is_killed_after_its_stop_grace() {
    let h = start(
        FakeLauncher::ignoring_sigterm(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    h.ready().await;
    let started = tokio::time::Instant::now();
    h.cancel.cancel();
    h.task.await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "bounded by stop_grace"
    );
    assert!(h.launcher.launched()[0].is_dead());
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_never_gets_ready_is_restarted_after_its_startup_timeout() {
    let options = WorkerOptions {
        startup: Duration::from_secs(3600),
        ..WorkerOptions::default()
    };
    let h = start_with(
        FakeLauncher::new(options),
        spec(Duration::from_secs(5), Duration::from_millis(500)),
    );
    let snap = h.until(|s| s.restarts >= 1).await;
    assert!(!snap.routable);
    assert!(
        snap.last_fault.as_deref().unwrap().starts_with("startup"),
        "{snap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_operator_restart_is_counted_as_a_restart_not_a_fault() {
    let h = start(
        FakeLauncher::new(WorkerOptions::default()),
        Duration::from_secs(5),
    );
    h.ready().await;
    h.worker
        .reporter()
        .control(Control::Sentinel(Event::Restart));
    let again = h.until(|s| s.routable && s.restarts == 1).await;
    assert_eq!(again.last_fault, None, "an operator restart is not a fault");
    let text = h.metrics.render(&h.pool);
    assert!(
        text.contains(r#"infermesh_worker_restarts_total{worker="w0",reason="operator"} 1"#),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("infermesh_worker_faults_total{") && !l.ends_with(" 0")),
        "no fault counted: {text}"
    );
}
