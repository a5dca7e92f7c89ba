//! The `exec` check against a real test worker: the document reaches the
//! command, exit codes and stdout make the verdict, and a slow or chatty
//! command can neither hang the check nor exhaust memory.

mod fixture;

use std::time::{Duration, Instant};

use infermesh_health::{Verdict, run_check};
use infermesh_testworker::fault::FaultKind;

use fixture::{Dir, Worker, build_check};

async fn run(toml: &str, dir: &Dir, worker: &Worker) -> Verdict {
    let check = build_check(toml, dir);
    run_check(check.as_ref(), worker.client(), Duration::from_secs(30)).await
}

/// An exec spec running `sh <script>` (scripts are run through `sh` so a
/// freshly written file is never exec'd while another test forks).
fn sh(script: &str, extra: &str) -> String {
    format!("kind = \"exec\"\nmodel = \"dense\"\ncommand = \"sh {script}\"\n{extra}")
}

#[tokio::test]
async fn passes_when_the_command_exits_0_and_sees_the_outputs() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    dir.write("saw.sh", "grep -q '\"OUTPUT0\"' && echo 'saw OUTPUT0'\n");
    let v = run(&sh("saw.sh", ""), &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.reason, "saw OUTPUT0");
    assert_eq!(v.check, "exec");

    dir.write("doc.sh", "cat > doc.json\n");
    assert!(run(&sh("doc.sh", ""), &dir, &worker).await.pass);
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("doc.json")).unwrap()).unwrap();
    assert_eq!(doc["model"], "dense");
    assert_eq!(
        doc["request"]["inputs"][0]["shape"],
        serde_json::json!([1, 16])
    );
    assert_eq!(
        doc["response"]["outputs"][0]["data"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert!(doc["latency_ms"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn fails_with_the_commands_first_line_as_reason() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    dir.write(
        "no.sh",
        "echo 'outputs look wrong'\necho 'details'\nexit 1\n",
    );
    let v = run(&sh("no.sh", ""), &dir, &worker).await;
    assert!(!v.pass, "{v}");
    assert_eq!(v.reason, "outputs look wrong");

    dir.write("quiet.sh", "echo 'to stderr' >&2\nexit 3\n");
    let v = run(&sh("quiet.sh", ""), &dir, &worker).await;
    assert_eq!(v.reason, "exit status: 3 (to stderr)");
}

#[tokio::test]
async fn the_command_sees_the_probe_error() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    dir.write(
        "err.sh",
        "grep -q '\"error\":\"ModelMetadata failed: NotFound' && echo 'saw the error'\n",
    );
    let spec = sh("err.sh", "").replace("\"dense\"", "\"sparse\"");
    let v = run(&spec, &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.model, "sparse");
}

#[tokio::test]
async fn a_slow_command_is_killed_at_its_timeout() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    // The child of the script must die too: it holds stdout open.
    dir.write("slow.sh", "sleep 30\n");
    let started = Instant::now();
    let v = run(&sh("slow.sh", "timeout = \"200ms\""), &dir, &worker).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(!v.pass);
    assert_eq!(v.reason, "timed out after 200ms");
}

#[tokio::test]
async fn endless_output_neither_hangs_nor_is_kept() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let started = Instant::now();
    let spec = "kind = \"exec\"\nmodel = \"dense\"\ncommand = \"yes\"\ntimeout = \"300ms\"\nmax_output_bytes = 64";
    let v = run(spec, &dir, &worker).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(v.reason, "timed out after 300ms");

    // Megabytes of output, then a clean exit: drained, and the verdict stands.
    dir.write("chatty.sh", "yes | head -c 8000000\nexit 0\n");
    let v = run(&sh("chatty.sh", "max_output_bytes = 64"), &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.reason, "y");
}

#[tokio::test]
async fn a_missing_program_is_a_failed_verdict() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let v = run(
        "kind = \"exec\"\nmodel = \"dense\"\ncommand = \"bin/no-such-check --x\"",
        &dir,
        &worker,
    )
    .await;
    assert!(!v.pass);
    assert!(v.reason.starts_with("cannot run '"), "{v}");
    assert!(v.reason.contains("bin/no-such-check': No such file"), "{v}");
}

#[tokio::test]
async fn the_shipped_example_script_judges_outputs() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("python3 not found; skipping");
        return;
    }
    let configs = Dir::at(fixture::configs_dir());
    let spec = "kind = \"exec\"\nmodel = \"dense\"\ncommand = \"./check-output.sh\"";
    let v = run(spec, &configs, &Worker::healthy().await).await;
    assert!(v.pass, "{v}");
    assert!(v.reason.starts_with("1 outputs look sane"), "{v}");
    let v = run(spec, &configs, &Worker::with_fault(FaultKind::Nan).await).await;
    assert!(!v.pass, "{v}");
    assert_eq!(v.reason, "OUTPUT0: 4 of 4 values are not finite");
}
