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
}

pub fn main(args: StatusArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, run(args))
}

async fn run(mut args: StatusArgs) -> Result<(), OpsError> {
    args.node.node = args.node_id.take();
    let (target, mut admin) = admin_for(&args.node).await?;
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

/// The status as JSON (the proto types carry no serde derives).
pub fn to_json(s: &StatusResponse) -> serde_json::Value {
    use serde_json::json;
    json!({
        "ok": true,
        "node_id": s.node_id,
        "version": s.version,
        "state": s.state,
        "weight": s.weight,
        "in_flight": s.in_flight,
        "queued": s.queued,
        "busy_ratio": s.busy_ratio,
        "uptime_ms": s.uptime_ms,
        "gpu_backend": s.gpu_backend,
        "gpus": s.gpus.iter().map(|g| json!({
            "index": g.index, "uuid": g.uuid, "name": g.name,
            "memory_total_bytes": g.memory_total_bytes, "memory_used_bytes": g.memory_used_bytes,
            "utilization_pct": g.utilization_pct, "temperature_c": g.temperature_c,
            "power_mw": g.power_mw, "ecc_uncorrected": g.ecc_uncorrected,
        })).collect::<Vec<_>>(),
        "workers": s.workers.iter().map(|w| json!({
            "id": w.id, "state": w.state, "pid": w.pid, "address": w.address,
            "models": w.models, "in_flight": w.in_flight, "requests": w.requests,
            "routable": w.routable, "restarts": w.restarts, "last_fault": w.last_fault,
            "last_exit": w.last_exit, "gpu": w.gpu, "command": w.command,
            "startup_ms": w.startup_ms, "last_output": w.last_output,
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
        "WORKER", "STATE", "PID", "ROUTED", "IN-FLIGHT", "REQUESTS", "RESTARTS"
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
    let checks: Vec<_> = s.workers.iter().flat_map(|w| w.health.iter()).collect();
    if !checks.is_empty() {
        println!("health checks (latest verdicts):");
        for h in checks {
            super::health::print_result(h);
        }
    }
    if !s.gpus.is_empty() {
        println!("GPUs ({}):", s.gpu_backend);
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
        }
    }
}
