//! The demo's closing summary: totals, each node's share of requests in
//! each phase (before the crash, between the crash and the slowdown, after
//! the slowdown), failover times from both sides — the client's outcomes and
//! the agent's own event log — and how much traffic left the slow node.

use std::collections::BTreeMap;

use infermesh_proto::admin::StatusResponse;
use serde::Serialize;

use super::fleet::Injection;
use super::load::{Failure, Success, by_code, histogram};
use crate::say::say;

/// What the summary is computed from.
pub struct Inputs<'a> {
    /// Node names, in order; index 0 is the local node.
    pub names: &'a [&'static str],
    /// Registry the client used.
    pub registry: String,
    /// Callers.
    pub concurrency: u32,
    /// Load start and end, Unix µs.
    pub start: u64,
    /// Load end, Unix µs.
    pub end: u64,
    /// Successful requests.
    pub successes: &'a [Success],
    /// Failed requests.
    pub failures: &'a [Failure],
    /// The CUDA crash injected into the local node, if it was.
    pub crash: Option<&'a Injection>,
    /// The slowdown injected into the slowest node, if it was.
    pub slow: Option<&'a Injection>,
    /// Each agent's last Status.
    pub statuses: &'a [Option<StatusResponse>],
    /// Attempts that failed on each node (client library counters).
    pub failed_attempts: &'a [u64],
    /// Of those on the local node, how many came between the crash and the slowdown.
    pub failed_attempts_on_crashed: u64,
}

/// The summary, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub registry: String,
    pub concurrency: u32,
    pub duration_s: f64,
    pub requests: u64,
    pub failed: u64,
    pub failed_by_code: BTreeMap<String, u64>,
    pub throughput_rps: f64,
    pub latency_ms: Latency,
    pub nodes: Vec<NodeSummary>,
    pub phases: Vec<Phase>,
    pub crash: Option<Crash>,
    pub slowdown: Option<Slowdown>,
    /// No request failed.
    pub ok: bool,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Serialize)]
pub struct NodeSummary {
    pub node: &'static str,
    pub role: &'static str,
    pub requests: u64,
    pub share: f64,
    pub restarts: u64,
    /// Attempts that failed on this node (retried elsewhere by the client).
    pub failed_attempts: u64,
}

/// A stretch of the run between events.
#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub from_s: f64,
    pub to_s: f64,
    pub requests: u64,
    /// Share of the phase's successful requests, by node.
    pub share: BTreeMap<&'static str, f64>,
}

/// The CUDA crash of the local node's worker.
#[derive(Debug, Serialize)]
pub struct Crash {
    pub node: &'static str,
    pub worker: String,
    pub at_s: f64,
    /// Agent event log: injection → `stop_routing`.
    pub agent_stop_routing_ms: Option<f64>,
    /// Agent event log: injection → `resume_routing` (the restarted worker ready).
    pub agent_resume_routing_ms: Option<f64>,
    /// Client: injection → first success on a remote node of a request sent after it.
    pub client_first_remote_success_ms: Option<f64>,
    /// Client: injection → first success on the crashed node of a request sent after it.
    pub client_local_serving_again_ms: Option<f64>,
    /// Slowest request answered in the 2 s after the injection (retries included).
    pub slowest_request_ms: Option<f64>,
    /// Attempts on the crashed node that failed and were retried elsewhere.
    pub failed_attempts_retried: u64,
}

/// The slowed-down node.
#[derive(Debug, Serialize)]
pub struct Slowdown {
    pub node: &'static str,
    pub worker: String,
    pub at_s: f64,
    /// Its share in the stretch before the slowdown (up to 5 s).
    pub share_before: f64,
    /// Its share from 1 s after the slowdown to the end.
    pub share_after: f64,
    /// 1 − after / before.
    pub traffic_left: f64,
    /// Its p99 in the stretch before the slowdown.
    pub p99_before_ms: Option<f64>,
    /// Its p99 from the slowdown to the end (what the client saw while it adapted).
    pub p99_after_ms: Option<f64>,
}

const SECOND: u64 = 1_000_000;

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Requests per node among successes sent in `[from, to)`.
fn counts(successes: &[Success], nodes: usize, from: u64, to: u64) -> Vec<u64> {
    let mut c = vec![0; nodes];
    for s in successes.iter().filter(|s| s.sent >= from && s.sent < to) {
        c[s.node] += 1;
    }
    c
}

fn share(c: &[u64], i: usize) -> f64 {
    let total: u64 = c.iter().sum();
    if total == 0 {
        0.0
    } else {
        c[i] as f64 / total as f64
    }
}

fn p99(successes: &[Success], node: usize, from: u64, to: u64) -> Option<f64> {
    let mut h = histogram();
    for s in successes
        .iter()
        .filter(|s| s.node == node && s.sent >= from && s.sent < to)
    {
        h.saturating_record(s.done.saturating_sub(s.sent).max(1));
    }
    (!h.is_empty()).then(|| ms(h.value_at_quantile(0.99)))
}

/// The first event of `kind` at or after `after` in `worker`'s log.
fn event(status: Option<&StatusResponse>, worker: &str, kind: &str, after: u64) -> Option<u64> {
    status?
        .workers
        .iter()
        .find(|w| w.id == worker)?
        .events
        .iter()
        .find(|e| e.kind == kind && e.unix_micros >= after)
        .map(|e| e.unix_micros)
}

/// Computes the summary.
pub fn summarize(i: &Inputs) -> Summary {
    let n = i.names.len();
    let mut h = histogram();
    for s in i.successes {
        h.saturating_record(s.done.saturating_sub(s.sent).max(1));
    }
    let total = counts(i.successes, n, 0, u64::MAX);
    let duration_s = i.end.saturating_sub(i.start) as f64 / 1e6;
    let failed = i.failures.len() as u64;
    let requests = i.successes.len() as u64 + failed;
    let at_s = |t: u64| t.saturating_sub(i.start) as f64 / 1e6;
    let nodes = (0..n)
        .map(|k| NodeSummary {
            node: i.names[k],
            role: if k == 0 { "local" } else { "remote" },
            requests: total[k],
            share: share(&total, k),
            restarts: i.statuses[k]
                .as_ref()
                .map_or(0, |s| s.workers.iter().map(|w| w.restarts).sum()),
            failed_attempts: i.failed_attempts[k],
        })
        .collect();
    let crash_at = i.crash.map_or(i.end, |c| c.at_micros);
    let slow_at = i.slow.map_or(i.end, |s| s.at_micros);
    let phase = |name, from: u64, to: u64| {
        let c = counts(i.successes, n, from, to);
        Phase {
            name,
            from_s: at_s(from),
            to_s: at_s(to),
            requests: c.iter().sum(),
            share: (0..n).map(|k| (i.names[k], share(&c, k))).collect(),
        }
    };
    let mut phases = vec![phase("before crash", i.start, crash_at)];
    if i.crash.is_some() {
        phases.push(phase("crash to slowdown", crash_at, slow_at));
    }
    if i.slow.is_some() {
        phases.push(phase("after slowdown", slow_at, i.end));
    }
    let crash = i.crash.map(|c| {
        let k = i.names.iter().position(|&x| x == c.node).unwrap_or(0);
        let t0 = c.at_micros;
        let status = i.statuses[k].as_ref();
        let stop = event(status, &c.worker, "stop_routing", t0);
        let resume = stop.and_then(|s| event(status, &c.worker, "resume_routing", s));
        let first = |remote: bool| {
            i.successes
                .iter()
                .filter(|s| s.sent >= t0 && (s.node != k) == remote)
                .map(|s| s.done)
                .min()
                .map(|d| ms(d - t0))
        };
        let slowest = i
            .successes
            .iter()
            .filter(|s| s.done >= t0 && s.done < t0 + 2 * SECOND)
            .map(|s| s.done - s.sent)
            .max();
        Crash {
            node: c.node,
            worker: c.worker.clone(),
            at_s: at_s(t0),
            agent_stop_routing_ms: stop.map(|s| ms(s.saturating_sub(t0))),
            agent_resume_routing_ms: resume.map(|r| ms(r.saturating_sub(t0))),
            client_first_remote_success_ms: first(true),
            client_local_serving_again_ms: first(false),
            slowest_request_ms: slowest.map(ms),
            failed_attempts_retried: i.failed_attempts_on_crashed,
        }
    });
    let slowdown = i.slow.map(|s| {
        let k = i.names.iter().position(|&x| x == s.node).unwrap_or(n - 1);
        let t0 = s.at_micros;
        // Before: the second half of the stretch since the crash (the crash's
        // effects have passed), at most 5 s.
        let from = (t0 - (t0 - crash_at.min(t0)) / 2).max(t0.saturating_sub(5 * SECOND));
        let after = (t0 + SECOND).min(i.end);
        let before_share = share(&counts(i.successes, n, from, t0), k);
        let after_share = share(&counts(i.successes, n, after, i.end), k);
        Slowdown {
            node: s.node,
            worker: s.worker.clone(),
            at_s: at_s(t0),
            share_before: before_share,
            share_after: after_share,
            traffic_left: if before_share > 0.0 {
                1.0 - after_share / before_share
            } else {
                0.0
            },
            p99_before_ms: p99(i.successes, k, from, t0),
            p99_after_ms: p99(i.successes, k, t0, i.end),
        }
    });
    let q = |q: f64| {
        if h.is_empty() {
            0.0
        } else {
            ms(h.value_at_quantile(q))
        }
    };
    Summary {
        registry: i.registry.clone(),
        concurrency: i.concurrency,
        duration_s,
        requests,
        failed,
        failed_by_code: by_code(i.failures),
        throughput_rps: requests as f64 / duration_s.max(1e-3),
        latency_ms: Latency {
            p50: q(0.5),
            p99: q(0.99),
            max: ms(h.max()),
        },
        nodes,
        phases,
        crash,
        slowdown,
        ok: failed == 0,
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1} ms"))
}

/// Prints the summary for people.
pub fn print(s: &Summary) {
    say!();
    say!(
        "== summary: {:.1} s, {} callers, registry {}",
        s.duration_s,
        s.concurrency,
        s.registry
    );
    say!(
        "requests {}  failed {}  {:.0} req/s  latency p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        s.requests,
        s.failed,
        s.throughput_rps,
        s.latency_ms.p50,
        s.latency_ms.p99,
        s.latency_ms.max
    );
    for (code, n) in &s.failed_by_code {
        say!("  failed with {code}: {n}");
    }
    let mut head = format!(
        "{:<18} {:>8} {:>8} {:>7}",
        "share of requests", "overall", "restarts", "errors"
    );
    for p in &s.phases {
        head.push_str(&format!(" {:>18}", p.name));
    }
    say!("{head}");
    for n in &s.nodes {
        let mut line = format!(
            "  {:<16} {:>7.1}% {:>8} {:>7}",
            format!("{} ({})", n.node, n.role),
            n.share * 100.0,
            n.restarts,
            n.failed_attempts
        );
        for p in &s.phases {
            line.push_str(&format!(" {:>17.1}%", p.share[n.node] * 100.0));
        }
        say!("{line}");
    }
    if let Some(c) = &s.crash {
        say!(
            "crash: cuda-crash into {}/{} at {:.1} s",
            c.node,
            c.worker,
            c.at_s
        );
        say!(
            "  agent event log: stopped routing to it after {}, routed to it again after {}",
            opt_ms(c.agent_stop_routing_ms),
            opt_ms(c.agent_resume_routing_ms)
        );
        say!(
            "  client: first success on a remote node after {}, on {} again after {}",
            opt_ms(c.client_first_remote_success_ms),
            c.node,
            opt_ms(c.client_local_serving_again_ms)
        );
        say!(
            "  client: {} attempt(s) on {} failed and were retried elsewhere; slowest request in the next 2 s: {}",
            c.failed_attempts_retried,
            c.node,
            opt_ms(c.slowest_request_ms)
        );
    }
    if let Some(d) = &s.slowdown {
        say!(
            "slowdown: service time x10 on {}/{} at {:.1} s",
            d.node,
            d.worker,
            d.at_s
        );
        say!(
            "  its share {:.1}% -> {:.1}% ({:.0}% of its traffic moved away); its p99 {} -> {}",
            d.share_before * 100.0,
            d.share_after * 100.0,
            d.traffic_left * 100.0,
            opt_ms(d.p99_before_ms),
            opt_ms(d.p99_after_ms)
        );
    }
    if s.ok {
        say!("result: OK, no request failed");
    } else {
        say!("result: FAILED, {} request(s) failed", s.failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(sent_s: f64, node: usize) -> Success {
        let sent = (sent_s * 1e6) as u64;
        Success {
            sent,
            done: sent + 2_000,
            node,
        }
    }

    fn injection(node: &'static str, at_s: u64) -> Injection {
        Injection {
            node,
            worker: "w0".into(),
            address: "127.0.0.1:1".into(),
            at_micros: at_s * SECOND,
        }
    }

    #[test]
    fn shares_per_phase_and_traffic_leaving_the_slow_node() {
        // 0..3 s: a, b, c alternate; 3..6 s: b and c (a crashed);
        // 6..9 s: a and b only (c slow).
        let mut successes = Vec::new();
        for i in 0..90 {
            let t = i as f64 * 0.1;
            let node = match t {
                t if t < 3.0 => i % 3,
                t if t < 6.0 => 1 + i % 2,
                _ => i % 2,
            };
            successes.push(ok(t, node));
        }
        let (crash, slow) = (injection("node-a", 3), injection("node-c", 6));
        let s = summarize(&Inputs {
            names: &["node-a", "node-b", "node-c"],
            registry: "static://x".into(),
            concurrency: 1,
            start: 0,
            end: 9 * SECOND,
            successes: &successes,
            failures: &[],
            crash: Some(&crash),
            slow: Some(&slow),
            statuses: &[None, None, None],
            failed_attempts: &[2, 0, 0],
            failed_attempts_on_crashed: 2,
        });
        assert!(s.ok);
        assert_eq!(s.requests, 90);
        assert_eq!(s.phases.len(), 3);
        assert!((s.phases[0].share["node-a"] - 1.0 / 3.0).abs() < 0.01);
        assert_eq!(s.phases[1].share["node-a"], 0.0);
        let slow = s.slowdown.unwrap();
        assert!((slow.share_before - 0.5).abs() < 0.05, "{slow:?}");
        assert_eq!(slow.share_after, 0.0);
        assert_eq!(slow.traffic_left, 1.0);
        let crash = s.crash.unwrap();
        assert_eq!(
            crash.client_local_serving_again_ms.map(|v| v > 2900.0),
            Some(true)
        );
        assert_eq!(crash.failed_attempts_retried, 2);
    }
}
