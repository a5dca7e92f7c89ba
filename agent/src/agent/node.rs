//! Steps 2–4 of the assembly: the parts every layer shares (the pool of
//! workers, metrics, GPU telemetry, the RDMA engine), the work that keeps
//! the workers serving (a supervisor each, GPU events, the capacity task),
//! and the node's record in the registry.

use std::net::SocketAddr;
use std::sync::Arc;

use infermesh_gpu::{GpuTelemetry, KernelLog, XidClassifier};
use infermesh_sentinel::FaultPatterns;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{RunError, Tasks};
use crate::admin::registry::{self, Advertised, Phase};
use crate::config::{self, AgentConfig};
use crate::dispatch::pool::Pool;
use crate::dispatch::tenant::Tenants;
use crate::metrics::Metrics;
use crate::supervision::launch::Launcher;
use crate::supervision::supervisor::{self, Context};
use crate::supervision::{capacity_task, gpu};
use crate::transports::rdma::{self, RdmaPeers};
use crate::worker::procfs::{ProcTable, Procfs};
use crate::worker::state::{Worker, WorkerDriver};

/// The node's phase (serving, draining, gone), which the readiness probe and
/// the registry record show, and the task publishing the record.
pub(super) struct Record {
    pub phase: Arc<watch::Sender<Phase>>,
    pub publisher: Option<JoinHandle<()>>,
}

/// What the node's layers share.
pub(super) struct Node {
    pub pool: Arc<Pool>,
    pub metrics: Arc<Metrics>,
    pub patterns: Arc<FaultPatterns>,
    pub gpus: Arc<dyn GpuTelemetry>,
    pub kernel_log: Arc<dyn KernelLog>,
    pub procs: Arc<dyn ProcTable>,
    pub rdma: Option<Arc<RdmaPeers>>,
}

impl Node {
    /// The pool of the configured workers (and the drivers their
    /// supervisors will hold), metrics, GPU telemetry, the RDMA engine.
    pub(super) async fn open(cfg: &AgentConfig) -> Result<(Self, Vec<WorkerDriver>), RunError> {
        let (workers, drivers): (Vec<_>, Vec<_>) = cfg
            .workers
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, spec)| Worker::new(spec, i))
            .unzip();
        let tenants = Tenants::new(cfg.tenants.clone());
        let pool = Pool::with_tenants(workers, cfg.weight, cfg.queue_capacity, tenants.clone());
        pool.set_orca(cfg.orca);
        let gpus = open_gpu_telemetry(cfg);
        // A slice that is not there is said once; the worker starts anyway
        // (the host may be fixed while the agent runs).
        let pipe_dir = std::env::var(infermesh_gpu::slice::PIPE_DIRECTORY_ENV).ok();
        for problem in gpu::slices::check(&cfg.workers, gpus.as_ref(), pipe_dir.as_deref()).errors {
            tracing::error!("{problem}");
        }
        let rdma = rdma::open(cfg.rdma)
            .await
            .map_err(RunError::Rdma)?
            .map(|engine| Arc::new(RdmaPeers::new(engine, cfg.max_message_bytes)));
        if cfg.admin_token.is_none() {
            tracing::info!(
                "no admin token file: mutating admin calls (drain, restart, ...) are refused"
            );
        }
        let node = Node {
            pool,
            metrics: Arc::new(Metrics::with_tenants(tenants)),
            patterns: Arc::new(cfg.fault_patterns.clone()),
            kernel_log: infermesh_gpu::open_kernel_log(gpus.backend()),
            gpus,
            procs: Arc::new(Procfs::default()),
            rdma,
        };
        Ok((node, drivers))
    }

    /// One supervisor per worker, each driving its worker through `driver`.
    pub(super) fn supervise(
        &self,
        cfg: &AgentConfig,
        drivers: Vec<WorkerDriver>,
        launcher: Arc<dyn Launcher>,
        tasks: &Tasks,
    ) {
        let ctx = Context {
            health: Arc::new(cfg.health.clone()),
            pool: Arc::clone(&self.pool),
            metrics: Arc::clone(&self.metrics),
            max_message_bytes: cfg.max_message_bytes,
            patterns: Arc::clone(&self.patterns),
            sentinel: cfg.sentinel.clone(),
            probe_interval: cfg.probe_interval,
            probe_timeout: cfg.probe_timeout,
            prober: launcher.prober(),
            launcher,
            tasks: tasks.background.clone(),
            worker_connections: cfg.worker_connections,
        };
        // Seeds only the backoff jitter; different per agent start and per worker.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        for (i, (w, d)) in self.pool.workers().iter().zip(drivers).enumerate() {
            tasks.background.spawn(supervisor::supervise(
                Arc::clone(w),
                d,
                ctx.clone(),
                seed ^ i as u64,
                tasks.stop_workers.clone(),
            ));
        }
    }

    /// GPU fault events to the workers that caused them and, with
    /// `weight = "auto"`, the capacity task; both until the background stops.
    pub(super) fn watch_gpus(&self, cfg: &AgentConfig, tasks: &Tasks) {
        let watch = gpu::watch(
            gpu::GpuWatch {
                gpus: Arc::clone(&self.gpus),
                kernel_log: Arc::clone(&self.kernel_log),
                procs: Arc::clone(&self.procs),
                classifier: XidClassifier::new(cfg.xid_policy.clone()),
                suspect_window: cfg.suspect_window,
            },
            Arc::clone(&self.pool),
            Arc::clone(&self.metrics),
        );
        tasks.background_until_stopped(watch);
        if cfg.weight == config::Weight::Auto {
            let task = capacity_task::run(Arc::clone(&self.gpus), Arc::clone(&self.pool));
            tasks.background_until_stopped(task);
        }
    }

    /// The node's record in the registry, when one is configured: the
    /// addresses to advertise, kept until the phase says `Gone`.
    pub(super) fn advertise(
        &self,
        cfg: &AgentConfig,
        (listen, admin_listen): (SocketAddr, SocketAddr),
        quic_listen: Option<SocketAddr>,
        tls: bool,
        tasks: &Tasks,
    ) -> Result<Record, RunError> {
        let (set_phase, phase) = watch::channel(Phase::Serving);
        let Some(rcfg) = cfg.registry.clone() else {
            return Ok(Record {
                phase: Arc::new(set_phase),
                publisher: None,
            });
        };
        let grpc = config::advertised(cfg.advertise, listen, || config::host_ip(listen.ip()))
            .map_err(RunError::Advertise)?;
        let admin = config::advertised(cfg.admin_advertise, admin_listen, || {
            config::host_ip(admin_listen.ip())
        })
        .map_err(RunError::Advertise)?;
        tracing::info!(%grpc, %admin, "advertising these addresses");
        let advertised = Advertised {
            node_id: cfg.node_id.clone(),
            grpc: grpc.to_string(),
            admin: admin.to_string(),
            score: match cfg.weight {
                config::Weight::Fixed(w) => Some(w),
                config::Weight::Auto => None,
            },
            gpus: Arc::clone(&self.gpus),
            pool: Arc::clone(&self.pool),
            rdma: self.rdma.as_ref().map(|r| r.kind().to_string()),
            zone: rcfg.zone.clone(),
            tls,
            quic: quic_listen.map(|q| SocketAddr::new(grpc.ip(), q.port()).to_string()),
        };
        let task = tasks
            .background
            .spawn(registry::run(rcfg, advertised, phase));
        Ok(Record {
            phase: Arc::new(set_phase),
            publisher: Some(task),
        })
    }
}

/// Opens the configured GPU telemetry; on failure logs one line and runs
/// without it.
fn open_gpu_telemetry(cfg: &AgentConfig) -> Arc<dyn GpuTelemetry> {
    match infermesh_gpu::open(cfg.gpu_backend, cfg.fake_gpus) {
        Ok(t) => {
            tracing::info!(
                backend = t.backend(),
                devices = t.devices().len(),
                mig_instances = t.mig_devices().len(),
                "GPU telemetry"
            );
            t
        }
        Err(e) => {
            tracing::warn!(error = %e, "GPU telemetry off: the configured backend could not be opened");
            Arc::new(infermesh_gpu::NoTelemetry)
        }
    }
}
