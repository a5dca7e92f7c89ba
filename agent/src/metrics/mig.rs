//! MIG instances as NVML reports them, refreshed at scrape time:
//!
//! - `infermesh_gpu_mig_memory_used_bytes{gpu,uuid}`: memory in use on the
//!   instance `uuid` (`MIG-…`) of GPU `gpu` (NVML index);
//! - `infermesh_gpu_mig_memory_total_bytes{gpu,uuid}`: its memory.
//!
//! No series on a host without MIG instances. DCGM's exporter labels its
//! MIG series with the GPU index and the instance, so the two join on `gpu`.

use infermesh_gpu::MigDevice;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;

/// The families of this file.
pub(super) struct MigMetrics {
    used: Family<Labels, Gauge>,
    total: Family<Labels, Gauge>,
}

impl MigMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            used: Family::default(),
            total: Family::default(),
        };
        registry.register(
            "gpu_mig_memory_used_bytes",
            "Memory in use on each MIG instance (NVML), by parent gpu index and instance uuid",
            m.used.clone(),
        );
        registry.register(
            "gpu_mig_memory_total_bytes",
            "Memory of each MIG instance",
            m.total.clone(),
        );
        m
    }

    pub(super) fn record(&self, mig: &[MigDevice]) {
        // Instances come and go when a GPU is re-partitioned.
        self.used.clear();
        self.total.clear();
        for m in mig {
            let labels = vec![("gpu", m.parent.to_string()), ("uuid", m.uuid.clone())];
            self.used
                .get_or_create(&labels)
                .set(i64::try_from(m.memory_used_bytes).unwrap_or(i64::MAX));
            self.total
                .get_or_create(&labels)
                .set(i64::try_from(m.memory_total_bytes).unwrap_or(i64::MAX));
        }
    }
}
