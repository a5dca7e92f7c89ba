//! The agent's Open Inference Protocol front: what clients call.
//!
//! Liveness is the agent's own; readiness and model calls are answered from
//! the workers; `ModelInfer` is validated against the model's metadata,
//! admitted, dispatched to the least-loaded ready worker hosting the model
//! (see [`crate::pool`]) under the caller's deadline, and the worker's answer
//! is passed back unchanged (raw or typed contents alike). Tensors may also
//! come by reference: in shared memory ([`crate::shm`]) or in a client's
//! RDMA-registered memory ([`crate::rdma`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::repository_index_response::ModelIndex;
use infermesh_proto::inference::*;
use infermesh_proto::tensor::validate_request;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::conn;
use crate::deadline::request_timeout;
use crate::error::AgentError;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::rdma::{self, RdmaPeers};
use crate::shm;
use crate::worker::{Input, Worker};
use infermesh_sentinel::{Event, FaultPatterns};
use infermesh_transport::shm::ShmRegistry;

/// The OIP service an agent serves.
#[derive(Clone)]
pub struct Front {
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    patterns: Arc<FaultPatterns>,
    shm: ShmRegistry,
    rdma: Option<Arc<RdmaPeers>>,
}

impl Front {
    /// A front over `pool`.
    pub fn new(
        pool: Arc<Pool>,
        metrics: Arc<Metrics>,
        patterns: Arc<FaultPatterns>,
        shm: ShmRegistry,
    ) -> Self {
        Self {
            pool,
            metrics,
            patterns,
            shm,
            rdma: None,
        }
    }

    /// Serves RDMA requests over `rdma`'s queue pairs (see [`crate::rdma`]).
    pub fn with_rdma(mut self, rdma: Option<Arc<RdmaPeers>>) -> Self {
        self.rdma = rdma;
        self
    }

    /// A client to a ready worker hosting `model`, for calls that take no slot.
    fn client_for(
        &self,
        model: &str,
    ) -> Result<(Arc<Worker>, GrpcInferenceServiceClient<Channel>), Status> {
        let worker = self
            .pool
            .any_ready_for(model)
            .ok_or_else(|| Status::from(self.pool.unavailable_reason(model)))?;
        let client = worker
            .process()
            .map(|p| p.client)
            .ok_or_else(|| Status::from(self.pool.unavailable_reason(model)))?;
        Ok((worker, client))
    }

    async fn infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let deadline = request_timeout(req.metadata()).map(|t| Instant::now() + t);
        let owner = conn::owner(&req);
        let mut req = req.into_inner();
        if req.model_name.is_empty() {
            return Err(AgentError::BadRequest("model_name is empty".into()).into());
        }
        let ticket = self.pool.admit();
        let meta = self
            .pool
            .metadata(&req.model_name)
            .ok_or_else(|| self.pool.unavailable_reason(&req.model_name))?;
        // RDMA inputs are pulled before a worker slot is taken, so a slow
        // link does not hold one; the request then goes on inline.
        let via_rdma = if rdma::uses_rdma(&req) {
            Some(rdma::prepare(self.rdma.as_deref(), owner, &mut req).await?)
        } else {
            None
        };
        let with_shm = shm::uses_shm(&req);
        if !with_shm {
            validate_request(&req, &meta).map_err(AgentError::from)?;
        }
        let lease = ticket.dispatch(&req.model_name, deadline).await?;
        let process = lease.process()?;
        let prepared = if with_shm {
            let p = shm::prepare(&self.shm, owner, lease.worker(), &process, &mut req).await?;
            if matches!(p, shm::Prepared::Inline(_)) {
                validate_request(&req, &meta).map_err(AgentError::from)?;
            }
            self.metrics.transport(match p {
                shm::Prepared::PassThrough => "shm_passthrough",
                shm::Prepared::Inline(_) => "shm_inline",
            });
            Some(p)
        } else {
            self.metrics
                .transport(if via_rdma.is_some() { "rdma" } else { "grpc" });
            None
        };
        let mut resp = forward(lease.worker(), process.client.clone(), req, deadline)
            .await
            .map_err(|s| self.worker_failed(lease.worker(), process.pid, s))?;
        if let Some(p) = prepared {
            shm::finish(&self.shm, owner, p, resp.get_mut())?;
        }
        if let Some(p) = via_rdma {
            p.finish(resp.get_mut()).await?;
        }
        drop(ticket);
        Ok(resp)
    }

    /// Tells the worker's sentinel about an internal error and decides what
    /// the caller sees. An error naming a fatal GPU fault (the worker's CUDA
    /// context is gone, e.g. Triton after an illegal address) is reported as
    /// a fault and answered UNAVAILABLE, so the client retries elsewhere.
    fn worker_failed(&self, worker: &Worker, pid: u32, s: Status) -> Status {
        if !matches!(s.code(), Code::Internal | Code::Unknown) {
            return s;
        }
        if let Some(pattern) = self.patterns.find(s.message()) {
            let event = Event::FaultLine {
                pattern: pattern.to_string(),
                line: s.message().to_string(),
            };
            worker.report(Input::Process { pid, event });
            return AgentError::WorkerUnreachable {
                worker: worker.id().to_string(),
                reason: format!("worker failed: {}", s.message()),
            }
            .into();
        }
        worker.report(Input::Process {
            pid,
            event: Event::RequestError,
        });
        s
    }
}

/// Sends `req` to `worker` with what is left of the deadline.
async fn forward(
    worker: &Worker,
    mut client: GrpcInferenceServiceClient<Channel>,
    req: ModelInferRequest,
    deadline: Option<Instant>,
) -> Result<Response<ModelInferResponse>, Status> {
    let mut out = Request::new(req);
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Status::deadline_exceeded(
                "deadline exceeded before the request reached a worker",
            ));
        }
        out.set_timeout(left);
    }
    client
        .model_infer(out)
        .await
        .map_err(|s| worker_status(worker, s))
}

/// A worker's error as the caller sees it: its own statuses pass through; a
/// broken connection becomes UNAVAILABLE naming the worker, so clients retry
/// elsewhere.
fn worker_status(worker: &Worker, s: Status) -> Status {
    // A status the worker sent has no source error; one tonic made from a
    // broken connection does, whatever its code (UNKNOWN for a reset body,
    // INTERNAL for an h2 stream reset while the worker is being killed).
    let from_transport = std::error::Error::source(&s).is_some();
    let transport = s.code() == Code::Unavailable || from_transport;
    if transport {
        AgentError::WorkerUnreachable {
            worker: worker.id().to_string(),
            reason: s.message().to_string(),
        }
        .into()
    } else {
        s
    }
}

#[tonic::async_trait]
impl infermesh_proto::GrpcInferenceService for Front {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let ready = self.pool.any_ready() && !self.pool.is_stopping();
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        req: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let ready = self.pool.model_ready(&req.get_ref().name) && !self.pool.is_stopping();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "infermesh-agent".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec!["model_repository".into(), "statistics".into()],
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let name = &req.get_ref().name;
        match self.pool.metadata(name) {
            Some(meta) => Ok(Response::new((*meta).clone())),
            None => Err(self.pool.unavailable_reason(name).into()),
        }
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let (worker, mut client) = self.client_for(&req.get_ref().name)?;
        client
            .model_config(req.into_inner())
            .await
            .map_err(|s| worker_status(&worker, s))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let req = req.into_inner();
        if !req.name.is_empty() && self.pool.metadata(&req.name).is_none() {
            return Err(self.pool.unavailable_reason(&req.name).into());
        }
        // Sum what every ready worker reports, per model.
        let mut merged: HashMap<String, ModelStatistics> = HashMap::new();
        for w in self.pool.workers() {
            let Some(p) = w.process().filter(|_| w.routable()) else {
                continue;
            };
            let mut client = p.client;
            let Ok(resp) = client.model_statistics(req.clone()).await else {
                continue;
            };
            for s in resp.into_inner().model_stats {
                merge_stats(merged.entry(s.name.clone()).or_default(), s);
            }
        }
        let mut model_stats: Vec<_> = merged.into_values().collect();
        model_stats.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        _: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let models = self
            .pool
            .models()
            .into_iter()
            .map(|(name, ready)| ModelIndex {
                name,
                version: String::new(),
                state: if ready { "READY" } else { "UNAVAILABLE" }.into(),
                reason: String::new(),
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        let owner = conn::owner(&req);
        let req = req.into_inner();
        // A name reused after an unregister must not reach a worker's stale copy.
        shm::forget_on_workers(&self.pool, owner, Some(&req.name)).await;
        self.shm.handle_register(owner, &req)?;
        tracing::debug!(owner, name = %req.name, key = %req.key, bytes = req.byte_size, "shared memory registered");
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        let owner = conn::owner(&req);
        Ok(Response::new(self.shm.handle_status(owner, req.get_ref())?))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        let owner = conn::owner(&req);
        let req = req.into_inner();
        self.shm.handle_unregister(owner, &req)?;
        let name = (!req.name.is_empty()).then_some(req.name.as_str());
        shm::forget_on_workers(&self.pool, owner, name).await;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let started = Instant::now();
        let model = req.get_ref().model_name.clone();
        let result = self.infer(req).await;
        let code = result.as_ref().map_or_else(|s| s.code(), |_| Code::Ok);
        self.metrics.request(&model, code, started.elapsed());
        result
    }

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
        let deadline = request_timeout(req.metadata()).map(|t| Instant::now() + t);
        let mut incoming = req.into_inner();
        // The first request picks the worker; the stream stays on it.
        let Some(first) = incoming.message().await? else {
            return Ok(Response::new(Box::pin(tokio_stream::empty())));
        };
        let ticket = self.pool.admit();
        let lease = ticket.dispatch(&first.model_name, deadline).await?;
        let worker = Arc::clone(lease.worker());
        let mut client = lease.process()?.client;
        let (tx, rx) = mpsc::channel(16);
        tx.send(first)
            .await
            .map_err(|_| Status::internal("stream closed"))?;
        tokio::spawn(async move {
            while let Ok(Some(msg)) = incoming.message().await {
                if tx.send(msg).await.is_err() {
                    break;
                }
            }
        });
        let upstream = client
            .model_stream_infer(ReceiverStream::new(rx))
            .await
            .map_err(|s| worker_status(&worker, s))?
            .into_inner();
        // The ticket and lease live as long as the stream does.
        let held = (ticket, lease);
        let out = upstream.map(move |item| {
            let _ = &held;
            item.map_err(|s| worker_status(&worker, s))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

fn merge_stats(into: &mut ModelStatistics, s: ModelStatistics) {
    fn add(a: &mut Option<StatisticDuration>, b: Option<StatisticDuration>) {
        if let Some(b) = b {
            let a = a.get_or_insert_with(Default::default);
            a.count += b.count;
            a.ns += b.ns;
        }
    }
    into.name = s.name;
    into.version = s.version;
    into.last_inference = into.last_inference.max(s.last_inference);
    into.inference_count += s.inference_count;
    into.execution_count += s.execution_count;
    if let Some(b) = s.inference_stats {
        let a = into.inference_stats.get_or_insert_with(Default::default);
        add(&mut a.success, b.success);
        add(&mut a.fail, b.fail);
        add(&mut a.queue, b.queue);
        add(&mut a.compute_input, b.compute_input);
        add(&mut a.compute_infer, b.compute_infer);
        add(&mut a.compute_output, b.compute_output);
    }
}
