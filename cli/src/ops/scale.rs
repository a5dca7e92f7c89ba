//! `infermesh scale`: how many nodes a service needs, from the busy ratio
//! its agents measure (the share of the last 10 s each had work in flight).
//!
//! The rule ([`ScaleRule`], sans-IO) is WPAI's: with `y` the mean busy ratio
//! of the serving nodes and `N` their count, recommend `ceil(y / target × N)`
//! — up once `y` has stayed above `max` for `up_window` (2 min), down once
//! it has stayed below `min` for `down_window` (5 min), never below
//! `min_nodes`, and *hold* (recommend nothing) while any node's figure is
//! missing. Busy ratio rather than CPU: a GPU-bound worker keeps the CPU idle
//! while the node is saturated. configs/scaling/ holds a KEDA ScaledObject and
//! an HPA that implement the same rule from Prometheus.

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
}

/// The scaling rule's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRule {
    /// Busy ratio aimed for.
    pub target: f64,
    /// Lower edge of the band.
    pub min: f64,
    /// Upper edge of the band.
    pub max: f64,
    /// Time above `max` before scaling up.
    pub up_window: Duration,
    /// Time below `min` before scaling down.
    pub down_window: Duration,
    /// Floor.
    pub min_nodes: usize,
}

/// What the rule says.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase", tag = "advice")]
pub enum Advice {
    /// Missing data: recommend nothing.
    Hold {
        /// Why.
        reason: String,
    },
    /// Within the band, or outside it for less than its window.
    Keep {
        /// Why.
        reason: String,
    },
    /// Grow to `to` nodes.
    Up {
        /// Recommended count.
        to: usize,
    },
    /// Shrink to `to` nodes.
    Down {
        /// Recommended count.
        to: usize,
    },
}

/// The rule with its memory of how long the busy ratio has been out of band.
#[derive(Debug)]
pub struct Scaler {
    rule: ScaleRule,
    above_since: Option<Instant>,
    below_since: Option<Instant>,
}

impl Scaler {
    /// A rule with no history.
    pub fn new(rule: ScaleRule) -> Self {
        Self {
            rule,
            above_since: None,
            below_since: None,
        }
    }

    /// The formula alone: `ceil(busy / target × nodes)`, at least `min_nodes`.
    pub fn formula(&self, nodes: usize, busy: f64) -> usize {
        let want = (busy / self.rule.target * nodes as f64).ceil();
        (want.max(0.0) as usize).max(self.rule.min_nodes)
    }

    /// One sample: the busy ratio of each serving node (`None` where it is
    /// unknown) at `now`.
    pub fn observe(&mut self, now: Instant, busy: &[Option<f64>]) -> Advice {
        let known: Option<Vec<f64>> = busy.iter().copied().collect();
        let Some(known) = known.filter(|k| !k.is_empty()) else {
            self.above_since = None;
            self.below_since = None;
            return Advice::Hold {
                reason: if busy.is_empty() {
                    "no serving node".into()
                } else {
                    "a node's busy ratio is missing".into()
                },
            };
        };
        let n = known.len();
        let y = known.iter().sum::<f64>() / n as f64;
        let r = self.rule;
        if y > r.max {
            self.below_since = None;
            let since = *self.above_since.get_or_insert(now);
            let held = now.saturating_duration_since(since);
            if held >= r.up_window {
                return Advice::Up {
                    to: self.formula(n, y).max(n + 1),
                };
            }
            return Advice::Keep {
                reason: format!(
                    "busy {y:.2} above {:.2} for {}s of {}s",
                    r.max,
                    held.as_secs(),
                    r.up_window.as_secs()
                ),
            };
        }
        self.above_since = None;
        if y < r.min {
            let since = *self.below_since.get_or_insert(now);
            let held = now.saturating_duration_since(since);
            let to = self.formula(n, y);
            if held >= r.down_window && to < n {
                return Advice::Down { to };
            }
            return Advice::Keep {
                reason: if to >= n {
                    format!(
                        "busy {y:.2} below {:.2}, but {n} nodes are what the formula asks for \
                         (floor {})",
                        r.min, r.min_nodes
                    )
                } else {
                    format!(
                        "busy {y:.2} below {:.2} for {}s of {}s",
                        r.min,
                        held.as_secs(),
                        r.down_window.as_secs()
                    )
                },
            };
        }
        self.below_since = None;
        Advice::Keep {
            reason: format!("busy {y:.2} within {:.2}-{:.2}", r.min, r.max),
        }
    }
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

    fn rule() -> ScaleRule {
        ScaleRule {
            target: 0.7,
            min: 0.6,
            max: 0.8,
            up_window: Duration::from_secs(120),
            down_window: Duration::from_secs(300),
            min_nodes: 2,
        }
    }

    #[test]
    fn up_only_after_the_window_and_by_the_formula() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let hot = [Some(0.95); 4];
        assert!(matches!(s.observe(t0, &hot), Advice::Keep { .. }));
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(119), &hot),
            Advice::Keep { .. }
        ));
        // ceil(0.95 / 0.7 × 4) = 6.
        assert_eq!(
            s.observe(t0 + Duration::from_secs(120), &hot),
            Advice::Up { to: 6 }
        );
        // Back in band: the clock restarts.
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(121), &[Some(0.7); 4]),
            Advice::Keep { .. }
        ));
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(122), &hot),
            Advice::Keep { .. }
        ));
    }

    #[test]
    fn down_after_its_longer_window_and_never_below_the_floor() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let cold = [Some(0.2); 6];
        assert!(matches!(s.observe(t0, &cold), Advice::Keep { .. }));
        // ceil(0.2 / 0.7 × 6) = 2.
        assert_eq!(
            s.observe(t0 + Duration::from_secs(300), &cold),
            Advice::Down { to: 2 }
        );
        // At the floor already: keep.
        let mut s = Scaler::new(rule());
        let two = [Some(0.05); 2];
        s.observe(t0, &two);
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(600), &two),
            Advice::Keep { .. }
        ));
    }

    #[test]
    fn missing_data_holds_and_resets_the_windows() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let hot = [Some(0.95); 2];
        s.observe(t0, &hot);
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(60), &[Some(0.95), None]),
            Advice::Hold { .. }
        ));
        assert!(matches!(s.observe(t0, &[]), Advice::Hold { .. }));
        // The hot spell restarts after the gap.
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(130), &hot),
            Advice::Keep { .. }
        ));
        assert_eq!(
            s.observe(t0 + Duration::from_secs(250), &hot),
            Advice::Up { to: 3 }
        );
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
