//! Xid handling with two in-process workers on one fake GPU, under tokio's
//! paused clock: fake NVML events, fake kernel log lines, a fake process
//! table, real supervisors and sentinels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use infermesh_gpu::{FakeKernelLog, FakeTelemetry, GpuEvent, GpuEventKind, GpuProcess, XidPolicy};
use infermesh_sentinel::{SentinelConfig, State};
use infermesh_testworker::WorkerOptions;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::config::{HealthConfig, WorkerSpec};
use crate::supervision::launch::Launcher;
use crate::supervision::supervisor::{self, Context};
use crate::testing::FakeLauncher;
use crate::worker::procfs::FakeProcTable;
use crate::worker::state::{Worker, WorkerSnapshot};

const GIB: u64 = 1 << 30;

struct Node {
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    gpus: Arc<FakeTelemetry>,
    kernel: Arc<FakeKernelLog>,
    procs: Arc<FakeProcTable>,
    /// Each worker's root pid (what the agent started).
    roots: Vec<u32>,
    /// Set if worker g1 was ever taken out of rotation.
    g1_interrupted: Arc<AtomicBool>,
    cancel: CancellationToken,
}

fn spec(id: &str) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        command: "fake".into(),
        argv: vec!["fake".into()],
        env: Default::default(),
        gpu: Some(crate::config::GpuSlice::whole(
            crate::config::WorkerGpu::Index(0),
        )),
        models: vec!["dense".into()],
        max_inflight: 4,
        startup_timeout: Duration::from_secs(30),
        stop_grace: Duration::from_secs(5),
        stall: Default::default(),
    }
}

/// The python process of the worker whose root is `root`, and a thread
/// and a child of it.
fn python(root: u32) -> u32 {
    root * 10
}
fn thread_of(root: u32) -> u32 {
    root * 10 + 3
}
fn child_of(root: u32) -> u32 {
    root * 10 + 7
}

/// Workers g0 and g1 on GPU 0 (g0 on the whole GPU by index, g1 on one of
/// its two MIG instances), ready, with a process table where each runs
/// python (with a thread and a child) under its root, beside a stranger's
/// python (pid 4242).
async fn node() -> Node {
    let launcher = FakeLauncher::new(WorkerOptions::default());
    let mut on_mig = spec("g1");
    on_mig.gpu = Some(crate::config::GpuSlice::whole(
        crate::config::WorkerGpu::Mig("MIG-fake-0-1".into()),
    ));
    let (workers, drivers): (Vec<_>, Vec<_>) = [spec("g0"), on_mig]
        .into_iter()
        .enumerate()
        .map(|(i, spec)| Worker::new(spec, i))
        .unzip();
    let pool = Pool::new(workers, 1.0, 8);
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pool: Arc::clone(&pool),
        metrics: Arc::clone(&metrics),
        max_message_bytes: 1 << 20,
        patterns: Arc::new(infermesh_sentinel::FaultPatterns::defaults()),
        sentinel: SentinelConfig::default(),
        probe_interval: Duration::from_secs(1),
        probe_timeout: Duration::from_secs(1),
        prober: crate::supervision::prober::Prober::inline(),
        health: Arc::new(HealthConfig::default()),
        launcher: Arc::clone(&launcher) as Arc<dyn Launcher>,
        tasks: TaskTracker::new(),
        worker_connections: 1,
    };
    let cancel = CancellationToken::new();
    for (i, driver) in drivers.into_iter().enumerate() {
        tokio::spawn(supervisor::supervise(
            Arc::clone(&pool.workers()[i]),
            driver,
            ctx.clone(),
            i as u64,
            cancel.clone(),
        ));
    }
    let mut roots = Vec::new();
    for w in pool.workers() {
        let snap = ready(w).await;
        roots.push(snap.process.as_ref().unwrap().pid);
    }
    let mut table = FakeProcTable::default()
        .process(10, 1, 10, "infermesh")
        .process(4242, 1, 4242, "python3");
    for &root in &roots {
        table = table
            .process(root, 10, root, "infermesh")
            .process(python(root), root, root, "python3")
            .thread(thread_of(root), python(root), "python3")
            .process(child_of(root), python(root), root, "pt_data_worker");
    }
    let g1_interrupted = Arc::new(AtomicBool::new(false));
    {
        let mut rx = pool.workers()[1].watch();
        let flag = Arc::clone(&g1_interrupted);
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if !rx.borrow().routable {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        });
    }
    let gpus = Arc::new(FakeTelemetry::from_setup(infermesh_gpu::FakeSetup {
        devices: 1,
        mig_per_device: 2,
        mps: false,
    }));
    let kernel = Arc::new(FakeKernelLog::new());
    let procs = Arc::new(table);
    let watching = GpuWatch {
        gpus: Arc::clone(&gpus) as Arc<dyn GpuTelemetry>,
        kernel_log: Arc::clone(&kernel) as Arc<dyn KernelLog>,
        procs: Arc::clone(&procs) as Arc<dyn ProcTable>,
        classifier: XidClassifier::new(XidPolicy::default()),
        suspect_window: DEFAULT_SUSPECT_WINDOW,
    };
    tokio::spawn(watch(watching, Arc::clone(&pool), Arc::clone(&metrics)));
    // Let the watcher subscribe before anything is injected.
    tokio::task::yield_now().await;
    Node {
        pool,
        metrics,
        gpus,
        kernel,
        procs,
        roots,
        g1_interrupted,
        cancel,
    }
}

async fn ready(w: &Worker) -> Arc<WorkerSnapshot> {
    until(w, |s| s.routable).await
}

async fn until(w: &Worker, what: impl Fn(&WorkerSnapshot) -> bool) -> Arc<WorkerSnapshot> {
    let mut rx = w.watch();
    let snap = rx.wait_for(|s| what(s)).await.expect("supervisor alive");
    Arc::clone(&snap)
}

impl Node {
    fn worker(&self, i: usize) -> &Arc<Worker> {
        &self.pool.workers()[i]
    }

    /// An Xid as the driver reports it: the kernel line naming `pid` (if
    /// any), then NVML's event.
    fn xid(&self, xid: u32, pid: Option<u32>) {
        if let Some(pid) = pid {
            self.kernel
                .inject_line(&format!(
                    "NVRM: Xid (PCI:0000:01:00): {xid}, pid={pid}, name=python3, channel 0x0000000a, intr 00000000"
                ))
                .unwrap();
        }
        self.gpus
            .inject(GpuEvent {
                index: 0,
                kind: GpuEventKind::Xid(xid),
            })
            .unwrap();
    }

    fn metrics(&self) -> String {
        self.metrics.render(&self.pool)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn an_xid_blamed_on_a_thread_restarts_only_the_worker_that_owns_it() {
    let n = node().await;
    let victim = n.roots[0];
    n.xid(31, Some(thread_of(victim)));
    let again = until(n.worker(0), |s| s.restarts == 1 && s.routable).await;
    let fault = again.last_fault.as_deref().unwrap();
    assert!(fault.starts_with("xid: GPU Xid 31"), "{fault}");
    assert!(
        fault.contains(&format!("pid {}", thread_of(victim))),
        "{fault}"
    );
    // Time for anything else to happen to g1: nothing does.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let g1 = n.worker(1).snapshot();
    assert_eq!((g1.restarts, g1.state), (0, State::Ready));
    assert!(
        !n.g1_interrupted.load(Ordering::SeqCst),
        "the healthy worker on the same GPU kept serving"
    );
    let text = n.metrics();
    // One fault, though both sources reported it.
    assert!(
        text.contains(r#"infermesh_gpu_xids_total{gpu="0",xid="31",verdict="restart_worker"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="31",attribution="worker"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_xid_blamed_on_a_child_restarts_its_worker_alone() {
    let n = node().await;
    // The NVML event first this time: it waits for the line.
    n.gpus
        .inject(GpuEvent {
            index: 0,
            kind: GpuEventKind::Xid(43),
        })
        .unwrap();
    tokio::task::yield_now().await;
    n.kernel
        .inject_line(&format!(
            "NVRM: Xid (PCI:0000:01:00): 43, pid={}, name=pt_data_worker, Ch 00000008",
            child_of(n.roots[1])
        ))
        .unwrap();
    until(n.worker(1), |s| s.restarts == 1 && s.routable).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(n.worker(0).snapshot().restarts, 0);
}

#[tokio::test(start_paused = true)]
async fn an_unattributed_application_xid_restarts_no_healthy_worker() {
    let n = node().await;
    // NVML's event alone (an older driver, or no kernel log).
    n.xid(43, None);
    tokio::time::sleep(Duration::from_secs(60)).await;
    for i in 0..2 {
        let w = n.worker(i).snapshot();
        assert_eq!(
            (w.restarts, w.state),
            (0, State::Ready),
            "{}",
            n.worker(i).id()
        );
        assert!(
            n.worker(i)
                .log()
                .events()
                .iter()
                .any(|e| e.kind == "suspect"),
            "held suspect"
        );
    }
    assert!(!n.g1_interrupted.load(Ordering::SeqCst));
    let text = n.metrics();
    assert!(
        text.contains(
            r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="43",attribution="unattributed"} 1"#
        ),
        "{text}"
    );
    // A pid that is gone names nobody either.
    n.xid(31, Some(99_999));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(n.worker(0).snapshot().restarts, 0);
    assert_eq!(n.worker(1).snapshot().restarts, 0);
}

#[tokio::test(start_paused = true)]
async fn a_suspect_that_then_fails_a_request_is_restarted_and_the_other_is_not() {
    let n = node().await;
    n.xid(13, None);
    // The hold for a kernel line, then the suspicion.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        n.worker(0)
            .log()
            .events()
            .iter()
            .any(|e| e.kind == "suspect")
    );
    // g0's context was the broken one: its next request fails.
    let pid = n.worker(0).snapshot().process.as_ref().unwrap().pid;
    n.worker(0).reporter().request_error(pid);
    let again = until(n.worker(0), |s| s.restarts == 1).await;
    assert!(
        again
            .last_fault
            .as_deref()
            .unwrap()
            .contains("named no process"),
        "{:?}",
        again.last_fault
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(n.worker(1).snapshot().restarts, 0);
    assert!(!n.g1_interrupted.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn an_xid_in_a_process_that_is_no_worker_restarts_nobody() {
    let n = node().await;
    n.xid(31, Some(4242));
    tokio::time::sleep(Duration::from_secs(30)).await;
    for i in 0..2 {
        assert_eq!(n.worker(i).snapshot().restarts, 0);
        assert!(
            !n.worker(i)
                .log()
                .events()
                .iter()
                .any(|e| e.kind == "suspect")
        );
    }
    assert!(n.metrics().contains(
        r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="31",attribution="other_process"} 1"#
    ));
}

#[tokio::test(start_paused = true)]
async fn a_device_level_xid_quarantines_every_worker_on_the_gpu() {
    let n = node().await;
    n.xid(79, None);
    for i in 0..2 {
        until(n.worker(i), |s| s.state == State::Quarantined).await;
    }
    assert!(n.pool.degraded());
}

#[tokio::test(start_paused = true)]
async fn each_workers_gpu_memory_comes_from_the_process_lists() {
    let n = node().await;
    let (r0, r1) = (n.roots[0], n.roots[1]);
    let process = |pid, gib: u64, util| GpuProcess {
        gpu: 0,
        pid,
        memory_bytes: Some(gib * GIB),
        sm_util_pct: util,
    };
    n.gpus.set_processes(vec![
        process(python(r0), 3, Some(40)),
        process(child_of(r0), 1, Some(5)),
        process(python(r1), 2, None),
        process(4242, 7, Some(90)),
    ]);
    let usage = crate::metrics::gpu_usage::per_worker(&*n.gpus, &*n.procs, &n.pool);
    assert_eq!(
        usage[0],
        vec![crate::metrics::gpu_usage::WorkerGpuUse {
            gpu: 0,
            memory_bytes: 4 * GIB,
            sm_util_pct: Some(45),
            processes: 2,
        }]
    );
    assert_eq!(usage[1][0].memory_bytes, 2 * GIB);
    assert_eq!(usage[1][0].sm_util_pct, None);
}
