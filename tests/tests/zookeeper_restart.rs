//! The client library through a ZooKeeper restart (same port, same data
//! directory), against real agents backed by test workers: the agents are
//! registered again, and a node that registers only after the restart
//! appears in an already-running client's membership and gets requests —
//! started only once the client has re-listed the service, so only a live
//! watch can tell the client of it.
//!
//! Two outages: 5 s, within the discovery's session (it reconnects on its
//! old session: the path where `zookeeper-client` 0.11 restores no
//! persistent watch), and 12 s, past it (a new session). The timings from
//! ZooKeeper's return are printed for BENCHMARKS.md; nothing here asserts a
//! time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_client::Client;
use infermesh_client::discovery::{self, Membership, Source};
use infermesh_proto::registry::{NodeRecord, NodeState, RegistryUrl, node_path};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, PATIENCE, dense, eventually, testworker};
use tokio::sync::watch;
use zookeeper_client as zk;

fn agent(zk: &Zk, node: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"eta\"\nsession_timeout = \"2s\"\n\
             [[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker("")
        ))
        .spawn()
}

async fn record(c: &zk::Client, node: &str) -> Option<NodeRecord> {
    let (data, _) = c.get_data(&node_path("eta", node)).await.ok()?;
    NodeRecord::from_json(&data, node).ok()
}

fn ids(m: &Membership) -> Vec<&str> {
    m.nodes
        .iter()
        .filter(|r| r.state == NodeState::Serving)
        .map(|r| r.node_id.as_str())
        .collect()
}

/// Waits (bounded by a generous guard, not a threshold) for a membership.
async fn until(
    rx: &mut watch::Receiver<Arc<Membership>>,
    what: &str,
    f: impl FnMut(&Arc<Membership>) -> bool,
) {
    tokio::time::timeout(PATIENCE, rx.wait_for(f))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
        .unwrap();
}

/// Sends requests until `node` has answered one; every answer is checked.
async fn until_served(client: &Client, node: &str) -> HashMap<String, usize> {
    let input = dense::input(2, 3);
    let mut per_node: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + PATIENCE;
    while !per_node.contains_key(node) {
        assert!(
            Instant::now() < deadline,
            "{node} never served: {per_node:?}"
        );
        let (resp, by) = client
            .infer_on(dense::request(&input, true))
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
        *per_node.entry(by).or_default() += 1;
    }
    per_node
}

async fn restart_scenario(outage: Duration) {
    let mut zk = Zk::start().await;
    let (a, b) = (agent(&zk, "node-a"), agent(&zk, "node-b"));
    a.wait_ready().await;
    b.wait_ready().await;
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("eta")
        .seed(7)
        .build()
        .await
        .unwrap();
    // A discovery beside the client's: its changes can be awaited and its
    // counters read.
    let url: RegistryUrl = zk.url("/im").parse().unwrap();
    let beside = discovery::open(&url, "eta");
    let mut rx = beside.subscribe();
    until(&mut rx, "node-a and node-b", |m| {
        ids(m) == ["node-a", "node-b"]
    })
    .await;
    eventually("the client sees node-a and node-b", || async {
        (ids(&client.membership()) == ["node-a", "node-b"]).then_some(())
    })
    .await;
    until_served(&client, "node-a").await;

    zk.kill();
    until(&mut rx, "the outage noticed", |m| {
        m.source == Source::Cached
    })
    .await;
    // The outage itself: its length is the scenario, not a synchronisation.
    tokio::time::sleep(outage).await;
    zk.restart().await;
    let back = Instant::now();

    // Both discoveries are back on ZooKeeper (listed it again) before the
    // new node exists: it can only be learnt of through a watch.
    until(&mut rx, "the discovery live again", |m| {
        m.source == Source::Live
    })
    .await;
    let live = eventually("the client's membership live again", || async {
        (client.membership().source == Source::Live).then(|| back.elapsed())
    })
    .await;
    let raw = zk::Client::connect(&format!("{}/im", zk.address()))
        .await
        .unwrap();
    let c = agent(&zk, "node-c");
    let registered = eventually("node-c registered after the restart", || async {
        record(&raw, "node-c").await.map(|_| back.elapsed())
    })
    .await;
    until(&mut rx, "node-c seen by a running discovery", |m| {
        m.source == Source::Live && ids(m).contains(&"node-c")
    })
    .await;
    let seen = eventually("node-c in the client's membership", || async {
        ids(&client.membership())
            .contains(&"node-c")
            .then(|| back.elapsed())
    })
    .await;
    let per_node = until_served(&client, "node-c").await;
    let served = back.elapsed();

    // The agents are registered again (their old sessions, had they expired
    // without a new registration, would have taken the records by now), and
    // every node stays in the membership.
    for node in ["node-a", "node-b"] {
        assert!(record(&raw, node).await.is_some(), "{node} re-registered");
    }
    assert_eq!(ids(&client.membership()), ["node-a", "node-b", "node-c"]);
    assert_eq!(client.membership().source, Source::Live);
    // Both discoveries (the client's and the one beside it) hold their
    // watch on the server again.
    let watches = zk.total_watches().expect("wchs answers");
    assert!(
        watches >= 2,
        "server-side watches after the restart: {watches}"
    );
    let stats = beside.stats();
    assert!(
        stats.sessions + stats.resyncs >= 2,
        "the watch was re-established: {stats:?}"
    );
    c.wait_ready().await;
    println!(
        "zookeeper restart after {outage:?} down: client live again {live:?}, node-c registered \
         {registered:?}, seen by the client {seen:?}, served {served:?} after ZooKeeper was back; requests {per_node:?}; discovery {stats:?}; {watches} watches on the server"
    );
}

#[tokio::test]
async fn restart_within_the_session() {
    restart_scenario(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn restart_past_the_session() {
    restart_scenario(Duration::from_secs(12)).await;
}
