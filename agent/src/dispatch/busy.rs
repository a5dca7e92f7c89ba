//! Busy ratio over a sliding window: the share of the last 10 s during which
//! the agent had at least one request in flight. Sans-IO: callers pass `now`.

use std::time::{Duration, Instant};

/// Length of the window the ratio is computed over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Resolution of the window: busy time is summed per bucket of this length.
pub const BUCKET: Duration = Duration::from_millis(100);
const BUCKETS: usize = (WINDOW.as_millis() / BUCKET.as_millis()) as usize;

/// Amounts summed per [`BUCKET`] over the last [`WINDOW`], in a ring of
/// 100 buckets with a running total: O(1) per addition and per question,
/// whatever the rate. Shared by [`BusyWindow`] (busy time) and
/// [`RateWindow`] (completions).
#[derive(Debug)]
struct Buckets<T> {
    /// `(bucket index since origin, amount in it)`.
    slots: [(u64, T); BUCKETS],
    /// Sum of the slots within the window ending at bucket `as_of`.
    total: T,
    as_of: u64,
}

impl<T> Default for Buckets<T>
where
    T: Copy + Default,
{
    fn default() -> Self {
        Self {
            slots: [(u64::MAX, T::default()); BUCKETS],
            total: T::default(),
            as_of: 0,
        }
    }
}

impl<T> Buckets<T>
where
    T: Copy + Default + PartialOrd + std::ops::AddAssign + std::ops::Sub<Output = T>,
{
    /// Moves the window's end to bucket `to`: buckets that fall out of it
    /// (indices at or below `to - BUCKETS`) leave the total.
    fn advance(&mut self, to: u64) {
        if to <= self.as_of {
            return;
        }
        let n = BUCKETS as u64;
        if to - self.as_of >= n {
            self.total = T::default();
        } else {
            // Leaving: (as_of - n, to - n].
            for leaving in (self.as_of + 1)..=to {
                let Some(index) = leaving.checked_sub(n) else {
                    continue;
                };
                let slot = &self.slots[(index % n) as usize];
                if slot.0 == index {
                    // Saturating: the total never goes below zero.
                    self.total = if self.total >= slot.1 {
                        self.total - slot.1
                    } else {
                        T::default()
                    };
                }
            }
        }
        self.as_of = to;
    }

    /// Whether bucket `index` is within the window ending at `as_of`.
    fn in_window(&self, index: u64) -> bool {
        index <= self.as_of && self.as_of - index < BUCKETS as u64
    }

    /// Adds `amount` to bucket `index`, if it is within the window.
    fn add(&mut self, index: u64, amount: T) {
        if !self.in_window(index) {
            return;
        }
        let slot = &mut self.slots[(index % BUCKETS as u64) as usize];
        if slot.0 != index {
            *slot = (index, T::default());
        }
        slot.1 += amount;
        self.total += amount;
    }
}

/// Tracks busy periods and answers the busy ratio over [`WINDOW`].
///
/// Busy time is accumulated into a ring of 100 buckets of 100 ms, so every
/// call is O(1) in the request rate (a list of busy intervals would grow to
/// one entry per request at low concurrency). The window edge is therefore
/// accurate to one bucket (1% of the window). The sum over the window is
/// kept up to date as buckets are added and age out, so the ratio (asked
/// for on every response) costs O(1) too.
#[derive(Debug, Default)]
pub struct BusyWindow {
    origin: Option<Instant>,
    open_since: Option<Instant>,
    busy: Buckets<Duration>,
}

impl BusyWindow {
    /// Work began (in-flight went from 0 to 1).
    pub fn start(&mut self, now: Instant) {
        self.origin.get_or_insert(now);
        if self.open_since.is_none() {
            self.open_since = Some(now);
        }
    }

    /// Work ended (in-flight went back to 0).
    pub fn stop(&mut self, now: Instant) {
        if let Some(start) = self.open_since.take() {
            self.add(start, now);
        }
    }

    /// The share of `[now - WINDOW, now]` spent busy, in `[0, 1]`.
    pub fn ratio(&mut self, now: Instant) -> f64 {
        let Some(origin) = self.origin else {
            return 0.0;
        };
        self.busy.advance(bucket_index(origin, now));
        let mut busy = self.busy.total;
        if let Some(start) = self.open_since {
            let from = now.checked_sub(WINDOW).map_or(start, |f| start.max(f));
            busy += now.saturating_duration_since(from);
        }
        (busy.as_secs_f64() / WINDOW.as_secs_f64()).clamp(0.0, 1.0)
    }

    /// Adds the busy interval `[from, to)` to the buckets it covers.
    fn add(&mut self, from: Instant, to: Instant) {
        let origin = *self.origin.get_or_insert(from);
        self.busy.advance(bucket_index(origin, to));
        let mut t = to.checked_sub(WINDOW).map_or(from, |edge| from.max(edge));
        while t < to {
            let i = bucket_index(origin, t);
            let bucket_end = origin + BUCKET * (i as u32 + 1);
            let end = bucket_end.min(to);
            self.busy.add(i, end.saturating_duration_since(t));
            t = end;
        }
    }
}

/// Requests completed over the last [`WINDOW`], in the same 100 ms buckets
/// as [`BusyWindow`]: O(1) per completion and per question.
#[derive(Debug, Default)]
pub struct RateWindow {
    origin: Option<Instant>,
    completions: Buckets<u64>,
}

impl RateWindow {
    /// One request completed at `now`.
    pub fn record(&mut self, now: Instant) {
        let origin = *self.origin.get_or_insert(now);
        let i = bucket_index(origin, now);
        self.completions.advance(i);
        self.completions.add(i, 1);
    }

    /// Completions per second over the window (over the time since the
    /// first completion while that is shorter, but at least one second).
    pub fn per_second(&mut self, now: Instant) -> f64 {
        let Some(origin) = self.origin else {
            return 0.0;
        };
        self.completions.advance(bucket_index(origin, now));
        let span = now
            .saturating_duration_since(origin)
            .clamp(Duration::from_secs(1), WINDOW);
        self.completions.total as f64 / span.as_secs_f64()
    }
}

fn bucket_index(origin: Instant, t: Instant) -> u64 {
    (t.saturating_duration_since(origin).as_nanos() / BUCKET.as_nanos()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_short_requests_cost_constant_space() {
        let t0 = Instant::now();
        let mut w = BusyWindow::default();
        let mut t = t0;
        for _ in 0..100_000 {
            w.start(t);
            t += Duration::from_micros(50);
            w.stop(t);
            t += Duration::from_micros(50);
        }
        // Busy half the time over the last 10 s.
        assert!((w.ratio(t) - 0.5).abs() < 0.011, "{}", w.ratio(t));
    }

    #[test]
    fn the_running_total_equals_a_fresh_sum() {
        // Irregular busy spells over a minute, checked against a sum
        // recomputed from the buckets after every step.
        let t0 = Instant::now();
        let mut w = BusyWindow::default();
        let mut t = t0;
        let mut seed = 1u64;
        for _ in 0..5_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let busy = Duration::from_micros(seed % 40_000);
            let idle = Duration::from_micros((seed >> 20) % 30_000);
            w.start(t);
            t += busy;
            w.stop(t);
            t += idle;
            let ratio = w.ratio(t);
            let fresh: Duration = w
                .busy
                .slots
                .iter()
                .filter(|(i, _)| w.busy.in_window(*i))
                .map(|(_, d)| *d)
                .sum();
            assert_eq!(w.busy.total, fresh);
            assert!((0.0..=1.0).contains(&ratio));
        }
    }

    #[test]
    fn the_rate_counts_the_last_ten_seconds() {
        let t0 = Instant::now();
        let mut r = RateWindow::default();
        assert_eq!(r.per_second(t0), 0.0);
        // 100 completions a second for 30 s.
        for i in 0..3_000u32 {
            r.record(t0 + Duration::from_millis(10) * i);
        }
        let at = t0 + Duration::from_secs(30);
        assert!(
            (r.per_second(at) - 100.0).abs() < 1.5,
            "{}",
            r.per_second(at)
        );
        // Nothing for 20 s more: nothing in the window.
        assert_eq!(r.per_second(at + Duration::from_secs(20)), 0.0);
        // Early on the rate is over the time so far.
        let mut early = RateWindow::default();
        for i in 0..20u32 {
            early.record(t0 + Duration::from_millis(100) * i);
        }
        assert!((early.per_second(t0 + Duration::from_secs(2)) - 10.0).abs() < 0.01);
    }

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
        assert!((w.ratio(t0 + s(14)) - 0.1).abs() < 0.011);
        // Window at t0+13 is [3, 13]: busy 3..4 and 12..13 (to one bucket).
        let mut w2 = BusyWindow::default();
        w2.start(t0);
        w2.stop(t0 + s(4));
        w2.start(t0 + s(12));
        w2.stop(t0 + s(13));
        assert!((w2.ratio(t0 + s(13)) - 0.2).abs() < 0.011);
    }
}
