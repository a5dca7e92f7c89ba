//! The bottom of the client's stack: how a request's tensors reach the node
//! the balancer picked.
//!
//! Each way is a [`Transport`] — an object-safe trait (`dyn Transport`), one
//! implementation per rung:
//!
//! - [`ShmRung`] — the node is the local one (`ClientBuilder::local_node`):
//!   the inputs are written into a pooled POSIX shared-memory region,
//!   registered once with the agent (Triton's `SystemSharedMemoryRegister`),
//!   and the request carries references; outputs come back the same way.
//! - [`RdmaRung`] — the node advertises an RDMA endpoint and the client has
//!   an engine (`PathsConfig::rdma`): inputs are pulled by the agent with
//!   RDMA READ from registered buffers, outputs pushed with RDMA WRITE (see
//!   [`rdma`]); it sets up a queue pair per node over the node's
//!   gRPC channel, which is why a transport gets the whole [`Peer`].
//! - [`QuicRung`] — the node advertises a QUIC endpoint and the client has
//!   TLS settings: one QUIC stream per request ([`quic`]).
//! - [`GrpcRung`] — tensors inline in the request: the rung that always works.
//!
//! [`Fallback`] is the combinator over them, itself a [`Transport`]: it asks
//! the sans-IO [`Ladder`](infermesh_transport::Ladder) which rung to use for the node, and when a rung
//! fails as a path ([`PathError::Broken`]) marks it broken for that node and
//! re-sends the *same* request on the next rung at once: no request fails
//! because a fast path broke. The ladder re-probes a broken rung after
//! `reprobe_after` (doubling while it keeps failing). A node's answer
//! ([`PathError::Status`]: UNAVAILABLE, RESOURCE_EXHAUSTED, ...) is not a
//! path failure; it goes up to the retry layer. Errors are told apart by
//! type, never by message text.
//!
//! This [`Transport`] is the workspace's one transport abstraction: the
//! `infermesh-transport` crate supplies what the rungs share — the
//! [`Path`](infermesh_transport::Path) names, the ladder's sans-IO choice of
//! a rung per node, and shared memory — and the rungs live here, beside the
//! connections they use (docs/DECISIONS.md, "Layers without circles").

mod config;
mod fallback;
mod grpc;
mod peer;
pub mod quic;
pub mod rdma;
mod shm;
mod transport;

pub use config::{
    DEFAULT_REPROBE_AFTER, DEFAULT_SHM_MIN_BYTES, DEFAULT_SHM_POOL_BYTES, PathsConfig,
};
pub use fallback::Fallback;
pub use grpc::GrpcRung;
pub use peer::Peer;
pub use quic::QuicRung;
pub use rdma::{RdmaPath, RdmaPathError, RdmaRung};
pub use shm::ShmRung;
pub use transport::{BoxFuture, PathError, Placed, Transport};
