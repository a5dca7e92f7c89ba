//! Where a serving worker's liveness probe runs: on a thread of its own, so
//! that its timeout measures the worker and not the agent.
//!
//! The probe (`ServerLive` + `ModelReady` within `probe_timeout`) used to
//! run on the agent's runtime, on a connection whose I/O that runtime
//! drives. With `--threads 1` under load, the agent's one thread spent
//! seconds at a stretch reading clients' 16 MiB requests without turning
//! to its I/O driver (`strace`: no `epoll_wait` for 3.5 s while it read
//! 6,000 frames from one client), so the worker's answer lay unread in the
//! agent's socket while the probe's clock ran: a busy *agent* was reported
//! as a hung *worker*, and the worker restarted (BENCHMARKS.md, issue 27).
//!
//! A [`Prober::dedicated`] runs every probe, and owns the probe's
//! connection to each worker, on one current-thread runtime on a thread
//! that does nothing else: the kernel schedules a mostly idle thread
//! promptly, so an answer is read when it arrives, however busy the data
//! path is, and the verdict waits for the supervisor if need be instead
//! of the other way round. A worker that does not answer is still a
//! timeout after `probe_timeout`. [`Prober::inline`] runs probes on the
//! caller's runtime, for tests under tokio's paused clock.
//!
//! Periodic health-check rounds of a serving worker run there too
//! ([`Prober::run`], over the probe's connection): a check's 10 s timeout
//! is as much a verdict on the worker as a probe's, and a busy agent must
//! not fail it. They are small inference requests every `interval`; the
//! startup gate's round still runs on the agent's runtime (nothing is
//! served before it passes).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{ModelReadyRequest, ServerLiveRequest};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Time to connect a probe's connection to a local worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs liveness probes (see the module docs).
pub struct Prober {
    /// The probes' runtime; `None`: the caller's.
    runtime: Option<Handle>,
    /// Dropped with the prober: its thread then ends.
    _stop: Option<oneshot::Sender<()>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("dedicated", &self.runtime.is_some())
            .finish()
    }
}

impl Prober {
    /// Probes on a thread and runtime of their own, which end when the
    /// prober is dropped.
    pub fn dedicated() -> std::io::Result<Arc<Self>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("infermesh-prober".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Arc::new(Self {
            runtime: Some(handle),
            _stop: Some(stop),
        }))
    }

    /// Probes on the caller's runtime (tests under the paused clock).
    pub fn inline() -> Arc<Self> {
        Arc::new(Self {
            runtime: None,
            _stop: None,
        })
    }

    /// A client for the worker at `address` whose connection is driven by
    /// the probes' runtime (lazily connected, on the first probe). `None`
    /// for an inline prober: probes then share the process's own client,
    /// as they did before there was a probe thread (a second connection
    /// per fake worker would only add I/O for the paused clock to race).
    pub fn client(
        &self,
        address: SocketAddr,
        max_message_bytes: usize,
    ) -> Option<GrpcInferenceServiceClient<Channel>> {
        let runtime = self.runtime.as_ref()?;
        let _on = runtime.enter();
        let client =
            infermesh_proto::oip_client(&address.to_string(), CONNECT_TIMEOUT, max_message_bytes)
                .expect("a socket address is a valid URI");
        Some(client)
    }

    /// Whether the worker behind `client` (made by [`Prober::client`], or
    /// the process's own for an inline prober) answers live and every one of `models` ready within `timeout`, timed
    /// on the probes' runtime.
    pub async fn live(
        &self,
        client: GrpcInferenceServiceClient<Channel>,
        models: Arc<[String]>,
        timeout: Duration,
    ) -> bool {
        let probe = async move {
            tokio::time::timeout(timeout, live(&models, client))
                .await
                .unwrap_or(false)
        };
        // The task ends on its own within `timeout`; a prober dropped
        // meanwhile (the agent stopping) cancels it: not live.
        self.run(probe).await.unwrap_or(false)
    }

    /// Runs `work` (a probe, a health round) on the probes' runtime, so
    /// that its timeouts measure the worker and not the agent; on the
    /// caller's for an inline prober. `None` if the prober was dropped
    /// meanwhile (the agent stopping).
    pub async fn run<F>(&self, work: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            None => Some(work.await),
            Some(runtime) => runtime.spawn(work).await.ok(),
        }
    }
}

/// `ServerLive`, then `ModelReady` for each model; false at the first
/// answer that is not yes (or not an answer).
pub(crate) async fn live(
    models: &[String],
    mut client: GrpcInferenceServiceClient<Channel>,
) -> bool {
    match client.server_live(ServerLiveRequest {}).await {
        Ok(r) if r.get_ref().live => {}
        _ => return false,
    }
    for model in models {
        let req = ModelReadyRequest {
            name: model.clone(),
            version: String::new(),
        };
        match client.model_ready(req).await {
            Ok(r) if r.get_ref().ready => {}
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
