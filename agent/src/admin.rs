//! The admin address: `/metrics` (OpenMetrics text), `/livez`, `/readyz`
//! (Kubernetes probes) and the `infermesh.v1.Admin` gRPC service, on one
//! port. Any other path is 404, so a mistyped probe fails.
//!
//! Mutating RPCs need the admin token. `Status` answers without it but then
//! leaves out worker command lines and output lines, which may carry
//! secrets (credentials in arguments, paths, data in logs).

pub mod registry;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use infermesh_gpu::{GpuError, GpuEvent, GpuEventKind, GpuTelemetry, KernelLog, PciAddress};
use infermesh_proto::admin::admin_server::{Admin, AdminServer};
use infermesh_proto::admin::{
    DrainRequest, DrainResponse, GpuStatus, HealthResult, InjectGpuEventRequest,
    InjectGpuEventResponse, RestartWorkerRequest, RestartWorkerResponse, RunHealthChecksRequest,
    RunHealthChecksResponse, StatusRequest, StatusResponse, UndrainRequest, UndrainResponse,
    WorkerEvent, WorkerGpuUse, WorkerStatus, inject_gpu_event_request,
};
use infermesh_sentinel::{Event, State};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::admin::registry::Phase;
use crate::config::AdminToken;
use crate::dispatch::pool::Pool;
use crate::metrics::Metrics;
use crate::worker::inbox::Control;
use crate::worker::procfs::ProcTable;
use crate::worker::state::Worker;
use crate::worker::worker_log::HealthRecord;

/// Output lines per worker returned by Status.
const STATUS_OUTPUT_LINES: usize = 20;
/// What Status shows instead of a command line without the admin token.
pub const HIDDEN: &str = "(hidden: needs the admin token)";

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
    /// The driver's Xid lines (the fake one takes injected lines).
    pub kernel_log: Arc<dyn KernelLog>,
    /// Which worker a pid belongs to (per-worker GPU use).
    pub procs: Arc<dyn ProcTable>,
    /// Token of mutating RPCs; `None` refuses them.
    pub token: Option<AdminToken>,
    /// The registration phase: drain and undrain move it.
    pub phase: Arc<watch::Sender<Phase>>,
    /// `sentinel.stable_period`, reported in Status (the drill waits for it).
    pub stable_period: Duration,
}

/// The admin router: HTTP endpoints and the admin gRPC service.
pub fn router(state: AdminState) -> Router {
    let grpc = tonic::service::Routes::new(AdminServer::new(state.clone()))
        .into_axum_router()
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") });
    let http = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    grpc.merge(http)
}

/// The probe-only router of `[tls] probe_listen`: `/livez` and `/readyz`
/// in plaintext, for kubelet probes when the admin port requires client
/// certificates (the kubelet presents none). Nothing else is served there.
pub fn probe_router(state: AdminState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(state)
}

async fn metrics(axum::extract::State(s): axum::extract::State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        {
            s.metrics.record_gpus(&s.gpus.devices(), &s.gpus.sample());
            s.metrics.record_mig(&s.gpus.mig_devices());
            let usage = crate::metrics::gpu_usage::per_worker(&*s.gpus, &*s.procs, &s.pool);
            let named: Vec<_> = s
                .pool
                .workers()
                .iter()
                .map(|w| w.id().to_string())
                .zip(usage)
                .collect();
            s.metrics.record_worker_gpu(&named);
            s.metrics.render(&s.pool)
        },
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
    /// The Status answer; command lines and output only if `full`.
    pub fn status(&self, full: bool) -> StatusResponse {
        let load = self.pool.load();
        let mut gpu_use =
            crate::metrics::gpu_usage::per_worker(&*self.gpus, &*self.procs, &self.pool);
        let parents = crate::config::slice::parents(
            self.pool.workers().iter().map(|w| w.spec.gpu.as_ref()),
            &*self.gpus,
        );
        let workers = self
            .pool
            .workers()
            .iter()
            .map(|w| {
                let snap = w.snapshot();
                let process = snap.process.as_ref();
                let (in_flight, requests) = self.pool.worker_load(w.index);
                WorkerStatus {
                    id: w.id().to_string(),
                    state: snap.state.as_str().to_string(),
                    pid: process.map_or(0, |p| p.pid),
                    address: process.map(|p| p.address.to_string()).unwrap_or_default(),
                    models: snap.models.as_ref().map(|m| m.to_vec()).unwrap_or_default(),
                    in_flight: in_flight as u64,
                    requests,
                    last_exit: snap.last_exit.clone().unwrap_or_default(),
                    gpu: parents.get(w.index).copied().flatten(),
                    gpu_device: w
                        .spec
                        .gpu
                        .as_ref()
                        .map(|g| g.device.visible_devices())
                        .unwrap_or_default(),
                    mps_thread_percentage: w
                        .spec
                        .gpu
                        .as_ref()
                        .and_then(|g| g.mps.thread_percentage)
                        .map_or(0, u32::from),
                    mps_memory_limit_mib: w
                        .spec
                        .gpu
                        .as_ref()
                        .and_then(|g| g.mps.memory_limit_mib)
                        .unwrap_or(0),
                    command: if full {
                        w.spec.command.clone()
                    } else {
                        HIDDEN.into()
                    },
                    last_output: if full {
                        w.log().last_output(STATUS_OUTPUT_LINES)
                    } else {
                        Vec::new()
                    },
                    routable: snap.routable,
                    restarts: snap.restarts,
                    last_fault: snap.last_fault.clone().unwrap_or_default(),
                    startup_ms: snap.startup_ms,
                    events: w
                        .log()
                        .events()
                        .into_iter()
                        .map(|e| WorkerEvent {
                            unix_micros: e.unix_micros,
                            kind: e.kind.to_string(),
                            detail: e.detail,
                        })
                        .collect(),
                    health: w
                        .log()
                        .health()
                        .into_iter()
                        .map(|r| health_result(w.id(), r))
                        .collect(),
                    gpu_use: std::mem::take(&mut gpu_use[w.index])
                        .into_iter()
                        .map(|u| WorkerGpuUse {
                            gpu: u.gpu,
                            memory_bytes: u.memory_bytes,
                            utilization_pct: u.sm_util_pct,
                            processes: u.processes,
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
            kernel_log: self.kernel_log.source().to_string(),
            stable_period_ms: self.stable_period.as_millis() as u64,
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
    /// The driver's kernel log line for Xid `xid` on GPU `gpu` blamed on
    /// `pid`, in the current drivers' form.
    fn kernel_line(&self, gpu: u32, xid: u32, pid: u32) -> Result<String, Status> {
        let device = self
            .gpus
            .devices()
            .into_iter()
            .find(|d| d.index == gpu)
            .ok_or_else(|| Status::not_found(format!("no GPU {gpu} on this node")))?;
        let pci = PciAddress::parse(&device.pci_bus_id).ok_or_else(|| {
            Status::internal(format!(
                "GPU {gpu} has no PCI address ({})",
                device.pci_bus_id
            ))
        })?;
        let name = self.procs.comm(pid).unwrap_or_else(|| "<unknown>".into());
        Ok(format!(
            "NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name={name}, injected through the admin API"
        ))
    }

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
                "missing or wrong admin token (give `authorization: Bearer <token>`; the CLI reads it from --admin-token-file or INFERMESH_ADMIN_TOKEN_FILE)",
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
    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let full = self.authorize(&req).is_ok();
        Ok(Response::new(AdminState::status(self, full)))
    }

    async fn restart_worker(
        &self,
        req: Request<RestartWorkerRequest>,
    ) -> Result<Response<RestartWorkerResponse>, Status> {
        self.authorize(&req)?;
        let id = &req.get_ref().worker;
        let worker = self.worker(id)?;
        tracing::info!(worker = %id, "restart requested through the admin API");
        worker.reporter().control(Control::Sentinel(Event::Restart));
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
        let line = match (req.pid, kind) {
            (Some(pid), GpuEventKind::Xid(xid)) => Some(self.kernel_line(req.gpu, xid, pid)?),
            (Some(_), GpuEventKind::EccDoubleBit) => {
                return Err(Status::invalid_argument(
                    "a pid goes with an xid: a double-bit ECC error names no process",
                ));
            }
            (None, _) => None,
        };
        // The line first, as the driver logs it before raising the event.
        let injected = match &line {
            Some(line) => self.kernel_log.inject_line(line),
            None => Ok(()),
        }
        .and_then(|()| self.gpus.inject(event));
        match injected {
            Ok(()) => {
                tracing::warn!(
                    gpu = req.gpu,
                    ?kind,
                    pid = ?req.pid,
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
        // Each worker's supervisor runs the round (it keeps the verdicts
        // and feeds them to the sentinel like a periodic round); all at once.
        let rounds: Vec<_> = workers
            .into_iter()
            .map(|w| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                w.reporter().control(Control::RunHealthChecks(tx));
                (w, rx)
            })
            .collect();
        let mut results = Vec::new();
        for (w, rx) in rounds {
            let verdicts = rx.await.unwrap_or_default();
            if verdicts.is_empty() {
                // No verdicts: either no check applies (nothing to say) or
                // the worker is not serving.
                let state = w.snapshot().state;
                if !matches!(state, State::Ready | State::Degraded | State::Draining) {
                    results.push(HealthResult {
                        worker: w.id().to_string(),
                        check: "state".into(),
                        pass: false,
                        reason: format!("worker is {}, not serving", state.as_str()),
                        ..Default::default()
                    });
                }
                continue;
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
