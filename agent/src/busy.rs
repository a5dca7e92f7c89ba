//! Busy ratio over a sliding window: the share of the last 10 s during which
//! the agent had at least one request in flight. Sans-IO: callers pass `now`.

use std::time::{Duration, Instant};

/// Length of the window the ratio is computed over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Tracks busy periods and answers the busy ratio over [`WINDOW`].
///
/// Closed busy periods are kept as `(start, end)` intervals and pruned once
/// they leave the window; under steady load there is one open period, so the
/// list stays short.
#[derive(Debug, Default)]
pub struct BusyWindow {
    open_since: Option<Instant>,
    closed: Vec<(Instant, Instant)>,
}

impl BusyWindow {
    /// Work began (in-flight went from 0 to 1).
    pub fn start(&mut self, now: Instant) {
        if self.open_since.is_none() {
            self.open_since = Some(now);
        }
    }

    /// Work ended (in-flight went back to 0).
    pub fn stop(&mut self, now: Instant) {
        if let Some(start) = self.open_since.take() {
            self.closed.push((start, now));
            self.prune(now);
        }
    }

    /// The share of `[now - WINDOW, now]` spent busy, in `[0, 1]`.
    pub fn ratio(&mut self, now: Instant) -> f64 {
        self.prune(now);
        let from = now.checked_sub(WINDOW);
        let clip = |t: Instant| from.map_or(t, |f| t.max(f));
        let mut busy: Duration = self
            .closed
            .iter()
            .map(|&(s, e)| e.saturating_duration_since(clip(s)))
            .sum();
        if let Some(s) = self.open_since {
            busy += now.saturating_duration_since(clip(s));
        }
        (busy.as_secs_f64() / WINDOW.as_secs_f64()).clamp(0.0, 1.0)
    }

    fn prune(&mut self, now: Instant) {
        if let Some(from) = now.checked_sub(WINDOW) {
            self.closed.retain(|&(_, end)| end > from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_zero_and_always_busy_is_one() {
        let t0 = Instant::now();
        let mut w = BusyWindow::default();
        assert_eq!(w.ratio(t0 + WINDOW), 0.0);
        w.start(t0);
        assert_eq!(w.ratio(t0 + WINDOW * 3), 1.0);
    }

    #[test]
    fn counts_only_the_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = BusyWindow::default();
        w.start(t0);
        w.stop(t0 + s(4));
        w.start(t0 + s(12));
        w.stop(t0 + s(13));
        // Window at t0+14 is [4, 14]: busy 12..13 only.
        assert!((w.ratio(t0 + s(14)) - 0.1).abs() < 1e-9);
        // Window at t0+13 is [3, 13]: busy 3..4 and 12..13.
        let mut w2 = BusyWindow::default();
        w2.start(t0);
        w2.stop(t0 + s(4));
        w2.start(t0 + s(12));
        w2.stop(t0 + s(13));
        assert!((w2.ratio(t0 + s(13)) - 0.2).abs() < 1e-9);
    }
}
