//! The CLI as a new user meets it: usage errors exit 64, `--check-config`
//! checks what it promises, completions print, and `--log-format json` logs
//! one JSON object per line.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use infermesh_tests::bin;

fn infermesh(args: &[&str]) -> Output {
    Command::new(bin("infermesh"))
        .args(args)
        .env_remove("INFERMESH_REGISTRY")
        .output()
        .expect("run infermesh")
}

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    for args in [
        &["restart", "node-a", "w0", "extra"][..],
        &["nodes", "--no-such-flag"],
        &["no-such-command"],
        &["agent", "--log-format", "yaml"],
    ] {
        let out = infermesh(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: the error is printed");
    }
    let help = infermesh(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"));
}

#[test]
fn completions_print_a_script_per_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = infermesh(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("drain"), "{shell}: {script}");
    }
}

#[test]
fn check_config_finds_missing_programs_and_taken_ports() {
    let worker = format!(
        "{} --listen 127.0.0.1:{{port}}",
        bin("infermesh-testworker").display()
    );

    let ok = infermesh(&[
        "agent",
        "--check-config",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--worker",
        &worker,
    ]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");

    let missing = infermesh(&[
        "agent",
        "--check-config",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--worker",
        "/nonexistent/triton --port {port}",
    ]);
    assert_eq!(missing.status.code(), Some(78), "{missing:?}");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("'/nonexistent/triton' not found"),
        "{stderr}"
    );

    let no_port = infermesh(&[
        "agent",
        "--check-config",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--worker",
        "/bin/true",
    ]);
    assert_eq!(
        no_port.status.code(),
        Some(0),
        "a warning, not an error: {no_port:?}"
    );
    assert!(String::from_utf8_lossy(&no_port.stderr).contains("no {port}"));

    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    let busy = infermesh(&[
        "agent",
        "--check-config",
        "--listen",
        &taken,
        "--admin-listen",
        "127.0.0.1:0",
        "--worker",
        &worker,
    ]);
    assert_eq!(busy.status.code(), Some(69), "{busy:?}");
    assert!(String::from_utf8_lossy(&busy.stderr).contains(&taken));
}

#[test]
fn log_format_json_writes_one_object_per_line() {
    let worker = format!(
        "{} --listen 127.0.0.1:{{port}}",
        bin("infermesh-testworker").display()
    );
    let mut agent = Command::new(bin("infermesh"))
        .args([
            "agent",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--worker",
            &worker,
        ])
        .env_remove("INFERMESH_REGISTRY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    let stderr = agent.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().expect("a log line").expect("utf-8");
    let _ = agent.kill();
    let _ = agent.wait();
    let v: serde_json::Value = serde_json::from_str(&first).expect("the line is JSON");
    assert!(
        v.get("level").is_some() && v.get("timestamp").is_some(),
        "{first}"
    );
}

#[test]
fn the_cli_refuses_an_admin_address_that_names_no_host() {
    for admin in ["0.0.0.0:8002", "[::]:8002"] {
        let out = infermesh(&["status", "--admin", admin]);
        assert_eq!(out.status.code(), Some(64), "{admin}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("names no host"), "{stderr}");
    }
}
