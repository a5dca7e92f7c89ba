//! Interoperability with a client the project did not write: NVIDIA's
//! `tritonclient[grpc]` from PyPI, installed into a virtualenv this test
//! creates (`target/py-venv`, reused across runs), calls the agent for
//! ServerLive, ModelMetadata, ModelConfig and ModelInfer with numpy inputs
//! and checks the numbers; `grpcio-health-checking` checks `grpc.health.v1`
//! and the xds protos (`xds-protos`) decode the ORCA load report.

use infermesh_tests::{Agent, free_port, testworker};

/// Runs `tests/py/SCRIPT HOST:PORT` with the venv's Python and returns its
/// stdout, failing the test with its output if it fails.
async fn run_script(script: &str, agent: &Agent) -> String {
    run_script_at(script, &agent.oip.to_string()).await
}

/// [`run_script`] against any address.
async fn run_script_at(script: &str, address: &str) -> String {
    infermesh_tests::py::run_script(script, &[address.to_string()]).await
}

#[tokio::test]
async fn tritonclient_calls_the_agent() {
    let agent = Agent::builder()
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await;
    let stdout = run_script("triton_interop.py", &agent).await;
    assert!(stdout.contains("tritonclient interop OK"), "{stdout}");
}

/// Triton's shared-memory example flow with tritonclient's own shm utilities,
/// once with a worker that reads the client's regions itself (the agent
/// passes the region through) and once with one that cannot (the agent copies
/// the tensors inline).
#[tokio::test]
async fn tritonclient_shared_memory_flow() {
    for (worker, path) in [("", "shm_passthrough"), ("--no-shm", "shm_inline")] {
        let agent = Agent::builder().worker(testworker(worker)).start().await;
        let stdout = run_script("triton_shm.py", &agent).await;
        assert!(stdout.contains("shared-memory flow: OK"), "{stdout}");
        let metrics = agent.metrics().await;
        let line = format!("infermesh_transport_requests_total{{path=\"{path}\"}}");
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
}

/// `grpc.health.v1` with gRPC's own Python health client, as Kubernetes
/// gRPC probes, Envoy and grpc-health-probe speak it.
#[tokio::test]
async fn grpc_health_checking_client_sees_the_agent_serving() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let stdout = run_script("health_probe.py", &agent).await;
    assert!(stdout.contains("grpc health OK"), "{stdout}");
}

/// The ORCA load report (`endpoint-load-metrics-bin`) decoded with the xds
/// protos, as gRPC's and Envoy's weighted round robin read it.
#[tokio::test]
async fn the_orca_load_report_decodes_with_the_xds_protos() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let stdout = run_script("orca_report.py", &agent).await;
    assert!(stdout.contains("orca report OK"), "{stdout}");
}

/// KServe v2 HTTP/REST with `tritonclient.http`: binary and JSON tensors.
#[tokio::test]
async fn tritonclient_http_calls_the_agent() {
    let http = format!("127.0.0.1:{}", free_port());
    let agent = Agent::builder()
        .config(format!(
            "http_listen = \"{http}\"\n[[workers]]\ncommand = \"{}\"\n",
            testworker("")
        ))
        .start()
        .await;
    let stdout = run_script_at("triton_http.py", &http).await;
    assert!(stdout.contains("tritonclient.http OK"), "{stdout}");
    let metrics = agent.metrics().await;
    assert!(
        metrics.contains(r#"infermesh_requests_total{model="dense",code="Ok"} 3"#),
        "HTTP requests are served and counted like gRPC ones:\n{metrics}"
    );
}
