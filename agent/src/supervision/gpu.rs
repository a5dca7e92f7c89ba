//! GPU fault events → the sentinel of the worker that caused them, or of
//! every worker on an unusable GPU.
//!
//! Two sources report each Xid: the telemetry backend's event (NVML, or
//! the fake one in tests and drills), which names the GPU, and the
//! driver's kernel log line, which also names the process (see
//! [`infermesh_gpu::XidCorrelator`], which joins them into one report).
//! Each report is classified by the Xid policy ([`XidClassifier`]):
//!
//! - **restart** (an application Xid: 13, 31, 43, 45, ...): the fault is
//!   one process's, and the other CUDA contexts on the GPU keep working.
//!   The pid the driver named is mapped to the worker whose process tree
//!   holds it ([`crate::worker::procfs`]) and only that worker is restarted. A pid
//!   that belongs to no worker (another pod's process) restarts nobody.
//!   Without a pid (older driver, no kernel log, the process already gone)
//!   nobody is restarted either: the GPU's workers are held **suspect** for
//!   `suspect_window`, and one that fails a request, probe or health check
//!   within it is restarted ([`Event::GpuSuspect`]).
//! - **quarantine** (the GPU is unusable: 48, 79, 95, 119, 120, ...): every
//!   worker on that GPU stops for good; the node reports itself degraded.
//! - **log**: counted only.
//!
//! A double-bit ECC event is handled as Xid 48. Counters:
//! `infermesh_gpu_xids_total{gpu,xid,verdict}` per fault and
//! `infermesh_gpu_xid_attributions_total{gpu,xid,attribution}` per
//! application Xid (`worker`, `other_process`, `unattributed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_gpu::{
    GpuDevice, GpuTelemetry, KernelLog, PciAddress, XidClassifier, XidCorrelator, XidReport,
    XidVerdict,
};
use infermesh_sentinel::{Event, GpuFaultSeverity};
use tokio::sync::broadcast::error::RecvError;

use crate::dispatch::pool::Pool;
use crate::metrics::Metrics;
use crate::worker::inbox::Control;
use crate::worker::procfs::{self, ProcTable};

pub mod slices;

pub use crate::config::stall::DEFAULT_SUSPECT_WINDOW;

/// What the GPU watcher reads and decides with.
pub struct GpuWatch {
    /// Fault events (NVML or fake).
    pub gpus: Arc<dyn GpuTelemetry>,
    /// The driver's Xid lines (kmsg, fake, or none).
    pub kernel_log: Arc<dyn KernelLog>,
    /// Which worker a pid belongs to.
    pub procs: Arc<dyn ProcTable>,
    /// The Xid policy.
    pub classifier: XidClassifier,
    /// How long an unattributed application Xid holds workers suspect.
    pub suspect_window: Duration,
}

/// The clock of the watcher: tokio's, so tests run it under a paused clock.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Routes GPU fault reports to workers until the telemetry stream ends.
pub async fn watch(w: GpuWatch, pool: Arc<Pool>, metrics: Arc<Metrics>) {
    let mut events = w.gpus.subscribe();
    let mut lines = w.kernel_log.subscribe();
    let mut lines_open = true;
    let devices = w.gpus.devices();
    let mut correlator = XidCorrelator::default();
    let mut handler = Handler {
        parents: crate::config::slice::parents(
            pool.workers().iter().map(|w| w.spec.gpu.as_ref()),
            w.gpus.as_ref(),
        ),
        classifier: w.classifier,
        procs: w.procs,
        suspect_window: w.suspect_window,
        pool,
        metrics,
    };
    loop {
        let wake = correlator.poll_timeout();
        let reports: Vec<XidReport> = tokio::select! {
            event = events.recv() => match event {
                Ok(e) => {
                    let xid = e.kind.xid();
                    let wait = w.kernel_log.live()
                        && handler.classifier.policy().restarts_worker(xid);
                    correlator.nvml(now(), e.index, xid, wait).into_iter().collect()
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "GPU events arrived faster than handled; some were dropped");
                    continue;
                }
                Err(RecvError::Closed) => return,
            },
            line = lines.recv(), if lines_open => match line {
                Ok(line) => {
                    let gpu = device_at(&devices, line.pci);
                    correlator.kernel(now(), gpu, line).into_iter().collect()
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "kernel log Xid lines arrived faster than handled; some were dropped");
                    continue;
                }
                Err(RecvError::Closed) => {
                    lines_open = false;
                    continue;
                }
            },
            _ = sleep_until(wake) => correlator.expire(now()),
        };
        for report in reports {
            handler.handle(report);
        }
    }
}

/// The NVML index of the device at `pci`.
fn device_at(devices: &[GpuDevice], pci: PciAddress) -> Option<u32> {
    devices
        .iter()
        .find(|d| PciAddress::parse(&d.pci_bus_id) == Some(pci))
        .map(|d| d.index)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

struct Handler {
    /// The GPU each worker is on ([`crate::config::slice::parents`]).
    parents: Vec<Option<u32>>,
    classifier: XidClassifier,
    procs: Arc<dyn ProcTable>,
    suspect_window: Duration,
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
}

/// Who an application Xid was blamed on.
enum Blame {
    /// Worker with this index.
    Worker(usize),
    /// A live process outside every worker.
    OtherProcess,
    /// Nobody could be named.
    Nobody(String),
}

impl Handler {
    fn handle(&mut self, r: XidReport) {
        let xid = r.xid;
        let gpu_label = r
            .gpu
            .map_or_else(|| "unknown".to_string(), |g| g.to_string());
        if r.late {
            // Counted when it was reported without a pid; now act on the pid
            // if it names one of ours (it is suspect already, restarting it
            // early costs nothing).
            if self.classifier.policy().restarts_worker(xid) {
                if let Some(pid) = r.pid {
                    if let Blame::Worker(i) = self.blame(pid, r.process.as_deref()) {
                        self.restart(i, xid, pid, &r);
                    }
                }
            }
            return;
        }
        let verdict = self
            .classifier
            .classify(now(), r.gpu.unwrap_or(u32::MAX), xid);
        let label = match verdict {
            XidVerdict::RestartWorker => "restart_worker",
            XidVerdict::QuarantineGpu => "quarantine_gpu",
            XidVerdict::LogOnly => "log_only",
        };
        self.metrics.gpu_xid(&gpu_label, xid, label);
        tracing::warn!(
            gpu = %gpu_label,
            xid,
            verdict = label,
            pid = ?r.pid,
            process = ?r.process,
            detail = r.detail.as_deref().unwrap_or(""),
            "GPU Xid event"
        );
        match verdict {
            XidVerdict::RestartWorker => self.application(&r, &gpu_label),
            XidVerdict::QuarantineGpu => match r.gpu {
                Some(gpu) => {
                    for w in self.on_gpu(gpu) {
                        self.send(
                            w,
                            Event::GpuFault {
                                xid,
                                severity: GpuFaultSeverity::Quarantine,
                                pid: None,
                            },
                        );
                    }
                }
                None => tracing::error!(
                    xid,
                    "GPU Xid that needs a GPU reset, on a device NVML does not list: nothing quarantined"
                ),
            },
            XidVerdict::LogOnly => {}
        }
    }

    /// An application Xid: restart the worker it is blamed on, or hold the
    /// GPU's workers suspect when it names nobody.
    fn application(&mut self, r: &XidReport, gpu_label: &str) {
        let xid = r.xid;
        let blame = match r.pid {
            Some(pid) => self.blame(pid, r.process.as_deref()),
            None => Blame::Nobody("the driver named no process".into()),
        };
        match blame {
            Blame::Worker(i) => {
                self.metrics.gpu_xid_attribution(gpu_label, xid, "worker");
                self.restart(i, xid, r.pid.unwrap_or_default(), r);
            }
            Blame::OtherProcess => {
                self.metrics
                    .gpu_xid_attribution(gpu_label, xid, "other_process");
                tracing::warn!(
                    xid, pid = ?r.pid, process = ?r.process,
                    "GPU Xid in a process that is not one of this agent's workers: no worker restarted"
                );
            }
            Blame::Nobody(why) => {
                self.metrics
                    .gpu_xid_attribution(gpu_label, xid, "unattributed");
                let Some(gpu) = r.gpu else {
                    tracing::warn!(xid, %why, "GPU Xid on an unknown device names none of this agent's workers");
                    return;
                };
                let suspects = self.on_gpu(gpu);
                tracing::warn!(
                    gpu, xid, %why, workers = suspects.len(), window = ?self.suspect_window,
                    "GPU Xid not attributed: its GPU's workers are suspect; those that fail within the window are restarted"
                );
                for w in suspects {
                    self.send(
                        w,
                        Event::GpuSuspect {
                            xid,
                            window: self.suspect_window,
                        },
                    );
                }
            }
        }
    }

    fn blame(&self, pid: u32, name: Option<&str>) -> Blame {
        let roots: Vec<(usize, u32)> = self
            .pool
            .workers()
            .iter()
            .filter_map(|w| Some((w.index, w.snapshot().process.as_ref()?.pid)))
            .collect();
        match procfs::owner(&*self.procs, &roots, pid, name) {
            Ok(Some(i)) => Blame::Worker(i),
            Ok(None) if self.procs.tgid(pid).is_some() => Blame::OtherProcess,
            Ok(None) => Blame::Nobody(format!("pid {pid} is gone")),
            Err(mismatch) => Blame::Nobody(mismatch.to_string()),
        }
    }

    fn restart(&self, worker: usize, xid: u32, pid: u32, r: &XidReport) {
        let w = &self.pool.workers()[worker];
        tracing::warn!(
            worker = %w.id(), xid, pid, process = ?r.process,
            "GPU Xid blamed on this worker: restarting it alone"
        );
        self.send(
            worker,
            Event::GpuFault {
                xid,
                severity: GpuFaultSeverity::Restart,
                pid: Some(pid),
            },
        );
    }

    fn on_gpu(&self, gpu: u32) -> Vec<usize> {
        self.pool
            .workers()
            .iter()
            .filter(|w| self.parents.get(w.index).copied().flatten() == Some(gpu))
            .map(|w| w.index)
            .collect()
    }

    fn send(&self, worker: usize, event: Event) {
        self.pool.workers()[worker]
            .reporter()
            .control(Control::Sentinel(event));
    }
}

#[cfg(test)]
mod tests;
