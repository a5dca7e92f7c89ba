//! The driver's Xid lines from the kernel log, behind a narrow trait.
//!
//! [`KernelLog`] hands the agent every Xid the driver logs from now on,
//! parsed ([`KernelXid`]), with the pid NVML's event lacks. Backends:
//!
//! - [`Kmsg`] — `/dev/kmsg`, read by one thread from the end of the ring
//!   (old records are history, not news). Reading it needs `CAP_SYSLOG`
//!   where `kernel.dmesg_restrict = 1`, and the device in the container;
//!   see docs/SENTINEL.md.
//! - [`FakeKernelLog`] — lines a test or drill writes, through the same
//!   parser.
//! - [`NoKernelLog`] — nothing: application Xids cannot be attributed and
//!   the agent falls back to holding the GPU's workers suspect.
//!
//! [`open_kernel_log`] picks one; when `/dev/kmsg` cannot be opened it logs
//! one line saying why and what it costs, and returns [`NoKernelLog`].

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::OnceLock;

use tokio::sync::broadcast;

use crate::telemetry::EVENT_CAPACITY;
use crate::{GpuError, KernelXid};

/// Where the kernel log is read.
pub const KMSG: &str = "/dev/kmsg";

/// Largest kmsg record (the kernel's limit is 1 KiB of text plus its
/// dictionary); a read with a smaller buffer fails with EINVAL.
const RECORD_BUFFER: usize = 16 << 10;

/// A source of the driver's Xid lines.
pub trait KernelLog: Send + Sync + 'static {
    /// `"kmsg"`, `"fake"` or `"off"`, for logs.
    fn source(&self) -> &'static str;

    /// Whether Xid lines can arrive at all. When false, nobody waits for a
    /// line to name the process behind an NVML event.
    fn live(&self) -> bool;

    /// A receiver of Xids logged from now on.
    fn subscribe(&self) -> broadcast::Receiver<KernelXid>;

    /// Deliver `line` as if the kernel had logged it: for tests and fault
    /// drills. Only the fake supports it. A line that is no Xid is
    /// dropped, as the real reader drops it.
    fn inject_line(&self, line: &str) -> Result<(), GpuError>;
}

/// The kernel log for a GPU telemetry backend: `/dev/kmsg` for NVML, the
/// fake for the fake backend, nothing without GPUs.
pub fn open_kernel_log(backend: &str) -> std::sync::Arc<dyn KernelLog> {
    match backend {
        "nvml" => match Kmsg::open(Path::new(KMSG)) {
            Ok(kmsg) => std::sync::Arc::new(kmsg),
            Err(error) => {
                tracing::warn!(
                    "Xid attribution off: cannot read the kernel log {KMSG} ({error}); an application \
                     Xid (13, 31, 43, 45, ...) will restart only the workers on its GPU that then fail \
                     a request or probe (give the agent CAP_SYSLOG and {KMSG}, and hostPID in \
                     Kubernetes: docs/SENTINEL.md)"
                );
                std::sync::Arc::new(NoKernelLog)
            }
        },
        "fake" => std::sync::Arc::new(FakeKernelLog::new()),
        _ => std::sync::Arc::new(NoKernelLog),
    }
}

/// `/dev/kmsg`, read by a thread from the end of the ring.
///
/// The thread blocks in `read` for the next record and ends after the first
/// record once the reader is dropped, or when the device fails for good.
#[derive(Debug)]
pub struct Kmsg {
    events: broadcast::Sender<KernelXid>,
    _stop: StopOnDrop,
}

#[derive(Debug)]
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Kmsg {
    /// Opens `path` (a kmsg device), moves past the records already there
    /// and starts the reading thread.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut file = File::open(path)?;
        file.seek(SeekFrom::End(0))?;
        let events = broadcast::channel(EVENT_CAPACITY).0;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, flag) = (events.clone(), std::sync::Arc::clone(&stop));
        std::thread::Builder::new()
            .name("kmsg".into())
            .spawn(move || read_records(file, &tx, &flag))?;
        Ok(Self {
            events,
            _stop: StopOnDrop(stop),
        })
    }
}

/// Reads one record per `read` until stopped or failed for good.
fn read_records(
    mut file: File,
    events: &broadcast::Sender<KernelXid>,
    stop: &std::sync::atomic::AtomicBool,
) {
    let mut buf = vec![0u8; RECORD_BUFFER];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match file.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                if let Some(xid) = KernelXid::parse(&record) {
                    tracing::debug!(?xid, "Xid in the kernel log");
                    let _ = events.send(xid);
                }
            }
            // EPIPE: records were overwritten before we read them; the
            // next read goes on from the oldest one left.
            Err(e) if e.kind() == ErrorKind::BrokenPipe || e.kind() == ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::warn!(%error, "reading the kernel log failed; Xid attribution off from now on");
                return;
            }
        }
    }
}

impl KernelLog for Kmsg {
    fn source(&self) -> &'static str {
        "kmsg"
    }

    fn live(&self) -> bool {
        true
    }

    fn subscribe(&self) -> broadcast::Receiver<KernelXid> {
        self.events.subscribe()
    }

    fn inject_line(&self, _line: &str) -> Result<(), GpuError> {
        Err(GpuError::NotSupported(
            "writing kernel log lines needs the fake backend",
        ))
    }
}

/// Lines written by tests and drills, parsed like the real log's.
#[derive(Debug)]
pub struct FakeKernelLog {
    events: broadcast::Sender<KernelXid>,
}

impl FakeKernelLog {
    /// A log with no lines yet.
    pub fn new() -> Self {
        Self {
            events: broadcast::channel(EVENT_CAPACITY).0,
        }
    }
}

impl Default for FakeKernelLog {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelLog for FakeKernelLog {
    fn source(&self) -> &'static str {
        "fake"
    }

    fn live(&self) -> bool {
        true
    }

    fn subscribe(&self) -> broadcast::Receiver<KernelXid> {
        self.events.subscribe()
    }

    fn inject_line(&self, line: &str) -> Result<(), GpuError> {
        if let Some(xid) = KernelXid::parse(line) {
            let _ = self.events.send(xid);
        }
        Ok(())
    }
}

/// No kernel log: no Xid lines ever arrive.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKernelLog;

impl KernelLog for NoKernelLog {
    fn source(&self) -> &'static str {
        "off"
    }

    fn live(&self) -> bool {
        false
    }

    fn subscribe(&self) -> broadcast::Receiver<KernelXid> {
        static NEVER: OnceLock<broadcast::Sender<KernelXid>> = OnceLock::new();
        NEVER
            .get_or_init(|| broadcast::channel(EVENT_CAPACITY).0)
            .subscribe()
    }

    fn inject_line(&self, _line: &str) -> Result<(), GpuError> {
        Err(GpuError::NotSupported(
            "writing kernel log lines needs the fake backend",
        ))
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;

    #[test]
    fn the_fake_parses_what_it_is_given_and_drops_the_rest() {
        let log = FakeKernelLog::new();
        let mut rx = log.subscribe();
        log.inject_line("NVRM: GPU at PCI:0000:01:00: GPU-fake-0")
            .unwrap();
        log.inject_line("NVRM: Xid (PCI:0000:01:00): 43, pid=77, name=python3, Ch 00000008")
            .unwrap();
        let x = rx.try_recv().unwrap();
        assert_eq!((x.xid, x.pid), (43, Some(77)));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert!(log.live());
    }

    #[test]
    fn without_a_log_nothing_arrives_and_nothing_is_waited_for() {
        let mut rx = NoKernelLog.subscribe();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert!(!NoKernelLog.live());
        assert!(NoKernelLog.inject_line("x").is_err());
    }

    #[test]
    fn a_log_that_cannot_be_opened_is_an_error_and_nvml_degrades_to_none() {
        let err = Kmsg::open(Path::new("/nonexistent/kmsg")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert_eq!(open_kernel_log("off").source(), "off");
        assert_eq!(open_kernel_log("fake").source(), "fake");
        // Here: kmsg when this process may read it (root), else off.
        let nvml = open_kernel_log("nvml");
        assert!(matches!(nvml.source(), "kmsg" | "off"));
    }

    #[test]
    fn records_are_parsed_until_the_source_ends() {
        // A file stands in for the device (one read, one record, then EOF).
        let dir = std::env::temp_dir().join(format!("infermesh-kmsg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kmsg");
        std::fs::write(
            &path,
            "4,1,1,-;NVRM: Xid (PCI:0000:01:00): 31, pid=5, name=python3, Ch 00000001\n SUBSYSTEM=pci\n",
        )
        .unwrap();
        let (tx, mut rx) = broadcast::channel(4);
        let stop = std::sync::atomic::AtomicBool::new(false);
        read_records(File::open(&path).unwrap(), &tx, &stop);
        let x = rx.try_recv().unwrap();
        assert_eq!((x.xid, x.pid), (31, Some(5)));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
