//! Slow start: a node that joins or comes back gets a growing share of
//! traffic instead of a flood.
//!
//! A fresh node has cold caches, lazily loaded models and no latency samples;
//! P2C would otherwise send it everything it can take until its first slow
//! responses arrive. Its weight is scaled by a factor that ramps linearly from
//! [`MIN_FACTOR`] to 1 over the configured window (as Envoy's
//! `slow_start_config` with aggression 1).

use std::time::{Duration, Instant};

/// The weight factor at the start of the ramp.
pub(crate) const MIN_FACTOR: f64 = 0.1;

/// When a node's current ramp started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowStart {
    since: Instant,
}

impl SlowStart {
    /// A ramp starting at `since`, which may lie in the future (a node
    /// ejected until then starts its ramp when it comes back).
    pub(crate) fn new(since: Instant) -> Self {
        Self { since }
    }

    /// Starts the ramp again at `since`, unless one is already due to start
    /// later (a node that returns from draining while ejected ramps up when
    /// the ejection ends).
    pub(crate) fn restart(&mut self, since: Instant) {
        self.since = self.since.max(since);
    }

    /// The weight factor at `now`, in `[MIN_FACTOR, 1]`.
    pub(crate) fn factor(&self, now: Instant, window: Duration) -> f64 {
        if window.is_zero() {
            return 1.0;
        }
        let elapsed = now.saturating_duration_since(self.since);
        let progress = (elapsed.as_secs_f64() / window.as_secs_f64()).min(1.0);
        MIN_FACTOR + (1.0 - MIN_FACTOR) * progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    #[test]
    fn ramps_linearly_from_a_tenth_to_full() {
        let t0 = Instant::now();
        let s = SlowStart::new(t0);
        assert!((s.factor(t0, WINDOW) - 0.1).abs() < 1e-12);
        assert!((s.factor(t0 + WINDOW / 2, WINDOW) - 0.55).abs() < 1e-12);
        assert_eq!(s.factor(t0 + WINDOW, WINDOW), 1.0);
        assert_eq!(s.factor(t0 + 5 * WINDOW, WINDOW), 1.0);
    }

    #[test]
    fn a_ramp_in_the_future_holds_at_the_minimum() {
        let t0 = Instant::now();
        let s = SlowStart::new(t0 + WINDOW);
        assert_eq!(s.factor(t0, WINDOW), MIN_FACTOR);
    }

    #[test]
    fn restart_begins_again() {
        let t0 = Instant::now();
        let mut s = SlowStart::new(t0);
        s.restart(t0 + 2 * WINDOW);
        assert_eq!(s.factor(t0 + 2 * WINDOW, WINDOW), MIN_FACTOR);
    }

    #[test]
    fn restart_never_moves_a_later_ramp_earlier() {
        let t0 = Instant::now();
        let mut s = SlowStart::new(t0 + WINDOW);
        s.restart(t0);
        assert_eq!(s.factor(t0 + WINDOW, WINDOW), MIN_FACTOR);
    }

    #[test]
    fn zero_window_is_full_weight() {
        let t0 = Instant::now();
        assert_eq!(SlowStart::new(t0).factor(t0, Duration::ZERO), 1.0);
    }
}
