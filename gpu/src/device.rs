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
