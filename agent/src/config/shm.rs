//! `[shm]`: how much of the agent's shared-memory table clients may take.
//!
//! Each region a client registers holds one open file descriptor in the
//! agent (the client's object is opened, never mapped: see
//! `infermesh_transport::shm`), so the table is bounded per connection and
//! in all. Past either limit a registration is refused with
//! `RESOURCE_EXHAUSTED` naming the limit; the client can still send tensors
//! inline. The defaults are here, once; `configs/agent.toml` names them.

use infermesh_transport::shm::{DEFAULT_MAX_REGIONS, DEFAULT_MAX_REGIONS_PER_OWNER};
use serde::Deserialize;

use super::limits::FD_HEADROOM;

/// Descriptors of [`FD_HEADROOM`] that shared-memory regions may never
/// take: worker processes, their pipes and restarts, the admin port and
/// ZooKeeper need them.
pub const FD_RESERVED_FROM_REGIONS: usize = 256;

/// Longest prefix the agent adds to a client's region name when it
/// registers the region with a worker: `c`, a `u64`, `.`.
pub const WORKER_NAME_PREFIX_BYTES: usize = 22;

/// `[shm]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShm {
    /// Regions one client connection may hold at once.
    pub max_regions_per_connection: Option<usize>,
    /// Regions all connections together may hold at once.
    pub max_regions: Option<usize>,
}

/// Checked `[shm]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmLimits {
    /// Regions per client connection.
    pub max_regions_per_connection: usize,
    /// Regions in all.
    pub max_regions: usize,
}

impl Default for ShmLimits {
    fn default() -> Self {
        Self {
            max_regions_per_connection: DEFAULT_MAX_REGIONS_PER_OWNER,
            max_regions: DEFAULT_MAX_REGIONS,
        }
    }
}

impl ShmLimits {
    /// Checks `raw`, adding what is wrong to `problems`.
    pub fn from_raw(raw: &RawShm, problems: &mut Vec<String>) -> Self {
        let d = Self::default();
        let limits = Self {
            max_regions_per_connection: raw
                .max_regions_per_connection
                .unwrap_or(d.max_regions_per_connection),
            max_regions: raw.max_regions.unwrap_or(d.max_regions),
        };
        if limits.max_regions_per_connection == 0 || limits.max_regions == 0 {
            problems
                .push("shm: max_regions_per_connection and max_regions must be at least 1".into());
        }
        let most = FD_HEADROOM - FD_RESERVED_FROM_REGIONS;
        if limits.max_regions > most {
            problems.push(format!(
                "shm.max_regions: {} is above {most}: each region holds a file descriptor out of the {FD_HEADROOM} the agent keeps free of connections",
                limits.max_regions
            ));
        }
        limits
    }

    /// The transport registry's configuration for these limits. Client
    /// region names are kept [`WORKER_NAME_PREFIX_BYTES`] shorter than a
    /// worker accepts, so the agent's private name for a region
    /// (`c<connection>.<name>`, see `crate::transports::shm`) always fits a worker's.
    pub fn registry_config(&self) -> infermesh_transport::shm::RegistryConfig {
        infermesh_transport::shm::RegistryConfig {
            max_regions_per_owner: self.max_regions_per_connection,
            max_regions: self.max_regions,
            max_name_bytes: infermesh_transport::shm::MAX_REGION_NAME_BYTES
                - WORKER_NAME_PREFIX_BYTES,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let mut problems = Vec::new();
        assert_eq!(
            ShmLimits::from_raw(&RawShm::default(), &mut problems),
            ShmLimits::default()
        );
        assert!(problems.is_empty());
        let raw = RawShm {
            max_regions_per_connection: Some(0),
            max_regions: Some(100_000),
        };
        ShmLimits::from_raw(&raw, &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
