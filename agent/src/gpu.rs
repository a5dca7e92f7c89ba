//! GPU fault events → the sentinels of the workers on that GPU.
//!
//! Events come from the telemetry backend (NVML, or the fake one in tests and
//! drills). Each is classified by the Xid policy ([`XidClassifier`]): restart
//! the workers on that GPU, quarantine the GPU (its workers stop and are not
//! restarted; the node reports itself degraded), or log and count. A
//! double-bit ECC event is handled as Xid 48.

use std::sync::Arc;
use std::time::Instant;

use infermesh_gpu::{GpuTelemetry, XidClassifier, XidVerdict};
use infermesh_sentinel::{Event, GpuFaultSeverity};
use tokio::sync::broadcast::error::RecvError;

use crate::inbox::Control;
use crate::metrics::Metrics;
use crate::pool::Pool;

/// Routes GPU events to workers until the telemetry stream ends.
pub async fn watch(
    gpus: Arc<dyn GpuTelemetry>,
    mut classifier: XidClassifier,
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
) {
    let mut events = gpus.subscribe();
    loop {
        let event = match events.recv().await {
            Ok(e) => e,
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "GPU events arrived faster than handled; some were dropped"
                );
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        let xid = event.kind.xid();
        let verdict = classifier.classify(Instant::now(), event.index, xid);
        let (severity, label) = match verdict {
            XidVerdict::RestartWorker => (Some(GpuFaultSeverity::Restart), "restart_worker"),
            XidVerdict::QuarantineGpu => (Some(GpuFaultSeverity::Quarantine), "quarantine_gpu"),
            XidVerdict::LogOnly => (None, "log_only"),
        };
        metrics.gpu_xid(event.index, xid, label);
        let on_gpu: Vec<_> = pool
            .workers()
            .iter()
            .filter(|w| w.spec.gpu == Some(event.index))
            .collect();
        tracing::warn!(
            gpu = event.index,
            xid,
            verdict = label,
            workers = on_gpu.len(),
            "GPU Xid event"
        );
        if let Some(severity) = severity {
            for w in on_gpu {
                w.reporter()
                    .control(Control::Sentinel(Event::GpuFault { xid, severity }));
            }
        }
    }
}
