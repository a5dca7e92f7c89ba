//! Advertising this node in the registry: builds the node's [`NodeRecord`]
//! from the pool and GPU telemetry; `infermesh-registry`'s
//! [`publish`](infermesh_registry::publish) keeps it in ZooKeeper (ephemeral
//! node, rewrites, re-registration after a session expiry, `draining` then
//! deleted on shutdown, reconnects with `infermesh-backoff`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use infermesh_gpu::GpuTelemetry;
use infermesh_proto::registry::{Capacity, Endpoints, ModelEntry, NodeRecord, NodeState, SCHEMA};
use infermesh_registry::publish::{self, Advertise, PublishConfig};
pub use infermesh_registry::publish::{
    MIN_REWRITE_INTERVAL, Phase, WEIGHT_HYSTERESIS, worth_rewriting,
};
use tokio::sync::watch;

pub use crate::config::RegistryConfig;
use crate::dispatch::pool::Pool;

/// What the registration task needs to build the record.
pub struct Advertised {
    /// Node id.
    pub node_id: String,
    /// OIP address clients should call.
    pub grpc: String,
    /// Admin address.
    pub admin: String,
    /// Configured capacity score; `None` with `weight = "auto"` (the live
    /// capacity of all workers is advertised instead).
    pub score: Option<f64>,
    /// GPU telemetry (model name and count).
    pub gpus: Arc<dyn GpuTelemetry>,
    /// The pool (state, weight, models).
    pub pool: Arc<Pool>,
    /// The RDMA path's kind (`verbs`, `emulated`) when the agent offers one.
    pub rdma: Option<String>,
    /// Zone advertised.
    pub zone: String,
    /// Whether the ports serve TLS (`[tls]`).
    pub tls: bool,
    /// The QUIC rung's address, when offered.
    pub quic: Option<String>,
}

impl Advertise for Advertised {
    fn ready(&self) -> bool {
        self.pool.any_ready()
    }

    fn record(&self, phase: Phase) -> NodeRecord {
        let devices = self.gpus.devices();
        let state = if phase != Phase::Serving {
            NodeState::Draining
        } else if self.pool.degraded() {
            NodeState::Degraded
        } else {
            NodeState::Serving
        };
        NodeRecord {
            schema: SCHEMA,
            node_id: self.node_id.clone(),
            zone: self.zone.clone(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            state,
            weight: self.pool.weight(),
            capacity: Capacity {
                gpu_model: devices.first().map(|d| d.name.clone()).unwrap_or_default(),
                gpu_count: devices.len() as u32,
                score: self.score.unwrap_or_else(|| self.pool.score()),
            },
            endpoints: Endpoints {
                grpc: self.grpc.clone(),
                admin: self.admin.clone(),
                rdma: self.rdma.clone(),
                tls: self.tls,
                quic: self.quic.clone(),
                ..Default::default()
            },
            models: self
                .pool
                .model_readiness()
                .into_iter()
                .map(|(name, ready)| ModelEntry { name, ready })
                .collect(),
            updated_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}

/// Keeps the node's record in the registry until `phase` reaches [`Phase::Gone`].
pub async fn run(cfg: RegistryConfig, node: Advertised, phase: watch::Receiver<Phase>) {
    let cfg = PublishConfig {
        url: cfg.url,
        service: cfg.service,
        node_id: node.node_id.clone(),
        session_timeout: cfg.session_timeout,
        auth: cfg.auth,
    };
    publish::run(cfg, node, phase).await
}
