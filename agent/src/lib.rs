//! The infermesh agent: one per GPU host.
//!
//! It supervises the host's inference server processes ("workers"), fronts
//! them with the Open Inference Protocol (KServe v2 / Triton gRPC) on its own
//! address, and exposes metrics and an admin API. Clients — `tritonclient`,
//! `infermesh-client`, anything speaking OIP — call the agent as they would
//! call Triton.
//!
//! - [`config`]: TOML / flag configuration, checked.
//! - [`spawn`], [`supervisor`]: running workers (ports, env, process groups,
//!   death with the agent, output capture with fault patterns, probes) and
//!   carrying out what each worker's sentinel decides (restart, backoff,
//!   quarantine).
//! - [`health`]: health-check plugins at start, periodically and on demand.
//! - [`gpu`]: GPU Xid events → the Xid policy → the workers on that GPU.
//! - [`pool`]: admission, least-in-flight dispatch, the bounded per-model queue.
//! - [`shm`], [`conn`]: Triton's system shared memory, regions per client
//!   connection, passed through to workers or copied inline.
//! - [`rdma`]: the RDMA rung — queue pairs per client connection, inputs
//!   pulled by RDMA READ and outputs pushed by RDMA WRITE around the worker.
//! - [`front`]: the OIP service; [`trailer`]: the load report on each response.
//! - [`registry`]: the node's record in ZooKeeper.
//! - [`admin`], [`metrics`]: `/metrics`, `/livez`, `/readyz`, admin gRPC.
//! - [`agent::run`]: start, serve, graceful shutdown.
//!
//! `unsafe` is denied everywhere except [`pdeathsig`], which registers the
//! parent-death signal between `fork` and `exec`.
#![deny(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod busy;
pub mod config;
pub mod conn;
pub mod deadline;
pub mod error;
pub mod front;
pub mod gpu;
pub mod health;
pub mod metrics;
pub mod pdeathsig;
pub mod pool;
pub mod rdma;
pub mod registry;
pub mod shm;
pub mod spawn;
pub mod supervisor;
pub mod trailer;
pub mod worker;

pub use agent::{RunError, run};
pub use config::{AgentConfig, ConfigError, RawConfig, RawWorker};
