//! Invariants of the balancer over random memberships and event sequences.

use std::time::{Duration, Instant};

use infermesh_client::{
    Balancer, BalancerConfig, LoadReport, NodeId, NodeInfo, NodeState, Outcome, Pick, PickError,
};
use proptest::prelude::*;

const MAX_NODES: usize = 8;

fn id(i: usize) -> NodeId {
    format!("n{i}")
}

#[derive(Debug, Clone)]
enum Op {
    Advance(Duration),
    Send(usize),
    Respond(usize, Duration, Outcome),
    Report(usize, u64, f64),
    SetState(usize, NodeState),
    /// Pick, excluding the nodes whose bit is set.
    Pick(u8),
}

#[derive(Debug, Clone)]
struct Scenario {
    nodes: Vec<(f64, NodeState)>,
    local: Option<usize>,
    eject_after: u32,
    max_ejected_share: f64,
    slow_start: Duration,
    seed: u64,
    ops: Vec<Op>,
}

fn state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        6 => Just(NodeState::Serving),
        2 => Just(NodeState::Degraded),
        2 => Just(NodeState::Draining),
    ]
}

fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![1 => Just(0.0), 6 => 0.5..4.0f64]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    // Failures often, so that nodes get ejected.
    prop_oneof![
        3 => Just(Outcome::Success),
        4 => Just(Outcome::Failure),
        1 => Just(Outcome::Neutral),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let node = 0..MAX_NODES;
    prop_oneof![
        2 => prop_oneof![4 => 0..500u64, 1 => 0..30_000u64]
            .prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
        3 => node.clone().prop_map(Op::Send),
        5 => (node.clone(), 1..200u64, outcome())
            .prop_map(|(n, ms, o)| Op::Respond(n, Duration::from_millis(ms), o)),
        1 => (node.clone(), 0..20u64, weight()).prop_map(|(n, f, w)| Op::Report(n, f, w)),
        1 => (node, state()).prop_map(|(n, s)| Op::SetState(n, s)),
        6 => any::<u8>().prop_map(Op::Pick),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec((weight(), state()), 0..=MAX_NODES),
        prop::option::of(0..MAX_NODES),
        1..4u32,
        prop_oneof![Just(0.25), Just(0.5), Just(1.0)],
        prop_oneof![Just(Duration::ZERO), Just(Duration::from_secs(10))],
        any::<u64>(),
        prop::collection::vec(op(), 0..120),
    )
        .prop_map(
            |(nodes, local, eject_after, max_ejected_share, slow_start, seed, ops)| Scenario {
                nodes,
                local,
                eject_after,
                max_ejected_share,
                slow_start,
                seed,
                ops,
            },
        )
}

/// What a check sees after each pick.
struct Seen<'a> {
    balancer: &'a Balancer,
    now: Instant,
    states: &'a [NodeState],
    exclude: &'a [NodeId],
    local: Option<NodeId>,
    result: Result<Pick, PickError>,
}

impl Seen<'_> {
    fn state(&self, node: &str) -> NodeState {
        let i: usize = node[1..].parse().expect("node ids are n<index>");
        self.states[i]
    }

    /// Nodes that could take a request: in membership, not draining, with
    /// weight, not excluded; `ejected` and `state` narrow it further.
    fn available(&self, ejected: bool, state: NodeState) -> Vec<NodeId> {
        self.balancer
            .nodes()
            .into_iter()
            .filter(|n| !self.exclude.contains(n))
            .filter(|n| self.state(n) == state)
            .filter(|n| self.balancer.is_ejected(self.now, n) == ejected)
            .filter(|n| {
                self.balancer
                    .cost(self.now, n)
                    .is_some_and(|c| c.is_finite())
            })
            .collect()
    }

    fn any_available(&self) -> bool {
        [NodeState::Serving, NodeState::Degraded]
            .into_iter()
            .any(|s| !self.available(false, s).is_empty() || !self.available(true, s).is_empty())
    }
}

/// Replays `s`, calling `check` after every pick.
fn replay(s: &Scenario, mut check: impl FnMut(&Seen<'_>) -> Result<(), TestCaseError>) {
    let t0 = Instant::now();
    let local = s.local.filter(|&l| l < s.nodes.len()).map(id);
    let config = BalancerConfig {
        local_node: local.clone(),
        eject_after: s.eject_after,
        max_ejected_share: s.max_ejected_share,
        slow_start: s.slow_start,
        ..BalancerConfig::default()
    };
    let mut states: Vec<NodeState> = s.nodes.iter().map(|&(_, st)| st).collect();
    let membership = |states: &[NodeState]| -> Vec<NodeInfo> {
        s.nodes
            .iter()
            .zip(states)
            .enumerate()
            .map(|(i, (&(weight, _), &state))| NodeInfo {
                id: id(i),
                weight,
                state,
                zone: "z".into(),
                models: None,
            })
            .collect()
    };
    let mut b = Balancer::new(config, s.seed);
    b.set_nodes(t0, membership(&states));
    let mut now = t0;
    for op in &s.ops {
        match *op {
            Op::Advance(d) => now += d,
            Op::Send(n) => b.on_send(now, &id(n)),
            Op::Respond(n, latency, outcome) => b.on_response(now, &id(n), latency, outcome),
            Op::Report(n, in_flight, weight) => {
                let report = LoadReport {
                    in_flight,
                    queued: in_flight / 2,
                    busy_ratio: 0.5,
                    weight,
                };
                b.on_load_report(now, &id(n), report);
            }
            Op::SetState(n, state) => {
                if let Some(st) = states.get_mut(n) {
                    *st = state;
                    b.set_nodes(now, membership(&states));
                }
            }
            Op::Pick(mask) => {
                let exclude: Vec<NodeId> = (0..s.nodes.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(id)
                    .collect();
                let result = b.pick(now, &exclude);
                let seen = Seen {
                    balancer: &b,
                    now,
                    states: &states,
                    exclude: &exclude,
                    local: local.clone(),
                    result,
                };
                if let Err(e) = check(&seen) {
                    panic!("{e}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An ejected node is picked only when no serving or degraded node that
    /// is not ejected remains (after exclusions); a degraded one only when no
    /// serving one does.
    #[test]
    fn never_picks_an_ejected_node_while_a_healthy_one_exists(s in scenario()) {
        replay(&s, |seen| {
            let Ok(pick) = &seen.result else { return Ok(()) };
            let healthy_serving = seen.available(false, NodeState::Serving);
            let healthy_degraded = seen.available(false, NodeState::Degraded);
            if seen.balancer.is_ejected(seen.now, &pick.node) {
                prop_assert!(
                    healthy_serving.is_empty() && healthy_degraded.is_empty(),
                    "picked ejected {} over {healthy_serving:?} {healthy_degraded:?}",
                    pick.node
                );
            } else if seen.state(&pick.node) == NodeState::Degraded {
                prop_assert!(
                    healthy_serving.is_empty(),
                    "picked degraded {} over {healthy_serving:?}",
                    pick.node
                );
            }
            prop_assert_eq!(pick.local, seen.local.as_ref() == Some(&pick.node));
            Ok(())
        });
    }

    /// Draining nodes and nodes without weight never get a request, even as
    /// the last resort.
    #[test]
    fn never_picks_a_draining_node(s in scenario()) {
        replay(&s, |seen| {
            if let Ok(pick) = &seen.result {
                prop_assert_ne!(seen.state(&pick.node), NodeState::Draining);
                let cost = seen.balancer.cost(seen.now, &pick.node);
                prop_assert!(cost.is_some_and(f64::is_finite), "no weight: {}", pick.node);
            }
            Ok(())
        });
    }

    /// An excluded node is never picked; a pick fails only when nothing
    /// else could take the request.
    #[test]
    fn never_picks_an_excluded_node_while_another_eligible_exists(s in scenario()) {
        replay(&s, |seen| {
            match &seen.result {
                Ok(pick) => prop_assert!(!seen.exclude.contains(&pick.node)),
                Err(PickError::NoNodes) => prop_assert!(seen.balancer.nodes().is_empty()),
                Err(PickError::AllUnavailable) => {
                    prop_assert!(!seen.balancer.nodes().is_empty());
                    prop_assert!(!seen.any_available(), "refused with nodes available");
                }
                Err(PickError::NoModel) => prop_assert!(false, "no model was asked for"),
            }
            Ok(())
        });
    }
}
