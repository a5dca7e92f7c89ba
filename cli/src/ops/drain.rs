//! `infermesh drain NODE [--wait]` and `infermesh undrain NODE`.
//!
//! Drain marks the node `draining` in the registry (clients stop sending it
//! new requests; requests that still arrive are served) and turns `/readyz`
//! to 503. With `--wait` it then watches the agent until nothing is in
//! flight and no request has arrived for `--quiet` (clients that had not yet
//! seen the new record have caught up), showing progress, and reports
//! `drained` — or `timed out` with what is still in flight (exit 1).

use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use infermesh_proto::admin::{DrainRequest, StatusRequest, StatusResponse, UndrainRequest};

use super::{Admin, NodeArgs, OpsError, admin_for, run_command};

/// Arguments of `infermesh drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The node: its id in the registry (with --registry), or its admin
    /// address host:port. Omit with --local or --admin.
    #[arg(value_name = "NODE")]
    node_id: Option<String>,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
    /// Wait until the node has nothing in flight.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this long (exit 1).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// How long the node must see no request before it counts as drained.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    quiet: Duration,
}

/// Arguments of `infermesh undrain`.
#[derive(Debug, Args)]
pub struct UndrainArgs {
    /// The node: its id in the registry (with --registry), or its admin
    /// address host:port. Omit with --local or --admin.
    #[arg(value_name = "NODE")]
    node_id: Option<String>,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
}

pub fn main(args: DrainArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, drain(args))
}

pub fn undrain_main(args: UndrainArgs) -> i32 {
    let json = args.node.registry.json;
    run_command(json, undrain(args))
}

const POLL: Duration = Duration::from_millis(100);

async fn drain(mut args: DrainArgs) -> Result<(), OpsError> {
    args.node.node = args.node_id.take();
    let json = args.node.registry.json;
    let (target, mut admin) = admin_for(&args.node).await?;
    let started = Instant::now();
    let at_drain = admin
        .drain(DrainRequest {})
        .await
        .map_err(|s| OpsError::from_status(&format!("drain {}", target.name), s))?
        .into_inner()
        .in_flight;
    if !args.wait {
        if json {
            println!(
                "{}",
                serde_json::json!({ "ok": true, "node": target.name, "draining": true, "inflight": at_drain })
            );
        } else {
            println!(
                "{}: draining ({at_drain} in flight); clients stop sending new requests",
                target.name
            );
        }
        return Ok(());
    }
    let bar = if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(at_drain.max(1));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} draining {msg} [{elapsed}] {wide_bar} {pos}/{len} finished",
            )
            .expect("template"),
        );
        bar
    };
    let outcome = wait_drained(&mut admin, &args, &bar).await;
    bar.finish_and_clear();
    let took = started.elapsed();
    match outcome {
        Ok(total) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": true, "node": target.name, "drained": true,
                        "inflight": 0, "inflight_at_drain": at_drain,
                        "requests_served_while_draining": total,
                        "seconds": took.as_secs_f64(),
                    })
                );
            } else {
                println!(
                    "{}: drained in {:.1}s ({at_drain} in flight at drain, {total} served while draining)",
                    target.name,
                    took.as_secs_f64()
                );
            }
            Ok(())
        }
        Err(WaitError::Timeout(left)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": false, "node": target.name, "drained": false,
                        "inflight": left, "seconds": took.as_secs_f64(),
                        "error": "timed out",
                    })
                );
            }
            let e = OpsError::failed(format!(
                "{}: timed out after {:?} with {left} requests still in flight (the node stays draining)",
                target.name, args.timeout
            ));
            Err(if json { e.reported() } else { e })
        }
        Err(WaitError::Status(s)) => Err(OpsError::from_status(
            &format!("status of {}", target.name),
            s,
        )),
    }
}

enum WaitError {
    Timeout(u64),
    Status(tonic::Status),
}

fn requests_total(s: &StatusResponse) -> u64 {
    s.workers.iter().map(|w| w.requests).sum()
}

/// Polls until nothing is in flight and no request arrived for `quiet`;
/// returns how many requests finished meanwhile.
async fn wait_drained(
    admin: &mut Admin,
    args: &DrainArgs,
    bar: &ProgressBar,
) -> Result<u64, WaitError> {
    let deadline = Instant::now() + args.timeout;
    let status = |admin: &mut Admin| {
        let mut admin = admin.clone();
        async move {
            admin
                .status(StatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(WaitError::Status)
        }
    };
    let first = status(admin).await?;
    let base = requests_total(&first);
    let mut last_total = base;
    let mut quiet_since: Option<Instant> = None;
    loop {
        let s = status(admin).await?;
        let total = requests_total(&s);
        bar.set_length(s.in_flight + total - base);
        bar.set_position(total - base);
        bar.set_message(format!("{} in flight", s.in_flight));
        let now = Instant::now();
        if s.in_flight == 0 && total == last_total {
            let since = *quiet_since.get_or_insert(now);
            if now - since >= args.quiet {
                return Ok(total - base);
            }
        } else {
            quiet_since = None;
        }
        last_total = total;
        if now >= deadline {
            return Err(WaitError::Timeout(s.in_flight));
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn undrain(mut args: UndrainArgs) -> Result<(), OpsError> {
    args.node.node = args.node_id.take();
    let (target, mut admin) = admin_for(&args.node).await?;
    admin
        .undrain(UndrainRequest {})
        .await
        .map_err(|s| OpsError::from_status(&format!("undrain {}", target.name), s))?;
    if args.node.registry.json {
        println!(
            "{}",
            serde_json::json!({ "ok": true, "node": target.name, "draining": false })
        );
    } else {
        println!("{}: serving again", target.name);
    }
    Ok(())
}
