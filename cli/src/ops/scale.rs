//! `infermesh scale`: how many nodes a service needs, from the busy ratio
//! its agents measure (the share of the last 10 s each had work in flight).
//!
//! The rule ([`rule::Scaler`], sans-IO) is WPAI's: with `y` the mean busy
//! ratio of the serving nodes and `N` their count, recommend `ceil(y /
//! target × N)` — up once `y` has stayed above `max` for `up_window` (2
//! min), down once it has stayed below `min` for `down_window` (5 min),
//! never below `min_nodes`, and *hold* (recommend nothing) while any node's
//! figure is missing. Busy ratio rather than CPU: a GPU-bound worker keeps
//! the CPU idle while the node is saturated. configs/scaling/ holds a KEDA
//! ScaledObject and an HPA that implement the same rule from Prometheus.
//!
//! With `--priority SERVICE=N` (repeatable) it recommends for several
//! services at once, each by its own rule, and with `--gpu-budget G` the
//! services share G GPUs by priority: lower priorities give way first, and
//! the output says who gave way to whom ([`budget`], [`priorities`]).

mod budget;
mod priorities;
mod rule;
#[cfg(test)]
mod simulation;

pub use rule::{Advice, ScaleRule, Scaler};

use std::time::{Duration, Instant};

use clap::Args;
use infermesh_proto::admin::StatusRequest;
use infermesh_proto::registry::{NodeRecord, NodeState};
use serde::Serialize;

use super::{Bearer, OpsError, RegistryArgs, connect, read_registry, run_command};

/// Arguments of `infermesh scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    #[command(flatten)]
    registry: RegistryArgs,
    /// Busy ratio the recommendation aims for.
    #[arg(long, default_value_t = 0.7)]
    target: f64,
    /// Below this busy ratio (for --down-window) the service shrinks.
    #[arg(long, default_value_t = 0.6)]
    min: f64,
    /// Above this busy ratio (for --up-window) the service grows.
    #[arg(long, default_value_t = 0.8)]
    max: f64,
    /// How long the busy ratio must stay above --max before scaling up.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    up_window: Duration,
    /// How long the busy ratio must stay below --min before scaling down.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    down_window: Duration,
    /// Never recommend fewer nodes.
    #[arg(long, default_value_t = 1)]
    min_nodes: usize,
    /// Keep sampling and print one line per sample; the windows apply.
    /// Without it one sample is read and the formula applied to it at once.
    #[arg(long)]
    watch: bool,
    /// Time between samples with --watch.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// A service and its priority, SERVICE=N (repeatable; higher is more
    /// important, as in Kubernetes PriorityClasses). With it, scale advises
    /// every service named here (instead of --service), each by its own
    /// busy ratio and the rule above.
    #[arg(long = "priority", value_name = "SERVICE=N")]
    priorities: Vec<String>,
    /// GPUs the services may hold together. When their rules want more,
    /// lower priorities are scaled down first (never below --min-nodes
    /// while a higher priority's floor fits) and the output says who gave
    /// way. A node counts the GPUs its registry record lists (at least 1).
    #[arg(long, value_name = "GPUS")]
    gpu_budget: Option<u64>,
}

/// One node's figures.
#[derive(Debug, Serialize)]
struct NodeLoad {
    id: String,
    state: String,
    busy_ratio: Option<f64>,
    #[serde(rename = "inflight")]
    in_flight: Option<u64>,
    queued: Option<u64>,
    /// GPUs its record lists.
    #[serde(skip)]
    gpus: u32,
}

pub fn main(args: ScaleArgs) -> i32 {
    let json = args.registry.json;
    run_command(json, run(args))
}

fn check(args: &ScaleArgs) -> Result<ScaleRule, OpsError> {
    let ok = |x: f64| x.is_finite() && x > 0.0 && x <= 1.0;
    if !(ok(args.min)
        && ok(args.target)
        && ok(args.max)
        && args.min <= args.target
        && args.target <= args.max)
    {
        return Err(OpsError::usage(format!(
            "need 0 < --min ({}) <= --target ({}) <= --max ({}) <= 1",
            args.min, args.target, args.max
        )));
    }
    if args.interval.is_zero() {
        return Err(OpsError::usage("--interval must be more than 0"));
    }
    Ok(ScaleRule {
        target: args.target,
        min: args.min,
        max: args.max,
        up_window: args.up_window,
        down_window: args.down_window,
        min_nodes: args.min_nodes,
    })
}

async fn run(args: ScaleArgs) -> Result<(), OpsError> {
    let rule = check(&args)?;
    if !args.priorities.is_empty() || args.gpu_budget.is_some() {
        let services = priorities::parse(&args.priorities, &args.registry.service)?;
        return priorities::run(&args, rule, services).await;
    }
    let mut scaler = Scaler::new(rule);
    if !args.watch {
        let nodes = sample(&args.registry).await?;
        let busy = serving_busy(&nodes);
        // One sample has no history: the windows are taken as met.
        let mut instant = Scaler::new(ScaleRule {
            up_window: Duration::ZERO,
            down_window: Duration::ZERO,
            ..rule
        });
        let advice = instant.observe(Instant::now(), &busy);
        let mean = mean(&busy);
        if args.registry.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "ok": true,
                    "nodes": nodes,
                    "serving": busy.len(),
                    "busy_ratio": mean,
                    "recommended": mean.map(|y| scaler.formula(busy.len(), y)),
                    "advice": advice,
                    "windows": "not applied (one sample; use --watch)",
                }))
                .expect("serializable")
            );
            return Ok(());
        }
        println!(
            "{:<24} {:<9} {:>6} {:>9} {:>7}",
            "NODE", "STATE", "BUSY", "INFLIGHT", "QUEUED"
        );
        for n in &nodes {
            let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            println!(
                "{:<24} {:<9} {:>6} {:>9} {:>7}",
                n.id,
                n.state,
                n.busy_ratio.map_or("-".to_string(), |b| format!("{b:.2}")),
                show(n.in_flight),
                show(n.queued)
            );
        }
        println!("{}", summary(busy.len(), mean, &advice, &scaler));
        println!("(one sample: the windows are not applied; --watch applies them)");
        return Ok(());
    }
    let mut tick = tokio::time::interval(args.interval);
    loop {
        tick.tick().await;
        let nodes = match sample(&args.registry).await {
            Ok(n) => n,
            Err(e) => {
                // The registry is down: hold, and say so.
                let advice = scaler.observe(Instant::now(), &[None]);
                print_watch(&args, &[], None, &advice, &scaler, Some(&e.message));
                continue;
            }
        };
        let busy = serving_busy(&nodes);
        let advice = scaler.observe(Instant::now(), &busy);
        print_watch(&args, &nodes, mean(&busy), &advice, &scaler, None);
    }
}

fn print_watch(
    args: &ScaleArgs,
    nodes: &[NodeLoad],
    mean: Option<f64>,
    advice: &Advice,
    scaler: &Scaler,
    error: Option<&str>,
) {
    let serving = nodes.iter().filter(|n| n.state != "draining").count();
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    if args.registry.json {
        println!(
            "{}",
            serde_json::json!({
                "time": at.to_string(),
                "serving": serving,
                "busy_ratio": mean,
                "advice": advice,
                "nodes": nodes,
                "error": error,
            })
        );
    } else {
        let mut line = format!("{at} {}", summary(serving, mean, advice, scaler));
        if let Some(e) = error {
            line.push_str(&format!(" ({e})"));
        }
        println!("{line}");
    }
}

fn summary(serving: usize, mean: Option<f64>, advice: &Advice, scaler: &Scaler) -> String {
    let busy = mean.map_or("-".to_string(), |y| format!("{y:.2}"));
    let formula = mean.map_or("-".to_string(), |y| scaler.formula(serving, y).to_string());
    let what = match advice {
        Advice::Hold { reason } => format!("hold ({reason})"),
        Advice::Keep { reason } => format!("keep ({reason})"),
        Advice::Up { to } => format!("scale UP to {to}"),
        Advice::Down { to } => format!("scale DOWN to {to}"),
    };
    format!("serving {serving}, busy {busy}, formula {formula}: {what}")
}

fn mean(busy: &[Option<f64>]) -> Option<f64> {
    let known: Option<Vec<f64>> = busy.iter().copied().collect();
    known
        .filter(|k| !k.is_empty())
        .map(|k| k.iter().sum::<f64>() / k.len() as f64)
}

/// The busy ratios of the nodes that take traffic (draining ones do not).
fn serving_busy(nodes: &[NodeLoad]) -> Vec<Option<f64>> {
    nodes
        .iter()
        .filter(|n| n.state != "draining")
        .map(|n| n.busy_ratio)
        .collect()
}

async fn sample(registry: &RegistryArgs) -> Result<Vec<NodeLoad>, OpsError> {
    let records = read_registry(registry).await?;
    let timeout = registry.connect_timeout;
    let handles: Vec<_> = records
        .into_iter()
        .map(|r| tokio::spawn(node_load(r, timeout, registry.tls.clone())))
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("status task"));
    }
    Ok(out)
}

async fn node_load(r: NodeRecord, timeout: Duration, tls: super::TlsArgs) -> NodeLoad {
    let status = if r.endpoints.admin.is_empty() {
        None
    } else {
        let dial = tls.connector(&r.node_id, r.endpoints.tls, Some(&r.host));
        let connected = match dial {
            Ok(dial) => connect(&r.endpoints.admin, timeout, Bearer::default(), dial).await,
            Err(e) => Err(e),
        };
        match connected {
            Ok(mut c) => tokio::time::timeout(timeout, c.status(StatusRequest {}))
                .await
                .ok()
                .and_then(Result::ok)
                .map(tonic::Response::into_inner),
            Err(_) => None,
        }
    };
    NodeLoad {
        gpus: r.capacity.gpu_count,
        id: r.node_id,
        state: match r.state {
            NodeState::Serving => "serving",
            NodeState::Draining => "draining",
            NodeState::Degraded => "degraded",
        }
        .into(),
        busy_ratio: status.as_ref().map(|s| s.busy_ratio),
        in_flight: status.as_ref().map(|s| s.in_flight),
        queued: status.as_ref().map(|s| s.queued),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIORITIES: &str = include_str!("../../../configs/scaling/keda-priorities.yaml");

    /// The per-service KEDA example: each ScaledObject reads its own
    /// service's busy ratio, each service has a PriorityClass, the more
    /// important one the higher value.
    #[test]
    fn the_priority_example_reads_each_service() {
        let docs: Vec<&str> = PRIORITIES.split("\n---\n").collect();
        let value = |class: &str| {
            let doc = docs
                .iter()
                .find(|d| d.contains(&format!("name: infermesh-{class}\n")))
                .unwrap_or_else(|| panic!("PriorityClass infermesh-{class}"));
            doc.lines()
                .find_map(|l| l.strip_prefix("value: "))
                .and_then(|v| v.trim().parse::<i64>().ok())
                .expect("a value")
        };
        assert!(value("search") > value("batch"));
        for service in ["search", "batch"] {
            let scaled = docs
                .iter()
                .find(|d| {
                    d.contains("kind: ScaledObject") && d.contains(&format!("  name: {service}\n"))
                })
                .unwrap_or_else(|| panic!("ScaledObject {service}"));
            assert!(
                scaled.contains(&format!("service=\"{service}\"")),
                "{service} reads its own busy ratio"
            );
        }
    }

    /// The KEDA and HPA examples implement the CLI's defaults.
    #[test]
    fn the_shipped_autoscaler_examples_match_the_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            scale: ScaleArgs,
        }
        let d = Cli::parse_from(["scale"]).scale;
        for (file, text) in [
            (
                "keda-scaledobject.yaml",
                include_str!("../../../configs/scaling/keda-scaledobject.yaml"),
            ),
            (
                "hpa-external.yaml",
                include_str!("../../../configs/scaling/hpa-external.yaml"),
            ),
            ("keda-priorities.yaml", PRIORITIES),
        ] {
            let up = format!("stabilizationWindowSeconds: {}", d.up_window.as_secs());
            let down = format!("stabilizationWindowSeconds: {}", d.down_window.as_secs());
            let target = format!("\"{}\"", d.target);
            let floor = format!(": {}\n", d.min_nodes);
            for needle in [&up, &down, &target, &floor] {
                assert!(text.contains(needle.as_str()), "{file} lacks {needle:?}");
            }
            assert!(text.contains("infermesh_busy_ratio"), "{file}");
        }
    }
}
