//! The narrow trait the agent sees.

use std::path::Path;

use tokio::sync::broadcast;

use crate::{GpuDevice, GpuError, GpuEvent, GpuProcess, GpuSample, MigDevice, MpsStatus};

/// How many fault events a slow subscriber may fall behind before it sees
/// `RecvError::Lagged`. Fault events are rare; this is generous.
pub(crate) const EVENT_CAPACITY: usize = 256;

/// GPU telemetry and fault events for one host.
///
/// Implementations: [`crate::NvmlTelemetry`] (real hardware),
/// [`crate::FakeTelemetry`] (scripted, for tests and drills) and
/// [`crate::NoTelemetry`] (no GPU). Calls are cheap enough for the agent to
/// make from its periodic sampling task; none of them block on events.
pub trait GpuTelemetry: Send + Sync + 'static {
    /// `"nvml"`, `"fake"` or `"off"`, for logs and the admin API.
    fn backend(&self) -> &'static str;

    /// The devices found when the backend was opened.
    fn devices(&self) -> Vec<GpuDevice>;

    /// A fresh reading, one per device that could be read; may be empty.
    fn sample(&self) -> Vec<GpuSample>;

    /// The processes running on each device now, with the memory they
    /// hold; empty where not known.
    fn processes(&self) -> Vec<GpuProcess>;

    /// The MIG instances of the host's GPUs with their memory, read now
    /// (an operator can re-partition a GPU while the agent runs); empty
    /// where MIG is off or not supported.
    fn mig_devices(&self) -> Vec<MigDevice>;

    /// Whether CUDA MPS would serve a process on GPU `index` (NVML index;
    /// a MIG instance's parent) that finds its control daemon in
    /// `pipe_directory` (see [`crate::slice`]).
    fn mps(&self, index: u32, pipe_directory: &Path) -> MpsStatus;

    /// A receiver of fault events from now on. It never reports `Closed`
    /// while the backend is alive.
    fn subscribe(&self) -> broadcast::Receiver<GpuEvent>;

    /// Deliver `event` to subscribers as if the hardware had raised it: for
    /// fault drills. Only the fake supports it; other backends return
    /// [`GpuError::NotSupported`].
    fn inject(&self, event: GpuEvent) -> Result<(), GpuError>;
}
