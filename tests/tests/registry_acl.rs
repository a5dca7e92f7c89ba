//! ZooKeeper ACLs: an agent given digest credentials (`registry.auth_file`)
//! creates its records writable by that identity only and readable by
//! anyone. A client without credentials can read them but can neither
//! modify nor delete them nor register a fake node beside them; the agent
//! still re-registers (as the same identity) after its session expires.

use std::time::Duration;

use infermesh_proto::registry::{NodeRecord, node_path, nodes_path};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, eventually, testworker};
use zookeeper_client as zk;

const CHROOT: &str = "/secured";

async fn anonymous(zk: &Zk) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .connect(&zk.address())
        .await
        .expect("connect without credentials")
}

/// The record's bytes and the session that owns it, once it exists.
async fn record(zk: &Zk, path: &str) -> (NodeRecord, i64) {
    let path = path.to_string();
    eventually("the record is readable without credentials", || {
        let path = path.clone();
        async move {
            let c = anonymous(zk).await;
            let (data, stat) = c.get_data(&path).await.ok()?;
            let r = NodeRecord::from_json(&data, "node-a").ok()?;
            Some((r, stat.ephemeral_owner))
        }
    })
    .await
}

#[tokio::test]
async fn records_are_writable_by_the_agents_identity_only() {
    let mut zk = Zk::start().await;
    let dir = tempfile_dir();
    let auth = dir.join("zk-auth");
    std::fs::write(&auth, "infermesh:s3cret-for-tests\n").unwrap();
    let _agent = Agent::builder()
        .config(format!(
            "node_id = \"node-a\"\n[registry]\nurl = \"{}\"\nservice = \"acl\"\n\
             session_timeout = \"2s\"\nauth_file = \"{}\"\n[[workers]]\ncommand = \"{}\"\n",
            zk.url(CHROOT),
            auth.display(),
            testworker("")
        ))
        .start()
        .await;
    let path = format!("{CHROOT}{}", node_path("acl", "node-a"));
    let (rec, owner) = record(&zk, &path).await;
    assert_eq!(rec.node_id, "node-a");

    let c = anonymous(&zk).await;
    let set = c.set_data(&path, b"{}", None).await;
    assert!(matches!(set, Err(zk::Error::NoAuth)), "set_data: {set:?}");
    let del = c.delete(&path, None).await;
    assert!(matches!(del, Err(zk::Error::NoAuth)), "delete: {del:?}");
    let fake = format!("{CHROOT}{}/node-fake", nodes_path("acl"));
    let create = c
        .create(
            &fake,
            b"{}",
            &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    assert!(
        matches!(create, Err(zk::Error::NoAuth)),
        "a fake node beside it: {create:?}"
    );

    // ZooKeeper down past the session timeout: the session expires, and the
    // agent registers again, still protected.
    zk.kill();
    tokio::time::sleep(Duration::from_secs(5)).await; // > session_timeout: the session must expire
    zk.restart().await;
    let new_owner = eventually("the agent registers again in a new session", || {
        let path = path.clone();
        let zk = &zk;
        async move {
            let (_, o) = record(zk, &path).await;
            (o != owner).then_some(o)
        }
    })
    .await;
    assert_ne!(new_owner, owner);
    let c = anonymous(&zk).await;
    let set = c.set_data(&path, b"{}", None).await;
    assert!(
        matches!(set, Err(zk::Error::NoAuth)),
        "after re-registration: {set:?}"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("infermesh-acl-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
