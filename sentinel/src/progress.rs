//! How far a worker has got with the requests it was given: the input of
//! the stall watchdog.
//!
//! The agent keeps one [`ProgressMeter`] per worker and tells it when a
//! request is dispatched to the worker, answered (any status the worker
//! sent), or abandoned without an answer (the caller left, the connection
//! broke). The meter measures **waiting**: the time the worker has spent
//! with requests outstanding since it last answered one. Time with nothing
//! outstanding does not count, and an abandoned request does not reset it
//! (a stuck worker whose callers give up after a deadline is still stuck).
//! An answer resets it, and so does a new process.
//!
//! It also keeps the service times (dispatch to answer) of the last
//! [`SAMPLES`] answers, from which the watchdog's window is derived: a
//! worker answering in 1 ms is stuck long before one that generates for
//! 30 s. Service times survive a restart (same model, same hardware).
//!
//! Sans-IO: every call takes `now`.

use std::time::{Duration, Instant};

/// Service times kept per worker.
pub const SAMPLES: usize = 256;

/// Answers needed before the service-time quantile is trusted.
pub const MIN_SAMPLES: usize = 8;

/// What the watchdog sees of one worker at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Requests outstanding on the worker.
    pub in_flight: usize,
    /// Time spent with requests outstanding since the last answer.
    pub waiting: Duration,
    /// The 99th percentile of the recent service times, once there are
    /// [`MIN_SAMPLES`] of them.
    pub service_p99: Option<Duration>,
}

/// Outstanding requests, waiting time and recent service times of one
/// worker.
#[derive(Debug, Clone)]
pub struct ProgressMeter {
    in_flight: usize,
    /// Start of the current stretch with requests outstanding.
    busy_since: Option<Instant>,
    /// Waiting carried over from earlier stretches without an answer.
    carried: Duration,
    /// Service times in µs, a ring.
    samples: Vec<u32>,
    next: usize,
}

impl Default for ProgressMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressMeter {
    /// A meter with nothing outstanding and no service times.
    pub fn new() -> Self {
        Self {
            in_flight: 0,
            busy_since: None,
            carried: Duration::ZERO,
            samples: Vec::new(),
            next: 0,
        }
    }

    /// A request was sent to the worker.
    pub fn dispatched(&mut self, now: Instant) {
        if self.in_flight == 0 {
            self.busy_since = Some(now);
        }
        self.in_flight += 1;
    }

    /// The worker answered a request after `service`.
    pub fn answered(&mut self, now: Instant, service: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.carried = Duration::ZERO;
        self.busy_since = (self.in_flight > 0).then_some(now);
        let micros = u32::try_from(service.as_micros()).unwrap_or(u32::MAX);
        if self.samples.len() < SAMPLES {
            self.samples.push(micros);
        } else {
            self.samples[self.next] = micros;
        }
        self.next = (self.next + 1) % SAMPLES;
    }

    /// The worker sent part of an answer (a streamed response): it is
    /// making progress, though nothing was released.
    pub fn progressed(&mut self, now: Instant) {
        self.carried = Duration::ZERO;
        if self.in_flight > 0 {
            self.busy_since = Some(now);
        }
    }

    /// A request was taken back before the worker had all of it (the agent
    /// forwards a large request as it arrives, and takes back one whose
    /// body is late: a slow or hostile client, not a slow worker). Unlike
    /// [`ProgressMeter::abandoned`], a stretch it ends is not carried: the
    /// worker could not have answered. A stretch other requests keep open
    /// goes on from its start.
    pub fn withdrawn(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.busy_since = None;
        }
    }

    /// A request ended without an answer from the worker.
    pub fn abandoned(&mut self, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            if let Some(since) = self.busy_since.take() {
                self.carried += now.saturating_duration_since(since);
            }
        }
    }

    /// A new process took the worker's place: what the old one owed is
    /// forgotten; its service times are kept.
    pub fn new_process(&mut self, now: Instant) {
        self.carried = Duration::ZERO;
        self.busy_since = (self.in_flight > 0).then_some(now);
    }

    /// The worker's progress at `now`.
    pub fn observe(&self, now: Instant) -> Progress {
        let current = self
            .busy_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        Progress {
            in_flight: self.in_flight,
            waiting: self.carried + current,
            service_p99: self.p99(),
        }
    }

    fn p99(&self) -> Option<Duration> {
        let n = self.samples.len();
        if n < MIN_SAMPLES {
            return None;
        }
        let mut sorted = self.samples.clone();
        // The smallest value at or above 99% of the samples.
        let rank = (n * 99).div_ceil(100).clamp(1, n) - 1;
        let (_, value, _) = sorted.select_nth_unstable(rank);
        Some(Duration::from_micros(u64::from(*value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waiting_runs_while_requests_are_outstanding_and_an_answer_resets_it() {
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        assert_eq!(m.observe(t0 + ms(500)).waiting, Duration::ZERO);
        m.dispatched(t0);
        m.dispatched(t0 + ms(10));
        assert_eq!(m.observe(t0 + ms(100)).waiting, ms(100));
        assert_eq!(m.observe(t0 + ms(100)).in_flight, 2);
        m.answered(t0 + ms(100), ms(100));
        let p = m.observe(t0 + ms(150));
        assert_eq!((p.in_flight, p.waiting), (1, ms(50)));
        m.answered(t0 + ms(200), ms(190));
        // Idle: nothing outstanding, nothing waits.
        assert_eq!(m.observe(t0 + ms(10_000)).waiting, Duration::ZERO);
    }

    #[test]
    fn withdrawn_requests_are_not_waiting_but_abandoned_ones_are() {
        // A client trickling upload after upload to a worker with nothing
        // else to do: each is taken back after 1 s.
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        for i in 0..10 {
            m.dispatched(t0 + ms(1000 * i));
            m.withdrawn();
        }
        assert_eq!(m.observe(t0 + ms(10_000)).waiting, Duration::ZERO);
        // Beside a request the worker holds, the stretch goes on.
        m.dispatched(t0 + ms(10_000));
        m.dispatched(t0 + ms(10_100));
        m.withdrawn();
        let p = m.observe(t0 + ms(10_500));
        assert_eq!((p.in_flight, p.waiting), (1, ms(500)));
    }

    #[test]
    fn abandoned_requests_keep_their_waiting() {
        // A stuck worker whose callers give up after 1 s each, one at a time.
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        for i in 0..5 {
            let start = t0 + ms(1000 * i);
            m.dispatched(start);
            m.abandoned(start + ms(1000));
        }
        m.dispatched(t0 + ms(5000));
        assert_eq!(m.observe(t0 + ms(5500)).waiting, ms(5500));
        // A new process owes nothing.
        m.new_process(t0 + ms(5500));
        assert_eq!(m.observe(t0 + ms(5600)).waiting, ms(100));
    }

    #[test]
    fn idle_time_between_abandoned_requests_does_not_count() {
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        m.dispatched(t0);
        m.abandoned(t0 + ms(300));
        m.dispatched(t0 + ms(60_000));
        assert_eq!(m.observe(t0 + ms(60_100)).waiting, ms(400));
    }

    #[test]
    fn streamed_progress_resets_waiting_without_releasing() {
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        m.dispatched(t0);
        m.progressed(t0 + ms(800));
        let p = m.observe(t0 + ms(1000));
        assert_eq!((p.in_flight, p.waiting), (1, ms(200)));
    }

    #[test]
    fn the_quantile_needs_enough_answers_and_follows_the_recent_ones() {
        let t0 = Instant::now();
        let mut m = ProgressMeter::new();
        for _ in 0..MIN_SAMPLES - 1 {
            m.dispatched(t0);
            m.answered(t0, ms(1));
        }
        assert_eq!(m.observe(t0).service_p99, None);
        m.dispatched(t0);
        m.answered(t0, ms(1));
        assert_eq!(m.observe(t0).service_p99, Some(ms(1)));
        // 1% slow answers are below the 99th percentile; 1.5% set it.
        let mut m = ProgressMeter::new();
        for i in 0..200 {
            m.dispatched(t0);
            m.answered(t0, if i % 100 == 0 { ms(50) } else { ms(1) });
        }
        assert_eq!(m.observe(t0).service_p99, Some(ms(1)));
        let mut m = ProgressMeter::new();
        for i in 0..200 {
            m.dispatched(t0);
            m.answered(t0, if i % 70 == 0 { ms(50) } else { ms(1) });
        }
        assert_eq!(m.observe(t0).service_p99, Some(ms(50)));
        // The ring forgets: 256 answers of 30 s replace the fast ones.
        for _ in 0..SAMPLES {
            m.dispatched(t0);
            m.answered(t0, Duration::from_secs(30));
        }
        assert_eq!(m.observe(t0).service_p99, Some(Duration::from_secs(30)));
    }
}
