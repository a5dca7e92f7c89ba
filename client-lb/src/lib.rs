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
//! To come in this crate: discovery behind a trait (ZooKeeper with a cache
//! that survives an outage; `static://host:port,...` as the embedded
//! default), the async driver that feeds the balancer, retries to a different
//! node within a budget and the caller's deadline, and the transport ladder.
#![forbid(unsafe_code)]

pub mod balancer;

pub use balancer::{
    Balancer, BalancerConfig, LoadReport, NodeId, NodeInfo, NodeState, Outcome, Pick, PickError,
};
