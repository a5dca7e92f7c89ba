//! Which GPU, or slice of one, a worker runs on (`gpu`,
//! `mps_thread_percentage`, `mps_memory_limit` in `[[workers]]`), checked
//! into a [`GpuSlice`]: a [`WorkerGpu`] and an [`MpsShare`] of it, which
//! become the worker's environment ([`GpuSlice::env`], set by
//! [`crate::supervision::spawn`]). An MPS share is a share of the one device the worker
//! is pinned to, so it needs `gpu`.
//!
//! `gpu` is an NVML index (`0`), a GPU's UUID (`"GPU-5f1c…"`) or a MIG
//! instance's UUID (`"MIG-…"`); all three go into `CUDA_VISIBLE_DEVICES`
//! as written. The MPS share sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (the
//! share of the GPU's SMs the worker's kernels may use) and
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=<MiB>MB`: the worker sees one
//! device, ordinal 0). Whether the GPU, the MIG instance and an MPS daemon
//! are really there is a question for the host, not the file:
//! [`crate::supervision::gpu::slices`] asks the GPU backend.

use std::collections::BTreeMap;
use std::fmt;

use infermesh_gpu::{GpuDevice, GpuTelemetry, MigDevice};
use serde::Deserialize;

/// `CUDA_VISIBLE_DEVICES`.
pub const VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// The MPS share of SMs, in percent.
pub const THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// The MPS limit of device memory, `ordinal=limit,...`.
pub const MEMORY_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// Longest UUID accepted (NVML's are 40–50 characters).
const MAX_UUID: usize = 96;
/// Largest memory limit accepted: 16 TiB, in MiB.
const MAX_MEMORY_MIB: u64 = 16 << 20;

/// `gpu` as written: a number or a string.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawGpuRef {
    /// An NVML index.
    Index(u32),
    /// A UUID.
    Name(String),
}

impl From<u32> for RawGpuRef {
    fn from(index: u32) -> Self {
        RawGpuRef::Index(index)
    }
}

/// The GPU, or MIG instance, a worker is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerGpu {
    /// A whole GPU by NVML index. CUDA numbers devices fastest-first unless
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and an MPS daemon started with
    /// `CUDA_VISIBLE_DEVICES` renumbers them: a UUID is safer.
    Index(u32),
    /// A whole GPU by UUID (`GPU-…`).
    Gpu(String),
    /// A MIG instance by UUID (`MIG-…`).
    Mig(String),
}

impl WorkerGpu {
    /// The value of `CUDA_VISIBLE_DEVICES`.
    pub fn visible_devices(&self) -> String {
        match self {
            WorkerGpu::Index(i) => i.to_string(),
            WorkerGpu::Gpu(uuid) | WorkerGpu::Mig(uuid) => uuid.clone(),
        }
    }

    /// The NVML index of the physical GPU it is on, as the backend's
    /// `devices` and `mig` instances say (an index is taken as given).
    /// CUDA also takes a unique prefix of a UUID; so does this.
    pub fn parent(&self, devices: &[GpuDevice], mig: &[MigDevice]) -> Option<u32> {
        match self {
            WorkerGpu::Index(i) => Some(*i),
            WorkerGpu::Gpu(uuid) => {
                unique(devices.iter().filter(|d| d.uuid.starts_with(uuid))).map(|d| d.index)
            }
            WorkerGpu::Mig(uuid) => {
                unique(mig.iter().filter(|m| m.uuid.starts_with(uuid))).map(|m| m.parent)
            }
        }
    }
}

/// The NVML index of the GPU each of `slices` (one per worker, in order)
/// is on: its own, or its MIG instance's parent; `None` for CPU workers
/// and devices the backend does not list. MIG instances are read once, so
/// callers resolve at start (re-partitioning a GPU needs its workers
/// stopped).
pub fn parents<'a>(
    slices: impl IntoIterator<Item = Option<&'a GpuSlice>>,
    gpus: &dyn GpuTelemetry,
) -> Vec<Option<u32>> {
    let slices: Vec<_> = slices.into_iter().collect();
    let devices = gpus.devices();
    let mig = if slices.iter().any(Option::is_some) {
        gpus.mig_devices()
    } else {
        Vec::new()
    };
    slices
        .into_iter()
        .map(|s| s?.device.parent(&devices, &mig))
        .collect()
}

fn unique<T>(mut it: impl Iterator<Item = T>) -> Option<T> {
    let first = it.next()?;
    it.next().is_none().then_some(first)
}

impl fmt::Display for WorkerGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerGpu::Index(i) => write!(f, "GPU {i}"),
            WorkerGpu::Gpu(uuid) => write!(f, "GPU {uuid}"),
            WorkerGpu::Mig(uuid) => write!(f, "MIG instance {uuid}"),
        }
    }
}

/// The GPU, or MIG instance, a worker is pinned to and its MPS share of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlice {
    /// The device.
    pub device: WorkerGpu,
    /// Its share of the device under CUDA MPS (none: the whole device).
    pub mps: MpsShare,
}

impl GpuSlice {
    /// A whole device.
    pub fn whole(device: WorkerGpu) -> Self {
        Self {
            device,
            mps: MpsShare::default(),
        }
    }

    /// The variables it adds to the worker's environment.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![(VISIBLE_DEVICES, self.device.visible_devices())];
        env.extend(self.mps.env());
        env
    }
}

/// A worker's CUDA MPS share of its GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MpsShare {
    /// Percent of the GPU's SMs its kernels may use (1–100).
    pub thread_percentage: Option<u8>,
    /// Device memory it may pin, MiB.
    pub memory_limit_mib: Option<u64>,
}

impl MpsShare {
    /// Whether any part is set (and so MPS must run).
    pub fn is_set(&self) -> bool {
        self.thread_percentage.is_some() || self.memory_limit_mib.is_some()
    }

    /// The MPS variables.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.thread_percentage {
            env.push((THREAD_PERCENTAGE, p.to_string()));
        }
        if let Some(mib) = self.memory_limit_mib {
            env.push((MEMORY_LIMIT, format!("0={mib}MB")));
        }
        env
    }
}

/// Checks the GPU settings of worker `at`, whose own environment is `env`.
pub fn gpu_slice(
    at: &str,
    gpu: Option<RawGpuRef>,
    mps_thread_percentage: Option<u32>,
    mps_memory_limit: Option<&str>,
    env: &BTreeMap<String, String>,
    problems: &mut Vec<String>,
) -> Option<GpuSlice> {
    let device = worker_gpu(at, gpu, problems);
    let mps = mps_share(
        at,
        mps_thread_percentage,
        mps_memory_limit,
        device.is_some(),
        env,
        problems,
    );
    Some(GpuSlice {
        device: device?,
        mps,
    })
}

/// Checks `gpu` of worker `at`.
fn worker_gpu(at: &str, raw: Option<RawGpuRef>, problems: &mut Vec<String>) -> Option<WorkerGpu> {
    let name = match raw? {
        RawGpuRef::Index(i) => return Some(WorkerGpu::Index(i)),
        RawGpuRef::Name(name) => name,
    };
    let well_formed = name.len() <= MAX_UUID
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-/".contains(c));
    match name.split_once('-') {
        Some(("GPU", rest)) if well_formed && !rest.is_empty() => Some(WorkerGpu::Gpu(name)),
        Some(("MIG", rest)) if well_formed && !rest.is_empty() => Some(WorkerGpu::Mig(name)),
        _ => {
            problems.push(format!(
                "{at}: gpu '{}' is not an index (0), a GPU UUID (\"GPU-…\") or a MIG instance \
                 UUID (\"MIG-…\"; `nvidia-smi -L` lists them)",
                name.escape_debug()
            ));
            None
        }
    }
}

/// Checks the MPS share of worker `at` (pinned to a GPU if `pinned`),
/// whose own environment is `env`.
fn mps_share(
    at: &str,
    thread_percentage: Option<u32>,
    memory_limit: Option<&str>,
    pinned: bool,
    env: &BTreeMap<String, String>,
    problems: &mut Vec<String>,
) -> MpsShare {
    let thread_percentage = thread_percentage.and_then(|p| match u8::try_from(p) {
        Ok(p @ 1..=100) => Some(p),
        _ => {
            problems.push(format!(
                "{at}: mps_thread_percentage {p} must be between 1 and 100"
            ));
            None
        }
    });
    let memory_limit_mib = memory_limit.and_then(|text| match mebibytes(text) {
        Some(mib @ 1..=MAX_MEMORY_MIB) => Some(mib),
        _ => {
            problems.push(format!(
                "{at}: mps_memory_limit '{}' is not a size like \"8GiB\" or \"512MiB\" \
                 (1 MiB to 16 TiB)",
                text.escape_debug()
            ));
            None
        }
    });
    let share = MpsShare {
        thread_percentage,
        memory_limit_mib,
    };
    if share.is_set() && !pinned {
        problems.push(format!(
            "{at}: mps_thread_percentage and mps_memory_limit need gpu: an MPS share is a share \
             of the one device the worker is pinned to"
        ));
    }
    let set = [
        (VISIBLE_DEVICES, pinned, "gpu"),
        (
            THREAD_PERCENTAGE,
            thread_percentage.is_some(),
            "mps_thread_percentage",
        ),
        (MEMORY_LIMIT, memory_limit_mib.is_some(), "mps_memory_limit"),
    ];
    for (var, ours, key) in set {
        if ours && env.contains_key(var) {
            problems.push(format!(
                "{at}: env sets {var}, which {key} sets: keep one of the two"
            ));
        }
    }
    share
}

/// `"8GiB"`, `"8G"`, `"8GB"`, `"512MiB"`, `"512M"`, `"512MB"` in MiB (binary
/// units throughout, as NVIDIA's tools mean them); `None` if not one.
fn mebibytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "M" | "MB" | "MiB" => 1,
        "G" | "GB" | "GiB" => 1 << 10,
        "T" | "TB" | "TiB" => 1 << 20,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u32, uuid: &str) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            pci_bus_id: String::new(),
            name: "x".into(),
            memory_total_bytes: 0,
            compute_capability: (9, 0),
        }
    }

    fn mig(parent: u32, uuid: &str) -> MigDevice {
        MigDevice {
            parent,
            index: 0,
            uuid: uuid.into(),
            memory_total_bytes: 0,
            memory_used_bytes: 0,
        }
    }

    #[test]
    fn gpu_is_an_index_or_a_uuid() {
        let mut problems = Vec::new();
        let at = "workers[0] (w0)";
        assert_eq!(
            worker_gpu(at, Some(RawGpuRef::Index(1)), &mut problems),
            Some(WorkerGpu::Index(1))
        );
        let m = "MIG-4c5c8b35-1f7e-5a7c-a0a5-8bd3c3f0c1a2";
        assert_eq!(
            worker_gpu(at, Some(RawGpuRef::Name(m.into())), &mut problems),
            Some(WorkerGpu::Mig(m.into()))
        );
        // The pre-R470 form names the GPU and the instance ids.
        let old = "MIG-GPU-5f1c/1/0";
        assert_eq!(
            worker_gpu(at, Some(RawGpuRef::Name(old.into())), &mut problems),
            Some(WorkerGpu::Mig(old.into()))
        );
        assert_eq!(
            worker_gpu(at, Some(RawGpuRef::Name("GPU-5f1c".into())), &mut problems),
            Some(WorkerGpu::Gpu("GPU-5f1c".into()))
        );
        assert!(problems.is_empty(), "{problems:?}");
        for bad in ["0", "mig-x", "MIG-", "GPU-a b", "GPU-1,GPU-2", "cuda:0"] {
            let mut problems = Vec::new();
            assert_eq!(
                worker_gpu(at, Some(RawGpuRef::Name(bad.into())), &mut problems),
                None
            );
            assert!(
                problems[0].contains("MIG instance UUID"),
                "{bad}: {problems:?}"
            );
        }
        assert_eq!(worker_gpu(at, None, &mut problems), None);
    }

    #[test]
    fn parents_follow_the_backend() {
        let devices = [device(0, "GPU-aaaa"), device(1, "GPU-abcd")];
        let migs = [mig(1, "MIG-1111"), mig(1, "MIG-1122")];
        let p = |g: WorkerGpu| g.parent(&devices, &migs);
        assert_eq!(p(WorkerGpu::Index(7)), Some(7));
        assert_eq!(p(WorkerGpu::Gpu("GPU-abcd".into())), Some(1));
        // A unique prefix, as CUDA takes it; an ambiguous one is nothing.
        assert_eq!(p(WorkerGpu::Gpu("GPU-ab".into())), Some(1));
        assert_eq!(p(WorkerGpu::Gpu("GPU-a".into())), None);
        assert_eq!(p(WorkerGpu::Mig("MIG-1122".into())), Some(1));
        assert_eq!(p(WorkerGpu::Mig("MIG-11".into())), None);
        assert_eq!(p(WorkerGpu::Mig("MIG-9".into())), None);
        assert_eq!(WorkerGpu::Mig("MIG-9".into()).visible_devices(), "MIG-9");
        assert_eq!(WorkerGpu::Index(3).visible_devices(), "3");
    }

    #[test]
    fn mps_share_is_checked_and_becomes_the_environment() {
        let at = "w";
        let gpu = || Some(RawGpuRef::Name("MIG-fake-0-1".into()));
        let none = BTreeMap::new();
        let mut problems = Vec::new();
        let slice = gpu_slice(at, gpu(), Some(30), Some("2GiB"), &none, &mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            slice.env(),
            vec![
                (VISIBLE_DEVICES, "MIG-fake-0-1".to_string()),
                (THREAD_PERCENTAGE, "30".to_string()),
                (MEMORY_LIMIT, "0=2048MB".to_string())
            ]
        );
        assert!(slice.mps.is_set());
        assert_eq!(
            GpuSlice::whole(WorkerGpu::Index(2)).env(),
            vec![(VISIBLE_DEVICES, "2".to_string())]
        );
        assert!(!MpsShare::default().is_set());
        for (text, mib) in [
            ("512M", 512),
            ("512MB", 512),
            ("8G", 8192),
            (" 1TiB ", 1 << 20),
        ] {
            assert_eq!(mebibytes(text), Some(mib), "{text}");
        }
        for bad in ["", "8", "8K", "1.5G", "-1G", "G"] {
            assert_eq!(mebibytes(bad), None, "{bad}");
        }

        let mut problems = Vec::new();
        gpu_slice(at, gpu(), Some(0), Some("0MiB"), &none, &mut problems);
        gpu_slice(at, gpu(), Some(101), Some("lots"), &none, &mut problems);
        assert_eq!(
            gpu_slice(at, None, None, Some("1G"), &none, &mut problems),
            None
        );
        let joined = problems.join("\n");
        assert_eq!(problems.len(), 5, "{joined}");
        assert!(joined.contains("mps_thread_percentage 0 must be between 1 and 100"));
        assert!(joined.contains("mps_thread_percentage 101"));
        assert!(joined.contains("mps_memory_limit 'lots'"));
        assert!(joined.contains("mps_memory_limit need gpu"));

        let env = BTreeMap::from([
            (VISIBLE_DEVICES.to_string(), "1".to_string()),
            (THREAD_PERCENTAGE.to_string(), "50".to_string()),
        ]);
        let mut problems = Vec::new();
        gpu_slice(at, gpu(), Some(20), None, &env, &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("env sets CUDA_VISIBLE_DEVICES, which gpu sets"));
        // Set in env alone, not by the share: the operator's own business.
        let mut problems = Vec::new();
        assert_eq!(gpu_slice(at, None, None, None, &env, &mut problems), None);
        assert!(problems.is_empty());
    }
}
