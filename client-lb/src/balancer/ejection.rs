//! Outlier ejection: a node that keeps failing is taken out of rotation for a
//! while, longer each time it does it again.
//!
//! After `eject_after` consecutive failures (a success resets the count) the
//! node is ejected. The n-th ejection of a bad spell lasts
//! `min(eject_max, eject_base * 2^(n-1))` nominally, drawn uniformly from
//! `[nominal / 2, nominal]` ("equal jitter",
//! <https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/>)
//! so that clients that ejected a node together do not all return to it at
//! the same instant. The spell ends, and the next ejection is short again,
//! with the first success once the node has been back for `eject_max`. This is
//! Envoy's consecutive-failure outlier detection with exponential rather than
//! linear backoff. The cap on the ejected share is enforced by the
//! [`Balancer`](super::Balancer), which sees all nodes.

use std::time::{Duration, Instant};

use infermesh_backoff::BackoffPolicy;
use rand::rngs::SmallRng;

/// The failure streak and ejection history of one node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ejection {
    /// Consecutive failures since the last success or ejection.
    streak: u32,
    /// Ejections in the current bad spell.
    spell: u32,
    /// End of the latest ejection of the spell, past or future.
    until: Option<Instant>,
}

impl Ejection {
    /// Whether the node is out of rotation at `now`.
    pub(crate) fn is_ejected(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Records a success: the streak is over, and so is the bad spell if the
    /// node has been back for `forgive_after`.
    pub(crate) fn on_success(&mut self, now: Instant, forgive_after: Duration) {
        self.streak = 0;
        let Some(until) = self.until else { return };
        if until
            .checked_add(forgive_after)
            .is_some_and(|forgiven| now >= forgiven)
        {
            self.spell = 0;
            self.until = None;
        }
    }

    /// Records a failure. Returns whether the streak has reached `threshold`
    /// (zero counts as one), i.e. the node should now be ejected. Failures of
    /// requests that were in flight when the node was ejected do not count:
    /// they say nothing new.
    pub(crate) fn on_failure(&mut self, now: Instant, threshold: u32) -> bool {
        if self.is_ejected(now) {
            return false;
        }
        self.streak = self.streak.saturating_add(1);
        self.streak >= threshold.max(1)
    }

    /// Ejects the node at `now`; returns when it comes back.
    pub(crate) fn eject(
        &mut self,
        now: Instant,
        base: Duration,
        max: Duration,
        rng: &mut SmallRng,
    ) -> Instant {
        self.spell = self.spell.saturating_add(1);
        self.streak = 0;
        let length = BackoffPolicy::new(base, max).delay(self.spell, rng);
        // Only absurd configured lengths overflow `Instant`; fall back to
        // the cap rather than panicking.
        let until = now
            .checked_add(length)
            .or_else(|| now.checked_add(max))
            .unwrap_or(now);
        self.until = Some(until);
        until
    }

    /// Ejections in the current bad spell.
    #[cfg(test)]
    pub(crate) fn spell(&self) -> u32 {
        self.spell
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    const SEC: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn ejects_after_the_threshold_of_consecutive_failures() {
        let t0 = Instant::now();
        let mut e = Ejection::default();
        for _ in 0..4 {
            assert!(!e.on_failure(t0, 5));
        }
        assert!(e.on_failure(t0, 5));
    }

    #[test]
    fn a_success_resets_the_streak() {
        let t0 = Instant::now();
        let mut e = Ejection::default();
        for _ in 0..4 {
            e.on_failure(t0, 5);
        }
        e.on_success(t0, MAX);
        for _ in 0..4 {
            assert!(!e.on_failure(t0, 5));
        }
    }

    #[test]
    fn lengths_double_with_jitter_up_to_the_cap() {
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut e = Ejection::default();
        let mut now = t0;
        for secs in [1, 2, 4, 8, 16, 32, 60, 60] {
            let nominal = secs * SEC;
            let until = e.eject(now, SEC, MAX, &mut rng);
            let length = until - now;
            assert!(length >= nominal / 2 && length <= nominal, "{length:?}");
            assert!(e.is_ejected(until - Duration::from_nanos(1)));
            assert!(!e.is_ejected(until));
            // Back, and failing again before the spell is forgiven.
            now = until;
            e.on_success(now, MAX);
        }
        assert_eq!(e.spell(), 8);
    }

    #[test]
    fn failures_while_ejected_do_not_count() {
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(2);
        let mut e = Ejection::default();
        let until = e.eject(t0, SEC, MAX, &mut rng);
        for _ in 0..10 {
            assert!(!e.on_failure(t0, 1));
        }
        assert!(e.on_failure(until, 1));
    }

    #[test]
    fn a_success_long_after_returning_ends_the_spell() {
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(3);
        let mut e = Ejection::default();
        let mut until = e.eject(t0, SEC, MAX, &mut rng);
        until = e.eject(until, SEC, MAX, &mut rng);
        e.on_success(until + MAX, MAX);
        assert_eq!(e.spell(), 0);
        let next = e.eject(until + MAX, SEC, MAX, &mut rng);
        assert!(next - (until + MAX) <= SEC);
    }

    #[test]
    fn zero_threshold_behaves_like_one() {
        let mut e = Ejection::default();
        assert!(e.on_failure(Instant::now(), 0));
    }

    #[test]
    fn huge_spells_stay_at_the_cap() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut e = Ejection::default();
        let mut now = Instant::now();
        for _ in 0..1000 {
            let until = e.eject(now, SEC, MAX, &mut rng);
            assert!(until - now <= MAX);
            now = until;
        }
    }
}
