//! Which worker holds how much GPU, and whom Xids were blamed on.
//!
//! `infermesh_worker_gpu_memory_bytes{worker,gpu}` and
//! `infermesh_worker_gpu_utilization_ratio{worker,gpu}` come from NVML's
//! process lists at scrape time ([`crate::metrics::gpu_usage`]); a worker that holds
//! nothing on a GPU has no series for it. Utilization is only there where
//! the driver samples it per process.
//! `infermesh_gpu_xid_attributions_total{gpu,xid,attribution}` counts each
//! application Xid by whom it was blamed on: `worker` (restarted alone),
//! `other_process` (not ours: nobody restarted) or `unattributed` (the
//! GPU's workers held suspect).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{Labels, Metrics};
use crate::metrics::gpu_usage::WorkerGpuUse;

/// The families of this file.
pub(super) struct GpuUseMetrics {
    memory: Family<Labels, Gauge>,
    utilization: Family<Labels, Gauge<f64, AtomicU64>>,
    attributions: Family<Labels, Counter>,
}

impl GpuUseMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            memory: Family::default(),
            utilization: Family::default(),
            attributions: Family::default(),
        };
        registry.register(
            "worker_gpu_memory_bytes",
            "GPU memory held by each worker's processes (NVML's process lists), by worker and gpu",
            m.memory.clone(),
        );
        registry.register(
            "worker_gpu_utilization_ratio",
            "Share of the last seconds each worker's kernels ran on the GPU's SMs, where the driver samples it per process",
            m.utilization.clone(),
        );
        registry.register(
            "gpu_xid_attributions",
            "Application Xids by whom they were blamed on: worker (restarted alone), other_process (nobody restarted), unattributed (the GPU's workers held suspect)",
            m.attributions.clone(),
        );
        m
    }
}

impl Metrics {
    /// Counts an application Xid by `attribution`.
    pub fn gpu_xid_attribution(&self, gpu: &str, xid: u32, attribution: &str) {
        let labels = vec![
            ("gpu", gpu.to_string()),
            ("xid", xid.to_string()),
            ("attribution", attribution.to_string()),
        ];
        self.gpu_use.attributions.get_or_create(&labels).inc();
    }

    /// Replaces the per-worker GPU gauges with `usage`: (worker id, its use
    /// of each GPU).
    pub fn record_worker_gpu(&self, usage: &[(String, Vec<WorkerGpuUse>)]) {
        let g = &self.gpu_use;
        g.memory.clear();
        g.utilization.clear();
        for (worker, uses) in usage {
            for u in uses {
                let labels = vec![("worker", worker.clone()), ("gpu", u.gpu.to_string())];
                g.memory
                    .get_or_create(&labels)
                    .set(i64::try_from(u.memory_bytes).unwrap_or(i64::MAX));
                if let Some(pct) = u.sm_util_pct {
                    g.utilization
                        .get_or_create(&labels)
                        .set(f64::from(pct) / 100.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_gpu_series_follow_the_latest_reading() {
        let metrics = Metrics::new();
        let pool = crate::testing::idle_pool();
        let use_of = |gpu, memory_bytes, sm_util_pct| WorkerGpuUse {
            gpu,
            memory_bytes,
            sm_util_pct,
            processes: 1,
        };
        metrics.record_worker_gpu(&[
            ("g0".into(), vec![use_of(0, 3 << 30, Some(45))]),
            ("g1".into(), vec![use_of(0, 1 << 30, None)]),
        ]);
        metrics.gpu_xid_attribution("0", 43, "worker");
        let text = metrics.render(&pool);
        for line in [
            r#"infermesh_worker_gpu_memory_bytes{worker="g0",gpu="0"} 3221225472"#,
            r#"infermesh_worker_gpu_memory_bytes{worker="g1",gpu="0"} 1073741824"#,
            r#"infermesh_worker_gpu_utilization_ratio{worker="g0",gpu="0"} 0.45"#,
            r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="43",attribution="worker"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains(r#"utilization_ratio{worker="g1""#), "{text}");
        // A worker that let go of the GPU disappears.
        metrics.record_worker_gpu(&[("g0".into(), vec![use_of(0, 2 << 30, Some(10))])]);
        let text = metrics.render(&pool);
        assert!(!text.contains(r#"worker="g1""#), "{text}");
    }
}
