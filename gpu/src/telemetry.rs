//! The narrow trait the agent sees.

use tokio::sync::broadcast;

use crate::{GpuDevice, GpuError, GpuEvent, GpuProcess, GpuSample};

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

    /// A receiver of fault events from now on. It never reports `Closed`
    /// while the backend is alive.
    fn subscribe(&self) -> broadcast::Receiver<GpuEvent>;

    /// Deliver `event` to subscribers as if the hardware had raised it: for
    /// fault drills. Only the fake supports it; other backends return
    /// [`GpuError::NotSupported`].
    fn inject(&self, event: GpuEvent) -> Result<(), GpuError>;
}
