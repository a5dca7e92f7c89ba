//! `infermesh nodes`: the nodes of a service as the registry has them, with
//! each agent's live in-flight count from its admin API.

use clap::Args;
use infermesh_proto::admin::StatusRequest;
use infermesh_proto::registry::NodeRecord;
use serde::Serialize;

use super::{Bearer, OpsError, RegistryArgs, connect, read_registry, run_command};

/// Arguments of `infermesh nodes`.
#[derive(Debug, Args)]
pub struct NodesArgs {
    #[command(flatten)]
    registry: RegistryArgs,
}

/// One row of the table.
#[derive(Debug, Serialize)]
struct Row {
    id: String,
    zone: String,
    state: String,
    weight: f64,
    models: Vec<String>,
    /// From the agent's admin API; absent when it did not answer.
    #[serde(rename = "inflight")]
    in_flight: Option<u64>,
    version: String,
    grpc: String,
    admin: String,
}

pub fn main(args: NodesArgs) -> i32 {
    let json = args.registry.json;
    run_command(json, run(args))
}

async fn run(args: NodesArgs) -> Result<(), OpsError> {
    let records = read_registry(&args.registry).await?;
    let timeout = args.registry.connect_timeout;
    let rows = futures_join(
        records
            .into_iter()
            .map(|r| row(r, timeout, args.registry.tls.clone())),
    )
    .await;
    if args.registry.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "ok": true, "nodes": rows }))
                .expect("serializable")
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no nodes in service '{}'", args.registry.service);
        return Ok(());
    }
    println!(
        "{:<24} {:<10} {:<9} {:>7} {:>9} {:<10} MODELS",
        "NODE", "ZONE", "STATE", "WEIGHT", "INFLIGHT", "VERSION"
    );
    for r in &rows {
        println!(
            "{:<24} {:<10} {:<9} {:>7.2} {:>9} {:<10} {}",
            r.id,
            if r.zone.is_empty() { "-" } else { &r.zone },
            r.state,
            r.weight,
            r.in_flight.map_or("-".to_string(), |n| n.to_string()),
            if r.version.is_empty() {
                "-"
            } else {
                &r.version
            },
            r.models.join(",")
        );
    }
    Ok(())
}

async fn row(r: NodeRecord, timeout: std::time::Duration, tls: super::TlsArgs) -> Row {
    let in_flight = if r.endpoints.admin.is_empty() {
        None
    } else {
        let dial = tls.connector(&r.node_id, r.endpoints.tls, Some(&r.host));
        let connected = match dial {
            Ok(dial) => connect(&r.endpoints.admin, timeout, Bearer::default(), dial).await,
            Err(e) => Err(e),
        };
        match connected {
            Ok(mut c) => c
                .status(StatusRequest {})
                .await
                .ok()
                .map(|s| s.into_inner().in_flight),
            Err(_) => None,
        }
    };
    Row {
        id: r.node_id,
        zone: r.zone,
        state: format!("{:?}", r.state).to_lowercase(),
        weight: r.weight,
        models: r
            .models
            .iter()
            .map(|m| {
                if m.ready {
                    m.name.clone()
                } else {
                    format!("{}(not ready)", m.name)
                }
            })
            .collect(),
        in_flight,
        version: r.version,
        grpc: r.endpoints.grpc,
        admin: r.endpoints.admin,
    }
}

/// Runs the futures concurrently, keeping their order.
async fn futures_join<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("status task"));
    }
    out
}
