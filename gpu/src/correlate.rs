//! NVML's Xid events and the kernel log's Xid lines, joined into one
//! report per fault.
//!
//! The driver reports one fault twice: an NVML event (GPU and Xid, no
//! process) and a kernel log line (PCI address, Xid and, on current
//! drivers, the pid). Either may reach the agent first, and one fault may
//! log several lines (an Xid 13 logs one per faulting SM). The rules:
//!
//! - a line is reported at once, with its pid; the same (GPU, Xid, pid)
//!   again within `window` is the same fault and is dropped;
//! - an NVML event whose line was already seen within `window` is dropped;
//! - an NVML event that may name a process (an application Xid while the
//!   kernel log is read) waits up to `hold` for its line, which then
//!   replaces it; without a line by then it is reported without a pid;
//! - a line that comes after its NVML event was reported without a pid is
//!   reported as [`XidReport::late`]: act on the name, do not count the
//!   fault again.
//!
//! Sans-IO: time is passed in; [`XidCorrelator::poll_timeout`] says when
//! [`XidCorrelator::expire`] is due.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::KernelXid;

/// How long an NVML event waits for the kernel line that names its process.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(1);

/// How long reports are remembered for matching and de-duplication.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);

/// Most reports remembered; older ones are forgotten early under a storm.
const MAX_REMEMBERED: usize = 1024;

/// One fault, from either source or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidReport {
    /// NVML index of the GPU; `None` when the line's PCI address matches no
    /// known device.
    pub gpu: Option<u32>,
    /// The Xid code.
    pub xid: u32,
    /// The process (thread) the driver blamed, when a line named one.
    pub pid: Option<u32>,
    /// Its command name as the driver printed it.
    pub process: Option<String>,
    /// The rest of the driver's line, when there was one.
    pub detail: Option<String>,
    /// The line came after the fault was already reported without a pid.
    pub late: bool,
}

impl XidReport {
    fn unnamed(gpu: u32, xid: u32) -> Self {
        Self {
            gpu: Some(gpu),
            xid,
            pid: None,
            process: None,
            detail: None,
            late: false,
        }
    }

    fn from_line(gpu: Option<u32>, line: KernelXid, late: bool) -> Self {
        Self {
            gpu,
            xid: line.xid,
            pid: line.pid,
            process: line.process,
            detail: Some(line.detail),
            late,
        }
    }
}

/// Joins the two sources; see the module docs.
#[derive(Debug, Clone)]
pub struct XidCorrelator {
    hold: Duration,
    window: Duration,
    /// Lines reported recently: (when, gpu, xid, pid).
    lines: VecDeque<(Instant, Option<u32>, u32, Option<u32>)>,
    /// NVML events reported without a pid recently: (when, gpu, xid).
    unnamed: VecDeque<(Instant, u32, u32)>,
    /// NVML events waiting for their line: (deadline, gpu, xid).
    waiting: VecDeque<(Instant, u32, u32)>,
}

impl Default for XidCorrelator {
    fn default() -> Self {
        Self::new(DEFAULT_HOLD, DEFAULT_WINDOW)
    }
}

impl XidCorrelator {
    /// A correlator holding NVML events up to `hold` and remembering
    /// reports for `window`.
    pub fn new(hold: Duration, window: Duration) -> Self {
        Self {
            hold,
            window: window.max(hold),
            lines: VecDeque::new(),
            unnamed: VecDeque::new(),
            waiting: VecDeque::new(),
        }
    }

    /// An NVML Xid event on `gpu` at `now`. With `wait`, it is held for the
    /// kernel line naming its process (give it for application Xids while
    /// the kernel log is read). Returns the report to act on now, if any.
    pub fn nvml(&mut self, now: Instant, gpu: u32, xid: u32, wait: bool) -> Option<XidReport> {
        self.forget(now);
        if self
            .lines
            .iter()
            .any(|&(_, g, x, _)| g == Some(gpu) && x == xid)
        {
            return None;
        }
        if wait {
            let deadline = now.checked_add(self.hold).unwrap_or(now);
            push_bounded(&mut self.waiting, (deadline, gpu, xid));
            return None;
        }
        push_bounded(&mut self.unnamed, (now, gpu, xid));
        Some(XidReport::unnamed(gpu, xid))
    }

    /// A kernel log line at `now`; `gpu` is the device its PCI address
    /// matched. Returns the report to act on now, if any.
    pub fn kernel(&mut self, now: Instant, gpu: Option<u32>, line: KernelXid) -> Option<XidReport> {
        self.forget(now);
        let key = (gpu, line.xid, line.pid);
        if self.lines.iter().any(|&(_, g, x, p)| (g, x, p) == key) {
            return None;
        }
        push_bounded(&mut self.lines, (now, gpu, line.xid, line.pid));
        let same = |&(_, g, x): &(Instant, u32, u32)| Some(g) == gpu && x == line.xid;
        let waited = self.waiting.iter().any(same);
        self.waiting.retain(|w| !same(w));
        let late = !waited && self.unnamed.iter().any(same);
        Some(XidReport::from_line(gpu, line, late))
    }

    /// When [`XidCorrelator::expire`] must next be called, if anything waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waiting.iter().map(|&(deadline, _, _)| deadline).min()
    }

    /// The NVML events whose line did not come in time, reported without a
    /// pid.
    pub fn expire(&mut self, now: Instant) -> Vec<XidReport> {
        let mut out = Vec::new();
        let mut left = VecDeque::new();
        for (deadline, gpu, xid) in self.waiting.drain(..) {
            if deadline <= now {
                out.push((gpu, xid));
            } else {
                left.push_back((deadline, gpu, xid));
            }
        }
        self.waiting = left;
        for &(gpu, xid) in &out {
            push_bounded(&mut self.unnamed, (now, gpu, xid));
        }
        out.into_iter()
            .map(|(gpu, xid)| XidReport::unnamed(gpu, xid))
            .collect()
    }

    fn forget(&mut self, now: Instant) {
        let window = self.window;
        let old = |t: Instant| now.saturating_duration_since(t) >= window;
        while self.lines.front().is_some_and(|l| old(l.0)) {
            self.lines.pop_front();
        }
        while self.unnamed.front().is_some_and(|u| old(u.0)) {
            self.unnamed.pop_front();
        }
    }
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() == MAX_REMEMBERED {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PciAddress;

    fn line(xid: u32, pid: Option<u32>) -> KernelXid {
        KernelXid {
            pci: PciAddress {
                domain: 0,
                bus: 1,
                device: 0,
            },
            xid,
            pid,
            process: pid.map(|_| "python3".to_string()),
            detail: "Ch 00000008".into(),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_line_after_its_held_event_replaces_it() {
        let mut c = XidCorrelator::default();
        let t0 = Instant::now();
        assert_eq!(c.nvml(t0, 0, 31, true), None);
        assert_eq!(c.poll_timeout(), Some(t0 + DEFAULT_HOLD));
        let r = c
            .kernel(t0 + ms(20), Some(0), line(31, Some(3323)))
            .unwrap();
        assert_eq!(
            (r.gpu, r.xid, r.pid, r.late),
            (Some(0), 31, Some(3323), false)
        );
        assert_eq!(c.poll_timeout(), None);
        assert!(c.expire(t0 + ms(2000)).is_empty(), "one fault, one report");
    }

    #[test]
    fn an_event_after_its_line_is_dropped() {
        let mut c = XidCorrelator::default();
        let t0 = Instant::now();
        assert!(c.kernel(t0, Some(0), line(43, Some(7))).is_some());
        assert_eq!(c.nvml(t0 + ms(5), 0, 43, true), None);
        assert_eq!(c.nvml(t0 + ms(6), 0, 43, false), None);
        assert_eq!(c.poll_timeout(), None);
        // Another GPU's event is its own fault.
        assert!(c.nvml(t0 + ms(7), 1, 43, false).is_some());
    }

    #[test]
    fn an_event_without_a_line_is_reported_unnamed_after_the_hold() {
        let mut c = XidCorrelator::default();
        let t0 = Instant::now();
        assert_eq!(c.nvml(t0, 0, 31, true), None);
        assert!(c.expire(t0 + ms(999)).is_empty());
        let r = c.expire(t0 + DEFAULT_HOLD);
        assert_eq!(r, vec![XidReport::unnamed(0, 31)]);
        // Its line, late: acted on, flagged.
        let r = c.kernel(t0 + ms(1500), Some(0), line(31, Some(9))).unwrap();
        assert!(r.late);
        assert_eq!(r.pid, Some(9));
    }

    #[test]
    fn events_not_held_are_reported_at_once() {
        let mut c = XidCorrelator::default();
        let r = c.nvml(Instant::now(), 2, 79, false).unwrap();
        assert_eq!(r, XidReport::unnamed(2, 79));
    }

    #[test]
    fn repeated_lines_of_one_fault_are_one_report() {
        let mut c = XidCorrelator::default();
        let t0 = Instant::now();
        // An Xid 13 logs a line per faulting SM; NVML raises an event per line.
        assert_eq!(c.nvml(t0, 0, 13, true), None);
        assert_eq!(c.nvml(t0 + ms(1), 0, 13, true), None);
        assert!(c.kernel(t0 + ms(2), Some(0), line(13, Some(5))).is_some());
        assert!(c.kernel(t0 + ms(3), Some(0), line(13, Some(5))).is_none());
        assert!(c.expire(t0 + ms(5000)).is_empty());
        // Another process's fault is another report.
        assert!(c.kernel(t0 + ms(4), Some(0), line(13, Some(6))).is_some());
        // After the window the same one counts again.
        assert!(
            c.kernel(t0 + DEFAULT_WINDOW + ms(3), Some(0), line(13, Some(5)))
                .is_some()
        );
    }

    #[test]
    fn lines_of_unknown_devices_are_reported_without_a_gpu() {
        let mut c = XidCorrelator::default();
        let r = c.kernel(Instant::now(), None, line(31, Some(1))).unwrap();
        assert_eq!((r.gpu, r.pid), (None, Some(1)));
    }

    #[test]
    fn memory_is_bounded_under_a_storm() {
        let mut c = XidCorrelator::default();
        let t0 = Instant::now();
        for pid in 0..10_000 {
            c.kernel(t0, Some(0), line(31, Some(pid)));
            c.nvml(t0, pid, 31, true);
        }
        assert!(c.lines.len() <= MAX_REMEMBERED && c.waiting.len() <= MAX_REMEMBERED);
    }
}
