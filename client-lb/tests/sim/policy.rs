//! The policies the simulation compares: the [`Balancer`] and three
//! baselines.

use std::time::{Duration, Instant};

use infermesh_client::{
    Balancer, BalancerConfig, LoadReport, NodeId, NodeInfo, NodeState, Outcome,
};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::Cluster;

/// A way of choosing a node, told about every attempt's outcome.
pub trait Policy {
    fn name(&self) -> &'static str;
    /// A node for an attempt at virtual time `now`, not one in `exclude`.
    fn pick(&mut self, now: Duration, cluster: &Cluster, exclude: &[usize]) -> Option<usize>;
    fn on_send(&mut self, _now: Duration, _node: usize) {}
    fn on_reply(
        &mut self,
        _now: Duration,
        _node: usize,
        _latency: Duration,
        _ok: bool,
        _cluster: &Cluster,
    ) {
    }
}

fn id(node: usize) -> NodeId {
    format!("n{}", node + 1)
}

/// The balancer under test, with checks on what it picks.
pub struct BalancerPolicy {
    balancer: Balancer,
    t0: Instant,
    /// Ejections seen (a failure that left the node ejected).
    pub ejections: u32,
    /// Picks of an ejected node while a non-excluded one was not ejected.
    pub ejected_picks: u32,
}

impl BalancerPolicy {
    /// Over nodes of these capacities (advertised as weights), `local` first.
    pub fn new(capacities: &[u32], local: usize, seed: u64) -> Self {
        let config = BalancerConfig {
            local_node: Some(id(local)),
            ..BalancerConfig::default()
        };
        let mut balancer = Balancer::new(config, seed);
        // One origin for virtual time; the balancer itself never reads a clock.
        let t0 = Instant::now();
        let nodes = (0..capacities.len())
            .map(|i| NodeInfo {
                id: id(i),
                weight: f64::from(capacities[i]),
                state: NodeState::Serving,
                zone: if i == local { "local" } else { "remote" }.into(),
                models: None,
            })
            .collect();
        balancer.set_nodes(t0, nodes);
        Self {
            balancer,
            t0,
            ejections: 0,
            ejected_picks: 0,
        }
    }
}

impl Policy for BalancerPolicy {
    fn name(&self) -> &'static str {
        "balancer"
    }

    fn pick(&mut self, now: Duration, cluster: &Cluster, exclude: &[usize]) -> Option<usize> {
        let now = self.t0 + now;
        let excluded: Vec<NodeId> = exclude.iter().map(|&n| id(n)).collect();
        let pick = self.balancer.pick(now, &excluded).ok()?;
        let node: usize = pick.node[1..].parse::<usize>().ok()? - 1;
        if self.balancer.is_ejected(now, &pick.node) {
            let healthy = (0..cluster.len())
                .any(|n| !exclude.contains(&n) && !self.balancer.is_ejected(now, &id(n)));
            if healthy {
                self.ejected_picks += 1;
            }
        }
        Some(node)
    }

    fn on_send(&mut self, now: Duration, node: usize) {
        self.balancer.on_send(self.t0 + now, &id(node));
    }

    fn on_reply(
        &mut self,
        now: Duration,
        node: usize,
        latency: Duration,
        ok: bool,
        cluster: &Cluster,
    ) {
        let now = self.t0 + now;
        let id = id(node);
        let outcome = if ok {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        let was_ejected = self.balancer.is_ejected(now, &id);
        self.balancer.on_response(now, &id, latency, outcome);
        if !was_ejected && self.balancer.is_ejected(now, &id) {
            self.ejections += 1;
        }
        if ok {
            // The agent's trailers: it counts queued requests as in flight.
            let report = LoadReport {
                in_flight: cluster.load(node),
                queued: cluster.queued(node),
                busy_ratio: 1.0,
                weight: f64::from(cluster.capacity(node)),
            };
            self.balancer.on_load_report(now, &id, report);
        }
    }
}

/// Each node in turn.
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    pub fn new() -> Self {
        Self { next: 0 }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round robin"
    }

    fn pick(&mut self, _now: Duration, cluster: &Cluster, exclude: &[usize]) -> Option<usize> {
        for _ in 0..cluster.len() {
            let node = self.next % cluster.len();
            self.next += 1;
            if !exclude.contains(&node) {
                return Some(node);
            }
        }
        None
    }
}

/// A node drawn uniformly at random.
pub struct Random {
    rng: SmallRng,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
        }
    }
}

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn pick(&mut self, _now: Duration, cluster: &Cluster, exclude: &[usize]) -> Option<usize> {
        let allowed: Vec<usize> = (0..cluster.len())
            .filter(|n| !exclude.contains(n))
            .collect();
        if allowed.is_empty() {
            return None;
        }
        Some(allowed[self.rng.random_range(0..allowed.len())])
    }
}

/// Join the shortest queue, relative to capacity, knowing every node's true
/// queue and whether it is down: an oracle no client has. It does not know
/// service speeds.
pub struct ShortestQueue {
    rng: SmallRng,
}

impl ShortestQueue {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
        }
    }
}

impl Policy for ShortestQueue {
    fn name(&self) -> &'static str {
        "jsq (oracle)"
    }

    fn pick(&mut self, now: Duration, cluster: &Cluster, exclude: &[usize]) -> Option<usize> {
        // Start the scan at a random node so that ties spread out.
        let n = cluster.len();
        let start = self.rng.random_range(0..n);
        (0..n)
            .map(|k| (start + k) % n)
            .filter(|&i| !exclude.contains(&i) && !cluster.is_down(i, now))
            .min_by(|&a, &b| {
                let q = |i: usize| (cluster.load(i) + 1) as f64 / f64::from(cluster.capacity(i));
                q(a).total_cmp(&q(b))
            })
    }
}
