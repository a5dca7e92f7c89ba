//! What a worker's supervisor remembers for operators: the last output lines
//! of its processes, timestamped sentinel events, and the newest verdict of
//! each health check. Written only by the supervisor (and the output readers
//! it starts); read by the admin API. Every ring is bounded.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use infermesh_health::Verdict;

/// Lines of worker output kept.
pub const OUTPUT_RING_LINES: usize = 200;
/// Events kept.
pub const EVENT_RING: usize = 64;
/// Health verdicts kept (one per check and model; configs have a few).
pub const HEALTH_RECORDS: usize = 64;

/// Something the sentinel did or saw, stamped with wall-clock time.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEvent {
    /// Microseconds since the Unix epoch.
    pub unix_micros: u64,
    /// `fault`, `stop_routing`, `resume_routing`, `restart`, `quarantine`,
    /// `spawned`, `state`, `exited`, `recovered`, `stable`.
    pub kind: &'static str,
    /// Details.
    pub detail: String,
}

/// A health verdict and when it was reached.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthRecord {
    /// The verdict.
    pub verdict: Verdict,
    /// Microseconds since the Unix epoch.
    pub unix_micros: u64,
}

impl HealthRecord {
    /// Stamps `verdict` with the current time.
    pub fn now(verdict: Verdict) -> Self {
        Self {
            verdict,
            unix_micros: now_micros(),
        }
    }
}

/// Microseconds since the Unix epoch, now.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The bounded history of one worker.
#[derive(Debug, Default)]
pub struct WorkerLog {
    output: Mutex<VecDeque<String>>,
    events: Mutex<VecDeque<WorkerEvent>>,
    health: Mutex<Vec<HealthRecord>>,
}

fn push_bounded<T>(ring: &Mutex<VecDeque<T>>, cap: usize, item: T) {
    let mut ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
    if ring.len() == cap {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl WorkerLog {
    /// Keeps a line of output.
    pub(crate) fn push_output(&self, line: String) {
        push_bounded(&self.output, OUTPUT_RING_LINES, line);
    }

    /// Records a sentinel event with the current wall-clock time.
    pub(crate) fn push_event(&self, kind: &'static str, detail: String) {
        let event = WorkerEvent {
            unix_micros: now_micros(),
            kind,
            detail,
        };
        push_bounded(&self.events, EVENT_RING, event);
    }

    /// Keeps the newest verdict of each (check, model).
    pub(crate) fn record_health(&self, records: impl IntoIterator<Item = HealthRecord>) {
        let mut kept = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        for r in records {
            let same = |k: &HealthRecord| {
                k.verdict.check == r.verdict.check && k.verdict.model == r.verdict.model
            };
            if let Some(k) = kept.iter_mut().find(|k| same(k)) {
                *k = r;
            } else if kept.len() < HEALTH_RECORDS {
                kept.push(r);
            }
        }
    }

    /// The last `n` output lines, oldest first.
    pub fn last_output(&self, n: usize) -> Vec<String> {
        let ring = self.output.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter()
            .skip(ring.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// The newest events, oldest first.
    pub fn events(&self) -> Vec<WorkerEvent> {
        let ring = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().cloned().collect()
    }

    /// The newest verdict of each health check that has run.
    pub fn health(&self) -> Vec<HealthRecord> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_bounded_and_keep_the_newest() {
        let log = WorkerLog::default();
        for i in 0..1000 {
            log.push_output(format!("line {i}"));
            log.push_event("state", format!("{i}"));
        }
        let out = log.last_output(usize::MAX);
        assert_eq!(out.len(), OUTPUT_RING_LINES);
        assert_eq!(out.last().unwrap(), "line 999");
        assert_eq!(log.events().len(), EVENT_RING);
    }
}
