//! `grpc.health.v1.Health` on the OIP port, for Kubernetes gRPC probes,
//! Envoy and `grpc-health-probe`.
//!
//! Service names: `""` and `inference.GRPCInferenceService` are the node as
//! a whole — `SERVING` while a worker is ready and the node is neither
//! drained nor stopping (the same rule as `/readyz`); any other name is a
//! model — `SERVING` while a ready worker hosts it. An unknown name is
//! `NOT_FOUND` for `Check` and `SERVICE_UNKNOWN` for `Watch` (which stays
//! open, as the protocol says). `Watch` sends the current status at once and
//! again on every change: it wakes on any worker's state change, and once a
//! second for the drain and stop flags.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use infermesh_proto::tensor::echo;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::dispatch::pool::Pool;
use crate::worker::state::WorkerSnapshot;

/// The OIP service's full name: asking for it asks for the node.
pub const OIP_SERVICE: &str = "inference.GRPCInferenceService";

/// How often a `Watch` re-reads the drain and stop flags, which no worker
/// snapshot carries.
const FLAG_POLL: Duration = Duration::from_secs(1);

/// The health service over the pool.
#[derive(Clone)]
pub struct GrpcHealth {
    pool: Arc<Pool>,
}

impl GrpcHealth {
    /// A tonic service to add to the OIP routes.
    pub fn server(pool: Arc<Pool>) -> HealthServer<GrpcHealth> {
        HealthServer::new(GrpcHealth { pool })
    }
}

/// The status of `service` on `pool`; `None` for a name it does not know.
pub fn status(pool: &Pool, service: &str) -> Option<ServingStatus> {
    let up = !pool.is_stopping() && !pool.is_draining();
    let serving = if service.is_empty() || service == OIP_SERVICE {
        pool.any_ready()
    } else {
        pool.models().id(service)?;
        pool.model_ready(service)
    };
    Some(if up && serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    })
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

struct Watching {
    pool: Arc<Pool>,
    service: String,
    workers: Vec<watch::Receiver<Arc<WorkerSnapshot>>>,
    last: Option<ServingStatus>,
}

impl Watching {
    /// Waits for a worker's state to change or the flag poll to come round.
    async fn changed(&mut self) {
        self.workers.retain(|rx| rx.has_changed().is_ok());
        if self.workers.is_empty() {
            tokio::time::sleep(FLAG_POLL).await;
            return;
        }
        let changes = self
            .workers
            .iter_mut()
            .map(|rx| Box::pin(rx.changed()))
            .collect::<Vec<_>>();
        tokio::select! {
            _ = futures_util::future::select_all(changes) => {}
            _ = tokio::time::sleep(FLAG_POLL) => {}
        }
    }
}

#[tonic::async_trait]
impl Health for GrpcHealth {
    async fn check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &req.get_ref().service;
        match status(&self.pool, service) {
            Some(s) => Ok(Response::new(response(s))),
            None => Err(Status::not_found(format!(
                "unknown service '{}': ask for \"\", {OIP_SERVICE} or a model this node serves",
                echo(service)
            ))),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let state = Watching {
            pool: Arc::clone(&self.pool),
            service: req.into_inner().service,
            workers: self.pool.workers().iter().map(|w| w.watch()).collect(),
            last: None,
        };
        let stream = futures_util::stream::unfold(state, |mut st| async move {
            loop {
                let now = status(&st.pool, &st.service).unwrap_or(ServingStatus::ServiceUnknown);
                if st.last != Some(now) {
                    st.last = Some(now);
                    return Some((Ok(response(now)), st));
                }
                st.changed().await;
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_unknown_and_known_models_follow_their_workers() {
        let pool = crate::testing::idle_pool();
        pool.models().intern("dense").unwrap();
        assert_eq!(status(&pool, "nope"), None);
        // No worker ready yet.
        assert_eq!(status(&pool, ""), Some(ServingStatus::NotServing));
        assert_eq!(status(&pool, OIP_SERVICE), Some(ServingStatus::NotServing));
        assert_eq!(status(&pool, "dense"), Some(ServingStatus::NotServing));
    }
}
