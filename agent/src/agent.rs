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

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::registry::Phase;
use crate::config::AgentConfig;
use crate::dispatch::pool::Pool;
use crate::metrics::Metrics;
use crate::serving::server::Shutdown;
use crate::supervision::launch::Launcher;
use crate::supervision::spawn::ProcessLauncher;

mod node;
mod ports;
mod serve;

use node::{Node, Record};
use ports::{Ports, load_tls};

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

/// Where the agent's tasks run and what ends them (see the module docs).
struct Tasks {
    /// Client connections, their streams, stream forwarders.
    requests: TaskTracker,
    /// Supervisors, connections to workers, GPU events, the registry, the
    /// admin port, KServe HTTP.
    background: TaskTracker,
    /// Stops the supervisors (their workers get SIGTERM, then SIGKILL).
    stop_workers: CancellationToken,
    /// Stops the other background tasks.
    stop_background: CancellationToken,
    /// Stops the client ports: gracefully (GOAWAY), then hard.
    port: Shutdown,
}

impl Tasks {
    fn new() -> Self {
        Self {
            requests: TaskTracker::new(),
            background: TaskTracker::new(),
            stop_workers: CancellationToken::new(),
            stop_background: CancellationToken::new(),
            port: Shutdown {
                graceful: CancellationToken::new(),
                hard: CancellationToken::new(),
            },
        }
    }

    /// Runs `task` in the background until it ends or the background stops.
    fn background_until_stopped(&self, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop_background.clone();
        self.background.spawn(async move {
            tokio::select! {
                _ = task => {}
                _ = stop.cancelled() => {}
            }
        });
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
    tasks: Tasks,
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

    /// Assembles the agent, step by step, and serves until [`Agent::stop`]:
    /// a failure at any step (a port taken, a certificate that does not
    /// load, no address to advertise) fails the start.
    pub async fn start(cfg: AgentConfig, launcher: Arc<dyn Launcher>) -> Result<Self, RunError> {
        let started = Instant::now();
        // 1. The certificate and every listening socket.
        let tls = load_tls(&cfg)?;
        let Ports {
            client,
            admin,
            listen,
            admin_listen,
            http_listen,
            quic_listen,
        } = Ports::bind(&cfg, tls.as_deref()).await?;
        // 2. What the layers share: the pool of workers, metrics, GPUs, RDMA.
        let tasks = Tasks::new();
        let (node, drivers) = Node::open(&cfg).await?;
        // 3. A supervisor per worker; GPU events and the capacity task.
        node.supervise(&cfg, drivers, launcher, &tasks);
        node.watch_gpus(&cfg, &tasks);
        // 4. The node's record in the registry.
        let Record {
            phase: set_phase,
            publisher: registration,
        } = node.advertise(
            &cfg,
            (listen, admin_listen),
            quic_listen,
            tls.is_some(),
            &tasks,
        )?;
        // 5. Serving: the client ports, then the admin port.
        serve::data_plane(&cfg, &node, client, tls.as_ref(), &tasks);
        serve::admin(
            &cfg,
            &node,
            admin,
            tls.as_ref(),
            started,
            &set_phase,
            &tasks,
        );
        tracing::info!(node = %cfg.node_id, %listen, %admin_listen, http_listen = ?http_listen, quic_listen = ?quic_listen, tls = tls.is_some(), workers = cfg.workers.len(), "agent serving");
        Ok(Agent {
            cfg,
            pool: node.pool,
            metrics: node.metrics,
            listen,
            admin_listen,
            quic_listen,
            tasks,
            set_phase,
            registration,
        })
    }

    /// Shuts down in order (see the module docs) and returns how it went.
    pub async fn stop(self) -> Stopped {
        let Agent {
            cfg,
            pool,
            tasks:
                Tasks {
                    requests,
                    background,
                    stop_workers,
                    stop_background,
                    port,
                },
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

#[cfg(test)]
mod cut_through_tests;

#[cfg(test)]
mod backlog_tests;
#[cfg(test)]
mod stream_reader_tests;
