//! Python clients the project did not write (`tritonclient` from PyPI and
//! gRPC's own tools), in a virtualenv made once under the target directory
//! (`target/py-venv`), and the scripts of `tests/py` that drive them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bin_dir;

/// The venv's Python, created once per test binary: the tests run in
/// parallel and must not install into the same venv at once.
pub fn venv() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(make_venv).clone()
}

/// Creates the venv with tritonclient and numpy unless it is there already.
fn make_venv() -> PathBuf {
    ensure_venv(
        "py-venv",
        "import tritonclient.grpc, tritonclient.http, numpy, grpc_health.v1.health_pb2_grpc, xds.data.orca.v3, grpclib",
        &[
            "tritonclient[grpc,http]",
            "numpy",
            "grpcio-health-checking",
            "xds-protos",
            "grpclib",
        ],
    )
}

/// The Python of the virtualenv `target/NAME`, created with `packages` from
/// PyPI unless it is there already and `imports` (a Python statement) runs.
/// Callers keep it behind a `OnceLock`: tests run in parallel and must not
/// install into one venv at once.
pub fn ensure_venv(name: &str, imports: &str, packages: &[&str]) -> PathBuf {
    let venv = bin_dir().parent().expect("target dir").join(name);
    let python = venv.join("bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", imports])
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
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet"])
                .args(packages),
            &format!("pip install {}", packages.join(" ")),
        );
    }
    python
}

/// Runs `cmd`, failing the test if it does not succeed.
pub fn run(cmd: &mut Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// Runs `tests/py/SCRIPT ARGS...` with the venv's Python and returns its
/// stdout, failing the test with its output if it fails.
pub async fn run_script(script: &str, args: &[String]) -> String {
    let python = tokio::task::spawn_blocking(venv).await.unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(script);
    let out = tokio::process::Command::new(python)
        .arg(&script)
        .args(args)
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
