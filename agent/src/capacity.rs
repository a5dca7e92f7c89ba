//! Live capacity (`weight = "auto"`): what each worker can serve, estimated
//! from what it does, scaled by the health of its GPU and of the host.
//! Sans-IO: every function takes `now` and the readings as arguments.
//!
//! **Per worker.** A [`Meter`] integrates the worker's requests in flight
//! over time (the agent holds a permit on the worker from dispatch to the
//! last byte of the answer): every [`TICK`] the pool takes the completions
//! `c` and the in-flight time `a` (request-seconds) of the tick. An
//! [`Estimator`] keeps exponentially weighted sums `C`, `A` of them
//! (half-life [`HALF_LIFE`]) and estimates
//!
//! ```text
//! capacity = slots × C / A   requests per second
//! ```
//!
//! `A / C` is the mean time a request holds a slot (service time), so this is
//! slots ÷ mean service time; by Little's law it is also completions per
//! second ÷ utilisation, where utilisation = mean requests in flight ÷ slots.
//! With one slot that is exactly completions/s ÷ busy ratio (busy = share of
//! the time with a request in flight).
//!
//! **Several slots.** The busy ratio alone underestimates a worker that
//! serves several requests at once at low load: one request in flight makes
//! it "busy" though it could take `max_inflight` of them, and the
//! underestimate feeds itself (less traffic → still looks full). Dividing by
//! the mean in flight ÷ `slots` (the worker's `max_inflight`, which the pool
//! never exceeds) instead counts each free slot as free. It assumes the
//! slots really run in parallel: when they do not (a worker that queues
//! internally, or a GPU that slows down as it is shared), each request's
//! service time grows with concurrency, `A / C` grows with it, and as load
//! rises the estimate falls to the throughput measured at saturation, which
//! is the true capacity. Nodes of one fleet configured alike are compared
//! alike at every load, so their ratio holds even before saturation.
//!
//! **Before data and when idle.** Until a worker has [`MIN_COMPLETIONS`]
//! (weighted) completions it has no estimate, and the node counts it at the
//! per-slot mean of its measured workers (same host, same GPUs) × its slots,
//! or at [`PRIOR_PER_SLOT`] × its slots when none is measured (10 ms per
//! request, the order of GPU inference). The prior must be of the order of
//! its measured peers': a fresh node advertising 1 among nodes advertising
//! thousands would get one request in thousands and take minutes to be
//! measured; one in the right order gets its share (ramped by the client's
//! slow start) and, since the estimate does not depend on the load, is
//! measured within a second or two. A tick without traffic changes nothing:
//! the estimate holds instead of decaying to zero (an idle node is not a
//! node without capacity), and is kept across worker restarts.
//!
//! **Health.** The node's weight is the sum over ready workers of
//! `capacity × gpu_factor(worker's GPU) × host_factor`; see [`gpu_factor`]
//! and [`host_factor`] for each factor and why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_gpu::{GpuSample, GpuTelemetry, throttle};

use crate::pool::Pool;

/// The configured `weight`: estimated live (`"auto"`, the default) or
/// pinned to a number (× the share of workers ready).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weight {
    /// Estimated from what the workers serve (this module).
    Auto,
    /// The operator's number.
    Fixed(f64),
}

impl From<f64> for Weight {
    fn from(w: f64) -> Self {
        Weight::Fixed(w)
    }
}

/// How often the pool takes each worker's meter and the health readings.
pub const TICK: Duration = Duration::from_secs(1);

/// Half-life of the smoothing: a change of speed shows half after this much
/// traffic (ticks without traffic do not count).
pub const HALF_LIFE: Duration = Duration::from_secs(5);

/// A tick longer than this means the agent was not running (its ticker
/// fell that far behind): the tick's sample is dropped.
pub const MAX_TICK: Duration = Duration::from_secs(3);

/// Weighted completions a worker needs before its estimate is used.
pub const MIN_COMPLETIONS: f64 = 8.0;

/// Capacity counted per slot of a worker with no estimate on a node without
/// any, in requests per second (10 ms per request).
pub const PRIOR_PER_SLOT: f64 = 100.0;

/// Factor applied while the GPU's clocks are cut for heat or power delivery.
pub const SLOWDOWN_FACTOR: f64 = 0.5;

/// Factor applied to a GPU with uncorrectable ECC errors since the driver
/// loaded.
pub const ECC_FACTOR: f64 = 0.5;

/// Share of GPU memory in use above which the GPU factor goes down.
pub const MEMORY_HIGH: f64 = 0.9;

/// Share of host memory available below which the host factor goes down.
pub const HOST_MEMORY_LOW: f64 = 0.05;

/// The lowest any health factor goes: a node that is still serving keeps
/// some weight (faults, not pressure, take nodes out).
pub const FACTOR_FLOOR: f64 = 0.25;

/// What one worker did during a tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Requests completed.
    pub completions: u64,
    /// Requests in flight integrated over the tick, in request-seconds.
    pub in_flight_secs: f64,
}

/// Integrates one worker's requests in flight over time.
#[derive(Debug, Default)]
pub struct Meter {
    in_flight: usize,
    since: Option<Instant>,
    sample: Sample,
}

impl Meter {
    /// A request took a slot at `now`.
    pub fn start(&mut self, now: Instant) {
        self.advance(now);
        self.in_flight += 1;
    }

    /// A request gave its slot back at `now` (completed, failed or cancelled:
    /// any of them held the slot for that long).
    pub fn finish(&mut self, now: Instant) {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.sample.completions += 1;
    }

    /// A slot taken at `now` was given back without an answer (the request
    /// failed or its caller had gone): its time counts, no completion.
    pub fn cancel(&mut self, now: Instant) {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// What happened since the last call, up to `now`.
    pub fn take(&mut self, now: Instant) -> Sample {
        self.advance(now);
        std::mem::take(&mut self.sample)
    }

    fn advance(&mut self, now: Instant) {
        if let Some(since) = self.since {
            let dt = now.saturating_duration_since(since).as_secs_f64();
            self.sample.in_flight_secs += dt * self.in_flight as f64;
        }
        self.since = Some(self.since.map_or(now, |s| s.max(now)));
    }
}

/// One worker's smoothed capacity.
#[derive(Debug, Clone, Default)]
pub struct Estimator {
    completions: f64,
    in_flight_secs: f64,
    estimate: Option<f64>,
}

impl Estimator {
    /// Folds in one tick of `tick` length for a worker with `slots` slots.
    pub fn observe(&mut self, sample: Sample, tick: Duration, slots: usize) {
        if sample.completions == 0 && sample.in_flight_secs <= 0.0 {
            // Idle: hold.
            return;
        }
        if tick > MAX_TICK {
            // The agent itself did not run for that long (SIGSTOP, a paused
            // VM, starvation): requests it held in flight meanwhile seem to
            // have taken the whole stall, which says nothing of the worker.
            // Folded in, it would cut the estimate many times over, and the
            // low weight would keep away the traffic that could correct it.
            return;
        }
        let keep = 0.5f64.powf(tick.as_secs_f64() / HALF_LIFE.as_secs_f64());
        self.completions = self.completions * keep + sample.completions as f64;
        self.in_flight_secs = self.in_flight_secs * keep + sample.in_flight_secs;
        if self.completions >= MIN_COMPLETIONS && self.in_flight_secs > 0.0 {
            self.estimate = Some(slots.max(1) as f64 * self.completions / self.in_flight_secs);
        }
    }

    /// Requests per second this worker can serve, once measured.
    pub fn capacity(&self) -> Option<f64> {
        self.estimate
    }
}

/// The node's capacity: the sum over `workers` (each `(estimate, ready,
/// health factor, slots)`) of the ready ones, unmeasured ones counted at the
/// per-slot mean of the measured ones, or [`PRIOR_PER_SLOT`], × their slots.
pub fn node_capacity<I>(workers: I) -> f64
where
    I: IntoIterator<Item = (Option<f64>, bool, f64, usize)>,
    I::IntoIter: Clone,
{
    let workers = workers.into_iter();
    let (sum, slots) = workers
        .clone()
        .filter_map(|w| Some((w.0?, w.3)))
        .fold((0.0, 0usize), |(s, n), (c, k)| (s + c, n + k));
    let per_slot = if slots == 0 {
        PRIOR_PER_SLOT
    } else {
        sum / slots as f64
    };
    workers
        .filter(|w| w.1)
        .map(|(estimate, _, factor, slots)| {
            estimate.unwrap_or(per_slot * slots.max(1) as f64) * factor
        })
        .sum()
}

/// How much of a GPU's measured capacity to advertise, in
/// `[FACTOR_FLOOR, 1]`. The measured rate already shows how fast the GPU is
/// now; these readings say what it does not show yet, or at all:
///
/// - **Thermal or power slowdown** (NVML's HW slowdown, SW/HW thermal, HW
///   power brake; not the power cap a busy GPU normally sits at, nor idle
///   clocks): ×[`SLOWDOWN_FACTOR`]. Clocks are cut by half or more at once,
///   while the smoothed rate shows it only after some seconds; and the cause
///   is usually the load itself, so shedding some lets the GPU recover. It
///   lifts as soon as the throttle clears.
/// - **Uncorrectable ECC errors** (volatile count > 0): ×[`ECC_FACTOR`]. The
///   Xid policy quarantines on the event itself; a GPU that still serves with
///   the count set needs a reset at the next chance, so prefer its peers.
/// - **Memory pressure**: from 1 at [`MEMORY_HIGH`] of the framebuffer in
///   use down to the floor when full. A full framebuffer fails the next larger
///   batch or cache growth with out-of-memory, which no rate foresees.
pub fn gpu_factor(sample: &GpuSample, memory_total_bytes: u64) -> f64 {
    let mut f = 1.0;
    if sample.throttle_reasons & throttle::SLOWDOWN != 0 {
        f *= SLOWDOWN_FACTOR;
    }
    if sample.ecc_uncorrected > 0 {
        f *= ECC_FACTOR;
    }
    if memory_total_bytes > 0 {
        let used = sample.memory_used_bytes as f64 / memory_total_bytes as f64;
        if used > MEMORY_HIGH {
            let over = ((used - MEMORY_HIGH) / (1.0 - MEMORY_HIGH)).min(1.0);
            f *= 1.0 - over * (1.0 - FACTOR_FLOOR);
        }
    }
    f.max(FACTOR_FLOOR)
}

/// The host's CPU and memory, as read from `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostSample {
    /// One-minute load average.
    pub load1: Option<f64>,
    /// CPUs available to the agent.
    pub cpus: Option<usize>,
    /// `MemTotal`, bytes.
    pub memory_total_bytes: Option<u64>,
    /// `MemAvailable`, bytes.
    pub memory_available_bytes: Option<u64>,
}

impl HostSample {
    /// Reads `/proc/loadavg` and `/proc/meminfo`; what cannot be read is `None`.
    pub fn read() -> Self {
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = |key: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map(|k| k.saturating_mul(1024))
        };
        HostSample {
            load1,
            cpus: std::thread::available_parallelism().ok().map(|n| n.get()),
            memory_total_bytes: kib("MemTotal:"),
            memory_available_bytes: kib("MemAvailable:"),
        }
    }
}

/// How much of the node's capacity the host lets it serve, in
/// `[FACTOR_FLOOR, 1]`:
///
/// - **CPU saturation**: `cpus / load1` when the run queue is longer than
///   the CPUs. Pre- and post-processing, tokenisation and the agent itself
///   run on the CPU; a saturated host delays all of them, and a node that
///   shares its host with other work loses capacity the GPU rate does not
///   yet show.
/// - **Memory**: from 1 at [`HOST_MEMORY_LOW`] available down to the floor
///   with none; a host about to swap or OOM-kill a worker serves nothing
///   well.
///
/// Readings that are missing count as healthy.
pub fn host_factor(host: &HostSample) -> f64 {
    let mut f = 1.0;
    if let (Some(load), Some(cpus)) = (host.load1, host.cpus) {
        if load > cpus as f64 {
            f *= cpus as f64 / load;
        }
    }
    if let (Some(total @ 1..), Some(available)) =
        (host.memory_total_bytes, host.memory_available_bytes)
    {
        let free = available as f64 / total as f64;
        if free < HOST_MEMORY_LOW {
            f *= FACTOR_FLOOR + (1.0 - FACTOR_FLOOR) * free / HOST_MEMORY_LOW;
        }
    }
    f.max(FACTOR_FLOOR)
}

/// The agent's capacity task (`weight = "auto"`): every [`TICK`], reads the
/// GPUs and the host, and folds the tick into the pool's estimates. A worker
/// pinned to a GPU (`gpu = N`) takes that GPU's factor; one that is not
/// takes the mean over the host's GPUs.
pub async fn run(gpus: Arc<dyn GpuTelemetry>, pool: Arc<Pool>) {
    let devices = gpus.devices();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tick.tick().await;
        let now = Instant::now();
        let per_gpu: Vec<(u32, f64)> = gpus
            .sample()
            .iter()
            .map(|s| {
                let total = devices
                    .iter()
                    .find(|d| d.index == s.index)
                    .map_or(0, |d| d.memory_total_bytes);
                (s.index, gpu_factor(s, total))
            })
            .collect();
        let any_gpu = if per_gpu.is_empty() {
            1.0
        } else {
            per_gpu.iter().map(|g| g.1).sum::<f64>() / per_gpu.len() as f64
        };
        let host = host_factor(&HostSample::read());
        let health: Vec<f64> = pool
            .workers()
            .iter()
            .map(|w| {
                let gpu = w
                    .spec
                    .gpu
                    .and_then(|g| per_gpu.iter().find(|p| p.0 == g))
                    .map_or(any_gpu, |p| p.1);
                gpu * host
            })
            .collect();
        pool.capacity_tick(now, now.saturating_duration_since(last), &health);
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a meter and estimator with a synthetic single-slot worker:
    /// requests of `service` back to back with `gap` between them, for
    /// `ticks` ticks. Returns the estimate.
    fn run(
        est: &mut Estimator,
        slots: usize,
        parallel: usize,
        service: Duration,
        gap: Duration,
        ticks: u32,
    ) {
        let t0 = Instant::now();
        let mut meter = Meter::default();
        let mut t = t0;
        for k in 1..=ticks {
            let end = t0 + TICK * k;
            while t + service <= end {
                for _ in 0..parallel {
                    meter.start(t);
                }
                t += service;
                for _ in 0..parallel {
                    meter.finish(t);
                }
                t += gap;
            }
            est.observe(meter.take(end), TICK, slots);
        }
    }

    #[test]
    fn one_slot_is_completions_over_busy_at_any_load() {
        let ms = Duration::from_millis;
        for gap in [ms(0), ms(10), ms(90)] {
            let mut e = Estimator::default();
            run(&mut e, 1, 1, ms(10), gap, 20);
            let c = e.capacity().unwrap();
            assert!((c - 100.0).abs() < 1.0, "gap {gap:?}: {c}");
        }
    }

    #[test]
    fn the_ratio_of_speeds_is_kept() {
        let ms = Duration::from_millis;
        let mut fast = Estimator::default();
        let mut slow = Estimator::default();
        run(&mut fast, 1, 1, ms(2), ms(3), 20);
        run(&mut slow, 1, 1, ms(20), ms(1), 20);
        let ratio = fast.capacity().unwrap() / slow.capacity().unwrap();
        assert!((ratio - 10.0).abs() < 0.2, "{ratio}");
    }

    #[test]
    fn several_slots_count_each_free_slot() {
        // A 4-slot worker at low load (one request at a time) and at full
        // load (four at a time): 4 / 10 ms either way; the busy ratio alone
        // would say 100/s at low load.
        let ms = Duration::from_millis;
        let mut low = Estimator::default();
        run(&mut low, 4, 1, ms(10), ms(30), 20);
        let mut full = Estimator::default();
        run(&mut full, 4, 4, ms(10), ms(0), 20);
        for e in [low, full] {
            assert!((e.capacity().unwrap() - 400.0).abs() < 4.0, "{e:?}");
        }
        // Slots that do not run in parallel: four in flight take four times
        // as long, and the estimate falls to the real 100/s.
        let mut serial = Estimator::default();
        run(&mut serial, 4, 4, ms(40), ms(0), 20);
        assert!((serial.capacity().unwrap() - 100.0).abs() < 1.0);
    }

    #[test]
    fn no_estimate_before_data_and_idle_holds() {
        let ms = Duration::from_millis;
        let mut e = Estimator::default();
        assert_eq!(e.capacity(), None);
        // Seven completions: not yet.
        let t0 = Instant::now();
        let mut m = Meter::default();
        for i in 0..7u32 {
            m.start(t0 + ms(10) * (2 * i));
            m.finish(t0 + ms(10) * (2 * i + 1));
        }
        e.observe(m.take(t0 + TICK), TICK, 1);
        assert_eq!(e.capacity(), None);
        run(&mut e, 1, 1, ms(10), ms(10), 5);
        let before = e.capacity().unwrap();
        // A minute without traffic changes nothing.
        for k in 0..60u32 {
            e.observe(m.take(t0 + TICK * (k + 10)), TICK, 1);
        }
        assert_eq!(e.capacity(), Some(before));
    }

    #[test]
    fn a_slowdown_shows_within_a_few_half_lives() {
        let ms = Duration::from_millis;
        let mut e = Estimator::default();
        run(&mut e, 1, 1, ms(5), ms(0), 30);
        assert!((e.capacity().unwrap() - 200.0).abs() < 2.0);
        run(&mut e, 1, 1, ms(10), ms(0), 5);
        let mid = e.capacity().unwrap();
        assert!(
            mid < 150.0 && mid > 100.0,
            "half-way after one half-life: {mid}"
        );
        run(&mut e, 1, 1, ms(10), ms(0), 30);
        assert!((e.capacity().unwrap() - 100.0).abs() < 2.0);
    }

    #[test]
    fn a_stall_of_the_agent_itself_is_not_folded_in() {
        let mut est = Estimator::default();
        run(&mut est, 1, 1, Duration::from_millis(2), Duration::ZERO, 10);
        let before = est.capacity().unwrap();
        // Four requests in flight across an 8 s stop of the agent: one 9 s
        // tick with 32 request-seconds and four completions.
        let stalled = Sample {
            completions: 4,
            in_flight_secs: 32.0,
        };
        est.observe(stalled, Duration::from_secs(9), 1);
        assert_eq!(est.capacity(), Some(before));
        // A slow tick of normal length still counts.
        est.observe(stalled, TICK, 1);
        assert!(est.capacity().unwrap() < before);
    }

    #[test]
    fn a_request_in_flight_across_ticks_counts_in_each() {
        let t0 = Instant::now();
        let mut m = Meter::default();
        m.start(t0);
        assert_eq!(m.take(t0 + TICK).in_flight_secs, 1.0);
        m.finish(t0 + TICK + TICK / 2);
        let s = m.take(t0 + TICK * 2);
        assert_eq!(s.completions, 1);
        assert_eq!(s.in_flight_secs, 0.5);
    }

    #[test]
    fn the_node_sums_ready_workers_and_fills_unmeasured_ones() {
        assert_eq!(node_capacity([]), 0.0);
        // Nothing measured: the prior per slot of each ready worker.
        assert_eq!(
            node_capacity([(None, true, 1.0, 4), (None, false, 1.0, 1)]),
            4.0 * PRIOR_PER_SLOT
        );
        // One measured (100/s over 2 slots): the other counts at 50/s a slot.
        assert_eq!(
            node_capacity([(Some(100.0), true, 1.0, 2), (None, true, 1.0, 4)]),
            300.0
        );
        // Not ready: not counted; health scales each worker.
        assert_eq!(
            node_capacity([(Some(100.0), true, 0.5, 1), (Some(300.0), false, 1.0, 1)]),
            50.0
        );
    }

    #[test]
    fn gpu_factor_per_reading() {
        let total = 80u64 << 30;
        let healthy = GpuSample {
            memory_used_bytes: total / 2,
            throttle_reasons: throttle::SW_POWER_CAP | throttle::GPU_IDLE,
            ..Default::default()
        };
        assert_eq!(gpu_factor(&healthy, total), 1.0);
        for bit in [
            throttle::HW_SLOWDOWN,
            throttle::SW_THERMAL_SLOWDOWN,
            throttle::HW_THERMAL_SLOWDOWN,
            throttle::HW_POWER_BRAKE_SLOWDOWN,
        ] {
            let hot = GpuSample {
                throttle_reasons: bit,
                ..healthy.clone()
            };
            assert_eq!(gpu_factor(&hot, total), SLOWDOWN_FACTOR);
        }
        let ecc = GpuSample {
            ecc_uncorrected: 1,
            ..healthy.clone()
        };
        assert_eq!(gpu_factor(&ecc, total), ECC_FACTOR);
        let at = |share: f64| {
            gpu_factor(
                &GpuSample {
                    memory_used_bytes: (total as f64 * share) as u64,
                    ..healthy.clone()
                },
                total,
            )
        };
        assert_eq!(at(0.9), 1.0);
        assert!((at(0.95) - (1.0 + FACTOR_FLOOR) / 2.0).abs() < 1e-6);
        assert_eq!(at(1.0), FACTOR_FLOOR);
        // Everything at once stays at the floor; unknown totals are ignored.
        let worst = GpuSample {
            memory_used_bytes: total,
            ecc_uncorrected: 3,
            throttle_reasons: throttle::HW_SLOWDOWN,
            ..Default::default()
        };
        assert_eq!(gpu_factor(&worst, total), FACTOR_FLOOR);
        assert_eq!(gpu_factor(&healthy, 0), 1.0);
    }

    #[test]
    fn host_factor_per_reading() {
        let gib = 1u64 << 30;
        let calm = HostSample {
            load1: Some(3.0),
            cpus: Some(8),
            memory_total_bytes: Some(64 * gib),
            memory_available_bytes: Some(32 * gib),
        };
        assert_eq!(host_factor(&calm), 1.0);
        assert_eq!(host_factor(&HostSample::default()), 1.0);
        let busy = HostSample {
            load1: Some(16.0),
            ..calm
        };
        assert_eq!(host_factor(&busy), 0.5);
        let swamped = HostSample {
            load1: Some(1000.0),
            ..calm
        };
        assert_eq!(host_factor(&swamped), FACTOR_FLOOR);
        let tight = HostSample {
            memory_available_bytes: Some(0),
            ..calm
        };
        assert_eq!(host_factor(&tight), FACTOR_FLOOR);
        let edge = HostSample {
            memory_available_bytes: Some((64.0 * gib as f64 * HOST_MEMORY_LOW) as u64),
            ..calm
        };
        assert!((host_factor(&edge) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn reads_this_host() {
        let h = HostSample::read();
        assert!(h.cpus.is_some_and(|n| n > 0));
        assert!(h.memory_total_bytes.is_some_and(|t| t > 0));
    }
}
