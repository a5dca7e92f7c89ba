//! A retry budget (as in Finagle and linkerd): retries may add at most
//! `ratio` of the request rate plus `min_per_sec`, so a failing fleet is not
//! hit with a retry storm. Sans-IO: callers pass `now`.

use std::time::Instant;

/// Token bucket of retries.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    min_per_sec: f64,
    balance: f64,
    cap: f64,
    last: Option<Instant>,
}

impl RetryBudget {
    /// Each request earns `ratio` retries; `min_per_sec` more accrue per
    /// second; unused retries accumulate up to `cap`.
    pub fn new(ratio: f64, min_per_sec: f64) -> Self {
        let cap = (min_per_sec * 10.0).max(10.0);
        RetryBudget {
            ratio: ratio.max(0.0),
            min_per_sec: min_per_sec.max(0.0),
            balance: cap,
            cap,
            last: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let secs = now.saturating_duration_since(last).as_secs_f64();
            self.balance = (self.balance + secs * self.min_per_sec).min(self.cap);
        }
        self.last = Some(now);
    }

    /// A request was sent.
    pub fn on_request(&mut self, now: Instant) {
        self.refill(now);
        self.balance = (self.balance + self.ratio).min(self.cap);
    }

    /// Takes one retry if the budget allows it.
    pub fn try_retry(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.balance >= 1.0 {
            self.balance -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Default for RetryBudget {
    /// 20% of requests plus 10 per second.
    fn default() -> Self {
        RetryBudget::new(0.2, 10.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_are_bounded_by_the_request_rate() {
        let t0 = Instant::now();
        let mut b = RetryBudget::new(0.2, 0.0);
        // Spend the initial allowance.
        while b.try_retry(t0) {}
        let mut granted = 0;
        for _ in 0..1000 {
            b.on_request(t0);
            if b.try_retry(t0) {
                granted += 1;
            }
        }
        assert!((199..=201).contains(&granted), "{granted}");
    }

    #[test]
    fn minimum_rate_refills_over_time() {
        let t0 = Instant::now();
        let mut b = RetryBudget::new(0.0, 10.0);
        while b.try_retry(t0) {}
        assert!(!b.try_retry(t0));
        assert!(b.try_retry(t0 + Duration::from_millis(150)));
        assert!(!b.try_retry(t0 + Duration::from_millis(150)));
    }
}
