//! Rules of the balancer as a whole; the parts have their own tests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn info(id: &str, weight: f64, state: NodeState) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        weight,
        state,
        zone: "z1".into(),
        models: None,
    }
}

fn serving(ids: &[&str]) -> Vec<NodeInfo> {
    ids.iter()
        .map(|id| info(id, 1.0, NodeState::Serving))
        .collect()
}

/// No slow start, so that tests start from full weights.
fn config(local: Option<&str>) -> BalancerConfig {
    BalancerConfig {
        local_node: local.map(str::to_string),
        slow_start: Duration::ZERO,
        ..BalancerConfig::default()
    }
}

fn balancer(local: Option<&str>, nodes: Vec<NodeInfo>, t0: Instant) -> Balancer {
    let mut b = Balancer::new(config(local), 42);
    b.set_nodes(t0, nodes);
    b
}

fn counts(b: &mut Balancer, now: Instant, exclude: &[NodeId], n: usize) -> HashMap<NodeId, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        *counts
            .entry(b.pick(now, exclude).unwrap().node)
            .or_default() += 1;
    }
    counts
}

fn fail(b: &mut Balancer, now: Instant, node: &str, times: u32) {
    for _ in 0..times {
        b.on_send(now, node);
        b.on_response(now, node, MS, Outcome::Failure);
    }
}

#[test]
fn no_nodes_and_nothing_available_are_told_apart() {
    let t0 = Instant::now();
    let mut b = Balancer::new(config(None), 1);
    assert_eq!(b.pick(t0, &[]), Err(PickError::NoNodes));
    b.set_nodes(t0, vec![info("a", 1.0, NodeState::Draining)]);
    assert_eq!(b.pick(t0, &[]), Err(PickError::AllUnavailable));
    b.set_nodes(t0, serving(&["a"]));
    assert_eq!(b.pick(t0, &["a".into()]), Err(PickError::AllUnavailable));
}

#[test]
fn one_eligible_node_is_picked() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a"]), t0);
    let pick = b.pick(t0, &[]).unwrap();
    assert_eq!(pick.node, "a");
    assert!(!pick.local);
}

#[test]
fn local_is_preferred_while_healthy() {
    let t0 = Instant::now();
    let mut b = balancer(Some("l"), serving(&["a", "b", "c", "l"]), t0);
    for _ in 0..1000 {
        let pick = b.pick(t0, &[]).unwrap();
        assert_eq!(pick.node, "l");
        assert!(pick.local);
    }
    // Busier than a remote, but within the bias: still local.
    b.on_response(t0, "l", 7 * MS, Outcome::Success);
    for n in ["a", "b", "c"] {
        b.on_response(t0, n, 5 * MS, Outcome::Success);
    }
    assert_eq!(counts(&mut b, t0, &[], 200)["l"], 200);
}

#[test]
fn traffic_spills_when_local_cost_exceeds_the_bias() {
    let t0 = Instant::now();
    let mut b = balancer(Some("l"), serving(&["a", "b", "c", "l"]), t0);
    // One request in flight doubles local's cost: beyond a bias of 1.5.
    b.on_send(t0, "l");
    for _ in 0..1000 {
        let pick = b.pick(t0, &[]).unwrap();
        assert_ne!(pick.node, "l");
        assert!(!pick.local);
    }
    // Slower, with nothing in flight: 8 ms against 5 ms is beyond 1.5 too.
    b.on_response(t0, "l", 8 * MS, Outcome::Success);
    assert!(!counts(&mut b, t0, &[], 200).contains_key("l"));
    // Local failure moves traffic at once: ejected local is not a candidate.
    let mut b = balancer(Some("l"), serving(&["a", "b", "c", "l"]), t0);
    fail(&mut b, t0, "l", 5);
    assert!(!counts(&mut b, t0, &[], 200).contains_key("l"));
}

#[test]
fn peak_ewma_drives_the_cost() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b"]), t0);
    let cost = |b: &Balancer, now| b.cost(now, "a").unwrap();
    assert!((cost(&b, t0) - 0.005).abs() < 1e-12, "default rtt");
    // A slow response raises the cost at once...
    b.on_response(t0, "a", 50 * MS, Outcome::Success);
    assert!((cost(&b, t0) - 0.050).abs() < 1e-12);
    // ...a fast one a second later barely lowers it...
    b.on_response(t0 + SEC, "a", 5 * MS, Outcome::Success);
    let w = (-0.1f64).exp();
    assert!((cost(&b, t0 + SEC) - (0.050 * w + 0.005 * (1.0 - w))).abs() < 1e-12);
    // ...neither failures nor caller errors are latency samples.
    let before = cost(&b, t0 + SEC);
    b.on_response(t0 + SEC, "a", 900 * MS, Outcome::Neutral);
    b.on_response(t0 + SEC, "a", 900 * MS, Outcome::Failure);
    assert_eq!(cost(&b, t0 + SEC), before);
    // P2C avoids the slow node.
    assert!(!counts(&mut b, t0 + SEC, &[], 200).contains_key("a"));
}

#[test]
fn draining_nodes_are_never_picked() {
    let t0 = Instant::now();
    let mut nodes = serving(&["a", "b"]);
    nodes.push(info("d", 100.0, NodeState::Draining));
    nodes.push(info("l", 1.0, NodeState::Draining));
    let mut b = balancer(Some("l"), nodes, t0);
    let c = counts(&mut b, t0, &[], 1000);
    assert!(!c.contains_key("d") && !c.contains_key("l"));
    // Not even as the last resort.
    assert_eq!(
        b.pick(t0, &["a".into(), "b".into()]),
        Err(PickError::AllUnavailable)
    );
}

#[test]
fn degraded_nodes_serve_only_when_no_serving_node_can() {
    let t0 = Instant::now();
    let nodes = vec![
        info("a", 1.0, NodeState::Serving),
        info("g", 4.0, NodeState::Degraded),
    ];
    let mut b = balancer(None, nodes, t0);
    assert_eq!(counts(&mut b, t0, &[], 200)["a"], 200);
    assert_eq!(b.pick(t0, &["a".into()]).unwrap().node, "g");
    fail(&mut b, t0, "a", 5);
    assert!(b.is_ejected(t0, "a"));
    assert_eq!(b.pick(t0, &[]).unwrap().node, "g");
}

#[test]
fn zero_weight_nodes_are_never_picked() {
    let t0 = Instant::now();
    let nodes = vec![
        info("a", 1.0, NodeState::Serving),
        info("z", 0.0, NodeState::Serving),
        info("n", -2.0, NodeState::Serving),
    ];
    let mut b = balancer(None, nodes, t0);
    assert_eq!(counts(&mut b, t0, &[], 200)["a"], 200);
    assert_eq!(b.cost(t0, "z"), Some(f64::INFINITY));
    // The agent reporting zero weight (no ready worker) has the same effect.
    b.on_load_report(
        t0,
        "a",
        LoadReport {
            in_flight: 0,
            queued: 0,
            busy_ratio: 0.0,
            weight: 0.0,
        },
    );
    assert_eq!(b.pick(t0, &[]), Err(PickError::AllUnavailable));
}

#[test]
fn ejected_after_consecutive_failures_and_back_after_backoff_with_slow_start() {
    let t0 = Instant::now();
    let mut cfg = config(None);
    cfg.slow_start = 10 * SEC;
    let mut b = Balancer::new(cfg, 3);
    b.set_nodes(t0, serving(&["a", "b", "c", "d"]));
    let warm = t0 + 20 * SEC;
    // Four failures, a success, four more: the streak was broken.
    fail(&mut b, warm, "a", 4);
    b.on_response(warm, "a", 5 * MS, Outcome::Success);
    b.on_response(warm, "b", 5 * MS, Outcome::Success);
    fail(&mut b, warm, "a", 4);
    assert!(!b.is_ejected(warm, "a"));
    fail(&mut b, warm, "a", 1);
    assert!(b.is_ejected(warm, "a"));
    assert!(!counts(&mut b, warm, &[], 1000).contains_key("a"));

    // The first ejection lasts between half the base and the base.
    assert!(b.is_ejected(warm + SEC / 2 - MS, "a"));
    let back = warm + SEC;
    assert!(!b.is_ejected(back, "a"));
    // It slow-starts from when the ejection ended, at most half a second
    // ago: at most 14.5% of its weight (a tenth plus 0.5 s of a 10 s ramp),
    // so about seven to ten times the cost of its peers.
    let ratio = b.cost(back, "a").unwrap() / b.cost(back, "b").unwrap();
    assert!((6.8..=10.0).contains(&ratio), "{ratio}");
    let ramped = back + 10 * SEC;
    let ratio = b.cost(ramped, "a").unwrap() / b.cost(ramped, "b").unwrap();
    assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");

    // Failing again right away ejects it for longer: nominally 2 s.
    fail(&mut b, back, "a", 5);
    assert!(b.is_ejected(back + SEC - MS, "a"));
    assert!(!b.is_ejected(back + 2 * SEC, "a"));
}

#[test]
fn no_more_than_the_max_share_is_ejected() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b", "c", "d"]), t0);
    fail(&mut b, t0, "a", 5);
    fail(&mut b, t0, "b", 5);
    fail(&mut b, t0, "c", 5);
    assert!(b.is_ejected(t0, "a") && b.is_ejected(t0, "b"));
    assert!(!b.is_ejected(t0, "c"), "half of four are ejected already");
    assert!(counts(&mut b, t0, &[], 1000).contains_key("c"));
    // Once a slot frees up, the next failure of the still-failing node ejects it.
    let later = t0 + 2 * SEC;
    assert!(!b.is_ejected(later, "a"));
    fail(&mut b, later, "c", 1);
    assert!(b.is_ejected(later, "c"));
}

#[test]
fn a_single_node_is_never_ejected() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a"]), t0);
    fail(&mut b, t0, "a", 50);
    assert!(!b.is_ejected(t0, "a"));
    assert_eq!(b.pick(t0, &[]).unwrap().node, "a");
}

#[test]
fn excluded_nodes_are_not_picked() {
    let t0 = Instant::now();
    let mut b = balancer(Some("l"), serving(&["a", "b", "c", "l"]), t0);
    let exclude: Vec<NodeId> = vec!["l".into(), "a".into()];
    let c = counts(&mut b, t0, &exclude, 1000);
    assert!(!c.contains_key("l") && !c.contains_key("a"));
    assert!(c.contains_key("b") && c.contains_key("c"));
}

#[test]
fn ejected_nodes_are_the_last_resort_when_the_rest_are_excluded() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b", "c", "d"]), t0);
    fail(&mut b, t0, "a", 5);
    assert!(b.is_ejected(t0, "a"));
    let tried: Vec<NodeId> = vec!["b".into(), "c".into(), "d".into()];
    assert_eq!(b.pick(t0, &tried).unwrap().node, "a");
}

#[test]
fn picks_follow_capacity() {
    let t0 = Instant::now();
    let nodes = vec![
        info("a", 1.0, NodeState::Serving),
        info("b", 2.0, NodeState::Serving),
        info("c", 4.0, NodeState::Serving),
    ];
    let mut b = balancer(None, nodes, t0);
    // A closed loop of 12 requests in flight: each pick adds to the load.
    let mut seen: HashMap<NodeId, usize> = HashMap::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut now = t0;
    for _ in 0..7000 {
        if in_flight.len() == 14 {
            let node: NodeId = in_flight.pop_front().unwrap();
            b.on_response(now, &node, 5 * MS, Outcome::Success);
        }
        now += MS;
        let node = b.pick(now, &[]).unwrap().node;
        b.on_send(now, &node);
        *seen.entry(node.clone()).or_default() += 1;
        in_flight.push_back(node);
    }
    let share = |id: &str| seen[id] as f64 / 7000.0;
    assert!(share("a") < share("b") && share("b") < share("c"));
    assert!((share("c") - 4.0 / 7.0).abs() < 0.15, "{seen:?}");
}

#[test]
fn membership_changes_keep_stats_and_forget_removed_nodes() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b"]), t0);
    b.on_response(t0, "a", 40 * MS, Outcome::Success);
    fail(&mut b, t0, "b", 5);
    assert!(b.is_ejected(t0, "b"));
    // "a" takes a new weight and keeps its latency; "b" leaves and comes back.
    b.set_nodes(t0, vec![info("a", 2.0, NodeState::Serving)]);
    assert_eq!(b.nodes(), vec!["a".to_string()]);
    assert!((b.cost(t0, "a").unwrap() - 0.020).abs() < 1e-12);
    b.set_nodes(t0, serving(&["b", "a", "b"]));
    assert_eq!(b.nodes(), vec!["a".to_string(), "b".to_string()]);
    assert!(!b.is_ejected(t0, "b"));
    assert_eq!(b.cost(t0, "x"), None);
}

#[test]
fn new_nodes_slow_start() {
    let t0 = Instant::now();
    let cfg = BalancerConfig::default();
    let mut b = Balancer::new(cfg, 5);
    b.set_nodes(t0, serving(&["a"]));
    let later = t0 + 30 * SEC;
    b.set_nodes(later, serving(&["a", "b"]));
    let ratio = b.cost(later, "b").unwrap() / b.cost(later, "a").unwrap();
    // "a" has decayed for 30 s with no samples; compare with the undecayed rtt.
    assert!(ratio > 10.0, "{ratio}");
    let c = counts(&mut b, later, &[], 1000);
    assert_eq!(c.get("b"), None, "a cold node loses every comparison");
}

#[test]
fn load_reports_count_other_clients_and_override_the_weight() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b"]), t0);
    b.on_send(t0, "a");
    b.on_load_report(
        t0,
        "a",
        LoadReport {
            in_flight: 4,
            queued: 2,
            busy_ratio: 1.0,
            weight: 2.0,
        },
    );
    // Own 1 + others 3 + 1, over the reported weight 2.
    assert!((b.cost(t0, "a").unwrap() - 0.005 * 5.0 / 2.0).abs() < 1e-12);
    // A stale report no longer counts: own 1 + 1 over the advertised 1 (the
    // latency estimate having decayed meanwhile).
    let stale = t0 + b.config().load_report_ttl + MS;
    let ratio = b.cost(stale, "a").unwrap() / b.cost(stale, "b").unwrap();
    assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
}

#[test]
fn the_same_seed_gives_the_same_picks() {
    let t0 = Instant::now();
    let run = |seed| {
        let mut b = Balancer::new(config(None), seed);
        b.set_nodes(t0, serving(&["a", "b", "c", "d", "e"]));
        (0..50)
            .map(|_| b.pick(t0, &[]).unwrap().node)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

/// The share of picks each node gets, from `n` picks made by `pick`.
fn shares(
    b: &mut Balancer,
    n: u32,
    mut pick: impl FnMut(&mut Balancer) -> Option<usize>,
) -> Vec<f64> {
    let mut counts = vec![0u32; b.nodes.len()];
    for _ in 0..n {
        if let Some(i) = pick(b) {
            counts[i] += 1;
        }
    }
    counts
        .iter()
        .map(|&c| f64::from(c) / f64::from(n))
        .collect()
}

/// The nodes `mixed` makes degraded, in cases that have some.
const DEGRADED: [&str; 5] = ["a", "b", "c", "d", "e"];

/// A state in which to compare the fast path with the scan.
struct Case {
    name: &'static str,
    local: Option<&'static str>,
    nodes: Vec<NodeInfo>,
    exclude: Vec<NodeId>,
    /// How many nodes, first by id, are ejected.
    ejected: usize,
}

fn case(name: &'static str, local: Option<&'static str>, nodes: Vec<NodeInfo>) -> Case {
    Case {
        name,
        local,
        nodes,
        exclude: Vec::new(),
        ejected: 0,
    }
}

fn ids(ids: &[&str]) -> Vec<NodeId> {
    ids.iter().map(|id| id.to_string()).collect()
}

#[test]
fn the_fast_path_picks_with_the_same_distribution_as_the_scan() {
    let t0 = Instant::now();
    let now = t0 + 3 * SEC;
    let index = |b: &Balancer, id: &str| b.index(id).unwrap();
    let cases = [
        case("healthy, local busy", Some("l"), mixed(&[])),
        Case {
            exclude: ids(&["a", "l"]),
            ..case("exclusions", Some("l"), mixed(&[]))
        },
        Case {
            ejected: 4,
            ..case("most ejected", None, mixed(&[]))
        },
        case("some degraded", None, mixed(&DEGRADED)),
        Case {
            exclude: ids(&["f", "g", "h", "x"]),
            ..case("only local serves", Some("l"), mixed(&DEGRADED))
        },
        Case {
            exclude: ids(&["f", "g", "h", "l", "x"]),
            ..case("only degraded left", Some("l"), mixed(&DEGRADED))
        },
        case("two nodes", Some("l"), serving(&["a", "l"])),
        case("three nodes", None, serving(&["a", "b", "c"])),
    ];
    for Case {
        name,
        local,
        nodes,
        exclude,
        ejected,
    } in cases
    {
        let mut cfg = config(local);
        // Ramps still under way at `now`, for the nodes that join later.
        cfg.slow_start = 10 * SEC;
        cfg.max_ejected_share = 1.0;
        let mut b = Balancer::new(cfg, 17);
        b.set_nodes(t0 - 20 * SEC, nodes.clone());
        b.set_nodes(t0, nodes.iter().cloned().chain(late()).collect());
        for (k, id) in b.nodes().iter().enumerate() {
            for _ in 0..k % 3 {
                b.on_send(now, id);
            }
            let latency = MS * (2 + (k as u32 * 7) % 11);
            b.on_response(now, id, latency, Outcome::Success);
        }
        // A report that lowers a weight leaves the bound loose.
        let report = |weight| LoadReport {
            in_flight: 2,
            queued: 0,
            busy_ratio: 0.5,
            weight,
        };
        b.on_load_report(now, "c", report(9.0));
        b.on_load_report(now, "c", report(0.5));
        if local.is_some() {
            b.on_send(now, "l");
        }
        for id in b.nodes().into_iter().take(ejected) {
            fail(&mut b, now, &id, 5);
        }
        // Shares of 40,000 picks differ by about 0.003 between two samplers
        // of the same distribution.
        let n = 40_000;
        let fast = shares(&mut b, n, |b| {
            let node = b.pick(now, &exclude).ok()?.node;
            Some(index(b, &node))
        });
        let scan = shares(&mut b, n, |b| {
            b.pick_by_scan(
                now,
                &Filter {
                    exclude: &exclude,
                    model: None,
                },
            )
        });
        for (i, (f, s)) in fast.iter().zip(&scan).enumerate() {
            assert!(
                (f - s).abs() < 0.015,
                "{name}: node {}: fast {f:.3}, scan {s:.3}",
                b.nodes[i].id()
            );
        }
    }
}

/// Remote nodes "a" to "h" of weights 1 to 4, and "l"; `degraded` are
/// degraded.
fn mixed(degraded: &[&str]) -> Vec<NodeInfo> {
    ["a", "b", "c", "d", "e", "f", "g", "h", "l"]
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let state = if degraded.contains(id) {
                NodeState::Degraded
            } else {
                NodeState::Serving
            };
            info(id, (k % 4 + 1) as f64, state)
        })
        .collect()
}

/// Nodes that join at `t0`, still slow-starting.
fn late() -> Vec<NodeInfo> {
    vec![
        info("x", 3.0, NodeState::Serving),
        info("y", 1.0, NodeState::Degraded),
    ]
}

#[test]
fn start_counts_in_flight_and_finish_takes_it_back() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b"]), t0);
    let t = b.start(t0, &[], None).unwrap();
    assert_eq!(b.in_flight(&t.node), Some(1));
    b.finish(t0 + MS, &t, Outcome::Cancelled);
    assert_eq!(b.in_flight(&t.node), Some(0));
    // A ticket from before the node left and came back does not count
    // against the new node.
    let t = b.start(t0, &[], None).unwrap();
    b.set_nodes(t0, serving(&[]));
    b.set_nodes(t0, serving(&["a", "b"]));
    let fresh = b.start(t0, std::slice::from_ref(&t.node), None).unwrap();
    let again = b
        .start(t0, std::slice::from_ref(&fresh.node), None)
        .unwrap();
    assert_eq!(again.node, t.node);
    b.finish(t0, &t, Outcome::Failure);
    assert_eq!(b.in_flight(&t.node), Some(1));
}

#[test]
fn routes_by_model_and_forgets_not_found_when_models_change() {
    let t0 = Instant::now();
    let with = |id: &str, models: &[&str]| NodeInfo {
        models: Some(models.iter().map(|m| m.to_string()).collect()),
        ..info(id, 1.0, NodeState::Serving)
    };
    let mut b = balancer(None, vec![with("a", &["dense"]), with("b", &["other"])], t0);
    for _ in 0..100 {
        let t = b.start(t0, &[], Some("other")).unwrap();
        assert_eq!(t.node, "b");
        b.finish(t0, &t, Outcome::Success);
    }
    assert_eq!(b.start(t0, &[], Some("x")), Err(PickError::NoModel));
    b.model_missing("b", "other");
    assert_eq!(b.start(t0, &[], Some("other")), Err(PickError::NoModel));
    // Same record: still missing. New models: believed again.
    b.set_nodes(t0, vec![with("a", &["dense"]), with("b", &["other"])]);
    assert_eq!(b.start(t0, &[], Some("other")), Err(PickError::NoModel));
    b.set_nodes(t0, vec![with("a", &["dense"]), with("b", &["other", "x"])]);
    assert_eq!(b.start(t0, &[], Some("other")).unwrap().node, "b");
}

#[test]
fn a_timeout_is_a_failure_and_lengthens_the_next_timeout() {
    let t0 = Instant::now();
    let mut b = balancer(None, serving(&["a", "b"]), t0);
    assert_eq!(b.attempt_timeout("a"), None, "no sample: only the deadline");
    b.on_send(t0, "a");
    b.on_response(t0, "a", 10 * MS, Outcome::Success);
    let floor = b.config().attempt_timeout_floor;
    assert_eq!(b.attempt_timeout("a"), Some(floor));
    for i in 0..5 {
        let t = b.start(t0, &["b".to_string()], None).unwrap();
        b.finish(t0 + floor * (i + 1), &t, Outcome::TimedOut);
    }
    assert!(b.is_ejected(t0 + floor * 5, "a"), "five timeouts eject");
    assert!(b.attempt_timeout("a").unwrap() > floor * 4);
}
