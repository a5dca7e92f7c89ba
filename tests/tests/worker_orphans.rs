//! Workers started through a wrapper die with their agent (tracker issue 11,
//! finding 6), and the worker shim the agent starts them through reports
//! their exits faithfully.
//!
//! A launch script (`/bin/sh -c 'server …; echo'`) forks the real server;
//! the parent-death signal on the shell does not reach it, so before the
//! shim it survived a SIGKILLed agent, re-parented to PID 1, still serving.

use std::net::SocketAddr;

use infermesh_proto::admin::RestartWorkerRequest;
use infermesh_proto::admin::WorkerStatus;
use infermesh_tests::{Agent, bin, eventually, process_alive, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Every process below `pid`, from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        for entry in dir.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                all.push(child);
                frontier.push(child);
            }
        }
    }
    all
}

/// The command line of `pid`.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The test worker process below `pid` (under the shim and the shell).
fn testworker_below(pid: u32) -> u32 {
    descendants(pid)
        .into_iter()
        .find(|&p| cmdline(p).starts_with(&bin("infermesh-testworker").display().to_string()))
        .unwrap_or_else(|| panic!("no test worker below {pid}"))
}

/// A worker command run by a shell that does something after the worker.
fn wrapped(after: &str) -> String {
    format!("/bin/sh -c '{}; {after}'", testworker(""))
}

async fn only_worker(agent: &Agent) -> WorkerStatus {
    agent.status().await.workers[0].clone()
}

async fn serving(address: &str) -> bool {
    tokio::net::TcpStream::connect(address.parse::<SocketAddr>().unwrap())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_wrapper_launched_worker_dies_with_a_sigkilled_agent() {
    let mut agent = Agent::builder().worker(wrapped("echo")).start().await;
    let w = only_worker(&agent).await;
    let below = descendants(w.pid);
    let server = testworker_below(w.pid);
    assert!(serving(&w.address).await);
    assert!(process_alive(server));

    agent.kill();
    eventually("the shim, the shell and the server are gone", || async {
        (!process_alive(w.pid) && below.iter().all(|&p| !process_alive(p))).then_some(())
    })
    .await;
    assert!(
        !serving(&w.address).await,
        "nothing serves on the worker's port any more"
    );
}

#[tokio::test]
async fn exit_codes_and_signals_read_through_the_shim() {
    // The shell exits 3 when its server dies: the agent reads exit code 3.
    let agent = Agent::builder().worker(wrapped("exit 3")).start().await;
    let first = only_worker(&agent).await;
    kill(
        Pid::from_raw(testworker_below(first.pid) as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    let second = eventually("the worker restarted after exit code 3", || async {
        let w = only_worker(&agent).await;
        (w.state == "ready" && w.pid != first.pid).then_some(w)
    })
    .await;
    assert_eq!(second.last_exit, "exit code 3");

    // A kill of the whole worker (the pid the agent shows) reads as SIGKILL
    // and leaves nothing behind.
    let below = descendants(second.pid);
    kill(Pid::from_raw(second.pid as i32), Signal::SIGKILL).unwrap();
    let third = eventually("the worker restarted after SIGKILL", || async {
        let w = only_worker(&agent).await;
        (w.state == "ready" && w.pid != second.pid).then_some(w)
    })
    .await;
    assert_eq!(third.last_exit, "signal 9 (SIGKILL)");
    eventually("the killed worker's processes are gone", || async {
        below.iter().all(|&p| !process_alive(p)).then_some(())
    })
    .await;

    // An operator restart stops the worker with SIGTERM: the shell dies of
    // it, and the agent reads that signal.
    let mut admin = agent.admin().await;
    let below = descendants(third.pid);
    admin
        .restart_worker(RestartWorkerRequest {
            worker: third.id.clone(),
        })
        .await
        .unwrap();
    let fourth = eventually("the worker restarted by the operator", || async {
        let w = only_worker(&agent).await;
        (w.state == "ready" && w.pid != third.pid).then_some(w)
    })
    .await;
    assert_eq!(fourth.last_exit, "signal 15 (SIGTERM)");
    assert!(below.iter().all(|&p| !process_alive(p)));
}

#[tokio::test]
async fn a_worker_that_aborts_reads_as_sigabrt() {
    let agent = Agent::builder()
        .worker(testworker("--fault cuda-crash --fault-after 0"))
        .spawn();
    // The first request makes it abort; the agent restarts it.
    let w = eventually("the worker starts", || async {
        let s = agent.try_status().await?;
        let w = s.workers.into_iter().next()?;
        (w.pid != 0 && w.state == "ready").then_some(w)
    })
    .await;
    let mut client = agent.client().await;
    let input = infermesh_tests::dense::input(1, 1);
    let _ = client
        .model_infer(infermesh_tests::dense::request(&input, true))
        .await;
    let after = eventually("the worker restarted after its abort", || async {
        let w2 = only_worker(&agent).await;
        (w2.pid != w.pid && !w2.last_exit.is_empty()).then_some(w2)
    })
    .await;
    assert_eq!(after.last_exit, "signal 6 (SIGABRT)");
}

#[tokio::test]
async fn a_sigterm_stop_lets_a_wrapped_worker_shut_down_gracefully() {
    let mut agent = Agent::builder().worker(wrapped("echo")).start().await;
    let w = only_worker(&agent).await;
    let below = descendants(w.pid);
    let status = agent.terminate();
    assert!(status.success(), "{status:?}");
    assert!(!process_alive(w.pid));
    assert!(below.iter().all(|&p| !process_alive(p)));
    let log = agent.log_text();
    assert!(
        log.contains("shutting down"),
        "the server saw SIGTERM and shut down itself:\n{log}"
    );
    assert!(!log.contains("ignored SIGTERM"), "{log}");
}
