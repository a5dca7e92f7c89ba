//! GPU telemetry and fault events for the infermesh agent, behind a narrow
//! trait, plus the Xid policy that turns fault events into sentinel inputs.
//!
//! [`GpuTelemetry`] gives the agent the host's devices (index, UUID, name,
//! memory, compute capability), on-demand samples (utilization, memory,
//! temperature, power, ECC counters, clock throttle reasons) for its load reports and metrics, and a
//! broadcast stream of fault events ([`GpuEvent`]: an Xid code or a
//! double-bit ECC error on a device index). Backends:
//!
//! - [`NvmlTelemetry`] — NVML through `nvml-wrapper`, which loads
//!   `libnvidia-ml.so.1` at run time, so one binary runs with and without the
//!   NVIDIA driver. A watcher thread turns NVML events into [`GpuEvent`]s.
//! - [`FakeTelemetry`] — fixed devices, scripted samples and injected events
//!   for tests and fault drills.
//! - [`NoTelemetry`] — nothing, for hosts without GPUs.
//!
//! [`open`] picks one from the configured [`Backend`]; `auto` uses NVML when
//! it is there and otherwise logs one line and runs without GPU events.
//!
//! It lists MIG instances ([`MigDevice`]) and says whether CUDA MPS serves
//! a GPU ([`MpsStatus`]), so the agent can check the slices of a GPU its
//! workers are given (see [`slice`]).
//!
//! It also lists the processes on each GPU with the memory they hold
//! ([`GpuProcess`]), so the agent can say which worker holds how much.
//!
//! NVML's Xid event names no process. The driver's kernel log line does:
//! [`KernelLog`] reads those lines (`/dev/kmsg`, or a fake), [`KernelXid`]
//! parses them, and [`XidCorrelator`] joins the two sources into one
//! [`XidReport`] per fault, with the pid when a line named it.
//!
//! The agent passes each report through an [`XidClassifier`] (see [`xid`] for
//! the table, which follows NVIDIA's Xid catalog): application-level Xids
//! restart the worker that caused them, Xids that need a GPU reset
//! quarantine the GPU, and a double-bit ECC event counts as Xid 48. The
//! classifier and the correlator are sans-IO: time is passed in.
//!
//! This crate and `rdma` are the only places native libraries are loaded;
//! `nvml-wrapper` keeps the FFI behind a safe API, so no `unsafe` is needed
//! here and the lint stays on.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod correlate;
mod device;
mod error;
mod fake;
mod kernel_log;
mod nvml;
mod nvrm;
mod off;
mod pci;
pub mod slice;
mod telemetry;
pub mod xid;

pub use backend::{Backend, ParseBackendError, open};
pub use correlate::{DEFAULT_HOLD, DEFAULT_WINDOW, XidCorrelator, XidReport};
pub use device::{GpuDevice, GpuEvent, GpuEventKind, GpuProcess, GpuSample, throttle};
pub use error::GpuError;
pub use fake::{FakeSetup, FakeTelemetry};
pub use kernel_log::{FakeKernelLog, KMSG, KernelLog, Kmsg, NoKernelLog, open_kernel_log};
pub use nvml::NvmlTelemetry;
pub use nvrm::KernelXid;
pub use off::NoTelemetry;
pub use pci::PciAddress;
pub use slice::{MigDevice, MpsStatus};
pub use telemetry::GpuTelemetry;
pub use xid::{
    XID_DOUBLE_BIT_ECC, XID_FALLEN_OFF_BUS, XidAction, XidClassifier, XidPolicy, XidVerdict,
};
