//! Discovery: which agents serve a service, as [`NodeRecord`]s.
//!
//! A [`Discovery`] publishes [`Membership`] snapshots on a `watch` channel;
//! the client feeds each one to its balancer. Two implementations:
//!
//! - [`StaticDiscovery`] (`static://host:port,...`): a fixed list, the
//!   embedded default for one machine and tests;
//! - [`ZkDiscovery`] (`zk://...`): follows the service's nodes in ZooKeeper
//!   with a persistent recursive watch. It lists the service once per
//!   session and once after every reconnect (re-adding the watch: see
//!   [`zookeeper`](ZkDiscovery) for why), and otherwise reads only the node
//!   a change names. When ZooKeeper is unreachable it keeps publishing the
//!   last membership it read (marked [`Source::Cached`]), says so in the
//!   log and in [`Membership::unreachable`] (also before a first read); records that fail validation are skipped with a warning, never
//!   fatal, and at most [`MAX_NODES`] nodes per service are followed.

mod static_list;
mod zookeeper;

use std::sync::Arc;

use infermesh_proto::registry::{NodeRecord, RegistryUrl};
use tokio::sync::watch;

pub use static_list::StaticDiscovery;
pub use zookeeper::{MAX_NODES, ZkDiscovery};

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
    /// While the registry cannot be read: why (its last error), so that
    /// callers can say the registry is unreachable rather than that no
    /// node is registered. `None` once it is read.
    pub unreachable: Option<String>,
}

impl Membership {
    /// No nodes, nothing read.
    pub fn empty() -> Self {
        Membership {
            nodes: Vec::new(),
            source: Source::Empty,
            unreachable: None,
        }
    }
}

/// What a discovery has done so far (all zero for a static list).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiscoveryStats {
    /// ZooKeeper read requests: listings plus record reads.
    pub reads: u64,
    /// Of which listings of the service's nodes (one per session and per
    /// reconnect).
    pub lists: u64,
    /// Sessions opened.
    pub sessions: u64,
    /// Re-synchronisations after a reconnect within a session.
    pub resyncs: u64,
    /// Records skipped as invalid (malformed, newer schema, over a cap).
    pub skipped: u64,
}

/// A source of membership snapshots.
pub trait Discovery: Send + Sync {
    /// The current snapshot and every later one.
    fn subscribe(&self) -> watch::Receiver<Arc<Membership>>;

    /// Counters of the work done so far.
    fn stats(&self) -> DiscoveryStats {
        DiscoveryStats::default()
    }
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
