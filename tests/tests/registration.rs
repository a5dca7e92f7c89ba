//! Agents advertise themselves in a real ZooKeeper: the record appears once
//! workers are ready, says `draining` while a SIGTERMed agent finishes its
//! requests and is gone after; a SIGKILLed agent's record disappears with its
//! session; an agent whose session expired registers again.

use infermesh_proto::registry::{NodeRecord, NodeState, node_path};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, eventually, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use zookeeper_client as zk;

fn agent_config(zk: &Zk, node: &str, extra_worker_flags: &str) -> String {
    format!(
        "node_id = \"{node}\"\nweight = 1.0\n[registry]\nurl = \"{}\"\nservice = \"eta\"\nzone = \"z1\"\nsession_timeout = \"2s\"\n\
         [[workers]]\ncommand = \"{}\"\n",
        zk.url("/infermesh"),
        testworker(extra_worker_flags)
    )
}

async fn client(zk: &Zk) -> zk::Client {
    zk::Client::connect(&format!("{}/infermesh", zk.address()))
        .await
        .unwrap()
}

async fn record(c: &zk::Client, node: &str) -> Option<NodeRecord> {
    let (data, _) = c.get_data(&node_path("eta", node)).await.ok()?;
    Some(NodeRecord::from_json(&data, node).expect("the agent writes valid records"))
}

#[tokio::test]
async fn record_appears_when_ready_and_drains_before_it_goes() {
    let zk = Zk::start().await;
    let mut agent = Agent::builder()
        .config(agent_config(&zk, "gpu-a", "--service-time-ms 300"))
        .start()
        .await;
    let c = client(&zk).await;
    let r = eventually("record written", || record(&c, "gpu-a")).await;
    assert_eq!(r.state, NodeState::Serving);
    assert_eq!(r.zone, "z1");
    assert_eq!(r.weight, 1.0);
    assert_eq!(r.endpoints.grpc, agent.oip.to_string());
    assert_eq!(r.endpoints.admin, agent.admin.to_string());
    assert!(r.models.iter().any(|m| m.name == "dense" && m.ready));

    // A request in flight keeps the agent draining for a moment after SIGTERM.
    let mut oip = agent.client().await;
    let call = tokio::spawn(async move {
        oip.model_infer(infermesh_tests::dense::request(
            &infermesh_tests::dense::input(1, 0),
            true,
        ))
        .await
    });
    eventually("request in flight", || async {
        (agent.status().await.in_flight == 1).then_some(())
    })
    .await;
    kill(Pid::from_raw(agent.pid() as i32), Signal::SIGTERM).unwrap();
    eventually("record says draining", || async {
        record(&c, "gpu-a")
            .await
            .filter(|r| r.state == NodeState::Draining)
            .map(|_| ())
    })
    .await;
    assert!(
        call.await.unwrap().is_ok(),
        "the in-flight request completes"
    );
    eventually("record deleted", || async {
        record(&c, "gpu-a").await.is_none().then_some(())
    })
    .await;
    let status = tokio::task::spawn_blocking(move || agent.terminate_wait())
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn sigkilled_agent_disappears_with_its_session() {
    let zk = Zk::start().await;
    let mut agent = Agent::builder()
        .config(agent_config(&zk, "gpu-b", ""))
        .start()
        .await;
    let c = client(&zk).await;
    eventually("record written", || record(&c, "gpu-b")).await;
    agent.kill();
    // Session timeout 2 s: the ephemeral node goes when the server expires it.
    eventually("record removed after the session timeout", || async {
        record(&c, "gpu-b").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn expired_session_registers_again() {
    let zk = Zk::start().await;
    let agent = Agent::builder()
        .config(agent_config(&zk, "gpu-c", ""))
        .start()
        .await;
    let c = client(&zk).await;
    let first = eventually("record written", || record(&c, "gpu-c")).await;
    // Freeze the agent past its session timeout: the server expires the session.
    let pid = Pid::from_raw(agent.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    eventually("record removed when the session expired", || async {
        record(&c, "gpu-c").await.is_none().then_some(())
    })
    .await;
    kill(pid, Signal::SIGCONT).unwrap();
    let again = eventually("record re-created with a new session", || {
        record(&c, "gpu-c")
    })
    .await;
    assert!(again.updated_ms > first.updated_ms);
    assert!(
        agent.log_text().contains("session lost"),
        "the agent says why it registered again"
    );
}

#[tokio::test]
async fn agent_registers_once_zookeeper_comes_back() {
    let mut zk = Zk::start().await;
    zk.kill();
    let agent = Agent::builder()
        .config(agent_config(&zk, "gpu-d", ""))
        .start()
        .await;
    eventually("the agent says ZooKeeper is unreachable", || async {
        agent
            .log_text()
            .contains("cannot reach ZooKeeper")
            .then_some(())
    })
    .await;
    zk.restart().await;
    let c = client(&zk).await;
    eventually("record written once ZooKeeper is up", || {
        record(&c, "gpu-d")
    })
    .await;
}
