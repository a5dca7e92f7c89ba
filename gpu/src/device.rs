//! What the telemetry reports: devices, samples and fault events.

use serde::Serialize;

/// A GPU as enumerated at start-up.
///
/// `index` is NVML's index, which follows PCI bus order. CUDA numbers devices
/// fastest-first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID` is set, so pin workers
/// by `uuid` (or set that variable) rather than trusting the two orders agree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuDevice {
    /// NVML device index.
    pub index: u32,
    /// Stable identifier, e.g. `GPU-5f1c...`; valid in `CUDA_VISIBLE_DEVICES`.
    pub uuid: String,
    /// PCI bus id as NVML gives it, e.g. `00000000:3B:00.0`: how the
    /// driver's kernel log lines name the device.
    pub pci_bus_id: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Installed framebuffer memory.
    pub memory_total_bytes: u64,
    /// CUDA compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
}

/// One reading of a device's counters. Readings the device does not support
/// (ECC on consumer parts, power on some boards) are reported as 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuSample {
    /// NVML device index, matching [`GpuDevice::index`].
    pub index: u32,
    /// Percent of the last sample period in which a kernel was running.
    pub utilization_pct: u32,
    /// Framebuffer memory in use.
    pub memory_used_bytes: u64,
    /// Die temperature.
    pub temperature_c: u32,
    /// Board power draw in milliwatts.
    pub power_mw: u32,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_corrected: u64,
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    pub ecc_uncorrected: u64,
    /// Why the clocks are held down right now: NVML's
    /// `nvmlClocksThrottleReasons` bitmask (DCGM's
    /// `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`), bits in [`throttle`].
    pub throttle_reasons: u64,
}

/// The bits of [`GpuSample::throttle_reasons`], as NVML defines them
/// (`nvml.h`, `nvmlClocksThrottleReason*`; stable ABI values).
pub mod throttle {
    /// Nothing is running on the GPU (clocks idle down).
    pub const GPU_IDLE: u64 = 0x1;
    /// Clocks held by the applications-clocks setting.
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    /// Software power cap: normal under full load.
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (clocks cut by half or more: heat, power brake).
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Held by another GPU of its sync-boost group.
    pub const SYNC_BOOST: u64 = 0x10;
    /// Software thermal slowdown (GPU or memory over its operating temperature).
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// Hardware thermal slowdown (temperature too high).
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    /// Hardware power brake (the power supply asserted it).
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    /// Display clock setting.
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// The reasons that mean the GPU is running well below its clocks for
    /// reasons outside the workload (heat, power delivery), as opposed to
    /// idling or the power cap a busy GPU normally sits at.
    pub const SLOWDOWN: u64 =
        HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN;

    /// Every reason with its label (`infermesh_gpu_throttle_reasons` docs).
    pub const ALL: [(u64, &str); 9] = [
        (GPU_IDLE, "gpu_idle"),
        (APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"),
        (SW_POWER_CAP, "sw_power_cap"),
        (HW_SLOWDOWN, "hw_slowdown"),
        (SYNC_BOOST, "sync_boost"),
        (SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ];
}

/// A process holding a context on a GPU (NVML's running compute and
/// graphics process lists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// Its pid, in the host's pid namespace.
    pub pid: u32,
    /// GPU memory it holds; `None` where the driver does not say (MIG,
    /// some virtualized GPUs).
    pub memory_bytes: Option<u64>,
    /// Percent of the last seconds its kernels ran on the SMs, where the
    /// driver samples it per process.
    pub sm_util_pct: Option<u32>,
}

/// What happened to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEventKind {
    /// A critical Xid error with its code; see [`crate::xid`] for the policy.
    Xid(u32),
    /// A double-bit (uncorrectable) ECC error. The policy treats it as Xid 48.
    EccDoubleBit,
}

impl GpuEventKind {
    /// The Xid code the policy classifies this event under: the code itself,
    /// or 48 (double-bit ECC error) for [`GpuEventKind::EccDoubleBit`].
    pub fn xid(self) -> u32 {
        match self {
            GpuEventKind::Xid(code) => code,
            GpuEventKind::EccDoubleBit => crate::xid::XID_DOUBLE_BIT_ECC,
        }
    }
}

/// A fault event on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuEvent {
    /// NVML device index, matching [`GpuDevice::index`].
    pub index: u32,
    /// What happened.
    pub kind: GpuEventKind,
}
