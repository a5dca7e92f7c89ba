//! Same-host tensors in POSIX shared memory, following Triton's system
//! shared-memory extension so third-party OIP clients (tritonclient) and our
//! own client use one convention.
//!
//! - Server side: [`ShmRegistry`] holds the regions each client connection
//!   registered and resolves tensor references in `ModelInfer`
//!   ([`ShmRegistry::take_inputs`], [`ShmRegistry::place_outputs`]).
//! - Client side: [`ShmPool`] keeps regions warm and [`ShmTransport`] stages
//!   requests into them; a caller may also lease a region and build its
//!   inputs in place ([`ShmLease`], laid out by [`Layout`]), and outputs
//!   come back as views of the region ([`SharedLease::view`]), not copies.
//! - Both sit on [`ShmRegion`], a bounds-checked window of a key validated
//!   by [`ShmKey`]: mapped when we created it, copied with `pread`/`pwrite`
//!   when a client did (so a client truncating its file cannot fault us);
//!   a server's copy from one client region to another is a `pread` into
//!   the destination's mapping, which only the kernel writes.

mod exchange;
mod foreign_mapping;
mod key;
mod layout;
mod lease;
mod mapping;
mod params;
mod pool;
mod region;
mod registry;
mod transport;

pub use key::{MAX_KEY_NAME_BYTES, ShmDir, ShmKey};
pub use layout::{Layout, TENSOR_ALIGN, Window};
pub use lease::{Element, SharedLease, ShmLease, elements, elements_mut};
pub use params::{BYTE_SIZE_PARAM, OFFSET_PARAM, REGION_PARAM, ShmRef};
pub use pool::{
    DEFAULT_MAX_TOTAL_BYTES, MIN_REGION_BYTES, PoolConfig, PoolCounters, PooledRegion,
    RetiredRegion, ShmPool,
};
pub use region::ShmRegion;
pub use registry::{
    DEFAULT_MAX_REGIONS, DEFAULT_MAX_REGIONS_PER_OWNER, MAX_REGION_NAME_BYTES, Owner, RegionStatus,
    RegistryConfig, ShmRegistry,
};
pub use transport::{MIN_OUTPUT_WINDOW, ShmTransport};

#[cfg(test)]
pub(crate) mod test_dir {
    //! A scratch directory standing in for `/dev/shm`, removed on drop.

    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::ShmDir;

    pub(crate) struct TestDir {
        root: PathBuf,
        shm: ShmDir,
    }

    impl TestDir {
        pub(crate) fn new(name: &str) -> Self {
            static SEQ: AtomicU64 = AtomicU64::new(0);
            let root = std::env::temp_dir().join(format!(
                "infermesh-transport-{}-{}-{name}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let shm = root.join("shm");
            std::fs::create_dir_all(&shm).expect("create test shm dir");
            Self {
                root,
                shm: ShmDir::new(shm),
            }
        }

        pub(crate) fn shm(&self) -> &ShmDir {
            &self.shm
        }

        /// A file outside the shm directory.
        pub(crate) fn outside_file(&self, name: &str, contents: &[u8]) -> PathBuf {
            let path = self.root.join(name);
            std::fs::write(&path, contents).expect("write outside file");
            path
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
