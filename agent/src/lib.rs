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
//! Modules form layers, listed bottom first in the workspace's `layers.toml`
//! (the one list; `tests/tests/layers.rs` fails when a module uses one of a
//! higher layer or modules form a circle, and `scripts/import-graph.py`
//! prints the table): foundation (config, TLS, errors), worker (state,
//! inbox, the HTTP/2 client to a worker), dispatch (pool, capacity, the
//! tenants' shares and priorities), metrics, supervision (supervisor,
//! launching, health checks, GPU events), transports (shared memory,
//! RDMA), serving (the OIP port, pass-through,
//! the tonic service, streams, load reports, KServe HTTP, QUIC), admin
//! (admin port, registry record), assembly ([`agent::run`]). The imports
//! that still break the rule are listed in `layers.toml`'s `allow`, a list
//! that only shrinks.
//!
//! `unsafe` is denied everywhere except [`pdeathsig`], which registers the
//! parent-death signal between `fork` and `exec`.
#![deny(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod agent;
pub mod busy;
pub mod capacity;
pub mod capacity_task;
pub mod concurrency;
pub mod config;
pub mod conn;
pub mod deadline;
pub mod error;
pub mod forward;
pub mod front;
pub mod front_body;
pub mod gpu;
pub mod grpc;
pub mod grpc_health;
pub mod health;
pub mod http;
pub mod inbox;
pub mod launch;
pub mod load_report;
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
pub mod supervisor;
pub mod tenant;
pub mod tls;
pub mod trace;
pub mod upstream;
pub mod worker_log;
pub mod worker_status;

#[cfg(test)]
mod testing;

pub use agent::{Agent, RunError, Stopped, run, run_with};
pub use config::{AgentConfig, ConfigError, RawConfig, RawWorker};
