//! The infermesh agent: one per GPU host.
//!
//! It supervises the host's inference server processes ("workers"), fronts
//! them with the Open Inference Protocol (KServe v2 / Triton gRPC) on its own
//! address, and exposes metrics and an admin API. Clients — `tritonclient`,
//! `infermesh-client`, anything speaking OIP — call the agent as they would
//! call Triton.
//!
//! ## Layers
//!
//! Modules form layers; a module only uses those above it in this list
//! (docs/DECISIONS.md, "Agent core", says why):
//!
//! 1. **config** — [`config`] (TOML and flags, checked; a leaf), [`tls`]
//!    (certificates, reloaded; used by config to check them), [`error`],
//!    [`deadline`], [`busy`], [`concurrency`] (each worker's adaptive
//!    concurrency limit and capacity, sans-IO).
//! 2. **worker state** — [`state`] (the snapshot each worker's supervisor
//!    publishes; everyone else only reads it), [`inbox`] (control messages
//!    that are never dropped, coalesced reports), [`worker_log`] (output,
//!    events, health verdicts), [`models`] (interned model names),
//!    [`upstream`] (the agent's own HTTP/2 client to a worker process; its
//!    frame and HPACK codecs, which the server uses too).
//! 3. **pool** — [`pool`]: admission, per-worker permits (as many as the
//!    worker's adaptive limit), per-model FIFO queues with direct hand-off.
//! 4. **metrics** — [`metrics`], label handles resolved once per model.
//! 5. **drivers** — [`supervisor`] (the only writer of a worker's state;
//!    drives its sentinel), [`launch`] / [`spawn`] / [`pdeathsig`] /
//!    [`output`] (starting processes, reading their output), [`health`] (check rounds), [`gpu`] (Xid events →
//!    the worker that caused them; per-worker GPU use), [`procfs`] (which
//!    worker a pid belongs to), [`registry`] (the node's record).
//! 6. **servers** — [`accept`] (the accept loop of the client ports: connection
//!    limit, backoff), [`server`] (the OIP port: the agent's own
//!    HTTP/2 server — its protocol state is the `infermesh-http2` crate — limits, routing),
//!    [`forward`] (pass-through `ModelInfer`), [`front`] (the other OIP
//!    calls), [`stream`] (`ModelStreamInfer`), [`shm`], [`rdma`],
//!    [`quic`] (the QUIC rung), [`conn`], [`grpc`], [`grpc_health`] (`grpc.health.v1`), [`http`]
//!    (KServe v2 HTTP/REST), [`trailer`]
//!    (load report), [`admin`].
//! 7. [`agent::run`]: wiring, serving, ordered shutdown.
//!
//! `unsafe` is denied everywhere except [`pdeathsig`], which registers the
//! parent-death signal between `fork` and `exec`.
#![deny(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod agent;
pub mod busy;
pub mod capacity;
pub mod concurrency;
pub mod config;
pub mod conn;
pub mod deadline;
pub mod error;
pub mod forward;
pub mod front;
pub mod gpu;
pub mod grpc;
pub mod grpc_health;
pub mod health;
pub mod http;
pub mod inbox;
pub mod launch;
pub mod metrics;
pub mod models;
pub mod output;
pub mod pdeathsig;
pub mod pool;
pub mod procfs;
pub mod quic;
pub mod rdma;
pub mod registry;
mod request_view;
pub mod server;
pub mod shm;
pub mod spawn;
pub mod state;
pub mod stream;
pub mod supervisor;
pub mod tls;
pub mod trace;
pub mod trailer;
pub mod upstream;
pub mod worker_log;

#[cfg(test)]
mod testing;

pub use agent::{Agent, RunError, Stopped, run, run_with};
pub use config::{AgentConfig, ConfigError, RawConfig, RawWorker};
