//! `infermesh drill` against a real agent: it injects faults, finds each in
//! the agent's event log, and reports zero failures after detection.

use std::process::Command;

use infermesh_tests::{Agent, bin, testworker};

#[tokio::test]
async fn drill_reports_detection_and_recovery() {
    let config = format!(
        r#"
[sentinel]
stable_period = "200ms"
[gpu]
backend = "fake"
fake_devices = 2
[[workers]]
command = "{w}"
gpu = 0
[[workers]]
command = "{w}"
gpu = 1
"#,
        w = testworker("")
    );
    let agent = Agent::builder().config(config).start().await;
    let (oip, admin) = (agent.oip.to_string(), agent.admin.to_string());
    let token_file = agent.token_file.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin("infermesh"))
            .args([
                "drill", "--target", &oip, "--admin", &admin, "--count", "2", "--json",
            ])
            .arg("--admin-token-file")
            .arg(&token_file)
            .args([
                "--fault",
                "cuda-crash",
                "--fault",
                "xid31",
                "--fault",
                "xid79",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drill failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = stdout.lines().last().unwrap();
    for fault in ["\"cuda-crash\"", "\"xid-31\"", "\"xid-79\""] {
        assert!(json.contains(fault), "{json}");
    }
    assert!(json.contains("\"failed_after_detection\":0"), "{json}");
    assert!(!json.contains("\"failed_after_detection\":1"), "{json}");
    // One quarantine at most with two workers: one must keep serving.
    assert_eq!(
        agent
            .status()
            .await
            .workers
            .iter()
            .filter(|w| w.state == "quarantined")
            .count(),
        1
    );
}
