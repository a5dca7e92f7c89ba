//! The one [`Transport`] trait of the client: a way of carrying a request
//! to a node, with the error that tells a broken path from a node's answer.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::shm::{Layout, SharedLease, ShmPool};
use infermesh_transport::{LadderCounters, Path};
use tonic::{Response, Status};

use super::peer::Peer;

/// A boxed, sendable future: what [`Transport::call`] returns, so that the
/// trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a transport could not deliver a request.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The node answered with a gRPC status, or the connection failed: not
    /// a fault of the path; the retry layer decides.
    #[error(transparent)]
    Status(Status),
    /// This request cannot take this path (the path itself is fine): send
    /// it on the next rung.
    #[error("request not suited to this path: {0}")]
    NotApplicable(String),
    /// The path to this node failed: mark it broken, re-send on the next rung.
    #[error("path broken: {0}")]
    Broken(String),
    /// The node refused the request on this path as invalid even after the
    /// path was set up afresh: either the path or the request is at fault.
    /// The next rung decides: if it succeeds the path is marked broken, if
    /// it refuses too the caller gets its answer.
    #[error("refused on this path: {0}")]
    Suspect(Status),
}

/// One way of carrying a request to a node. Object-safe: the client holds
/// a `dyn Transport` (a [`Fallback`] over the rungs, or whatever a caller
/// passes to `ClientBuilder::transport`).
pub trait Transport: Send + Sync {
    /// The path this transport implements (a combinator answers with its
    /// last resort).
    fn path(&self) -> Path;

    /// Whether this transport can reach `peer` at all (shared memory only a
    /// local node, RDMA only a node that advertises it).
    fn reaches(&self, peer: &Peer) -> bool;

    /// Whether `req` is worth this path (a request too small for shared
    /// memory is not); one that is not goes down the ladder without
    /// counting as an attempt here.
    fn suits(&self, _req: &ModelInferRequest) -> bool {
        true
    }

    /// Sends `req` to `peer`; `timeout` is the attempt's time left (sent to
    /// the node as the gRPC deadline; the caller enforces it too).
    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>>;

    /// Sends a request whose raw inputs the caller built in place in a
    /// region of the client's shared-memory pool: `req`'s
    /// `raw_input_contents` are views of `placed`'s region. A path that
    /// reaches the region (shared memory to the local node) sends
    /// references to it and nothing is copied; any other path sends the
    /// inputs inline from the region, which is what this default does.
    fn call_placed<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        _placed: &'a Placed,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        self.call(peer, req, timeout)
    }

    /// The shared-memory pool callers lease regions from, when this
    /// transport sends from one (`Client::lease`).
    fn shm_pool(&self) -> Option<ShmPool> {
        None
    }

    /// Forgets what is kept for `node` (it left the membership).
    fn forget(&self, _node: &str) {}

    /// Per-path counters, for a transport that keeps them.
    fn counters(&self) -> LadderCounters {
        LadderCounters::default()
    }
}

/// Where a leased request's tensors lie: its region, shared with the views
/// of its inputs (and, once answered, of its outputs), and their windows.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The region.
    pub lease: SharedLease,
    /// One window per input and per requested output.
    pub layout: Layout,
}
