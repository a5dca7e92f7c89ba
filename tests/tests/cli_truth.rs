//! The CLI tells the truth (issue 27): `--json` output is JSON and only
//! JSON on stdout for every subcommand that takes it; `bench --transport X`
//! refuses a target that does not offer X instead of measuring gRPC; an
//! unreachable registry is named as unreachable; `--check-config` finds a
//! worker program where the agent finds it.

use std::process::{Command, Output};

use infermesh_tests::certs::Pki;
use infermesh_tests::{Agent, bin, free_ports, testworker};
use serde_json::Value;

/// Runs `infermesh ARGS...` off the async runtime.
async fn infermesh(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(bin("infermesh"))
            .args(&args)
            .env_remove("INFERMESH_REGISTRY")
            .env_remove("INFERMESH_TOKEN_FILE") // earlier spelling: still read
            .env_remove("INFERMESH_ADMIN_TOKEN_FILE")
            .env_remove("INFERMESH_TLS_CA")
            .output()
            .expect("run infermesh")
    })
    .await
    .unwrap()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The subcommands `infermesh --help` lists whose own `--help` offers `--json`.
async fn subcommands_with_json() -> Vec<String> {
    let help = text(&infermesh(strings(&["--help"])).await.stdout);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| n != "help")
        .collect();
    assert!(names.len() > 10, "subcommands listed: {names:?}\n{help}");
    let mut with_json = Vec::new();
    for name in names {
        let help = text(&infermesh(vec![name.clone(), "--help".into()]).await.stdout);
        if help.contains("--json") {
            with_json.push(name);
        }
    }
    with_json
}

/// Finding (issue 27): `bench --json`, `drill --json` and the demo printed
/// text lines around the JSON on stdout, and `version --json` was refused.
/// Every subcommand that takes `--json` is run once against a real agent
/// (a failing command's `{"ok": false, ...}` counts: it is JSON too), and
/// its whole stdout must parse as one JSON document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_output_is_json_only() {
    let agent = Agent::builder()
        .config(format!(
            "[sentinel]\nstable_period = \"1s\"\n[[workers]]\nid = \"w0\"\ncommand = \"{}\"\n",
            testworker("")
        ))
        .start()
        .await;
    let (oip, admin) = (agent.oip.to_string(), agent.admin.to_string());
    let token = agent.token_file.display().to_string();
    let registry = format!("static://{oip}");
    let demo_log = agent.dir.join("demo.log").display().to_string();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("version", vec!["version", "--json"]),
        ("nodes", vec!["nodes", "--registry", &registry, "--json"]),
        ("status", vec!["status", &admin, "--json"]),
        ("health", vec!["health", "--admin", &admin, "--json"]),
        ("scale", vec!["scale", "--registry", &registry, "--json"]),
        (
            "bench",
            vec![
                "bench",
                "--target",
                &oip,
                "--duration",
                "300ms",
                "--warmup",
                "0s",
                "--json",
            ],
        ),
        (
            "drill",
            vec![
                "drill",
                "--target",
                &oip,
                "--admin",
                &admin,
                "--admin-token-file",
                &token,
                "--fault",
                "cuda-crash",
                "--count",
                "1",
                "--concurrency",
                "1",
                "--json",
            ],
        ),
        (
            "restart",
            vec![
                "restart",
                "w0",
                "--admin",
                &admin,
                "--admin-token-file",
                &token,
                "--json",
            ],
        ),
        (
            "drain",
            vec![
                "drain",
                "--admin",
                &admin,
                "--admin-token-file",
                &token,
                "--json",
            ],
        ),
        (
            "undrain",
            vec![
                "undrain",
                "--admin",
                &admin,
                "--admin-token-file",
                &token,
                "--json",
            ],
        ),
        (
            "demo",
            vec![
                "demo",
                "--duration",
                "3s",
                "--log-file",
                &demo_log,
                "--json",
            ],
        ),
    ];
    for name in subcommands_with_json().await {
        assert!(
            cases.iter().any(|(n, _)| *n == name),
            "`infermesh {name}` takes --json: add a case for it here"
        );
    }
    for (name, args) in cases {
        let out = infermesh(strings(&args)).await;
        let stdout = text(&out.stdout);
        let parsed: Result<Value, _> = serde_json::from_str(stdout.trim());
        assert!(
            parsed.is_ok(),
            "`infermesh {}`: stdout is not one JSON document ({:?}):\n{stdout}\nstderr:\n{}",
            args.join(" "),
            parsed.err(),
            text(&out.stderr)
        );
        eprintln!(
            "{name}: exit {:?}, {} bytes of JSON",
            out.status.code(),
            stdout.len()
        );
    }
}

/// Finding (issue 27): `bench --transport quic` against an agent that
/// offers no QUIC reported gRPC figures and exited 0. It now exits 69
/// before any load, naming what is missing — given the agent's address,
/// and through a registry whose records advertise no QUIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_over_quic_against_a_quic_less_agent_fails() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let oip = agent.oip.to_string();
    let direct = infermesh(strings(&[
        "bench",
        "--target",
        &oip,
        "--transport",
        "quic",
        "--duration",
        "300ms",
        "--json",
    ]))
    .await;
    assert_eq!(direct.status.code(), Some(69), "{direct:?}");
    assert!(
        direct.stdout.is_empty(),
        "no figures: {}",
        text(&direct.stdout)
    );
    assert!(
        text(&direct.stderr).contains("--transport quic"),
        "{direct:?}"
    );

    let pki = Pki::new(&agent.dir.join("pki"), "bench");
    let ca = pki.ca_file("bench").display().to_string();
    let registry = format!("static://{oip}");
    let through_registry = infermesh(strings(&[
        "bench",
        "--registry",
        &registry,
        "--tls-ca",
        &ca,
        "--transport",
        "quic",
        "--duration",
        "300ms",
    ]))
    .await;
    assert_eq!(
        through_registry.status.code(),
        Some(69),
        "{through_registry:?}"
    );
    assert!(
        text(&through_registry.stderr).contains("advertises QUIC"),
        "{through_registry:?}"
    );

    // Shared memory with the agent on this host does take shared memory,
    // and the report says which path carried the requests.
    let shm = infermesh(strings(&[
        "bench",
        "--target",
        &oip,
        "--transport",
        "shm",
        "--duration",
        "300ms",
        "--warmup",
        "0s",
        "--json",
    ]))
    .await;
    assert_eq!(shm.status.code(), Some(0), "{shm:?}");
    let report: Value = serde_json::from_slice(&shm.stdout).unwrap();
    let by_path = report["requests_by_path"].as_object().unwrap();
    assert!(by_path["shm"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(by_path.len(), 1, "{report}");
}

/// Finding (issue 27): with nothing listening at the registry, `bench`
/// said "no node registered for the service" and `nodes` "did not answer
/// within 5s". Both now say the registry is unreachable, and name it.
#[tokio::test]
async fn an_unreachable_registry_is_named() {
    let [port] = free_ports();
    let registry = format!("zk://127.0.0.1:{port}/infermesh");
    for args in [
        vec!["bench", "--registry", &registry, "--duration", "300ms"],
        vec!["nodes", "--registry", &registry, "--connect-timeout", "2s"],
    ] {
        let out = infermesh(strings(&args)).await;
        assert_eq!(out.status.code(), Some(69), "{args:?}: {out:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("registry {registry} is unreachable")),
            "{args:?}: {stderr}"
        );
    }
}

/// Finding (issue 27): `--check-config` refused a bare worker program the
/// agent itself finds next to the `infermesh` binary.
#[tokio::test]
async fn check_config_finds_programs_where_the_agent_does() {
    let testworker = bin("infermesh-testworker");
    let dir = testworker.parent().unwrap();
    assert_eq!(dir, bin("infermesh").parent().unwrap());
    // A PATH without the build directory: the program is found next to
    // the binary, as the agent finds it.
    let out = tokio::task::spawn_blocking(|| {
        Command::new(bin("infermesh"))
            .args([
                "agent",
                "--check-config",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--worker",
                "infermesh-testworker --listen 127.0.0.1:{port}",
            ])
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
