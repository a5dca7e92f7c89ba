//! `RdmaEngine::probe` on a host without a verbs device: `None`, no panic,
//! exactly one log line.

use std::io::Write;
use std::sync::{Arc, Mutex};

use infermesh_rdma::RdmaEngine;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn host_has_verbs_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn probe_logs_one_line_and_returns_none_without_a_device() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let engine = tracing::subscriber::with_default(subscriber, RdmaEngine::probe);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    eprint!("{log}");
    assert_eq!(log.lines().count(), 1, "expected one log line, got:\n{log}");
    if host_has_verbs_device() {
        return; // a real device may or may not be usable; not this test's business
    }
    assert!(engine.is_none());
    assert!(log.contains("RDMA path disabled"), "{log}");
}
