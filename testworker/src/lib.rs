//! `infermesh-testworker`: an Open Inference Protocol gRPC server computing a
//! real, deterministic model on CPU, with fault injection.
//!
//! It stands in for a GPU inference server (Triton, MLServer) in tests, the
//! demo and drills: `--service-time-ms` and `--concurrency` emulate fast and
//! slow GPUs, `--startup-ms` a model load, and `--fault` / the
//! `infermesh_fault` request parameter reproduce the failures the agent must
//! survive (a CUDA crash, Triton's "sticky" CUDA error, a hang, NaN outputs,
//! a slowdown). The model math is in [`dense`]; every worker computes the
//! same numbers, so tests can check results exactly. A worker started with
//! `--model identity` also serves the [`model`] `identity`, which returns
//! its input unchanged, to measure transports without compute.
//!
//! Like Triton, it implements the system shared-memory extension (tensors
//! passed by reference to registered POSIX shm regions), through
//! `infermesh-transport`'s `ShmRegistry`.
#![forbid(unsafe_code)]

pub mod dense;
pub mod fault;
pub mod model;
pub mod server;

pub use fault::FaultKind;
pub use server::{TestWorker, WorkerOptions};
