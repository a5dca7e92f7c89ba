//! How many requests to send one worker at once, learned from what it does
//! (the gradient / Vegas family of adaptive concurrency limits), and the
//! worker's capacity that follows from it. Sans-IO: every call takes `now`.
//!
//! **What is measured.** Requests *served at once* by the worker, by
//! Little's law: over a window with `n` requests in flight on average
//! (permits held, dispatch to answer) and a mean latency `rtt`, the worker
//! serves `p = n × unloaded / rtt` at once, where `unloaded` is its latency
//! with nothing else in flight. Past the worker's parallelism `P` the extra
//! requests wait inside it, `rtt` grows as `n / P` and `p = P` exactly; below
//! it `rtt = unloaded` and `p = n`, a lower bound. `p × 1 / unloaded` is the
//! worker's throughput at that concurrency, so the capacity — the auto
//! weight — is
//!
//! ```text
//! capacity = concurrency / unloaded        requests per second
//! limit    = round(concurrency) + headroom (≥ 1, about an eighth), ≤ max_inflight
//! ```
//!
//! The headroom keeps a request waiting inside the worker, so a slot never
//! idles while the agent dispatches the next one, and lets the limit find
//! more parallelism when there is some; the rest waits in the agent's
//! queue, where priorities apply.
//!
//! **Unloaded latency.** A request that ran alone on the worker (none in
//! flight when it was sent, none sent until it answered) is a sample of it;
//! at low load every request is one. The unloaded latency is the median
//! ([`BASELINE_QUANTILE`]) of the last [`SOLO_SAMPLES`] of them, not a
//! running mean: a lightly used worker's capacity rests on these samples
//! alone, and a cold first request or one delayed by a busy host (a 20 ms
//! worker read 35 ms beside two saturated ones) moved a mean by a third;
//! the median moves only once half of the recent samples say so, so a
//! worker that really got slower takes over after half of
//! [`SOLO_SAMPLES`] requests (or at once through a jump probe, below). Under sustained load
//! there are none, so the limiter *probes*: the limit drops to 1 until
//! [`PROBE_SAMPLES`] requests have run alone, and their median becomes the
//! unloaded latency (Envoy's minRTT window, which takes a percentile too,
//! with one request rather than a few: with a single-slot worker, three at
//! once already queue). The samples from before a probe are dropped (they
//! describe the baseline it replaced), and fewer than [`SOLO_MIN`] since
//! then do not override it. A probe runs after the
//! first window if no request has run alone by then, every
//! [`PROBE_INTERVAL`] (jittered, seeded) while none has since the last one,
//! and at once when a window's latency is more
//! than [`JUMP`] times off what the learned concurrency predicts — a worker
//! that became slower or faster (a thermal slowdown, a `slow` fault) is
//! re-measured within a window or two instead of having its limit cut as
//! if it were queueing (Gradient2's long-RTT drift and Vegas's periodic
//! `rtt_noload` reset answer the same staleness more slowly).
//!
//! **Growth and smoothing.** Until the first window shows queueing
//! (latency above [`TOLERANCE`] over unloaded) the limit doubles on each
//! window the worker spent at its limit (slow start; the capacity counts
//! one doubling ahead of what was measured and of the most requests the
//! worker was sent at once, see [`Limiter::capacity`]); afterwards the
//! concurrency follows `p`, smoothed ([`GAIN`]), in windows where the limit
//! binds or more requests are in flight than it serves at once; at once
//! upwards when the limit binds and latency is at the unloaded one
//! (nothing waits: the headroom found more parallelism); and only upwards
//! in windows with less demand (the worker was not asked for more: `p` is
//! only a lower bound, and an idle node is not a node without capacity).
//!
//! **Why it does not oscillate.** A gradient controller sets the limit
//! from the ratio of latencies, which the limit itself changes: a cut
//! drains the queue, latency falls, the limit grows back (Gradient2 damps
//! this with a smoothing factor and a gradient clamp, Envoy with a buffer
//! on minRTT and a sqrt headroom). Here the limit is set from `p`, which
//! does not depend on the limit once the limit exceeds the worker's
//! parallelism: queueing makes `rtt` grow exactly as `n`, and the quotient
//! stays `P`. The fixed point `round(P) + headroom` is reached from above
//! in one window and from below by doubling, and noise is averaged by
//! [`GAIN`]. Probes are the only deliberate dips, one short one per
//! [`PROBE_INTERVAL`] at most while the worker stays saturated, and a
//! latency jump folds nothing into the concurrency until a probe has
//! re-measured the baseline (and the first window after a probe is always
//! folded, so a real change of parallelism cannot start a probe loop).
//!
//! **Latency that is not queueing.** `p` counts all latency above the
//! baseline as requests waiting inside the worker. Latency added outside
//! it — an agent starved of CPU reading answers late, a slower network —
//! holds each permit longer than the worker's slot, so `p` falls below
//! the concurrency, the limit follows, the worker is underfed, and the
//! next window reads less still: a spiral (on one core a 4 × 4 ms worker
//! went to limit 2 and served a quarter of its slots). A fold that would
//! take the concurrency below [`DROP`] of its value when the baseline was
//! last measured re-measures the baseline first (at most every
//! [`PROBE_GAP`]); a baseline more than [`TOLERANCE`] slower means the
//! requests got slower, not the worker narrower: it is taken, the
//! concurrency goes back to that value, and the limit grows to cover the
//! delay. A worker that really narrowed shows the same baseline, and the
//! next windows cut.
//!
//! See docs/DECISIONS.md ("Adaptive concurrency") for the sources and the
//! measured behaviour.

use std::time::{Duration, Instant};

/// Shortest window over which `p` is measured.
pub const WINDOW: Duration = Duration::from_millis(100);

/// Completions a window needs before it closes (unless [`LONG_WINDOW`]).
pub const MIN_SAMPLES: u32 = 8;

/// A window this long closes with as few as two completions (slow workers).
pub const LONG_WINDOW: Duration = Duration::from_secs(1);

/// A window "binds" when the worker spent at least this share of it at its
/// limit: only then can `p` be below the concurrency for a reason.
pub const BOUND_SHARE: f64 = 0.5;

/// Latency within this fraction above unloaded counts as no queueing.
pub const TOLERANCE: f64 = 0.2;

/// Latency more than this many times off the prediction (either way)
/// starts a probe instead of being folded in.
pub const JUMP: f64 = 3.0;

/// Weight of a window's `p` in the concurrency when the worker is
/// saturated (noise is averaged over about 1 / GAIN windows).
pub const GAIN: f64 = 0.25;

/// Requests that ran alone outside probes kept for the unloaded latency
/// (the most recent; older ones age out).
pub const SOLO_SAMPLES: usize = 16;

/// Requests that ran alone since the last probe needed before they, rather
/// than the probe, give the unloaded latency.
pub const SOLO_MIN: usize = 4;

/// The unloaded latency is this quantile of its samples (the median,
/// the lower of the two middle ones): up to half of them can be cold or
/// late (a busy host) without moving it, and it is the mean service time
/// of a worker whose service time varies evenly, which `p` needs.
pub const BASELINE_QUANTILE: f64 = 0.5;

/// Requests that must run alone for a probe to end.
pub const PROBE_SAMPLES: u32 = 8;

/// A probe with at least one sample ends after this long.
pub const PROBE_MAX: Duration = Duration::from_secs(2);

/// A probe without any sample gives up after this long (the old baseline stays).
pub const PROBE_GIVE_UP: Duration = Duration::from_secs(10);

/// Mean time between periodic probes while no request runs alone (jittered
/// ±25% so that the workers of a fleet do not probe in step).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// Weight of a routine probe's result in the unloaded latency; a routine
/// probe moves it by at most [`ROUTINE_STEP`]× either way.
pub const ROUTINE_GAIN: f64 = 0.5;

/// Most a routine probe changes the unloaded latency by, as a factor.
pub const ROUTINE_STEP: f64 = 1.5;

/// Least time between probes started by a latency jump.
pub const PROBE_GAP: Duration = Duration::from_secs(5);

/// A fold that would take the concurrency below this share of what it was
/// when the baseline was last measured re-measures the baseline first.
pub const DROP: f64 = 0.7;

/// A request's place in the limiter's accounting, from dispatch to answer.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch {
    /// When it was sent.
    pub at: Instant,
    seq: u64,
    alone: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Doubling until the first window that queues.
    SlowStart,
    /// Following the measured concurrency.
    Steady,
    /// Limit 1 until enough requests ran alone.
    Probe {
        since: Instant,
        samples: u32,
        /// Their latencies, seconds (the first `samples`).
        latencies: [f64; PROBE_SAMPLES as usize],
        then: Then,
        /// What started it.
        why: Why,
    },
}

/// Why a probe runs, which decides what its result changes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Why {
    /// Periodic, or the first baseline: the throughput is assumed to hold.
    Routine,
    /// A window's latency was [`JUMP`] times off: the service time changed.
    Jump,
    /// A fold would have cut the concurrency below [`DROP`] of this, its
    /// value when the baseline was last measured.
    Drop(f64),
}

/// Where a probe returns to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Then {
    SlowStart,
    Steady,
}

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    start: Option<Instant>,
    in_flight_secs: f64,
    at_limit_secs: f64,
    completions: u32,
    latency_secs: f64,
    /// Most requests in flight at once.
    peak: usize,
}

/// The latencies of the last [`SOLO_SAMPLES`] requests that ran alone
/// outside probes, seconds, oldest overwritten first; and the same kept
/// in order, so that their [`baseline`] is read, not sorted, on each
/// sample (at concurrency 1 every request is one: sorting sixteen on each
/// was ~1k instructions per request; BENCHMARKS.md).
#[derive(Debug, Default, Clone)]
struct Solo {
    ring: [f64; SOLO_SAMPLES],
    /// `ring[..len]` in `f64::total_cmp` order.
    sorted: [f64; SOLO_SAMPLES],
    len: usize,
    next: usize,
}

impl Solo {
    fn push(&mut self, latency: f64) {
        if self.len == SOLO_SAMPLES {
            // The oldest leaves the order too (any one equal to it).
            let old = self.ring[self.next];
            let at = self.sorted[..self.len]
                .iter()
                .position(|x| x.total_cmp(&old).is_eq())
                .expect("the ring's samples are the sorted ones");
            self.sorted.copy_within(at + 1..self.len, at);
            self.len -= 1;
        }
        self.ring[self.next] = latency;
        self.next = (self.next + 1) % SOLO_SAMPLES;
        let at = self.sorted[..self.len].partition_point(|x| x.total_cmp(&latency).is_lt());
        self.sorted.copy_within(at..self.len, at + 1);
        self.sorted[at] = latency;
        self.len += 1;
    }

    /// [`baseline`] of the samples.
    fn baseline(&self) -> Option<f64> {
        quantile_of_sorted(&self.sorted[..self.len])
    }

    fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }
}

/// The [`BASELINE_QUANTILE`] of the first [`SOLO_SAMPLES`] of `samples`
/// (of two, the smaller); `None` when empty.
fn baseline(samples: &[f64]) -> Option<f64> {
    let mut sorted = [0.0; SOLO_SAMPLES];
    let n = samples.len().min(SOLO_SAMPLES);
    let sorted = &mut sorted[..n];
    sorted.copy_from_slice(&samples[..n]);
    sorted.sort_unstable_by(f64::total_cmp);
    quantile_of_sorted(sorted)
}

/// The [`BASELINE_QUANTILE`] of `sorted` (in order); `None` when empty.
fn quantile_of_sorted(sorted: &[f64]) -> Option<f64> {
    let at = ((sorted.len().checked_sub(1)?) as f64 * BASELINE_QUANTILE).floor() as usize;
    sorted.get(at).copied()
}

/// One worker's adaptive concurrency limit.
#[derive(Debug, Clone)]
pub struct Limiter {
    max: usize,
    limit: usize,
    mode: Mode,
    /// Requests the worker serves at once, once known (learned or hinted).
    concurrency: Option<f64>,
    /// Whether `concurrency` was measured under load (not only hinted).
    learned: bool,
    /// Latency of a request alone, seconds.
    unloaded: Option<f64>,
    /// Requests that ran alone since the last probe.
    solo: Solo,
    /// Whether `unloaded` came from a probe (not from `solo`).
    probed: bool,
    in_flight: usize,
    since: Option<Instant>,
    window: Window,
    /// Most requests in flight at once in the last window that closed.
    last_peak: usize,
    dispatches: u64,
    /// The concurrency when the baseline was last measured (a probe ended,
    /// slow start learned it, or a hint gave it).
    reference: Option<f64>,
    /// Skip the jump check on the next window (a fresh baseline).
    fresh: bool,
    last_probe: Option<Instant>,
    next_probe: Option<Instant>,
    /// The slow-start limit a probe interrupted.
    explored: usize,
    solo_since_probe: bool,
    rng: u64,
}

impl Limiter {
    /// A limiter for a worker that may take at most `max` requests at once
    /// (`max_inflight`); `seed` jitters its probes.
    pub fn new(max: usize, seed: u64) -> Self {
        Self {
            max: max.max(1),
            limit: 1,
            mode: Mode::SlowStart,
            concurrency: None,
            learned: false,
            unloaded: None,
            solo: Solo::default(),
            probed: false,
            in_flight: 0,
            since: None,
            window: Window::default(),
            last_peak: 0,
            dispatches: 0,
            reference: None,
            fresh: true,
            last_probe: None,
            next_probe: None,
            explored: 0,
            solo_since_probe: false,
            rng: seed | 1,
        }
    }

    /// The worker says how many requests it runs at once (Triton's
    /// `instance_group` count × `max_batch_size`): the starting point, until
    /// measured.
    pub fn hint(&mut self, parallelism: usize) {
        if self.learned || parallelism == 0 {
            return;
        }
        let c = parallelism.min(self.max) as f64;
        self.concurrency = Some(c);
        self.reference = Some(c);
        match &mut self.mode {
            Mode::Probe { then, .. } => *then = Then::Steady,
            mode => {
                *mode = Mode::Steady;
                self.limit = self.target(c);
            }
        }
    }

    /// Permits the worker may hold now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Requests the worker serves at once, once known.
    pub fn concurrency(&self) -> Option<f64> {
        self.concurrency
    }

    /// The worker's latency with nothing else in flight, once measured.
    pub fn unloaded(&self) -> Option<Duration> {
        self.unloaded.map(Duration::from_secs_f64)
    }

    /// Whether a probe holds the limit at 1 now.
    pub fn probing(&self) -> bool {
        matches!(self.mode, Mode::Probe { .. })
    }

    /// Requests per second the worker can serve, once both the concurrency
    /// and the unloaded latency are known.
    ///
    /// While the limit is still exploring (slow start: no window has shown
    /// the worker queueing yet) the concurrency counted is the limit being
    /// tried, up to twice the lower bound measured so far, rather than that
    /// bound alone: an estimate that only ever reports what the worker was
    /// asked for draws only that much traffic from weighted clients, and
    /// would never be asked for more. Slow start ends at the first window
    /// that queues with more in flight than measured.
    ///
    /// But only one doubling ahead of what its clients ask for, too: at
    /// most twice the most requests in flight at once in the last window
    /// (or the current one). A limit that no client comes near has not
    /// been tried, and advertising it draws nothing from a client that
    /// weighs latency as well (a 2 × 20 ms worker sent one request at a
    /// time after a burst of two advertised 181 requests/s for 89-100).
    pub fn capacity(&self) -> Option<f64> {
        let u = self.unloaded.filter(|u| *u > 0.0)?;
        let c = self.concurrency.unwrap_or(1.0);
        let exploring = match self.mode {
            Mode::SlowStart => self.limit,
            Mode::Probe {
                then: Then::SlowStart,
                ..
            } => self.explored,
            _ => 0,
        };
        let asked = 2 * self.last_peak.max(self.window.peak);
        // At most twice what was measured and asked for: one doubling ahead.
        let c = c.max((exploring.min(asked) as f64).min(2.0 * c));
        Some(c / u)
    }

    /// A request is sent to the worker at `now`.
    pub fn start(&mut self, now: Instant) -> Dispatch {
        self.advance(now);
        let alone = self.in_flight == 0;
        self.in_flight += 1;
        self.window.peak = self.window.peak.max(self.in_flight);
        let seq = self.dispatches;
        self.dispatches += 1;
        Dispatch {
            at: now,
            seq,
            alone,
        }
    }

    /// The request sent as `d` gave its permit back at `now`; `served`
    /// when the worker answered it (failures and cancellations count for
    /// the time they held the permit, not as completions).
    pub fn finish(&mut self, now: Instant, d: Dispatch, served: bool) {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        let latency = now.saturating_duration_since(d.at).as_secs_f64();
        let solo = served && d.alone && self.dispatches == d.seq + 1;
        if let Mode::Probe {
            since,
            samples,
            latencies,
            then,
            why,
        } = &mut self.mode
        {
            if solo && *samples < PROBE_SAMPLES {
                latencies[*samples as usize] = latency;
                *samples += 1;
            }
            let (since, samples, latencies, then, why) =
                (*since, *samples, *latencies, *then, *why);
            let held = now.saturating_duration_since(since);
            if samples >= PROBE_SAMPLES
                || (samples > 0 && held >= PROBE_MAX)
                || held >= PROBE_GIVE_UP
            {
                self.end_probe(now, &latencies[..samples as usize], then, why);
            }
            return;
        }
        if !served {
            return;
        }
        if solo {
            self.solo_since_probe = true;
            self.solo.push(latency);
            // Too few since a probe measured it: the probe's stands.
            if !self.probed || self.solo.len >= SOLO_MIN {
                self.unloaded = self.solo.baseline();
                self.probed = false;
            }
        }
        let w = &mut self.window;
        w.completions += 1;
        w.latency_secs += latency;
        let start = *w.start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if (w.completions >= MIN_SAMPLES && elapsed >= WINDOW)
            || (w.completions >= 2 && elapsed >= LONG_WINDOW)
        {
            self.close_window(now, elapsed);
        }
    }

    /// The worker's process was replaced: what is in flight is gone, a
    /// probe in progress ends, the learned figures stay (same program, same
    /// GPU) until measured again.
    pub fn restarted(&mut self, now: Instant) {
        self.in_flight = 0;
        self.since = Some(now);
        self.window = Window::default();
        if let Mode::Probe { then, .. } = self.mode {
            self.end_probe(now, &[], then, Why::Routine);
        }
    }

    fn advance(&mut self, now: Instant) {
        if let Some(since) = self.since {
            let dt = now.saturating_duration_since(since).as_secs_f64();
            if self.window.start.is_some() {
                self.window.in_flight_secs += dt * self.in_flight as f64;
                if self.in_flight >= self.limit {
                    self.window.at_limit_secs += dt;
                }
            }
        }
        self.since = Some(self.since.map_or(now, |s| s.max(now)));
        if self.window.start.is_none() && !self.probing() {
            self.window.start = Some(now);
        }
    }

    fn close_window(&mut self, now: Instant, elapsed: Duration) {
        let w = std::mem::take(&mut self.window);
        self.window.start = Some(now);
        self.window.peak = self.in_flight;
        self.last_peak = w.peak;
        let secs = elapsed.as_secs_f64();
        let Some(base) = self.unloaded else {
            // No request has run alone yet (a burst from the start): nothing
            // can be judged without the baseline, so measure it first.
            self.begin_probe(now, Why::Routine);
            return;
        };
        if secs <= 0.0 {
            return;
        }
        let n = w.in_flight_secs / secs;
        let rtt = w.latency_secs / f64::from(w.completions);
        if n <= 0.0 || rtt <= 0.0 || base <= 0.0 {
            return;
        }
        let ratio = rtt / base;
        let bound = w.at_limit_secs / secs >= BOUND_SHARE;
        let fresh = std::mem::replace(&mut self.fresh, false);
        let gap_ok = self
            .last_probe
            .is_none_or(|p| now.saturating_duration_since(p) >= PROBE_GAP);
        if !fresh {
            // In slow start the limit is at most twice a level that did not
            // queue, so its own overshoot at most doubles the latency.
            let expected = match self.mode {
                Mode::Steady => self.concurrency.map_or(1.0, |c| (n / c.max(1e-9)).max(1.0)),
                _ => 1.0,
            };
            let off = ratio / expected;
            if !(1.0 / JUMP..=JUMP).contains(&off) && gap_ok {
                // The baseline is stale (the worker got slower or faster):
                // measure it again before folding anything in.
                self.begin_probe(now, Why::Jump);
                return;
            }
        }
        // Requests served at once: never more than were in flight.
        let p = (n / ratio).min(n);
        let queueing = ratio > 1.0 + TOLERANCE;
        match self.mode {
            Mode::SlowStart => {
                let c = self.concurrency.unwrap_or(1.0);
                if queueing && (bound || n > c) {
                    // Past the worker's parallelism: `p` measures it.
                    self.concurrency = Some(p.max(1.0));
                    self.reference = self.concurrency;
                    self.learned = true;
                    self.mode = Mode::Steady;
                    self.limit = self.target(p);
                } else {
                    self.raise(p.max(1.0));
                    // Not app-limited (Netflix's rule: at least half the
                    // limit in flight) and nothing waits: try twice as many.
                    if n >= self.limit as f64 / 2.0 {
                        self.limit = (self.limit * 2).min(self.max);
                        if self.limit == self.max {
                            self.mode = Mode::Steady;
                        }
                    }
                }
            }
            Mode::Steady => {
                let c = self.concurrency.unwrap_or(p);
                let next = 1f64.max(if bound && ratio <= 1.0 {
                    // The limit binds and nothing waits: there may be
                    // more parallelism; `p` (= n) is a lower bound.
                    c.max(p)
                } else if bound || n > c {
                    // At or past the worker's parallelism: `p` measures it.
                    c + GAIN * (p - c)
                } else {
                    // Fewer asked than it serves at once: nothing to learn
                    // beyond a lower bound.
                    c.max(p)
                });
                if let Some(r) = self
                    .reference
                    .filter(|&r| next < DROP * r && gap_ok && !fresh)
                {
                    // Latency the worker's slots do not explain reads as
                    // requests waiting inside it. If it is not (an agent
                    // starved of CPU answers late, a slower network), each
                    // cut underfeeds the worker, the next window reads even
                    // less, and the limit spirals down. Before a cut this
                    // large, measure the baseline again.
                    self.begin_probe(now, Why::Drop(r));
                    return;
                }
                self.concurrency = Some(next);
                if self.concurrency != Some(c) {
                    self.learned = true;
                }
                self.limit = self.target(self.concurrency.unwrap_or(p));
            }
            Mode::Probe { .. } => {}
        }
        if !self.solo_since_probe && self.next_probe.is_some_and(|t| now >= t) {
            self.begin_probe(now, Why::Routine);
        }
    }

    /// `p` is a lower bound of the concurrency: raise to it.
    fn raise(&mut self, p: f64) {
        let c = self.concurrency.map_or(p, |c| c.max(p));
        if self.concurrency.is_none_or(|old| c > old) {
            self.learned = true;
        }
        self.concurrency = Some(c);
    }

    /// The limit for a concurrency of `c`.
    fn target(&self, c: f64) -> usize {
        let headroom = (c / 8.0).round().max(1.0);
        ((c.round() + headroom) as usize).clamp(1, self.max)
    }

    /// Starts measuring the unloaded latency, for the reason `why`.
    fn begin_probe(&mut self, now: Instant, why: Why) {
        let then = match self.mode {
            Mode::SlowStart => Then::SlowStart,
            Mode::Steady => Then::Steady,
            Mode::Probe { .. } => return,
        };
        self.mode = Mode::Probe {
            since: now,
            samples: 0,
            latencies: [0.0; PROBE_SAMPLES as usize],
            then,
            why,
        };
        self.explored = self.limit;
        self.limit = 1;
        self.last_probe = Some(now);
        self.window = Window::default();
    }

    /// Ends a probe with the latencies of the requests that ran alone in
    /// it, seconds; their [`BASELINE_QUANTILE`] is its measure (one late
    /// sample does not move it). After a jump the worker's service time
    /// changed and its parallelism is assumed to hold: the concurrency
    /// stays, the capacity follows the new latency at once. A routine
    /// probe assumes the opposite (the throughput held, the baseline's
    /// estimate moved): the unloaded latency moves part of the way, and the
    /// concurrency, which is measured in its units, moves with it, so the
    /// capacity — their quotient — does not jump with the noise of a few
    /// samples.
    ///
    /// A probe before a large cut ([`Why::Drop`]) decides between the two:
    /// a baseline more than [`TOLERANCE`] slower means the requests got
    /// slower, not the worker narrower — the new baseline is taken and the
    /// concurrency goes back to what it was when the old one was measured;
    /// otherwise it is routine, and the next windows make the cut.
    fn end_probe(&mut self, now: Instant, samples: &[f64], then: Then, why: Why) {
        if let Some(probe) = baseline(samples) {
            let slower = self
                .unloaded
                .is_some_and(|old| probe > old * (1.0 + TOLERANCE));
            match (self.unloaded, why) {
                (_, Why::Drop(restore)) if slower => {
                    self.unloaded = Some(probe);
                    self.concurrency = Some(self.concurrency.map_or(restore, |c| c.max(restore)));
                }
                (Some(old), Why::Routine | Why::Drop(_)) if old > 0.0 => {
                    let new = (old + ROUTINE_GAIN * (probe - old))
                        .clamp(old / ROUTINE_STEP, old * ROUTINE_STEP);
                    if let Some(c) = self.concurrency {
                        self.concurrency = Some((c * new / old).max(1.0));
                    }
                    self.unloaded = Some(new);
                }
                _ => self.unloaded = Some(probe),
            }
            // What ran alone before describes the baseline this replaced.
            self.solo.clear();
            self.probed = true;
        }
        self.reference = self.concurrency;
        self.solo_since_probe = false;
        self.fresh = true;
        self.next_probe = Some(now + self.jittered(PROBE_INTERVAL));
        self.window = Window {
            start: Some(now),
            peak: self.in_flight,
            ..Window::default()
        };
        match (then, self.concurrency) {
            (Then::Steady, Some(c)) => {
                self.mode = Mode::Steady;
                self.limit = self.target(c);
            }
            _ => {
                self.mode = Mode::SlowStart;
                self.limit = self.explored.max(1);
            }
        }
    }

    /// `d` × a factor in [0.75, 1.25) from the seeded generator.
    fn jittered(&mut self, d: Duration) -> Duration {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        d.mul_f64(0.75 + 0.5 * unit)
    }
}

/// Most requests a model's configuration says run at once: Σ over its
/// instance groups of count (× GPUs listed) × max(1, `max_batch_size`).
/// `None` when it says nothing usable. Capped at 65,536.
pub fn parallelism(config: &infermesh_proto::inference::ModelConfig) -> Option<usize> {
    let batch = config.max_batch_size.max(1) as usize;
    let instances: usize = config
        .instance_group
        .iter()
        .map(|g| g.count.max(0) as usize * g.gpus.len().max(1))
        .sum();
    let n = instances.checked_mul(batch)?.min(1 << 16);
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests;
