//! The capacity task (`weight = "auto"`): the driver of [`crate::dispatch::capacity`]'s
//! sans-IO health factors. Every [`TICK`] it reads the GPUs and the host and
//! sets each worker's factor in the pool, which scales its capacity.

use std::sync::Arc;

use infermesh_gpu::GpuTelemetry;

use crate::dispatch::capacity::{HostSample, TICK, gpu_factor, host_factor};
use crate::dispatch::pool::Pool;

/// The agent's capacity task (`weight = "auto"`): every [`TICK`], reads the
/// GPUs and the host and sets each worker's health factor. A worker
/// pinned to a GPU (`gpu = N`, a UUID, or a MIG instance of it) takes that
/// GPU's factor; one that is not takes the mean over the host's GPUs.
pub async fn run(gpus: Arc<dyn GpuTelemetry>, pool: Arc<Pool>) {
    let devices = gpus.devices();
    let parents = crate::config::slice::parents(
        pool.workers().iter().map(|w| w.spec.gpu.as_ref()),
        gpus.as_ref(),
    );
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let per_gpu: Vec<(u32, f64)> = gpus
            .sample()
            .iter()
            .map(|s| {
                let total = devices
                    .iter()
                    .find(|d| d.index == s.index)
                    .map_or(0, |d| d.memory_total_bytes);
                (s.index, gpu_factor(s, total))
            })
            .collect();
        let any_gpu = if per_gpu.is_empty() {
            1.0
        } else {
            per_gpu.iter().map(|g| g.1).sum::<f64>() / per_gpu.len() as f64
        };
        let host = host_factor(&HostSample::read());
        let health: Vec<f64> = pool
            .workers()
            .iter()
            .map(|w| {
                let gpu = parents
                    .get(w.index)
                    .copied()
                    .flatten()
                    .and_then(|g| per_gpu.iter().find(|p| p.0 == g))
                    .map_or(any_gpu, |p| p.1);
                gpu * host
            })
            .collect();
        pool.set_health(&health);
    }
}
