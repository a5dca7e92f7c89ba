//! `bench --rate`: open-loop load. Requests leave at a fixed rate, evenly
//! spaced, whatever the answers — the load that callers outside a node put
//! on it (a steady service, a flood at several times its capacity) — where
//! the closed loop's callers wait for each answer and so slow down with the
//! node. A request's latency counts from its send, and a slow answer never
//! delays the next send (no coordinated omission). At most `max_in_flight`
//! are outstanding: a request due beyond it is not sent and is counted
//! under [`NOT_SENT`], so a node that stops answering cannot make the bench
//! hold unbounded tasks.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infermesh_proto::inference::ModelInferRequest;

use super::{Caller, TaskResult};

/// The most requests outstanding unless `--concurrency` says otherwise.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 10_000;

/// The error a request is counted under when it was due while
/// `max_in_flight` were outstanding.
pub const NOT_SENT: &str = "NotSent";

/// Highest rate accepted, requests per second.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Parses `--rate`: requests per second, positive and at most [`MAX_RATE`].
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of requests per second"))?;
    if r.is_finite() && r > 0.0 && r <= MAX_RATE {
        Ok(r)
    } else {
        Err(format!(
            "{s} requests per second: give a rate above 0 and at most {MAX_RATE}"
        ))
    }
}

/// What to send, how fast.
pub struct Load {
    pub caller: Caller,
    pub request: ModelInferRequest,
    /// Requests per second.
    pub rate: f64,
    pub max_in_flight: usize,
    /// Each request's deadline.
    pub timeout: Duration,
}

/// The `k`-th send time after `start` at `rate` per second.
fn due(start: Instant, k: u64, rate: f64) -> Instant {
    start + Duration::from_secs_f64(k as f64 / rate)
}

/// Sends `load` from now until `end`, counting the requests sent from
/// `measure_from` on; `done` counts successes as they come (progress).
pub async fn run(
    load: Load,
    (measure_from, end): (Instant, Instant),
    done: Arc<AtomicU64>,
) -> TaskResult {
    let result = Arc::new(Mutex::new(TaskResult::new()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut sent = Vec::new();
    let mut prune_at = 4096;
    for k in 0.. {
        let at = due(start, k, load.rate);
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let measured = at >= measure_from;
        if in_flight.load(Ordering::Relaxed) >= load.max_in_flight {
            if measured {
                let mut r = result.lock().expect("result");
                *r.errors.entry(NOT_SENT.to_string()).or_default() += 1;
            }
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (caller, request) = (load.caller.clone(), load.request.clone());
        let (result, in_flight, done) = (result.clone(), in_flight.clone(), done.clone());
        let timeout = load.timeout;
        sent.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let outcome = caller.call(request, timeout).await;
            let took = t0.elapsed();
            in_flight.fetch_sub(1, Ordering::Relaxed);
            if measured {
                result.lock().expect("result").record(took, outcome, &done);
            }
        }));
        // Keep the list of tasks short: forget those that finished.
        if sent.len() >= prune_at {
            sent.retain(|t| !t.is_finished());
            prune_at = (sent.len() * 2).max(4096);
        }
    }
    for t in sent {
        t.await.expect("bench request task panicked");
    }
    Arc::try_unwrap(result)
        .ok()
        .expect("every request task is done")
        .into_inner()
        .expect("result")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_are_evenly_spaced_from_the_start() {
        let t0 = Instant::now();
        assert_eq!(due(t0, 0, 100.0), t0);
        assert_eq!(due(t0, 3, 100.0), t0 + Duration::from_millis(30));
        assert_eq!(due(t0, 1200, 1200.0), t0 + Duration::from_secs(1));
    }

    #[test]
    fn a_rate_is_a_positive_number() {
        assert_eq!(parse_rate("1200"), Ok(1200.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        for bad in ["0", "-3", "nan", "inf", "fast", "2000000"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }
}
