//! ZooKeeper discovery with a cache that survives an outage.

use std::sync::Arc;
use std::time::Duration;

use infermesh_proto::registry::{NodeRecord, nodes_path};
use tokio::sync::watch;
use zookeeper_client as zk;

use super::{Discovery, Membership, Source};

/// Watches `/infermesh/v1/services/<service>/nodes` in ZooKeeper.
pub struct ZkDiscovery {
    tx: watch::Sender<Arc<Membership>>,
    task: tokio::task::JoinHandle<()>,
}

impl ZkDiscovery {
    /// Starts watching in the background (needs a tokio runtime).
    pub fn start(hosts: String, chroot: String, service: String) -> Self {
        let (tx, _) = watch::channel(Arc::new(Membership::empty()));
        let task = tokio::spawn(run(hosts, chroot, service, tx.clone()));
        ZkDiscovery { tx, task }
    }
}

impl Drop for ZkDiscovery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Discovery for ZkDiscovery {
    fn subscribe(&self) -> watch::Receiver<Arc<Membership>> {
        self.tx.subscribe()
    }
}

/// Keeps the last membership published, marked cached, and says why.
fn keep_cached(tx: &watch::Sender<Arc<Membership>>, why: &str) {
    let current = tx.borrow().clone();
    if current.source == Source::Live {
        tracing::warn!(
            nodes = current.nodes.len(),
            "ZooKeeper unreachable ({why}): routing on the cached membership"
        );
        tx.send_replace(Arc::new(Membership {
            nodes: current.nodes.clone(),
            source: Source::Cached,
        }));
    }
}

async fn run(hosts: String, chroot: String, service: String, tx: watch::Sender<Arc<Membership>>) {
    let path = nodes_path(&service);
    let mut retry = Duration::from_millis(200);
    loop {
        let client = match zk::Client::connector()
            .with_session_timeout(Duration::from_secs(6))
            .connect(&hosts)
            .await
            .map(|c| {
                if chroot.is_empty() {
                    Ok(c)
                } else {
                    c.chroot(chroot.clone())
                }
            }) {
            Ok(Ok(c)) => c,
            Ok(Err(_)) => {
                tracing::error!(%chroot, "invalid ZooKeeper chroot; discovery stopped");
                return;
            }
            Err(e) => {
                keep_cached(&tx, &e.to_string());
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        retry = Duration::from_millis(200);
        if let Err(e) = follow(&client, &path, &tx).await {
            keep_cached(&tx, &e);
        }
    }
}

/// Reads the membership and re-reads it on every change until the session ends.
async fn follow(
    client: &zk::Client,
    path: &str,
    tx: &watch::Sender<Arc<Membership>>,
) -> Result<(), String> {
    let mut watcher = client
        .watch(path, zk::AddWatchMode::PersistentRecursive)
        .await
        .map_err(|e| format!("watching {path}: {e}"))?;
    let mut state = client.state_watcher();
    publish(client, path, tx).await?;
    loop {
        tokio::select! {
            s = state.changed() => {
                if s.is_terminated() {
                    return Err(format!("session {s:?}"));
                }
                if s == zk::SessionState::Disconnected {
                    keep_cached(tx, "disconnected");
                } else {
                    // Reconnected with the same session: catch up.
                    publish(client, path, tx).await?;
                }
            }
            event = watcher.changed() => {
                if event.event_type == zk::EventType::Session {
                    if event.session_state.is_terminated() {
                        return Err(format!("session {:?}", event.session_state));
                    }
                    continue;
                }
                publish(client, path, tx).await?;
            }
        }
    }
}

/// Reads every record under `path` and publishes the valid ones.
async fn publish(
    client: &zk::Client,
    path: &str,
    tx: &watch::Sender<Arc<Membership>>,
) -> Result<(), String> {
    let children = match client.list_children(path).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => return Err(format!("listing {path}: {e}")),
    };
    let mut nodes = Vec::with_capacity(children.len());
    for child in children {
        match client.get_data(&format!("{path}/{child}")).await {
            Ok((data, _)) => match NodeRecord::from_json(&data, &child) {
                Ok(r) => nodes.push(r),
                Err(e) => {
                    tracing::warn!(node = %child, error = %e, "skipping an invalid node record")
                }
            },
            // Gone between the listing and the read.
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(format!("reading {path}/{child}: {e}")),
        }
    }
    nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let membership = Membership {
        nodes,
        source: Source::Live,
    };
    if tx.borrow().as_ref() != &membership {
        tracing::info!(
            nodes = membership.nodes.len(),
            "membership updated from ZooKeeper"
        );
        tx.send_replace(Arc::new(membership));
    }
    Ok(())
}
