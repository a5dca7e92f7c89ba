//! The one reconnect loop shape of the agent's publisher and the client's
//! discovery.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use infermesh_backoff::{Backoff, BackoffPolicy};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Reconnects to ZooKeeper: 200 ms doubling to 5 s, equal jitter.
pub const RECONNECT: BackoffPolicy =
    BackoffPolicy::new(Duration::from_millis(200), Duration::from_secs(5));

/// A streak of ZooKeeper failures and the wait each one earns.
///
/// The first failure after a healthy session is retried at once (a session
/// that expired or a server that restarted is usually back); each further
/// failure waits [`RECONNECT`]'s next delay, until [`Reconnect::succeeded`].
#[derive(Debug)]
pub struct Reconnect {
    backoff: Backoff,
    rng: SmallRng,
    healthy: bool,
}

impl Reconnect {
    /// A streak with `policy`, jitter seeded from the clock.
    pub fn new(policy: BackoffPolicy) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self::seeded(policy, nanos ^ u64::from(std::process::id()))
    }

    /// A streak with `policy` and a fixed seed (tests).
    pub fn seeded(policy: BackoffPolicy, seed: u64) -> Self {
        Reconnect {
            backoff: Backoff::new(policy),
            rng: SmallRng::seed_from_u64(seed),
            healthy: true,
        }
    }

    /// Counts a failure; returns how long to wait before trying again.
    pub fn failed(&mut self) -> Duration {
        if std::mem::take(&mut self.healthy) {
            Duration::ZERO
        } else {
            self.backoff.next_delay(&mut self.rng)
        }
    }

    /// The session reached its steady state: the streak is over.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
        self.healthy = true;
    }

    /// Failures that waited since the last success.
    pub fn attempts(&self) -> u32 {
        self.backoff.attempts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failure_after_success_is_immediate_then_backs_off() {
        let mut r = Reconnect::seeded(RECONNECT.without_jitter(), 1);
        let ms = |d: Duration| d.as_millis() as u64;
        let got: Vec<u64> = (0..8).map(|_| ms(r.failed())).collect();
        assert_eq!(got, [0, 200, 400, 800, 1600, 3200, 5000, 5000]);
        r.succeeded();
        assert_eq!(r.failed(), Duration::ZERO);
        assert_eq!(r.failed(), Duration::from_millis(200));
    }

    #[test]
    fn jittered_delays_stay_within_policy() {
        let mut r = Reconnect::seeded(RECONNECT, 9);
        r.failed();
        for n in 1..20 {
            let d = r.failed();
            assert!(d >= RECONNECT.nominal(n) / 2 && d <= RECONNECT.nominal(n));
        }
    }
}
