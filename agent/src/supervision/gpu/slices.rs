//! Whether the GPU slices the workers are given exist on this host: the
//! GPU or MIG instance each is pinned to, and CUDA MPS where a worker has
//! an MPS share (without an MPS daemon the CUDA driver runs the worker
//! without MPS and silently ignores its share). Asked of the GPU backend,
//! so the fake one can say yes or no in tests.
//!
//! `infermesh agent --check-config` prints every finding and fails on an
//! error; the running agent logs each error once at start and starts the
//! worker anyway (what the file says may be fixed on the host while the
//! agent runs: an MPS daemon started, a GPU re-partitioned).

use infermesh_gpu::slice::{PIPE_DIRECTORY_ENV, pipe_directory};
use infermesh_gpu::{GpuTelemetry, MpsStatus};

use crate::config::{WorkerGpu, WorkerSpec};

/// What checking the workers' slices found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SliceCheck {
    /// A slice that is not there: the worker would not get what its
    /// configuration says.
    pub errors: Vec<String>,
    /// What could not be checked, and why.
    pub notes: Vec<String>,
}

/// Checks `workers` against `gpus`; `agent_pipe_directory` is the agent's
/// own `CUDA_MPS_PIPE_DIRECTORY` (workers inherit it unless their `env`
/// sets one).
pub fn check(
    workers: &[WorkerSpec],
    gpus: &dyn GpuTelemetry,
    agent_pipe_directory: Option<&str>,
) -> SliceCheck {
    let mut out = SliceCheck::default();
    if workers.iter().all(|w| w.gpu.is_none()) {
        return out;
    }
    let devices = gpus.devices();
    let mig = gpus.mig_devices();
    // No telemetry (no NVML, or `backend = "off"`): nothing to check a GPU
    // against, but the MPS daemon's pipe still answers.
    let blind = devices.is_empty() && gpus.backend() == "off";
    for (w, slice) in workers.iter().filter_map(|w| Some((w, w.gpu.as_ref()?))) {
        let at = format!("worker {}", w.id);
        let gpu = &slice.device;
        let parent = match (gpu.parent(&devices, &mig), gpu) {
            _ if blind => {
                out.notes.push(format!(
                    "{at}: GPU telemetry is off, so {gpu} cannot be checked"
                ));
                None
            }
            (Some(index), WorkerGpu::Index(_)) if !devices.iter().any(|d| d.index == index) => {
                out.errors.push(format!(
                    "{at}: no GPU with index {index} on this host ({} GPU(s))",
                    devices.len()
                ));
                None
            }
            (Some(index), _) => Some(index),
            (None, WorkerGpu::Mig(uuid)) => {
                let known: Vec<&str> = mig.iter().map(|m| m.uuid.as_str()).collect();
                out.errors.push(format!(
                    "{at}: no MIG instance {uuid} on this host ({})",
                    if known.is_empty() {
                        "no GPU has MIG instances".to_string()
                    } else {
                        format!("MIG instances: {}", known.join(", "))
                    }
                ));
                None
            }
            (None, other) => {
                let known: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
                out.errors.push(format!(
                    "{at}: no {other} on this host, or more than one whose UUID starts so \
                         (GPUs: {})",
                    known.join(", ")
                ));
                None
            }
        };
        if !slice.mps.is_set() {
            continue;
        }
        // Without telemetry the daemon's pipe alone answers (any index).
        let Some(index) = parent.or(blind.then_some(0)) else {
            // The device itself is missing: said above.
            continue;
        };
        let from_env = w.env.get(PIPE_DIRECTORY_ENV).map(String::as_str);
        let dir = pipe_directory(from_env.or(agent_pipe_directory));
        if let MpsStatus::Absent(why) = gpus.mps(index, &dir) {
            out.errors.push(format!(
                "{at}: has an MPS share (mps_thread_percentage / mps_memory_limit), but MPS \
                 does not serve {gpu}: {why}. Without MPS the CUDA driver ignores the share"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use infermesh_gpu::{FakeSetup, FakeTelemetry, NoTelemetry};

    use super::*;
    use crate::config::{GpuSlice, MpsShare};

    fn worker(id: &str, gpu: Option<WorkerGpu>, mps: Option<u8>) -> WorkerSpec {
        let mut spec = crate::testing::spec(id);
        spec.gpu = gpu.map(|device| GpuSlice {
            device,
            mps: MpsShare {
                thread_percentage: mps,
                memory_limit_mib: None,
            },
        });
        spec
    }

    fn fake(mps: bool) -> FakeTelemetry {
        FakeTelemetry::from_setup(FakeSetup {
            devices: 2,
            mig_per_device: 2,
            mps,
        })
    }

    #[test]
    fn existing_slices_pass() {
        let workers = [
            worker("a", Some(WorkerGpu::Mig("MIG-fake-1-0".into())), Some(30)),
            worker("b", Some(WorkerGpu::Gpu("GPU-fake-0".into())), Some(70)),
            worker("c", Some(WorkerGpu::Index(1)), None),
            worker("d", None, None),
        ];
        assert_eq!(check(&workers, &fake(true), None), SliceCheck::default());
    }

    #[test]
    fn a_missing_mig_instance_or_gpu_is_an_error() {
        let workers = [
            worker("a", Some(WorkerGpu::Mig("MIG-fake-1-7".into())), None),
            worker("b", Some(WorkerGpu::Index(2)), None),
            worker("c", Some(WorkerGpu::Gpu("GPU-nope".into())), None),
        ];
        let found = check(&workers, &fake(false), None);
        assert_eq!(found.errors.len(), 3, "{found:?}");
        assert!(found.errors[0].starts_with("worker a: no MIG instance MIG-fake-1-7"));
        assert!(found.errors[0].contains("MIG-fake-0-0, MIG-fake-0-1"));
        assert!(found.errors[1].contains("no GPU with index 2"));
        assert!(found.errors[2].contains("no GPU GPU-nope"));
        let plain = FakeTelemetry::from_setup(FakeSetup::default());
        let found = check(&workers[..1], &plain, None);
        assert!(
            found.errors[0].contains("no GPU has MIG instances"),
            "{found:?}"
        );
    }

    #[test]
    fn an_mps_share_without_mps_is_an_error() {
        let workers = [
            worker("a", Some(WorkerGpu::Mig("MIG-fake-1-0".into())), Some(30)),
            worker("b", Some(WorkerGpu::Index(0)), Some(50)),
        ];
        let found = check(&workers, &fake(false), None);
        assert_eq!(found.errors.len(), 2, "{found:?}");
        assert!(
            found.errors[0].contains("MPS does not serve MIG instance MIG-fake-1-0"),
            "{found:?}"
        );
        assert!(found.errors[1].starts_with("worker b:") && found.errors[1].contains("GPU 0"));
        // MPS on GPU 1 only: the MIG instance on it passes.
        let gpus = fake(false);
        gpus.set_mps(1, true);
        let found = check(&workers, &gpus, None);
        assert_eq!(found.errors.len(), 1, "{found:?}");
        assert!(found.errors[0].starts_with("worker b:"), "{found:?}");
    }

    #[test]
    fn without_telemetry_the_pipe_decides_and_gpus_are_noted() {
        let dir = std::env::temp_dir().join(format!("infermesh-slices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let workers = [
            worker("a", Some(WorkerGpu::Mig("MIG-x".into())), Some(30)),
            worker("b", None, None),
        ];
        let nowhere = "/nonexistent/nvidia-mps";
        let found = check(&workers, &NoTelemetry, Some(nowhere));
        assert_eq!(found.notes.len(), 1, "{found:?}");
        assert!(found.notes[0].contains("cannot be checked"));
        assert_eq!(found.errors.len(), 1, "{found:?}");
        assert!(found.errors[0].contains(nowhere), "{found:?}");
        // The worker's own env names the directory, where a daemon listens.
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join("control"))
            .status()
            .unwrap();
        assert!(made.success());
        let mut with_env = workers[0].clone();
        with_env
            .env
            .insert(PIPE_DIRECTORY_ENV.to_string(), dir.display().to_string());
        let found = check(&[with_env], &NoTelemetry, Some(nowhere));
        assert!(found.errors.is_empty(), "{found:?}");
        assert!(Path::new(&dir).join("control").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
