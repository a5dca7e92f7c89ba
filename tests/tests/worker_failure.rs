//! A worker killed with SIGKILL stops receiving traffic at once; workers die
//! with their agent even when the agent itself is SIGKILLed.

use infermesh_tests::{Agent, dense, eventually, process_alive, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[tokio::test]
async fn killed_worker_stops_receiving_traffic() {
    let agent = Agent::builder()
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await;
    let mut client = agent.client().await;
    let before = agent.status().await;
    let victim = &before.workers[0];
    kill(Pid::from_raw(victim.pid as i32), Signal::SIGKILL).unwrap();

    let after_kill = eventually("agent notices the worker died", || async {
        let s = agent.status().await;
        (s.workers[0].state == "exited").then_some(s)
    })
    .await;
    assert!(
        after_kill.workers[0].last_exit.contains("SIGKILL"),
        "{}",
        after_kill.workers[0].last_exit
    );
    assert!(agent.log_text().contains("worker exited"));

    let input = dense::input(1, 11);
    for i in 0..20 {
        let resp = client
            .model_infer(dense::request(&input, true))
            .await
            .unwrap_or_else(|e| panic!("request {i} after the kill failed: {e}"));
        assert_eq!(dense::output(resp.get_ref()).0, dense::forward(&input));
    }
    let end = agent.status().await;
    assert_eq!(
        end.workers[0].requests, after_kill.workers[0].requests,
        "no traffic to the dead worker"
    );
    assert_eq!(end.workers[1].requests, after_kill.workers[1].requests + 20);
    assert_eq!(end.weight, 0.5, "weight follows the share of ready workers");
}

#[tokio::test]
async fn workers_die_with_a_sigkilled_agent() {
    let mut agent = Agent::builder()
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await;
    let pids: Vec<u32> = agent.status().await.workers.iter().map(|w| w.pid).collect();
    assert!(pids.iter().all(|&p| process_alive(p)));
    agent.kill();
    eventually("workers exit after their agent is SIGKILLed", || async {
        pids.iter().all(|&p| !process_alive(p)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn no_ready_worker_means_unavailable_at_once() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let mut client = agent.client().await;
    let pid = agent.status().await.workers[0].pid;
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    eventually("worker marked exited", || async {
        (agent.status().await.workers[0].state == "exited").then_some(())
    })
    .await;
    let err = client
        .model_infer(dense::request(&dense::input(1, 1), true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{}", err.message());
}
