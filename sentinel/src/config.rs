//! Tunables of the sentinel.

use std::time::Duration;

use crate::StallWindow;

/// Default time between SIGTERM and SIGKILL for a faulted worker: a
/// faulted worker has nothing to finish and a hung one ignores SIGTERM, so
/// a second is enough (the agent's `sentinel.kill_grace` default; shutting
/// a healthy worker down is the agent's `stop_grace`).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(1);

/// Thresholds and timings of a [`Sentinel`](crate::Sentinel).
///
/// Thresholds of zero behave like one: the first failure is a fault.
#[derive(Debug, Clone)]
pub struct SentinelConfig {
    /// Nominal delay before the second restart of a crash loop; it doubles with
    /// each further restart. The first restart is always immediate.
    pub backoff_base: Duration,
    /// Upper bound on the nominal backoff delay.
    pub backoff_cap: Duration,
    /// How long a worker must stay up after becoming ready for the crash-loop
    /// counter to reset.
    pub stable_period: Duration,
    /// How long a spawned process may take to become ready.
    pub startup_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when killing the process.
    pub kill_grace: Duration,
    /// Number of internal request errors within `error_window` that makes a
    /// fault.
    pub error_burst: u32,
    /// Sliding window over which request errors are counted.
    pub error_window: Duration,
    /// Consecutive health-check failures that make a fault; fewer only
    /// degrade the worker.
    pub health_failure_threshold: u32,
    /// Consecutive liveness-probe timeouts that make a fault (a hang); fewer
    /// only degrade the worker.
    pub probe_failure_threshold: u32,
    /// How long the worker may hold requests without answering any before
    /// it is faulted (`stall`); see [`StallWindow`].
    pub stall: StallWindow,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        Self {
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            stable_period: Duration::from_secs(60),
            startup_timeout: Duration::from_secs(120),
            kill_grace: DEFAULT_KILL_GRACE,
            error_burst: 5,
            error_window: Duration::from_secs(10),
            health_failure_threshold: 3,
            probe_failure_threshold: 1,
            stall: StallWindow::default(),
        }
    }
}
