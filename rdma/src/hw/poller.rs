//! The completion poller: one thread per device drains the CQ and sends
//! each work completion to the task waiting for it.
//!
//! While work is outstanding it spins briefly, then polls every 20 µs; with
//! nothing outstanding it parks until a post wakes it (or 100 ms pass).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};
use std::time::Duration;

use sideway::ibverbs::completion::{
    ExtendedCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use tokio::sync::oneshot;

use crate::RdmaError;
use crate::verbs::{Completion, WcStatus, WorkRequest};

/// A posted work request waiting for its completion.
pub(super) struct Pending {
    pub wr: WorkRequest,
    pub reply: oneshot::Sender<Completion>,
    pub qpn: u32,
    /// Set when a completion for this queue pair fails (it is then in the
    /// error state).
    pub broken: Arc<AtomicBool>,
}

/// Pending work by `wr_id`, shared by the posting side and the thread.
#[derive(Default)]
pub(super) struct PendingTable {
    table: Mutex<HashMap<u64, Pending>>,
}

impl PendingTable {
    pub(super) fn insert(&self, wr_id: u64, pending: Pending) {
        self.lock().insert(wr_id, pending);
    }

    pub(super) fn remove(&self, wr_id: u64) -> Option<Pending> {
        self.lock().remove(&wr_id)
    }

    /// Removes everything posted on `qpn` (it was destroyed: the device
    /// will not complete it).
    pub(super) fn remove_qp(&self, qpn: u32) -> Vec<Pending> {
        let mut table = self.lock();
        let ids: Vec<u64> = table
            .iter()
            .filter(|(_, p)| p.qpn == qpn)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| table.remove(id)).collect()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The poller thread's handle; stops it on drop.
pub(super) struct Poller {
    pub pending: Arc<PendingTable>,
    stop: Arc<AtomicBool>,
    thread: Thread,
}

impl Poller {
    pub(super) fn start(cq: Arc<ExtendedCompletionQueue>, device: &str) -> Result<Self, RdmaError> {
        let pending = Arc::new(PendingTable::default());
        let stop = Arc::new(AtomicBool::new(false));
        let handle = thread::Builder::new()
            .name(format!("rdma-cq-{device}"))
            .spawn({
                let pending = Arc::clone(&pending);
                let stop = Arc::clone(&stop);
                move || run(&cq, &pending, &stop)
            })?;
        Ok(Poller {
            pending,
            stop,
            thread: handle.thread().clone(),
        })
    }

    /// Wakes the thread after a post.
    pub(super) fn wake(&self) {
        self.thread.unpark();
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

fn run(cq: &ExtendedCompletionQueue, pending: &PendingTable, stop: &AtomicBool) {
    let mut idle_polls = 0u32;
    let mut done = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match cq.start_poll() {
            Ok(poller) => {
                for wc in poller {
                    done.push((wc.wr_id(), wc.status(), wc.vendor_err()));
                }
            }
            Err(PollCompletionQueueError::CompletionQueueEmpty) => {}
            Err(e) => {
                tracing::warn!(error = %e, "polling the RDMA completion queue failed");
                thread::sleep(Duration::from_millis(1));
            }
        }
        if done.is_empty() {
            if pending.is_empty() {
                thread::park_timeout(Duration::from_millis(100));
            } else if idle_polls < 1000 {
                idle_polls += 1;
                std::hint::spin_loop();
            } else {
                thread::sleep(Duration::from_micros(20));
            }
            continue;
        }
        idle_polls = 0;
        for (wr_id, raw_status, vendor_err) in done.drain(..) {
            let Some(p) = pending.remove(wr_id) else {
                continue;
            };
            let status = wc_status(raw_status);
            let detail = (status != WcStatus::Success).then(|| {
                p.broken.store(true, Ordering::Release);
                format!("{status:?} (vendor error {vendor_err:#x})")
            });
            let _ = p.reply.send(Completion::new(p.wr, status, detail));
        }
    }
}

/// Maps a raw `ibv_wc_status` without sideway's panicking conversion.
fn wc_status(raw: u32) -> WcStatus {
    use WorkCompletionStatus as S;
    let is = |s: S| raw == s as u32;
    if is(S::Success) {
        WcStatus::Success
    } else if is(S::LocalLengthError) {
        WcStatus::LocalLength
    } else if is(S::LocalProtectionError) {
        WcStatus::LocalProtection
    } else if is(S::LocalQueuePairOperationError) {
        WcStatus::LocalQpOperation
    } else if is(S::RemoteAccessError) {
        WcStatus::RemoteAccess
    } else if is(S::RemoteInvalidRequestError) {
        WcStatus::RemoteInvalidRequest
    } else if is(S::RemoteOperationError) {
        WcStatus::RemoteOperation
    } else if is(S::RetryCounterExceededError) {
        WcStatus::RetryExceeded
    } else if is(S::WorkRequestFlushedError) {
        WcStatus::Flushed
    } else {
        WcStatus::Other(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_raw_statuses_without_panicking() {
        use WorkCompletionStatus as S;
        assert_eq!(wc_status(S::Success as u32), WcStatus::Success);
        assert_eq!(
            wc_status(S::RemoteAccessError as u32),
            WcStatus::RemoteAccess
        );
        assert_eq!(
            wc_status(S::RetryCounterExceededError as u32),
            WcStatus::RetryExceeded
        );
        assert_eq!(
            wc_status(S::WorkRequestFlushedError as u32),
            WcStatus::Flushed
        );
        assert_eq!(wc_status(9999), WcStatus::Other(9999));
    }
}
