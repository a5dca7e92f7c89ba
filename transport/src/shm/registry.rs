//! [`ShmRegistry`]: the server side of Triton's system shared-memory
//! extension — the regions clients registered, per client connection.
//!
//! # Owners and trust
//!
//! Every region belongs to an *owner*, a `u64` the server derives from the
//! client connection (the agent numbers its connections; the test worker
//! hashes the peer address). An owner sees only its own regions: a request
//! from one connection can neither read, write, list nor unregister a
//! region another connection registered, even under the same name, and all
//! of an owner's regions go away with [`ShmRegistry::drop_owner`] when its
//! connection closes. Region names are therefore per connection, unlike
//! Triton's one server-wide namespace; a client that registers on one
//! connection must infer on the same one.
//!
//! What an owner cannot be kept from is naming any object in the shm
//! directory by key: the server opens it with its own permissions. Keys are
//! confined to that directory (see [`ShmKey`](super::ShmKey)), but a local
//! client able to reach the server can read or write any shm object the
//! server's user can open — the same trust Triton places in clients allowed
//! to use shared memory. Serve shared memory only to local, trusted callers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use infermesh_proto::inference::system_shared_memory_status_response::RegionStatus as ProtoRegionStatus;
use infermesh_proto::inference::{
    SystemSharedMemoryRegisterRequest, SystemSharedMemoryStatusRequest,
    SystemSharedMemoryStatusResponse, SystemSharedMemoryUnregisterRequest,
};

use super::key::ShmDir;
use super::region::ShmRegion;
use crate::error::ShmError;

/// Identifies the client connection that registered a region.
pub type Owner = u64;

/// Regions one owner (client connection) may hold at once, by default.
pub const DEFAULT_MAX_REGIONS_PER_OWNER: usize = 64;
/// Regions all owners together may hold at once, by default. Each holds one
/// open file descriptor, so this bounds what clients can take of the
/// server's descriptors (the agent keeps 1024 free of connections for this,
/// its workers and their restarts).
pub const DEFAULT_MAX_REGIONS: usize = 512;

/// Longest region name accepted by default, in bytes: names are kept for
/// the region's life, so they are bounded like everything else a client
/// sends. (The agent accepts a little less from clients, leaving room for
/// the prefix it adds when it registers a region with a worker.)
pub const MAX_REGION_NAME_BYTES: usize = 256;

/// Where a [`ShmRegistry`] opens keys and how many regions it allows.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Directory keys are resolved in (`/dev/shm`).
    pub dir: ShmDir,
    /// Regions one owner may hold at once.
    pub max_regions_per_owner: usize,
    /// Regions all owners together may hold at once.
    pub max_regions: usize,
    /// Longest region name accepted, in bytes.
    pub max_name_bytes: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            dir: ShmDir::system(),
            max_regions_per_owner: DEFAULT_MAX_REGIONS_PER_OWNER,
            max_regions: DEFAULT_MAX_REGIONS,
            max_name_bytes: MAX_REGION_NAME_BYTES,
        }
    }
}

/// A registered region, as `SystemSharedMemoryStatus` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// The name requests use.
    pub name: String,
    /// The key as registered.
    pub key: String,
    /// Start of the window in the object.
    pub offset: u64,
    /// Bytes in the window.
    pub byte_size: u64,
}

struct Registered {
    status: RegionStatus,
    region: Arc<ShmRegion>,
}

/// Every owner's regions, and how many there are in all.
#[derive(Default)]
struct Owners {
    by_owner: HashMap<Owner, BTreeMap<String, Registered>>,
    total: usize,
}

impl Owners {
    fn get(&self, owner: &Owner) -> Option<&BTreeMap<String, Registered>> {
        self.by_owner.get(owner)
    }

    /// Removes `name` of `owner`, or all its regions with `None`.
    fn remove(&mut self, owner: Owner, name: Option<&str>) {
        let Some(regions) = self.by_owner.get_mut(&owner) else {
            return;
        };
        let before = regions.len();
        match name {
            None => regions.clear(),
            Some(name) => {
                regions.remove(name);
            }
        }
        self.total -= before - regions.len();
        if regions.is_empty() {
            self.by_owner.remove(&owner);
        }
    }
}

/// The regions clients registered, keyed by (owner, name). Thread-safe;
/// clones share the same registry.
#[derive(Clone, Default)]
pub struct ShmRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    config: RegistryConfig,
    owners: RwLock<Owners>,
}

impl ShmRegistry {
    /// An empty registry.
    pub fn new(config: RegistryConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                owners: RwLock::new(Owners::default()),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Owners> {
        self.inner
            .owners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Owners> {
        self.inner
            .owners
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `byte_size` bytes of the object `key` from `offset` as
    /// `name` for `owner`: validates the key and opens the object (one file
    /// descriptor per region, within the limits; never mapped). Refused with
    /// `RESOURCE_EXHAUSTED` when the owner or the registry is at its limit.
    pub fn register(
        &self,
        owner: Owner,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), ShmError> {
        if name.is_empty() {
            return Err(ShmError::EmptyName);
        }
        let limit = self.inner.config.max_name_bytes;
        if name.len() > limit {
            return Err(ShmError::NameTooLong {
                name: name.to_string(),
                limit,
            });
        }
        self.check_room(&self.read(), owner, name)?;
        // Open outside the lock: it is a few system calls.
        let region = ShmRegion::open_in(&self.inner.config.dir, key, offset, byte_size)?;
        let mut owners = self.write();
        self.check_room(&owners, owner, name)?;
        owners.total += 1;
        owners.by_owner.entry(owner).or_default().insert(
            name.to_string(),
            Registered {
                status: RegionStatus {
                    name: name.to_string(),
                    key: key.to_string(),
                    offset,
                    byte_size,
                },
                region: Arc::new(region),
            },
        );
        Ok(())
    }

    fn check_room(&self, owners: &Owners, owner: Owner, name: &str) -> Result<(), ShmError> {
        let regions = owners.get(&owner);
        if regions.is_some_and(|r| r.contains_key(name)) {
            return Err(ShmError::AlreadyExists(name.to_string()));
        }
        let limit = self.inner.config.max_regions_per_owner;
        if regions.map_or(0, BTreeMap::len) >= limit {
            return Err(ShmError::TooManyRegions { limit });
        }
        let limit = self.inner.config.max_regions;
        if owners.total >= limit {
            return Err(ShmError::TooManyRegionsInAll { limit });
        }
        Ok(())
    }

    /// The owner's regions by name; `None` lists all. An unknown name is
    /// `NotFound`.
    pub fn status(&self, owner: Owner, name: Option<&str>) -> Result<Vec<RegionStatus>, ShmError> {
        let owners = self.read();
        let regions = owners.get(&owner);
        match name {
            None => Ok(regions
                .map(|r| r.values().map(|e| e.status.clone()).collect())
                .unwrap_or_default()),
            Some(name) => regions
                .and_then(|r| r.get(name))
                .map(|e| vec![e.status.clone()])
                .ok_or_else(|| ShmError::NotFound(name.to_string())),
        }
    }

    /// Unregisters the owner's region `name`, or all its regions with
    /// `None`. Like Triton, unregistering a name that is not registered
    /// succeeds (clients call it in cleanup paths). Requests in flight keep
    /// the mapping until they finish.
    pub fn unregister(&self, owner: Owner, name: Option<&str>) -> Result<(), ShmError> {
        self.write().remove(owner, name);
        Ok(())
    }

    /// Forgets everything `owner` registered: its connection closed.
    pub fn drop_owner(&self, owner: Owner) {
        self.write().remove(owner, None);
    }

    /// Regions registered, all owners together (for metrics).
    pub fn region_count(&self) -> usize {
        self.read().total
    }

    /// The owner's region `region`, which `tensor` refers to.
    pub(crate) fn lookup(
        &self,
        owner: Owner,
        tensor: &str,
        region: &str,
    ) -> Result<Arc<ShmRegion>, ShmError> {
        self.read()
            .get(&owner)
            .and_then(|r| r.get(region))
            .map(|e| Arc::clone(&e.region))
            .ok_or_else(|| ShmError::UnknownRegion {
                tensor: tensor.to_string(),
                region: region.to_string(),
            })
    }

    /// `SystemSharedMemoryRegister`.
    pub fn handle_register(
        &self,
        owner: Owner,
        req: &SystemSharedMemoryRegisterRequest,
    ) -> Result<(), ShmError> {
        self.register(owner, &req.name, &req.key, req.offset, req.byte_size)
    }

    /// `SystemSharedMemoryStatus`: an empty name lists all the owner's
    /// regions.
    pub fn handle_status(
        &self,
        owner: Owner,
        req: &SystemSharedMemoryStatusRequest,
    ) -> Result<SystemSharedMemoryStatusResponse, ShmError> {
        let name = (!req.name.is_empty()).then_some(req.name.as_str());
        let regions = self
            .status(owner, name)?
            .into_iter()
            .map(|s| {
                (
                    s.name.clone(),
                    ProtoRegionStatus {
                        name: s.name,
                        key: s.key,
                        offset: s.offset,
                        byte_size: s.byte_size,
                    },
                )
            })
            .collect();
        Ok(SystemSharedMemoryStatusResponse { regions })
    }

    /// `SystemSharedMemoryUnregister`: an empty name unregisters all the
    /// owner's regions.
    pub fn handle_unregister(
        &self,
        owner: Owner,
        req: &SystemSharedMemoryUnregisterRequest,
    ) -> Result<(), ShmError> {
        let name = (!req.name.is_empty()).then_some(req.name.as_str());
        self.unregister(owner, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_dir::TestDir;

    fn registry(dir: &TestDir, max: usize) -> ShmRegistry {
        ShmRegistry::new(RegistryConfig {
            dir: dir.shm().clone(),
            max_regions_per_owner: max,
            max_regions: 100,
            ..RegistryConfig::default()
        })
    }

    #[test]
    fn the_global_limit_holds_across_owners_and_frees_on_unregister() {
        let dir = TestDir::new("registry-global");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = ShmRegistry::new(RegistryConfig {
            dir: dir.shm().clone(),
            max_regions_per_owner: 2,
            max_regions: 3,
            ..RegistryConfig::default()
        });
        reg.register(1, "a", "/obj", 0, 64).unwrap();
        reg.register(1, "b", "/obj", 0, 64).unwrap();
        reg.register(2, "a", "/obj", 0, 64).unwrap();
        let err = reg.register(3, "a", "/obj", 0, 64).unwrap_err();
        assert!(
            matches!(err, ShmError::TooManyRegionsInAll { limit: 3 }),
            "{err}"
        );
        assert_eq!(err.to_status().code(), tonic::Code::ResourceExhausted);
        assert!(err.to_string().contains("max_regions"), "{err}");
        let err = reg.register(1, "c", "/obj", 0, 64).unwrap_err();
        assert!(
            matches!(err, ShmError::TooManyRegions { limit: 2 }),
            "{err}"
        );
        assert!(
            err.to_string().contains("max_regions_per_connection"),
            "{err}"
        );
        reg.unregister(1, Some("a")).unwrap();
        reg.register(3, "a", "/obj", 0, 64).unwrap();
        reg.drop_owner(1);
        reg.drop_owner(3);
        assert_eq!(reg.region_count(), 1);
        reg.register(4, "a", "/obj", 0, 64).unwrap();
        reg.register(4, "b", "/obj", 0, 64).unwrap();
        assert_eq!(reg.region_count(), 3);
    }

    #[test]
    fn register_status_unregister() {
        let dir = TestDir::new("registry-basic");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = registry(&dir, 8);
        reg.register(1, "in", "/obj", 0, 1024).unwrap();
        reg.register(1, "out", "/obj", 1024, 3072).unwrap();
        let all = reg.status(1, None).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(
            reg.status(1, Some("out")).unwrap(),
            vec![RegionStatus {
                name: "out".into(),
                key: "/obj".into(),
                offset: 1024,
                byte_size: 3072,
            }]
        );
        let err = reg.status(1, Some("nope")).unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::NotFound);
        reg.unregister(1, Some("in")).unwrap();
        reg.unregister(1, Some("in")).unwrap();
        assert_eq!(reg.status(1, None).unwrap().len(), 1);
        reg.unregister(1, None).unwrap();
        assert!(reg.status(1, None).unwrap().is_empty());
        assert_eq!(reg.region_count(), 0);
    }

    #[test]
    fn duplicate_name_is_already_exists_and_changes_nothing() {
        let dir = TestDir::new("registry-dup");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = registry(&dir, 8);
        reg.register(1, "r", "/obj", 0, 64).unwrap();
        let err = reg.register(1, "r", "/obj", 64, 64).unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::AlreadyExists);
        assert_eq!(reg.status(1, Some("r")).unwrap()[0].offset, 0);
    }

    #[test]
    fn owners_are_isolated() {
        let dir = TestDir::new("registry-owners");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = registry(&dir, 8);
        reg.register(1, "r", "/obj", 0, 64).unwrap();
        assert!(reg.status(2, None).unwrap().is_empty());
        assert!(reg.status(2, Some("r")).is_err());
        assert!(reg.lookup(2, "t", "r").is_err());
        // Owner 2 unregistering "r" or everything leaves owner 1's region.
        reg.unregister(2, Some("r")).unwrap();
        reg.unregister(2, None).unwrap();
        assert!(reg.lookup(1, "t", "r").is_ok());
        // The same name is free for another owner.
        reg.register(2, "r", "/obj", 128, 64).unwrap();
        assert_eq!(reg.status(1, Some("r")).unwrap()[0].offset, 0);
        assert_eq!(reg.status(2, Some("r")).unwrap()[0].offset, 128);
        reg.drop_owner(1);
        assert!(reg.lookup(1, "t", "r").is_err());
        assert!(reg.lookup(2, "t", "r").is_ok());
    }

    #[test]
    fn limits_and_bad_input_leave_the_registry_unchanged() {
        let dir = TestDir::new("registry-limits");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = registry(&dir, 2);
        reg.register(1, "a", "/obj", 0, 64).unwrap();
        reg.register(1, "b", "obj", 0, 64).unwrap();
        let err = reg.register(1, "c", "/obj", 0, 64).unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::ResourceExhausted);
        reg.register(2, "c", "/obj", 0, 64).unwrap();
        let long = "n".repeat(MAX_REGION_NAME_BYTES + 1);
        for (name, key, offset, size) in [
            ("", "/obj", 0, 64),
            (long.as_str(), "/obj", 0, 64),
            ("x", "../etc/passwd", 0, 64),
            ("x", "/a/b", 0, 64),
            ("x", "/missing", 0, 64),
            ("x", "/obj", u64::MAX, 1),
            ("x", "/obj", 1, u64::MAX),
            ("x", "/obj", 4000, 97),
            ("x", "/obj", 0, 0),
        ] {
            let err = reg.register(3, name, key, offset, size).unwrap_err();
            assert_eq!(
                err.to_status().code(),
                tonic::Code::InvalidArgument,
                "{name} {key} {offset} {size}: {err}"
            );
        }
        assert!(reg.status(3, None).unwrap().is_empty());
        assert_eq!(reg.region_count(), 3);
    }

    #[test]
    fn proto_adapters_treat_empty_names_as_all() {
        let dir = TestDir::new("registry-proto");
        let _obj = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let reg = registry(&dir, 8);
        let req = |name: &str, offset| SystemSharedMemoryRegisterRequest {
            name: name.into(),
            key: "/obj".into(),
            offset,
            byte_size: 64,
        };
        reg.handle_register(7, &req("a", 0)).unwrap();
        reg.handle_register(7, &req("b", 64)).unwrap();
        let all = reg
            .handle_status(7, &SystemSharedMemoryStatusRequest::default())
            .unwrap();
        assert_eq!(all.regions.len(), 2);
        assert_eq!(all.regions["b"].offset, 64);
        reg.handle_unregister(7, &SystemSharedMemoryUnregisterRequest::default())
            .unwrap();
        assert_eq!(reg.region_count(), 0);
    }
}
