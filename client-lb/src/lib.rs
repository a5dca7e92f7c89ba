//! `infermesh-client`: the library calling services link to reach a fleet of
//! infermesh agents.
//!
//! What exists today is the core of client-side load balancing,
//! [`balancer`]: a sans-IO [`Balancer`] that picks a node per request (the
//! local node while it is healthy and not overloaded, otherwise
//! power-of-two-choices among remote nodes weighted by capacity, cost =
//! peak-EWMA latency × (in-flight + 1) / weight), learns from each response
//! and the agent's load report in its trailers
//! (`infermesh_proto::load::LoadReport`), ejects failing nodes with jittered
//! exponential backoff under a cap on the ejected share, and slow-starts nodes
//! that join or return. It takes `now` as an argument and a seed for its RNG,
//! so it is tested by a deterministic simulation (`tests/simulation.rs`).
//!
//! Around it: [`discovery`] behind a trait (ZooKeeper with a cache that
//! survives an outage; `static://host:port,...` as the embedded default) and
//! the [`Client`], a stack of layers (see `client.rs`): retry within a
//! deadline and a [`RetryBudget`] → the balancer, which picks a node serving
//! the request's model and counts it in flight under one lock → one attempt
//! on that node within its per-attempt timeout, whose in-flight guard
//! records success, failure, timeout or cancellation → a [`Transport`]
//! (the [`paths`] ladder: shared memory to the local node, RDMA, QUIC, gRPC;
//! TLS wherever the node's record says so). Errors are typed
//! ([`ClientError`]); no node for a model fails at once:
//!
//! ```no_run
//! # async fn demo() -> Result<(), infermesh_client::ClientError> {
//! let client = infermesh_client::Client::builder()
//!     .registry("zk://127.0.0.1:2181/infermesh")
//!     .service("eta")
//!     .local_node("gpu-node-1")
//!     .build()
//!     .await?;
//! let y = client.infer_f32("dense", "INPUT0", &[1, 16], &[0.5; 16]).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod balancer;
mod client;
pub mod config;
pub mod discovery;
pub mod leased;
pub mod paths;
mod retry_budget;
pub mod trace;
mod verdict;

pub use client::{Answered, Client, ClientBuilder, ClientError, NodeStats};
pub use config::ClientConfig;
pub use leased::{LeasedRequest, OutputSpec, SharedRequest, TensorSpec};
pub use paths::{Fallback, PathError, PathsConfig, Peer, Placed, Transport};
pub use paths::{RdmaPath, RdmaPathError};
pub use retry_budget::RetryBudget;

pub use balancer::{
    Balancer, BalancerConfig, LoadReport, NodeId, NodeInfo, NodeState, Outcome, Pick, PickError,
    Ticket,
};
