//! TLS and mTLS on the agent's ports (issue 13) with real peers:
//! `tritonclient` (gRPC `ssl=True`, HTTP over https) through an agent that
//! requires client certificates; plaintext, certificate-less, unlisted and
//! wrongly-trusting clients refused; a certificate rotated on disk picked up
//! for new connections while the client library keeps sending through the
//! registry (0 failures); the ops CLI (`nodes`, `health`, `drain`) over TLS;
//! bad certificate files refused at startup (exit 78) and by
//! `--check-config`. Certificates are made by the test (`rcgen`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use infermesh_client::{Client, ClientError};
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::admin::StatusRequest;
use infermesh_proto::admin::admin_client::AdminClient;
use infermesh_proto::channel::oip_channel_tls;
use infermesh_proto::inference::ServerReadyRequest;
use infermesh_proto::registry::NodeState;
use infermesh_tests::certs::{Issued, Pki};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, Load, bin, dense, eventually, free_port, http_get, testworker};
use infermesh_tls::{ClientTls, TlsConnector};
use serde_json::Value;
use tonic::transport::Channel;

/// A scratch directory for one test's certificates.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infermesh-tls-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A CA, the agent's certificate (IP SAN 127.0.0.1) and two client
/// certificates: `trainer.test` (allowed) and `intruder.test` (signed by
/// the same CA, not on the allow-list).
struct Certs {
    pki: Pki,
    ca: PathBuf,
    server: Issued,
    trainer: Issued,
    intruder: Issued,
}

fn certs(dir: &Path) -> Certs {
    let pki = Pki::new(dir, "fleet");
    Certs {
        ca: pki.ca_file("fleet"),
        server: pki.server("agent", &["127.0.0.1", "localhost"], 1),
        trainer: pki.client("trainer", &["trainer.test"], 2),
        intruder: pki.client("intruder", &["intruder.test"], 3),
        pki,
    }
}

fn client_tls(ca: &Path, id: Option<&Issued>) -> ClientTls {
    let read = |p: &Path| std::fs::read(p).unwrap();
    let id = id.map(|i| (read(&i.cert), read(&i.key)));
    ClientTls::from_pem(
        &read(ca),
        id.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
    )
    .unwrap()
}

/// `[tls]` of an agent with these certificates; `mtls` adds the client CA
/// and the allow-list.
fn tls_section(c: &Certs, mtls: bool) -> String {
    let mut s = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\nreload_interval = \"200ms\"\n",
        path(&c.server.cert),
        path(&c.server.key)
    );
    if mtls {
        s += &format!(
            "client_ca = \"{}\"\nallow_clients = [\"trainer.test\"]\n",
            path(&c.ca)
        );
    }
    s
}

fn tls_channel(addr: &str, tls: &ClientTls) -> Channel {
    oip_channel_tls(addr, std::time::Duration::from_secs(5), Some(tls), None).unwrap()
}

/// The error and its sources, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out = format!("{out}: {s}");
        source = s.source();
    }
    out
}

async fn server_ready(ch: Channel) -> Result<bool, String> {
    GrpcInferenceServiceClient::new(ch)
        .server_ready(ServerReadyRequest {})
        .await
        .map(|r| r.into_inner().ready)
        .map_err(|s| chain(&s))
}

/// Waits until the TLS agent answers ready with all `workers` ready, as
/// the harness's `wait_ready` does in plaintext.
async fn wait_ready_tls(agent: &Agent, tls: &ClientTls, workers: usize) {
    let (oip, admin) = (agent.oip.to_string(), agent.admin.to_string());
    eventually("TLS agent and its workers ready", || async {
        let ready = server_ready(tls_channel(&oip, tls)).await.ok()?;
        let status = AdminClient::new(tls_channel(&admin, tls))
            .status(StatusRequest {})
            .await
            .ok()?
            .into_inner();
        let all =
            status.workers.len() == workers && status.workers.iter().all(|w| w.state == "ready");
        (ready && all).then_some(())
    })
    .await;
}

#[tokio::test]
async fn mtls_refuses_plaintext_anonymous_unlisted_and_untrusting_clients() {
    let dir = scratch("refusals");
    let c = certs(&dir);
    let probes = format!("127.0.0.1:{}", free_port());
    let agent = Agent::builder()
        .config(format!(
            "{}probe_listen = \"{probes}\"\n[[workers]]\ncommand = \"{}\"\n",
            tls_section(&c, true),
            testworker("")
        ))
        .spawn();
    let trainer = client_tls(&c.ca, Some(&c.trainer));
    wait_ready_tls(&agent, &trainer, 1).await;
    let oip = agent.oip.to_string();

    // The allowed client infers, and the answer is right.
    let input = dense::input(2, 5);
    let resp = GrpcInferenceServiceClient::new(tls_channel(&oip, &trainer))
        .model_infer(dense::request(&input, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dense::output(&resp).0, dense::forward(&input));

    // Plaintext HTTP/2 to a TLS port: no answer.
    let plain =
        infermesh_proto::channel::oip_channel(&oip, std::time::Duration::from_secs(5)).unwrap();
    let err = server_ready(plain).await.unwrap_err();
    assert!(err.contains("transport error"), "{err}");

    // TLS without a client certificate: the agent requires one.
    let anonymous = client_tls(&c.ca, None);
    let err = server_ready(tls_channel(&oip, &anonymous))
        .await
        .unwrap_err();
    assert!(err.contains("CertificateRequired"), "{err}");

    // A certificate the CA signed for a name not on the allow-list: refused
    // on the data plane, accepted on the admin port.
    let intruder = client_tls(&c.ca, Some(&c.intruder));
    let err = server_ready(tls_channel(&oip, &intruder))
        .await
        .unwrap_err();
    assert!(err.contains("alert"), "{err}");
    let status = AdminClient::new(tls_channel(&agent.admin.to_string(), &intruder))
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.workers.len(), 1);

    // Kubernetes probes: plaintext /livez and /readyz on probe_listen, and
    // nothing else there.
    assert!(
        http_get(&probes, "/livez")
            .await
            .starts_with("HTTP/1.0 200")
    );
    assert!(
        http_get(&probes, "/readyz")
            .await
            .starts_with("HTTP/1.0 200")
    );
    assert!(
        http_get(&probes, "/metrics")
            .await
            .starts_with("HTTP/1.0 404")
    );

    // A client trusting another CA refuses the agent.
    let other = Pki::new(&dir, "other");
    let stranger = client_tls(&other.ca_file("other"), Some(&c.trainer));
    let err = server_ready(tls_channel(&oip, &stranger))
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // A certificate for another address: refused by its name.
    let elsewhere = c.pki.server("elsewhere", &["10.9.9.9"], 9);
    drop(agent);
    let agent = Agent::builder()
        .config(format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\n[[workers]]\ncommand = \"{}\"\n",
            path(&elsewhere.cert),
            path(&elsewhere.key),
            testworker("")
        ))
        .spawn();
    let err = eventually("the agent to answer the handshake", || async {
        let e = server_ready(tls_channel(&agent.oip.to_string(), &anonymous))
            .await
            .unwrap_err();
        (!e.contains("Connection refused")).then_some(e)
    })
    .await;
    assert!(err.contains("NotValidForName"), "{err}");
}

#[tokio::test]
async fn tritonclient_over_mtls() {
    let dir = scratch("tritonclient");
    let c = certs(&dir);
    let http = format!("127.0.0.1:{}", free_port());
    let agent = Agent::builder()
        .config(format!(
            "http_listen = \"{http}\"\n{}\n[[workers]]\ncommand = \"{}\"\n",
            tls_section(&c, true),
            testworker("")
        ))
        .spawn();
    wait_ready_tls(&agent, &client_tls(&c.ca, Some(&c.trainer)), 1).await;
    let stdout = infermesh_tests::py::run_script(
        "triton_tls.py",
        &[
            agent.oip.to_string(),
            http,
            path(&c.ca),
            path(&c.trainer.cert),
            path(&c.trainer.key),
        ],
    )
    .await;
    for line in [
        "grpc over mTLS OK",
        "grpc without a client certificate refused",
        "http over mTLS OK",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

fn registry_agent(zk: &Zk, node: &str, tls: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"sec\"\nsession_timeout = \"2s\"\n\
             {tls}\n[[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker("")
        ))
        .spawn()
}

async fn wait_serving(client: &Client) {
    eventually("the client sees the node serving", || async {
        let m = client.membership();
        (m.nodes.len() == 1 && m.nodes[0].state == NodeState::Serving && m.nodes[0].endpoints.tls)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn rotated_certificate_is_picked_up_while_the_client_library_keeps_sending() {
    let dir = scratch("rotation");
    let c = certs(&dir);
    let zk = Zk::start().await;
    let agent = registry_agent(&zk, "sec-a", &tls_section(&c, true));
    let trainer = client_tls(&c.ca, Some(&c.trainer));
    wait_ready_tls(&agent, &trainer, 1).await;

    // Without TLS settings the client skips the node: no plaintext attempt.
    let bare = Client::builder()
        .registry(zk.url("/im"))
        .service("sec")
        .build()
        .await
        .unwrap();
    wait_serving(&bare).await;
    let input = dense::input(1, 1);
    match bare.infer(dense::request(&input, true)).await {
        Err(ClientError::NoNode { .. }) => {}
        other => panic!("expected NoNode, got {other:?}"),
    }

    let client = Client::builder()
        .registry(zk.url("/im"))
        .service("sec")
        .tls(trainer.clone())
        .build()
        .await
        .unwrap();
    wait_serving(&client).await;
    let load = Load::start(&client, 2, 2, |i| dense::request(i, true));
    eventually("requests flowing", || async {
        (load.sent() >= 20).then_some(())
    })
    .await;

    let first = presented(&agent, &trainer).await;
    assert_eq!(
        first, c.server.der,
        "the agent presents the first certificate"
    );
    let rotated = c.pki.server("agent", &["127.0.0.1", "localhost"], 77);
    assert_ne!(rotated.der, c.server.der);
    eventually("the agent logs the reload", || async {
        agent
            .log_text()
            .contains("TLS certificate reloaded")
            .then_some(())
    })
    .await;
    assert_eq!(
        presented(&agent, &trainer).await,
        rotated.der,
        "a new connection gets the rotated certificate (serial 77)"
    );
    let sent_at_reload = load.sent();
    eventually("requests after the reload", || async {
        (load.sent() >= sent_at_reload + 20).then_some(())
    })
    .await;
    assert_eq!(
        load.stop().await,
        0,
        "no request failed across the rotation"
    );
}

/// The certificate the agent presents to a new connection.
async fn presented(agent: &Agent, tls: &ClientTls) -> Vec<u8> {
    let stream = TlsConnector::new(tls, None)
        .connect("127.0.0.1", agent.oip.port())
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Runs `infermesh ARGS...` without the environment's registry and TLS.
async fn cli(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(bin("infermesh"))
            .args(&args)
            .env_remove("INFERMESH_TOKEN_FILE") // earlier spelling: still read
            .env_remove("INFERMESH_ADMIN_TOKEN_FILE")
            .env_remove("INFERMESH_REGISTRY")
            .env_remove("INFERMESH_TLS_CA")
            .env_remove("INFERMESH_TLS_CERT")
            .env_remove("INFERMESH_TLS_KEY")
            .output()
            .expect("run infermesh")
    })
    .await
    .unwrap()
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

#[tokio::test]
async fn ops_cli_over_tls() {
    let dir = scratch("cli");
    let c = certs(&dir);
    let zk = Zk::start().await;
    let agent = registry_agent(&zk, "sec-cli", &tls_section(&c, true));
    wait_ready_tls(&agent, &client_tls(&c.ca, Some(&c.trainer)), 1).await;
    let registry = zk.url("/im");
    let base = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend(
            ["--registry", &registry, "--service", "sec", "--json"]
                .iter()
                .map(|s| s.to_string()),
        );
        v
    };
    let with_tls = |mut v: Vec<String>| -> Vec<String> {
        v.extend([
            "--tls-ca".into(),
            path(&c.ca),
            "--tls-cert".into(),
            path(&c.intruder.cert),
            "--tls-key".into(),
            path(&c.intruder.key),
        ]);
        v
    };
    eventually("the node in the registry", || async {
        let out = cli(with_tls(base(&["nodes"]))).await;
        let doc = json_of(&out);
        (doc["nodes"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await;

    // `nodes` reads each agent's load over TLS (the admin port accepts any
    // certificate the CA signed).
    let out = cli(with_tls(base(&["nodes"]))).await;
    assert!(out.status.success(), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["nodes"][0]["inflight"], 0, "{doc}");

    // Without the CA: a clear configuration error, no plaintext attempt.
    let out = cli(base(&["status", "sec-cli"])).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("serves TLS: give --tls-ca"),
        "{out:?}"
    );

    let token = path(&agent.token_file);
    let mut health = with_tls(base(&["health", "sec-cli"]));
    health.extend(["--admin-token-file".into(), token.clone()]);
    let out = cli(health).await;
    assert!(out.status.success(), "{out:?}");

    let mut drain = with_tls(base(&["drain", "sec-cli"]));
    drain.extend(["--admin-token-file".into(), token]);
    let out = cli(drain).await;
    assert!(out.status.success(), "{out:?}");
    let out = cli(with_tls(base(&["nodes"]))).await;
    assert_eq!(json_of(&out)["nodes"][0]["state"], "draining");
}

#[tokio::test]
async fn bad_certificate_files_are_configuration_errors() {
    let dir = scratch("bad-files");
    let c = certs(&dir);
    let run = |extra: Vec<String>| async move {
        let mut args: Vec<String> = [
            "agent",
            "--check-config",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--worker",
            "true {port}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra);
        cli(args).await
    };
    // The key of another certificate.
    let out = run(vec![
        "--tls-cert".into(),
        path(&c.server.cert),
        "--tls-key".into(),
        path(&c.trainer.key),
    ])
    .await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the key does not go with the certificate"),
        "{out:?}"
    );
    // A missing file, and a key without its certificate.
    let out = run(vec![
        "--tls-cert".into(),
        path(&dir.join("missing.pem")),
        "--tls-key".into(),
        path(&c.server.key),
    ])
    .await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tls.cert: cannot read"),
        "{out:?}"
    );
    let out = run(vec!["--tls-key".into(), path(&c.server.key)]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    // A good pair with mTLS passes.
    let out = run(vec![
        "--tls-cert".into(),
        path(&c.server.cert),
        "--tls-key".into(),
        path(&c.server.key),
        "--tls-client-ca".into(),
        path(&c.ca),
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("TLS with client certificates"),
        "{out:?}"
    );
}

/// The client CA file (mTLS) is re-read like the certificate: after a CA
/// rotation on disk, clients of the new CA get in and clients of the old one
/// are refused, without restarting the agent.
#[tokio::test]
async fn a_rotated_client_ca_is_picked_up() {
    let dir = scratch("client-ca");
    let c = certs(&dir);
    let ca_file = dir.join("client-ca.pem");
    std::fs::copy(&c.ca, &ca_file).unwrap();
    let agent = Agent::builder()
        .config(format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\nreload_interval = \"200ms\"\nclient_ca = \"{}\"\n\
             [[workers]]\ncommand = \"{}\"\n",
            path(&c.server.cert),
            path(&c.server.key),
            path(&ca_file),
            testworker("")
        ))
        .spawn();
    let old = client_tls(&c.ca, Some(&c.trainer));
    wait_ready_tls(&agent, &old, 1).await;
    let oip = agent.oip.to_string();

    // A client of the next CA (trusting the agent's CA as before).
    let next = Pki::new(&dir, "next");
    let next_id = next.client("next-client", &["trainer.test"], 9);
    let new = client_tls(&c.ca, Some(&next_id));
    assert!(
        server_ready(tls_channel(&oip, &new)).await.is_err(),
        "not before the rotation"
    );

    std::fs::copy(next.ca_file("next"), &ca_file).unwrap();
    eventually("the new client CA in use", || async {
        server_ready(tls_channel(&oip, &new)).await.ok()
    })
    .await;
    let err = server_ready(tls_channel(&oip, &old)).await.unwrap_err();
    assert!(err.contains("alert"), "{err}");
}
