//! SIGTERM: the agent stops accepting, lets every in-flight request finish,
//! stops its workers and exits 0.

use infermesh_tests::{Agent, dense, eventually, process_alive, testworker};

#[tokio::test]
async fn sigterm_loses_no_in_flight_request() {
    const N: usize = 8;
    let mut agent = Agent::builder()
        .worker(testworker("--service-time-ms 400"))
        .worker(testworker("--service-time-ms 400"))
        .start()
        .await;
    let worker_pids: Vec<u32> = agent.status().await.workers.iter().map(|w| w.pid).collect();
    let input = dense::input(2, 21);
    let mut calls = Vec::new();
    for _ in 0..N {
        let mut client = agent.client().await;
        let req = dense::request(&input, true);
        calls.push(tokio::spawn(async move { client.model_infer(req).await }));
    }
    eventually("all requests in flight at the agent", || async {
        (agent.status().await.in_flight == N as u64).then_some(())
    })
    .await;

    let terminate = tokio::task::spawn_blocking(move || {
        let status = agent.terminate();
        (status, agent)
    });
    for (i, call) in calls.into_iter().enumerate() {
        let resp = call
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("in-flight request {i} lost: {e}"));
        assert_eq!(dense::output(resp.get_ref()).0, dense::forward(&input));
    }
    let (status, agent) = terminate.await.unwrap();
    assert!(
        status.success(),
        "agent exits 0 after SIGTERM, got {status}"
    );
    assert!(
        worker_pids.iter().all(|&p| !process_alive(p)),
        "workers stopped"
    );
    let log = agent.log_text();
    assert!(log.contains("draining"), "log says it drained");
    assert!(log.contains("agent stopped"));
    // The workers stopped on SIGTERM, not after stop_grace by SIGKILL (a
    // worker shim once passed its blocked signal mask on to the worker).
    assert!(!log.contains("ignored SIGTERM"), "{log}");
}
