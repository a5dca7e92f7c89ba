//! Issue 11, finding 7: on SIGTERM the agent marked itself draining and
//! exited within milliseconds, before clients had seen the record change,
//! so requests sent in that window failed. Now it advertises draining,
//! keeps serving for `drain_delay` (default 2 s, longer than the
//! registry's propagation), and only then stops accepting.

use infermesh_client::Client;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, Load, dense, eventually, testworker};

fn zk_agent(zk: &Zk, node: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"drain\"\n\
             session_timeout = \"2s\"\n[[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker("--service-time-ms 2")
        ))
        .spawn()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_one_of_three_agents_under_load_fails_no_request() {
    let zk = Zk::start().await;
    let mut agents: Vec<Agent> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| zk_agent(&zk, n))
        .collect();
    for a in &agents {
        a.wait_ready().await;
    }
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("drain")
        .seed(11)
        .build()
        .await
        .unwrap();
    eventually("the client sees the three nodes", || async {
        (client.membership().nodes.len() == 3).then_some(())
    })
    .await;
    let load = Load::start(&client, 6, 1, |x| dense::request(x, true));
    eventually("every node takes load", || async {
        let s = client.node_stats();
        ["node-a", "node-b", "node-c"]
            .iter()
            .all(|n| s.get(*n).is_some_and(|n| n.attempts > 20))
            .then_some(())
    })
    .await;

    let mut leaving = agents.remove(0);
    let status = tokio::task::spawn_blocking(move || {
        let status = leaving.terminate();
        (status, leaving)
    })
    .await
    .unwrap();
    let (status, leaving) = status;
    assert!(status.success(), "agent exits 0 after SIGTERM: {status}");
    let log = leaving.log_text();
    assert!(log.contains("draining"), "log says it drained");

    // The load goes on over the two others.
    let before = load.sent();
    eventually("load continues after the agent left", || async {
        (load.sent() > before + 100).then_some(())
    })
    .await;
    let failed = load.stop().await;
    assert_eq!(failed, 0, "requests failed across the SIGTERM");
    assert!(
        client
            .membership()
            .nodes
            .iter()
            .all(|n| n.node_id != "node-a"),
        "the stopped node left the registry"
    );
}
