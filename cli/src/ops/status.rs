//! `infermesh status NODE`: the agent's own view of its node and workers.

use clap::Args;
use infermesh_proto::admin::{StatusRequest, StatusResponse};

use super::{NodeArgs, OpsError, admin_for, run_command};

/// Arguments of `infermesh status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The node: its id in the registry (with --registry), or its admin
    /// address host:port. Omit with --local or --admin.
    #[arg(value_name = "NODE")]
    node_id: Option<String>,
    #[command(flatten)]
    node: NodeArgs,
    /// Keep asking and print one line per worker per sample, with its
    /// request rate since the previous sample (Ctrl-C to stop).
    #[arg(long)]
    watch: bool,
    /// Time between samples with --watch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    interval: std::time::Duration,
}

pub fn main(args: StatusArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, run(args))
}

async fn run(mut args: StatusArgs) -> Result<(), OpsError> {
    args.node.node = args.node_id.take();
    let (target, mut admin) = admin_for(&args.node).await?;
    if args.watch {
        if args.interval.is_zero() {
            return Err(OpsError::usage("--interval must be more than 0"));
        }
        return watch(
            &target.name,
            &mut admin,
            args.interval,
            args.node.registry.json,
        )
        .await;
    }
    let status = admin
        .status(StatusRequest {})
        .await
        .map_err(|s| OpsError::from_status(&format!("status of {}", target.name), s))?
        .into_inner();
    if args.node.registry.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&status)).expect("json")
        );
    } else {
        print_status(&status);
    }
    Ok(())
}

/// Requests per second of each worker between two samples; a worker whose
/// count went down (restarted agent) or that is new starts again from 0.
pub fn rates(
    before: Option<(&StatusResponse, std::time::Instant)>,
    now: (&StatusResponse, std::time::Instant),
) -> Vec<(String, Option<f64>)> {
    now.0
        .workers
        .iter()
        .map(|w| {
            let rate = before.and_then(|(b, at)| {
                let secs = now.1.saturating_duration_since(at).as_secs_f64();
                let prev = b.workers.iter().find(|p| p.id == w.id)?;
                (secs > 0.0 && w.requests >= prev.requests)
                    .then(|| (w.requests - prev.requests) as f64 / secs)
            });
            (w.id.clone(), rate)
        })
        .collect()
}

async fn watch(
    name: &str,
    admin: &mut super::Admin,
    interval: std::time::Duration,
    json: bool,
) -> Result<(), OpsError> {
    let mut tick = tokio::time::interval(interval);
    let mut last: Option<(StatusResponse, std::time::Instant)> = None;
    if !json {
        println!(
            "{:<20} {:<12} {:<12} {:>9} {:>7} {:>9} {:>8} {:>6}",
            "TIME", "WORKER", "STATE", "REQ/S", "QUEUED", "INFLIGHT", "RESTARTS", "BUSY"
        );
    }
    loop {
        tick.tick().await;
        let at = std::time::Instant::now();
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let s = match admin.status(StatusRequest {}).await {
            Ok(r) => r.into_inner(),
            Err(e) => {
                // The agent may be restarting: say so and keep watching.
                eprintln!("{stamp} {name}: {}", e.message());
                last = None;
                continue;
            }
        };
        let rates = rates(last.as_ref().map(|(s, t)| (s, *t)), (&s, at));
        for (w, (_, rate)) in s.workers.iter().zip(&rates) {
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "time": stamp, "node_id": s.node_id, "worker": w.id, "state": w.state,
                        "requests_per_s": rate, "inflight": w.in_flight, "restarts": w.restarts,
                        "node_queued": s.queued, "node_busy_ratio": s.busy_ratio,
                    })
                );
            } else {
                println!(
                    "{:<20} {:<12} {:<12} {:>9} {:>7} {:>9} {:>8} {:>5.0}%",
                    stamp,
                    w.id,
                    w.state,
                    rate.map_or("-".to_string(), |r| format!("{r:.1}")),
                    s.queued,
                    w.in_flight,
                    w.restarts,
                    s.busy_ratio * 100.0
                );
            }
        }
        last = Some((s, at));
    }
}

/// The status as JSON (the proto types carry no serde derives).
pub fn to_json(s: &StatusResponse) -> serde_json::Value {
    use serde_json::json;
    json!({
        "ok": true,
        "node_id": s.node_id,
        "version": s.version,
        "state": s.state,
        "weight": s.weight,
        "inflight": s.in_flight,
        "queued": s.queued,
        "busy_ratio": s.busy_ratio,
        "uptime_ms": s.uptime_ms,
        "gpu_backend": s.gpu_backend,
        "kernel_log": s.kernel_log,
        "gpus": s.gpus.iter().map(|g| json!({
            "index": g.index, "uuid": g.uuid, "name": g.name,
            "memory_total_bytes": g.memory_total_bytes, "memory_used_bytes": g.memory_used_bytes,
            "utilization_pct": g.utilization_pct, "temperature_c": g.temperature_c,
            "power_mw": g.power_mw, "ecc_uncorrected": g.ecc_uncorrected,
        })).collect::<Vec<_>>(),
        "workers": s.workers.iter().map(|w| json!({
            "id": w.id, "state": w.state, "pid": w.pid, "address": w.address,
            "models": w.models, "inflight": w.in_flight, "requests": w.requests,
            "routable": w.routable, "restarts": w.restarts, "last_fault": w.last_fault,
            "last_exit": w.last_exit, "gpu": w.gpu, "command": w.command,
            "gpu_device": w.gpu_device,
            "mps_thread_percentage": (w.mps_thread_percentage > 0).then_some(w.mps_thread_percentage),
            "mps_memory_limit_mib": (w.mps_memory_limit_mib > 0).then_some(w.mps_memory_limit_mib),
            "startup_ms": w.startup_ms, "last_output": w.last_output,
            "gpu_use": w.gpu_use.iter().map(|u| json!({
                "gpu": u.gpu, "memory_bytes": u.memory_bytes,
                "utilization_pct": u.utilization_pct, "processes": u.processes,
            })).collect::<Vec<_>>(),
            "health": w.health.iter().map(super::health::result_json).collect::<Vec<_>>(),
            "events": w.events.iter().map(|e| json!({
                "unix_micros": e.unix_micros, "kind": e.kind, "detail": e.detail,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn print_status(s: &StatusResponse) {
    println!(
        "node {}  state {}  weight {:.2}  in-flight {}  queued {}  busy {:.0}%  up {}s  infermesh {}",
        s.node_id,
        s.state,
        s.weight,
        s.in_flight,
        s.queued,
        s.busy_ratio * 100.0,
        s.uptime_ms / 1000,
        s.version
    );
    println!(
        "{:<12} {:<12} {:>8} {:>8} {:>9} {:>9} {:>8}  LAST FAULT",
        "WORKER", "STATE", "PID", "ROUTED", "INFLIGHT", "REQUESTS", "RESTARTS"
    );
    for w in &s.workers {
        println!(
            "{:<12} {:<12} {:>8} {:>8} {:>9} {:>9} {:>8}  {}",
            w.id,
            w.state,
            w.pid,
            if w.routable { "yes" } else { "no" },
            w.in_flight,
            w.requests,
            w.restarts,
            if w.last_fault.is_empty() {
                "-"
            } else {
                &w.last_fault
            }
        );
    }
    let pinned: Vec<_> = s
        .workers
        .iter()
        .filter(|w| !w.gpu_device.is_empty())
        .collect();
    if !pinned.is_empty() {
        println!("GPU slices:");
        for w in pinned {
            let mut share = Vec::new();
            if w.mps_thread_percentage > 0 {
                share.push(format!("MPS {}% of SMs", w.mps_thread_percentage));
            }
            if w.mps_memory_limit_mib > 0 {
                share.push(format!("MPS memory {} MiB", w.mps_memory_limit_mib));
            }
            println!(
                "  {:<12} CUDA_VISIBLE_DEVICES={}{}{}",
                w.id,
                w.gpu_device,
                w.gpu.map_or(String::new(), |g| format!(" (on GPU {g})")),
                if share.is_empty() {
                    String::new()
                } else {
                    format!(", {}", share.join(", "))
                }
            );
        }
    }
    let checks: Vec<_> = s.workers.iter().flat_map(|w| w.health.iter()).collect();
    if !checks.is_empty() {
        println!("health checks (latest verdicts):");
        for h in checks {
            super::health::print_result(h);
        }
    }
    if !s.gpus.is_empty() {
        println!("GPUs ({}, Xid lines from {}):", s.gpu_backend, s.kernel_log);
        for g in &s.gpus {
            println!(
                "  {} {} util {}% mem {}/{} MiB {}°C ecc {}",
                g.index,
                g.name,
                g.utilization_pct,
                g.memory_used_bytes >> 20,
                g.memory_total_bytes >> 20,
                g.temperature_c,
                g.ecc_uncorrected
            );
            for w in &s.workers {
                for u in w.gpu_use.iter().filter(|u| u.gpu == g.index) {
                    println!(
                        "    {:<12} mem {} MiB util {} ({} process{})",
                        w.id,
                        u.memory_bytes >> 20,
                        u.utilization_pct.map_or("-".into(), |p| format!("{p}%")),
                        u.processes,
                        if u.processes == 1 { "" } else { "es" }
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infermesh_proto::admin::WorkerStatus;
    use std::time::{Duration, Instant};

    fn status(counts: &[(&str, u64)]) -> StatusResponse {
        StatusResponse {
            workers: counts
                .iter()
                .map(|(id, n)| WorkerStatus {
                    id: id.to_string(),
                    requests: *n,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let t0 = Instant::now();
        let a = status(&[("w0", 100), ("w1", 50)]);
        let b = status(&[("w0", 300), ("w1", 10), ("w2", 5)]);
        assert_eq!(
            rates(None, (&a, t0)),
            vec![("w0".into(), None), ("w1".into(), None)]
        );
        let r = rates(Some((&a, t0)), (&b, t0 + Duration::from_secs(2)));
        assert_eq!(r[0], ("w0".into(), Some(100.0)));
        assert_eq!(
            r[1],
            ("w1".into(), None),
            "a count that went down is a restart"
        );
        assert_eq!(r[2], ("w2".into(), None), "a new worker has no rate yet");
    }
}
