//! Slices of a GPU a worker can be given: MIG instances and CUDA MPS shares.
//!
//! **MIG** (Multi-Instance GPU, A100/H100 and later) carves a GPU into
//! instances with their own SMs and memory; CUDA sees each as a device of
//! its own, named `MIG-<uuid>` in `CUDA_VISIBLE_DEVICES`. NVML lists them
//! under their parent GPU (`nvmlDeviceGetMigDeviceHandleByIndex`), which is
//! what [`MigDevice`] reports.
//!
//! **MPS** (Multi-Process Service) lets CUDA processes share one GPU's SMs
//! at once, each capped by `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`. Those variables only take effect
//! when the client connects to an MPS control daemon: without one the CUDA
//! driver silently runs the process without MPS, share ignored. The daemon
//! is found the way the CUDA driver finds it: its `control` pipe in the
//! pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`).
//! [`control_pipe`] checks that; a backend adds what it knows of the device
//! (NVML: a GPU whose compute mode is `Prohibited` takes no context at all).

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Environment variable that moves the MPS pipe directory.
pub const PIPE_DIRECTORY_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Where the MPS control daemon puts its pipes when the variable is unset.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// A MIG instance as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigDevice {
    /// NVML index of the GPU it is carved from.
    pub parent: u32,
    /// Its index among the parent's MIG devices.
    pub index: u32,
    /// `MIG-<uuid>`: what `CUDA_VISIBLE_DEVICES` takes.
    pub uuid: String,
    /// Its memory.
    pub memory_total_bytes: u64,
    /// Memory in use now.
    pub memory_used_bytes: u64,
}

/// Whether CUDA MPS would serve a process on a GPU now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsStatus {
    /// A control daemon listens and the GPU takes contexts.
    Running,
    /// Not, and why (a sentence for `--check-config` and the log).
    Absent(String),
}

/// The MPS pipe directory a process with `env_value` as its
/// `CUDA_MPS_PIPE_DIRECTORY` (if set) uses.
pub fn pipe_directory(env_value: Option<&str>) -> PathBuf {
    PathBuf::from(
        env_value
            .filter(|v| !v.is_empty())
            .unwrap_or(DEFAULT_PIPE_DIRECTORY),
    )
}

/// Whether an MPS control daemon listens in `dir`: its `control` pipe is
/// there and is a FIFO (what `nvidia-cuda-mps-control -d` creates, and what
/// the CUDA driver opens to reach it).
pub fn control_pipe(dir: &Path) -> MpsStatus {
    use std::os::unix::fs::FileTypeExt;
    let pipe = dir.join("control");
    match std::fs::metadata(&pipe) {
        Ok(m) if m.file_type().is_fifo() => MpsStatus::Running,
        Ok(_) => MpsStatus::Absent(format!(
            "{} is not a pipe: no MPS control daemon there",
            pipe.display()
        )),
        Err(e) => MpsStatus::Absent(format!(
            "no MPS control daemon: {} ({e}); start one with `nvidia-cuda-mps-control -d` \
             or set {PIPE_DIRECTORY_ENV}",
            pipe.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_directory_defaults_like_cuda() {
        assert_eq!(pipe_directory(None), PathBuf::from("/tmp/nvidia-mps"));
        assert_eq!(pipe_directory(Some("")), PathBuf::from("/tmp/nvidia-mps"));
        assert_eq!(pipe_directory(Some("/run/mps")), PathBuf::from("/run/mps"));
    }

    #[test]
    fn control_pipe_must_be_a_fifo() {
        let dir = std::env::temp_dir().join(format!("infermesh-mps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("control"));
        let MpsStatus::Absent(why) = control_pipe(&dir) else {
            panic!("no pipe yet");
        };
        assert!(why.contains("control"), "{why}");
        std::fs::write(dir.join("control"), b"").unwrap();
        assert!(matches!(control_pipe(&dir), MpsStatus::Absent(_)));
        std::fs::remove_file(dir.join("control")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join("control"))
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(control_pipe(&dir), MpsStatus::Running);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
