//! How the client picks transports, and the defaults.

use std::time::Duration;

use infermesh_rdma::RdmaEngine;
use infermesh_tls::ClientTls;
use infermesh_transport::Path;
use infermesh_transport::shm::{PoolConfig, ShmDir, ShmPool};

/// Shared-memory pool a client registers with a same-host agent.
pub const DEFAULT_SHM_POOL_BYTES: u64 = 256 << 20;
/// Requests whose raw input tensors total fewer bytes go inline even to the
/// local node:
/// below about 32 KiB a shared-memory region costs more than the copy it
/// saves (BENCHMARKS.md, "Tensor transports": inline is 25% faster at
/// 1 KiB, 6% at 16 KiB; shared memory 4–22% faster at 64 KiB).
pub const DEFAULT_SHM_MIN_BYTES: usize = 32 << 10;
/// How long a broken transport stays broken before it is tried again.
pub const DEFAULT_REPROBE_AFTER: Duration = Duration::from_secs(30);

/// How the client picks transports.
#[derive(Debug, Clone)]
pub struct PathsConfig {
    /// Paths in order of preference (gRPC is always the last resort).
    pub prefer: Vec<Path>,
    /// Bytes of shared memory the client may hold in its pool.
    pub shm_pool_bytes: u64,
    /// Requests whose raw input tensors total fewer bytes go inline even to
    /// the local node ([`DEFAULT_SHM_MIN_BYTES`]; 0 = every request).
    pub shm_min_bytes: usize,
    /// First wait before a broken path is tried again.
    pub reprobe_after: Duration,
    /// The RDMA engine (`RdmaEngine::probe()` on a host with a verbs device,
    /// `RdmaEngine::emulated()` in tests); `None` = no RDMA path.
    pub rdma: Option<RdmaEngine>,
    /// Where shared-memory regions are created (`/dev/shm`; tests point it
    /// elsewhere).
    pub shm_dir: Option<std::path::PathBuf>,
    /// TLS to agents whose records say their ports serve TLS (issue 13);
    /// without it such agents are skipped with a warning.
    pub tls: Option<ClientTls>,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            prefer: vec![Path::Shm, Path::Rdma, Path::Grpc],
            shm_pool_bytes: DEFAULT_SHM_POOL_BYTES,
            shm_min_bytes: DEFAULT_SHM_MIN_BYTES,
            reprobe_after: DEFAULT_REPROBE_AFTER,
            shm_dir: None,
            rdma: None,
            tls: None,
        }
    }
}

impl PathsConfig {
    /// The pool leases come from when the transport has none (a custom
    /// transport, or no shared-memory rung): regions are still leased, and
    /// their inputs sent inline.
    pub(crate) fn own_pool(&self) -> ShmPool {
        let mut config = PoolConfig {
            max_total_bytes: self.shm_pool_bytes,
            ..PoolConfig::default()
        };
        if let Some(dir) = &self.shm_dir {
            config.dir = ShmDir::new(dir.clone());
        }
        ShmPool::new(config)
    }
}
