//! The demo's fleet: three agents running in this process (tokio tasks
//! around [`infermesh_agent::run`]), each supervising `infermesh-testworker`
//! processes of a different speed, stopped through a shutdown future the
//! demo controls.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use infermesh_agent::config::{RawGpu, RawRegistry, RawSentinel};
use infermesh_agent::{AgentConfig, RawConfig, RawWorker, RunError};
use infermesh_proto::admin::admin_client::AdminClient;
use infermesh_proto::admin::{StatusRequest, StatusResponse, WorkerStatus};
use infermesh_proto::inference::ModelInferRequest;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// One node of the demo: its name, and the workers its agent runs.
pub struct NodePlan {
    /// Node id (and the name shown).
    pub name: &'static str,
    /// Test workers on the node.
    pub workers: u32,
    /// Service time of each worker (emulated GPU compute).
    pub service_time_ms: u32,
}

/// node-a is this host's node; the others are remote. Capacity differs by
/// node, so the client's balancing has something to do.
pub const PLAN: [NodePlan; 3] = [
    NodePlan {
        name: "node-a",
        workers: 1,
        service_time_ms: 2,
    },
    NodePlan {
        name: "node-b",
        workers: 2,
        service_time_ms: 4,
    },
    NodePlan {
        name: "node-c",
        workers: 1,
        service_time_ms: 8,
    },
];

/// Requests one test worker computes at once.
const WORKER_SLOTS: u32 = 4;

/// Where the agents register, when not in the embedded static list.
#[derive(Debug, Clone)]
pub struct ZkRegistry {
    /// `zk://host:port[/chroot]`.
    pub url: String,
    /// Service name.
    pub service: String,
}

/// A running agent.
pub struct Node {
    /// Node id.
    pub name: &'static str,
    /// The node's OIP address.
    pub oip: SocketAddr,
    /// The node's admin address.
    pub admin: SocketAddr,
    admin_client: AdminClient<Channel>,
}

impl Node {
    /// The agent's admin Status, or why it could not be read.
    pub async fn status(&self) -> Result<StatusResponse, String> {
        let mut c = self.admin_client.clone();
        let mut req = tonic::Request::new(StatusRequest {});
        req.set_timeout(Duration::from_millis(800));
        c.status(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|e| format!("{}: admin Status: {}", self.name, e.message()))
    }
}

/// The three agents.
pub struct Fleet {
    /// The nodes, in [`PLAN`] order.
    pub nodes: Vec<Node>,
    stop: watch::Sender<bool>,
    agents: Vec<(&'static str, JoinHandle<Result<(), RunError>>)>,
}

/// Microseconds since the Unix epoch (the agents' event clock).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Two distinct loopback ports free right now. The agent binds them moments
/// later; another process taking one in between fails the start with a
/// clear error.
fn free_ports() -> std::io::Result<(SocketAddr, SocketAddr)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?, b.local_addr()?))
}

/// `path` as one shell word for the worker command line.
fn shell_word(path: &Path) -> String {
    let s = path.to_string_lossy();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn config(
    plan: &NodePlan,
    oip: SocketAddr,
    admin: SocketAddr,
    testworker: &Path,
    zk: Option<&ZkRegistry>,
) -> Result<AgentConfig, String> {
    let command = format!(
        "{} --listen 127.0.0.1:{{port}} --service-time-ms {} --concurrency {WORKER_SLOTS}",
        shell_word(testworker),
        plan.service_time_ms
    );
    let raw = RawConfig {
        node_id: Some(plan.name.into()),
        listen: Some(oip.to_string()),
        admin_listen: Some(admin.to_string()),
        // The default weight, "auto": each node advertises the capacity it
        // measures, and the client also tells fast from slow by the latency
        // it sees (peak EWMA), which is what the slowdown shows first.
        weight: None,
        shutdown_grace: Some(Duration::from_secs(2)),
        // The agent shares this process's runtime; it does not build its own.
        threads: None,
        // As scripts/drill.sh: a crash restarts at once, and a worker is out
        // of its crash loop one second after it is ready again.
        sentinel: RawSentinel {
            stable_period: Some(Duration::from_secs(1)),
            backoff_base: Some(Duration::from_millis(100)),
            ..Default::default()
        },
        gpu: RawGpu {
            backend: Some("off".into()),
            ..Default::default()
        },
        registry: RawRegistry {
            url: zk.map(|z| z.url.clone()),
            service: zk.map(|z| z.service.clone()),
            ..Default::default()
        },
        workers: (0..plan.workers)
            .map(|i| RawWorker {
                id: Some(format!("w{i}")),
                command: command.clone(),
                startup_timeout: Some(Duration::from_secs(30)),
                stop_grace: Some(Duration::from_secs(2)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut cfg = AgentConfig::from_raw(raw).map_err(|e| format!("{}: {e}", plan.name))?;
    // As `infermesh agent` does: workers start through `infermesh
    // worker-shim` (cli/src/shim.rs), so they die with the demo even if it
    // is SIGKILLed.
    cfg.worker_shim = std::env::current_exe().ok();
    Ok(cfg)
}

impl Fleet {
    /// Starts the agents one after another (each bound before the next picks
    /// its ports). Returns once every admin address answers; the workers may
    /// still be starting ([`Fleet::wait_ready`]).
    pub async fn start(testworker: &Path, zk: Option<&ZkRegistry>) -> Result<Fleet, String> {
        let (stop, stop_rx) = watch::channel(false);
        let mut fleet = Fleet {
            nodes: Vec::new(),
            stop,
            agents: Vec::new(),
        };
        for plan in &PLAN {
            let (oip, admin) = free_ports().map_err(|e| format!("no free loopback port: {e}"))?;
            let cfg = config(plan, oip, admin, testworker, zk)?;
            let mut rx = stop_rx.clone();
            let shutdown = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let task = tokio::spawn(infermesh_agent::run(cfg, shutdown));
            fleet.agents.push((plan.name, task));
            let admin_client = match connect_admin(admin, &mut fleet.agents).await {
                Ok(c) => c,
                Err(e) => {
                    fleet.stop().await;
                    return Err(format!("{}: {e}", plan.name));
                }
            };
            fleet.nodes.push(Node {
                name: plan.name,
                oip,
                admin,
                admin_client,
            });
        }
        Ok(fleet)
    }

    /// Waits until every worker of every node is routable.
    pub async fn wait_ready(&self, patience: Duration) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        loop {
            let mut waiting = Vec::new();
            for n in &self.nodes {
                match n.status().await {
                    Ok(s) if s.workers.iter().all(|w| w.routable) => {}
                    Ok(s) => waiting.extend(
                        s.workers
                            .iter()
                            .filter(|w| !w.routable)
                            .map(|w| describe_unready(n.name, w)),
                    ),
                    Err(e) => waiting.push(e),
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "workers not ready after {patience:?}: {}",
                    waiting.join("; ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every agent (they drain, then stop their workers) and returns
    /// once they are all done; problems are printed.
    pub async fn stop(&mut self) {
        let _ = self.stop.send(true);
        for (name, task) in self.agents.drain(..) {
            match tokio::time::timeout(Duration::from_secs(15), task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => eprintln!("{name}: agent failed: {e}"),
                Ok(Err(e)) => eprintln!("{name}: agent task failed: {e}"),
                Err(_) => eprintln!("{name}: agent did not stop within 15 s"),
            }
        }
    }
}

fn describe_unready(node: &str, w: &WorkerStatus) -> String {
    let mut s = format!("{node}/{} {}", w.id, w.state);
    if !w.last_exit.is_empty() {
        s.push_str(&format!(" (last exit: {})", w.last_exit));
    }
    if let Some(line) = w.last_output.last() {
        s.push_str(&format!(" (output: {line})"));
    }
    s
}

/// Connects to a just-started agent's admin address; fails at once if the
/// agent task ended (e.g. its port was taken).
async fn connect_admin(
    admin: SocketAddr,
    agents: &mut [(&'static str, JoinHandle<Result<(), RunError>>)],
) -> Result<AdminClient<Channel>, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((_, task)) = agents.last_mut() {
            if task.is_finished() {
                return Err(match task.await {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(())) => "agent stopped at once".into(),
                    Err(e) => format!("agent task failed: {e}"),
                });
            }
        }
        if let Ok(c) = AdminClient::connect(format!("http://{admin}")).await {
            return Ok(c);
        }
        if Instant::now() > deadline {
            return Err(format!("admin address {admin} not answering after 10 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `dense` model's request, with a fault to fire if given.
pub fn dense_request(fault: Option<&str>) -> ModelInferRequest {
    crate::drill::request("dense", fault)
}

/// A fault fired into a worker.
#[derive(Debug, Clone)]
pub struct Injection {
    /// Node.
    pub node: &'static str,
    /// Worker id.
    pub worker: String,
    /// The worker's own OIP address.
    pub address: String,
    /// When it was sent, Unix µs.
    pub at_micros: u64,
}

/// Sends a request asking for fault `kind` straight to the first routable
/// worker of `node` (not through the agent, as a real fault would arise
/// inside it). The answer does not matter: the worker crashes or slows down.
pub async fn inject(node: &Node, kind: &str) -> Result<Injection, String> {
    let status = node.status().await?;
    let victim = status
        .workers
        .iter()
        .find(|w| w.routable)
        .ok_or_else(|| format!("{}: no routable worker to inject into", node.name))?;
    let mut client = infermesh_proto::oip_client(
        &victim.address,
        Duration::from_secs(1),
        infermesh_proto::DEFAULT_MAX_MESSAGE_BYTES,
    )?;
    let at_micros = unix_micros();
    let req = dense_request(Some(kind));
    tokio::spawn(async move {
        let mut r = tonic::Request::new(req);
        r.set_timeout(Duration::from_secs(10));
        let _ = client.model_infer(r).await;
    });
    Ok(Injection {
        node: node.name,
        worker: victim.id.clone(),
        address: victim.address.clone(),
        at_micros,
    })
}
