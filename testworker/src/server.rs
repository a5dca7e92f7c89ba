//! The OIP service of the test worker.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use infermesh_proto::FAULT_PARAMETER;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_response::InferOutputTensor;
use infermesh_proto::inference::model_metadata_response::TensorMetadata;
use infermesh_proto::inference::repository_index_response::ModelIndex;
use infermesh_proto::inference::*;
use infermesh_proto::tensor::{self, f32_to_raw, raw_to_f32};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::dense;
use crate::fault::{self, CUDA_ERROR_MESSAGE, FaultKind};

/// How a test worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Model names served; each computes the `dense` model.
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
    nan: AtomicBool,
    slow: AtomicBool,
    stats: Mutex<HashMap<String, ModelStats>>,
}

impl TestWorker {
    /// A worker with `opts`; its startup clock starts now.
    pub fn new(opts: WorkerOptions) -> Self {
        Self(Arc::new(Inner {
            slots: Semaphore::new(opts.concurrency.max(1)),
            opts,
            started: Instant::now(),
            served: AtomicU64::new(0),
            scheduled_fault_fired: AtomicBool::new(false),
            sticky: AtomicBool::new(false),
            hung: AtomicBool::new(false),
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
        Ok(ModelMetadataResponse {
            name: name.to_string(),
            versions: vec!["1".into()],
            platform: "infermesh_testworker".into(),
            inputs: vec![TensorMetadata {
                name: dense::INPUT.into(),
                datatype: "FP32".into(),
                shape: vec![-1, dense::IN_FEATURES as i64],
            }],
            outputs: vec![TensorMetadata {
                name: dense::OUTPUT.into(),
                datatype: "FP32".into(),
                shape: vec![-1, dense::OUT_FEATURES as i64],
            }],
        })
    }

    /// Runs one inference: faults, validation, a slot for the service time,
    /// the dense math, and a reply in the form the request used.
    pub async fn infer(&self, req: ModelInferRequest) -> Result<ModelInferResponse, Status> {
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
        if self.sticky.load(Ordering::SeqCst) {
            return Err(Status::internal(CUDA_ERROR_MESSAGE));
        }
        if !self.ready() {
            return Err(Status::unavailable("model is loading"));
        }
        let meta = self.metadata(&req.model_name)?;
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
            raw_to_f32(&req.raw_input_contents[0]).unwrap_or_default()
        } else {
            req.inputs[0]
                .contents
                .as_ref()
                .map(|c| c.fp32_contents.clone())
                .unwrap_or_default()
        };
        let mut output = dense::forward(&input);
        if self.nan.load(Ordering::SeqCst) {
            output.fill(f32::NAN);
        }
        let rows = (input.len() / dense::IN_FEATURES) as i64;
        let mut out = InferOutputTensor {
            name: dense::OUTPUT.into(),
            datatype: "FP32".into(),
            shape: vec![rows, dense::OUT_FEATURES as i64],
            ..Default::default()
        };
        let raw_output_contents = if raw {
            vec![f32_to_raw(&output).into()]
        } else {
            out.contents = Some(InferTensorContents {
                fp32_contents: output,
                ..Default::default()
            });
            vec![]
        };
        self.served.fetch_add(1, Ordering::SeqCst);
        self.record(&req.model_name, started.elapsed(), rows as u64, true)
            .await;
        Ok(ModelInferResponse {
            model_name: req.model_name,
            model_version: "1".into(),
            id: req.id,
            parameters: HashMap::new(),
            outputs: vec![out],
            raw_output_contents,
        })
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
            extensions: vec!["model_repository".into(), "statistics".into()],
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
        let name = &req.get_ref().name;
        self.metadata(name)?;
        let tensor = |name: &str, dims: i64| (name.to_string(), vec![-1, dims]);
        let (iname, idims) = tensor(dense::INPUT, dense::IN_FEATURES as i64);
        let (oname, odims) = tensor(dense::OUTPUT, dense::OUT_FEATURES as i64);
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
        self.infer(req.into_inner()).await.map(Response::new)
    }

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let worker = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                let reply = match worker.infer(req).await {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use infermesh_proto::inference::model_infer_request::InferInputTensor;

    fn request(fault: Option<&str>) -> ModelInferRequest {
        let mut req = ModelInferRequest {
            model_name: "dense".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![1, 16],
                ..Default::default()
            }],
            raw_input_contents: vec![f32_to_raw(&[0.25; 16]).into()],
            ..Default::default()
        };
        if let Some(kind) = fault {
            req.parameters.insert(
                FAULT_PARAMETER.into(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::StringParam(kind.into())),
                },
            );
        }
        req
    }

    fn outputs(resp: &ModelInferResponse) -> Vec<f32> {
        raw_to_f32(&resp.raw_output_contents[0]).unwrap()
    }

    #[tokio::test]
    async fn sticky_cuda_error_fails_every_later_inference_but_stays_live() {
        let w = TestWorker::new(WorkerOptions::default());
        assert!(w.infer(request(None)).await.is_ok());
        let err = w.infer(request(Some("cuda-sticky"))).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
        assert!(err.message().contains("illegal memory access"));
        let again = w.infer(request(None)).await.unwrap_err();
        assert_eq!(again.code(), tonic::Code::Internal);
        use infermesh_proto::GrpcInferenceService;
        let live = w
            .server_live(Request::new(ServerLiveRequest {}))
            .await
            .unwrap();
        assert!(live.get_ref().live, "like Triton, it still reports live");
    }

    #[tokio::test]
    async fn nan_fault_outputs_nan_after_the_configured_count() {
        let w = TestWorker::new(WorkerOptions {
            fault: Some(FaultKind::Nan),
            fault_after: 2,
            ..Default::default()
        });
        for _ in 0..2 {
            assert!(
                outputs(&w.infer(request(None)).await.unwrap())
                    .iter()
                    .all(|v| v.is_finite())
            );
        }
        assert!(
            outputs(&w.infer(request(None)).await.unwrap())
                .iter()
                .all(|v| v.is_nan())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_fault_multiplies_service_time() {
        let w = TestWorker::new(WorkerOptions {
            service_time: Duration::from_millis(20),
            ..Default::default()
        });
        let t0 = tokio::time::Instant::now();
        w.infer(request(Some("slow"))).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn hang_fault_stops_answering_everything() {
        use infermesh_proto::GrpcInferenceService;
        let w = TestWorker::new(WorkerOptions::default());
        let hung =
            tokio::time::timeout(Duration::from_secs(30), w.infer(request(Some("hang")))).await;
        assert!(hung.is_err(), "the faulting request never answers");
        let live = tokio::time::timeout(
            Duration::from_secs(30),
            w.server_live(Request::new(ServerLiveRequest {})),
        )
        .await;
        assert!(live.is_err(), "liveness probes time out too");
    }

    #[tokio::test]
    async fn unknown_fault_kind_is_invalid_argument() {
        let w = TestWorker::new(WorkerOptions::default());
        let err = w.infer(request(Some("meltdown"))).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(w.infer(request(None)).await.is_ok());
    }
}
