//! The admin address: `/metrics` (OpenMetrics text), `/livez`, `/readyz`
//! (Kubernetes probes) and the `infermesh.v1.Admin` gRPC service, on one port.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use infermesh_gpu::{GpuError, GpuEvent, GpuEventKind, GpuTelemetry};
use infermesh_proto::admin::admin_server::{Admin, AdminServer};
use infermesh_proto::admin::{
    GpuStatus, InjectGpuEventRequest, InjectGpuEventResponse, RestartWorkerRequest,
    RestartWorkerResponse, StatusRequest, StatusResponse, WorkerEvent, WorkerStatus,
    inject_gpu_event_request,
};
use infermesh_sentinel::Event;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::worker::Input;

/// Output lines per worker returned by Status.
const STATUS_OUTPUT_LINES: usize = 20;

/// State behind the admin endpoints.
#[derive(Clone)]
pub struct AdminState {
    /// Node id.
    pub node_id: String,
    /// The worker pool.
    pub pool: Arc<Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// When the agent started.
    pub started: Instant,
    /// GPU telemetry.
    pub gpus: Arc<dyn GpuTelemetry>,
}

/// The admin router: HTTP endpoints and the admin gRPC service.
pub fn router(state: AdminState) -> Router {
    let grpc = tonic::service::Routes::new(AdminServer::new(state.clone())).into_axum_router();
    let http = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    grpc.merge(http)
}

async fn metrics(axum::extract::State(s): axum::extract::State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(&s.pool),
    )
}

async fn readyz(axum::extract::State(s): axum::extract::State<AdminState>) -> impl IntoResponse {
    if s.pool.is_stopping() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else if s.pool.any_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no ready worker\n")
    }
}

impl AdminState {
    /// The Status answer.
    pub fn status(&self) -> StatusResponse {
        let load = self.pool.load();
        let workers = self
            .pool
            .workers()
            .iter()
            .map(|w| {
                let process = w.process();
                WorkerStatus {
                    id: w.id().to_string(),
                    state: w.state().as_str().to_string(),
                    pid: process.as_ref().map_or(0, |p| p.pid),
                    address: process
                        .as_ref()
                        .map(|p| p.address.to_string())
                        .unwrap_or_default(),
                    models: w.models().map(|m| m.to_vec()).unwrap_or_default(),
                    in_flight: w.in_flight() as u64,
                    requests: w.requests(),
                    last_exit: w.last_exit().unwrap_or_default(),
                    gpu: w.spec.gpu,
                    command: w.spec.command.clone(),
                    last_output: w.last_output(STATUS_OUTPUT_LINES),
                    routable: w.routable(),
                    restarts: w.restarts(),
                    last_fault: w.last_fault().unwrap_or_default(),
                    startup_ms: w.startup_ms(),
                    events: w
                        .events()
                        .into_iter()
                        .map(|e| WorkerEvent {
                            unix_micros: e.unix_micros,
                            kind: e.kind.to_string(),
                            detail: e.detail,
                        })
                        .collect(),
                }
            })
            .collect();
        StatusResponse {
            node_id: self.node_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            state: if self.pool.is_stopping() {
                "stopping"
            } else if self.pool.degraded() {
                "degraded"
            } else {
                "serving"
            }
            .to_string(),
            weight: load.weight,
            in_flight: load.in_flight,
            queued: load.queued,
            busy_ratio: load.busy_ratio,
            workers,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            gpu_backend: self.gpus.backend().to_string(),
            gpus: self.gpu_status(),
        }
    }

    fn gpu_status(&self) -> Vec<GpuStatus> {
        let samples = self.gpus.sample();
        self.gpus
            .devices()
            .into_iter()
            .map(|d| {
                let s = samples
                    .iter()
                    .find(|s| s.index == d.index)
                    .cloned()
                    .unwrap_or_default();
                GpuStatus {
                    index: d.index,
                    uuid: d.uuid,
                    name: d.name,
                    memory_total_bytes: d.memory_total_bytes,
                    utilization_pct: s.utilization_pct,
                    memory_used_bytes: s.memory_used_bytes,
                    temperature_c: s.temperature_c,
                    power_mw: s.power_mw,
                    ecc_uncorrected: s.ecc_uncorrected,
                }
            })
            .collect()
    }
}

#[tonic::async_trait]
impl Admin for AdminState {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(AdminState::status(self)))
    }

    async fn restart_worker(
        &self,
        req: Request<RestartWorkerRequest>,
    ) -> Result<Response<RestartWorkerResponse>, Status> {
        let id = &req.get_ref().worker;
        let worker = self
            .pool
            .workers()
            .iter()
            .find(|w| w.id() == id)
            .ok_or_else(|| Status::not_found(format!("no worker '{id}' on this node")))?;
        tracing::info!(worker = %id, "restart requested through the admin API");
        worker.report(Input::Sentinel(Event::Restart));
        Ok(Response::new(RestartWorkerResponse {}))
    }

    async fn inject_gpu_event(
        &self,
        req: Request<InjectGpuEventRequest>,
    ) -> Result<Response<InjectGpuEventResponse>, Status> {
        let req = req.into_inner();
        let kind = match req.kind {
            Some(inject_gpu_event_request::Kind::Xid(code)) => GpuEventKind::Xid(code),
            Some(inject_gpu_event_request::Kind::EccDoubleBit(true)) => GpuEventKind::EccDoubleBit,
            _ => {
                return Err(Status::invalid_argument(
                    "give an xid or ecc_double_bit = true",
                ));
            }
        };
        let event = GpuEvent {
            index: req.gpu,
            kind,
        };
        match self.gpus.inject(event) {
            Ok(()) => {
                tracing::warn!(
                    gpu = req.gpu,
                    ?kind,
                    "GPU event injected through the admin API"
                );
                Ok(Response::new(InjectGpuEventResponse {}))
            }
            Err(GpuError::NotSupported(_)) => Err(Status::failed_precondition(format!(
                "GPU events can only be injected into the fake backend; this agent runs '{}' (set gpu.backend = \"fake\")",
                self.gpus.backend()
            ))),
            Err(GpuError::UnknownDevice(i)) => {
                Err(Status::not_found(format!("no GPU {i} on this node")))
            }
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }
}
