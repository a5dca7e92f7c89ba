//! Crash-loop backoff: how long to wait before the next spawn.
//!
//! The first restart of a crash loop is immediate, because most faults are
//! one-off (a bad request, a transient Xid) and every second down is lost
//! capacity. If the worker keeps failing before it has been stable for the
//! stable period, the nominal delay doubles from `base` up to `cap`
//! (`base * 2^(n-1)` for the n-th consecutive delayed restart), and the actual
//! delay is drawn uniformly from `[nominal / 2, nominal]` ("equal jitter", see
//! <https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/>)
//! so that workers that crashed together — say, on a shared NCCL failure — do
//! not restart in lockstep and crash together again.

use std::time::Duration;

use infermesh_backoff::{Backoff as Streak, BackoffPolicy};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Crash-loop counter and the jitter source.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    /// Delayed restarts of this loop (the first, immediate one not counted).
    streak: Streak,
    /// Restarts since the worker was last stable.
    consecutive: u32,
    rng: SmallRng,
}

impl Backoff {
    pub(crate) fn new(base: Duration, cap: Duration, seed: u64) -> Self {
        Self {
            streak: Streak::new(BackoffPolicy::new(base, cap)),
            consecutive: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The delay before the next spawn, advancing the crash-loop counter
    /// unless the restart was `requested` by an operator: a deliberate restart
    /// says nothing about the worker crashing, so it neither waits nor counts.
    pub(crate) fn next_delay(&mut self, requested: bool) -> Duration {
        if requested {
            return Duration::ZERO;
        }
        let n = self.consecutive;
        self.consecutive = self.consecutive.saturating_add(1);
        if n == 0 {
            return Duration::ZERO;
        }
        self.streak.next_delay(&mut self.rng)
    }

    /// Forgets the crash loop: the worker has been stable.
    pub(crate) fn reset(&mut self) {
        self.consecutive = 0;
        self.streak.reset();
    }

    /// Restarts counted since the worker was last stable.
    #[cfg(test)]
    pub(crate) fn consecutive(&self) -> u32 {
        self.consecutive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(60);

    #[test]
    fn first_restart_is_immediate_then_doubles_to_the_cap() {
        let mut b = Backoff::new(BASE, CAP, 7);
        assert_eq!(b.next_delay(false), Duration::ZERO);
        let nominal_secs = [1, 2, 4, 8, 16, 32, 60, 60, 60];
        for secs in nominal_secs {
            let nominal = Duration::from_secs(secs);
            let d = b.next_delay(false);
            assert!(
                d >= nominal / 2 && d <= nominal,
                "{d:?} for nominal {nominal:?}"
            );
        }
        assert_eq!(b.consecutive(), 10);
    }

    #[test]
    fn jitter_stays_within_half_and_full_and_varies() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..200 {
            let mut b = Backoff::new(BASE, CAP, seed);
            b.next_delay(false);
            b.next_delay(false);
            let d = b.next_delay(false); // nominal 2s
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
                "{d:?}"
            );
            seen.insert(d);
        }
        assert!(seen.len() > 100, "jitter should spread restarts out");
    }

    #[test]
    fn same_seed_same_delays() {
        let delays = |seed| {
            let mut b = Backoff::new(BASE, CAP, seed);
            (0..8).map(|_| b.next_delay(false)).collect::<Vec<_>>()
        };
        assert_eq!(delays(42), delays(42));
        assert_ne!(delays(42), delays(43));
    }

    #[test]
    fn requested_restarts_neither_wait_nor_count() {
        let mut b = Backoff::new(BASE, CAP, 1);
        b.next_delay(false);
        b.next_delay(false);
        assert_eq!(b.next_delay(true), Duration::ZERO);
        assert_eq!(b.consecutive(), 2);
    }

    #[test]
    fn reset_starts_a_new_loop() {
        let mut b = Backoff::new(BASE, CAP, 1);
        for _ in 0..5 {
            b.next_delay(false);
        }
        b.reset();
        assert_eq!(b.next_delay(false), Duration::ZERO);
        assert!(b.next_delay(false) <= BASE);
    }

    #[test]
    fn very_long_loops_stay_at_the_cap() {
        let mut b = Backoff::new(BASE, CAP, 3);
        for _ in 0..100 {
            b.next_delay(false);
        }
        for _ in 0..3 {
            let d = b.next_delay(false);
            assert!(d >= CAP / 2 && d <= CAP);
        }
    }
}
