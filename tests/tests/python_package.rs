//! The Python package `infermesh` (issue 15), tested from Python: its pytest
//! suite in `python/tests/` runs against real agents with test workers and
//! a real ZooKeeper started here, whose addresses it gets in environment
//! variables.
//!
//! The package is built once per run of this binary with maturin into a
//! virtualenv beside the workspace's build (`target/py-infermesh`, created
//! with maturin, numpy, pytest and mypy on first use), with the `dev` profile so
//! that it reuses the workspace's debug artifacts: `pip install ./python`,
//! exactly as a user installs it, with `MATURIN_PEP517_ARGS=--profile dev`.
//!
//! - `test_local.py`: datatype mapping both ways, BYTES, argument checks,
//!   fork(), and `mypy --strict` of the package against its stubs.
//! - `test_balance.py`, `test_errors.py`, `test_async.py` against three
//!   agents in ZooKeeper and a slow one: every node gets traffic, each
//!   answer is right, errors are the documented exceptions, `asyncio.gather`
//!   spreads calls, a cancelled call leaves nothing in flight.
//! - `test_failover.py`: an agent SIGKILLed while four threads call: no call
//!   fails.
//! - `test_shm.py`: with `local_node`, every call takes shared memory; the
//!   agent's `infermesh_transport_requests_total{path="shm_passthrough"}`
//!   counts them (checked here), and an agent called without it counts gRPC.
//! - `test_leased.py`: a leased region's inputs are numpy arrays filled in
//!   place, outputs are read-only arrays over the region, which is not
//!   reused while one lives; a lease is sent once; to a remote node it goes
//!   inline.
//! - `test_tls.py`: an agent in ZooKeeper that requires client certificates
//!   (mTLS): `tls=infermesh.TLS(ca, cert, key)` and the `INFERMESH_TLS_*`
//!   environment reach it; without a client certificate the handshake is
//!   refused; without TLS settings the node is skipped, never sent
//!   plaintext.

use std::path::{Path, PathBuf};
use std::process::Command;

use infermesh_tests::certs::Pki;
use infermesh_tests::py::{ensure_venv, run};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, testworker};

/// The venv's Python with the package installed, once per test binary.
fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(install).clone()
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
}

/// Creates the venv (maturin, numpy, pytest, mypy) unless it is there, then
/// builds and installs the package from `python/`.
fn install() -> PathBuf {
    let python = ensure_venv(
        "py-infermesh",
        "import maturin, numpy, pytest, mypy",
        &["maturin>=1.5,<2", "numpy", "pytest", "mypy"],
    );
    let bin = python.parent().expect("venv bin").to_path_buf();
    // maturin's PEP 517 hook runs the `maturin` binary from PATH.
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run(
        Command::new(bin.join("pip"))
            .args([
                "install",
                "--quiet",
                "--no-build-isolation",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(workspace().join("python"))
            .env("PATH", path)
            .env("MATURIN_PEP517_ARGS", "--profile dev"),
        "pip install ./python",
    );
    python
}

/// Runs pytest on `files` (in `python/tests/`) with `env`; fails the test
/// with pytest's output if any test fails or is skipped.
async fn pytest(files: &[&str], env: &[(&str, String)]) -> String {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let dir = workspace().join("python/tests");
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(["-m", "pytest", "-q", "-rs", "-s", "-p", "no:cacheprovider"])
        .args(files.iter().map(|f| dir.join(f)))
        .current_dir(&dir)
        .kill_on_drop(true);
    // The caller's TLS environment would change what the tests see.
    for k in [
        "INFERMESH_TLS_CA",
        "INFERMESH_TLS_CERT",
        "INFERMESH_TLS_KEY",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pytest {files:?} failed:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("skipped"), "a test was skipped:\n{stdout}");
    println!("{stdout}");
    stdout
}

fn zk_agent(zk: &Zk, service: &str, node: &str, worker_flags: &str) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{node}\"\n[registry]\nurl = \"{}\"\nservice = \"{service}\"\n\
             session_timeout = \"2s\"\n[[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            testworker(worker_flags)
        ))
        .spawn()
}

/// The value of a counter line `name` in a `/metrics` text.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
}

#[tokio::test]
async fn python_package_without_a_fleet() {
    let out = pytest(&["test_local.py"], &[]).await;
    assert!(out.contains("passed"), "{out}");
}

#[tokio::test]
async fn python_balances_reports_errors_and_runs_under_asyncio() {
    let zk = Zk::start().await;
    let nodes = ["py-a", "py-b", "py-c"];
    let agents: Vec<Agent> = nodes
        .iter()
        .map(|n| zk_agent(&zk, "py", n, "--model dense"))
        .collect();
    // Holds every request far longer than the suite runs: calls to it end
    // by their timeout, deadline or cancellation.
    let slow = Agent::builder()
        .worker(testworker("--model dense --service-time-ms 600000"))
        .start()
        .await;
    for a in &agents {
        a.wait_ready().await;
    }
    let env = [
        ("INFERMESH_REGISTRY", zk.url("/im")),
        ("INFERMESH_SERVICE", "py".to_string()),
        ("INFERMESH_NODES", nodes.join(",")),
        ("INFERMESH_SLOW_REGISTRY", format!("static://{}", slow.oip)),
    ];
    pytest(
        &["test_balance.py", "test_errors.py", "test_async.py"],
        &env,
    )
    .await;
    // Each agent served some of the calls (the client's view is checked in
    // Python; this is the agents').
    for a in &agents {
        let served = counter(
            &a.metrics().await,
            "infermesh_requests_total{model=\"dense\",code=\"Ok\"}",
        );
        assert!(served > 0, "agent {} served no call", a.oip);
    }
}

#[tokio::test]
async fn python_calls_survive_an_agent_killed_mid_load() {
    let zk = Zk::start().await;
    let nodes = ["fo-a", "fo-b", "fo-c"];
    let agents: Vec<Agent> = nodes
        .iter()
        .map(|n| zk_agent(&zk, "failover", n, "--model dense --service-time-ms 2"))
        .collect();
    for a in &agents {
        a.wait_ready().await;
    }
    let env = [
        ("INFERMESH_REGISTRY", zk.url("/im")),
        ("INFERMESH_SERVICE", "failover".to_string()),
        ("INFERMESH_NODES", nodes.join(",")),
        ("INFERMESH_KILL_NODE", nodes[1].to_string()),
        ("INFERMESH_KILL_PID", agents[1].pid().to_string()),
    ];
    pytest(&["test_failover.py"], &env).await;
}

/// Two agents serving `identity`, one the Python tests call local (reached
/// through shared memory) and one remote, and the environment naming them.
async fn local_and_remote_identity_agents() -> (Agent, Agent, [(&'static str, String); 2]) {
    let local = Agent::builder()
        .worker(testworker("--model identity"))
        .start()
        .await;
    let remote = Agent::builder()
        .worker(testworker("--model identity"))
        .start()
        .await;
    let env = [
        ("INFERMESH_LOCAL_NODE", local.oip.to_string()),
        ("INFERMESH_REMOTE_NODE", remote.oip.to_string()),
    ];
    (local, remote, env)
}

/// The metric counting requests an agent carried on `path`.
fn transport_path(path: &str) -> String {
    format!("infermesh_transport_requests_total{{path=\"{path}\"}}")
}

#[tokio::test]
async fn python_uses_shared_memory_to_the_local_agent() {
    let (local, remote, env) = local_and_remote_identity_agents().await;
    pytest(&["test_shm.py"], &env).await;
    let calls = 50;
    let m = local.metrics().await;
    let path = transport_path;
    assert_eq!(counter(&m, &path("shm_passthrough")), calls, "{m}");
    assert_eq!(counter(&m, &path("grpc")), 0, "{m}");
    let m = remote.metrics().await;
    assert_eq!(counter(&m, &path("grpc")), calls, "{m}");
    assert_eq!(counter(&m, &path("shm_passthrough")), 0, "{m}");
}

#[tokio::test]
async fn python_leases_shared_memory_and_views_outputs_in_place() {
    let (local, remote, env) = local_and_remote_identity_agents().await;
    pytest(&["test_leased.py"], &env).await;
    let path = transport_path;
    let m = local.metrics().await;
    assert!(counter(&m, &path("shm_passthrough")) > 0, "{m}");
    assert_eq!(counter(&m, &path("grpc")), 0, "{m}");
    let m = remote.metrics().await;
    assert_eq!(counter(&m, &path("grpc")), 1, "{m}");
}

#[tokio::test]
async fn python_reaches_an_mtls_agent_with_its_tls_settings() {
    let dir = std::env::temp_dir().join(format!("infermesh-pytls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pki = Pki::new(&dir, "fleet");
    let ca = pki.ca_file("fleet");
    let server = pki.server("agent", &["127.0.0.1", "localhost"], 1);
    let trainer = pki.client("trainer", &["trainer.test"], 2);
    let zk = Zk::start().await;
    let _agent = Agent::builder()
        .config(format!(
            "node_id = \"tls-a\"\n[registry]\nurl = \"{}\"\nservice = \"pytls\"\n\
             session_timeout = \"2s\"\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[workers]]\ncommand = \"{}\"\n",
            zk.url("/im"),
            server.cert.display(),
            server.key.display(),
            ca.display(),
            testworker("--model dense")
        ))
        .spawn();
    let env = [
        ("INFERMESH_REGISTRY", zk.url("/im")),
        ("INFERMESH_SERVICE", "pytls".to_string()),
        ("INFERMESH_NODES", "tls-a".to_string()),
        ("INFERMESH_TEST_CA", ca.display().to_string()),
        ("INFERMESH_TEST_CERT", trainer.cert.display().to_string()),
        ("INFERMESH_TEST_KEY", trainer.key.display().to_string()),
    ];
    pytest(&["test_tls.py"], &env).await;
    let _ = std::fs::remove_dir_all(&dir);
}
