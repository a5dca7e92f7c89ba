//! The agent's life: bind, start supervisors and servers, serve, and shut
//! down in order with a bound on every step.
//!
//! Every task the agent starts is spawned on one of two [`TaskTracker`]s —
//! `requests` (client connections, their HTTP/2 streams, stream forwarders)
//! and `background` (supervisors, connections to workers, GPU events, the
//! registry, the admin port) — and ends on a [`CancellationToken`], so
//! shutdown can wait for all of them and nothing is left detached.
//!
//! Shutdown (SIGTERM, or the `shutdown` future):
//! 1. readiness turns false and the registry record says `draining`;
//! 2. for `drain_delay` the agent keeps serving normally, so clients that
//!    have not yet seen the record do not fail;
//! 3. the OIP port stops accepting and sends GOAWAY; in-flight requests
//!    finish, bounded by `shutdown_grace` (then whatever is left is dropped
//!    and queued requests are failed);
//! 4. the record is deleted; workers get SIGTERM, then SIGKILL after their
//!    `stop_grace`; the remaining tasks end; the function returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_gpu::{GpuTelemetry, KernelLog, XidClassifier};
use infermesh_proto::GrpcInferenceServiceServer;
use infermesh_proto::rdma::RdmaServer;
use infermesh_transport::shm::ShmRegistry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;

use crate::admin::registry::{self, Advertised, Phase};
use crate::admin::{self, AdminState};
use crate::config::{self, AgentConfig, limits};
use crate::dispatch::pool::Pool;
use crate::dispatch::tenant::Tenants;
use crate::metrics::Metrics;
use crate::serving::accept::BoundedListener;
use crate::serving::forward::{BodyLimits, InferPath};
use crate::serving::front::Front;
use crate::serving::grpc_health::GrpcHealth;
use crate::serving::server::{self, Oip, ServerLimits, Shutdown};
use crate::supervision::gpu;
use crate::supervision::launch::Launcher;
use crate::supervision::spawn::ProcessLauncher;
use crate::supervision::supervisor::{self, Context};
use crate::transports::conn::OnClose;
use crate::transports::rdma::{RdmaPeers, RdmaService};
use crate::transports::shm::{self, ShmState};
use crate::worker::state::Worker;

/// How long the registry may take to confirm the record's deletion.
const DEREGISTER_WAIT: Duration = Duration::from_secs(3);
/// Beyond the workers' stop grace, how long background tasks may take to end.
const BACKGROUND_WAIT: Duration = Duration::from_secs(5);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listen address is taken or not ours.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Address.
        addr: std::net::SocketAddr,
        /// Which listener.
        what: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A listen address is unspecified (`0.0.0.0`) and no address to
    /// advertise instead is known.
    #[error("no address to advertise: {0}")]
    Advertise(String),
    /// The TLS certificate, key or client CA do not load.
    #[error("TLS: {0}")]
    Tls(String),
    /// The configured RDMA emulation could not start.
    #[error("cannot start the RDMA emulation: {0}")]
    Rdma(#[source] std::io::Error),
}

/// Serves `app` on `listener` (plain TCP or [`crate::tls::TlsListener`])
/// on `tasks` until `stop`.
fn serve_http<L>(
    listener: L,
    app: axum::Router,
    what: &'static str,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let stop = stop.clone();
    tasks.spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "{what} server failed");
        }
    });
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

/// Raises the soft limit on open files to the hard limit (client
/// connections are file descriptors) and returns it.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit; assuming 1024");
            1024
        }
    }
}

/// Runs an agent until `shutdown` resolves, then shuts down as the module
/// docs describe. Workers are started as processes.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let launcher = ProcessLauncher {
        shim: cfg.worker_shim.clone(),
    };
    run_with(cfg, Arc::new(launcher), shutdown).await
}

/// [`run`], with workers started by `launcher`.
pub async fn run_with(
    cfg: AgentConfig,
    launcher: Arc<dyn Launcher>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let agent = Agent::start(cfg, launcher).await?;
    shutdown.await;
    agent.stop().await;
    Ok(())
}

/// A running agent.
pub struct Agent {
    cfg: AgentConfig,
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    listen: SocketAddr,
    admin_listen: SocketAddr,
    quic_listen: Option<SocketAddr>,
    requests: TaskTracker,
    background: TaskTracker,
    stop_workers: CancellationToken,
    stop_background: CancellationToken,
    port: Shutdown,
    set_phase: Arc<watch::Sender<Phase>>,
    registration: Option<JoinHandle<()>>,
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Requests still in flight when `shutdown_grace` ran out (dropped).
    pub requests_dropped: u64,
    /// Tasks still running when the agent gave up waiting (0 normally).
    pub tasks_left: usize,
}

impl Agent {
    /// The worker pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where the OIP port listens.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// Where the admin port listens.
    pub fn admin_listen(&self) -> SocketAddr {
        self.admin_listen
    }

    /// Where the QUIC rung listens (UDP), when on.
    pub fn quic_listen(&self) -> Option<SocketAddr> {
        self.quic_listen
    }

    /// Binds, starts supervisors and servers; serves until [`Agent::stop`].
    pub async fn start(cfg: AgentConfig, launcher: Arc<dyn Launcher>) -> Result<Self, RunError> {
        let started = Instant::now();
        let tls = cfg
            .tls
            .as_ref()
            .map(crate::tls::ServerTls::load)
            .transpose()
            .map_err(RunError::Tls)?
            .map(Arc::new);
        let bind = |addr, what| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Bind { addr, what, source })
        };
        let oip_listener = bind(cfg.listen, "OIP gRPC").await?;
        let admin_listener = bind(cfg.admin_listen, "admin").await?;
        let http_listener = match cfg.http_listen {
            Some(a) => Some(bind(a, "KServe HTTP").await?),
            None => None,
        };
        let probe_listener = match cfg.tls.as_ref().and_then(|t| t.probe_listen) {
            Some(a) => Some(bind(a, "probes").await?),
            None => None,
        };
        let quic_limits = crate::serving::quic::QuicLimits {
            max_connections: cfg.limits.max_connections,
            max_streams: cfg.limits.max_concurrent_streams,
            max_message_bytes: cfg.max_message_bytes,
            idle_timeout: cfg.limits.idle_timeout,
            read_timeout: cfg.limits.read_timeout,
        };
        let quic_endpoint = match (&cfg.quic, &tls) {
            (Some(at), Some(t)) => {
                let addr = at.unwrap_or_else(|| oip_listener.local_addr().unwrap_or(cfg.listen));
                Some(
                    crate::serving::quic::bind(addr, t, &quic_limits).map_err(|source| {
                        RunError::Bind {
                            addr,
                            what: "QUIC (UDP)",
                            source,
                        }
                    })?,
                )
            }
            _ => None,
        };
        let quic_listen = quic_endpoint.as_ref().and_then(|e| e.local_addr().ok());
        let http_listen = http_listener.as_ref().and_then(|l| l.local_addr().ok());
        let (listen, admin_listen) = (
            oip_listener.local_addr().unwrap_or(cfg.listen),
            admin_listener.local_addr().unwrap_or(cfg.admin_listen),
        );
        let requests = TaskTracker::new();
        let background = TaskTracker::new();
        let stop_workers = CancellationToken::new();
        let stop_background = CancellationToken::new();
        let port = Shutdown {
            graceful: CancellationToken::new(),
            hard: CancellationToken::new(),
        };

        let (workers, drivers): (Vec<_>, Vec<_>) = cfg
            .workers
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, spec)| Worker::new(spec, i))
            .unzip();
        let pool = Pool::with_tenants(
            workers,
            cfg.weight,
            cfg.queue_capacity,
            Tenants::new(cfg.tenants.clone()),
        );
        pool.set_orca(cfg.orca);
        let metrics = Arc::new(Metrics::new());
        let patterns = Arc::new(cfg.fault_patterns.clone());
        let gpus = open_gpu_telemetry(&cfg);
        // A slice that is not there is said once; the worker starts anyway
        // (the host may be fixed while the agent runs).
        let pipe_dir = std::env::var(infermesh_gpu::slice::PIPE_DIRECTORY_ENV).ok();
        for problem in gpu::slices::check(&cfg.workers, gpus.as_ref(), pipe_dir.as_deref()).errors {
            tracing::error!("{problem}");
        }
        let kernel_log: Arc<dyn KernelLog> = infermesh_gpu::open_kernel_log(gpus.backend());
        let procs: Arc<dyn crate::worker::procfs::ProcTable> =
            Arc::new(crate::worker::procfs::Procfs::default());
        let rdma = crate::transports::rdma::open(cfg.rdma)
            .await
            .map_err(RunError::Rdma)?
            .map(|engine| Arc::new(RdmaPeers::new(engine, cfg.max_message_bytes)));
        if cfg.admin_token.is_none() {
            tracing::info!(
                "no admin token file: mutating admin calls (drain, restart, ...) are refused"
            );
        }
        let ctx = Context {
            health: Arc::new(cfg.health.clone()),
            pool: Arc::clone(&pool),
            metrics: Arc::clone(&metrics),
            max_message_bytes: cfg.max_message_bytes,
            patterns: Arc::clone(&patterns),
            sentinel: cfg.sentinel.clone(),
            probe_interval: cfg.probe_interval,
            probe_timeout: cfg.probe_timeout,
            launcher,
            tasks: background.clone(),
        };
        // Seeds only the backoff jitter; different per agent start and per worker.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        for (i, (w, d)) in pool.workers().iter().zip(drivers).enumerate() {
            background.spawn(supervisor::supervise(
                Arc::clone(w),
                d,
                ctx.clone(),
                seed ^ i as u64,
                stop_workers.clone(),
            ));
        }
        {
            let watch = gpu::watch(
                gpu::GpuWatch {
                    gpus: Arc::clone(&gpus),
                    kernel_log: Arc::clone(&kernel_log),
                    procs: Arc::clone(&procs),
                    classifier: XidClassifier::new(cfg.xid_policy.clone()),
                    suspect_window: cfg.suspect_window,
                },
                Arc::clone(&pool),
                Arc::clone(&metrics),
            );
            let stop = stop_background.clone();
            background.spawn(async move {
                tokio::select! {
                    _ = watch => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
        if cfg.weight == config::Weight::Auto {
            let task = crate::supervision::capacity_task::run(Arc::clone(&gpus), Arc::clone(&pool));
            let stop = stop_background.clone();
            background.spawn(async move {
                tokio::select! {
                    _ = task => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
        let (set_phase, phase_rx) = watch::channel(Phase::Serving);
        let set_phase = Arc::new(set_phase);
        let registration = match &cfg.registry {
            None => None,
            Some(_) => Some((
                config::advertised(cfg.advertise, listen, || config::host_ip(listen.ip()))
                    .map_err(RunError::Advertise)?,
                config::advertised(cfg.admin_advertise, admin_listen, || {
                    config::host_ip(admin_listen.ip())
                })
                .map_err(RunError::Advertise)?,
            )),
        };
        let registration = cfg
            .registry
            .clone()
            .zip(registration)
            .map(|(rcfg, (grpc, admin))| {
                tracing::info!(%grpc, %admin, "advertising these addresses");
                let advertised = Advertised {
                    node_id: cfg.node_id.clone(),
                    grpc: grpc.to_string(),
                    admin: admin.to_string(),
                    score: match cfg.weight {
                        config::Weight::Fixed(w) => Some(w),
                        config::Weight::Auto => None,
                    },
                    gpus: Arc::clone(&gpus),
                    pool: Arc::clone(&pool),
                    rdma: rdma.as_ref().map(|r| r.kind().to_string()),
                    zone: rcfg.zone.clone(),
                    tls: tls.is_some(),
                    quic: quic_listen.map(|q| SocketAddr::new(grpc.ip(), q.port()).to_string()),
                };
                background.spawn(registry::run(rcfg, advertised, phase_rx))
            });

        let shm = ShmState::new(
            ShmRegistry::new(cfg.shm.registry_config()),
            pool.workers().len(),
        );
        let on_close: OnClose = {
            let (shm, pool, rdma, tasks) = (
                shm.clone(),
                Arc::clone(&pool),
                rdma.clone(),
                background.clone(),
            );
            Arc::new(move |owner| {
                shm.registry().drop_owner(owner);
                if let Some(rdma) = &rdma {
                    rdma.drop_owner(owner);
                }
                // Regions passed through to workers go too.
                let (pool, shm) = (Arc::clone(&pool), shm.clone());
                tasks.spawn(async move { shm::forget_on_workers(&pool, &shm, owner, None).await });
            })
        };
        let front = Front::new(
            Arc::clone(&pool),
            Arc::clone(&metrics),
            Arc::clone(&patterns),
            shm,
            requests.clone(),
        )
        .with_rdma(rdma.clone());
        let oip = {
            let service = |limit| {
                GrpcInferenceServiceServer::new(front.clone())
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(cfg.max_message_bytes)
            };
            let mut calls = Routes::new(service(limits::SMALL_MESSAGE_BYTES))
                .add_service(GrpcHealth::server(Arc::clone(&pool)));
            if let Some(r) = &rdma {
                calls = calls.add_service(RdmaServer::new(RdmaService::new(Arc::clone(r))));
            }
            let l = &cfg.limits;
            Oip {
                infer: InferPath::new(
                    Arc::clone(&pool),
                    Arc::clone(&metrics),
                    Arc::clone(&patterns),
                    front.clone(),
                    BodyLimits {
                        max_message_bytes: cfg.max_message_bytes,
                        receive_budget_bytes: l.receive_budget_bytes,
                        read_timeout: l.read_timeout,
                    },
                ),
                streams: Routes::new(service(cfg.max_message_bytes)).prepare(),
                calls: calls.prepare(),
                pool: Arc::clone(&pool),
                call_timeout: l.call_timeout,
            }
        };
        let fd_limit = raise_fd_limit();
        // Client connections come in on the OIP port and KServe HTTP.
        let tcp_ports = 1 + usize::from(http_listener.is_some());
        let l = &cfg.limits;
        let server_limits = ServerLimits {
            max_connections: l.connections_within(fd_limit, tcp_ports),
            // Windows, header lists and the limits against hostile clients
            // are the HTTP/2 crate's documented defaults (http2/README.md).
            http2: infermesh_http2::Limits {
                max_concurrent_streams: l.max_concurrent_streams,
                ..infermesh_http2::Limits::default()
            },
            handshake_timeout: l.handshake_timeout,
            idle_timeout: l.idle_timeout,
            keepalive_interval: l.keepalive_interval,
            keepalive_timeout: l.keepalive_timeout,
        };
        if server_limits.max_connections < l.max_connections {
            tracing::warn!(
                fd_limit,
                max_connections = server_limits.max_connections,
                "open-file limit lowers the connection limit (raise `ulimit -n` for more)"
            );
        }
        if let (Some(t), Some(s)) = (&tls, &cfg.tls) {
            let (t, every, stop) = (Arc::clone(t), s.reload_interval, stop_background.clone());
            background.spawn(async move { t.watch(every, stop).await });
        }
        if let Some(endpoint) = quic_endpoint {
            requests.spawn(crate::serving::quic::serve(
                endpoint,
                oip.infer.clone(),
                Arc::clone(&pool),
                quic_limits,
                port.clone(),
                requests.clone(),
            ));
        }
        requests.spawn(server::serve(
            oip_listener,
            tls.as_ref().map(|t| t.oip.clone()),
            oip,
            server_limits,
            on_close,
            port.clone(),
            requests.clone(),
        ));
        {
            let state = AdminState {
                node_id: cfg.node_id.clone(),
                pool: Arc::clone(&pool),
                metrics: Arc::clone(&metrics),
                started,
                gpus: Arc::clone(&gpus),
                kernel_log: Arc::clone(&kernel_log),
                procs: Arc::clone(&procs),
                token: cfg.admin_token.clone(),
                phase: Arc::clone(&set_phase),
                stable_period: cfg.sentinel.stable_period,
            };
            if let Some(listener) = probe_listener {
                let app = admin::probe_router(state.clone());
                serve_http(listener, app, "probe", &stop_background, &background);
            }
            let app = admin::router(state);
            match &tls {
                None => serve_http(admin_listener, app, "admin", &stop_background, &background),
                Some(t) => serve_http(
                    crate::tls::TlsListener::new(
                        admin_listener,
                        t.admin.clone(),
                        cfg.limits.handshake_timeout,
                        stop_background.clone(),
                        background.clone(),
                    ),
                    app,
                    "admin",
                    &stop_background,
                    &background,
                ),
            }
        }
        if let Some(listener) = http_listener {
            let app = crate::serving::http::router(
                front.clone(),
                cfg.max_message_bytes,
                cfg.limits.call_timeout,
            );
            // Bounded as the OIP port is, with the same `[limits]`.
            background.spawn(crate::serving::http::port::serve(
                BoundedListener::new(listener, server_limits.max_connections, "KServe HTTP"),
                tls.as_ref().map(|t| t.http.clone()),
                app,
                crate::serving::http::port::PortLimits {
                    handshake_timeout: l.handshake_timeout,
                    idle_timeout: l.idle_timeout,
                },
                stop_background.clone(),
                background.clone(),
            ));
        }
        tracing::info!(node = %cfg.node_id, %listen, %admin_listen, http_listen = ?http_listen, quic_listen = ?quic_listen, tls = tls.is_some(), workers = cfg.workers.len(), "agent serving");
        Ok(Agent {
            cfg,
            pool,
            metrics,
            listen,
            admin_listen,
            quic_listen,
            requests,
            background,
            stop_workers,
            stop_background,
            port,
            set_phase,
            registration,
        })
    }

    /// Shuts down in order (see the module docs) and returns how it went.
    pub async fn stop(self) -> Stopped {
        let Agent {
            cfg,
            pool,
            requests,
            background,
            stop_workers,
            stop_background,
            port,
            set_phase,
            registration,
            ..
        } = self;
        let mut stopped = Stopped {
            requests_dropped: 0,
            tasks_left: 0,
        };
        // 1–2: advertise draining, keep serving for drain_delay.
        tracing::info!(drain_delay = ?cfg.drain_delay, in_flight = pool.load().in_flight, "shutting down: advertising draining");
        pool.set_stopping();
        let _ = set_phase.send(Phase::Draining);
        tokio::time::sleep(cfg.drain_delay).await;
        // 3: stop accepting; finish in-flight requests within shutdown_grace.
        tracing::info!(grace = ?cfg.shutdown_grace, in_flight = pool.load().in_flight, "no longer accepting connections; finishing in-flight requests");
        port.graceful.cancel();
        requests.close();
        if tokio::time::timeout(cfg.shutdown_grace, requests.wait())
            .await
            .is_err()
        {
            stopped.requests_dropped = pool.load().in_flight;
            tracing::warn!(
                left = stopped.requests_dropped,
                "shutdown grace ran out; dropping requests still in flight"
            );
            port.hard.cancel();
            pool.close();
            requests.wait().await;
        } else {
            tracing::info!("in-flight requests finished");
        }
        pool.close();
        // 4: deregister, stop workers and everything else.
        let _ = set_phase.send(Phase::Gone);
        if let Some(r) = registration {
            if tokio::time::timeout(DEREGISTER_WAIT, r).await.is_err() {
                tracing::warn!(
                    "registry did not confirm the deregistration in 3 s; the record goes with the session"
                );
            }
        }
        stop_workers.cancel();
        stop_background.cancel();
        background.close();
        let longest_stop = cfg
            .workers
            .iter()
            .map(|w| w.stop_grace)
            .max()
            .unwrap_or_default();
        if tokio::time::timeout(longest_stop + BACKGROUND_WAIT, background.wait())
            .await
            .is_err()
        {
            stopped.tasks_left = background.len();
            tracing::error!(
                tasks = stopped.tasks_left,
                "background tasks did not end in time; exiting anyway"
            );
        }
        tracing::info!("agent stopped");
        stopped
    }
}

#[cfg(test)]
mod tests;
