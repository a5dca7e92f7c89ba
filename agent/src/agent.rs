//! The agent's life: bind, spawn workers, serve, and on shutdown drain
//! in-flight requests before stopping workers.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use infermesh_proto::GrpcInferenceServiceServer;
use infermesh_proto::rdma::RdmaServer;
use infermesh_transport::shm::ShmRegistry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::config::AgentConfig;
use crate::conn;
use crate::front::Front;
use crate::gpu;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::rdma::{RdmaPeers, RdmaService};
use crate::registry::{self, Advertised, Phase};
use crate::supervisor::{self, Context};
use crate::trailer::LoadReportLayer;
use crate::worker::{Input, Worker};
use infermesh_gpu::{GpuTelemetry, XidClassifier};

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
    /// The OIP server failed.
    #[error("OIP server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The configured RDMA emulation could not start.
    #[error("cannot start the RDMA emulation: {0}")]
    Rdma(#[source] std::io::Error),
}

/// Opens the configured GPU telemetry; on failure logs one line and runs
/// without it.
fn open_gpu_telemetry(cfg: &AgentConfig) -> Arc<dyn GpuTelemetry> {
    match infermesh_gpu::open(cfg.gpu_backend, cfg.fake_gpus) {
        Ok(t) => {
            tracing::info!(
                backend = t.backend(),
                devices = t.devices().len(),
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

/// Runs an agent until `shutdown` resolves, then shuts down gracefully:
/// readiness turns false, no new connections are accepted, in-flight requests
/// finish (bounded by `shutdown_grace`), workers get SIGTERM (SIGKILL after
/// their `stop_grace`), and the function returns.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let started = Instant::now();
    let bind = |addr, what| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Bind { addr, what, source })
    };
    let oip_listener = bind(cfg.listen, "OIP gRPC").await?;
    let admin_listener = bind(cfg.admin_listen, "admin").await?;
    let (listen, admin_listen) = (
        oip_listener.local_addr().unwrap_or(cfg.listen),
        admin_listener.local_addr().unwrap_or(cfg.admin_listen),
    );

    let (workers, inputs): (Vec<_>, Vec<_>) = cfg.workers.iter().cloned().map(Worker::new).unzip();
    let pool = Pool::new(workers, cfg.weight, cfg.queue_capacity);
    let metrics = Arc::new(Metrics::new());
    let patterns = Arc::new(cfg.fault_patterns.clone());
    let gpus = open_gpu_telemetry(&cfg);
    let health = Arc::new(cfg.health.clone());
    let rdma = crate::rdma::open(cfg.rdma)
        .await
        .map_err(RunError::Rdma)?
        .map(|engine| Arc::new(RdmaPeers::new(engine, cfg.max_message_bytes)));
    if cfg.admin_token.is_none() {
        tracing::info!(
            "no admin token file: mutating admin calls (drain, restart, ...) are refused"
        );
    }
    let ctx = Context {
        health: Arc::clone(&health),
        pool: Arc::clone(&pool),
        metrics: Arc::clone(&metrics),
        max_message_bytes: cfg.max_message_bytes,
        patterns: Arc::clone(&patterns),
        sentinel: cfg.sentinel.clone(),
        probe_interval: cfg.probe_interval,
        probe_timeout: cfg.probe_timeout,
    };
    // Seeds only the backoff jitter; different per agent start and per worker.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let supervisors: Vec<_> = pool
        .workers()
        .iter()
        .zip(inputs)
        .enumerate()
        .map(|(i, (w, rx))| {
            tokio::spawn(supervisor::supervise(
                Arc::clone(w),
                ctx.clone(),
                rx,
                seed ^ i as u64,
            ))
        })
        .collect();
    let gpu_watch = tokio::spawn(gpu::watch(
        Arc::clone(&gpus),
        XidClassifier::new(cfg.xid_policy.clone()),
        Arc::clone(&pool),
        Arc::clone(&metrics),
    ));
    let (set_phase, phase_rx) = watch::channel(Phase::Serving);
    let set_phase = Arc::new(set_phase);
    let registration = cfg.registry.clone().map(|rcfg| {
        let advertised = Advertised {
            node_id: cfg.node_id.clone(),
            grpc: cfg.advertise.clone(),
            admin: admin_listen.to_string(),
            score: cfg.weight,
            gpus: Arc::clone(&gpus),
            pool: Arc::clone(&pool),
            rdma: rdma.as_ref().map(|r| r.kind().to_string()),
        };
        tokio::spawn(registry::run(rcfg, advertised, phase_rx))
    });
    let stop_workers = || {
        for w in pool.workers() {
            w.report(Input::Stop);
        }
    };

    let (stop_serving, serving_rx) = watch::channel(false);
    let oip = {
        let shm = ShmRegistry::default();
        let on_close: conn::OnClose = {
            let (shm, pool, rdma) = (shm.clone(), Arc::clone(&pool), rdma.clone());
            Arc::new(move |owner| {
                shm.drop_owner(owner);
                if let Some(rdma) = &rdma {
                    rdma.drop_owner(owner);
                }
                // Regions passed through to workers go too.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let pool = Arc::clone(&pool);
                    rt.spawn(
                        async move { crate::shm::forget_on_workers(&pool, owner, None).await },
                    );
                }
            })
        };
        let front = GrpcInferenceServiceServer::new(
            Front::new(
                Arc::clone(&pool),
                Arc::clone(&metrics),
                Arc::clone(&patterns),
                shm,
            )
            .with_rdma(rdma.clone()),
        )
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
        let mut rx = serving_rx.clone();
        let server = tonic::transport::Server::builder()
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .layer(LoadReportLayer::new(Arc::clone(&pool)))
            .add_service(front)
            .add_optional_service(rdma.map(|r| RdmaServer::new(RdmaService::new(r))))
            .serve_with_incoming_shutdown(conn::incoming(oip_listener, on_close), async move {
                let _ = rx.wait_for(|s| *s).await;
            });
        tokio::spawn(server)
    };
    let admin = {
        let state = AdminState {
            node_id: cfg.node_id.clone(),
            pool: Arc::clone(&pool),
            metrics: Arc::clone(&metrics),
            started,
            gpus: Arc::clone(&gpus),
            token: cfg.admin_token.clone(),
            health: Arc::clone(&health),
            phase: Arc::clone(&set_phase),
        };
        let mut rx = serving_rx.clone();
        let server =
            axum::serve(admin_listener, admin::router(state)).with_graceful_shutdown(async move {
                let _ = rx.wait_for(|s| *s).await;
            });
        tokio::spawn(async move { server.await })
    };
    tracing::info!(node = %cfg.node_id, %listen, %admin_listen, workers = cfg.workers.len(), "agent serving");

    let mut oip = oip;
    tokio::select! {
        _ = shutdown => {}
        result = &mut oip => {
            // The OIP server ended on its own: that is fatal.
            stop_workers();
            gpu_watch.abort();
            for s in supervisors { let _ = s.await; }
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.into()),
                Err(join) => panic!("OIP server task panicked: {join}"),
            };
        }
    }

    let in_flight = pool.load().in_flight;
    tracing::info!(in_flight, grace = ?cfg.shutdown_grace, "shutting down: draining in-flight requests");
    pool.set_stopping();
    // Clients see `draining` and stop sending new requests while in-flight ones finish.
    let _ = set_phase.send(Phase::Draining);
    let _ = stop_serving.send(true);
    match tokio::time::timeout(cfg.shutdown_grace, &mut oip).await {
        Ok(_) => tracing::info!("in-flight requests finished"),
        Err(_) => {
            tracing::warn!(
                left = pool.load().in_flight,
                "shutdown grace ran out; stopping with requests in flight"
            );
            oip.abort();
        }
    }
    let _ = set_phase.send(Phase::Gone);
    if let Some(r) = registration {
        if tokio::time::timeout(std::time::Duration::from_secs(3), r)
            .await
            .is_err()
        {
            tracing::warn!(
                "registry did not confirm the deregistration in 3 s; the record goes with the session"
            );
        }
    }
    stop_workers();
    for s in supervisors {
        let _ = s.await;
    }
    gpu_watch.abort();
    let _ = admin.await;
    tracing::info!("agent stopped");
    Ok(())
}
