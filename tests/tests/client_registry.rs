//! The client library against real agents and a real ZooKeeper: it discovers
//! agents and spreads requests over them, stops sending to a draining agent,
//! rides out a SIGKILLed agent without failed requests, keeps serving from its
//! cache through a ZooKeeper outage, and fails fast when no node exists.

use std::collections::HashMap;

use infermesh_client::discovery::Source;
use infermesh_client::{Client, ClientError};
use infermesh_proto::registry::NodeState;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, dense, eventually, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn agent(zk: &Zk, node: &str, worker_flags: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"eta\"\nsession_timeout = \"2s\"\n\
             [[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker(worker_flags)
        ))
        .spawn()
}

async fn client(zk: &Zk) -> Client {
    Client::builder()
        .registry(zk.url("/im"))
        .service("eta")
        .seed(7)
        .build()
        .await
        .unwrap()
}

async fn wait_nodes(client: &Client, n: usize) {
    eventually("client sees the nodes", || async {
        let m = client.membership();
        (m.nodes.len() == n && m.nodes.iter().all(|r| r.state == NodeState::Serving)).then_some(())
    })
    .await;
}

/// Sends `n` requests and counts answers per node; every answer is checked.
async fn spread(client: &Client, n: usize) -> HashMap<String, usize> {
    let input = dense::input(2, 3);
    let mut per_node = HashMap::new();
    for i in 0..n {
        let node = infer_checked(client, &input, i).await;
        *per_node.entry(node).or_default() += 1;
    }
    per_node
}

/// Sends request `i` with `input`, checks its answer and returns the node
/// that gave it.
async fn infer_checked(client: &Client, input: &[f32], i: usize) -> String {
    let (resp, node) = client
        .infer_on(dense::request(input, true))
        .await
        .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
    assert_eq!(dense::output(&resp).0, dense::forward(input));
    node
}

/// Sends `n` requests at once and counts answers per node; every answer is
/// checked.
async fn spread_at_once(client: &Client, n: usize) -> HashMap<String, usize> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let client = client.clone();
        tasks.spawn(async move { infer_checked(&client, &dense::input(2, i as u32), i).await });
    }
    let mut per_node = HashMap::new();
    while let Some(node) = tasks.join_next().await {
        *per_node.entry(node.unwrap()).or_default() += 1;
    }
    per_node
}

#[tokio::test]
async fn discovers_agents_and_spreads_requests() {
    let zk = Zk::start().await;
    let (a, b) = (agent(&zk, "node-a", ""), agent(&zk, "node-b", ""));
    a.wait_ready().await;
    b.wait_ready().await;
    let client = client(&zk).await;
    wait_nodes(&client, 2).await;
    // Sent at once: the balancer counts a node's requests in flight from the
    // moment it picks it, so the second pick goes to the other node while
    // the first is unanswered. (Requests sent one after another may all go
    // to the node that answered first: p2c prefers the lower latency
    // estimate, and a node not yet asked starts at `default_rtt`, which a
    // loopback answer undercuts.)
    let per_node = spread_at_once(&client, 60).await;
    assert_eq!(per_node.len(), 2, "both nodes get traffic: {per_node:?}");
    let y = client
        .infer_f32("dense", "INPUT0", &[1, 16], &dense::input(1, 9))
        .await
        .unwrap();
    assert_eq!(y, dense::forward(&dense::input(1, 9)));
}

#[tokio::test]
async fn draining_node_gets_no_new_requests() {
    let zk = Zk::start().await;
    let slow = agent(&zk, "node-slow", "--service-time-ms 2000");
    let fast = agent(&zk, "node-fast", "");
    slow.wait_ready().await;
    fast.wait_ready().await;
    let client = client(&zk).await;
    wait_nodes(&client, 2).await;
    // Hold the slow agent in its draining phase with a request in flight.
    let mut direct = slow.client().await;
    let held = tokio::spawn(async move {
        direct
            .model_infer(dense::request(&dense::input(1, 0), true))
            .await
    });
    eventually("request in flight", || async {
        (slow.status().await.in_flight == 1).then_some(())
    })
    .await;
    kill(Pid::from_raw(slow.pid() as i32), Signal::SIGTERM).unwrap();
    eventually("the client sees node-slow draining", || async {
        let m = client.membership();
        m.nodes
            .iter()
            .any(|r| r.node_id == "node-slow" && r.state == NodeState::Draining)
            .then_some(())
    })
    .await;
    let per_node = spread(&client, 20).await;
    assert_eq!(
        per_node.get("node-slow"),
        None,
        "no new request to a draining node: {per_node:?}"
    );
    assert!(
        held.await.unwrap().is_ok(),
        "the draining node finishes what it had"
    );
}

#[tokio::test]
async fn sigkilled_agent_costs_no_failed_request_and_leaves_membership() {
    let zk = Zk::start().await;
    let mut a = agent(&zk, "node-a", "");
    let b = agent(&zk, "node-b", "");
    a.wait_ready().await;
    b.wait_ready().await;
    let client = client(&zk).await;
    wait_nodes(&client, 2).await;
    spread(&client, 20).await;
    a.kill();
    // Requests keep succeeding: a connection error is retried on node-b and
    // node-a is ejected long before its session times out.
    let per_node = spread(&client, 50).await;
    assert_eq!(per_node.get("node-a"), None, "{per_node:?}");
    eventually(
        "node-a leaves membership after its session timeout",
        || async {
            let m = client.membership();
            (m.nodes.len() == 1 && m.nodes[0].node_id == "node-b").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn zookeeper_outage_is_served_from_cache() {
    let mut zk = Zk::start().await;
    let (a, b) = (agent(&zk, "node-a", ""), agent(&zk, "node-b", ""));
    a.wait_ready().await;
    b.wait_ready().await;
    let client = client(&zk).await;
    wait_nodes(&client, 2).await;
    zk.kill();
    eventually("the client notices the outage", || async {
        (client.membership().source == Source::Cached).then_some(())
    })
    .await;
    assert_eq!(client.membership().nodes.len(), 2, "cached membership kept");
    // Both cached nodes still serve. Which one the balancer prefers depends
    // on their latency estimates (a slow first answer on a loaded machine
    // keeps a node costlier for a while), so keep sending until both have
    // answered; every request must succeed meanwhile.
    let served = std::sync::Arc::new(std::sync::Mutex::new(HashMap::<String, usize>::new()));
    eventually("both cached nodes serve requests", || {
        let (client, served) = (client.clone(), served.clone());
        async move {
            let batch = spread(&client, 10).await;
            let mut served = served.lock().unwrap();
            for (node, n) in batch {
                *served.entry(node).or_default() += n;
            }
            (served.len() == 2).then_some(())
        }
    })
    .await;
    zk.restart().await;
    eventually("membership live again with both agents", || async {
        let m = client.membership();
        (m.source == Source::Live && m.nodes.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn static_registry_and_fail_fast() {
    let a = Agent::builder().worker(testworker("")).start().await;
    let client = Client::builder()
        .registry(format!("static://{}", a.oip))
        .build()
        .await
        .unwrap();
    assert_eq!(spread(&client, 5).await.len(), 1);

    let zk = Zk::start().await;
    let empty = Client::builder()
        .registry(zk.url("/im"))
        .service("nobody")
        .build()
        .await
        .unwrap();
    match empty.infer(dense::request(&dense::input(1, 0), true)).await {
        Err(ClientError::NoNode { service, .. }) => assert_eq!(service, "nobody"),
        other => panic!("expected NoNode, got {other:?}"),
    }
    assert!(
        Client::builder()
            .registry("zk://nohost")
            .build()
            .await
            .is_err(),
        "bad URL is refused"
    );
}

/// Finding (issue 27): with nothing listening at the registry, a call said
/// "no node registered for the service". It now says the registry is
/// unreachable, and names it.
#[tokio::test]
async fn an_unreachable_registry_is_named() {
    let [port] = infermesh_tests::free_ports();
    let registry = format!("zk://127.0.0.1:{port}/im");
    let client = Client::builder()
        .registry(registry.clone())
        .deadline(std::time::Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let err = client
        .infer(dense::request(&dense::input(1, 0), true))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::RegistryUnreachable { .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let text = err.to_string();
    assert!(
        text.contains(&format!("registry {registry} is unreachable")),
        "{text}"
    );
}
