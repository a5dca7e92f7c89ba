//! The engine: one per process, what the agent and the client use.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::connection::EngineShared;
use crate::emulated::{EmulatedDevice, EmulatedFaults};
use crate::hw::SidewayDevice;
use crate::memory::Access;
use crate::mr_cache::{MrCache, MrStats};
use crate::verbs::VerbsDevice;
use crate::{Connection, EndpointInfo, RdmaError, Registered};

/// Engine settings.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Budget of registered (pinned) bytes of the [`MrCache`]. Default 1 GiB.
    pub mr_cache_bytes: usize,
    /// Verbs device name (e.g. `mlx5_0`); the first with an active port if
    /// unset.
    pub device: Option<String>,
    /// Device port. Default 1.
    pub port: u8,
    /// GID index; on RoCE a RoCE v2 IPv4 GID is picked if unset.
    pub gid_index: Option<u32>,
    /// Most work requests in flight across all connections. Default 1024.
    pub max_outstanding: usize,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            mr_cache_bytes: 1 << 30,
            device: None,
            port: 1,
            gid_index: None,
            max_outstanding: 1024,
        }
    }
}

/// The RDMA path of one process: a device (real or emulated), its memory
/// registration cache and its connections. Cheap to clone.
#[derive(Clone)]
pub struct RdmaEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    shared: Arc<EngineShared>,
    faults: Option<EmulatedFaults>,
    /// Client side: one connection slot per peer key.
    peers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Connection>>>>>,
    /// Agent side: accepted connections by local QPN.
    accepted: Mutex<HashMap<u32, Connection>>,
}

impl RdmaEngine {
    /// The real device with default settings, or `None` (see
    /// [`probe_with`](Self::probe_with)).
    pub fn probe() -> Option<RdmaEngine> {
        Self::probe_with(&RdmaConfig::default())
    }

    /// Opens a verbs device if the host has one; otherwise logs one line
    /// saying why not and returns `None`, so the path is not advertised.
    /// Blocks briefly (device queries).
    pub fn probe_with(config: &RdmaConfig) -> Option<RdmaEngine> {
        // sideway panics on some unexpected driver values; a probe must not.
        let opened = std::panic::catch_unwind(|| SidewayDevice::open(config))
            .unwrap_or_else(|_| Err(RdmaError::verbs("probe", "panicked in the verbs wrapper")));
        match opened {
            Ok(device) => {
                tracing::info!("RDMA path enabled: {}", device.description());
                Some(Self::with_device(Arc::new(device), None, config))
            }
            Err(e @ (RdmaError::LibraryMissing | RdmaError::NoDevice(_))) => {
                tracing::info!("RDMA path disabled: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("RDMA path disabled: {e}");
                None
            }
        }
    }

    /// Opens a verbs device or says why not, without logging (for a
    /// configuration that requires RDMA).
    pub fn open_verbs(config: &RdmaConfig) -> Result<RdmaEngine, RdmaError> {
        let device = SidewayDevice::open(config)?;
        Ok(Self::with_device(Arc::new(device), None, config))
    }

    /// The software emulation with default settings (tests, `--rdma
    /// emulated`). Needs a tokio runtime.
    pub async fn emulated() -> std::io::Result<RdmaEngine> {
        Self::emulated_with(&RdmaConfig::default()).await
    }

    /// The software emulation.
    pub async fn emulated_with(config: &RdmaConfig) -> std::io::Result<RdmaEngine> {
        let faults = EmulatedFaults::default();
        let device = EmulatedDevice::start(faults.clone()).await?;
        Ok(Self::with_device(Arc::new(device), Some(faults), config))
    }

    fn with_device(
        device: Arc<dyn VerbsDevice>,
        faults: Option<EmulatedFaults>,
        config: &RdmaConfig,
    ) -> RdmaEngine {
        let shared = Arc::new(EngineShared {
            cache: MrCache::new(Arc::clone(&device), config.mr_cache_bytes),
            device,
            outstanding: Arc::new(Semaphore::new(config.max_outstanding.max(1))),
            next_wr_id: AtomicU64::new(1),
        });
        RdmaEngine {
            inner: Arc::new(EngineInner {
                shared,
                faults,
                peers: Mutex::default(),
                accepted: Mutex::default(),
            }),
        }
    }

    /// `"verbs"` or `"emulated"`.
    pub fn kind(&self) -> &'static str {
        self.inner.shared.device.kind()
    }

    /// The fault switches, for the emulation only.
    pub fn faults(&self) -> Option<&EmulatedFaults> {
        self.inner.faults.as_ref()
    }

    /// A registered buffer of `len` bytes granting peers `access`, from the
    /// registration cache (a miss registers off the runtime).
    pub async fn register(&self, len: usize, access: Access) -> Result<Registered, RdmaError> {
        self.inner.shared.register(len, access).await
    }

    /// Registration cache counters.
    pub fn mr_stats(&self) -> MrStats {
        self.inner.shared.cache.stats()
    }

    /// Deregisters every idle cached buffer (blocks briefly on hardware).
    pub fn trim_cache(&self) {
        self.inner.shared.cache.clear();
    }

    /// Client side: the cached connection to `peer` (any stable key, e.g.
    /// the node id), or a new one. A new one creates a queue pair, passes
    /// its [`EndpointInfo`] to `exchange` — which carries it to the agent
    /// over the control path and returns the agent's answer from
    /// [`accept`](Self::accept) — and connects to that. A broken cached
    /// connection is replaced.
    pub async fn connect<F, Fut>(&self, peer: &str, exchange: F) -> Result<Connection, RdmaError>
    where
        F: FnOnce(EndpointInfo) -> Fut,
        Fut: Future<Output = Result<EndpointInfo, RdmaError>>,
    {
        let slot = {
            let mut peers = lock(&self.inner.peers);
            Arc::clone(peers.entry(peer.to_string()).or_default())
        };
        let mut slot = slot.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| !c.is_broken()) {
            return Ok(conn.clone());
        }
        *slot = None;
        let qp = self.create_qp().await?;
        let remote = exchange(qp.local_info()).await?;
        self.check_kind(&remote)?;
        qp.connect(remote.clone()).await?;
        let conn = Connection::new(qp, remote, Arc::clone(&self.inner.shared));
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Drops the cached connection to `peer`. Call it when the agent reports
    /// an RDMA failure for a request (its end of the connection may be in
    /// the error state while this end still looks healthy), so the next
    /// [`connect`](Self::connect) sets up a new one.
    pub fn disconnect(&self, peer: &str) {
        lock(&self.inner.peers).remove(peer);
    }

    /// Agent side: a connection to the client that sent `peer`; reply with
    /// its [`Connection::local_info`]. The connection stays registered
    /// under its QPN for [`connection`](Self::connection) until
    /// [`close`](Self::close) or until it breaks.
    pub async fn accept(&self, peer: &EndpointInfo) -> Result<Connection, RdmaError> {
        self.check_kind(peer)?;
        let qp = self.create_qp().await?;
        qp.connect(peer.clone()).await?;
        let conn = Connection::new(qp, peer.clone(), Arc::clone(&self.inner.shared));
        let mut accepted = lock(&self.inner.accepted);
        accepted.retain(|_, c| !c.is_broken());
        accepted.insert(conn.qpn(), conn.clone());
        Ok(conn)
    }

    /// Agent side: the accepted connection with local QPN `qpn` (the QPN the
    /// client quotes in its request), unless closed or broken.
    pub fn connection(&self, qpn: u32) -> Option<Connection> {
        let mut accepted = lock(&self.inner.accepted);
        match accepted.get(&qpn) {
            Some(c) if c.is_broken() => {
                accepted.remove(&qpn);
                None
            }
            found => found.cloned(),
        }
    }

    /// Agent side: forgets the accepted connection `qpn`.
    pub fn close(&self, qpn: u32) {
        lock(&self.inner.accepted).remove(&qpn);
    }

    async fn create_qp(&self) -> Result<Box<dyn crate::verbs::QueuePair>, RdmaError> {
        let device = Arc::clone(&self.inner.shared.device);
        tokio::task::spawn_blocking(move || device.create_qp())
            .await
            .map_err(|e| RdmaError::Io(std::io::Error::other(e)))?
    }

    fn check_kind(&self, peer: &EndpointInfo) -> Result<(), RdmaError> {
        if peer.kind() != self.kind() {
            return Err(RdmaError::KindMismatch {
                local: self.kind(),
                peer: peer.kind(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for RdmaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaEngine")
            .field("kind", &self.kind())
            .field("mr", &self.mr_stats())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
