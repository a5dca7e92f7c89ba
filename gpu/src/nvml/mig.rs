//! MIG instances and MPS through NVML.
//!
//! A GPU with MIG mode on lists its instances by index
//! (`nvmlDeviceGetMaxMigDeviceCount` slots, of which the populated ones
//! answer `nvmlDeviceGetMigDeviceHandleByIndex`). A GPU without MIG answers
//! `NotSupported`, which is normal and quiet; any other failure (a driver
//! older than the call, a permission) is said once per GPU in the log and
//! the GPU is listed without instances.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;

use crate::{MigDevice, MpsStatus};

/// NVML's "MIG mode enabled" (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// GPUs whose MIG listing failed and has been logged.
#[derive(Debug, Default)]
pub(super) struct MigWarnings(Mutex<BTreeSet<u32>>);

impl MigWarnings {
    fn once(&self, index: u32, error: &NvmlError) {
        let mut warned = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if warned.insert(index) {
            tracing::warn!(
                gpu = index,
                %error,
                "cannot list this GPU's MIG instances; workers pinned to one of them cannot be checked"
            );
        }
    }
}

/// The MIG instances of the GPUs with NVML indices `indices`.
pub(super) fn mig_devices(nvml: &Nvml, indices: &[u32], warnings: &MigWarnings) -> Vec<MigDevice> {
    let mut out = Vec::new();
    for &parent in indices {
        match instances(nvml, parent) {
            Ok(mut found) => out.append(&mut found),
            Err(NvmlError::NotSupported) => {}
            Err(error) => warnings.once(parent, &error),
        }
    }
    out
}

fn instances(nvml: &Nvml, parent: u32) -> Result<Vec<MigDevice>, NvmlError> {
    let device = nvml.device_by_index(parent)?;
    if device.mig_mode()?.current != MIG_ENABLED {
        return Ok(Vec::new());
    }
    let slots = device.mig_device_count()?;
    let mut out = Vec::new();
    for index in 0..slots {
        let mig = match device.mig_device_by_index(index) {
            Ok(mig) => mig,
            // An empty slot.
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(e),
        };
        let memory = mig.memory_info()?;
        out.push(MigDevice {
            parent,
            index,
            uuid: mig.uuid()?,
            memory_total_bytes: memory.total,
            memory_used_bytes: memory.used,
        });
    }
    Ok(out)
}

/// MPS on GPU `index`: the device must take contexts, and a control
/// daemon must listen in `pipe_directory`.
pub(super) fn mps(nvml: &Nvml, index: u32, pipe_directory: &Path) -> MpsStatus {
    match nvml.device_by_index(index).and_then(|d| d.compute_mode()) {
        Ok(ComputeMode::Prohibited) => {
            return MpsStatus::Absent(format!(
                "GPU {index} is in compute mode Prohibited: it takes no CUDA context"
            ));
        }
        Ok(_) => {}
        Err(e) => return MpsStatus::Absent(format!("cannot read GPU {index}: {e}")),
    }
    crate::slice::control_pipe(pipe_directory)
}
