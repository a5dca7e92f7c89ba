//! Whatever a worker writes, the agent keeps draining its output and still
//! matches fault patterns (tracker issue 11, finding 8): a 1 MiB line is cut
//! and marked, invalid UTF-8 is replaced, and output written continuously
//! after both — more than a pipe holds — is read to the fault line at its
//! end. Before, a non-UTF-8 byte ended the reader, the pipe closed, and the
//! worker's next write died of SIGPIPE.

use infermesh_tests::{Agent, eventually, testworker};

const SCRIPT: &str = r#"
# A 1 MiB line, invalid UTF-8, then ~300 KB of chatter and a fault line,
# written in the background while the server runs.
head -c 1048576 /dev/zero | tr '\0' x
printf '\n\377\376 bad bytes\n'
(
  i=0
  while [ $i -lt 20000 ]; do echo "chatter line $i"; i=$((i+1)); done
  echo "CUDA error: an illegal memory access was encountered"
) &
exec "$@"
"#;

#[tokio::test]
async fn output_is_drained_past_long_lines_and_bad_bytes_and_faults_still_match() {
    let dir = std::env::temp_dir().join(format!("infermesh-noisy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("noisy.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let agent = Agent::builder()
        .worker(format!("/bin/sh {} {}", script.display(), testworker("")))
        .spawn();
    let w = eventually("the fault line after the noise is detected", || async {
        let w = agent.try_status().await?.workers.into_iter().next()?;
        w.last_fault.contains("CUDA error").then_some(w)
    })
    .await;
    assert!(w.last_fault.contains("illegal memory access"), "{w:?}");
    let log = agent.log_text();
    let cut = format!(
        "{}{}",
        "x".repeat(infermesh_agent::supervision::output::MAX_LINE_BYTES),
        infermesh_agent::supervision::output::TRUNCATED_MARK
    );
    assert!(log.contains(&cut), "the 1 MiB line is cut and marked");
    assert!(
        !log.contains(&"x".repeat(infermesh_agent::supervision::output::MAX_LINE_BYTES + 1)),
        "nothing past the cut is kept"
    );
    assert!(log.contains("\u{fffd}\u{fffd} bad bytes"));
    assert!(log.contains("chatter line 19999"));
    let _ = std::fs::remove_dir_all(&dir);
}
