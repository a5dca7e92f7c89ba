//! GPU telemetry for the agent, behind a narrow trait.
//!
//! Planned (sentinel issue): a `GpuTelemetry` trait exposing devices (index,
//! UUID, name, memory, compute capability), periodic samples (utilization,
//! memory, temperature, power, ECC counters) and a stream of fault events
//! (Xid codes, double-bit ECC). Two implementations: NVML through
//! `nvml-wrapper`, loaded at run time so one binary runs with and without the
//! NVIDIA driver, and a fake whose devices and events are scripted for tests
//! and drills. The Xid policy table (restart the worker vs quarantine the GPU)
//! lives here too. This crate, with `rdma`, is where `unsafe` and native
//! loading are allowed.
