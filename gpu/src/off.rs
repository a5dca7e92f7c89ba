//! The backend for hosts without GPU telemetry.

use std::path::Path;
use std::sync::OnceLock;

use tokio::sync::broadcast;

use crate::telemetry::EVENT_CAPACITY;
use crate::{
    GpuDevice, GpuError, GpuEvent, GpuProcess, GpuSample, GpuTelemetry, MigDevice, MpsStatus,
};

/// No GPU telemetry (backend `"off"`): no devices, no samples, and fault
/// events never arrive.
///
/// Subscribers wait forever rather than seeing `Closed`, so the agent's event
/// loop needs no special case: the sender lives in a process-wide static.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTelemetry;

fn never() -> &'static broadcast::Sender<GpuEvent> {
    static NEVER: OnceLock<broadcast::Sender<GpuEvent>> = OnceLock::new();
    NEVER.get_or_init(|| broadcast::channel(EVENT_CAPACITY).0)
}

impl GpuTelemetry for NoTelemetry {
    fn backend(&self) -> &'static str {
        "off"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        Vec::new()
    }

    fn sample(&self) -> Vec<GpuSample> {
        Vec::new()
    }

    fn processes(&self) -> Vec<GpuProcess> {
        Vec::new()
    }

    fn mig_devices(&self) -> Vec<MigDevice> {
        Vec::new()
    }

    /// No telemetry is not no GPU (the backend may be `off` by choice): the
    /// control daemon's pipe still says whether MPS runs.
    fn mps(&self, _index: u32, pipe_directory: &Path) -> MpsStatus {
        crate::slice::control_pipe(pipe_directory)
    }

    fn subscribe(&self) -> broadcast::Receiver<GpuEvent> {
        never().subscribe()
    }

    fn inject(&self, _event: GpuEvent) -> Result<(), GpuError> {
        Err(GpuError::NotSupported(
            "injecting GPU events needs the fake backend",
        ))
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;
    use crate::GpuEventKind;

    #[test]
    fn reports_nothing_and_never_closes() {
        let off = NoTelemetry;
        assert_eq!(off.backend(), "off");
        assert!(off.devices().is_empty());
        assert!(off.sample().is_empty());
        assert!(off.processes().is_empty());
        assert!(off.mig_devices().is_empty());
        let nowhere = std::path::Path::new("/nonexistent/nvidia-mps");
        assert!(matches!(off.mps(0, nowhere), MpsStatus::Absent(_)));
        // The receiver outlives any particular `NoTelemetry` value.
        let mut rx = { NoTelemetry }.subscribe();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn refuses_injection() {
        let event = GpuEvent {
            index: 0,
            kind: GpuEventKind::Xid(79),
        };
        assert!(matches!(
            NoTelemetry.inject(event),
            Err(GpuError::NotSupported(_))
        ));
    }
}
