//! `infermesh restart NODE WORKER`: restart one worker now (SIGTERM, SIGKILL
//! after its grace, spawn again).

use clap::Args;
use infermesh_proto::admin::RestartWorkerRequest;

use super::{NodeArgs, OpsError, admin_for, run_command};

/// Arguments of `infermesh restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// NODE WORKER, or just WORKER with --local or --admin. NODE is a node
    /// id (with --registry) or an admin host:port; WORKER a worker id (see
    /// `infermesh status NODE`).
    #[arg(value_name = "NODE WORKER", num_args = 1..=2, required = true)]
    names: Vec<String>,
    #[command(flatten)]
    node: NodeArgs,
}

pub fn main(args: RestartArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, run(args))
}

async fn run(mut args: RestartArgs) -> Result<(), OpsError> {
    let worker = args.names.pop().unwrap_or_default();
    args.node.node = args.names.pop();
    let (target, mut admin) = admin_for(&args.node).await?;
    admin
        .restart_worker(RestartWorkerRequest {
            worker: worker.clone(),
        })
        .await
        .map_err(|s| OpsError::from_status(&format!("restart {} on {}", worker, target.name), s))?;
    if args.node.registry.json {
        println!(
            "{}",
            serde_json::json!({ "ok": true, "node": target.name, "worker": worker, "restarting": true })
        );
    } else {
        println!("{}: restarting worker {}", target.name, worker);
    }
    Ok(())
}
