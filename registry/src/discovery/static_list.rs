//! `static://host:port,...`: a fixed list of agents.

use std::net::SocketAddr;
use std::sync::Arc;

use infermesh_proto::registry::{Capacity, Endpoints, NodeRecord, NodeState, SCHEMA};
use tokio::sync::watch;

use super::{Discovery, Membership, Source};

/// A fixed membership: each address is a serving node of weight 1, its id
/// the address itself.
pub struct StaticDiscovery {
    tx: watch::Sender<Arc<Membership>>,
}

impl StaticDiscovery {
    /// Nodes at `addrs`.
    pub fn new(addrs: &[SocketAddr]) -> Self {
        let mut nodes: Vec<NodeRecord> = addrs
            .iter()
            .map(|a| NodeRecord {
                schema: SCHEMA,
                node_id: a.to_string(),
                zone: String::new(),
                host: a.ip().to_string(),
                version: String::new(),
                state: NodeState::Serving,
                weight: 1.0,
                capacity: Capacity {
                    score: 1.0,
                    ..Default::default()
                },
                endpoints: Endpoints {
                    grpc: a.to_string(),
                    ..Default::default()
                },
                models: Vec::new(),
                updated_ms: 0,
            })
            .collect();
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        nodes.dedup_by(|a, b| a.node_id == b.node_id);
        let (tx, _) = watch::channel(Arc::new(Membership {
            nodes,
            source: Source::Live,
            unreachable: None,
        }));
        StaticDiscovery { tx }
    }
}

impl Discovery for StaticDiscovery {
    fn subscribe(&self) -> watch::Receiver<Arc<Membership>> {
        self.tx.subscribe()
    }
}
