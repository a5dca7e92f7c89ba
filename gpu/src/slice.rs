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
//! is found the way the CUDA driver finds it: its `control` endpoint in the
//! pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`).
//! [`control_pipe`] checks that; a backend adds what it knows of the device
//! (NVML: a GPU whose compute mode is `Prohibited` takes no context at all).
//!
//! The endpoint is a `SOCK_SEQPACKET` Unix socket on current drivers (seen
//! on an H200, driver 580: a FIFO-only check called a running daemon absent)
//! and was a FIFO on old ones; both are accepted. A socket is also connected
//! to, because a daemon that died leaves its socket file behind; the daemon
//! logs the connection ("User did not send valid credentials", as it does
//! for the CUDA driver's own first connection) and nothing else happens.

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

/// Whether an MPS control daemon listens in `dir`: its `control` endpoint is
/// there and is a Unix socket that accepts a connection (what
/// `nvidia-cuda-mps-control -d` creates on current drivers) or a FIFO (old
/// drivers). The connection is closed at once without a word.
pub fn control_pipe(dir: &Path) -> MpsStatus {
    use std::os::unix::fs::FileTypeExt;
    let control = dir.join("control");
    match std::fs::metadata(&control) {
        Ok(m) if m.file_type().is_socket() => {
            match connect_seqpacket(&control) {
                Ok(()) => MpsStatus::Running,
                // Bound by a socket of another type: something listens there
                // (a driver that went back to stream sockets, say).
                Err(e) if e.raw_os_error() == Some(libc::EPROTOTYPE) => MpsStatus::Running,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    MpsStatus::Absent(format!(
                        "{} is a socket nobody listens on (a stopped MPS control daemon's); \
                         start one with `nvidia-cuda-mps-control -d`",
                        control.display()
                    ))
                }
                Err(e) => MpsStatus::Absent(format!(
                    "cannot reach the MPS control daemon at {}: {e}",
                    control.display()
                )),
            }
        }
        Ok(m) if m.file_type().is_fifo() => MpsStatus::Running,
        Ok(_) => MpsStatus::Absent(format!(
            "{} is neither a socket nor a pipe: no MPS control daemon there",
            control.display()
        )),
        Err(e) => MpsStatus::Absent(format!(
            "no MPS control daemon: {} ({e}); start one with `nvidia-cuda-mps-control -d` \
             or set {PIPE_DIRECTORY_ENV}",
            control.display()
        )),
    }
}

/// Connects to the Unix socket at `path` as the CUDA driver does
/// (`SOCK_SEQPACKET`) and closes the connection.
fn connect_seqpacket(path: &Path) -> std::io::Result<()> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET.cloexec(), None)?;
    socket.connect(&SockAddr::unix(path)?)
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
    fn a_listening_control_socket_is_a_running_daemon_and_a_stale_one_is_not() {
        use socket2::{Domain, SockAddr, Socket, Type};
        let dir = std::env::temp_dir().join(format!("infermesh-mps-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = dir.join("control");
        let bound = |kind: Type| {
            let _ = std::fs::remove_file(&control);
            let s = Socket::new(Domain::UNIX, kind, None).unwrap();
            s.bind(&SockAddr::unix(&control).unwrap()).unwrap();
            s
        };
        // What the daemon listens on (H200, driver 580; a stream connect
        // gets EPROTOTYPE there).
        let daemon = bound(Type::SEQPACKET);
        daemon.listen(8).unwrap();
        assert_eq!(control_pipe(&dir), MpsStatus::Running);
        // A listener of another type: someone is there all the same.
        let other = bound(Type::STREAM);
        other.listen(8).unwrap();
        assert_eq!(control_pipe(&dir), MpsStatus::Running);
        // The daemon died: its socket file stays, nobody accepts. (Bound and
        // never listening: a dropped listener could live on in a process
        // another test forks, until that process execs.)
        drop(bound(Type::SEQPACKET));
        let MpsStatus::Absent(why) = control_pipe(&dir) else {
            panic!("a socket nobody listens on is not a daemon");
        };
        assert!(why.contains("nobody listens"), "{why}");
        drop((daemon, other));
        std::fs::remove_dir_all(&dir).unwrap();
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
