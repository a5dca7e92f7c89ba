//! Starting a worker process the way the agent owns it:
//!
//! - a free loopback port is picked and substituted for `{port}` in the
//!   command line, and exported as `INFERMESH_WORKER_PORT`;
//! - `CUDA_VISIBLE_DEVICES` is set when the worker has a GPU;
//! - the worker runs in its own process group, so a terminal's Ctrl-C reaches
//!   only the agent (which then drains before stopping workers), and a stop
//!   signal reaches the worker's own children too;
//! - it gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the agent even when
//!   the agent is SIGKILLed: no orphan keeps GPU memory or a port;
//! - stdout and stderr are read line by line into the agent log (tagged with
//!   the worker id) and the worker's output ring.
//!
//! A bare program name is looked up in `PATH`, then next to the running
//! `infermesh` binary, so `--worker "infermesh-testworker ..."` works from a
//! build directory without installing anything.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::future::Future;
use std::pin::Pin;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::config::WorkerSpec;
use crate::launch::{Exit, Launched, OutputSink};

/// Placeholder in a worker's command line for its port.
pub const PORT_PLACEHOLDER: &str = "{port}";

/// A spawned worker process.
pub struct Spawned {
    /// The process.
    pub child: Child,
    /// Its pid (and process group id).
    pub pid: u32,
    /// Where it will serve OIP.
    pub address: SocketAddr,
}

impl Launched for Spawned {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn address(&self) -> SocketAddr {
        self.address
    }

    fn signal(&mut self, signal: Signal) {
        if let Err(e) = killpg(Pid::from_raw(self.pid as i32), signal) {
            tracing::debug!(pid = self.pid, ?signal, error = %e, "signal to worker group failed (already gone?)");
        }
    }

    fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn wait(&mut self) -> Pin<Box<dyn Future<Output = Exit> + Send + '_>> {
        Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            match self.child.wait().await {
                Ok(s) => Exit {
                    code: s.code(),
                    signal: s.signal(),
                },
                Err(e) => {
                    tracing::warn!(pid = self.pid, error = %e, "cannot wait for worker");
                    Exit {
                        code: None,
                        signal: None,
                    }
                }
            }
        })
    }
}

/// Spawns a process of `spec`; its output goes to `output`.
pub fn spawn(spec: &WorkerSpec, output: OutputSink) -> io::Result<Spawned> {
    let port = free_port()?;
    let argv: Vec<String> = spec
        .argv
        .iter()
        .map(|a| a.replace(PORT_PLACEHOLDER, &port.to_string()))
        .collect();
    let program = resolve_program(&argv[0]).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "'{}' not found in PATH or next to the infermesh binary",
                argv[0]
            ),
        )
    })?;
    let mut cmd = Command::new(&program);
    cmd.args(&argv[1..])
        .envs(&spec.env)
        .env("INFERMESH_WORKER_PORT", port.to_string())
        .env("INFERMESH_WORKER_ID", &spec.id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(gpu) = spec.gpu {
        cmd.env("CUDA_VISIBLE_DEVICES", gpu.to_string());
    }
    crate::pdeathsig::kill_child_when_parent_dies(&mut cmd);
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or_default();
    if let Some(out) = child.stdout.take() {
        forward_lines(output.clone(), pid, "stdout", out);
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(output, pid, "stderr", err);
    }
    Ok(Spawned {
        child,
        pid,
        address: SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

/// A port free on loopback right now. The worker binds it moments later; the
/// small race with other processes is the usual price of letting the agent
/// own port assignment, and shows up as a worker that fails to start.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn resolve_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let in_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p));
    in_path.or_else(|| {
        let here = std::env::current_exe().ok()?;
        let candidate = here.parent()?.join(name);
        is_executable(&candidate).then_some(candidate)
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn forward_lines(
    output: OutputSink,
    pid: u32,
    stream: &'static str,
    reader: impl AsyncRead + Unpin + Send + 'static,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        loop {
            match lines.next_line().await {
                Ok(Some(line)) => output.line(pid, stream, &line),
                Ok(None) => break,
                // Not UTF-8 or a read error: note it and keep the worker running.
                Err(e) => {
                    tracing::debug!(worker = %output.worker, stream, error = %e, "unreadable worker output");
                    break;
                }
            }
        }
    });
}

/// How a process ended (exit code or signal), in words for logs and the admin API.
pub fn describe(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("signal {sig} ({})", s.as_str()),
            Err(_) => format!("signal {sig}"),
        },
        _ => "ended".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_programs_in_path() {
        assert!(resolve_program("sh").is_some());
        assert!(resolve_program("no-such-program-here").is_none());
        assert_eq!(resolve_program("/bin/x"), Some(PathBuf::from("/bin/x")));
    }
}
