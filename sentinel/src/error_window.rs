//! Sliding-window count of internal request errors.
//!
//! A single 500 is a bad request; a burst of them in a short time while the
//! process still answers probes is the signature of a poisoned CUDA context
//! whose error message did not reach the log (or was not recognised).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Times of the recent errors, oldest first; holds fewer than `burst` entries.
#[derive(Debug, Clone)]
pub(crate) struct ErrorWindow {
    times: VecDeque<Instant>,
    burst: usize,
    window: Duration,
}

impl ErrorWindow {
    pub(crate) fn new(burst: u32, window: Duration) -> Self {
        let burst = usize::try_from(burst.max(1)).unwrap_or(usize::MAX);
        Self {
            times: VecDeque::new(),
            burst,
            window,
        }
    }

    /// Records an error at `now`; true when it completes a burst, i.e. `burst`
    /// errors happened less than `window` apart. The window is then emptied so
    /// that one burst is one fault.
    pub(crate) fn record(&mut self, now: Instant) -> bool {
        while let Some(&oldest) = self.times.front() {
            if now.saturating_duration_since(oldest) >= self.window {
                self.times.pop_front();
            } else {
                break;
            }
        }
        self.times.push_back(now);
        if self.times.len() >= self.burst {
            self.times.clear();
            return true;
        }
        false
    }

    /// Forgets all errors (a new process starts with a clean slate).
    pub(crate) fn clear(&mut self) {
        self.times.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn burst_within_window_fires() {
        let t0 = Instant::now();
        let mut w = ErrorWindow::new(3, Duration::from_secs(1));
        assert!(!w.record(at(t0, 0)));
        assert!(!w.record(at(t0, 400)));
        assert!(w.record(at(t0, 800)));
        // Emptied: the next error starts a new count.
        assert!(!w.record(at(t0, 900)));
    }

    #[test]
    fn window_slides() {
        let t0 = Instant::now();
        let mut w = ErrorWindow::new(3, Duration::from_secs(1));
        assert!(!w.record(at(t0, 0)));
        assert!(!w.record(at(t0, 600)));
        // The error at 0 is exactly one window old: it no longer counts.
        assert!(!w.record(at(t0, 1000)));
        // 600 and 1000 are still inside the window ending at 1500.
        assert!(w.record(at(t0, 1500)));
    }

    #[test]
    fn spread_out_errors_never_fire() {
        let t0 = Instant::now();
        let mut w = ErrorWindow::new(2, Duration::from_secs(1));
        for i in 0..100 {
            assert!(!w.record(at(t0, i * 1000)));
        }
    }

    #[test]
    fn zero_burst_behaves_like_one() {
        let t0 = Instant::now();
        let mut w = ErrorWindow::new(0, Duration::from_secs(1));
        assert!(w.record(t0));
    }
}
