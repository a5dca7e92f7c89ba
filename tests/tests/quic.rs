//! The QUIC rung (issue 13) with a real agent, a real ZooKeeper and the
//! client library: requests take QUIC (mTLS, the agent's certificate) when
//! both ends offer it; a node whose advertised QUIC port is blocked (a UDP
//! socket that never answers) or closed is served over gRPC without a
//! failed request, and the ladder's counters show the fallback.

use std::time::Duration;

use infermesh_client::{BalancerConfig, Client, PathsConfig};
use infermesh_proto::registry::{NodeRecord, NodeState, node_path};
use infermesh_tests::certs::Pki;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, dense, eventually, testworker};
use infermesh_tls::{ClientTls, TlsConnector};
use infermesh_transport::Path;
use zookeeper_client as zk;

/// Starts an agent with TLS, client certificates and the QUIC rung, and a
/// client with the certificate of an allowed client preferring QUIC.
async fn setup(zk: &Zk, test: &str) -> (Agent, Client, zk::Client, NodeRecord, ClientTls) {
    let dir = std::env::temp_dir().join(format!("infermesh-quic-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pki = Pki::new(&dir, "fleet");
    let server = pki.server("agent", &["127.0.0.1"], 1);
    let trainer = pki.client("trainer", &["trainer.test"], 2);
    let ca = pki.ca_file("fleet");
    let agent = Agent::builder()
        .config(format!(
            "node_id = \"quic-a\"\n[registry]\nurl = \"{}\"\nservice = \"q\"\nsession_timeout = \"2s\"\n\
             [transport]\nquic = \"on\"\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallow_clients = [\"trainer.test\"]\n\
             [[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            server.cert.display(),
            server.key.display(),
            ca.display(),
            testworker("")
        ))
        .spawn();
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = ClientTls::from_pem(
        &read(&ca),
        Some((&read(&trainer.cert), &read(&trainer.key))),
    )
    .unwrap();
    // Slow start off: the dead-port nodes join after the real one and
    // must get requests at once, not after the ramp (the fallback test
    // sends its requests within a fraction of the ramp on a quiet machine).
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("q")
        .seed(3)
        .balancer(BalancerConfig {
            slow_start: Duration::ZERO,
            ..Default::default()
        })
        .tls(tls.clone())
        .transports(PathsConfig {
            prefer: vec![Path::Quic, Path::Grpc],
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    let zk = zk::Client::connect(&format!("{}/im", zk.address()))
        .await
        .unwrap();
    let record = eventually("the agent's record, serving", || async {
        let (data, _) = zk.get_data(&node_path("q", "quic-a")).await.ok()?;
        let r = NodeRecord::from_json(&data, "quic-a").ok()?;
        (r.state == NodeState::Serving && r.models.iter().any(|m| m.ready)).then_some(r)
    })
    .await;
    (agent, client, zk, record, tls)
}

async fn send(client: &Client, n: usize) {
    for i in 0..n {
        let input = dense::input(2, i as u32);
        let resp = client
            .infer(dense::request(&input, true))
            .await
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
}

#[tokio::test]
async fn requests_take_quic_when_both_ends_offer_it() {
    let zk = Zk::start().await;
    let (agent, client, _zk, record, tls) = setup(&zk, "used").await;
    assert!(record.endpoints.tls);
    let quic = record.endpoints.quic.as_deref().expect("QUIC advertised");
    assert_eq!(
        quic.parse::<std::net::SocketAddr>().unwrap().ip(),
        record.grpc_addr().ip()
    );
    eventually("the client sees the node", || async {
        (client.membership().nodes.len() == 1).then_some(())
    })
    .await;
    send(&client, 47).await;
    // 256 KiB: the request arrives in many QUIC chunks, which go on to the
    // worker as they came (issue 27).
    for i in 0..3 {
        let input = dense::input(4096, i);
        let resp = client.infer(dense::request(&input, true)).await.unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let c = client.path_counters();
    assert_eq!(c.get(Path::Quic).successes, 50, "{c:?}");
    assert_eq!(c.get(Path::Quic).failures, 0, "{c:?}");
    assert_eq!(c.get(Path::Grpc).attempts, 0, "{c:?}");
    // The load report came back on QUIC too: the node's stats saw answers.
    let stats = client.node_stats();
    assert_eq!(stats["quic-a"].failures, 0);
    // An error status comes back on QUIC as the agent answered it, for a
    // request of one chunk and of many.
    for rows in [1, 4096] {
        let mut bad = dense::request(&dense::input(rows, 1), true);
        bad.inputs[0].shape = vec![rows as i64, 15];
        match client.infer(bad).await {
            Err(infermesh_client::ClientError::Status(s)) => {
                assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
            }
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }
    let c = client.path_counters();
    assert_eq!(c.get(Path::Grpc).attempts, 0, "{c:?}");
    // The agent counts them as QUIC (the rejected one never reached a
    // worker).
    let metrics = metrics_over_tls(&agent, &tls).await;
    for (path, n) in [("quic", 50), ("grpc", 0)] {
        let line = format!("infermesh_transport_requests_total{{path=\"{path}\"}} {n}\n");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

/// The agent's `/metrics` over its TLS admin port (HTTP/2, the client's
/// certificate).
async fn metrics_over_tls(agent: &Agent, tls: &ClientTls) -> String {
    let io = TlsConnector::new(tls, None)
        .connect("127.0.0.1", agent.admin.port())
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://127.0.0.1:{}/metrics", agent.admin.port()))
        .body(())
        .unwrap();
    let (resp, _) = send.ready().await.unwrap().send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    let mut body = resp.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    String::from_utf8(text).unwrap()
}

#[tokio::test]
async fn blocked_or_closed_quic_ports_fall_back_to_grpc_without_failures() {
    let zk = Zk::start().await;
    let (_agent, client, zk_client, record, _) = setup(&zk, "fallback").await;
    // Two more nodes with the real agent's gRPC endpoint but a QUIC port
    // that never answers (a bound UDP socket that reads nothing) and one
    // that is closed.
    let blackhole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let closed = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for (id, quic) in [
        ("blocked", blackhole.local_addr().unwrap()),
        ("closed", closed),
    ] {
        let mut r = record.clone();
        r.node_id = id.into();
        r.endpoints.quic = Some(quic.to_string());
        zk_client
            .create(&node_path("q", id), &r.to_json(), &persistent)
            .await
            .unwrap();
    }
    eventually("the client sees three nodes", || async {
        (client.membership().nodes.len() == 3).then_some(())
    })
    .await;
    // The balancer takes the new nodes from membership on a task of its
    // own, so requests go on until both dead nodes were tried (before, a
    // fixed 60 could all leave before it had them).
    let mut sent = 0;
    eventually("both dead QUIC ports tried", || {
        sent += 1;
        let client = &client;
        let i = sent;
        async move {
            let input = dense::input(2, i);
            let resp = client.infer(dense::request(&input, true)).await.unwrap();
            assert_eq!(dense::output(&resp).0, dense::forward(&input));
            (client.path_counters().get(Path::Quic).fallbacks >= 2).then_some(())
        }
    })
    .await;
    let c = client.path_counters();
    let (q, g) = (c.get(Path::Quic), c.get(Path::Grpc));
    assert!(q.successes > 0, "the real node's QUIC works: {c:?}");
    assert!(q.fallbacks >= 2, "both dead QUIC ports fell back: {c:?}");
    assert_eq!(q.failures, q.fallbacks, "{c:?}");
    assert!(
        g.successes >= 2,
        "the fallbacks were served over gRPC: {c:?}"
    );
    assert_eq!(g.failures, 0, "{c:?}");
    // Broken paths are skipped until re-probed: at most one failed QUIC
    // attempt per dead node in this run.
    assert!(q.failures <= 2, "{c:?}");
    drop(blackhole);
}
