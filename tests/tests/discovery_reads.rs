//! Discovery's ZooKeeper reads against a real ZooKeeper: a change to one
//! node costs one read of that node, not a re-read of the service. N = 200
//! nodes (`INFERMESH_DISCOVERY_NODES` to change it; CI uses 200) each
//! changing K = 5 times cost the client at most N×K + N + 1 reads
//! (one listing, one read per creation, one per change); re-reading the
//! service on every change, as discovery did before, costs (N+1) per change:
//! about 240,000 here. Invalid records are skipped without touching the rest
//! of the membership.

use std::sync::Arc;

use infermesh_client::discovery::{self, Membership, Source};
use infermesh_proto::registry::{
    Capacity, Endpoints, NodeRecord, NodeState, RegistryUrl, SCHEMA, node_path, nodes_path,
};
use infermesh_tests::PATIENCE;
use infermesh_tests::zk::Zk;
use tokio::sync::watch;
use zookeeper_client as zk;

const K: u64 = 5;

/// Nodes in the read-count test.
fn nodes() -> usize {
    std::env::var("INFERMESH_DISCOVERY_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn record(i: usize, version: u64) -> NodeRecord {
    NodeRecord {
        schema: SCHEMA,
        node_id: format!("node-{i:04}"),
        zone: "z".into(),
        host: "h".into(),
        version: String::new(),
        state: NodeState::Serving,
        weight: 1.0,
        capacity: Capacity {
            score: 1.0,
            ..Default::default()
        },
        endpoints: Endpoints {
            grpc: format!("127.0.0.1:{}", 10_000 + i),
            ..Default::default()
        },
        models: Vec::new(),
        updated_ms: version,
    }
}

async fn writer(zk: &Zk, service: &str) -> zk::Client {
    let c = zk::Client::connect(&zk.address()).await.unwrap();
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    c.mkdir(&format!("/im{}", nodes_path(service)), &persistent)
        .await
        .unwrap();
    c.chroot("/im").unwrap()
}

async fn create(c: &zk::Client, service: &str, id: &str, data: &[u8]) {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    c.create(&node_path(service, id), data, &persistent)
        .await
        .unwrap();
}

/// Waits (generously bounded, as a failure guard) for a membership.
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

#[tokio::test]
async fn a_change_reads_only_the_changed_node() {
    let n = nodes();
    let zk = Zk::start().await;
    let w = writer(&zk, "reads").await;
    let url: RegistryUrl = zk.url("/im").parse().unwrap();
    let discovery = discovery::open(&url, "reads");
    let mut rx = discovery.subscribe();
    until(&mut rx, "the empty service listed", |m| {
        m.source == Source::Live
    })
    .await;
    for i in 0..n {
        create(&w, "reads", &record(i, 0).node_id, &record(i, 0).to_json()).await;
    }
    until(&mut rx, "every node seen", |m| m.nodes.len() == n).await;
    let started = std::time::Instant::now();
    for k in 1..=K {
        for i in 0..n {
            w.set_data(
                &node_path("reads", &record(i, k).node_id),
                &record(i, k).to_json(),
                None,
            )
            .await
            .unwrap();
        }
        until(&mut rx, "every node's change seen", |m| {
            m.nodes.len() == n && m.nodes.iter().all(|r| r.updated_ms == k)
        })
        .await;
    }
    let elapsed = started.elapsed();
    let stats = discovery.stats();
    let bound = n as u64 * K + n as u64 + 1;
    println!(
        "discovery reads: {} for {n} nodes × {K} changes (bound {bound}; re-reading the service per change: {}); \
         {} changes written and seen in {elapsed:?}",
        stats.reads,
        (n as u64 + 1) * (n as u64 * K + n as u64),
        n as u64 * K
    );
    assert!(stats.reads <= bound, "{stats:?} over {bound}");
    assert_eq!(stats.lists, 1, "listed once: {stats:?}");
    assert_eq!((stats.sessions, stats.resyncs), (1, 0), "{stats:?}");
    assert_eq!(stats.skipped, 0);

    // Deleting a node costs no read.
    let before = discovery.stats().reads;
    w.delete(&node_path("reads", &record(0, 0).node_id), None)
        .await
        .unwrap();
    until(&mut rx, "the deleted node gone", |m| m.nodes.len() == n - 1).await;
    assert_eq!(discovery.stats().reads, before);
}

#[tokio::test]
async fn invalid_records_are_skipped_and_the_rest_kept() {
    let zk = Zk::start().await;
    let w = writer(&zk, "mixed").await;
    let url: RegistryUrl = zk.url("/im").parse().unwrap();
    let discovery = discovery::open(&url, "mixed");
    let mut rx = discovery.subscribe();
    for i in 0..3 {
        create(&w, "mixed", &record(i, 0).node_id, &record(i, 0).to_json()).await;
    }
    until(&mut rx, "three nodes", |m| m.nodes.len() == 3).await;

    // Garbage, a record of a newer major schema, a record over the size cap,
    // a record whose id differs from its znode, and a record with unknown
    // fields (accepted).
    create(&w, "mixed", "garbage", b"\x00{not json").await;
    let v2 = br#"{"schema":2,"node_id":"future","state":{"phase":"up"}}"#;
    create(&w, "mixed", "future", v2).await;
    let mut big = record(7, 0);
    big.node_id = "big".into();
    big.host = "h".repeat(70 * 1024);
    create(&w, "mixed", "big", &big.to_json()).await;
    create(&w, "mixed", "liar", &record(8, 0).to_json()).await;
    let mut extended: serde_json::Value = serde_json::from_slice(&record(9, 0).to_json()).unwrap();
    extended["added_in_a_later_minor"] = serde_json::json!({"x": 1});
    create(
        &w,
        "mixed",
        "node-0009",
        &serde_json::to_vec(&extended).unwrap(),
    )
    .await;
    until(&mut rx, "the extended record accepted", |m| {
        m.nodes.iter().any(|r| r.node_id == "node-0009")
    })
    .await;
    // An existing node turning invalid leaves only that node.
    w.set_data(&node_path("mixed", "node-0001"), b"[]", None)
        .await
        .unwrap();
    until(&mut rx, "node-0001 dropped, the rest kept", |m| {
        let ids: Vec<&str> = m.nodes.iter().map(|r| r.node_id.as_str()).collect();
        ids == ["node-0000", "node-0002", "node-0009"]
    })
    .await;
    assert_eq!(rx.borrow().source, Source::Live);
    assert!(discovery.stats().skipped >= 5, "{:?}", discovery.stats());
    // And it comes back when its record is valid again.
    w.set_data(
        &node_path("mixed", "node-0001"),
        &record(1, 1).to_json(),
        None,
    )
    .await
    .unwrap();
    until(&mut rx, "node-0001 back", |m| m.nodes.len() == 4).await;
}
