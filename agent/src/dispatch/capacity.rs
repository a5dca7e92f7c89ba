//! Live capacity (`weight = "auto"`): what each worker can serve, as its
//! adaptive concurrency limit measures it, scaled by the health of its GPU
//! and of the host. Sans-IO: every function takes the readings as arguments.
//!
//! **Per worker.** [`crate::worker::concurrency`] learns how many requests the
//! worker serves at once and its latency with nothing else in flight; their
//! quotient is its capacity in requests per second (its throughput when
//! saturated), whatever its `max_inflight`. It is known as soon as both
//! are: the worker's own account of its parallelism (Triton's ModelConfig)
//! is the starting point before load, the concurrency measured under load
//! replaces it, and an idle worker keeps its last figures (an idle node is
//! not a node without capacity; they are kept across restarts, too).
//!
//! **Before data.** A worker with no capacity yet counts at the mean capacity
//! per unit of concurrency of the node's measured workers × its own
//! concurrency (1 while unknown), or at [`PRIOR_PER_SLOT`] per unit on a node
//! with none measured (10 ms per request, the order of GPU inference). The
//! prior must be of the order of its measured peers': a fresh node
//! advertising 1 among nodes advertising thousands would get one request in
//! thousands and take minutes to be measured; one in the right order gets
//! its share (ramped by the client's slow start) and is measured within a
//! second or two.
//!
//! **Health.** The node's weight is the sum over ready workers of
//! `capacity × gpu_factor(worker's GPU) × host_factor`; see [`gpu_factor`]
//! and [`host_factor`] for each factor and why.

use std::time::Duration;

use infermesh_gpu::{GpuSample, throttle};

/// How often the capacity task reads the GPUs and the host.
pub const TICK: Duration = Duration::from_secs(1);

/// Capacity counted per unit of concurrency of a worker with no estimate on
/// a node without any, in requests per second (10 ms per request).
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

/// The node's capacity: the sum over `workers` (each `(capacity, ready,
/// health factor, concurrency)`) of the ready ones, unmeasured ones counted
/// at the mean capacity per unit of concurrency of the measured ones, or
/// [`PRIOR_PER_SLOT`], × their concurrency.
pub fn node_capacity<I>(workers: I) -> f64
where
    I: IntoIterator<Item = (Option<f64>, bool, f64, f64)>,
    I::IntoIter: Clone,
{
    let workers = workers.into_iter();
    let (sum, units) = workers
        .clone()
        .filter_map(|w| Some((w.0?, w.3)))
        .fold((0.0, 0.0), |(s, n), (c, k)| (s + c, n + k.max(1e-9)));
    let per_unit = if units <= 0.0 {
        PRIOR_PER_SLOT
    } else {
        sum / units
    };
    workers
        .filter(|w| w.1)
        .map(|(capacity, _, factor, concurrency)| {
            capacity.unwrap_or(per_unit * concurrency.max(1.0)) * factor
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_sums_ready_workers_and_fills_unmeasured_ones() {
        assert_eq!(node_capacity([]), 0.0);
        // Nothing measured: the prior per unit of concurrency of each
        // ready worker (1 while its concurrency is unknown).
        assert_eq!(
            node_capacity([(None, true, 1.0, 4.0), (None, false, 1.0, 1.0)]),
            4.0 * PRIOR_PER_SLOT
        );
        // One measured (100/s at a concurrency of 2): the other counts at
        // 50/s a unit.
        assert_eq!(
            node_capacity([(Some(100.0), true, 1.0, 2.0), (None, true, 1.0, 4.0)]),
            300.0
        );
        // Not ready: not counted; health scales each worker.
        assert_eq!(
            node_capacity([
                (Some(100.0), true, 0.5, 1.0),
                (Some(300.0), false, 1.0, 1.0)
            ]),
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
