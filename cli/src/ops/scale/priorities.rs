//! `infermesh scale --priority SERVICE=N ... [--gpu-budget G]`: every
//! service named is sampled and advised by its own rule ([`Scaler`]); the
//! nodes they want are then granted by priority under the budget
//! ([`budget::share`]), and each service's advice is what it is granted:
//! up or down to its grant, and the nodes it gave way, to whom.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::budget::{self, Claim, GaveWay};
use super::rule::{Advice, ScaleRule, Scaler};
use super::{NodeLoad, ScaleArgs, mean, sample, serving_busy};
use crate::ops::OpsError;

/// A service and its priority, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Name in the registry.
    pub name: String,
    /// Higher is more important.
    pub priority: i64,
}

/// `--priority` values, or `fallback` (the `--service`) at priority 0 when
/// there are none (a budget for one service).
pub fn parse(given: &[String], fallback: &str) -> Result<Vec<Service>, OpsError> {
    if given.is_empty() {
        return Ok(vec![Service {
            name: fallback.to_string(),
            priority: 0,
        }]);
    }
    let mut out: Vec<Service> = Vec::new();
    for text in given {
        let parsed = text
            .split_once('=')
            .and_then(|(name, n)| Some((name.trim(), n.trim().parse::<i64>().ok()?)))
            .filter(|(name, _)| infermesh_proto::registry::valid_name(name));
        let Some((name, priority)) = parsed else {
            return Err(OpsError::usage(format!(
                "--priority '{}': expected SERVICE=N, e.g. search=10",
                text.escape_debug()
            )));
        };
        if out.iter().any(|s| s.name == name) {
            return Err(OpsError::usage(format!(
                "--priority: service {name} given twice"
            )));
        }
        out.push(Service {
            name: name.to_string(),
            priority,
        });
    }
    Ok(out)
}

/// The advice for one service in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceAdvice {
    /// Service name.
    pub service: String,
    /// Its priority.
    pub priority: i64,
    /// Nodes taking traffic.
    pub serving: usize,
    /// Their mean busy ratio, if every one answered.
    pub busy_ratio: Option<f64>,
    /// GPUs one of its nodes holds.
    pub gpus_per_node: u64,
    /// What its own rule says.
    pub wants: usize,
    /// What the budget grants.
    pub gets: usize,
    /// Its rule's advice, before the budget.
    pub own_advice: Advice,
    /// The advice: up or down to `gets`, or its own when nothing changed.
    pub advice: Advice,
    /// The nodes it gave way, and to whom.
    pub gave_way: Option<GaveWay>,
    /// Why its nodes could not be read, if they could not.
    pub error: Option<String>,
}

/// Nodes a rule's advice asks for, given `current` serving.
fn wants(advice: &Advice, current: usize) -> usize {
    match advice {
        Advice::Up { to } | Advice::Down { to } => *to,
        Advice::Hold { .. } | Advice::Keep { .. } => current,
    }
}

/// The advice once the budget has granted `gets` of the `current` nodes.
fn granted(own: &Advice, current: usize, gets: usize, gave_way: Option<&GaveWay>) -> Advice {
    use std::cmp::Ordering::*;
    match (gets.cmp(&current), gave_way) {
        (Greater, _) => Advice::Up { to: gets },
        (Less, _) => Advice::Down { to: gets },
        (Equal, None) => own.clone(),
        (Equal, Some(g)) => Advice::Keep {
            reason: format!(
                "wants {}, gives way{}",
                current + g.nodes,
                to_whom(g).map_or(String::new(), |w| format!(" to {w}"))
            ),
        },
    }
}

fn to_whom(g: &GaveWay) -> Option<String> {
    (!g.to.is_empty()).then(|| g.to.join(", "))
}

/// One round: each service's samples (`None`: could not be read, with the
/// reason) through its scaler at `now`, then the budget.
pub fn advise(
    services: &[Service],
    scalers: &mut [Scaler],
    samples: &[Result<Vec<NodeLoad>, String>],
    last_current: &mut [usize],
    rule: &ScaleRule,
    budget: Option<u64>,
    now: Instant,
) -> Vec<ServiceAdvice> {
    let mut rows: Vec<ServiceAdvice> = services
        .iter()
        .zip(scalers.iter_mut())
        .zip(samples)
        .zip(last_current.iter_mut())
        .map(|(((s, scaler), sample), last)| {
            let (advice, busy, serving, gpus, error) = match sample {
                Ok(nodes) => {
                    let busy = serving_busy(nodes);
                    *last = busy.len();
                    let gpus = nodes.iter().map(|n| u64::from(n.gpus)).max().unwrap_or(1);
                    (
                        scaler.observe(now, &busy),
                        mean(&busy),
                        busy.len(),
                        gpus,
                        None,
                    )
                }
                // Unknown: hold, and keep claiming what it had.
                Err(e) => (
                    scaler.observe(now, &[None]),
                    None,
                    *last,
                    1,
                    Some(e.clone()),
                ),
            };
            ServiceAdvice {
                service: s.name.clone(),
                priority: s.priority,
                serving,
                busy_ratio: busy,
                gpus_per_node: gpus.max(1),
                wants: wants(&advice, serving),
                gets: 0,
                own_advice: advice.clone(),
                advice,
                gave_way: None,
                error,
            }
        })
        .collect();
    let claims: Vec<Claim> = rows
        .iter()
        .map(|r| Claim {
            service: r.service.clone(),
            priority: r.priority,
            wants: r.wants,
            floor: rule.min_nodes,
            gpus_per_node: r.gpus_per_node,
        })
        .collect();
    for (row, grant) in rows.iter_mut().zip(budget::share(&claims, budget)) {
        row.gets = grant.gets;
        row.advice = granted(
            &row.own_advice,
            row.serving,
            grant.gets,
            grant.gave_way.as_ref(),
        );
        row.gave_way = grant.gave_way;
    }
    rows
}

/// GPUs `rows` want and are granted.
fn gpus(rows: &[ServiceAdvice]) -> (u64, u64) {
    rows.iter().fold((0, 0), |(w, g), r| {
        (
            w + r.wants as u64 * r.gpus_per_node,
            g + r.gets as u64 * r.gpus_per_node,
        )
    })
}

pub async fn run(
    args: &ScaleArgs,
    rule: ScaleRule,
    services: Vec<Service>,
) -> Result<(), OpsError> {
    let one_sample = !args.watch;
    // One sample has no history: the windows are taken as met.
    let rule = if one_sample {
        ScaleRule {
            up_window: Duration::ZERO,
            down_window: Duration::ZERO,
            ..rule
        }
    } else {
        rule
    };
    let mut scalers: Vec<Scaler> = services.iter().map(|_| Scaler::new(rule)).collect();
    let mut last_current = vec![0; services.len()];
    let mut tick = tokio::time::interval(args.interval);
    loop {
        tick.tick().await;
        let mut samples = Vec::new();
        for s in &services {
            let mut registry = args.registry.clone();
            registry.service = s.name.clone();
            let read = sample(&registry).await;
            if one_sample {
                // A single reading that fails is the command's failure.
                samples.push(Ok(read?));
            } else {
                samples.push(read.map_err(|e| e.message));
            }
        }
        let rows = advise(
            &services,
            &mut scalers,
            &samples,
            &mut last_current,
            &rule,
            args.gpu_budget,
            Instant::now(),
        );
        if one_sample {
            print_once(args, &rows, samples);
            return Ok(());
        }
        print_watch(args, &rows);
    }
}

fn print_once(
    args: &ScaleArgs,
    rows: &[ServiceAdvice],
    samples: Vec<Result<Vec<NodeLoad>, String>>,
) {
    let (wanted, granted) = gpus(rows);
    if args.registry.json {
        let services: Vec<serde_json::Value> = rows
            .iter()
            .zip(samples)
            .map(|(r, nodes)| {
                let mut v = serde_json::to_value(r).expect("serializable");
                v["nodes"] = serde_json::to_value(nodes.unwrap_or_default()).expect("serializable");
                v
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "ok": true,
                "gpu_budget": args.gpu_budget,
                "wanted_gpus": wanted,
                "granted_gpus": granted,
                "services": services,
                "windows": "not applied (one sample; use --watch)",
            }))
            .expect("serializable")
        );
        return;
    }
    println!(
        "{:<20} {:>5} {:>7} {:>5} {:>5} {:>5} {:>5}  ADVICE",
        "SERVICE", "PRIO", "SERVING", "BUSY", "WANTS", "GETS", "GPUS"
    );
    for r in rows {
        println!(
            "{:<20} {:>5} {:>7} {:>5} {:>5} {:>5} {:>5}  {}",
            r.service,
            r.priority,
            r.serving,
            r.busy_ratio.map_or("-".to_string(), |b| format!("{b:.2}")),
            r.wants,
            r.gets,
            r.gets as u64 * r.gpus_per_node,
            what(r)
        );
    }
    println!("{}", budget_line(args.gpu_budget, wanted, granted));
    println!("(one sample: the windows are not applied; --watch applies them)");
}

fn print_watch(args: &ScaleArgs, rows: &[ServiceAdvice]) {
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let (wanted, granted) = gpus(rows);
    if args.registry.json {
        println!(
            "{}",
            serde_json::json!({
                "time": at.to_string(),
                "gpu_budget": args.gpu_budget,
                "wanted_gpus": wanted,
                "granted_gpus": granted,
                "services": rows,
            })
        );
        return;
    }
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} (prio {}) serving {}, busy {}: {}",
                r.service,
                r.priority,
                r.serving,
                r.busy_ratio.map_or("-".to_string(), |b| format!("{b:.2}")),
                what(r)
            )
        })
        .collect();
    println!(
        "{at} {} | {}",
        parts.join(" | "),
        budget_line(args.gpu_budget, wanted, granted)
    );
}

/// The advice in words, with whom it gave way to.
fn what(r: &ServiceAdvice) -> String {
    let mut s = match &r.advice {
        Advice::Hold { reason } => format!("hold ({reason})"),
        Advice::Keep { reason } => format!("keep ({reason})"),
        Advice::Up { to } => format!("scale UP to {to}"),
        Advice::Down { to } => format!("scale DOWN to {to}"),
    };
    if let Some(g) = &r.gave_way {
        s.push_str(&format!(
            "; GAVE WAY {} node(s){}",
            g.nodes,
            to_whom(g).map_or(" (budget)".to_string(), |w| format!(" to {w}"))
        ));
    }
    if let Some(e) = &r.error {
        s.push_str(&format!(" ({e})"));
    }
    s
}

fn budget_line(budget: Option<u64>, wanted: u64, granted: u64) -> String {
    match budget {
        Some(b) => format!("GPU budget {b}: wanted {wanted}, granted {granted}"),
        None => format!("no GPU budget: wanted {wanted}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(busy: f64) -> NodeLoad {
        NodeLoad {
            id: "n".into(),
            state: "serving".into(),
            busy_ratio: Some(busy),
            in_flight: None,
            queued: None,
            gpus: 0,
        }
    }

    fn rule() -> ScaleRule {
        ScaleRule {
            target: 0.7,
            min: 0.6,
            max: 0.8,
            up_window: Duration::ZERO,
            down_window: Duration::ZERO,
            min_nodes: 1,
        }
    }

    #[test]
    fn priorities_parse_and_default_to_the_service() {
        let given = ["search=10".to_string(), " batch = -1".to_string()];
        let s = parse(&given, "default").unwrap();
        assert_eq!((s[0].name.as_str(), s[0].priority), ("search", 10));
        assert_eq!((s[1].name.as_str(), s[1].priority), ("batch", -1));
        assert_eq!(parse(&[], "eta").unwrap()[0].name, "eta");
        for bad in ["search", "search=high", "=3", "a/b=1"] {
            let e = parse(&[bad.to_string()], "x").unwrap_err();
            assert!(e.message.contains("SERVICE=N"), "{bad}: {}", e.message);
        }
        let twice = ["a=1".to_string(), "a=2".to_string()];
        assert!(parse(&twice, "x").unwrap_err().message.contains("twice"));
    }

    /// Both hot, 4 nodes each, 8 GPUs: each wants 6; the high one grows,
    /// the low one shrinks to what is left, and the advice says so.
    #[test]
    fn the_low_priority_is_told_to_give_way() {
        let services = [
            Service {
                name: "batch".into(),
                priority: 1,
            },
            Service {
                name: "search".into(),
                priority: 10,
            },
        ];
        let mut scalers = [Scaler::new(rule()), Scaler::new(rule())];
        let hot = || Ok((0..4).map(|_| node(0.95)).collect::<Vec<_>>());
        let mut last = [0, 0];
        let rows = advise(
            &services,
            &mut scalers,
            &[hot(), hot()],
            &mut last,
            &rule(),
            Some(8),
            Instant::now(),
        );
        // ceil(0.95 / 0.7 × 4) = 6 each.
        assert_eq!((rows[0].wants, rows[1].wants), (6, 6));
        assert_eq!(rows[1].advice, Advice::Up { to: 6 });
        assert_eq!(rows[0].advice, Advice::Down { to: 2 });
        assert_eq!(rows[0].own_advice, Advice::Up { to: 6 });
        assert_eq!(
            rows[0].gave_way,
            Some(GaveWay {
                nodes: 4,
                to: vec!["search".into()]
            })
        );
        assert_eq!(gpus(&rows), (12, 8));
        assert!(what(&rows[0]).contains("GAVE WAY 4 node(s) to search"));

        // Without a budget each gets its own advice.
        let rows = advise(
            &services,
            &mut scalers,
            &[hot(), hot()],
            &mut last,
            &rule(),
            None,
            Instant::now(),
        );
        assert!(rows.iter().all(|r| r.advice == Advice::Up { to: 6 }));

        // A service that cannot be read holds and keeps claiming its 4.
        let rows = advise(
            &services,
            &mut scalers,
            &[hot(), Err("registry down".into())],
            &mut last,
            &rule(),
            Some(8),
            Instant::now(),
        );
        assert!(
            matches!(rows[1].advice, Advice::Hold { .. }),
            "{:?}",
            rows[1]
        );
        assert_eq!((rows[1].wants, rows[1].gets), (4, 4));
        assert_eq!(
            rows[0].advice,
            Advice::Keep {
                reason: "wants 6, gives way to search".into()
            }
        );
    }
}
