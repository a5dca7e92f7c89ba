//! Discovery: which agents serve a service, as [`NodeRecord`]s.
//!
//! A [`Discovery`] publishes [`Membership`] snapshots on a `watch` channel;
//! the client feeds each one to its balancer. Two implementations:
//!
//! - [`StaticDiscovery`] (`static://host:port,...`): a fixed list, the
//!   embedded default for one machine and tests;
//! - [`ZkDiscovery`] (`zk://...`): watches the service's nodes in ZooKeeper
//!   with a persistent recursive watch and re-reads them on every change.
//!   When ZooKeeper is unreachable it keeps publishing the last membership
//!   it read (marked [`Source::Cached`]) and says so in the log; records that
//!   fail validation are skipped with a warning, never fatal.

mod static_list;
mod zookeeper;

use std::sync::Arc;

use infermesh_proto::registry::{NodeRecord, RegistryUrl};
use tokio::sync::watch;

pub use static_list::StaticDiscovery;
pub use zookeeper::ZkDiscovery;

/// Where a membership snapshot comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Nothing read yet.
    Empty,
    /// Read from the registry and kept up to date.
    Live,
    /// The registry is unreachable: the last membership read.
    Cached,
}

/// The nodes of a service at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Membership {
    /// Valid records, sorted by node id.
    pub nodes: Vec<NodeRecord>,
    /// Freshness.
    pub source: Source,
}

impl Membership {
    /// No nodes, nothing read.
    pub fn empty() -> Self {
        Membership {
            nodes: Vec::new(),
            source: Source::Empty,
        }
    }
}

/// A source of membership snapshots.
pub trait Discovery: Send + Sync {
    /// The current snapshot and every later one.
    fn subscribe(&self) -> watch::Receiver<Arc<Membership>>;
}

/// Opens the discovery named by `url` for `service`. ZooKeeper discovery
/// connects in the background; its first snapshot may come later.
pub fn open(url: &RegistryUrl, service: &str) -> Arc<dyn Discovery> {
    match url {
        RegistryUrl::Static(addrs) => Arc::new(StaticDiscovery::new(addrs)),
        RegistryUrl::ZooKeeper { hosts, chroot } => Arc::new(ZkDiscovery::start(
            hosts.join(","),
            chroot.clone(),
            service.to_string(),
        )),
    }
}
