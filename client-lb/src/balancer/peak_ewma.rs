//! Peak-EWMA: a latency estimate that rises at once and forgets slowly.
//!
//! The algorithm is Finagle's `PeakEwma` load metric (Twitter, "Finagle:
//! power of two choices with peak EWMA",
//! <https://twitter.github.io/finagle/guide/Clients.html#power-of-two-choices-p2c-peak-ewma>),
//! as also used by linkerd and `tower::load::PeakEwma`:
//!
//! - a sample above the current estimate replaces it (the "peak"), so a node
//!   that turns slow is penalised by its very first slow response;
//! - a sample below it is blended in as an exponentially weighted moving
//!   average whose weight depends on the time since the previous sample:
//!   `estimate = estimate * w + sample * (1 - w)`, `w = exp(-elapsed / tau)`;
//! - between samples the estimate decays toward zero with the same time
//!   constant (Finagle and tower do this by observing a zero sample on every
//!   read; here reads are pure and compute the decay instead). Without it a
//!   node shunned after one slow spell would never be picked again to prove
//!   it has recovered: its estimate only changes when a response arrives.
//!
//! Estimates are in seconds.

use std::time::{Duration, Instant};

/// Estimates below this (one nanosecond) are rounded up, so that a long-idle
/// node's cost still grows with its in-flight count.
const FLOOR_SECS: f64 = 1e-9;

/// A peak-EWMA latency estimate.
#[derive(Debug, Clone)]
pub(crate) struct PeakEwma {
    /// Seconds, as of `stamp`.
    estimate: f64,
    /// When `estimate` was last updated.
    stamp: Instant,
    /// The time constant, in seconds.
    tau: f64,
}

impl PeakEwma {
    /// An estimate of `initial` at `now`, decaying with time constant `decay`.
    pub(crate) fn new(now: Instant, initial: Duration, decay: Duration) -> Self {
        Self {
            estimate: initial.as_secs_f64(),
            stamp: now,
            tau: decay.as_secs_f64(),
        }
    }

    /// Takes in a latency sample observed at `now`.
    pub(crate) fn observe(&mut self, now: Instant, sample: Duration) {
        let sample = sample.as_secs_f64();
        if sample > self.estimate {
            self.estimate = sample;
        } else {
            let w = self.weight(now);
            self.estimate = self.estimate * w + sample * (1.0 - w);
        }
        // A sample stamped before the last one (events delivered out of
        // order) must not move the clock back.
        self.stamp = self.stamp.max(now);
    }

    /// The estimate at `now`, in seconds: the last one decayed toward zero for
    /// the time since it was made.
    pub(crate) fn get(&self, now: Instant) -> f64 {
        (self.estimate * self.weight(now)).max(FLOOR_SECS)
    }

    /// `exp(-elapsed / tau)`: how much of the old estimate still counts.
    fn weight(&self, now: Instant) -> f64 {
        if self.tau <= 0.0 {
            return 0.0;
        }
        let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
        (-elapsed / self.tau).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const TAU: Duration = Duration::from_secs(10);

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn starts_at_the_initial_estimate() {
        let t0 = Instant::now();
        let e = PeakEwma::new(t0, 5 * MS, TAU);
        assert!(close(e.get(t0), 0.005));
    }

    #[test]
    fn jumps_to_a_higher_sample_at_once() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0, 5 * MS, TAU);
        e.observe(t0 + MS, 80 * MS);
        assert!(close(e.get(t0 + MS), 0.080));
    }

    #[test]
    fn lower_samples_blend_in_by_elapsed_time() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0, 100 * MS, TAU);
        // One time constant later the old estimate weighs e^-1.
        e.observe(t0 + TAU, 10 * MS);
        let w = (-1.0f64).exp();
        assert!(close(e.get(t0 + TAU), 0.100 * w + 0.010 * (1.0 - w)));

        // A burst of samples close together barely moves the estimate.
        let before = e.get(t0 + TAU);
        e.observe(t0 + TAU + MS, 10 * MS);
        assert!(before - e.get(t0 + TAU + MS) < 0.0001);
    }

    #[test]
    fn decays_toward_zero_without_samples() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0, 5 * MS, TAU);
        e.observe(t0, 50 * MS);
        let later = e.get(t0 + 3 * TAU);
        assert!(close(later, 0.050 * (-3.0f64).exp()));
        // Reads do not change the estimate.
        assert!(close(e.get(t0), 0.050));
        // It never reaches zero, so load still counts.
        assert!(e.get(t0 + 100_000 * TAU) > 0.0);
    }

    #[test]
    fn zero_time_constant_keeps_only_the_latest_sample() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(t0, 5 * MS, Duration::ZERO);
        e.observe(t0, 50 * MS);
        e.observe(t0 + MS, 3 * MS);
        assert!(close(e.estimate, 0.003));
    }

    #[test]
    fn out_of_order_samples_do_not_move_the_clock_back() {
        let t0 = Instant::now() + TAU;
        let mut e = PeakEwma::new(t0, 5 * MS, TAU);
        e.observe(t0 - TAU, MS);
        assert_eq!(e.stamp, t0);
        assert!(close(e.estimate, 0.005));
    }
}
