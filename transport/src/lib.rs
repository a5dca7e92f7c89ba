//! What the tensor transport ladder's rungs share: the [`Path`] names, the
//! sans-IO [`Ladder`] that picks a rung per peer, and POSIX shared memory
//! (both ends of Triton's system shared-memory extension). The rungs
//! themselves — the one `Transport` trait, with the connections each needs —
//! are the client library's (`infermesh_client::paths`); the agent serves
//! shared memory from [`ShmRegistry`] (docs/DECISIONS.md, "Layers without
//! circles").
//!
//! Tensors take the best path both ends have (DESIGN.md, "Tensor transport
//! ladder"): same-host shared memory, then RDMA, then gRPC inline
//! (`raw_input_contents`), which always works. A failing path is marked
//! broken for that peer and the same request is re-sent on the next path
//! down; broken paths are re-probed later.
//!
//! - [`ShmTransport`]: stage a request's tensors in a region ([`Staged`]),
//!   bring the outputs back.
//! - [`Ladder`]: the sans-IO choice of path per peer, with circuit breakers
//!   and counters.
//! - [`shm`]: POSIX shared memory with Triton's conventions — keys,
//!   [`ShmRegion`], the server's per-connection [`ShmRegistry`]
//!   (`SystemSharedMemoryRegister/Status/Unregister`, resolving
//!   `shared_memory_region` tensor parameters) and the client's [`ShmPool`].
//!   The agent and the test worker call the registry from their gRPC
//!   handlers; there is no server here.
//! - Errors: [`ShmError`] (mapped to gRPC codes in one place,
//!   [`ShmError::to_status`]) and [`TransportError`].
//!
//! # `unsafe`
//!
//! The house rule is `#![forbid(unsafe_code)]` outside `gpu/` and `rdma/`.
//! Our own client maps the regions it creates, and reading a mapping is
//! `unsafe`, so this crate *denies* `unsafe` and allows it in three small
//! modules: `shm/mapping.rs` (bounds-checked raw copies in and out of a
//! mapping of an object this process created, and a `pread` into a new
//! vector without zeroing it first), `shm/lease.rs` (slices of a leased
//! region lent to the one holder of its lease: mutable while it holds it
//! alone, read-only once shared; the argument is in its module docs —
//! issue 27's zero-copy ends) and `shm/foreign_mapping.rs` (a `pread` into
//! a mapping of a client's object, which only the kernel ever writes).
//! Typed views go through `zerocopy`. Each block carries a `SAFETY`
//! comment.
//!
//! The server side (the agent, the test worker) never reads or writes a
//! client's object through a mapping: a client that truncates its file
//! would make such an access raise `SIGBUS` and kill the server. It copies
//! with `pread`/`pwrite` on the file descriptor instead, which a truncated
//! file turns into an error (see [`ShmRegion`]); a copy from one client
//! region to another is a `pread` into the destination's mapping, where a
//! truncated page is the kernel's `EFAULT`, not a signal. What remains from the other
//! process is a torn copy when a client writes a tensor while the server
//! reads it — the client's contract to avoid, as in Triton. Serve shared
//! memory to local clients you trust with your shm directory (see
//! [`ShmRegistry`] for the trust model).
#![deny(unsafe_code)]

mod error;
mod ladder;
mod path;
pub mod quic;
pub mod shm;
mod staged;

pub use error::{ShmError, TransportError};
pub use ladder::{Ladder, LadderConfig, LadderCounters, PathCounters};
pub use path::{Path, UnknownPath};
pub use shm::{ShmPool, ShmRegion, ShmRegistry, ShmTransport};
pub use staged::{Registration, Staged};
