//! What goes into the sentinel ([`Event`]) and what comes out of it
//! ([`Action`], [`Notice`]).

use std::time::Duration;

use crate::{FaultReason, Progress, State};

/// How bad a GPU Xid is, as classified by the GPU monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuFaultSeverity {
    /// The worker's CUDA context is lost but the GPU is usable: restart it.
    Restart,
    /// The GPU itself is unusable (e.g. fallen off the bus, uncorrectable
    /// memory error); restarting would only fail again, so stop for good.
    Quarantine,
}

/// Something the driver observed about the worker or its environment.
///
/// Events that make no sense in the current state (a late probe answer, an
/// exit report for a process that is already gone) are ignored, so the driver
/// never has to filter them.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The driver spawned the process after an [`Action::Spawn`].
    Spawned,
    /// The driver could not spawn the process after an [`Action::Spawn`].
    SpawnFailed {
        /// Why spawning failed.
        error: String,
    },
    /// The startup probe passed: the process is live and its models are ready.
    BecameReady,
    /// The process ended.
    Exited {
        /// Exit code, if it exited normally.
        code: Option<i32>,
        /// Signal number, if it was killed by a signal.
        signal: Option<i32>,
    },
    /// An output line of the process matched a fault pattern
    /// (see [`FaultPatterns`](crate::FaultPatterns)).
    FaultLine {
        /// The pattern that matched.
        pattern: String,
        /// The whole line.
        line: String,
    },
    /// The GPU monitor classified an Xid on this worker's GPU: one the
    /// driver blamed on this worker's process (restart), or one that makes
    /// the whole GPU unusable (quarantine).
    GpuFault {
        /// The NVIDIA Xid number.
        xid: u32,
        /// What the Xid means for the worker.
        severity: GpuFaultSeverity,
        /// The process (thread) the driver named, when it named one.
        pid: Option<u32>,
    },
    /// An application Xid on this worker's GPU that could not be blamed on
    /// a process: the worker is suspect for `window`. A request error, a
    /// probe timeout or a failed health check within it restarts the
    /// worker (reason `xid`) at once; otherwise the suspicion lapses.
    GpuSuspect {
        /// The NVIDIA Xid number.
        xid: u32,
        /// How long the suspicion lasts.
        window: Duration,
    },
    /// What the stall watchdog sees of the worker's requests now (sent
    /// periodically while it serves).
    Progress(Progress),
    /// A health-check verdict.
    Health {
        /// Whether the check passed.
        pass: bool,
        /// Why it failed (or a short note when it passed).
        reason: String,
    },
    /// The periodic liveness probe was answered.
    ProbeOk,
    /// The periodic liveness probe timed out: the process may be hung.
    ProbeTimeout,
    /// A proxied request failed with an internal error.
    RequestError,
    /// An operator asked the worker to stop taking new traffic.
    Drain,
    /// An operator asked the worker to take traffic again.
    Undrain,
    /// An operator asked for the worker to be restarted.
    Restart,
    /// Time passed; fire the timers that are due (see
    /// [`Sentinel::poll_timeout`](crate::Sentinel::poll_timeout)).
    Tick,
}

/// Something the driver must do, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Stop sending new requests to the worker.
    StopRouting,
    /// Start sending requests to the worker again.
    ResumeRouting,
    /// Answer every request in flight on the current process at once with
    /// a retryable error: the process is stuck and will not answer them.
    AbortInFlight,
    /// Terminate the process: SIGTERM, then SIGKILL once `grace` has passed.
    /// The driver reports [`Event::Exited`] when the process is gone; no
    /// [`Action::Spawn`] is emitted before that.
    Kill {
        /// How long to wait between SIGTERM and SIGKILL.
        grace: Duration,
    },
    /// Start the process, then report [`Event::Spawned`] or
    /// [`Event::SpawnFailed`].
    Spawn,
    /// Advertise the new state; emitted on every state change.
    SetState(State),
    /// Record something for logs and metrics; needs no other reaction.
    Emit(Notice),
}

/// Something worth logging or counting.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// A fault was detected.
    Fault {
        /// What kind of fault.
        reason: FaultReason,
        /// Human-readable detail (the matched line, the exit status, ...).
        detail: String,
    },
    /// A restart has been scheduled.
    Restart {
        /// The fault that caused it.
        reason: FaultReason,
        /// The backoff before the spawn; [`Duration::ZERO`] means immediate.
        delay: Duration,
    },
    /// The worker was quarantined and will not be restarted.
    Quarantine {
        /// The Xid that caused it.
        xid: u32,
        /// Human-readable detail.
        detail: String,
    },
    /// An unattributed application Xid made the worker suspect.
    Suspect {
        /// The Xid.
        xid: u32,
        /// How long the suspicion lasts.
        window: Duration,
    },
    /// The worker became ready again after a fault.
    Recovered,
    /// The worker stayed up for the stable period; the crash-loop counter was
    /// reset, so the next fault restarts it without delay.
    Stable,
}
