//! Running a check command with a deadline and bounded output.
//!
//! The command runs in its own process group. Its stdin gets the document
//! and is closed; stdout and stderr are read concurrently (so a chatty
//! command never blocks on a full pipe), keeping at most `max_output` bytes
//! of each and discarding the rest. At the deadline — or if the caller drops
//! the future — the whole group gets SIGKILL, so a script's children die
//! with it.

use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// How a command ended.
#[derive(Debug)]
pub(crate) struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// The first `max_output` bytes of stdout.
    pub stdout: Vec<u8>,
    /// The first `max_output` bytes of stderr.
    pub stderr: Vec<u8>,
}

/// Why a command has no exit status.
#[derive(Debug)]
pub(crate) enum RunError {
    /// It could not be started (missing program, not executable, ...).
    Spawn(io::Error),
    /// It ran past the deadline and was killed.
    TimedOut,
    /// Waiting for it failed.
    Wait(io::Error),
}

/// Runs `program` with `args` in `cwd`, feeding it `stdin`.
pub(crate) async fn run(
    program: &Path,
    args: &[String],
    cwd: &Path,
    stdin: Vec<u8>,
    timeout: Duration,
    max_output: usize,
) -> Result<Finished, RunError> {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(RunError::Spawn)?;
    let mut group = GroupKiller(child.id());
    let (input, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());

    let work = async {
        let feed = async move {
            if let Some(mut input) = input {
                // A command may exit without reading its input: a broken
                // pipe is its business, not an error.
                let _ = input.write_all(&stdin).await;
            }
        };
        let (_, stdout, stderr, status) = tokio::join!(
            feed,
            read_bounded(stdout, max_output),
            read_bounded(stderr, max_output),
            child.wait(),
        );
        (status, stdout, stderr)
    };
    let outcome = tokio::time::timeout(timeout, work).await;
    match outcome {
        Ok((status, stdout, stderr)) => {
            let status = status.map_err(RunError::Wait)?;
            // Reaped, and its pipes are closed: nothing of it is left.
            group.0 = None;
            Ok(Finished {
                status,
                stdout,
                stderr,
            })
        }
        Err(_) => {
            drop(group);
            let _ = child.kill().await;
            Err(RunError::TimedOut)
        }
    }
}

/// Kills a process group when dropped, unless disarmed (`.0 = None`).
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH (already gone) is fine.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

/// Reads `reader` to the end, keeping the first `max` bytes.
async fn read_bounded<R: AsyncRead + Unpin>(reader: Option<R>, max: usize) -> Vec<u8> {
    let Some(mut reader) = reader else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}
