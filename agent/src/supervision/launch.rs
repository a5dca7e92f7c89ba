//! How a supervisor starts a worker process, behind a narrow seam.
//!
//! [`Launcher`] starts one process of a worker and hands back a
//! [`Launched`]: its pid and OIP address, a way to signal its process
//! group, and its exit. [`ProcessLauncher`] is the real one
//! ([`crate::supervision::spawn`]); tests put in-process workers behind the same trait so
//! the supervisor can be driven under tokio's paused clock.
//!
//! A worker's output goes to an [`OutputSink`]: each line is logged (tagged
//! with the worker id), kept in the worker's output ring, and matched
//! against the fault patterns — a match is reported to the supervisor
//! (coalesced, see [`crate::worker::inbox`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use infermesh_sentinel::FaultPatterns;
use nix::sys::signal::Signal;

use crate::config::WorkerSpec;
use crate::supervision::prober::Prober;
use crate::worker::inbox::Reporter;
use crate::worker::worker_log::WorkerLog;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if one killed it.
    pub signal: Option<i32>,
}

/// A started worker process.
pub trait Launched: Send {
    /// Its pid (and process group id).
    fn pid(&self) -> u32;
    /// Where it serves OIP.
    fn address(&self) -> SocketAddr;
    /// Sends `signal` to its process group.
    fn signal(&mut self, signal: Signal);
    /// Whether it has ended already (without waiting).
    fn has_exited(&mut self) -> bool;
    /// Resolves when it has ended.
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = Exit> + Send + '_>>;
}

/// Starts worker processes.
pub trait Launcher: Send + Sync + 'static {
    /// Starts one process of `spec`, its output going to `output`.
    fn launch(&self, spec: &WorkerSpec, output: OutputSink) -> io::Result<Box<dyn Launched>>;

    /// Where the liveness probes of its processes run: a thread of their
    /// own ([`Prober::dedicated`]), so that a busy agent is not taken for
    /// a hung worker. Processes that live on the caller's runtime (the
    /// in-process fakes, under tokio's paused clock) are probed from it.
    fn prober(&self) -> Arc<Prober> {
        Prober::dedicated().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot start the probe thread: liveness probes share the agent's runtime");
            Prober::inline()
        })
    }
}

/// Where one worker's output lines go.
#[derive(Debug, Clone)]
pub struct OutputSink {
    /// Worker id, for the log.
    pub worker: Arc<str>,
    /// Fault patterns.
    pub patterns: Arc<FaultPatterns>,
    /// The worker's output ring.
    pub log: Arc<WorkerLog>,
    /// Fault reports to the supervisor.
    pub reporter: Reporter,
}

impl OutputSink {
    /// Handles one line `pid` wrote on `stream`.
    pub fn line(&self, pid: u32, stream: &'static str, line: &str) {
        if let Some(pattern) = self.patterns.find(line) {
            tracing::error!(target: "infermesh::worker", worker = %self.worker, stream, pattern, "{line}");
            self.reporter.fault_line(pid, pattern, line);
        } else {
            use tracing::Level;
            // At the worker's own level when its format says (Triton's
            // `E…`/`W…`/`I…`, `ERROR:`…); info otherwise.
            match crate::supervision::output::level_of(line).unwrap_or(Level::INFO) {
                Level::ERROR => {
                    tracing::error!(target: "infermesh::worker", worker = %self.worker, stream, "{line}")
                }
                Level::WARN => {
                    tracing::warn!(target: "infermesh::worker", worker = %self.worker, stream, "{line}")
                }
                Level::INFO => {
                    tracing::info!(target: "infermesh::worker", worker = %self.worker, stream, "{line}")
                }
                Level::DEBUG => {
                    tracing::debug!(target: "infermesh::worker", worker = %self.worker, stream, "{line}")
                }
                _ => {
                    tracing::trace!(target: "infermesh::worker", worker = %self.worker, stream, "{line}")
                }
            }
        }
        self.log.push_output(line.to_string());
    }
}
