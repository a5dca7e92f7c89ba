//! Which worker holds how much of each GPU: NVML's running-process lists
//! mapped to workers through the same pid → worker mapping as Xids
//! ([`crate::worker::procfs`]). Read on demand (admin `Status`, `/metrics`).

use infermesh_gpu::GpuTelemetry;

use crate::dispatch::pool::Pool;
use crate::worker::procfs::{self, ProcTable};

/// One worker's use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerGpuUse {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// GPU memory its processes hold (those whose figure the driver gives).
    pub memory_bytes: u64,
    /// Percent of the GPU's SMs its kernels kept busy lately, summed over
    /// its processes; `None` where the driver does not sample per process.
    pub sm_util_pct: Option<u32>,
    /// Its processes on the GPU.
    pub processes: u32,
}

/// Each worker's use of the GPUs (by worker index; empty for a worker with
/// no process on any GPU).
pub fn per_worker(
    gpus: &dyn GpuTelemetry,
    procs: &dyn ProcTable,
    pool: &Pool,
) -> Vec<Vec<WorkerGpuUse>> {
    let mut out = vec![Vec::<WorkerGpuUse>::new(); pool.workers().len()];
    let running = gpus.processes();
    if running.is_empty() {
        return out;
    }
    let roots: Vec<(usize, u32)> = pool
        .workers()
        .iter()
        .filter_map(|w| Some((w.index, w.snapshot().process.as_ref()?.pid)))
        .collect();
    for p in running {
        let Ok(Some(worker)) = procfs::owner(procs, &roots, p.pid, None) else {
            continue;
        };
        let uses = &mut out[worker];
        let at = match uses.iter().position(|u| u.gpu == p.gpu) {
            Some(at) => at,
            None => {
                uses.push(WorkerGpuUse {
                    gpu: p.gpu,
                    memory_bytes: 0,
                    sm_util_pct: None,
                    processes: 0,
                });
                uses.len() - 1
            }
        };
        let u = &mut uses[at];
        u.processes += 1;
        u.memory_bytes += p.memory_bytes.unwrap_or(0);
        if let Some(pct) = p.sm_util_pct {
            u.sm_util_pct = Some(u.sm_util_pct.unwrap_or(0).saturating_add(pct).min(100));
        }
    }
    out
}
