//! The admin address: `/metrics` (OpenMetrics text), `/livez`, `/readyz`
//! (Kubernetes probes) and the `infermesh.v1.Admin` gRPC service, on one port.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use infermesh_proto::admin::admin_server::{Admin, AdminServer};
use infermesh_proto::admin::{StatusRequest, StatusResponse, WorkerStatus};
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::pool::Pool;

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
                }
            })
            .collect();
        StatusResponse {
            node_id: self.node_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            state: if self.pool.is_stopping() {
                "stopping"
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
        }
    }
}

#[tonic::async_trait]
impl Admin for AdminState {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(AdminState::status(self)))
    }
}
