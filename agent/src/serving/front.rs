//! The agent's Open Inference Protocol service: everything clients call
//! except plain `ModelInfer`, which [`crate::serving::forward`] passes through
//! without decoding it into this service. `ModelInfer` requests that need
//! their tensors rewritten (shared memory, RDMA) come here through
//! [`Front::infer_decoded`]; `ModelStreamInfer` is in `model_stream` (a child module: it is part of this service).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use infermesh_proto::inference::repository_index_response::ModelIndex;
use infermesh_proto::inference::*;
use infermesh_proto::tensor::validate_request;
use infermesh_sentinel::FaultPatterns;
use tokio_util::task::TaskTracker;
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::dispatch::models::ModelId;
use crate::dispatch::pool::Pool;
use crate::error::AgentError;
use crate::metrics::{Metrics, TransportPath};
use crate::serving::deadline::request_timeout;
use crate::serving::worker_status::{aborted, judge_worker_status, worker_status};
use crate::transports::conn;
use crate::transports::rdma::{self, RdmaPeers};
use crate::transports::shm::{self, ShmState};
use crate::worker::state::{Process, Worker};

mod model_stream;

/// The OIP service an agent serves.
#[derive(Clone)]
pub struct Front {
    pub(crate) pool: Arc<Pool>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) patterns: Arc<FaultPatterns>,
    pub(crate) shm: ShmState,
    pub(crate) rdma: Option<Arc<RdmaPeers>>,
    pub(crate) tasks: TaskTracker,
}

impl Front {
    /// A front over `pool`; stream tasks are spawned on `tasks`.
    pub fn new(
        pool: Arc<Pool>,
        metrics: Arc<Metrics>,
        patterns: Arc<FaultPatterns>,
        shm: ShmState,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            pool,
            metrics,
            patterns,
            shm,
            rdma: None,
            tasks,
        }
    }

    /// Serves RDMA requests over `rdma`'s queue pairs (see [`crate::transports::rdma`]).
    pub fn with_rdma(mut self, rdma: Option<Arc<RdmaPeers>>) -> Self {
        self.rdma = rdma;
        self
    }

    /// A ready worker hosting `model` and its process, for calls that take
    /// no permit.
    fn ready_for(&self, model: &str) -> Result<(Arc<Worker>, Arc<Process>), Status> {
        self.pool
            .any_ready_for(model)
            .ok_or_else(|| self.pool.unavailable_reason(model).into())
    }

    /// Serves a decoded `ModelInfer` of connection `owner` for `model`
    /// (described by `meta`): RDMA inputs pulled, shared-memory references
    /// passed through or copied, validated, sent to a worker over gRPC, and
    /// the outputs placed where the caller asked. Returns the response and
    /// the path its tensors took.
    pub async fn infer_decoded(
        &self,
        owner: u64,
        deadline: Option<Instant>,
        req: &mut ModelInferRequest,
        model: ModelId,
        meta: &ModelMetadataResponse,
    ) -> Result<(ModelInferResponse, TransportPath), Status> {
        // RDMA inputs are pulled before a worker permit is taken, so a slow
        // link does not hold one; the request then goes on inline.
        let via_rdma = if rdma::uses_rdma(req) {
            Some(rdma::prepare(self.rdma.as_deref(), owner, req).await?)
        } else {
            None
        };
        let with_shm = shm::uses_shm(req);
        if !with_shm {
            validate_request(req, meta).map_err(AgentError::from)?;
        }
        let priority = crate::dispatch::tenant::request_priority(&req.parameters)?;
        let mut lease = self
            .pool
            .acquire_prioritized(model, None, deadline, priority)
            .await?;
        let process = Arc::clone(lease.process());
        let (prepared, path) = if with_shm {
            let p = shm::prepare(&self.shm, owner, lease.worker(), &process, req).await?;
            let path = match p {
                shm::Prepared::PassThrough => TransportPath::ShmPassthrough,
                shm::Prepared::Inline(_) => {
                    validate_request(req, meta).map_err(AgentError::from)?;
                    TransportPath::ShmInline
                }
            };
            (Some(p), path)
        } else if via_rdma.is_some() {
            (None, TransportPath::Rdma)
        } else {
            (None, TransportPath::Grpc)
        };
        let mut out = Request::new(std::mem::take(req));
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Status::deadline_exceeded(
                    "deadline exceeded before the request reached a worker",
                ));
            }
            out.set_timeout(left);
        }
        let mut client = process.client.clone();
        let answer = tokio::select! {
            biased;
            answer = client.model_infer(out) => answer,
            () = process.abort.cancelled() => return Err(aborted(lease.worker().id())),
        };
        let mut resp = match answer {
            Ok(resp) => {
                lease.served();
                resp.into_inner()
            }
            Err(s) => {
                // A status the worker sent is progress (the stall watchdog);
                // a broken connection is not.
                if std::error::Error::source(&s).is_none() {
                    lease.answered();
                }
                let s = worker_status(lease.worker(), s);
                return Err(judge_worker_status(
                    lease.worker().reporter(),
                    process.pid,
                    &self.patterns,
                    s,
                ));
            }
        };
        drop(lease);
        if let Some(p) = prepared {
            shm::finish(&self.shm, owner, p, &mut resp)?;
        }
        if let Some(p) = via_rdma {
            p.finish(&mut resp).await?;
        }
        Ok((resp, path))
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
            extensions: vec![
                "model_repository".into(),
                "statistics".into(),
                "system_shared_memory".into(),
            ],
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let name = &req.get_ref().name;
        match self.pool.models().metadata(name) {
            Some(meta) => Ok(Response::new((*meta).clone())),
            None => Err(self.pool.unavailable_reason(name).into()),
        }
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let (worker, process) = self.ready_for(&req.get_ref().name)?;
        let mut client = process.client.clone();
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
        if !req.name.is_empty() && self.pool.models().metadata(&req.name).is_none() {
            return Err(self.pool.unavailable_reason(&req.name).into());
        }
        // Sum what every ready worker reports, per model.
        let mut merged: HashMap<String, ModelStatistics> = HashMap::new();
        for w in self.pool.workers() {
            let snap = w.snapshot();
            let Some(p) = snap.process.as_ref().filter(|_| snap.routable) else {
                continue;
            };
            let mut client = p.client.clone();
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
            .model_readiness()
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
        shm::forget_on_workers(&self.pool, &self.shm, owner, Some(&req.name)).await;
        self.shm.registry().handle_register(owner, &req)?;
        tracing::debug!(owner, name = %req.name, key = %req.key, bytes = req.byte_size, "shared memory registered");
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        let owner = conn::owner(&req);
        Ok(Response::new(
            self.shm.registry().handle_status(owner, req.get_ref())?,
        ))
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        let owner = conn::owner(&req);
        let req = req.into_inner();
        self.shm.registry().handle_unregister(owner, &req)?;
        let name = (!req.name.is_empty()).then_some(req.name.as_str());
        shm::forget_on_workers(&self.pool, &self.shm, owner, name).await;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    /// Reached only when this service is served on its own (the agent's
    /// port answers `ModelInfer` by pass-through): the decoding path.
    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let started = Instant::now();
        let deadline = request_timeout(req.metadata()).map(|t| started + t);
        let owner = conn::owner(&req);
        let _ticket = self.pool.admit();
        let mut req = req.into_inner();
        let lookup = self.pool.models().lookup(&req.model_name);
        let metrics = self
            .metrics
            .model(lookup.as_ref().map(|(id, _)| *id), self.pool.models());
        let result = async {
            let (id, meta) = lookup.ok_or_else(|| self.pool.unavailable_reason(&req.model_name))?;
            let meta = meta.ok_or_else(|| self.pool.unavailable_reason(&req.model_name))?;
            let (resp, path) = self
                .infer_decoded(owner, deadline, &mut req, id, &meta)
                .await?;
            self.metrics.transport(path);
            Ok(Response::new(resp))
        }
        .await;
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        metrics.request(code, started.elapsed());
        result
    }

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
        model_stream::serve(self.clone(), req).await
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
        add(&mut a.compute_output, b.compute_output);
        add(&mut a.compute_infer, b.compute_infer);
    }
}
