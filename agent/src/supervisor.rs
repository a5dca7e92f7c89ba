//! Runs one worker: spawn, wait until ready, watch until it exits or the
//! agent stops it.
//!
//! Restart policy is the sentinel's job (a later issue); for now a worker
//! that exits is logged, marked `exited`, and gets no more traffic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::{
    ModelMetadataRequest, ModelReadyRequest, RepositoryIndexRequest, ServerLiveRequest,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::spawn::{self, describe_exit};
use crate::worker::{Process, Worker, WorkerState};

/// Interval between readiness probes while a worker starts.
const READY_POLL: Duration = Duration::from_millis(25);
/// Timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the supervisor needs besides the worker.
#[derive(Clone)]
pub struct Context {
    /// The pool the worker belongs to.
    pub pool: Arc<Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Largest gRPC message.
    pub max_message_bytes: usize,
}

/// Supervises `worker` until it exits or `stop` turns true.
pub async fn supervise(worker: Arc<Worker>, ctx: Context, mut stop: watch::Receiver<bool>) {
    let id = worker.id().to_string();
    let mut spawned = match spawn::spawn(&worker) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(worker = %id, command = %worker.spec.command, error = %e, "cannot start worker");
            exited(&worker, &ctx, format!("spawn failed: {e}"));
            return;
        }
    };
    tracing::info!(worker = %id, pid = spawned.pid, address = %spawned.address, command = %worker.spec.command, "worker started");
    let client = client(spawned.address, ctx.max_message_bytes);
    worker.set_process(Some(Process {
        pid: spawned.pid,
        address: spawned.address,
        client: client.clone(),
    }));

    let started = Instant::now();
    tokio::select! {
        ready = wait_ready(&worker, &ctx, client) => match ready {
            Ok(()) => {
                worker.set_state(WorkerState::Ready);
                ctx.pool.wake();
                tracing::info!(worker = %id, models = ?worker.models().unwrap_or_default(), took_ms = started.elapsed().as_millis() as u64, "worker ready");
            }
            Err(reason) => {
                tracing::error!(worker = %id, %reason, "worker did not become ready; stopping it");
                stop_process(&mut spawned.child, spawned.pid, worker.spec.stop_grace).await;
                exited(&worker, &ctx, format!("not ready: {reason}"));
                return;
            }
        },
        status = spawned.child.wait() => {
            let how = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
            tracing::error!(worker = %id, exit = %how, "worker exited before it was ready");
            exited(&worker, &ctx, how);
            return;
        }
        _ = stopped(&mut stop) => {
            stop_process(&mut spawned.child, spawned.pid, worker.spec.stop_grace).await;
            exited(&worker, &ctx, "stopped by agent".into());
            return;
        }
    }

    tokio::select! {
        status = spawned.child.wait() => {
            let how = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
            tracing::error!(worker = %id, exit = %how, "worker exited; no longer routing to it");
            exited(&worker, &ctx, how);
        }
        _ = stopped(&mut stop) => {
            worker.set_state(WorkerState::Exited);
            ctx.pool.wake();
            stop_process(&mut spawned.child, spawned.pid, worker.spec.stop_grace).await;
            exited(&worker, &ctx, "stopped by agent".into());
            tracing::info!(worker = %id, "worker stopped");
        }
    }
}

/// Resolves when the agent asks workers to stop.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // A closed channel means the agent is gone: stop too.
    let _ = stop.wait_for(|s| *s).await;
}

fn exited(worker: &Worker, ctx: &Context, how: String) {
    worker.set_state(WorkerState::Exited);
    ctx.metrics.worker_exited(worker.id());
    worker.record_exit(how);
    ctx.pool.wake();
}

fn client(
    address: std::net::SocketAddr,
    max_message_bytes: usize,
) -> GrpcInferenceServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("loopback URI is valid")
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .connect_lazy();
    GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
}

/// Polls ServerLive and ModelReady until the worker and all its models are
/// ready, learning its models (RepositoryIndex) and their metadata.
async fn wait_ready(
    worker: &Worker,
    ctx: &Context,
    mut client: GrpcInferenceServiceClient<Channel>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + worker.spec.startup_timeout;
    let probe = async {
        loop {
            match probe_ready(worker, ctx, &mut client).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(fatal) => return Err(fatal),
            }
            tokio::time::sleep(READY_POLL).await;
        }
    };
    tokio::time::timeout_at(deadline, probe)
        .await
        .unwrap_or_else(|_| Err(format!("not ready after {:?}", worker.spec.startup_timeout)))
}

/// One readiness probe: `Ok(false)` means "not yet", `Err` means "never".
async fn probe_ready(
    worker: &Worker,
    ctx: &Context,
    client: &mut GrpcInferenceServiceClient<Channel>,
) -> Result<bool, String> {
    let call = |fut| tokio::time::timeout(PROBE_TIMEOUT, fut);
    match call(client.server_live(ServerLiveRequest {})).await {
        Ok(Ok(r)) if r.get_ref().live => {}
        _ => return Ok(false),
    }
    if worker.models().is_none() {
        match tokio::time::timeout(
            PROBE_TIMEOUT,
            client.repository_index(RepositoryIndexRequest::default()),
        )
        .await
        {
            Ok(Ok(r)) => {
                let models: Vec<String> =
                    r.into_inner().models.into_iter().map(|m| m.name).collect();
                if models.is_empty() {
                    return Ok(false);
                }
                worker.set_models(models);
            }
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                return Err(
                    "the worker does not list its models (RepositoryIndex); set `models` for it"
                        .into(),
                );
            }
            _ => return Ok(false),
        }
    }
    let models = worker.models().unwrap_or_default();
    for model in models.iter() {
        let req = ModelReadyRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(PROBE_TIMEOUT, client.model_ready(req)).await {
            Ok(Ok(r)) if r.get_ref().ready => {}
            _ => return Ok(false),
        }
    }
    for model in models.iter() {
        let req = ModelMetadataRequest {
            name: model.clone(),
            version: String::new(),
        };
        match tokio::time::timeout(PROBE_TIMEOUT, client.model_metadata(req)).await {
            Ok(Ok(r)) => ctx.pool.set_metadata(r.into_inner()),
            Ok(Err(s)) => {
                return Err(format!(
                    "model '{model}' is ready but its metadata failed: {}",
                    s.message()
                ));
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// SIGTERM to the worker's process group, SIGKILL after `grace`.
pub async fn stop_process(child: &mut Child, pid: u32, grace: Duration) {
    let group = Pid::from_raw(pid as i32);
    if let Err(e) = killpg(group, Signal::SIGTERM) {
        tracing::debug!(pid, error = %e, "SIGTERM to worker group failed (already gone?)");
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(pid, ?grace, "worker ignored SIGTERM; sending SIGKILL");
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}
