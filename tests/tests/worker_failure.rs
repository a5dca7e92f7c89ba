//! A worker killed with SIGKILL stops receiving traffic at once and is
//! restarted; a model with no ready worker is refused at once with
//! UNAVAILABLE; workers die with their agent even when the agent itself is
//! SIGKILLed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::ServerLiveRequest;
use infermesh_tests::{Agent, dense, eventually, process_alive, testworker};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test]
async fn sigkilled_worker_is_taken_out_of_routing_and_restarted() {
    // A pinned weight, so it reads as the share of workers ready.
    let agent = Agent::builder()
        .config("weight = 1.0\n")
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await;
    let mut client = agent.client().await;
    let victim = agent.status().await.workers[0].clone();
    let t0 = unix_micros();
    kill(Pid::from_raw(victim.pid as i32), Signal::SIGKILL).unwrap();

    let restarted = eventually("the agent restarts the killed worker", || async {
        let w = agent.status().await.workers[0].clone();
        (w.routable && w.pid != victim.pid).then_some(w)
    })
    .await;
    let kinds: Vec<&str> = restarted
        .events
        .iter()
        .filter(|e| e.unix_micros >= t0)
        .map(|e| e.kind.as_str())
        .collect();
    let pos = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no '{k}' event in {kinds:?}"))
    };
    assert!(
        pos("exited") < pos("restart")
            && pos("restart") < pos("spawned")
            && pos("spawned") < pos("resume_routing")
    );
    let stop = pos("stop_routing");
    assert!(
        stop < pos("spawned"),
        "routing stopped before the replacement started: {kinds:?}"
    );
    assert!(
        restarted.last_exit.contains("SIGKILL"),
        "{}",
        restarted.last_exit
    );
    assert_eq!(restarted.restarts, 1);
    assert!(
        restarted.last_fault.starts_with("exit"),
        "{}",
        restarted.last_fault
    );

    let input = dense::input(1, 11);
    for i in 0..20 {
        let resp = client
            .model_infer(dense::request(&input, true))
            .await
            .unwrap_or_else(|e| panic!("request {i} after the restart failed: {e}"));
        assert_eq!(dense::output(resp.get_ref()).0, dense::forward(&input));
    }
    assert_eq!(agent.status().await.weight, 1.0, "both workers ready again");
}

#[tokio::test]
async fn no_ready_worker_means_unavailable_at_once() {
    // A worker that takes ten minutes to load its model: never ready here.
    let agent = Agent::builder()
        .config(format!(
            "[[workers]]\ncommand = \"{}\"\nmodels = [\"dense\"]\n",
            testworker("--startup-ms 600000")
        ))
        .spawn();
    let mut client = eventually("agent serving", || async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", agent.oip))
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut c = GrpcInferenceServiceClient::new(ch);
        c.server_live(ServerLiveRequest {}).await.ok()?;
        Some(c)
    })
    .await;
    let mut req = tonic::Request::new(dense::request(&dense::input(1, 1), true));
    // Were the request queued for the loading worker, it would end with
    // DEADLINE_EXCEEDED after this; it must be refused straight away.
    req.set_timeout(Duration::from_secs(30));
    let err = client.model_infer(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{}", err.message());
    assert_eq!(agent.status().await.workers[0].state, "starting");
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
