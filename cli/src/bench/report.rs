//! `bench`'s report: the JSON document of `--json` and its text form.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::say::say;

/// The `--json` report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub model: String,
    /// Closed loop: callers; open loop: the most requests in flight.
    pub concurrency: u32,
    /// Open loop (`--rate`): requests sent per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_rps: Option<f64>,
    pub size_bytes: usize,
    pub requests: u64,
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    /// Successful requests per node (through the client library only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub requests_by_node: BTreeMap<String, u64>,
    /// Successful requests per transport path that carried them (`grpc`,
    /// `shm`, `rdma`, `quic`; `unknown` for a transport that does not say).
    pub requests_by_path: BTreeMap<String, u64>,
    /// When the client library last sent an attempt to each node (Unix ms).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub last_attempt_unix_ms_by_node: BTreeMap<String, u64>,
    pub duration_s: f64,
    pub throughput_rps: f64,
    /// Input tensor bytes sent per second by successful requests.
    pub bytes_per_s: f64,
    /// Successful requests only.
    pub latency_ms: Latency,
    /// All requests, failed ones included (time until the error).
    pub latency_all_ms: Latency,
    /// With --transport: the transport asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// With --transport: requests per path (attempts, successes, failures,
    /// fallbacks to the next path down).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub paths: BTreeMap<String, serde_json::Value>,
    /// With --transport: a plain memcpy of the same size, bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcpy_bytes_per_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// The report as text for people (stdout, or stderr under `--json`).
pub fn print_human(r: &Report) {
    let load = match r.rate_rps {
        Some(rate) => format!("rate {rate} req/s (at most {} in flight)", r.concurrency),
        None => format!("concurrency {}", r.concurrency),
    };
    say!(
        "target {}  model {}  {load}  payload {} B ({} rows)",
        r.target,
        r.model,
        r.size_bytes,
        r.size_bytes / super::ROW_BYTES
    );
    say!(
        "requests {}  errors {}  duration {:.2} s",
        r.requests,
        r.errors,
        r.duration_s
    );
    for (code, n) in &r.errors_by_code {
        say!("  {code}: {n}");
    }
    for (node, n) in &r.requests_by_node {
        say!("  node {node}: {n} requests");
    }
    let carried: Vec<String> = r
        .requests_by_path
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    say!("carried by path: {}", carried.join(", "));
    say!(
        "throughput {:.1} req/s  {:.2} MiB/s",
        r.throughput_rps,
        r.bytes_per_s / (1024.0 * 1024.0)
    );
    if let Some(t) = &r.transport {
        let paths: Vec<String> = r.paths.iter().map(|(p, v)| format!("{p} {v}")).collect();
        say!("transport {t}: {}", paths.join("  "));
    }
    if let Some(m) = r.memcpy_bytes_per_s {
        say!(
            "memcpy of the same size: {:.2} MiB/s (transport reaches {:.1}% of it)",
            m / (1024.0 * 1024.0),
            100.0 * r.bytes_per_s / m
        );
    }
    for (label, l) in [
        ("successes   ", &r.latency_ms),
        ("all requests", &r.latency_all_ms),
    ] {
        say!(
            "latency ms, {label}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p999 {:.3}  max {:.3}  mean {:.3}",
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            l.mean
        );
    }
}
