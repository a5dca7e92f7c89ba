//! The tensor transport ladder between the client library and an agent, and
//! the server side of Triton's system shared-memory extension.
//!
//! Tensors take the best path both ends have (DESIGN.md, "Tensor transport
//! ladder"): same-host shared memory, then RDMA, then gRPC inline
//! (`raw_input_contents`), which always works. A failing path is marked
//! broken for that peer and the same request is re-sent on the next path
//! down; broken paths are re-probed later.
//!
//! - [`Transport`]: stage a request's tensors on a path, bring the outputs
//!   back; [`GrpcInline`] (nothing to do) and [`ShmTransport`].
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
//! Shared memory cannot be used without mapping it, and reading a mapping
//! is `unsafe`, so this crate *denies* `unsafe` and allows it in exactly one
//! small module, `shm/mapping.rs`, which every access goes through:
//! bounds-checked copies in and out, and slices lent to a closure for the
//! duration of one call — never a reference that outlives the call, never a
//! typed view of the bytes. Each block carries a `SAFETY` comment.
//!
//! Two hazards come from the other process and cannot be ruled out by any
//! Rust code: (1) a client may write a tensor while the server copies it —
//! the copy is then torn, which is the client's contract to avoid, as in
//! Triton; (2) a client that truncates its object while the server copies
//! from it makes the kernel send `SIGBUS`. The region checks the file length
//! before every access, which leaves only a deliberate race; serve shared
//! memory to trusted local clients only (see [`ShmRegistry`] for the trust
//! model). Our own client could avoid both with sealed memfds (DESIGN.md);
//! POSIX shm is what third-party clients use.
#![deny(unsafe_code)]

mod error;
mod ladder;
mod path;
pub mod shm;
mod transport;

pub use error::{ShmError, TransportError};
pub use ladder::{Ladder, LadderConfig, LadderCounters, PathCounters};
pub use path::{Path, UnknownPath};
pub use shm::{ShmPool, ShmRegion, ShmRegistry, ShmTransport};
pub use transport::{GrpcInline, Registration, Staged, Transport};
