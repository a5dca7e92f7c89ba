//! The lifecycle states a supervised worker moves through.

use std::fmt;

/// Where a worker is in its lifecycle, as advertised to the rest of the mesh.
///
/// The transitions are drawn in the crate documentation.
///
/// Only [`State::Ready`] and [`State::Degraded`] take traffic; see
/// [`Sentinel::routable`](crate::Sentinel::routable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// A process has been (or is being) spawned and has not yet passed its
    /// startup probe.
    Starting,
    /// The process is up, ready and healthy; it takes traffic.
    Ready,
    /// The process is up and still takes traffic, but a probe or health check
    /// has failed below its fault threshold.
    Degraded,
    /// A fault was detected; the process is being killed (or is already gone)
    /// and a restart will be scheduled once it has exited.
    Failed,
    /// Waiting out the crash-loop backoff delay before the next spawn.
    Backoff,
    /// The process is up but an operator asked for it to take no new traffic.
    Draining,
    /// The worker's GPU is unusable; the worker is never restarted.
    Quarantined,
}

impl State {
    /// Every state, in declaration order (for pre-registering metric labels).
    pub const ALL: [State; 7] = [
        State::Starting,
        State::Ready,
        State::Degraded,
        State::Failed,
        State::Backoff,
        State::Draining,
        State::Quarantined,
    ];

    /// The lowercase name used in logs, metrics and the advertised record.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Degraded => "degraded",
            State::Failed => "failed",
            State::Backoff => "backoff",
            State::Draining => "draining",
            State::Quarantined => "quarantined",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_distinct_lowercase() {
        let names: HashSet<_> = State::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), State::ALL.len());
        for name in names {
            assert_eq!(name, name.to_lowercase());
        }
        assert_eq!(State::Quarantined.to_string(), "quarantined");
    }
}
