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
    DrainRequest, DrainResponse, GpuStatus, HealthResult, InjectGpuEventRequest,
    InjectGpuEventResponse, RestartWorkerRequest, RestartWorkerResponse, RunHealthChecksRequest,
    RunHealthChecksResponse, StatusRequest, StatusResponse, UndrainRequest, UndrainResponse,
    WorkerEvent, WorkerStatus, inject_gpu_event_request,
};
use infermesh_sentinel::{Event, State};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::config::{AdminToken, HealthConfig};
use crate::health::{self, HealthRecord};
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::registry::Phase;
use crate::worker::{Input, Worker};

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
    /// Token of mutating RPCs; `None` refuses them.
    pub token: Option<AdminToken>,
    /// Health checks.
    pub health: Arc<HealthConfig>,
    /// The registration phase: drain and undrain move it.
    pub phase: Arc<watch::Sender<Phase>>,
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
    } else if s.pool.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
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
                    health: w
                        .health()
                        .into_iter()
                        .map(|r| health_result(w.id(), r))
                        .collect(),
                }
            })
            .collect();
        StatusResponse {
            node_id: self.node_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            state: if self.pool.is_stopping() {
                "stopping"
            } else if self.pool.is_draining() {
                "draining"
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

fn health_result(worker: &str, r: HealthRecord) -> HealthResult {
    HealthResult {
        worker: worker.to_string(),
        check: r.verdict.check,
        model: r.verdict.model,
        pass: r.verdict.pass,
        reason: r.verdict.reason,
        latency_us: r.verdict.latency.as_micros() as u64,
        unix_micros: r.unix_micros,
    }
}

impl AdminState {
    /// Refuses a mutating call without the right `authorization: Bearer` token.
    fn authorize<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(AdminToken(expected)) = &self.token else {
            return Err(Status::unauthenticated(
                "this agent has no admin token (start it with --admin-token-file); mutating admin calls are refused",
            ));
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "missing or wrong admin token (give `authorization: Bearer <token>`; the CLI reads it from --token-file or INFERMESH_TOKEN_FILE)",
            ))
        }
    }

    fn worker(&self, id: &str) -> Result<&Arc<Worker>, Status> {
        self.pool
            .workers()
            .iter()
            .find(|w| w.id() == id)
            .ok_or_else(|| Status::not_found(format!("no worker '{id}' on this node")))
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
        self.authorize(&req)?;
        let id = &req.get_ref().worker;
        let worker = self.worker(id)?;
        tracing::info!(worker = %id, "restart requested through the admin API");
        worker.report(Input::Sentinel(Event::Restart));
        Ok(Response::new(RestartWorkerResponse {}))
    }

    async fn inject_gpu_event(
        &self,
        req: Request<InjectGpuEventRequest>,
    ) -> Result<Response<InjectGpuEventResponse>, Status> {
        self.authorize(&req)?;
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

    async fn drain(&self, req: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        self.authorize(&req)?;
        if self.pool.is_stopping() {
            return Err(Status::failed_precondition("the agent is shutting down"));
        }
        self.pool.set_draining(true);
        self.phase.send_if_modified(|p| {
            let changed = *p == Phase::Serving;
            if changed {
                *p = Phase::Draining;
            }
            changed
        });
        let in_flight = self.pool.load().in_flight;
        tracing::warn!(
            in_flight,
            "node drained through the admin API: advertising `draining`"
        );
        Ok(Response::new(DrainResponse { in_flight }))
    }

    async fn undrain(
        &self,
        req: Request<UndrainRequest>,
    ) -> Result<Response<UndrainResponse>, Status> {
        self.authorize(&req)?;
        if self.pool.is_stopping() {
            return Err(Status::failed_precondition("the agent is shutting down"));
        }
        self.pool.set_draining(false);
        self.phase.send_if_modified(|p| {
            let changed = *p == Phase::Draining;
            if changed {
                *p = Phase::Serving;
            }
            changed
        });
        tracing::info!("node undrained through the admin API: advertising `serving`");
        Ok(Response::new(UndrainResponse {}))
    }

    async fn run_health_checks(
        &self,
        req: Request<RunHealthChecksRequest>,
    ) -> Result<Response<RunHealthChecksResponse>, Status> {
        self.authorize(&req)?;
        let only = &req.get_ref().worker;
        let workers: Vec<&Arc<Worker>> = if only.is_empty() {
            self.pool.workers().iter().collect()
        } else {
            vec![self.worker(only)?]
        };
        let mut results = Vec::new();
        for w in workers {
            let up = matches!(w.state(), State::Ready | State::Degraded | State::Draining);
            let Some(process) = w.process().filter(|_| up) else {
                results.push(HealthResult {
                    worker: w.id().to_string(),
                    check: "state".into(),
                    pass: false,
                    reason: format!("worker is {}, not serving", w.state().as_str()),
                    ..Default::default()
                });
                continue;
            };
            let verdicts = health::run_round(&self.health, w, &self.metrics, process.client).await;
            if let Some(event) = health::round_event(&verdicts) {
                w.report(Input::Process {
                    pid: process.pid,
                    event,
                });
            }
            results.extend(
                verdicts
                    .into_iter()
                    .map(|v| health_result(w.id(), HealthRecord::now(v))),
            );
        }
        Ok(Response::new(RunHealthChecksResponse { results }))
    }
}
