//! The OIP service of the test worker.
//!
//! Like Triton, it serves the system shared-memory extension: clients
//! register POSIX shm regions and pass tensors by reference. Regions belong
//! to the client connection that registered them (its peer address, hashed;
//! in-process calls without an address share owner 0). The worker cannot
//! see a connection close, so a client's regions stay registered until it
//! unregisters them — the agent, which sees connections, drops them itself.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use infermesh_proto::FAULT_PARAMETER;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_response::InferOutputTensor;
use infermesh_proto::inference::repository_index_response::ModelIndex;
use infermesh_proto::inference::*;
use infermesh_proto::tensor;
use infermesh_transport::shm::{Owner, RegistryConfig};
use infermesh_transport::{ShmError, ShmRegistry};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::dense;
use crate::fault::{self, CUDA_ERROR_MESSAGE, FaultKind};
use crate::model::{Input, Model};

/// How a test worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Model names served; `identity` copies its input, every other name
    /// computes the `dense` model (see [`crate::model`]).
    pub models: Vec<String>,
    /// Time each request holds a slot, emulating GPU compute.
    pub service_time: Duration,
    /// Number of slots (requests computed at once).
    pub concurrency: usize,
    /// Simulated model load time before the worker reports ready.
    pub startup: Duration,
    /// A fault to fire after `fault_after` requests.
    pub fault: Option<FaultKind>,
    /// Requests served before `fault` fires.
    pub fault_after: u64,
    /// Where shared-memory keys are opened, and the regions allowed per
    /// client connection.
    pub shm: RegistryConfig,
    /// Whether the shared-memory RPCs are served; off, they answer
    /// UNIMPLEMENTED like a server without the extension.
    pub shm_rpcs: bool,
    /// Whether `ModelConfig` is served (saying how many requests run at
    /// once: `instance_group` count = `concurrency`); off, it answers
    /// UNIMPLEMENTED like a server without Triton's extension, and the
    /// agent must learn the worker's parallelism from its latencies.
    pub model_config: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            models: vec![dense::DEFAULT_MODEL.to_string()],
            service_time: Duration::ZERO,
            concurrency: 64,
            startup: Duration::ZERO,
            fault: None,
            fault_after: 0,
            shm: RegistryConfig::default(),
            shm_rpcs: true,
            model_config: true,
        }
    }
}

#[derive(Default)]
struct ModelStats {
    success: StatisticDuration,
    fail: StatisticDuration,
    inference_count: u64,
    last_inference_ms: u64,
}

/// The test worker's `GRPCInferenceService`; cheap to clone (shared state).
#[derive(Clone)]
pub struct TestWorker(Arc<Inner>);

impl std::ops::Deref for TestWorker {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// The state behind a [`TestWorker`].
pub struct Inner {
    opts: WorkerOptions,
    started: Instant,
    slots: Semaphore,
    served: AtomicU64,
    scheduled_fault_fired: AtomicBool,
    sticky: AtomicBool,
    hung: AtomicBool,
    stalled: AtomicBool,
    nan: AtomicBool,
    slow: AtomicBool,
    stats: Mutex<HashMap<String, ModelStats>>,
    shm: ShmRegistry,
}

impl TestWorker {
    /// A worker with `opts`; its startup clock starts now.
    pub fn new(opts: WorkerOptions) -> Self {
        Self(Arc::new(Inner {
            slots: Semaphore::new(opts.concurrency.max(1)),
            shm: ShmRegistry::new(opts.shm.clone()),
            opts,
            started: Instant::now(),
            served: AtomicU64::new(0),
            scheduled_fault_fired: AtomicBool::new(false),
            sticky: AtomicBool::new(false),
            hung: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            nan: AtomicBool::new(false),
            slow: AtomicBool::new(false),
            stats: Mutex::new(HashMap::new()),
        }))
    }
}

impl Inner {
    fn ready(&self) -> bool {
        self.started.elapsed() >= self.opts.startup
    }

    fn serves(&self, model: &str) -> bool {
        self.opts.models.iter().any(|m| m == model)
    }

    /// A hung worker never answers: every RPC awaits forever.
    async fn hang_if_hung(&self) {
        if self.hung.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn fire(&self, kind: FaultKind) {
        tracing::warn!(fault = %kind, "fault injected");
        match kind {
            FaultKind::CudaCrash => fault::crash_like_cuda(),
            FaultKind::CudaSticky => {
                eprintln!("{CUDA_ERROR_MESSAGE}");
                self.sticky.store(true, Ordering::SeqCst);
            }
            FaultKind::Hang => self.hung.store(true, Ordering::SeqCst),
            FaultKind::Stall => self.stalled.store(true, Ordering::SeqCst),
            FaultKind::Nan => self.nan.store(true, Ordering::SeqCst),
            FaultKind::Slow => self.slow.store(true, Ordering::SeqCst),
        }
    }

    fn service_time(&self) -> Duration {
        if self.slow.load(Ordering::SeqCst) {
            (self.opts.service_time * 10).max(Duration::from_millis(10))
        } else {
            self.opts.service_time
        }
    }

    fn metadata(&self, name: &str) -> Result<ModelMetadataResponse, Status> {
        if !self.serves(name) {
            return Err(Status::not_found(format!("unknown model '{name}'")));
        }
        let (input, output) = Model::of(name).tensors();
        Ok(ModelMetadataResponse {
            name: name.to_string(),
            versions: vec!["1".into()],
            platform: "infermesh_testworker".into(),
            inputs: vec![input],
            outputs: vec![output],
        })
    }

    /// UNIMPLEMENTED unless the shared-memory RPCs are on.
    fn shm_rpcs(&self) -> Result<(), Status> {
        if self.opts.shm_rpcs {
            Ok(())
        } else {
            Err(Status::unimplemented(
                "this worker was started with --no-shm: no system shared memory",
            ))
        }
    }

    /// The shared-memory regions clients registered.
    pub fn shm_registry(&self) -> &ShmRegistry {
        &self.shm
    }

    /// Runs one inference for an in-process caller (shared-memory owner 0).
    pub async fn infer(&self, req: ModelInferRequest) -> Result<ModelInferResponse, Status> {
        self.infer_for(0, req).await
    }

    /// Runs one inference for the client connection `owner`: faults,
    /// shared-memory inputs, validation, a slot for the service time, the
    /// model, shared-memory outputs, and a reply in the form the request
    /// used.
    pub async fn infer_for(
        &self,
        owner: Owner,
        mut req: ModelInferRequest,
    ) -> Result<ModelInferResponse, Status> {
        self.hang_if_hung().await;
        if let Some(kind) = requested_fault(&req)? {
            self.fire(kind);
        } else if let Some(kind) = self.opts.fault {
            // Fires once; the fault's effect (sticky, NaN, slow, hang) persists.
            let due = self.served.load(Ordering::SeqCst) >= self.opts.fault_after;
            if due && !self.scheduled_fault_fired.swap(true, Ordering::SeqCst) {
                self.fire(kind);
            }
        }
        self.hang_if_hung().await;
        if self.stalled.load(Ordering::SeqCst) {
            // Inference is stuck; the other RPCs are not.
            std::future::pending::<()>().await;
        }
        if self.sticky.load(Ordering::SeqCst) {
            return Err(Status::internal(CUDA_ERROR_MESSAGE));
        }
        if !self.ready() {
            return Err(Status::unavailable("model is loading"));
        }
        let mut meta = self.metadata(&req.model_name)?;
        let model = Model::of(&req.model_name);
        if model == Model::Identity {
            if let Some(resp) = self.identity_in_shm(owner, &req).await? {
                return Ok(resp);
            }
        }
        self.shm.take_inputs(owner, &mut req).map_err(shm_status)?;
        if let (Some(spec), Some(input)) = (meta.inputs.first_mut(), req.inputs.first()) {
            spec.shape = model.input_shape_for(&input.shape);
        }
        tensor::validate_request(&req, &meta)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;

        let started = Instant::now();
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Status::unavailable("shutting down"))?;
        let wait = self.service_time();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let raw = !req.raw_input_contents.is_empty();
        let input = if raw {
            Input::Raw(&req.raw_input_contents[0])
        } else {
            Input::Typed(
                req.inputs[0]
                    .contents
                    .as_ref()
                    .map_or(&[][..], |c| &c.fp32_contents[..]),
            )
        };
        let nan = self.nan.load(Ordering::SeqCst);
        let output = model.compute(input, &req.inputs[0].shape, nan);
        let rows = output.rows;
        let mut out = InferOutputTensor {
            name: dense::OUTPUT.into(),
            datatype: "FP32".into(),
            shape: output.shape.clone(),
            ..Default::default()
        };
        let raw_output_contents = if raw {
            vec![output.into_raw()]
        } else {
            out.contents = Some(InferTensorContents {
                fp32_contents: output.into_values(),
                ..Default::default()
            });
            vec![]
        };
        let mut resp = ModelInferResponse {
            model_name: req.model_name.clone(),
            model_version: "1".into(),
            id: req.id.clone(),
            parameters: HashMap::new(),
            outputs: vec![out],
            raw_output_contents,
        };
        self.shm
            .place_outputs(owner, &req, &mut resp)
            .map_err(shm_status)?;
        self.served.fetch_add(1, Ordering::SeqCst);
        self.record(&req.model_name, started.elapsed(), rows, true)
            .await;
        Ok(resp)
    }

    /// `identity` with its input and its output both in shared memory:
    /// the input's window is copied to the output's in the kernel, one copy
    /// (Triton's identity backend on system shared memory makes one), where
    /// reading the input here and writing it back would make two. `None`
    /// when the request is not so (the ordinary path serves it).
    async fn identity_in_shm(
        &self,
        owner: Owner,
        req: &ModelInferRequest,
    ) -> Result<Option<ModelInferResponse>, Status> {
        let in_shm = |p: &HashMap<String, InferParameter>| {
            p.contains_key(infermesh_transport::shm::REGION_PARAM)
        };
        let [input] = &req.inputs[..] else {
            return Ok(None);
        };
        let output = req.outputs.iter().find(|o| o.name == dense::OUTPUT);
        // A worker whose outputs are NaN (the injected fault) computes them.
        if self.nan.load(Ordering::SeqCst)
            || !req.raw_input_contents.is_empty()
            || !in_shm(&input.parameters)
            || !output.is_some_and(|o| in_shm(&o.parameters))
        {
            return Ok(None);
        }
        let window = infermesh_transport::shm::ShmRef::from_params(&input.name, &input.parameters)
            .map_err(shm_status)?
            .map_or(0, |r| r.byte_size);
        let want = tensor::element_count(&input.shape).and_then(|n| n.checked_mul(4));
        if input.name != dense::INPUT || input.datatype != "FP32" || want != Some(window as usize) {
            return Err(Status::invalid_argument(format!(
                "identity takes one FP32 input '{}' whose window holds its shape ({window} bytes for shape {:?})",
                dense::INPUT,
                input.shape
            )));
        }
        let started = Instant::now();
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Status::unavailable("shutting down"))?;
        let wait = self.service_time();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        self.shm
            .copy_input_to_output(owner, req, 0, dense::OUTPUT)
            .map_err(shm_status)?;
        let rows = input.shape.first().copied().unwrap_or(1).max(0) as u64;
        let resp = ModelInferResponse {
            model_name: req.model_name.clone(),
            model_version: "1".into(),
            id: req.id.clone(),
            parameters: HashMap::new(),
            outputs: vec![InferOutputTensor {
                name: dense::OUTPUT.into(),
                datatype: "FP32".into(),
                shape: input.shape.clone(),
                ..Default::default()
            }],
            // Triton's convention: an empty entry for an output in shared
            // memory.
            raw_output_contents: vec![Default::default()],
        };
        self.served.fetch_add(1, Ordering::SeqCst);
        self.record(&req.model_name, started.elapsed(), rows, true)
            .await;
        Ok(Some(resp))
    }

    async fn record(&self, model: &str, took: Duration, rows: u64, ok: bool) {
        let mut stats = self.stats.lock().await;
        let s = stats.entry(model.to_string()).or_default();
        let d = if ok { &mut s.success } else { &mut s.fail };
        d.count += 1;
        d.ns += took.as_nanos() as u64;
        if ok {
            s.inference_count += rows;
            s.last_inference_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
        }
    }
}

/// The shared-memory owner of a call: its client connection's address,
/// hashed; 0 for in-process calls.
fn connection_owner<T>(req: &Request<T>) -> Owner {
    req.remote_addr().map_or(0, |addr| {
        let mut h = DefaultHasher::new();
        addr.hash(&mut h);
        h.finish()
    })
}

fn shm_status(e: ShmError) -> Status {
    e.to_status()
}

/// The fault a request asks for through the `infermesh_fault` parameter.
fn requested_fault(req: &ModelInferRequest) -> Result<Option<FaultKind>, Status> {
    match req
        .parameters
        .get(FAULT_PARAMETER)
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => Ok(None),
        Some(ParameterChoice::StringParam(s)) => {
            s.parse().map(Some).map_err(Status::invalid_argument)
        }
        Some(_) => Err(Status::invalid_argument(format!(
            "parameter '{FAULT_PARAMETER}' must be a string"
        ))),
    }
}

#[tonic::async_trait]
impl infermesh_proto::GrpcInferenceService for TestWorker {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        self.hang_if_hung().await;
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        self.hang_if_hung().await;
        Ok(Response::new(ServerReadyResponse {
            ready: self.ready(),
        }))
    }

    async fn model_ready(
        &self,
        req: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        self.hang_if_hung().await;
        let ready = self.ready() && self.serves(&req.get_ref().name);
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        self.hang_if_hung().await;
        Ok(Response::new(ServerMetadataResponse {
            name: "infermesh-testworker".into(),
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
        self.hang_if_hung().await;
        self.metadata(&req.get_ref().name).map(Response::new)
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        self.hang_if_hung().await;
        if !self.opts.model_config {
            return Err(Status::unimplemented(
                "ModelConfig is not served (--no-model-config)",
            ));
        }
        let name = &req.get_ref().name;
        self.metadata(name)?;
        let (input, output) = Model::of(name).tensors();
        let (iname, idims) = (input.name, input.shape);
        let (oname, odims) = (output.name, output.shape);
        Ok(Response::new(ModelConfigResponse {
            config: Some(ModelConfig {
                name: name.clone(),
                platform: "infermesh_testworker".into(),
                backend: "infermesh-testworker".into(),
                max_batch_size: 0,
                input: vec![ModelInput {
                    name: iname,
                    data_type: DataType::TypeFp32 as i32,
                    dims: idims,
                    ..Default::default()
                }],
                output: vec![ModelOutput {
                    name: oname,
                    data_type: DataType::TypeFp32 as i32,
                    dims: odims,
                    ..Default::default()
                }],
                instance_group: vec![ModelInstanceGroup {
                    name: format!("{name}_0"),
                    count: self.opts.concurrency as i32,
                    kind: model_instance_group::Kind::Cpu as i32,
                    ..Default::default()
                }],
                model_transaction_policy: Some(ModelTransactionPolicy { decoupled: false }),
            }),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        self.hang_if_hung().await;
        let wanted = &req.get_ref().name;
        if !wanted.is_empty() {
            self.metadata(wanted)?;
        }
        let stats = self.stats.lock().await;
        let model_stats = self
            .opts
            .models
            .iter()
            .filter(|m| wanted.is_empty() || *m == wanted)
            .map(|m| {
                let s = stats.get(m);
                ModelStatistics {
                    name: m.clone(),
                    version: "1".into(),
                    last_inference: s.map_or(0, |s| s.last_inference_ms),
                    inference_count: s.map_or(0, |s| s.inference_count),
                    execution_count: s.map_or(0, |s| s.success.count),
                    inference_stats: Some(InferStatistics {
                        success: s.map(|s| s.success),
                        fail: s.map(|s| s.fail),
                        ..Default::default()
                    }),
                    batch_stats: vec![],
                }
            })
            .collect();
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        _: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        self.hang_if_hung().await;
        let state = if self.ready() { "READY" } else { "LOADING" };
        let models = self
            .opts
            .models
            .iter()
            .map(|m| ModelIndex {
                name: m.clone(),
                version: "1".into(),
                state: state.into(),
                reason: String::new(),
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let owner = connection_owner(&req);
        // What a tracing server would join: logged so tests see the W3C
        // trace context reached the worker (only sent when tracing is on).
        if let Some(tp) = req.metadata().get("traceparent") {
            tracing::info!(traceparent = %tp.to_str().unwrap_or("(not text)").escape_debug(), "trace context received");
        }
        self.infer_for(owner, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
        let owner = connection_owner(&req);
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let worker = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                let reply = match worker.infer_for(owner, req).await {
                    Ok(resp) => ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(resp),
                    },
                    Err(status) => ModelStreamInferResponse {
                        error_message: status.message().to_string(),
                        infer_response: None,
                    },
                };
                if tx.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn system_shared_memory_status(
        &self,
        req: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        self.hang_if_hung().await;
        self.shm_rpcs()?;
        let owner = connection_owner(&req);
        self.shm
            .handle_status(owner, req.get_ref())
            .map(Response::new)
            .map_err(shm_status)
    }

    async fn system_shared_memory_register(
        &self,
        req: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        self.hang_if_hung().await;
        self.shm_rpcs()?;
        let owner = connection_owner(&req);
        self.shm
            .handle_register(owner, req.get_ref())
            .map(|()| Response::new(SystemSharedMemoryRegisterResponse {}))
            .map_err(shm_status)
    }

    async fn system_shared_memory_unregister(
        &self,
        req: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        self.hang_if_hung().await;
        self.shm_rpcs()?;
        let owner = connection_owner(&req);
        self.shm
            .handle_unregister(owner, req.get_ref())
            .map(|()| Response::new(SystemSharedMemoryUnregisterResponse {}))
            .map_err(shm_status)
    }
}

#[cfg(test)]
mod tests;
