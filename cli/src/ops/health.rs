//! `infermesh health NODE`: run the node's health checks now and print
//! each verdict. Exits 1 if any check failed.

use clap::Args;
use infermesh_proto::admin::{HealthResult, RunHealthChecksRequest};

use super::{NodeArgs, OpsError, admin_for, run_command};

/// Arguments of `infermesh health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The node: its id in the registry (with --registry), or its admin
    /// address host:port. Omit with --local or --admin.
    #[arg(value_name = "NODE")]
    node_id: Option<String>,
    #[command(flatten)]
    node: NodeArgs,
    /// Only this worker.
    #[arg(long)]
    worker: Option<String>,
}

pub fn main(args: HealthArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, run(args))
}

async fn run(mut args: HealthArgs) -> Result<(), OpsError> {
    args.node.node = args.node_id.take();
    let (target, mut admin) = admin_for(&args.node).await?;
    let results = admin
        .run_health_checks(RunHealthChecksRequest {
            worker: args.worker.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| OpsError::from_status(&format!("health checks on {}", target.name), s))?
        .into_inner()
        .results;
    let failed = results.iter().filter(|r| !r.pass).count();
    if args.node.registry.json {
        let doc = serde_json::json!({
            "ok": failed == 0,
            "node": target.name,
            "results": results.iter().map(result_json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
    } else if results.is_empty() {
        println!("{}: no health checks configured", target.name);
    } else {
        for r in &results {
            print_result(r);
        }
    }
    if failed > 0 {
        let e = OpsError::failed(format!(
            "{failed} of {} checks failed on {}",
            results.len(),
            target.name
        ));
        return Err(if args.node.registry.json {
            e.reported()
        } else {
            e
        });
    }
    Ok(())
}

/// A verdict as JSON.
pub fn result_json(r: &HealthResult) -> serde_json::Value {
    serde_json::json!({
        "worker": r.worker, "check": r.check, "model": r.model, "pass": r.pass,
        "reason": r.reason, "latency_us": r.latency_us, "unix_micros": r.unix_micros,
    })
}

/// One verdict as a line.
pub fn print_result(r: &HealthResult) {
    println!(
        "  {:<4} {:<10} {:<10} {:<12} {:>9.1} ms  {}",
        if r.pass { "PASS" } else { "FAIL" },
        r.worker,
        r.check,
        if r.model.is_empty() { "-" } else { &r.model },
        r.latency_us as f64 / 1000.0,
        r.reason
    );
}
