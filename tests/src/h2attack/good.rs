//! A well-behaved client for the attack table: requests one after another
//! on one connection (a new one if the server ends it), each with a
//! deadline; its p99 and errors. For the web server (nghttpd); against the
//! agent the script uses `infermesh bench`, a real gRPC client.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Options, Server, Wire, exchange};

/// What the good client saw.
#[derive(Clone, Debug)]
pub struct GoodReport {
    /// Answered requests (as `infermesh bench` counts them).
    pub requests: u64,
    pub errors: u64,
    pub p99: Duration,
}

impl GoodReport {
    /// One JSON object, with `infermesh bench --json`'s names.
    pub fn json(&self) -> String {
        format!(
            "{{\"requests\":{},\"errors\":{},\"latency_ms\":{{\"p99\":{:.3}}}}}",
            self.requests,
            self.errors,
            self.p99.as_secs_f64() * 1e3
        )
    }
}

/// Sends requests for `duration`, each failing after `deadline`.
pub fn run(addr: SocketAddr, server: Server, duration: Duration, deadline: Duration) -> GoodReport {
    let end = Instant::now() + duration;
    let (mut errors, mut took) = (0, Vec::new());
    let mut wire: Option<Wire> = None;
    while Instant::now() < end {
        let t = Instant::now();
        let ok = match wire.as_mut() {
            None => false,
            Some(w) => {
                let call = server.request(&w.authority.clone());
                exchange(w, &call, deadline)
                    .is_some_and(|a| a.reset.is_none() && !a.fields.is_empty())
            }
        };
        if ok {
            took.push(t.elapsed());
        } else if wire.is_some() {
            errors += 1;
        }
        if wire.as_ref().is_none_or(|w| w.seen(|s| s.over())) || !ok {
            wire = Wire::connect(addr, &Options::default()).ok();
            if wire.is_none() {
                errors += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    took.sort();
    let p99 = took
        .get((took.len() * 99 / 100).min(took.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    GoodReport {
        requests: took.len() as u64,
        errors,
        p99,
    }
}
