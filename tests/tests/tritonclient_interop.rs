//! Interoperability with a client the project did not write: NVIDIA's
//! `tritonclient[grpc]` from PyPI, installed into a virtualenv this test
//! creates (`target/py-venv`, reused across runs), calls the agent for
//! ServerLive, ModelMetadata, ModelConfig and ModelInfer with numpy inputs
//! and checks the numbers; `grpcio-health-checking` checks `grpc.health.v1`
//! and the xds protos (`xds-protos`) decode the ORCA load report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use infermesh_tests::{Agent, bin_dir, free_port, testworker};

/// The venv's Python, created once per test binary: the tests run in
/// parallel and must not install into the same venv at once.
fn venv() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(make_venv).clone()
}

/// Creates the venv with tritonclient and numpy unless it is there already.
fn make_venv() -> PathBuf {
    let venv = bin_dir().parent().expect("target dir").join("py-venv");
    let python = venv.join("bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args([
                "-c",
                "import tritonclient.grpc, tritonclient.http, numpy, grpc_health.v1.health_pb2_grpc, xds.data.orca.v3, grpclib",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ready {
        let python3 = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(
            Command::new(python3).args(["-m", "venv"]).arg(&venv),
            "create venv",
        );
        run(
            Command::new(venv.join("bin/pip")).args([
                "install",
                "--quiet",
                "tritonclient[grpc,http]",
                "numpy",
                "grpcio-health-checking",
                "xds-protos",
                "grpclib",
            ]),
            "pip install tritonclient[grpc,http] numpy grpcio-health-checking xds-protos grpclib",
        );
    }
    python
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// Runs `tests/py/SCRIPT HOST:PORT` with the venv's Python and returns its
/// stdout, failing the test with its output if it fails.
async fn run_script(script: &str, agent: &Agent) -> String {
    run_script_at(script, &agent.oip.to_string()).await
}

/// [`run_script`] against any address.
async fn run_script_at(script: &str, address: &str) -> String {
    let python = tokio::task::spawn_blocking(venv).await.unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(script);
    let out = tokio::process::Command::new(python)
        .arg(&script)
        .arg(address)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    stdout
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
