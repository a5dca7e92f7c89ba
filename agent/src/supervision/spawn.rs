//! Starting a worker process the way the agent owns it:
//!
//! - a free loopback port is picked and substituted for `{port}` in the
//!   command line, and exported as `INFERMESH_WORKER_PORT`;
//! - `CUDA_VISIBLE_DEVICES` is set when the worker has a GPU (an index, a
//!   GPU UUID or a MIG instance UUID), and the CUDA MPS variables when it
//!   has a share of one ([`crate::config::slice`]);
//! - the worker runs in its own process group, so a terminal's Ctrl-C reaches
//!   only the agent (which then drains before stopping workers), and a stop
//!   signal reaches the worker's own children too;
//! - it dies with the agent even when the agent is SIGKILLed, so no orphan
//!   keeps GPU memory or a port. With a shim ([`ProcessLauncher::shim`], set
//!   by the CLI to its own binary) the worker runs under
//!   `infermesh worker-shim --parent <agent pid> -- <command>`, a child
//!   subreaper in the same process group that kills the worker and every
//!   descendant when the agent goes — wrappers (`/bin/sh -c '…; echo'`)
//!   included — and exits the way the worker did (`cli/src/shim.rs`). Stop
//!   signals still go to the whole group; a `SIGKILL` is sent to the shim as
//!   `SIGUSR1` instead (a `SIGKILL` would kill the shim alone and leave
//!   descendants that left the group). Without a shim (in-process tests,
//!   embedders) the worker itself gets `PR_SET_PDEATHSIG(SIGKILL)`, which
//!   does not reach below a wrapper; the agent says so once in the log;
//! - once the process (shim or worker) has ended, whatever is left in its
//!   process group is sent `SIGKILL`, so a restart starts clean even if the
//!   shim itself was killed;
//! - stdout and stderr are drained for the worker's whole life by
//!   [`crate::supervision::output::read_lines`] (bytes, lines capped, lossy UTF-8) into
//!   [`OutputSink::line`]: the agent log, the output ring, fault patterns.
//!
//! [`ProcessLauncher::shim`]: ProcessLauncher::shim
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

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::config::WorkerSpec;
use crate::supervision::launch::{Exit, Launched, Launcher, OutputSink};

/// Placeholder in a worker's command line for its port.
pub const PORT_PLACEHOLDER: &str = "{port}";

/// A spawned worker process.
pub struct Spawned {
    /// The process (the shim, when there is one).
    pub child: Child,
    /// Its pid (and process group id).
    pub pid: u32,
    /// Where it will serve OIP.
    pub address: SocketAddr,
    /// Started through the worker shim.
    pub shimmed: bool,
}

/// What the shim takes as "kill the worker and everything below it now".
const SHIM_KILL: Signal = Signal::SIGUSR1;

impl Launched for Spawned {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn address(&self) -> SocketAddr {
        self.address
    }

    fn signal(&mut self, signal: Signal) {
        let pid = Pid::from_raw(self.pid as i32);
        let sent = match (self.shimmed, signal) {
            (true, Signal::SIGKILL) => kill(pid, SHIM_KILL),
            _ => killpg(pid, signal),
        };
        if let Err(e) = sent {
            tracing::debug!(pid = self.pid, ?signal, error = %e, "signal to worker group failed (already gone?)");
        }
    }

    fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn wait(&mut self) -> Pin<Box<dyn Future<Output = Exit> + Send + '_>> {
        Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            let status = self.child.wait().await;
            // The group outlives its leader while members remain (and its
            // id cannot be reused meanwhile): kill what the process left.
            let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
            match status {
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

impl Drop for Spawned {
    fn drop(&mut self) {
        // Dropped while running (e.g. the agent's runtime going away): the
        // shim kills the worker tree; without one, `kill_on_drop` does.
        if self.shimmed && matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(Pid::from_raw(self.pid as i32), SHIM_KILL);
        }
    }
}

/// Spawns a process of `spec`, through the worker shim `shim` if given; its
/// output goes to `output`.
pub fn spawn(spec: &WorkerSpec, shim: Option<&Path>, output: OutputSink) -> io::Result<Spawned> {
    let port = free_port()?;
    let argv: Vec<String> = spec
        .argv
        .iter()
        .map(|a| a.replace(PORT_PLACEHOLDER, &port.to_string()))
        .collect();
    let program = resolve_program(&argv[0])
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, not_found(&argv[0])))?;
    let mut cmd = match shim {
        Some(shim) => {
            let mut cmd = Command::new(shim);
            cmd.arg("worker-shim")
                .arg("--parent")
                .arg(std::process::id().to_string())
                .arg("--")
                .arg(&program)
                .args(&argv[1..]);
            cmd
        }
        None => {
            static DIRECT: std::sync::Once = std::sync::Once::new();
            DIRECT.call_once(|| {
                tracing::warn!("no worker shim configured: workers are started directly and a worker behind a wrapper script can outlive a SIGKILLed agent");
            });
            let mut cmd = Command::new(&program);
            cmd.args(&argv[1..]);
            crate::supervision::pdeathsig::kill_child_when_parent_dies(&mut cmd);
            cmd
        }
    };
    cmd.envs(&spec.env)
        .env("INFERMESH_WORKER_PORT", port.to_string())
        .env("INFERMESH_WORKER_ID", &spec.id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(shim.is_none());
    if let Some(gpu) = &spec.gpu {
        cmd.envs(gpu.env());
    }
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
        shimmed: shim.is_some(),
    })
}

/// A port free on loopback right now. The worker binds it moments later; the
/// small race with other processes is the usual price of letting the agent
/// own port assignment, and shows up as a worker that fails to start.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The executable file a worker's program `name` stands for, as the agent
/// starts it: `name` itself if it has a `/`; else the first match on
/// `PATH`, then one next to the running `infermesh` binary.
/// `infermesh agent --check-config` looks programs up with this too.
pub fn resolve_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let path = PathBuf::from(name);
        return is_executable(&path).then_some(path);
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

/// Why [`resolve_program`] found nothing for `name`.
pub fn not_found(name: &str) -> String {
    if name.contains('/') {
        format!("'{name}' not found (not an executable file)")
    } else {
        format!(
            "'{name}' not found (no executable of that name on PATH or next to the infermesh binary)"
        )
    }
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
        let reader = BufReader::new(reader);
        let read = crate::supervision::output::read_lines(
            reader,
            crate::supervision::output::MAX_LINE_BYTES,
            |line| output.line(pid, stream, line),
        );
        if let Err(e) = read.await {
            tracing::warn!(worker = %output.worker, stream, error = %e, "cannot read worker output");
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

/// Starts real processes ([`spawn`]).
#[derive(Debug, Clone, Default)]
pub struct ProcessLauncher {
    /// The `infermesh` binary to start workers through as a shim, if any.
    pub shim: Option<PathBuf>,
}

impl Launcher for ProcessLauncher {
    fn launch(&self, spec: &WorkerSpec, output: OutputSink) -> io::Result<Box<dyn Launched>> {
        Ok(Box::new(spawn(spec, self.shim.as_deref(), output)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_programs_in_path() {
        assert!(resolve_program("sh").is_some());
        assert!(resolve_program("no-such-program-here").is_none());
        // A path is taken as it is, if it is an executable file.
        assert_eq!(resolve_program("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(resolve_program("/bin/no-such-program-here"), None);
        assert_eq!(
            resolve_program(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")),
            None,
            "not executable"
        );
    }
}
