//! [`ShmPool`]: the client's shared-memory regions, created once and leased
//! per request.
//!
//! Regions are named `infermesh-<pid>-<seq>` and sized in powers of two
//! (at least 64 KiB), so a request of any size finds an idle region of its
//! class once the pool is warm: leasing pops from a free list and a dropped
//! [`ShmLease`] pushes back, with no allocation and no system call. The pool
//! holds at most `max_total_bytes`; when a new region would not fit, idle
//! regions of other sizes are retired to make room, and if that is not
//! enough the lease fails with [`ShmError::PoolExhausted`] and the caller
//! sends the request inline.
//!
//! A region is registered with a peer once and reused: each remembers the
//! peers it is registered with. Retired regions are reported by
//! [`ShmPool::take_retired`] so the caller can unregister them.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::key::ShmDir;
use super::lease::ShmLease;
use super::region::ShmRegion;
use crate::error::ShmError;

/// Smallest region the pool creates.
pub const MIN_REGION_BYTES: u64 = 64 * 1024;
/// Default bound on the pool's total size.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 256 * 1024 * 1024;

/// Sequence numbers for region names, shared by every pool in the process.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Where a [`ShmPool`] creates regions and how much it may hold.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Directory regions are created in (`/dev/shm`).
    pub dir: ShmDir,
    /// Bytes all regions together may hold.
    pub max_total_bytes: u64,
    /// Smallest region created; sizes are rounded up to a power of two.
    pub min_region_bytes: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            dir: ShmDir::system(),
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            min_region_bytes: MIN_REGION_BYTES,
        }
    }
}

/// A region owned by the pool.
#[derive(Debug)]
pub struct PooledRegion {
    name: String,
    region: ShmRegion,
    /// Peers this region is registered with.
    registered: Mutex<HashSet<String>>,
}

impl PooledRegion {
    /// The name it is registered under (also its key without the `/`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mapped region.
    pub fn region(&self) -> &ShmRegion {
        &self.region
    }

    fn peers(&self) -> MutexGuard<'_, HashSet<String>> {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the caller registered this region with `peer`.
    pub fn is_registered_with(&self, peer: &str) -> bool {
        self.peers().contains(peer)
    }

    /// Records that `peer` accepted the registration.
    pub fn mark_registered(&self, peer: &str) {
        self.peers().insert(peer.to_string());
    }

    fn forget(&self, peer: &str) {
        self.peers().remove(peer);
    }
}

/// A region retired from the pool, which peers may still have registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiredRegion {
    /// The registered name.
    pub name: String,
    /// Peers to send `SystemSharedMemoryUnregister` to.
    pub peers: Vec<String>,
}

/// Counters of a [`ShmPool`], for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Regions created.
    pub created: u64,
    /// Leases served by an idle region.
    pub reused: u64,
    /// Regions retired to make room.
    pub retired: u64,
    /// Leases refused for lack of room.
    pub exhausted: u64,
    /// Bytes all current regions hold.
    pub total_bytes: u64,
    /// Regions leased now.
    pub leased: usize,
}

/// Pooled client-side shared-memory regions. Clones share the pool.
#[derive(Clone, Default)]
pub struct ShmPool {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    config: PoolConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Idle regions by size.
    idle: BTreeMap<u64, Vec<Arc<PooledRegion>>>,
    /// Every region, idle or leased.
    all: Vec<Arc<PooledRegion>>,
    retired: Vec<RetiredRegion>,
    counters: PoolCounters,
}

impl ShmPool {
    /// An empty pool.
    pub fn new(config: PoolConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The size class a lease of `bytes` gets.
    pub fn class_of(&self, bytes: u64) -> Option<u64> {
        bytes
            .max(self.inner.config.min_region_bytes)
            .max(1)
            .checked_next_power_of_two()
    }

    /// Leases a region of at least `min_bytes`, reusing an idle one of the
    /// same size class when there is one.
    pub fn lease(&self, min_bytes: u64) -> Result<ShmLease, ShmError> {
        let limit = self.inner.config.max_total_bytes;
        let mut state = self.state();
        let Some(size) = self.class_of(min_bytes).filter(|&s| s <= limit) else {
            state.counters.exhausted += 1;
            return Err(ShmError::PoolExhausted {
                requested: min_bytes,
                in_use: state.counters.total_bytes,
                limit,
            });
        };
        if let Some(region) = state.idle.get_mut(&size).and_then(Vec::pop) {
            state.counters.reused += 1;
            state.counters.leased += 1;
            return Ok(self.lease_of(region));
        }
        // Retire idle regions of other sizes, largest first, until it fits.
        while state.counters.total_bytes + size > limit {
            let Some(victim) = state.idle.values_mut().rev().find_map(Vec::pop) else {
                state.counters.exhausted += 1;
                return Err(ShmError::PoolExhausted {
                    requested: size,
                    in_use: state.counters.total_bytes,
                    limit,
                });
            };
            state.retire(&victim);
        }
        // Reserve the bytes, then create without holding the lock.
        state.counters.total_bytes += size;
        drop(state);
        match self.create(size) {
            Ok(region) => {
                let region = Arc::new(region);
                let mut state = self.state();
                state.all.push(Arc::clone(&region));
                state.counters.created += 1;
                state.counters.leased += 1;
                Ok(self.lease_of(region))
            }
            Err(e) => {
                self.state().counters.total_bytes -= size;
                Err(e)
            }
        }
    }

    fn create(&self, size: u64) -> Result<PooledRegion, ShmError> {
        let pid = std::process::id();
        let mut attempts = 0;
        loop {
            let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
            let name = format!("infermesh-{pid}-{seq}");
            match ShmRegion::create_in(&self.inner.config.dir, &name, size) {
                Ok(region) => {
                    return Ok(PooledRegion {
                        name,
                        region,
                        registered: Mutex::new(HashSet::new()),
                    });
                }
                // Left behind by a crashed process that had our pid.
                Err(ShmError::Create { source, .. })
                    if source.kind() == io::ErrorKind::AlreadyExists && attempts < 8 =>
                {
                    attempts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn lease_of(&self, region: Arc<PooledRegion>) -> ShmLease {
        ShmLease::new(region, self.clone())
    }

    /// Whether `self` and `other` are the same pool.
    pub fn same_pool(&self, other: &ShmPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn give_back(&self, region: Arc<PooledRegion>) {
        let mut state = self.state();
        state.counters.leased -= 1;
        state
            .idle
            .entry(region.region.len())
            .or_default()
            .push(region);
    }

    /// Counters now.
    pub fn counters(&self) -> PoolCounters {
        self.state().counters
    }

    /// Forgets every registration with `peer` (it restarted, or a request
    /// on shared memory failed): the next lease registers again.
    pub fn forget_peer(&self, peer: &str) {
        for region in &self.state().all {
            region.forget(peer);
        }
    }

    /// Regions retired since the last call, with the peers they were
    /// registered with.
    pub fn take_retired(&self) -> Vec<RetiredRegion> {
        std::mem::take(&mut self.state().retired)
    }
}

impl State {
    fn retire(&mut self, victim: &Arc<PooledRegion>) {
        self.all.retain(|r| !Arc::ptr_eq(r, victim));
        self.counters.total_bytes -= victim.region.len();
        self.counters.retired += 1;
        let peers: Vec<String> = victim.peers().iter().cloned().collect();
        if !peers.is_empty() {
            self.retired.push(RetiredRegion {
                name: victim.name.clone(),
                peers,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_dir::TestDir;

    fn pool(dir: &TestDir, max: u64) -> ShmPool {
        ShmPool::new(PoolConfig {
            dir: dir.shm().clone(),
            max_total_bytes: max,
            min_region_bytes: MIN_REGION_BYTES,
        })
    }

    #[test]
    fn sizes_round_up_to_powers_of_two_of_at_least_64k() {
        let dir = TestDir::new("pool-sizes");
        let p = pool(&dir, 1 << 30);
        assert_eq!(p.class_of(0), Some(64 * 1024));
        assert_eq!(p.class_of(64 * 1024 + 1), Some(128 * 1024));
        assert_eq!(p.class_of(1 << 20), Some(1 << 20));
        assert_eq!(p.class_of(u64::MAX), None);
        let lease = p.lease(100_000).unwrap();
        assert_eq!(lease.region().len(), 128 * 1024);
        assert!(
            lease
                .name()
                .starts_with(&format!("infermesh-{}-", std::process::id()))
        );
    }

    #[test]
    fn a_returned_region_is_reused() {
        let dir = TestDir::new("pool-reuse");
        let p = pool(&dir, 1 << 30);
        let first = p.lease(1000).unwrap();
        let name = first.name().to_string();
        first.mark_registered("peer-a");
        drop(first);
        let second = p.lease(2000).unwrap();
        assert_eq!(second.name(), name);
        assert!(second.is_registered_with("peer-a"));
        let third = p.lease(2000).unwrap();
        assert_ne!(third.name(), name, "a leased region is not shared");
        let c = p.counters();
        assert_eq!((c.created, c.reused, c.leased), (2, 1, 2));
        assert_eq!(c.total_bytes, 2 * 64 * 1024);
        p.forget_peer("peer-a");
        assert!(!second.is_registered_with("peer-a"));
    }

    #[test]
    fn the_budget_retires_idle_regions_then_refuses() {
        let dir = TestDir::new("pool-budget");
        let p = pool(&dir, 256 * 1024);
        let small = p.lease(1).unwrap();
        small.mark_registered("peer-a");
        let small_name = small.name().to_string();
        drop(small);
        let big = p.lease(200 * 1024).unwrap();
        assert_eq!(big.region().len(), 256 * 1024);
        assert_eq!(
            p.take_retired(),
            vec![RetiredRegion {
                name: small_name,
                peers: vec!["peer-a".into()],
            }]
        );
        let err = p.lease(1).unwrap_err();
        assert!(matches!(err, ShmError::PoolExhausted { .. }), "{err}");
        assert_eq!(err.to_status().code(), tonic::Code::ResourceExhausted);
        assert!(p.lease(1 << 20).is_err(), "larger than the whole budget");
        drop(big);
        assert!(p.lease(1).is_ok());
        assert_eq!(p.counters().exhausted, 2);
    }
}
