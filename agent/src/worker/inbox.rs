//! What the rest of the agent tells a worker's supervisor.
//!
//! Two kinds of input with different guarantees:
//!
//! - **Control** — an operator's restart, a GPU fault (restart or
//!   quarantine), drain, a health round's verdicts, a request to run health
//!   checks now. Rare and each one matters, so they travel on an unbounded
//!   channel that never drops them, and the supervisor takes them before
//!   anything else.
//! - **Reports** about one process — failed requests, a fault line in its
//!   output. These can arrive by the thousand when a GPU dies, and the
//!   sentinel only needs to know *that* they happened: they are coalesced
//!   into a counter and the first fault line per process, plus one wake-up.
//!   A flood of them can neither fill memory nor push a control message out.

use std::sync::{Arc, Mutex, PoisonError};

use infermesh_health::Verdict;
use infermesh_sentinel::Event;
use tokio::sync::{Notify, mpsc, oneshot};

/// Processes whose reports are kept apart at once; reports about older
/// ones are dropped (they are about processes long replaced).
const TRACKED_PIDS: usize = 4;
/// Longest fault line kept, in bytes.
const FAULT_LINE_BYTES: usize = 1024;
/// Request errors fed to the sentinel per wake-up at most: more says
/// nothing more (its error burst is far smaller).
pub const MAX_ERRORS_PER_WAKE: u32 = 1024;

/// A control message: never dropped.
#[derive(Debug)]
pub enum Control {
    /// An event for the sentinel (operator restart, GPU fault, drain, ...).
    Sentinel(Event),
    /// An event about one process (a health round's verdict on it); dropped
    /// if that process is no longer the current one.
    Process {
        /// The process.
        pid: u32,
        /// The event.
        event: Event,
    },
    /// Run the worker's health checks now and answer with the verdicts
    /// (empty if the worker is not serving).
    RunHealthChecks(oneshot::Sender<Vec<Verdict>>),
}

/// Coalesced reports about one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessReports {
    /// The process.
    pub pid: u32,
    /// Requests that failed with an internal error since the last take.
    pub errors: u32,
    /// The first output line that matched a fault pattern: (pattern, line).
    pub fault: Option<(String, String)>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Oldest first; at most [`TRACKED_PIDS`].
    by_pid: Vec<ProcessReports>,
}

impl Pending {
    fn entry(&mut self, pid: u32) -> &mut ProcessReports {
        if let Some(i) = self.by_pid.iter().position(|r| r.pid == pid) {
            return &mut self.by_pid[i];
        }
        if self.by_pid.len() == TRACKED_PIDS {
            self.by_pid.remove(0);
        }
        self.by_pid.push(ProcessReports {
            pid,
            ..Default::default()
        });
        self.by_pid.last_mut().expect("just pushed")
    }
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
}

/// Sends to one worker's supervisor. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reporter {
    control: mpsc::UnboundedSender<Control>,
    shared: Arc<Shared>,
}

/// The supervisor's receiving end.
#[derive(Debug)]
pub struct Inbox {
    control: mpsc::UnboundedReceiver<Control>,
    shared: Arc<Shared>,
}

/// What [`Inbox::recv`] returns.
#[derive(Debug)]
pub enum Input {
    /// A control message.
    Control(Control),
    /// Coalesced reports, per process, oldest process first.
    Reports(Vec<ProcessReports>),
    /// Every reporter is gone (the agent is being torn down).
    Closed,
}

/// A connected reporter and inbox.
pub fn channel() -> (Reporter, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::default());
    (
        Reporter {
            control: tx,
            shared: Arc::clone(&shared),
        },
        Inbox {
            control: rx,
            shared,
        },
    )
}

impl Reporter {
    /// Sends a control message. It is only lost if the supervisor has
    /// already ended, in which case there is nobody to act on it.
    pub fn control(&self, c: Control) {
        let _ = self.control.send(c);
    }

    /// Counts a request that failed with an internal error on `pid`.
    pub fn request_error(&self, pid: u32) {
        self.update(pid, |r| r.errors = r.errors.saturating_add(1));
    }

    /// Reports an output line of `pid` that matched `pattern`. Only the
    /// first per process is kept: one is enough to fail it.
    pub fn fault_line(&self, pid: u32, pattern: &str, line: &str) {
        self.update(pid, |r| {
            if r.fault.is_none() {
                r.fault = Some((pattern.to_string(), truncate(line, FAULT_LINE_BYTES)));
            }
        });
    }

    fn update(&self, pid: u32, f: impl FnOnce(&mut ProcessReports)) {
        {
            let mut p = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            f(p.entry(pid));
        }
        // Stores a permit if the supervisor is not waiting: never lost.
        self.shared.wake.notify_one();
    }
}

fn truncate(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

impl Inbox {
    /// The next input: control messages first, then coalesced reports.
    pub async fn recv(&mut self) -> Input {
        // Reports that are already pending must not wait behind a wake-up
        // that was consumed earlier, so look before sleeping.
        loop {
            tokio::select! {
                biased;
                c = self.control.recv() => return match c {
                    Some(c) => Input::Control(c),
                    None => Input::Closed,
                },
                _ = self.shared.wake.notified() => {
                    let taken = std::mem::take(
                        &mut *self.shared.pending.lock().unwrap_or_else(PoisonError::into_inner),
                    );
                    if !taken.by_pid.is_empty() {
                        return Input::Reports(taken.by_pid);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infermesh_sentinel::GpuFaultSeverity;

    #[tokio::test]
    async fn a_flood_of_errors_is_one_report_and_control_comes_first() {
        let (reporter, mut inbox) = channel();
        for _ in 0..100_000 {
            reporter.request_error(7);
        }
        reporter.control(Control::Sentinel(Event::GpuFault {
            xid: 79,
            severity: GpuFaultSeverity::Quarantine,
            pid: None,
        }));
        for _ in 0..100_000 {
            reporter.request_error(7);
        }
        match inbox.recv().await {
            Input::Control(Control::Sentinel(Event::GpuFault { xid: 79, .. })) => {}
            other => panic!("control first, got {other:?}"),
        }
        match inbox.recv().await {
            Input::Reports(r) => assert_eq!(
                r,
                vec![ProcessReports {
                    pid: 7,
                    errors: 200_000,
                    fault: None
                }]
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn first_fault_line_per_process_is_kept_and_bounded() {
        let (reporter, mut inbox) = channel();
        let long = "x".repeat(10_000);
        reporter.fault_line(1, "CUDA error", &format!("CUDA error {long}"));
        reporter.fault_line(1, "NCCL error", "NCCL error later");
        match inbox.recv().await {
            Input::Reports(r) => {
                let (pattern, line) = r[0].fault.clone().unwrap();
                assert_eq!(pattern, "CUDA error");
                assert!(line.len() <= FAULT_LINE_BYTES + '…'.len_utf8());
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn reports_about_many_processes_stay_bounded() {
        let (reporter, mut inbox) = channel();
        for pid in 0..1000 {
            reporter.request_error(pid);
        }
        match inbox.recv().await {
            Input::Reports(r) => {
                assert_eq!(r.len(), TRACKED_PIDS);
                assert_eq!(r.last().unwrap().pid, 999);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn closed_when_every_reporter_is_gone() {
        let (reporter, mut inbox) = channel();
        drop(reporter);
        assert!(matches!(inbox.recv().await, Input::Closed));
    }
}
