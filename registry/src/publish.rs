//! Advertising a node in the registry.
//!
//! With a ZooKeeper registry an agent keeps an ephemeral znode at
//! `/infermesh/v1/services/<service>/nodes/<node-id>` holding its
//! [`NodeRecord`]:
//!
//! - created once the node has something to serve ([`Advertise::ready`]);
//! - rewritten when its state, models' readiness or endpoints change (at
//!   once) or its weight moves by more than [`WEIGHT_HYSTERESIS`] (at most
//!   once per [`MIN_REWRITE_INTERVAL`]), so weights do not flap;
//! - re-created after a session expiry (the `zookeeper-client` crate reports
//!   expiry as a terminal state instead of silently reconnecting with a new
//!   session, which would lose the ephemeral node unnoticed). A reconnect
//!   within the session (e.g. ZooKeeper restarted on its data directory)
//!   keeps the node; writes wait until the connection is back;
//! - on shutdown, rewritten as `draining` (clients stop sending new requests)
//!   while in-flight requests finish, then deleted.
//!
//! A crashed host's node disappears when its session times out. A `static://`
//! registry has nothing to write. Reconnects back off with [`RECONNECT`].

use std::time::{Duration, Instant};

use infermesh_proto::registry::{NodeRecord, RegistryUrl, node_path, nodes_path};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::reconnect::{RECONNECT, Reconnect};

/// Relative weight change below which the record is not rewritten.
pub const WEIGHT_HYSTERESIS: f64 = 0.1;
/// Least time between two weight-only rewrites.
pub const MIN_REWRITE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the record is recomputed.
const TICK: Duration = Duration::from_millis(100);

/// Where and as what a node registers.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// Where to register.
    pub url: RegistryUrl,
    /// Service name.
    pub service: String,
    /// Node id (the znode name).
    pub node_id: String,
    /// ZooKeeper session timeout.
    pub session_timeout: Duration,
    /// `user:password` for ZooKeeper's digest scheme. With it, the agent
    /// authenticates and creates its nodes writable by that identity only
    /// (readable by anyone); without it, nodes are world-writable.
    pub auth: Option<DigestAuth>,
}

/// ZooKeeper digest credentials, `user:password` (never logged).
#[derive(Clone)]
pub struct DigestAuth(String);

impl DigestAuth {
    /// Checks `text` is `user:password` with both parts non-empty.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                Ok(Self(text.to_string()))
            }
            _ => Err("must hold user:password (ZooKeeper digest scheme)".into()),
        }
    }

    /// The user name.
    pub fn user(&self) -> &str {
        self.0.split_once(':').map_or("", |(u, _)| u)
    }
}

impl std::fmt::Debug for DigestAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DigestAuth({}:***)", self.user())
    }
}

/// With credentials: everything for the identities the creating session
/// authenticated as (every agent shares one), read for anyone (clients and
/// the ops CLI read without credentials).
static AUTH_WRITE_ANYONE_READ: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

fn acls(auth: bool) -> zk::Acls<'static> {
    if auth {
        zk::Acls::new(&AUTH_WRITE_ANYONE_READ)
    } else {
        zk::Acls::anyone_all()
    }
}

/// What the node advertises; read every [`TICK`] (100 ms).
pub trait Advertise: Send + Sync {
    /// Whether the node has something to serve (it is not advertised before).
    fn ready(&self) -> bool;
    /// The record for `phase` now.
    fn record(&self, phase: Phase) -> NodeRecord;
}

/// The shutdown phases the registration follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Normal operation.
    Serving,
    /// Shutting down: advertise `draining`.
    Draining,
    /// In-flight requests done: delete the record and stop.
    Gone,
}

/// Whether `new` differs enough from what was written last to rewrite it.
pub fn worth_rewriting(last: &NodeRecord, new: &NodeRecord, since_last: Duration) -> bool {
    if last.state != new.state || last.models != new.models || last.endpoints != new.endpoints {
        return true;
    }
    let moved = (new.weight - last.weight).abs() > WEIGHT_HYSTERESIS * last.weight.max(1e-9);
    let to_or_from_zero = (last.weight == 0.0) != (new.weight == 0.0);
    // Going to or from zero weight is written at once; other moves are rate-limited.
    to_or_from_zero || (moved && since_last >= MIN_REWRITE_INTERVAL)
}

/// Keeps the node's record in the registry until `phase` reaches [`Phase::Gone`].
pub async fn run<A: Advertise>(cfg: PublishConfig, node: A, mut phase: watch::Receiver<Phase>) {
    let RegistryUrl::ZooKeeper { hosts, chroot } = &cfg.url else {
        tracing::info!("static registry: nothing to register");
        return;
    };
    // Connect without the chroot: it may not exist yet, and a chrooted
    // session cannot create it.
    let connect = hosts.join(",");
    let path = node_path(&cfg.service, &cfg.node_id);
    let mut retry = Reconnect::new(RECONNECT);
    loop {
        if *phase.borrow() == Phase::Gone {
            return;
        }
        let client = tokio::select! {
            c = {
                let mut connector = zk::Client::connector().with_session_timeout(cfg.session_timeout);
                if let Some(a) = &cfg.auth {
                    connector = connector.with_auth("digest", a.0.as_bytes());
                }
                connector.connect(&connect)
            } => c,
            _ = phase.wait_for(|p| *p == Phase::Gone) => return,
        };
        let why = match client {
            Err(e) => format!("cannot reach ZooKeeper: {e}"),
            Ok(client) => {
                tracing::info!(registry = %connect, session = ?client.session_id(), "connected to ZooKeeper");
                match chrooted(client, chroot, &cfg.service, cfg.auth.is_some()).await {
                    Err(e) => format!("cannot prepare the registry path: {e}"),
                    Ok(client) => {
                        match register(
                            &client,
                            &node,
                            &path,
                            &mut phase,
                            &mut retry,
                            cfg.auth.is_some(),
                        )
                        .await
                        {
                            Ok(()) => return,
                            Err(e) => format!(
                                "ZooKeeper session lost ({e}); registering again with a new session"
                            ),
                        }
                    }
                }
            }
        };
        let wait = retry.failed();
        tracing::warn!(registry = %connect, retry_in = ?wait, "{why}; will retry");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = phase.wait_for(|p| *p == Phase::Gone) => return,
        }
    }
}

/// Registers with one session; `Ok` when done (deleted on shutdown), `Err`
/// when the session ended and a new one is needed.
async fn register<A: Advertise>(
    client: &zk::Client,
    node: &A,
    path: &str,
    phase: &mut watch::Receiver<Phase>,
    retry: &mut Reconnect,
    auth: bool,
) -> Result<(), String> {
    let mut state = client.state_watcher();
    let mut connected = true;
    let mut tick = tokio::time::interval(TICK);
    let mut written: Option<(NodeRecord, Instant)> = None;
    loop {
        tokio::select! {
            s = state.changed() => {
                if s.is_terminated() {
                    return Err(format!("session {s:?}"));
                }
                connected = s != zk::SessionState::Disconnected;
                if connected {
                    tracing::info!("reconnected to ZooKeeper within the session; the record is still there");
                } else {
                    tracing::warn!("disconnected from ZooKeeper; the record stays while the session lives");
                }
                continue;
            }
            _ = tick.tick() => {}
            _ = phase.changed() => {}
        }
        let current = *phase.borrow();
        if current == Phase::Gone {
            if written.is_some() {
                match client.delete(path, None).await {
                    Ok(()) | Err(zk::Error::NoNode) => tracing::info!(path, "deregistered"),
                    Err(e) => {
                        tracing::warn!(path, error = %e, "could not delete the record; it goes with the session")
                    }
                }
            }
            return Ok(());
        }
        if !connected || (written.is_none() && !node.ready()) {
            continue;
        }
        let record = node.record(current);
        let due = match &written {
            None => true,
            Some((last, at)) => worth_rewriting(last, &record, at.elapsed()),
        };
        if !due {
            continue;
        }
        let result = if written.is_none() {
            create(client, path, &record, auth).await
        } else {
            match client.set_data(path, &record.to_json(), None).await {
                Ok(_) => Ok(()),
                // Deleted under us (an operator, a tool): advertise again.
                Err(zk::Error::NoNode) => {
                    tracing::warn!(
                        path,
                        "the record was deleted by someone else; creating it again"
                    );
                    create(client, path, &record, auth).await
                }
                Err(e) => Err(e.to_string()),
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(path, state = ?record.state, weight = record.weight, "registry record written");
                written = Some((record, Instant::now()));
                retry.succeeded();
            }
            Err(e) => {
                tracing::warn!(path, error = %e, "could not write the registry record; will retry")
            }
        }
    }
}

/// Creates `<chroot>/infermesh/v1/services/<service>/nodes` (persistent) and
/// returns the client rooted at `chroot`.
async fn chrooted(
    client: zk::Client,
    chroot: &str,
    service: &str,
    auth: bool,
) -> Result<zk::Client, String> {
    let persistent = zk::CreateMode::Persistent.with_acls(acls(auth));
    let full = format!("{chroot}{}", nodes_path(service));
    match client.mkdir(&full, &persistent).await {
        Ok(()) | Err(zk::Error::NodeExists) => {}
        Err(e) => return Err(format!("creating {full}: {e}")),
    }
    if chroot.is_empty() {
        return Ok(client);
    }
    client
        .chroot(chroot.to_string())
        .map_err(|_| format!("invalid chroot '{chroot}'"))
}

/// Creates the ephemeral record, replacing one left by an earlier session of
/// this node (e.g. the agent restarted before its old session expired).
async fn create(
    client: &zk::Client,
    path: &str,
    record: &NodeRecord,
    auth: bool,
) -> Result<(), String> {
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(acls(auth));
    match client.create(path, &record.to_json(), &ephemeral).await {
        Ok(_) => Ok(()),
        Err(zk::Error::NodeExists) => {
            tracing::warn!(
                path,
                "a record for this node id exists from another session; replacing it"
            );
            client.delete(path, None).await.map_err(|e| e.to_string())?;
            client
                .create(path, &record.to_json(), &ephemeral)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn digest_credentials_are_checked_and_never_printed() {
        let a = DigestAuth::parse("infermesh:s3cret\n").unwrap();
        assert_eq!(a.user(), "infermesh");
        assert!(!format!("{a:?}").contains("s3cret"));
        for bad in ["", "nocolon", ":pw", "user:"] {
            assert!(DigestAuth::parse(bad).is_err(), "{bad:?}");
        }
    }

    use infermesh_proto::registry::{Capacity, Endpoints, NodeState, SCHEMA};

    use super::*;

    fn record(weight: f64, state: NodeState) -> NodeRecord {
        NodeRecord {
            schema: SCHEMA,
            node_id: "n".into(),
            zone: String::new(),
            host: String::new(),
            version: String::new(),
            state,
            weight,
            capacity: Capacity::default(),
            endpoints: Endpoints::default(),
            models: vec![],
            updated_ms: 0,
        }
    }

    #[test]
    fn weight_changes_are_rate_limited_with_hysteresis() {
        let last = record(1.0, NodeState::Serving);
        let long = MIN_REWRITE_INTERVAL * 2;
        assert!(
            !worth_rewriting(&last, &record(1.05, NodeState::Serving), long),
            "within hysteresis"
        );
        assert!(worth_rewriting(
            &last,
            &record(0.5, NodeState::Serving),
            long
        ));
        assert!(
            !worth_rewriting(&last, &record(0.5, NodeState::Serving), Duration::ZERO),
            "rate-limited"
        );
        assert!(
            worth_rewriting(&last, &record(0.0, NodeState::Serving), Duration::ZERO),
            "to zero at once"
        );
        assert!(
            worth_rewriting(&last, &record(1.0, NodeState::Draining), Duration::ZERO),
            "state at once"
        );
    }
}
