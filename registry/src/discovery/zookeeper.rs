//! ZooKeeper discovery: an incremental cache that survives reconnects,
//! session expiry and outages.
//!
//! One persistent recursive watch on `/infermesh/v1/services/<service>/nodes`
//! reports every creation, data change and deletion of a node record. A
//! created or changed node is read on its own (events that arrive together
//! are coalesced, so a node is read once per batch); a deleted one is
//! dropped without a read. The whole service is listed only when the watch
//! is (re-)established.
//!
//! The watch is re-established on every new session and after every
//! reconnect within a session. `zookeeper-client` 0.11 re-sends one-shot
//! watches on reconnect but not persistent ones (its `resend_watches` never
//! raises the index of the `SetWatches` variant past the one-shot kinds, so
//! `SetWatches2` with persistent paths is never sent), and ZooKeeper does not
//! replay events missed while disconnected (ZOOKEEPER-4698); without a fresh
//! `AddWatch` and a re-list a client that rode out a ZooKeeper restart on its
//! old session would never hear of a node again. See docs/DECISIONS.md.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use infermesh_proto::registry::{NodeRecord, RecordError, nodes_path, valid_name};
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{Discovery, DiscoveryStats, Membership, Source};
use crate::reconnect::{RECONNECT, Reconnect};

/// Most nodes followed per service; more are skipped with a warning (input
/// bound: a runaway writer cannot make a client hold unbounded state).
pub const MAX_NODES: usize = 10_000;
/// Session timeout asked of ZooKeeper.
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// Most watch events coalesced into one batch of reads.
const MAX_BATCH: usize = 4096;

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    lists: AtomicU64,
    sessions: AtomicU64,
    resyncs: AtomicU64,
    skipped: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> DiscoveryStats {
        DiscoveryStats {
            reads: self.reads.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            sessions: self.sessions.load(Ordering::Relaxed),
            resyncs: self.resyncs.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }
}

/// Follows `/infermesh/v1/services/<service>/nodes` in ZooKeeper.
pub struct ZkDiscovery {
    tx: watch::Sender<Arc<Membership>>,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl ZkDiscovery {
    /// Starts following in the background (needs a tokio runtime).
    pub fn start(hosts: String, chroot: String, service: String) -> Self {
        let (tx, _) = watch::channel(Arc::new(Membership::empty()));
        let counters = Arc::new(Counters::default());
        let cache = Cache {
            path: nodes_path(&service),
            nodes: BTreeMap::new(),
            warned: HashMap::new(),
            over_cap: false,
            counters: counters.clone(),
            tx: tx.clone(),
        };
        let task = tokio::spawn(run(hosts, chroot, cache));
        ZkDiscovery { tx, counters, task }
    }

    /// Counters of the work done so far.
    pub fn stats(&self) -> DiscoveryStats {
        self.counters.snapshot()
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

    fn stats(&self) -> DiscoveryStats {
        self.counters.snapshot()
    }
}

async fn run(hosts: String, chroot: String, mut cache: Cache) {
    let mut retry = Reconnect::new(RECONNECT);
    loop {
        // Fail at once when no host answers (instead of after the session
        // timeout): this loop retries with backoff anyway, and callers learn
        // early that the registry is unreachable.
        let connected = zk::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .with_fail_eagerly()
            .connect(&hosts)
            .await;
        let why = match connected {
            Ok(client) => {
                let client = if chroot.is_empty() {
                    client
                } else {
                    match client.chroot(chroot.clone()) {
                        Ok(c) => c,
                        Err(_) => {
                            tracing::error!(%chroot, "invalid ZooKeeper chroot; discovery stopped");
                            return;
                        }
                    }
                };
                Counters::bump(&cache.counters.sessions);
                tracing::info!(registry = %hosts, session = ?client.session_id(), "discovery connected to ZooKeeper");
                follow(&client, &mut cache, &mut retry).await
            }
            Err(e) => why_unreachable(&hosts, &e).await,
        };
        cache.keep_cached(&why);
        tokio::time::sleep(retry.failed()).await;
    }
}

/// Why no session could be made with `hosts`: the client's error and, for
/// the first host, what a plain TCP connect says (refused, no answer),
/// which the client's "no available hosts" leaves out.
async fn why_unreachable(hosts: &str, e: &zk::Error) -> String {
    let first = hosts.split(',').next().unwrap_or(hosts);
    let tcp = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(first),
    )
    .await;
    match tcp {
        // TCP works: ZooKeeper itself refused the session.
        Ok(Ok(_)) => e.to_string(),
        Ok(Err(io)) => format!("{e} ({first}: {io})"),
        Err(_) => format!("{e} ({first}: no answer within 1 s)"),
    }
}

/// What one watch event asks for.
enum Change {
    /// Read this node.
    Read(String),
    /// This node is gone.
    Remove(String),
    /// List the whole service.
    Relist,
    /// Nothing for us (a deeper path, the directory's own data).
    Nothing,
}

/// Follows the service with one session until it ends; returns why.
async fn follow(client: &zk::Client, cache: &mut Cache, retry: &mut Reconnect) -> String {
    let mut watcher: Option<zk::PersistentWatcher> = None;
    // A new session starts by watching and listing.
    let mut resync_at = Some(Instant::now());
    let mut connected = true;
    loop {
        let first = tokio::select! {
            ev = next_event(&mut watcher) => ev,
            _ = sleep_until(resync_at), if connected => {
                match resync(client, &mut watcher, cache).await {
                    Ok(()) => {
                        resync_at = None;
                        retry.succeeded();
                    }
                    Err(e) => {
                        if client.state().is_terminated() {
                            return e;
                        }
                        let wait = retry.failed();
                        tracing::warn!(error = %e, retry_in = ?wait, "discovery could not re-synchronise; will retry");
                        cache.keep_cached(&e);
                        resync_at = Some(Instant::now() + wait);
                    }
                }
                continue;
            }
        };
        // Coalesce what is already queued: one read per node per batch.
        // The library panics on a poll after a terminal session event (its
        // channel is closed then), so draining stops at one.
        let terminal = |ev: &zk::WatchedEvent| {
            ev.event_type == zk::EventType::Session && ev.session_state.is_terminated()
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && !batch.last().is_some_and(terminal) {
            match watcher.as_mut().and_then(|w| w.changed().now_or_never()) {
                Some(ev) => batch.push(ev),
                None => break,
            }
        }
        let mut dirty = BTreeSet::new();
        let mut removed = false;
        for ev in batch {
            if ev.event_type == zk::EventType::Session {
                let s = ev.session_state;
                if s.is_terminated() {
                    // The watcher must not be polled after this.
                    return format!("session {s:?}");
                }
                if s == zk::SessionState::Disconnected {
                    connected = false;
                    cache.keep_cached("disconnected");
                } else {
                    // Reconnected within the session: the library restored
                    // no persistent watch and ZooKeeper replays nothing
                    // missed; watch again and re-list.
                    connected = true;
                    tracing::info!(
                        "discovery reconnected to ZooKeeper within its session; re-synchronising"
                    );
                    Counters::bump(&cache.counters.resyncs);
                    resync_at = Some(Instant::now());
                }
                continue;
            }
            match cache.classify(ev.event_type, &ev.path) {
                Change::Read(node) => {
                    dirty.insert(node);
                }
                Change::Remove(node) => {
                    dirty.remove(&node);
                    removed |= cache.nodes.remove(&node).is_some();
                    cache.warned.remove(&node);
                }
                Change::Relist => {
                    tracing::debug!(path = %ev.path, "the service's node directory appeared; listing it");
                    resync_at = Some(Instant::now());
                }
                Change::Nothing => {}
            }
        }
        if resync_at.is_some() || !connected {
            // A re-list (now or after the reconnect) covers this batch.
            continue;
        }
        match cache.read_each(client, dirty).await {
            Ok(()) => {
                if removed {
                    cache.over_cap = false;
                }
                cache.publish();
            }
            Err(e) => {
                if client.state().is_terminated() {
                    return e;
                }
                tracing::warn!(error = %e, "discovery lost a read; re-synchronising");
                resync_at = Some(Instant::now() + retry.failed());
            }
        }
    }
}

async fn next_event(watcher: &mut Option<zk::PersistentWatcher>) -> zk::WatchedEvent {
    match watcher {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Watches the service again (a fresh `AddWatch`, then drops the old
/// watcher) and re-lists it.
async fn resync(
    client: &zk::Client,
    watcher: &mut Option<zk::PersistentWatcher>,
    cache: &mut Cache,
) -> Result<(), String> {
    let fresh = client
        .watch(&cache.path, zk::AddWatchMode::PersistentRecursive)
        .await
        .map_err(|e| format!("watching {}: {e}", cache.path))?;
    // Adding before dropping keeps the library from asking the server to
    // remove the path's (new) persistent watch.
    *watcher = Some(fresh);
    cache.relist(client).await
}

/// The membership being kept and where it is published.
struct Cache {
    path: String,
    nodes: BTreeMap<String, NodeRecord>,
    /// The last problem logged per node, so a node that keeps writing the
    /// same bad record is logged once.
    warned: HashMap<String, String>,
    /// More than [`MAX_NODES`] nodes were seen (logged once).
    over_cap: bool,
    counters: Arc<Counters>,
    tx: watch::Sender<Arc<Membership>>,
}

impl Cache {
    fn classify(&self, event_type: zk::EventType, path: &str) -> Change {
        use zk::EventType::*;
        if path == self.path {
            return match event_type {
                NodeCreated => Change::Relist,
                // Every child went before the directory could.
                _ => Change::Nothing,
            };
        }
        let Some(node) = path
            .strip_prefix(&self.path)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|n| !n.contains('/'))
        else {
            return Change::Nothing;
        };
        match event_type {
            NodeCreated | NodeDataChanged => Change::Read(node.to_string()),
            NodeDeleted => Change::Remove(node.to_string()),
            _ => Change::Nothing,
        }
    }

    /// Lists the service and reads every node, replacing the cache.
    async fn relist(&mut self, client: &zk::Client) -> Result<(), String> {
        tracing::debug!(path = %self.path, "listing the service");
        Counters::bump(&self.counters.reads);
        Counters::bump(&self.counters.lists);
        let mut children = match client.list_children(&self.path).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(format!("listing {}: {e}", self.path)),
        };
        children.sort();
        if children.len() > MAX_NODES {
            self.warn_over_cap(children.len());
            Counters::add(&self.counters.skipped, (children.len() - MAX_NODES) as u64);
            children.truncate(MAX_NODES);
        } else {
            self.over_cap = false;
        }
        let mut nodes = BTreeMap::new();
        for child in children {
            if let Some(record) = self.read(client, &child).await? {
                nodes.insert(child, record);
            }
        }
        self.warned.retain(|node, _| nodes.contains_key(node));
        self.nodes = nodes;
        self.publish();
        Ok(())
    }

    /// Reads the nodes a batch of events named.
    async fn read_each(
        &mut self,
        client: &zk::Client,
        dirty: BTreeSet<String>,
    ) -> Result<(), String> {
        for node in dirty {
            if !self.nodes.contains_key(&node) && self.nodes.len() >= MAX_NODES {
                self.warn_over_cap(self.nodes.len() + 1);
                Counters::bump(&self.counters.skipped);
                continue;
            }
            match self.read(client, &node).await? {
                Some(record) => self.nodes.insert(node, record),
                None => self.nodes.remove(&node),
            };
        }
        Ok(())
    }

    /// Reads one node's record: `None` when it is gone or invalid.
    async fn read(
        &mut self,
        client: &zk::Client,
        node: &str,
    ) -> Result<Option<NodeRecord>, String> {
        if !valid_name(node) {
            self.skip(node, "the znode name is not a valid node id".to_string());
            return Ok(None);
        }
        Counters::bump(&self.counters.reads);
        let data = match client.get_data(&format!("{}/{node}", self.path)).await {
            Ok((data, _)) => data,
            // Gone between the event (or listing) and the read.
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(format!("reading {}/{node}: {e}", self.path)),
        };
        match NodeRecord::from_json(&data, node) {
            Ok(record) => {
                self.warned.remove(node);
                Ok(Some(record))
            }
            Err(e @ RecordError::Schema(_)) => {
                self.skip(
                    node,
                    format!("{e}; this client skips it until it is upgraded"),
                );
                Ok(None)
            }
            Err(e) => {
                self.skip(node, e.to_string());
                Ok(None)
            }
        }
    }

    /// Skips a node's record, logging each distinct problem once per node.
    fn skip(&mut self, node: &str, why: String) {
        Counters::bump(&self.counters.skipped);
        if self.warned.get(node) != Some(&why) {
            tracing::warn!(node, error = %why, "skipping an invalid node record");
            // Bounded like the membership: past the cap, problems are
            // logged each time instead of remembered.
            if self.warned.len() < MAX_NODES || self.warned.contains_key(node) {
                self.warned.insert(node.to_string(), why);
            }
        }
    }

    fn warn_over_cap(&mut self, seen: usize) {
        if !std::mem::replace(&mut self.over_cap, true) {
            tracing::warn!(
                seen,
                cap = MAX_NODES,
                path = %self.path,
                "more nodes than a client follows per service; the rest are skipped"
            );
        }
    }

    /// Publishes the cache if it differs from the last snapshot.
    fn publish(&self) {
        let current = self.tx.borrow().clone();
        let changed = current.source != Source::Live
            || current.unreachable.is_some()
            || current.nodes.len() != self.nodes.len()
            || current.nodes.iter().ne(self.nodes.values());
        if changed {
            let membership = Membership {
                nodes: self.nodes.values().cloned().collect(),
                source: Source::Live,
                unreachable: None,
            };
            if current.nodes.len() != membership.nodes.len() {
                tracing::info!(
                    nodes = membership.nodes.len(),
                    "membership updated from ZooKeeper"
                );
            } else {
                tracing::debug!("a node's record changed");
            }
            self.tx.send_replace(Arc::new(membership));
        }
    }

    /// ZooKeeper cannot be read (`why`): keep what was read, if anything,
    /// marked cached, and say why. Published once per outage, not per retry.
    fn keep_cached(&self, why: &str) {
        let current = self.tx.borrow().clone();
        let source = match current.source {
            Source::Empty => Source::Empty,
            Source::Live | Source::Cached => Source::Cached,
        };
        if current.source == Source::Live {
            tracing::warn!(
                nodes = current.nodes.len(),
                "ZooKeeper unreachable ({why}): routing on the cached membership"
            );
        }
        if current.source != source || current.unreachable.is_none() {
            self.tx.send_replace(Arc::new(Membership {
                nodes: current.nodes.clone(),
                source,
                unreachable: Some(why.to_string()),
            }));
        }
    }
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> Cache {
        let (tx, _) = watch::channel(Arc::new(Membership::empty()));
        Cache {
            path: nodes_path("eta"),
            nodes: BTreeMap::new(),
            warned: HashMap::new(),
            over_cap: false,
            counters: Arc::default(),
            tx,
        }
    }

    fn event(event_type: zk::EventType, path: &str) -> (zk::EventType, String) {
        (event_type, path.to_string())
    }

    #[test]
    fn events_name_one_node_or_the_whole_service() {
        use zk::EventType::*;
        let c = cache();
        let dir = "/infermesh/v1/services/eta/nodes";
        let is = |(t, p): (zk::EventType, String), want: &str| match c.classify(t, &p) {
            Change::Read(n) => want == format!("read {n}"),
            Change::Remove(n) => want == format!("remove {n}"),
            Change::Relist => want == "relist",
            Change::Nothing => want == "nothing",
        };
        assert!(is(event(NodeCreated, &format!("{dir}/a")), "read a"));
        assert!(is(event(NodeDataChanged, &format!("{dir}/a")), "read a"));
        assert!(is(event(NodeDeleted, &format!("{dir}/a")), "remove a"));
        assert!(is(event(NodeCreated, dir), "relist"));
        assert!(is(event(NodeDeleted, dir), "nothing"));
        assert!(is(event(NodeDataChanged, dir), "nothing"));
        assert!(is(event(NodeCreated, &format!("{dir}/a/b")), "nothing"));
        assert!(is(event(NodeCreated, &format!("{dir}x/a")), "nothing"));
        assert!(is(
            event(NodeCreated, "/infermesh/v1/services/other/nodes/a"),
            "nothing"
        ));
    }

    #[test]
    fn publishing_only_on_a_change_and_keeping_the_cache_through_an_outage() {
        let mut c = cache();
        let mut rx = c.tx.subscribe();
        c.publish();
        assert_eq!(rx.borrow_and_update().source, Source::Live);
        c.publish();
        assert!(!rx.has_changed().unwrap(), "nothing changed");
        let record = infermesh_proto::registry::NodeRecord {
            schema: infermesh_proto::registry::SCHEMA,
            node_id: "a".into(),
            zone: String::new(),
            host: String::new(),
            version: String::new(),
            state: infermesh_proto::registry::NodeState::Serving,
            weight: 1.0,
            capacity: Default::default(),
            endpoints: infermesh_proto::registry::Endpoints {
                grpc: "127.0.0.1:1".into(),
                ..Default::default()
            },
            models: vec![],
            updated_ms: 1,
        };
        c.nodes.insert("a".into(), record);
        c.publish();
        assert_eq!(rx.borrow_and_update().nodes.len(), 1);
        c.keep_cached("test");
        let m = rx.borrow_and_update().clone();
        assert_eq!((m.source, m.nodes.len()), (Source::Cached, 1));
        c.keep_cached("again");
        assert!(!rx.has_changed().unwrap(), "marked once");
        assert_eq!(m.unreachable.as_deref(), Some("test"));
        c.publish();
        assert_eq!(rx.borrow_and_update().unreachable, None, "read again");
    }

    /// A registry never reached says so: no nodes, and why.
    #[test]
    fn a_registry_never_read_is_reported_unreachable() {
        let c = cache();
        let mut rx = c.tx.subscribe();
        c.keep_cached("connection refused");
        let m = rx.borrow_and_update().clone();
        assert_eq!(m.source, Source::Empty);
        assert!(m.nodes.is_empty());
        assert_eq!(m.unreachable.as_deref(), Some("connection refused"));
    }

    #[test]
    fn a_node_that_keeps_writing_the_same_bad_record_is_logged_once() {
        let mut c = cache();
        c.skip("a", "bad".into());
        c.skip("a", "bad".into());
        assert_eq!(c.warned.len(), 1);
        assert_eq!(c.counters.snapshot().skipped, 2);
    }
}
