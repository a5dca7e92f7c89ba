//! The stall watchdog's policy: how long a worker may hold requests
//! without answering any before it is declared stuck.
//!
//! A worker whose inference is stuck — a GPU kernel that spins, a
//! deadlocked model, a stuck backend — often keeps answering `ServerLive`
//! and `ModelReady` on other threads, so the liveness probe passes. The
//! watchdog looks at requests instead: a worker with requests in flight
//! that answers none of them for the **stall window** is faulted
//! ([`FaultReason::Stall`](crate::FaultReason::Stall)); its callers are
//! answered at once and it is restarted.
//!
//! The window, by default ([`StallWindow::Auto`]), follows the worker's own
//! service times (see [`crate::progress`]): `max(floor, 4 × p99)`, so a
//! model answering in 1 ms is caught after the floor (5 s by default) and
//! a 30 s generation gets 2 minutes. Until the worker has answered
//! [`MIN_SAMPLES`](crate::progress::MIN_SAMPLES) requests the window is
//! [`COLD_WINDOW`] (or the floor if larger). It can be pinned
//! ([`StallWindow::Fixed`]) or turned off per worker.

use std::time::Duration;

use crate::progress::Progress;

/// `Auto`'s window is this many times the 99th-percentile service time.
pub const AUTO_MULTIPLIER: u32 = 4;

/// `Auto`'s smallest window, by default.
pub const DEFAULT_FLOOR: Duration = Duration::from_secs(5);

/// `Auto`'s window before there are enough service times to go by.
pub const COLD_WINDOW: Duration = Duration::from_secs(60);

/// How long a worker may hold requests without answering any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallWindow {
    /// No watchdog.
    Off,
    /// This window, whatever the service times.
    Fixed(Duration),
    /// `max(floor, 4 × p99 service time)`; `max(floor, 60 s)` until known.
    Auto {
        /// The smallest window.
        floor: Duration,
    },
}

impl Default for StallWindow {
    fn default() -> Self {
        StallWindow::Auto {
            floor: DEFAULT_FLOOR,
        }
    }
}

impl StallWindow {
    /// The window for a worker whose 99th-percentile service time is
    /// `p99` (`None`: not known yet); `None` when the watchdog is off.
    pub fn window(&self, p99: Option<Duration>) -> Option<Duration> {
        match *self {
            StallWindow::Off => None,
            StallWindow::Fixed(window) => Some(window),
            StallWindow::Auto { floor } => Some(floor.max(match p99 {
                Some(p99) => p99.saturating_mul(AUTO_MULTIPLIER),
                None => COLD_WINDOW,
            })),
        }
    }

    /// Whether `progress` is a stall; if so, why, for the fault's detail.
    pub fn verdict(&self, progress: &Progress) -> Option<String> {
        let window = self.window(progress.service_p99)?;
        if progress.in_flight == 0 || progress.waiting < window {
            return None;
        }
        let basis = match (self, progress.service_p99) {
            (StallWindow::Auto { floor }, Some(p99)) => {
                format!("max(floor {floor:?}, {AUTO_MULTIPLIER} × p99 service time {p99:?})")
            }
            (StallWindow::Auto { floor }, None) => {
                format!("max(floor {floor:?}, {COLD_WINDOW:?} until service times are known)")
            }
            _ => "configured".to_string(),
        };
        Some(format!(
            "{} request(s) in flight and none answered for {:?} (stall window {window:?}: {basis})",
            progress.in_flight, progress.waiting
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn progress(in_flight: usize, waiting: Duration, p99: Option<Duration>) -> Progress {
        Progress {
            in_flight,
            waiting,
            service_p99: p99,
        }
    }

    #[test]
    fn a_fast_model_gets_the_floor_and_a_slow_one_a_multiple_of_its_service_time() {
        let auto = StallWindow::default();
        assert_eq!(auto.window(Some(ms(1))), Some(DEFAULT_FLOOR));
        assert!(
            DEFAULT_FLOOR < Duration::from_secs(10),
            "issue 25: caught within 10 s"
        );
        let generation = Duration::from_secs(30);
        assert_eq!(auto.window(Some(generation)), Some(generation * 4));
        assert_eq!(auto.window(None), Some(COLD_WINDOW));
        assert!(
            COLD_WINDOW > generation,
            "a first 30 s generation is not a stall"
        );
        let high_floor = StallWindow::Auto {
            floor: Duration::from_secs(300),
        };
        assert_eq!(high_floor.window(None), Some(Duration::from_secs(300)));
        assert_eq!(
            StallWindow::Fixed(ms(700)).window(Some(ms(1))),
            Some(ms(700))
        );
        assert_eq!(StallWindow::Off.window(Some(ms(1))), None);
    }

    #[test]
    fn a_stall_needs_requests_in_flight_for_the_whole_window() {
        let auto = StallWindow::default();
        let p99 = Some(ms(1));
        assert_eq!(
            auto.verdict(&progress(0, Duration::from_secs(600), p99)),
            None
        );
        assert_eq!(auto.verdict(&progress(3, ms(4999), p99)), None);
        let why = auto.verdict(&progress(3, ms(5000), p99)).unwrap();
        assert!(
            why.starts_with("3 request(s) in flight and none answered for 5s"),
            "{why}"
        );
        assert!(why.contains("p99 service time 1ms"), "{why}");
        assert_eq!(
            StallWindow::Off.verdict(&progress(3, Duration::MAX, p99)),
            None
        );
    }
}
