//! The prober against the real test worker on a loopback port, served on a
//! runtime of its own (a separate process, as far as the agent can tell),
//! with the agent's runtime a current-thread one as under `--threads 1`.

use std::net::SocketAddr;

use infermesh_proto::GrpcInferenceServiceServer;
use infermesh_testworker::{TestWorker, WorkerOptions};

use super::*;

const TIMEOUT: Duration = Duration::from_secs(1);

/// A test worker serving `dense` on its own thread; ends with the runtime.
fn worker() -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        tonic::transport::Server::builder()
            .add_service(GrpcInferenceServiceServer::new(TestWorker::new(
                WorkerOptions::default(),
            )))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    (address, rt)
}

fn agent_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn models() -> Arc<[String]> {
    Arc::from(vec!["dense".to_string()])
}

/// The failure of issue 27's benchmark: the agent's one thread busy (there,
/// reading 16 MiB requests) for longer than the probe's timeout while the
/// probe is out. The worker answered at once; the probe must say so.
#[test]
fn a_probe_out_while_the_agents_thread_is_busy_is_answered_not_timed_out() {
    let (address, _worker) = worker();
    agent_runtime().block_on(async {
        let prober = Prober::dedicated().unwrap();
        let client = prober.client(address, 1 << 20).unwrap();
        let probe = tokio::spawn(async move { prober.live(client, models(), TIMEOUT).await });
        // The probe starts (its deadline is set) ...
        tokio::task::yield_now().await;
        // ... and the agent's thread does not poll anything for longer
        // than the probe may take: a long synchronous stretch of the data
        // path, emulated.
        std::thread::sleep(TIMEOUT * 2);
        assert!(
            probe.await.unwrap(),
            "a busy agent's probe of a live worker failed"
        );
    });
}

/// Hang detection is unchanged: a worker that accepts the connection and
/// never answers (its threads stuck) fails the probe after the timeout.
#[test]
fn a_worker_that_never_answers_fails_the_probe() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    agent_runtime().block_on(async {
        let prober = Prober::dedicated().unwrap();
        let client = prober.client(address, 1 << 20).unwrap();
        assert!(
            !prober
                .live(client, models(), Duration::from_millis(200))
                .await
        );
    });
    drop(silent);
}

#[test]
fn a_live_worker_passes_and_a_model_it_does_not_serve_fails() {
    let (address, _worker) = worker();
    agent_runtime().block_on(async {
        let prober = Prober::dedicated().unwrap();
        let client = prober.client(address, 1 << 20).unwrap();
        assert!(prober.live(client.clone(), models(), TIMEOUT).await);
        let other: Arc<[String]> = Arc::from(vec!["absent".to_string()]);
        assert!(!prober.live(client, other, TIMEOUT).await);
    });
}

#[tokio::test(start_paused = true)]
async fn an_inline_prober_runs_on_the_callers_runtime() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let prober = Prober::inline();
    assert!(
        prober.client(address, 1 << 20).is_none(),
        "the process's own client serves"
    );
    let client =
        infermesh_proto::oip_client(&address.to_string(), CONNECT_TIMEOUT, 1 << 20).unwrap();
    // Under the paused clock the timeout passes without waiting.
    assert!(
        !prober
            .live(client, models(), Duration::from_secs(3600))
            .await
    );
}

/// A health check that asks the worker whether it is live.
#[derive(Debug)]
struct LiveCheck;

impl infermesh_health::HealthCheck for LiveCheck {
    fn name(&self) -> &str {
        "live"
    }

    fn model(&self) -> &str {
        ""
    }

    fn check<'a>(&'a self, client: infermesh_health::Client) -> infermesh_health::CheckFuture<'a> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            // What a probe asks first (`ServerLive`), and no model.
            let result = match live(&[], client).await {
                true => Ok("live".to_string()),
                false => Err("not live".to_string()),
            };
            infermesh_health::Verdict::from_result(self, result, started.elapsed())
        })
    }
}

/// A health round is timed where probes are ([`Prober::run`], the
/// supervisor's periodic rounds): the agent's thread busy for longer than
/// the check's timeout while it is out does not fail a worker that
/// answered at once. (Run on the agent's runtime, the same check times
/// out.)
#[test]
fn a_health_check_out_while_the_agents_thread_is_busy_passes() {
    let (address, _worker) = worker();
    agent_runtime().block_on(async {
        let prober = Prober::dedicated().unwrap();
        let client = prober.client(address, 1 << 20).unwrap();
        let round = {
            let prober = Arc::clone(&prober);
            tokio::spawn(async move {
                let check =
                    async move { infermesh_health::run_check(&LiveCheck, client, TIMEOUT).await };
                prober.run(check).await
            })
        };
        tokio::task::yield_now().await;
        std::thread::sleep(TIMEOUT * 2);
        let verdict = round.await.unwrap().expect("the prober is alive");
        assert!(
            verdict.pass,
            "a busy agent failed a live worker's health check: {verdict:?}"
        );
    });
}
