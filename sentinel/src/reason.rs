//! Why a worker was declared faulty.

use std::fmt;

/// The cause of a fault, carried in [`Notice`](crate::Notice)s and exposed by
/// [`Sentinel::last_fault`](crate::Sentinel::last_fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultReason {
    /// The process exited on its own.
    Exit,
    /// An output line matched a fatal fault pattern (e.g. `CUDA error`).
    FaultPattern,
    /// The GPU reported an Xid that requires restarting the worker.
    Xid,
    /// Consecutive health-check failures reached the threshold.
    Health,
    /// Consecutive liveness-probe timeouts reached the threshold.
    Hang,
    /// Requests were in flight and none was answered for the stall window,
    /// while the process may still answer probes (inference stuck, e.g. a
    /// spinning GPU kernel or a deadlocked model).
    Stall,
    /// Too many internal request errors within the error window.
    ErrorBurst,
    /// An operator asked for a restart.
    Operator,
    /// The process did not become ready within the startup timeout.
    StartupTimeout,
    /// The process could not be spawned at all.
    SpawnFailed,
}

impl FaultReason {
    /// Every reason, in declaration order (for pre-registering metric labels).
    pub const ALL: [FaultReason; 10] = [
        FaultReason::Exit,
        FaultReason::FaultPattern,
        FaultReason::Xid,
        FaultReason::Health,
        FaultReason::Hang,
        FaultReason::Stall,
        FaultReason::ErrorBurst,
        FaultReason::Operator,
        FaultReason::StartupTimeout,
        FaultReason::SpawnFailed,
    ];

    /// The snake_case name used as a Prometheus label value.
    pub fn as_label(self) -> &'static str {
        match self {
            FaultReason::Exit => "exit",
            FaultReason::FaultPattern => "fault_pattern",
            FaultReason::Xid => "xid",
            FaultReason::Health => "health",
            FaultReason::Hang => "hang",
            FaultReason::Stall => "stall",
            FaultReason::ErrorBurst => "error_burst",
            FaultReason::Operator => "operator",
            FaultReason::StartupTimeout => "startup_timeout",
            FaultReason::SpawnFailed => "spawn_failed",
        }
    }
}

impl fmt::Display for FaultReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn labels_are_distinct_snake_case() {
        let labels: HashSet<_> = FaultReason::ALL.iter().map(|r| r.as_label()).collect();
        assert_eq!(labels.len(), FaultReason::ALL.len());
        for label in labels {
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
        assert_eq!(FaultReason::StartupTimeout.to_string(), "startup_timeout");
    }
}
