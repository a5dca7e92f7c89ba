//! `infermesh-backoff`: the project's one exponential backoff.
//!
//! Every wait that grows while something keeps failing uses it: the
//! sentinel's crash-loop restarts, the client's outlier ejection, the
//! transport ladder's re-probes of a broken path, and the reconnects to
//! ZooKeeper of the agent's registration and the client's discovery.
//!
//! The n-th delay (n ≥ 1) is nominally `min(cap, base × 2^(n-1))`. With
//! [`Jitter::Equal`] (the default) the actual delay is drawn uniformly from
//! `[nominal / 2, nominal]` — "equal jitter" in
//! <https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/> —
//! so that processes that failed together (workers on one NCCL ring, clients
//! that lost the same node, agents that lost the same ZooKeeper) do not retry
//! in lockstep, while the wait never falls below half the nominal value.
//!
//! Sans-IO: it reads no clock and owns no randomness; callers pass the RNG
//! (seeded in tests and simulations), so every sequence replays exactly.
#![forbid(unsafe_code)]

use std::time::Duration;

use rand::{Rng, RngExt};

/// How the actual delay is spread around the nominal one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the nominal delay (for waits nobody else shares, e.g. one
    /// client's re-probe of one peer's broken path).
    None,
    /// Uniform in `[nominal / 2, nominal]`.
    Equal,
}

/// The shape of a backoff: first delay, cap, jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Nominal first delay.
    pub base: Duration,
    /// Largest nominal delay.
    pub cap: Duration,
    /// Spread of the actual delay.
    pub jitter: Jitter,
}

impl BackoffPolicy {
    /// Doubling from `base` up to `cap`, with equal jitter.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Equal,
        }
    }

    /// The same policy with no jitter.
    pub const fn without_jitter(self) -> Self {
        Self {
            jitter: Jitter::None,
            ..self
        }
    }

    /// The nominal n-th delay, `min(cap, base × 2^(n-1))`, without
    /// overflowing for long streaks; zero for `n == 0`.
    pub fn nominal(&self, n: u32) -> Duration {
        if n == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(n - 1).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The actual n-th delay: the nominal one, jittered.
    pub fn delay<R: Rng + ?Sized>(&self, n: u32, rng: &mut R) -> Duration {
        let nominal = self.nominal(n);
        match self.jitter {
            Jitter::None => nominal,
            Jitter::Equal if nominal.is_zero() => nominal,
            Jitter::Equal => rng.random_range(nominal / 2..=nominal),
        }
    }
}

/// A streak of failures and the delay each one earns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    policy: BackoffPolicy,
    /// Delays handed out since the last reset.
    attempts: u32,
}

impl Backoff {
    /// A backoff with no failures yet.
    pub const fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            attempts: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// Counts one more failure and returns the delay it earns.
    pub fn next_delay<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        self.attempts = self.attempts.saturating_add(1);
        self.policy.delay(self.attempts, rng)
    }

    /// The streak is over (the thing succeeded, or was stable long enough).
    pub fn reset(&mut self) {
        self.attempts = 0;
    }

    /// Delays handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn nominal_doubles_up_to_the_cap_without_overflow() {
        let p = BackoffPolicy::new(SEC, 60 * SEC);
        let got: Vec<u64> = (0..9).map(|n| p.nominal(n).as_secs()).collect();
        assert_eq!(got, [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.nominal(u32::MAX), 60 * SEC);
        let huge = BackoffPolicy::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.nominal(40), Duration::MAX);
    }

    #[test]
    fn equal_jitter_stays_within_half_and_whole_nominal() {
        let p = BackoffPolicy::new(SEC, 60 * SEC);
        let mut rng = SmallRng::seed_from_u64(7);
        for n in 1..20 {
            for _ in 0..50 {
                let d = p.delay(n, &mut rng);
                assert!(d >= p.nominal(n) / 2 && d <= p.nominal(n), "{n}: {d:?}");
            }
        }
    }

    #[test]
    fn without_jitter_is_exactly_nominal() {
        let p = BackoffPolicy::new(30 * SEC, 300 * SEC).without_jitter();
        let mut b = Backoff::new(p);
        let mut rng = SmallRng::seed_from_u64(1);
        let got: Vec<u64> = (0..6).map(|_| b.next_delay(&mut rng).as_secs()).collect();
        assert_eq!(got, [30, 60, 120, 240, 300, 300]);
    }

    #[test]
    fn reset_starts_the_streak_over() {
        let mut b = Backoff::new(BackoffPolicy::new(SEC, 60 * SEC).without_jitter());
        let mut rng = SmallRng::seed_from_u64(1);
        b.next_delay(&mut rng);
        b.next_delay(&mut rng);
        assert_eq!(b.attempts(), 2);
        b.reset();
        assert_eq!(b.next_delay(&mut rng), SEC);
    }

    #[test]
    fn same_seed_same_sequence() {
        let p = BackoffPolicy::new(Duration::from_millis(200), 5 * SEC);
        let run = |seed| {
            let mut b = Backoff::new(p);
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..10).map(|_| b.next_delay(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
    }
}
