//! The memory-registration cache: registered buffers are pooled and reused
//! across requests, because registering memory pins pages and programs the
//! NIC's translation tables (milliseconds for large buffers).
//!
//! Buffers come in power-of-two size classes (at least [`MIN_CLASS`] bytes)
//! per [`Access`]. [`MrCache::take`] hands out the most recently returned
//! idle buffer of the class (a hit); otherwise [`MrCache::register`]
//! allocates and registers a new one (a miss). The total registered bytes
//! (idle plus handed out) are bounded: a miss first evicts idle buffers,
//! least recently used first, deregistering each; if the handed-out buffers
//! alone leave no room the miss fails with
//! [`RdmaError::RegistrationBudget`], which sends the request down the
//! transport ladder instead of pinning unbounded memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::memory::{Access, RegionMemory, RegionMut, RegionRef};
use crate::verbs::{MemoryRegistration, VerbsDevice};
use crate::{RdmaError, RemoteBuffer};

/// The smallest size class.
pub const MIN_CLASS: usize = 4096;

/// Counters of an [`MrCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrStats {
    /// Buffers handed out from the idle pool.
    pub hits: u64,
    /// Buffers that had to be registered.
    pub misses: u64,
    /// Idle buffers deregistered to make room.
    pub evictions: u64,
    /// Bytes registered now (idle and handed out).
    pub registered_bytes: usize,
    /// Bytes of idle buffers.
    pub idle_bytes: usize,
    /// Registrations alive now.
    pub regions: usize,
}

/// A registered region: memory plus its registration.
struct Region {
    // Declared before `mem`: the registration is undone before the memory
    // can be freed.
    reg: Box<dyn MemoryRegistration>,
    mem: Arc<RegionMemory>,
    access: Access,
}

type ClassKey = (Access, usize);

#[derive(Default)]
struct CacheState {
    /// Idle regions per class, oldest first; each with its LRU tick.
    idle: HashMap<ClassKey, Vec<(u64, Region)>>,
    /// Idle regions in LRU order: tick → class.
    lru: BTreeMap<u64, ClassKey>,
    tick: u64,
    stats: MrStats,
}

/// The pool of registered buffers (see the module docs).
pub struct MrCache {
    device: Arc<dyn VerbsDevice>,
    capacity: usize,
    state: Mutex<CacheState>,
}

impl MrCache {
    /// A cache registering with `device`, bounded by `capacity` bytes.
    pub fn new(device: Arc<dyn VerbsDevice>, capacity: usize) -> Arc<Self> {
        Arc::new(MrCache {
            device,
            capacity,
            state: Mutex::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> MrStats {
        self.lock().stats
    }

    /// An idle buffer of the class of `len` and `access`, if one is cached.
    pub fn take(self: &Arc<Self>, len: usize, access: Access) -> Option<Registered> {
        let class = size_class(len).ok()?;
        let mut state = self.lock();
        let (tick, region) = state.idle.get_mut(&(access, class))?.pop()?;
        state.lru.remove(&tick);
        state.stats.hits += 1;
        state.stats.idle_bytes -= class;
        drop(state);
        Some(Registered {
            region: Some(region),
            class,
            len,
            cache: Arc::clone(self),
        })
    }

    /// Registers a new buffer (a miss), evicting idle buffers as needed.
    /// Blocks while the device registers the memory.
    pub fn register(self: &Arc<Self>, len: usize, access: Access) -> Result<Registered, RdmaError> {
        let class = size_class(len)?;
        let evicted = self.reserve(class)?;
        // Deregistration and registration are slow; run them unlocked.
        drop(evicted);
        let mem = Arc::new(RegionMemory::new(class));
        match self.device.register(Arc::clone(&mem), access) {
            Ok(reg) => Ok(Registered {
                region: Some(Region { reg, mem, access }),
                class,
                len,
                cache: Arc::clone(self),
            }),
            Err(e) => {
                self.release(class);
                Err(e)
            }
        }
    }

    /// Deregisters every idle buffer.
    pub fn clear(&self) {
        let mut state = self.lock();
        let idle = std::mem::take(&mut state.idle);
        state.lru.clear();
        let mut freed = 0;
        let mut count = 0;
        for regions in idle.values() {
            for (_, region) in regions {
                freed += region.mem.len();
                count += 1;
            }
        }
        state.stats.evictions += count;
        state.stats.registered_bytes -= freed;
        state.stats.idle_bytes -= freed;
        state.stats.regions -= count as usize;
        drop(state);
        drop(idle);
    }

    /// Books `class` bytes for a new registration, evicting LRU idle
    /// regions; returns the evicted regions for the caller to drop unlocked.
    fn reserve(&self, class: usize) -> Result<Vec<Region>, RdmaError> {
        let mut state = self.lock();
        let mut evicted = Vec::new();
        let in_use = state.stats.registered_bytes - state.stats.idle_bytes;
        if in_use + class > self.capacity {
            // Evicting idle buffers would not make room.
            return Err(RdmaError::RegistrationBudget {
                requested: class,
                in_use,
                capacity: self.capacity,
            });
        }
        while state.stats.registered_bytes + class > self.capacity {
            let (_, key) = state
                .lru
                .pop_first()
                .expect("idle bytes cover the shortfall");
            let regions = state
                .idle
                .get_mut(&key)
                .expect("lru entries have idle regions");
            let (_, region) = regions.remove(0);
            state.stats.evictions += 1;
            state.stats.registered_bytes -= key.1;
            state.stats.idle_bytes -= key.1;
            state.stats.regions -= 1;
            evicted.push(region);
        }
        state.stats.misses += 1;
        state.stats.registered_bytes += class;
        state.stats.regions += 1;
        Ok(evicted)
    }

    /// Undoes the booking of a registration that is gone.
    fn release(&self, class: usize) {
        let mut state = self.lock();
        state.stats.registered_bytes -= class;
        state.stats.regions -= 1;
    }

    fn give_back(&self, region: Region, class: usize) {
        let mut state = self.lock();
        state.tick += 1;
        let tick = state.tick;
        let key = (region.access, class);
        state.lru.insert(tick, key);
        state.idle.entry(key).or_default().push((tick, region));
        state.stats.idle_bytes += class;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn size_class(len: usize) -> Result<usize, RdmaError> {
    len.max(MIN_CLASS)
        .checked_next_power_of_two()
        .ok_or(RdmaError::TooLarge {
            len: len as u64,
            max: 1 << (usize::BITS - 1),
        })
}

/// A registered buffer from the [`MrCache`], owned by one user at a time.
///
/// Its first [`len`](Self::len) bytes are the buffer (the registration may
/// be larger: the size class). The contents are whatever the previous user
/// left unless the buffer was freshly registered (zeroed). Dropping it
/// returns it to the pool, still registered: a peer that holds its
/// [`remote`](Self::remote) descriptor keeps access until the registration
/// is evicted. Use [`deregister`](Self::deregister) to revoke access at
/// once.
pub struct Registered {
    region: Option<Region>,
    class: usize,
    len: usize,
    cache: Arc<MrCache>,
}

impl Registered {
    /// Length of the buffer in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The remote access granted.
    pub fn access(&self) -> Access {
        self.region().access
    }

    /// The descriptor a peer needs to access `[addr, addr + len)`.
    pub fn remote(&self) -> RemoteBuffer {
        let region = self.region();
        RemoteBuffer::new(region.mem.addr(), self.len as u64, region.reg.rkey())
            .expect("an allocation does not wrap the address space")
    }

    /// Reads the buffer. Do not hold this while a peer may write it.
    pub fn as_slice(&self) -> RegionRef<'_> {
        self.region().mem.read(self.len)
    }

    /// Writes the buffer (e.g. fills an input before sending its descriptor).
    pub fn as_mut_slice(&mut self) -> RegionMut<'_> {
        self.region().mem.write(self.len)
    }

    /// Deregisters now instead of returning to the pool: the rkey stops
    /// working immediately. Blocks briefly on hardware.
    pub fn deregister(mut self) {
        if let Some(region) = self.region.take() {
            drop(region);
            self.cache.release(self.class);
        }
    }

    pub(crate) fn memory(&self) -> &Arc<RegionMemory> {
        &self.region().mem
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.region().reg.lkey()
    }

    fn region(&self) -> &Region {
        self.region.as_ref().expect("region is present until drop")
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.cache.give_back(region, self.class);
        }
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("remote", &self.remote())
            .field("access", &self.access())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::QueuePair;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A device whose registrations only count themselves.
    #[derive(Default)]
    struct CountingDevice {
        live: Arc<AtomicU32>,
        next: AtomicU32,
    }

    struct CountingReg(u32, Arc<AtomicU32>);

    impl MemoryRegistration for CountingReg {
        fn lkey(&self) -> u32 {
            self.0
        }
        fn rkey(&self) -> u32 {
            self.0
        }
    }

    impl Drop for CountingReg {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl VerbsDevice for CountingDevice {
        fn kind(&self) -> &'static str {
            "counting"
        }
        fn register(
            &self,
            _mem: Arc<RegionMemory>,
            _access: Access,
        ) -> Result<Box<dyn MemoryRegistration>, RdmaError> {
            self.live.fetch_add(1, Ordering::SeqCst);
            let key = self.next.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Box::new(CountingReg(key, Arc::clone(&self.live))))
        }
        fn create_qp(&self) -> Result<Box<dyn QueuePair>, RdmaError> {
            unreachable!()
        }
        fn max_transfer(&self) -> u64 {
            u64::MAX
        }
    }

    fn cache(capacity: usize) -> (Arc<MrCache>, Arc<AtomicU32>) {
        let device = CountingDevice::default();
        let live = Arc::clone(&device.live);
        (MrCache::new(Arc::new(device), capacity), live)
    }

    fn get(cache: &Arc<MrCache>, len: usize, access: Access) -> Result<Registered, RdmaError> {
        match cache.take(len, access) {
            Some(r) => Ok(r),
            None => cache.register(len, access),
        }
    }

    #[test]
    fn reuses_by_class_and_access() {
        let (cache, live) = cache(1 << 20);
        let a = get(&cache, 5000, Access::RemoteRead).unwrap();
        let key = a.remote().rkey();
        assert_eq!(a.len(), 5000);
        drop(a);
        // Same class (8 KiB), same access: hit, same registration.
        let b = get(&cache, 8192, Access::RemoteRead).unwrap();
        assert_eq!(b.remote().rkey(), key);
        // Other access: miss.
        let c = get(&cache, 5000, Access::RemoteWrite).unwrap();
        assert_ne!(c.remote().rkey(), key);
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.evictions), (1, 2, 0));
        assert_eq!(s.registered_bytes, 16384);
        assert_eq!(live.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn evicts_least_recently_used_and_deregisters() {
        let (cache, live) = cache(3 * MIN_CLASS);
        let a = get(&cache, 1, Access::Local).unwrap();
        let b = get(&cache, 1, Access::RemoteRead).unwrap();
        let c = get(&cache, 1, Access::RemoteWrite).unwrap();
        let (ka, kb) = (a.remote().rkey(), b.remote().rkey());
        drop(a); // oldest idle
        drop(b);
        drop(c);
        assert_eq!(live.load(Ordering::SeqCst), 3);
        // A new class needs room: `a` goes first.
        let d = get(&cache, 1, Access::RemoteReadWrite).unwrap();
        assert_eq!(live.load(Ordering::SeqCst), 3);
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.evictions), (0, 4, 1));
        // `b` is still cached, `a` is not.
        let b2 = get(&cache, 1, Access::RemoteRead).unwrap();
        assert_eq!(b2.remote().rkey(), kb);
        let a2 = get(&cache, 1, Access::Local).unwrap();
        assert_ne!(a2.remote().rkey(), ka);
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.evictions), (1, 5, 2));
        assert!(s.registered_bytes <= 3 * MIN_CLASS);
        drop((d, b2, a2));
        cache.clear();
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(cache.stats().registered_bytes, 0);
    }

    #[test]
    fn budget_exceeded_by_buffers_in_use() {
        let (cache, _) = cache(2 * MIN_CLASS);
        let _a = get(&cache, 1, Access::Local).unwrap();
        let _b = get(&cache, 1, Access::Local).unwrap();
        let err = get(&cache, 1, Access::Local).unwrap_err();
        assert!(matches!(err, RdmaError::RegistrationBudget { .. }), "{err}");
        assert_eq!(cache.stats().registered_bytes, 2 * MIN_CLASS);
    }

    #[test]
    fn deregister_revokes_and_frees_budget() {
        let (cache, live) = cache(MIN_CLASS);
        let a = get(&cache, 10, Access::RemoteRead).unwrap();
        a.deregister();
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(cache.stats().registered_bytes, 0);
        assert!(get(&cache, 10, Access::RemoteRead).is_ok());
    }

    #[test]
    fn size_classes() {
        assert_eq!(size_class(0).unwrap(), MIN_CLASS);
        assert_eq!(size_class(4097).unwrap(), 8192);
        assert_eq!(size_class(16 << 20).unwrap(), 16 << 20);
        assert!(size_class(usize::MAX).is_err());
    }
}
