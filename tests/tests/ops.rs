//! The admin API and the ops CLI against real agents (and a real ZooKeeper
//! for the registry parts): mutating calls need the token, every command's
//! `--json` output parses, health checks gate readiness and restart workers
//! whose outputs go bad, and `drain --wait` under constant load through the
//! client library finishes with zero failed requests.

use std::path::Path;
use std::process::{Command, Output};

use infermesh_client::Client;
use infermesh_proto::admin::admin_client::AdminClient;
use infermesh_proto::admin::{
    DrainRequest, RestartWorkerRequest, RunHealthChecksRequest, StatusRequest, UndrainRequest,
};
use infermesh_proto::registry::NodeState;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, Load, bin, dense, eventually, testworker};
use serde_json::Value;

/// Runs `infermesh ARGS...` and returns its output (off the async runtime).
async fn cli(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(bin("infermesh"))
            .args(&args)
            .env_remove("INFERMESH_TOKEN_FILE") // earlier spelling: still read
            .env_remove("INFERMESH_ADMIN_TOKEN_FILE")
            .env_remove("INFERMESH_REGISTRY")
            .output()
            .expect("run infermesh")
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test]
async fn mutating_admin_calls_need_the_token() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let mut open = AdminClient::connect(format!("http://{}", agent.admin))
        .await
        .unwrap();
    // Status is read-only and open.
    assert_eq!(
        open.status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .workers
            .len(),
        1
    );
    fn code<T>(r: Result<T, tonic::Status>) -> tonic::Code {
        r.map(|_| ()).unwrap_err().code()
    }
    let unauth = tonic::Code::Unauthenticated;
    assert_eq!(code(open.drain(DrainRequest {}).await), unauth);
    assert_eq!(code(open.undrain(UndrainRequest {}).await), unauth);
    assert_eq!(
        code(
            open.restart_worker(RestartWorkerRequest {
                worker: "w0".into()
            })
            .await
        ),
        unauth
    );
    assert_eq!(
        code(
            open.run_health_checks(RunHealthChecksRequest::default())
                .await
        ),
        unauth
    );
    // A wrong token is refused the same way.
    let mut req = tonic::Request::new(DrainRequest {});
    req.metadata_mut()
        .insert("authorization", "Bearer not-the-token".parse().unwrap());
    assert_eq!(code(open.drain(req).await), unauth);
    // Nothing changed: the worker was not restarted and the node is not draining.
    let status = agent.status().await;
    assert_eq!(status.state, "serving");
    assert_eq!(status.workers[0].restarts, 0);

    // The CLI without a token: refused, exit 77 (EX_NOPERM), JSON says why.
    let admin = agent.admin.to_string();
    let out = cli(args(&["drain", "--admin", &admin, "--json"])).await;
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["ok"], false);
    assert!(doc["error"].as_str().unwrap().contains("token"), "{doc}");

    // With the token, the same calls work.
    let mut admin_client = agent.admin().await;
    admin_client.drain(DrainRequest {}).await.unwrap();
    assert_eq!(agent.status().await.state, "draining");
    admin_client.undrain(UndrainRequest {}).await.unwrap();
    assert_eq!(agent.status().await.state, "serving");
}

#[tokio::test]
async fn cli_status_restart_and_health_print_json() {
    let config = format!(
        "node_id = \"cli-node\"\n\
         [health]\ninterval = \"1h\"\n\
         [[health.checks]]\nkind = \"live\"\n\
         [[health.checks]]\nkind = \"finite\"\nmodel = \"dense\"\n\
         [[workers]]\nid = \"good\"\ncommand = \"{}\"\n\
         [[workers]]\nid = \"bad\"\ncommand = \"{}\"\n",
        testworker(""),
        // NaN from its 3rd request on: it passes the startup gate, then fails.
        testworker("--fault nan --fault-after 2"),
    );
    let agent = Agent::builder().config(config).start().await;
    let admin = agent.admin.to_string();
    let token = path(&agent.token_file);

    let out = cli(args(&["status", "--admin", &admin, "--json"])).await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["node_id"], "cli-node");
    assert_eq!(doc["workers"].as_array().unwrap().len(), 2);
    // The startup gate ran the checks: their verdicts are in the status.
    let good = &doc["workers"][0];
    assert_eq!(good["id"], "good");
    let checks: Vec<&str> = good["health"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["check"].as_str().unwrap())
        .collect();
    assert!(
        checks.contains(&"finite") && checks.contains(&"live"),
        "{good}"
    );

    // Make the bad worker compute NaN (requests 2.. of the worker).
    let mut client = agent.client().await;
    for _ in 0..2 {
        let mut req = dense::request(&dense::input(1, 1), true);
        req.model_name = "dense".into();
        let _ = client.model_infer(req).await;
    }
    // `health` runs the checks now: exit 1, the bad worker's finite check fails.
    let out = eventually("health reports the NaN worker", || {
        let (admin, token) = (admin.clone(), token.clone());
        async move {
            let out = cli(args(&[
                "health",
                "--admin",
                &admin,
                "--admin-token-file",
                &token,
                "--json",
            ]))
            .await;
            let doc = json_of(&out);
            let bad_fails = doc["results"]
                .as_array()?
                .iter()
                .any(|r| r["worker"] == "bad" && r["check"] == "finite" && r["pass"] == false);
            bad_fails.then_some((out, doc))
        }
    })
    .await;
    let (out, doc) = out;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(doc["ok"], false);
    let good_ok = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["worker"] == "good")
        .all(|r| r["pass"] == true);
    assert!(good_ok, "{doc}");

    let out = cli(args(&[
        "restart",
        "--admin",
        &admin,
        "--admin-token-file",
        &token,
        "good",
        "--json",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(json_of(&out)["restarting"], true);
    eventually("the good worker restarted", || async {
        let s = agent.status().await;
        (s.workers[0].restarts >= 1).then_some(())
    })
    .await;
    let out = cli(args(&[
        "restart",
        "--admin",
        &admin,
        "--admin-token-file",
        &token,
        "nope",
        "--json",
    ]))
    .await;
    assert_eq!(
        out.status.code(),
        Some(64),
        "unknown worker is a usage error: {out:?}"
    );
}

#[tokio::test]
async fn failed_health_checks_restart_the_worker() {
    let config = format!(
        "[health]\ninterval = \"100ms\"\njitter = \"0s\"\nfailures = 2\n\
         [[health.checks]]\nkind = \"finite\"\nmodel = \"dense\"\n\
         [[workers]]\nid = \"w0\"\ncommand = \"{}\"\n",
        // Passes the startup gate (request 1), then outputs NaN.
        testworker("--fault nan --fault-after 1"),
    );
    let agent = Agent::builder().config(config).start().await;
    let status = eventually("a health restart", || async {
        let s = agent.status().await;
        (s.workers[0].restarts >= 1).then_some(s)
    })
    .await;
    let w = &status.workers[0];
    assert!(
        w.last_fault.starts_with("health:"),
        "last fault: {}",
        w.last_fault
    );
    assert!(
        w.last_fault.contains("finite"),
        "last fault: {}",
        w.last_fault
    );
    let metrics = agent.metrics().await;
    assert!(
        metrics.contains("infermesh_worker_restarts_total{worker=\"w0\",reason=\"health\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("infermesh_health_checks_total"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failing_startup_check_keeps_the_worker_out_of_rotation() {
    let config = format!(
        "[[health.checks]]\nkind = \"finite\"\nmodel = \"dense\"\n\
         [[workers]]\nid = \"w0\"\ncommand = \"{}\"\n",
        testworker("--fault nan --fault-after 0"),
    );
    let agent = Agent::builder().config(config).spawn();
    let status = eventually("the startup check has run and failed", || async {
        let s = agent.try_status().await?;
        let w = s.workers.first()?;
        w.health
            .iter()
            .any(|h| h.check == "finite" && !h.pass)
            .then_some(s)
    })
    .await;
    let w = &status.workers[0];
    assert_eq!(w.state, "starting");
    assert!(!w.routable);
}

fn zk_agent(zk: &Zk, node: &str) -> Agent {
    service_agent(zk, node, "ops")
}

fn service_agent(zk: &Zk, node: &str, service: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"{service}\"\nsession_timeout = \"2s\"\n\
             [[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker("--service-time-ms 2")
        ))
        .spawn()
}

#[tokio::test]
async fn drain_under_load_loses_no_request_and_nodes_lists_it() {
    let zk = Zk::start().await;
    let (a, b) = (zk_agent(&zk, "node-a"), zk_agent(&zk, "node-b"));
    a.wait_ready().await;
    b.wait_ready().await;
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("ops")
        .seed(3)
        .build()
        .await
        .unwrap();
    eventually("client sees both nodes", || async {
        (client.membership().nodes.len() == 2).then_some(())
    })
    .await;
    let registry = zk.url("/im");
    let out = cli(args(&[
        "nodes",
        "--registry",
        &registry,
        "--service",
        "ops",
        "--json",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{doc}");
    assert_eq!(nodes[0]["id"], "node-a");
    assert_eq!(nodes[0]["state"], "serving");
    assert_eq!(nodes[0]["models"][0], "dense");
    assert_eq!(nodes[0]["inflight"], 0);

    // Constant load through the client library.
    let load = Load::start(&client, 4, 1, |x| dense::request(x, true));
    eventually("both nodes take load", || async {
        let s = client.node_stats();
        (s.get("node-a").is_some_and(|n| n.attempts > 10)
            && s.get("node-b").is_some_and(|n| n.attempts > 10))
        .then_some(())
    })
    .await;

    // `scale` reads both nodes' busy ratios under load and applies the rule.
    let out = cli(args(&[
        "scale",
        "--registry",
        &registry,
        "--service",
        "ops",
        "--json",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["serving"], 2, "{doc}");
    let busy = doc["busy_ratio"].as_f64().expect("both nodes answered");
    assert!(busy > 0.0 && busy <= 1.0, "{doc}");
    assert!(doc["recommended"].as_u64().is_some(), "{doc}");
    assert!(
        ["keep", "up", "down"].contains(&doc["advice"]["advice"].as_str().unwrap()),
        "{doc}"
    );
    let bad = cli(args(&[
        "scale",
        "--registry",
        &registry,
        "--min",
        "0.9",
        "--max",
        "0.8",
    ]))
    .await;
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");

    // Two services by priority under a budget of 2 GPUs (a node without
    // GPUs counts as one), each with a floor of 2: ops (priority 10, the two
    // loaded nodes) keeps its floor, batch (priority 1, one idle node) gives
    // its node way to ops.
    let mut batch = service_agent(&zk, "node-batch", "batch");
    batch.wait_ready().await;
    // Ready is not registered: `scale` reads the registry (without this
    // the batch service was seen with no node, once in four runs).
    eventually("the batch node is registered", || async {
        let out = cli(args(&[
            "nodes",
            "--registry",
            &registry,
            "--service",
            "batch",
            "--json",
        ]))
        .await;
        // Until then `nodes` may fail (no node): not JSON, not done.
        let doc: Value = serde_json::from_slice(&out.stdout).ok()?;
        doc["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 1)
            .then_some(())
    })
    .await;
    let priorities = [
        "scale",
        "--registry",
        &registry,
        "--priority",
        "ops=10",
        "--priority",
        "batch=1",
        "--gpu-budget",
        "2",
        "--min-nodes",
        "2",
    ];
    let out = cli(args(&[&priorities[..], &["--json"]].concat())).await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    let (ops, low) = (&doc["services"][0], &doc["services"][1]);
    assert_eq!(
        (&ops["service"], &low["service"]),
        (&"ops".into(), &"batch".into()),
        "{doc}"
    );
    assert_eq!(
        (&ops["serving"], &ops["gets"]),
        (&2.into(), &2.into()),
        "{doc}"
    );
    assert_eq!(
        (&low["serving"], &low["gets"]),
        (&1.into(), &0.into()),
        "{doc}"
    );
    assert_eq!(low["advice"]["advice"], "down", "{doc}");
    assert_eq!(low["gave_way"]["nodes"], 1, "{doc}");
    assert_eq!(low["gave_way"]["to"][0], "ops", "{doc}");
    assert_eq!(doc["granted_gpus"], 2, "{doc}");
    let out = cli(args(&priorities)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("scale DOWN to 0; GAVE WAY 1 node(s) to ops")
            && text.contains("GPU budget 2"),
        "{text}"
    );
    batch.terminate();

    let token = path(&a.token_file);
    let out = cli(args(&[
        "drain",
        "node-a",
        "--registry",
        &registry,
        "--service",
        "ops",
        "--admin-token-file",
        &token,
        "--wait",
        "--timeout",
        "60s",
        "--json",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["drained"], true, "{doc}");
    assert_eq!(doc["inflight"], 0);
    // Drained: the client no longer sends to node-a, and the registry says so.
    let attempts_a = client.node_stats()["node-a"].attempts;
    let before = load.sent();
    eventually("more load after the drain", || async {
        (load.sent() > before + 50).then_some(())
    })
    .await;
    assert_eq!(client.node_stats()["node-a"].attempts, attempts_a);
    assert!(
        client
            .nodes()
            .iter()
            .any(|n| n.node_id == "node-a" && n.state == NodeState::Draining)
    );
    assert_eq!(a.status().await.state, "draining");

    // Undrain: node-a takes requests again.
    let out = cli(args(&[
        "undrain",
        "node-a",
        "--registry",
        &registry,
        "--service",
        "ops",
        "--admin-token-file",
        &token,
        "--json",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    eventually("node-a takes load again", || async {
        (client.node_stats()["node-a"].attempts > attempts_a).then_some(())
    })
    .await;
    assert_eq!(load.stop().await, 0, "failed requests");
}
