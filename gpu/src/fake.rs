//! A scriptable backend for tests and fault drills.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use tokio::sync::broadcast;

use crate::telemetry::EVENT_CAPACITY;
use crate::{
    GpuDevice, GpuError, GpuEvent, GpuProcess, GpuSample, GpuTelemetry, MigDevice, MpsStatus,
};

const GIB: u64 = 1 << 30;

/// What the fake backend pretends the host has, as configured
/// (`[gpu] fake_devices`, `fake_mig_devices`, `fake_mps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeSetup {
    /// GPUs, indexed from 0.
    pub devices: u32,
    /// MIG instances on each GPU (0: MIG off).
    pub mig_per_device: u32,
    /// Whether an MPS control daemon serves every GPU.
    pub mps: bool,
}

impl Default for FakeSetup {
    fn default() -> Self {
        Self {
            devices: 2,
            mig_per_device: 0,
            mps: false,
        }
    }
}

/// Fake GPUs (backend `"fake"`): fixed devices, samples and process lists
/// the test sets, and fault events delivered by [`GpuTelemetry::inject`].
///
/// Lets the agent's GPU paths (sampling, Xid handling, quarantine) run on a
/// host without a GPU, in tests and in `infermesh` fault drills.
#[derive(Debug)]
pub struct FakeTelemetry {
    devices: Vec<GpuDevice>,
    samples: Mutex<BTreeMap<u32, GpuSample>>,
    processes: Mutex<Vec<GpuProcess>>,
    mig: Mutex<Vec<MigDevice>>,
    mps: Mutex<BTreeSet<u32>>,
    events: broadcast::Sender<GpuEvent>,
}

impl FakeTelemetry {
    /// `count` devices indexed from 0, named "Fake GPU", with UUID
    /// `GPU-fake-<index>`, PCI bus id `00000000:<index + 1>:00.0` (bus in
    /// hex), 80 GiB and compute capability 9.0, each idling at a plausible
    /// utilization, temperature and power, with no processes.
    pub fn new(count: u32) -> Self {
        let devices = (0..count)
            .map(|index| GpuDevice {
                index,
                uuid: format!("GPU-fake-{index}"),
                pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
                name: "Fake GPU".to_owned(),
                memory_total_bytes: 80 * GIB,
                compute_capability: (9, 0),
            })
            .collect();
        Self::with_devices(devices)
    }

    /// The host `setup` describes: [`FakeTelemetry::new`]'s devices, each
    /// split into `mig_per_device` MIG instances named
    /// `MIG-fake-<gpu>-<instance>` (80 GiB shared equally), MPS on every GPU
    /// when `mps`.
    pub fn from_setup(setup: FakeSetup) -> Self {
        let fake = Self::new(setup.devices);
        let per = setup.mig_per_device;
        let mig = (0..setup.devices)
            .flat_map(|parent| {
                (0..per).map(move |index| MigDevice {
                    parent,
                    index,
                    uuid: format!("MIG-fake-{parent}-{index}"),
                    memory_total_bytes: 80 * GIB / u64::from(per),
                    memory_used_bytes: 0,
                })
            })
            .collect();
        fake.set_mig_devices(mig);
        for index in 0..setup.devices {
            fake.set_mps(index, setup.mps);
        }
        fake
    }

    /// The given devices; each starts with the default plausible sample.
    pub fn with_devices(devices: Vec<GpuDevice>) -> Self {
        let samples = devices
            .iter()
            .map(|device| (device.index, idle_sample(device)))
            .collect();
        Self {
            devices,
            samples: Mutex::new(samples),
            processes: Mutex::new(Vec::new()),
            mig: Mutex::new(Vec::new()),
            mps: Mutex::new(BTreeSet::new()),
            events: broadcast::channel(EVENT_CAPACITY).0,
        }
    }

    /// Make [`GpuTelemetry::sample`] report `sample` for the device with
    /// `sample.index` from now on. A sample for an unknown index is dropped.
    pub fn set_sample(&self, sample: GpuSample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        match samples.get_mut(&sample.index) {
            Some(slot) => *slot = sample,
            None => tracing::warn!(
                index = sample.index,
                "fake GPU: no such device; sample dropped"
            ),
        }
    }

    /// Make [`GpuTelemetry::processes`] report `processes` from now on.
    pub fn set_processes(&self, processes: Vec<GpuProcess>) {
        *self
            .processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = processes;
    }

    /// Make [`GpuTelemetry::mig_devices`] report `mig` from now on.
    pub fn set_mig_devices(&self, mig: Vec<MigDevice>) {
        *self.mig.lock().unwrap_or_else(PoisonError::into_inner) = mig;
    }

    /// Say from now on whether MPS serves GPU `index` (whatever pipe
    /// directory is asked about).
    pub fn set_mps(&self, index: u32, running: bool) {
        let mut mps = self.mps.lock().unwrap_or_else(PoisonError::into_inner);
        if running {
            mps.insert(index);
        } else {
            mps.remove(&index);
        }
    }
}

fn idle_sample(device: &GpuDevice) -> GpuSample {
    GpuSample {
        index: device.index,
        utilization_pct: 0,
        memory_used_bytes: device.memory_total_bytes.min(GIB / 2),
        temperature_c: 35,
        power_mw: 70_000,
        ecc_corrected: 0,
        ecc_uncorrected: 0,
        throttle_reasons: crate::throttle::GPU_IDLE,
    }
}

impl GpuTelemetry for FakeTelemetry {
    fn backend(&self) -> &'static str {
        "fake"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
    }

    fn sample(&self) -> Vec<GpuSample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.values().cloned().collect()
    }

    fn processes(&self) -> Vec<GpuProcess> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn mig_devices(&self) -> Vec<MigDevice> {
        self.mig
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn mps(&self, index: u32, _pipe_directory: &Path) -> MpsStatus {
        if !self.devices.iter().any(|d| d.index == index) {
            return MpsStatus::Absent(format!("no GPU with index {index}"));
        }
        if self
            .mps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&index)
        {
            MpsStatus::Running
        } else {
            MpsStatus::Absent(format!(
                "no MPS control daemon serves fake GPU {index} (fake_mps = false)"
            ))
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<GpuEvent> {
        self.events.subscribe()
    }

    fn inject(&self, event: GpuEvent) -> Result<(), GpuError> {
        if !self.devices.iter().any(|d| d.index == event.index) {
            return Err(GpuError::UnknownDevice(event.index));
        }
        // With no subscriber the event is dropped, as real hardware's would be.
        let _ = self.events.send(event);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;
    use crate::GpuEventKind;

    #[test]
    fn new_lists_fake_devices() {
        let fake = FakeTelemetry::new(2);
        assert_eq!(fake.backend(), "fake");
        let devices = fake.devices();
        assert_eq!(devices.len(), 2);
        assert_eq!(
            devices[1],
            GpuDevice {
                index: 1,
                uuid: "GPU-fake-1".into(),
                pci_bus_id: "00000000:02:00.0".into(),
                name: "Fake GPU".into(),
                memory_total_bytes: 80 * GIB,
                compute_capability: (9, 0),
            }
        );
    }

    #[test]
    fn samples_are_plausible_then_scripted() {
        let fake = FakeTelemetry::new(2);
        let samples = fake.sample();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].index, 0);
        assert!(samples[0].temperature_c > 0 && samples[0].power_mw > 0);
        assert!(samples[0].memory_used_bytes < 80 * GIB);

        let hot = GpuSample {
            index: 1,
            utilization_pct: 97,
            memory_used_bytes: 70 * GIB,
            temperature_c: 88,
            power_mw: 690_000,
            ecc_corrected: 12,
            ecc_uncorrected: 1,
            throttle_reasons: crate::throttle::HW_THERMAL_SLOWDOWN,
        };
        fake.set_sample(hot.clone());
        fake.set_sample(GpuSample {
            index: 9,
            ..GpuSample::default()
        });
        let samples = fake.sample();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1], hot);
    }

    #[test]
    fn with_devices_keeps_given_indices() {
        let device = GpuDevice {
            index: 3,
            uuid: "GPU-x".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            name: "Some GPU".into(),
            memory_total_bytes: 24 * GIB,
            compute_capability: (8, 9),
        };
        let fake = FakeTelemetry::with_devices(vec![device.clone()]);
        assert_eq!(fake.devices(), vec![device]);
        assert_eq!(fake.sample()[0].index, 3);
        let event = GpuEvent {
            index: 0,
            kind: GpuEventKind::Xid(13),
        };
        assert_eq!(fake.inject(event), Err(GpuError::UnknownDevice(0)));
    }

    #[test]
    fn process_lists_are_scripted() {
        let fake = FakeTelemetry::new(1);
        assert!(fake.processes().is_empty());
        let p = GpuProcess {
            gpu: 0,
            pid: 4242,
            memory_bytes: Some(3 * GIB),
            sm_util_pct: Some(40),
        };
        fake.set_processes(vec![p.clone()]);
        assert_eq!(fake.processes(), vec![p]);
    }

    #[test]
    fn setup_lists_mig_instances_and_says_where_mps_runs() {
        let dir = Path::new("/nonexistent");
        let plain = FakeTelemetry::from_setup(FakeSetup::default());
        assert_eq!(plain.devices().len(), 2);
        assert!(plain.mig_devices().is_empty());
        assert!(matches!(plain.mps(0, dir), MpsStatus::Absent(_)));

        let sliced = FakeTelemetry::from_setup(FakeSetup {
            devices: 2,
            mig_per_device: 3,
            mps: true,
        });
        let mig = sliced.mig_devices();
        assert_eq!(mig.len(), 6);
        assert_eq!(mig[4].uuid, "MIG-fake-1-1");
        assert_eq!((mig[4].parent, mig[4].index), (1, 1));
        assert_eq!(mig[4].memory_total_bytes, 80 * GIB / 3);
        assert_eq!(sliced.mps(1, dir), MpsStatus::Running);
        assert!(matches!(sliced.mps(2, dir), MpsStatus::Absent(_)));
        sliced.set_mps(1, false);
        assert!(matches!(sliced.mps(1, dir), MpsStatus::Absent(_)));
    }

    #[test]
    fn inject_reaches_every_subscriber() {
        let fake = FakeTelemetry::new(2);
        let mut a = fake.subscribe();
        let mut b = fake.subscribe();
        let event = GpuEvent {
            index: 1,
            kind: GpuEventKind::EccDoubleBit,
        };
        fake.inject(event).unwrap();
        assert_eq!(a.try_recv(), Ok(event));
        assert_eq!(b.try_recv(), Ok(event));
        assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn inject_rejects_unknown_device_and_tolerates_no_subscriber() {
        let fake = FakeTelemetry::new(1);
        let event = GpuEvent {
            index: 1,
            kind: GpuEventKind::Xid(79),
        };
        assert_eq!(fake.inject(event), Err(GpuError::UnknownDevice(1)));
        let event = GpuEvent { index: 0, ..event };
        assert_eq!(fake.inject(event), Ok(()));
    }
}
