//! The real backend: NVML through `nvml-wrapper`.
//!
//! `nvml-wrapper` loads `libnvidia-ml.so.1` with `dlopen` when [`NvmlTelemetry::open`]
//! runs, not at link time, so one binary runs on GPU hosts and on machines
//! without the NVIDIA driver (where `open` returns [`GpuError::Unavailable`]).
//!
//! Samples and process lists are read on demand; fault events come from a
//! watcher thread
//! (`nvml/watcher.rs`), which needs Linux: elsewhere no events are reported.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use tokio::sync::broadcast;

use crate::telemetry::EVENT_CAPACITY;
use crate::{
    GpuDevice, GpuError, GpuEvent, GpuProcess, GpuSample, GpuTelemetry, MigDevice, MpsStatus,
};

/// Per-process utilization is averaged over the driver's samples of this
/// last stretch of time.
const PROCESS_UTILIZATION_WINDOW: Duration = Duration::from_secs(5);

mod mig;
#[cfg(target_os = "linux")]
mod watcher;

/// GPU telemetry from NVML (backend `"nvml"`).
///
/// Dropping it stops the watcher thread within about a second; NVML is shut
/// down when the thread has let go of it.
#[derive(Debug)]
pub struct NvmlTelemetry {
    nvml: Arc<Nvml>,
    devices: Vec<GpuDevice>,
    events: broadcast::Sender<GpuEvent>,
    stop: Arc<AtomicBool>,
    mig_warnings: mig::MigWarnings,
}

impl NvmlTelemetry {
    /// Load NVML, enumerate the devices and start the event watcher.
    ///
    /// Fails with [`GpuError::Unavailable`] when the library or driver is
    /// missing, and [`GpuError::Nvml`] when NVML is there but unusable.
    /// A device that cannot be read is left out with a warning.
    pub fn open() -> Result<Self, GpuError> {
        let nvml = Arc::new(Nvml::init().map_err(gpu_error)?);
        let count = nvml.device_count().map_err(gpu_error)?;
        let devices: Vec<GpuDevice> = (0..count)
            .filter_map(|index| match describe(&nvml, index) {
                Ok(device) => Some(device),
                Err(error) => {
                    tracing::warn!(index, %error, "GPU cannot be read; leaving it out");
                    None
                }
            })
            .collect();

        let events = broadcast::channel(EVENT_CAPACITY).0;
        let stop = Arc::new(AtomicBool::new(false));
        #[cfg(target_os = "linux")]
        {
            let watcher = watcher::Watcher {
                nvml: Arc::clone(&nvml),
                indices: devices.iter().map(|d| d.index).collect(),
                events: events.clone(),
                stop: Arc::clone(&stop),
            };
            std::thread::Builder::new()
                .name("nvml-events".into())
                .spawn(move || watcher.run())
                .map_err(|e| GpuError::Nvml(format!("cannot start the event thread: {e}")))?;
        }
        #[cfg(not(target_os = "linux"))]
        tracing::warn!("NVML fault events need Linux; GPU telemetry will report none");

        Ok(Self {
            nvml,
            devices,
            events,
            stop,
            mig_warnings: mig::MigWarnings::default(),
        })
    }
}

impl Drop for NvmlTelemetry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl GpuTelemetry for NvmlTelemetry {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
    }

    fn sample(&self) -> Vec<GpuSample> {
        self.devices
            .iter()
            .filter_map(|device| match read_sample(&self.nvml, device.index) {
                Ok(sample) => Some(sample),
                Err(error) => {
                    tracing::debug!(index = device.index, %error, "GPU sample failed");
                    None
                }
            })
            .collect()
    }

    fn processes(&self) -> Vec<GpuProcess> {
        // The driver stamps its utilization samples with the CPU clock in µs.
        let since = SystemTime::now()
            .checked_sub(PROCESS_UTILIZATION_WINDOW)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_micros() as u64);
        self.devices
            .iter()
            .flat_map(
                |device| match read_processes(&self.nvml, device.index, since) {
                    Ok(processes) => processes,
                    Err(error) => {
                        tracing::debug!(index = device.index, %error, "GPU process list failed");
                        Vec::new()
                    }
                },
            )
            .collect()
    }

    fn mig_devices(&self) -> Vec<MigDevice> {
        let indices: Vec<u32> = self.devices.iter().map(|d| d.index).collect();
        mig::mig_devices(&self.nvml, &indices, &self.mig_warnings)
    }

    fn mps(&self, index: u32, pipe_directory: &Path) -> MpsStatus {
        mig::mps(&self.nvml, index, pipe_directory)
    }

    fn subscribe(&self) -> broadcast::Receiver<GpuEvent> {
        self.events.subscribe()
    }

    fn inject(&self, _event: GpuEvent) -> Result<(), GpuError> {
        Err(GpuError::NotSupported(
            "injecting GPU events needs the fake backend",
        ))
    }
}

/// Sorts NVML's errors into "no NVIDIA stack here" and "NVML failed".
fn gpu_error(error: NvmlError) -> GpuError {
    match error {
        // The inner error carries the useful text, e.g.
        // "libnvidia-ml.so.1: cannot open shared object file: ...".
        NvmlError::LibloadingError(e) => GpuError::Unavailable(e.to_string()),
        NvmlError::LibraryNotFound
        | NvmlError::DriverNotLoaded
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_) => GpuError::Unavailable(error.to_string()),
        other => GpuError::Nvml(other.to_string()),
    }
}

fn describe(nvml: &Nvml, index: u32) -> Result<GpuDevice, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let cc = device.cuda_compute_capability()?;
    Ok(GpuDevice {
        index,
        uuid: device.uuid()?,
        // Only Xid lines need it: a device without it is still watched.
        pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        name: device.name()?,
        memory_total_bytes: device.memory_info()?.total,
        compute_capability: (cc.major, cc.minor),
    })
}

/// Reads one device; a counter the device lacks (ECC, power) reads as 0.
fn read_sample(nvml: &Nvml, index: u32) -> Result<GpuSample, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let memory = device.memory_info()?;
    let ecc = |kind| {
        device
            .total_ecc_errors(kind, EccCounter::Volatile)
            .unwrap_or(0)
    };
    Ok(GpuSample {
        index,
        utilization_pct: device.utilization_rates().map(|u| u.gpu).unwrap_or(0),
        memory_used_bytes: memory.used,
        temperature_c: device.temperature(TemperatureSensor::Gpu).unwrap_or(0),
        power_mw: device.power_usage().unwrap_or(0),
        ecc_corrected: ecc(MemoryError::Corrected),
        ecc_uncorrected: ecc(MemoryError::Uncorrected),
        // The raw bitmask: the same bits as `crate::throttle` (NVML's ABI).
        throttle_reasons: device
            .current_throttle_reasons()
            .map(|r| r.bits())
            .unwrap_or(0),
    })
}

/// The compute and graphics processes of one device, with the memory
/// each holds and, where the driver samples it, its SM utilization
/// averaged over the samples taken since `since_us` (µs since the epoch).
fn read_processes(nvml: &Nvml, index: u32, since_us: u64) -> Result<Vec<GpuProcess>, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let compute = device.running_compute_processes()?;
    let graphics = device.running_graphics_processes().unwrap_or_default();
    let mut by_pid: BTreeMap<u32, GpuProcess> = BTreeMap::new();
    for p in compute.into_iter().chain(graphics) {
        let memory = match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        let entry = by_pid.entry(p.pid).or_insert(GpuProcess {
            gpu: index,
            pid: p.pid,
            memory_bytes: None,
            sm_util_pct: None,
        });
        // In both lists it is one context: the larger figure is its memory.
        entry.memory_bytes = entry.memory_bytes.max(memory);
    }
    // Not every GPU samples per process (NotSupported), and none may have
    // been taken since `since_us` (NotFound): utilization stays unknown.
    if let Ok(samples) = device.process_utilization_stats(since_us) {
        let mut sums: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for s in samples {
            let sum = sums.entry(s.pid).or_default();
            sum.0 += u64::from(s.sm_util);
            sum.1 += 1;
        }
        for (pid, (total, n)) in sums {
            if let Some(p) = by_pid.get_mut(&pid) {
                p.sm_util_pct = Some(u32::try_from(total / n.max(1)).unwrap_or(100).min(100));
            }
        }
    }
    Ok(by_pid.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_are_nvmls() {
        use nvml_wrapper::bitmasks::device::ThrottleReasons as R;

        use crate::throttle;
        for (ours, nvml) in [
            (throttle::GPU_IDLE, R::GPU_IDLE),
            (
                throttle::APPLICATIONS_CLOCKS_SETTING,
                R::APPLICATIONS_CLOCKS_SETTING,
            ),
            (throttle::SW_POWER_CAP, R::SW_POWER_CAP),
            (throttle::HW_SLOWDOWN, R::HW_SLOWDOWN),
            (throttle::SYNC_BOOST, R::SYNC_BOOST),
            (throttle::SW_THERMAL_SLOWDOWN, R::SW_THERMAL_SLOWDOWN),
            (throttle::HW_THERMAL_SLOWDOWN, R::HW_THERMAL_SLOWDOWN),
            (
                throttle::HW_POWER_BRAKE_SLOWDOWN,
                R::HW_POWER_BRAKE_SLOWDOWN,
            ),
            (throttle::DISPLAY_CLOCK_SETTING, R::DISPLAY_CLOCK_SETTING),
        ] {
            assert_eq!(ours, nvml.bits());
        }
    }

    #[test]
    fn open_fails_cleanly_without_a_driver() {
        // CI and development machines have no NVIDIA driver; on a GPU host
        // this checks that opening works and finds devices.
        match NvmlTelemetry::open() {
            Ok(nvml) => {
                assert_eq!(nvml.backend(), "nvml");
                assert_eq!(nvml.sample().len(), nvml.devices().len());
                for device in nvml.devices() {
                    assert!(
                        crate::PciAddress::parse(&device.pci_bus_id).is_some(),
                        "{}",
                        device.pci_bus_id
                    );
                }
                for p in nvml.processes() {
                    assert!(p.pid > 0);
                }
                for m in nvml.mig_devices() {
                    assert!(m.uuid.starts_with("MIG-"), "{}", m.uuid);
                    assert!(nvml.devices().iter().any(|d| d.index == m.parent));
                }
            }
            Err(GpuError::Unavailable(reason)) => assert!(!reason.is_empty()),
            Err(other) => assert!(matches!(other, GpuError::Nvml(_)), "{other:?}"),
        }
    }

    #[test]
    fn missing_driver_is_unavailable_and_other_failures_are_nvml() {
        assert!(matches!(
            gpu_error(NvmlError::DriverNotLoaded),
            GpuError::Unavailable(_)
        ));
        assert!(matches!(
            gpu_error(NvmlError::LibraryNotFound),
            GpuError::Unavailable(_)
        ));
        assert!(matches!(
            gpu_error(NvmlError::NoPermission),
            GpuError::Nvml(_)
        ));
        assert!(matches!(
            gpu_error(NvmlError::LibRmVersionMismatch),
            GpuError::Nvml(_)
        ));
    }
}
