//! The NVML event watcher: one thread blocked in `nvmlEventSetWait`.
//!
//! NVML's event API is blocking and an event set is not `Sync`, so the
//! watcher owns the set on its own thread. It registers critical-Xid and
//! double-bit-ECC events on every device that supports them (warning once for
//! each that does not) and forwards each event to the broadcast channel.
//!
//! When the wait reports a GPU lost (fallen off the bus) the watcher finds
//! which devices no longer answer, reports each as Xid 79 (the driver may not
//! deliver that Xid itself once the device is unreachable) and goes on
//! watching the others. It stops when the telemetry is dropped or NVML fails
//! for good.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{EventSet, Nvml};
use tokio::sync::broadcast;

use crate::xid::XID_FALLEN_OFF_BUS;
use crate::{GpuEvent, GpuEventKind};

/// How long one `nvmlEventSetWait` blocks; bounds how late the watcher
/// notices that the telemetry was dropped.
const WAIT_MS: u32 = 1000;

/// Consecutive `Unknown` errors from the wait before the watcher gives up.
const MAX_UNKNOWN_ERRORS: u32 = 10;

/// NVML's stand-in for an Xid it cannot name.
const XID_UNKNOWN: u32 = 999;

fn warn_once(warned: &mut BTreeSet<u32>, index: u32, error: &str) {
    if warned.insert(index) {
        tracing::warn!(
            index,
            error,
            "GPU fault events unavailable for this GPU; skipping it"
        );
    }
}

/// The event thread's state.
pub(super) struct Watcher {
    pub(super) nvml: Arc<Nvml>,
    pub(super) indices: Vec<u32>,
    pub(super) events: broadcast::Sender<GpuEvent>,
    pub(super) stop: Arc<AtomicBool>,
}

impl Watcher {
    /// Watches until dropped telemetry or a permanent NVML error stops it.
    pub(super) fn run(self) {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut lost = BTreeSet::new();
        let mut warned = BTreeSet::new();
        // Each pass watches the devices not yet lost; a lost GPU starts a new pass.
        loop {
            let Some(set) = self.register(wanted, &lost, &mut warned) else {
                if !self.indices.is_empty() {
                    tracing::warn!(
                        "no GPU left that can report fault events; GPU event watcher stopped"
                    );
                }
                return;
            };
            let mut unknown_errors = 0;
            loop {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                match set.wait(WAIT_MS) {
                    Ok(data) => {
                        unknown_errors = 0;
                        self.forward(&data);
                    }
                    Err(NvmlError::Timeout) => unknown_errors = 0,
                    Err(NvmlError::GpuLost) => {
                        if !self.report_lost(&mut lost) {
                            tracing::warn!(
                                "a GPU was lost but none can be identified; GPU event watcher stopped"
                            );
                            return;
                        }
                        break;
                    }
                    Err(NvmlError::Unknown) if unknown_errors < MAX_UNKNOWN_ERRORS => {
                        unknown_errors += 1;
                        thread::sleep(Duration::from_millis(100));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "NVML event wait failed; GPU event watcher stopped");
                        return;
                    }
                }
            }
        }
    }

    /// An event set covering every device not in `lost`; `None` when no
    /// device can deliver events. Warns once per device that cannot.
    fn register(
        &self,
        wanted: EventTypes,
        lost: &BTreeSet<u32>,
        warned: &mut BTreeSet<u32>,
    ) -> Option<EventSet<'_>> {
        let mut skip = lost.clone();
        // A failed registration frees the whole set, so start over without
        // that device; `skip` grows on every retry, so this ends.
        'retry: loop {
            let mut set = match self.nvml.create_event_set() {
                Ok(set) => set,
                Err(error) => {
                    tracing::warn!(%error, "cannot create an NVML event set; no GPU fault events");
                    return None;
                }
            };
            let mut watched = 0;
            for &index in &self.indices {
                if skip.contains(&index) {
                    continue;
                }
                let supported = self
                    .nvml
                    .device_by_index(index)
                    .and_then(|device| Ok((device.supported_event_types()? & wanted, device)));
                let error = match supported {
                    Ok((types, device)) if !types.is_empty() => {
                        match device.register_events(types, set) {
                            Ok(registered) => {
                                set = registered;
                                watched += 1;
                                continue;
                            }
                            Err(error) => {
                                skip.insert(index);
                                warn_once(warned, index, &error.to_string());
                                continue 'retry;
                            }
                        }
                    }
                    Ok(_) => "supports neither Xid nor double-bit ECC events".to_owned(),
                    Err(error) => error.to_string(),
                };
                skip.insert(index);
                warn_once(warned, index, &error);
            }
            return (watched > 0).then_some(set);
        }
    }

    fn forward(&self, data: &EventData<'_>) {
        let index = match data.device.index() {
            Ok(index) => index,
            Err(error) => {
                tracing::warn!(%error, event = ?data.event_type, "GPU event from an unidentifiable device dropped");
                return;
            }
        };
        if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            // The policy counts NVML's "unknown Xid" as an unknown code.
            let code = match data.event_data {
                Some(XidError::Value(code)) => u32::try_from(code).unwrap_or(XID_UNKNOWN),
                Some(XidError::Unknown) | None => XID_UNKNOWN,
            };
            self.send(index, GpuEventKind::Xid(code));
        }
        if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            self.send(index, GpuEventKind::EccDoubleBit);
        }
    }

    /// Finds the devices that no longer answer, reports each as Xid 79 and
    /// adds it to `lost`; false when no newly lost device was found.
    fn report_lost(&self, lost: &mut BTreeSet<u32>) -> bool {
        let mut found = false;
        for &index in &self.indices {
            let gone = matches!(
                self.nvml
                    .device_by_index(index)
                    .and_then(|device| device.memory_info()),
                Err(NvmlError::GpuLost)
            );
            if gone && lost.insert(index) {
                tracing::error!(index, "GPU has fallen off the bus");
                self.send(index, GpuEventKind::Xid(XID_FALLEN_OFF_BUS));
                found = true;
            }
        }
        found
    }

    fn send(&self, index: u32, kind: GpuEventKind) {
        tracing::debug!(index, ?kind, "GPU fault event");
        // No subscriber yet is fine: nobody is running on the GPU to act for.
        let _ = self.events.send(GpuEvent { index, kind });
    }
}
