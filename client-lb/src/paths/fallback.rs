//! [`Fallback`]: the ladder over the rungs, itself a [`Transport`].

use std::sync::Mutex;
use std::time::Duration;

use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::shm::ShmPool;
use infermesh_transport::{Ladder, LadderConfig, LadderCounters, Path};
use tonic::Response;

use super::config::PathsConfig;
use super::grpc::GrpcRung;
use super::peer::Peer;
use super::quic::QuicRung;
use super::rdma::RdmaRung;
use super::shm::ShmRung;
use super::transport::{BoxFuture, PathError, Placed, Transport};

/// The transport ladder: rungs in order of preference, the last one always
/// [`GrpcRung`], with fallback to the next rung when one breaks.
pub struct Fallback {
    rungs: Vec<Box<dyn Transport>>,
    ladder: Mutex<Ladder>,
}

impl Fallback {
    /// Rungs as configured (`prefer` order; gRPC added last).
    pub fn new(config: &PathsConfig) -> Self {
        let mut rungs: Vec<Box<dyn Transport>> = Vec::new();
        for path in &config.prefer {
            match path {
                Path::Shm => rungs.push(Box::new(ShmRung::new(
                    config.shm_pool_bytes,
                    config.shm_min_bytes,
                    config.shm_dir.clone(),
                ))),
                Path::Rdma => {
                    if let Some(engine) = &config.rdma {
                        rungs.push(Box::new(RdmaRung::new(engine.clone())));
                    }
                }
                Path::Quic => {
                    if let Some(tls) = &config.tls {
                        rungs.push(Box::new(QuicRung::new(tls.clone())));
                    }
                }
                Path::Grpc => {}
            }
        }
        rungs.push(Box::new(GrpcRung));
        Self::with_rungs(rungs, config.reprobe_after)
    }

    /// A ladder over `rungs`, in order; a [`GrpcRung`] is added when the
    /// last is not gRPC.
    pub fn with_rungs(mut rungs: Vec<Box<dyn Transport>>, reprobe_after: Duration) -> Self {
        if rungs.last().is_none_or(|r| r.path() != Path::Grpc) {
            rungs.push(Box::new(GrpcRung));
        }
        let paths: Vec<Path> = rungs.iter().map(|r| r.path()).collect();
        let ladder = Ladder::new(LadderConfig {
            preference: paths.clone(),
            supported: paths,
            reprobe_after,
            ..LadderConfig::default()
        });
        Fallback {
            rungs,
            ladder: Mutex::new(ladder),
        }
    }

    fn index(&self, path: Path) -> usize {
        self.rungs
            .iter()
            .position(|r| r.path() == path)
            .unwrap_or(self.rungs.len() - 1)
    }

    fn ladder(&self) -> std::sync::MutexGuard<'_, Ladder> {
        self.ladder.lock().expect("ladder lock")
    }

    /// Sends `req` down the ladder from the rung it chooses for the node.
    async fn route(
        &self,
        peer: &Peer,
        req: &ModelInferRequest,
        placed: Option<&Placed>,
        timeout: Duration,
    ) -> Result<Response<ModelInferResponse>, PathError> {
        let node = peer.node.as_str();
        let mut advertised = [Path::Grpc; Path::ALL.len()];
        let mut n = 0;
        for rung in &self.rungs {
            if n < advertised.len() && rung.reaches(peer) && rung.suits(req) {
                advertised[n] = rung.path();
                n += 1;
            }
        }
        let mut path = self.ladder().choose(node, &advertised[..n], now());
        let mut suspect: Option<Path> = None;
        // Each step moves down the ladder: at most one call per rung.
        for _ in 0..self.rungs.len() {
            let index = self.index(path);
            let rung = &self.rungs[index];
            let next_down = || {
                self.rungs[index + 1..]
                    .iter()
                    .find(|r| r.reaches(peer) && r.suits(req))
                    .map_or(Path::Grpc, |r| r.path())
            };
            let sent = match placed {
                Some(p) => rung.call_placed(peer, req, p, timeout),
                None => rung.call(peer, req, timeout),
            };
            match sent.await {
                Ok(mut resp) => {
                    // Which path carried it, for callers that report it
                    // (`Client::infer_answered`).
                    resp.extensions_mut().insert(path);
                    let mut ladder = self.ladder();
                    if let Some(broken) = suspect {
                        ladder.on_failure(node, broken, now());
                        tracing::warn!(%node, path = %broken, "path refused a request another path accepted; marked broken");
                    }
                    ladder.on_success(node, path, now());
                    return Ok(resp);
                }
                Err(PathError::Status(s)) => return Err(PathError::Status(s)),
                Err(PathError::Suspect(s)) if path == Path::Grpc => {
                    return Err(PathError::Status(s));
                }
                Err(PathError::Suspect(_)) => {
                    suspect = Some(path);
                    path = next_down();
                }
                Err(PathError::NotApplicable(why)) => {
                    tracing::debug!(%node, %why, %path, "request not suited to the path; next one down");
                    path = next_down();
                }
                Err(PathError::Broken(reason)) if path != Path::Grpc => {
                    let next = self.ladder().on_failure(node, path, now());
                    tracing::warn!(%node, %reason, %path, fallback = %next, "path failed; re-sending the request");
                    path = next;
                }
                Err(e) => return Err(e),
            }
        }
        Err(PathError::Broken(format!(
            "no path to node '{node}' worked"
        )))
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl Transport for Fallback {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.route(peer, req, None, timeout))
    }

    fn call_placed<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        placed: &'a Placed,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(self.route(peer, req, Some(placed), timeout))
    }

    fn shm_pool(&self) -> Option<ShmPool> {
        self.rungs.iter().find_map(|r| r.shm_pool())
    }

    fn forget(&self, node: &str) {
        self.ladder().forget(node);
        for rung in &self.rungs {
            rung.forget(node);
        }
    }

    fn counters(&self) -> LadderCounters {
        self.ladder().counters()
    }
}
