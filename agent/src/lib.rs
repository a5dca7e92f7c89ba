//! The infermesh agent: one per GPU host.
//!
//! It supervises the host's inference server processes ("workers"), fronts
//! them with the Open Inference Protocol (KServe v2 / Triton gRPC) on its own
//! address, and exposes metrics and an admin API. Clients — `tritonclient`,
//! `infermesh-client`, anything speaking OIP — call the agent as they would
//! call Triton. docs/ARCHITECTURE.md follows a request from arriving to a
//! worker answering, folder by folder.
//!
//! ## Layers
//!
//! Each folder is a layer, and a module uses only modules of its own layer
//! and of the layers below, with no circles (the list is the workspace's
//! `layers.toml`; `tests/tests/layers.rs` enforces it and
//! `scripts/import-graph.py` prints it). Bottom first:
//!
//! 1. the crate-wide pieces: [`config`] (TOML and flags, checked), [`tls`],
//!    [`error`] (the one place errors become gRPC statuses), [`trace`],
//!    [`alarm`] (the waker connection tasks give their timers and signals);
//! 2. [`worker`]: one worker as the rest of the agent sees it, and the
//!    HTTP/2 client to its process;
//! 3. [`dispatch`]: admission, per-worker permits, per-model queues, live
//!    capacity;
//! 4. [`metrics`];
//! 5. [`supervision`]: a supervisor per worker driving its sentinel,
//!    starting processes, health checks, GPU events;
//! 6. [`transports`]: shared memory and RDMA on the agent's side;
//! 7. [`serving`]: the client ports — accept loop, the OIP port's HTTP/2
//!    server, the pass-through, the tonic service, KServe HTTP, QUIC (its
//!    response types form a layer of their own below the rest);
//! 8. [`admin`]: the admin port and the node's registry record;
//! 9. [`agent`]: assembly ([`Agent::start`]) and ordered shutdown.
//!
//! `unsafe` is denied everywhere except [`supervision::pdeathsig`], which
//! registers the parent-death signal between `fork` and `exec`.
#![deny(unsafe_code)]

pub mod alarm;
pub mod condition;
pub mod config;
pub mod error;
pub mod tls;
pub mod trace;

pub mod worker;

pub mod dispatch;

pub mod metrics;

pub mod supervision;

pub mod transports;

pub mod serving;

pub mod admin;

pub mod agent;

#[cfg(test)]
mod testing;

pub use agent::{Agent, RunError, Stopped, run, run_with};
pub use config::{AgentConfig, ConfigError, RawConfig, RawWorker};
