//! The balancer core: which node gets the next request.
//!
//! [`Balancer`] is a sans-IO state machine. The driver (discovery watcher,
//! request path) feeds it membership from discovery ([`Balancer::set_nodes`]),
//! each request's send and response ([`Balancer::on_send`],
//! [`Balancer::on_response`]) and the agents' load reports
//! ([`Balancer::on_load_report`]), each stamped with an explicit `now`, and
//! asks it for a node per attempt ([`Balancer::pick`]). It reads no clock,
//! does no I/O and draws its randomness from a seeded RNG, so tests and the
//! simulation in `tests/simulation.rs` replay exactly.
//!
//! Per node it keeps a peak-EWMA latency estimate (`peak_ewma.rs`), its own
//! in-flight count, the latest load report (`load.rs`), the failure streak
//! and ejection history (`ejection.rs`) and the slow-start ramp
//! (`slow_start.rs`). The node's cost, the expected wait for one more
//! request, is
//!
//! ```text
//! cost = peak_ewma_latency × (in_flight + others_in_flight + 1) / effective_weight
//! effective_weight = (fresh reported weight, else advertised weight) × slow_start_factor
//! ```
//!
//! A pick goes through these steps (`pick.rs` has the choice itself):
//!
//! 1. Candidates: nodes not excluded by the caller, not draining, with
//!    positive weight. Among them, the first non-empty tier wins:
//!    serving and not ejected; else degraded and not ejected; else ejected
//!    (serving or degraded). Falling back to ejected nodes rather than
//!    failing means a request is never refused while some node might serve
//!    it, for instance when retries have excluded all the healthy ones.
//! 2. If the local node is a candidate, it is compared against the better of
//!    two remote candidates sampled by weight and kept while
//!    `local_cost <= local_bias × remote_cost`.
//! 3. Otherwise power of two choices among the candidates: two distinct
//!    nodes sampled by weight, the cheaper one wins.
//!
//! The weighted draws are made by rejection sampling over the membership
//! rather than by scanning it, so that a pick costs the same with a thousand
//! nodes as with ten; when that does not succeed quickly (few healthy nodes,
//! or none), the pick scans. Both give the same distribution; `pick.rs`
//! explains why.
//!
//! Ejection follows consecutive failures, but never beyond
//! `max_ejected_share` of the membership: a node that fails while the cap is
//! reached stays in rotation ("panic mode"), and is ejected by a later
//! failure once a slot frees up.

mod config;
mod ejection;
mod load;
mod node;
mod peak_ewma;
mod pick;
mod slow_start;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;

pub use config::BalancerConfig;
pub use load::LoadReport;
pub use node::{NodeId, NodeInfo, NodeState, Outcome};
pub use pick::{Pick, PickError};

use node::Node;
use pick::Candidate;

/// Local-first, power-of-two-choices load balancer over a set of nodes.
#[derive(Debug)]
pub struct Balancer {
    config: BalancerConfig,
    /// Sorted by id, so that iteration order (and so every seeded run) is
    /// deterministic.
    nodes: Vec<Node>,
    rng: SmallRng,
    /// Reused by `pick` to avoid allocating per request.
    remotes: Vec<Candidate>,
    /// The local node's position in `nodes`, if it is a member.
    local: Option<usize>,
    /// At least every node's effective weight, now and until the next report
    /// or membership update: the bound of the rejection sampling. It may be
    /// loose (a node's report lowered its weight); the exact scan tightens it.
    weight_bound: f64,
    /// The serial the next new node gets (see [`Ticket`]).
    next_serial: u64,
}

/// A request counted in flight on a node: taken by [`Balancer::start`]
/// (pick and count in one step), given back to [`Balancer::finish`] with
/// the outcome. A ticket whose node left (and maybe came back) in between
/// is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The node picked.
    pub node: NodeId,
    /// Whether it is the local node.
    pub local: bool,
    /// When the request was counted in flight.
    pub sent: Instant,
    serial: u64,
}

/// How much a candidate is preferred; the lowest tier present wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Serving,
    Degraded,
    Ejected,
}

impl Balancer {
    /// A balancer with no nodes yet, drawing its randomness from `seed`.
    pub fn new(config: BalancerConfig, seed: u64) -> Self {
        Self {
            config,
            nodes: Vec::new(),
            rng: SmallRng::seed_from_u64(seed),
            remotes: Vec::new(),
            local: None,
            weight_bound: 0.0,
            next_serial: 0,
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &BalancerConfig {
        &self.config
    }

    /// Replaces the membership with discovery's latest view. New nodes start
    /// their slow start at `now`; removed nodes are forgotten (a node that is
    /// removed and comes back starts afresh); existing nodes keep their
    /// statistics and take the new weight and state. A node that comes back
    /// from draining or from zero weight slow-starts again. If an id appears
    /// twice, the first entry wins.
    pub fn set_nodes(&mut self, now: Instant, nodes: Vec<NodeInfo>) {
        let mut old: BTreeMap<NodeId, Node> = std::mem::take(&mut self.nodes)
            .into_iter()
            .map(|n| (n.info.id.clone(), n))
            .collect();
        let mut infos = nodes;
        infos.sort_by(|a, b| a.id.cmp(&b.id));
        infos.dedup_by(|later, first| later.id == first.id);
        let mut nodes = Vec::with_capacity(infos.len());
        for info in infos {
            nodes.push(match old.remove(&info.id) {
                Some(mut node) => {
                    node.update(now, info, &self.config);
                    node
                }
                None => {
                    self.next_serial += 1;
                    Node::new(now, info, &self.config, self.next_serial)
                }
            });
        }
        self.nodes = nodes;
        self.local = self
            .config
            .local_node
            .as_deref()
            .and_then(|id| self.index(id));
        self.weight_bound = self.max_weight();
    }

    /// The largest weight any node may have until the next report or
    /// membership update.
    fn max_weight(&self) -> f64 {
        self.nodes.iter().map(Node::max_weight).fold(0.0, f64::max)
    }

    /// Chooses a node for a request, never one in `exclude` (the nodes this
    /// request has already tried).
    pub fn pick(&mut self, now: Instant, exclude: &[NodeId]) -> Result<Pick, PickError> {
        let chosen = self.choose(
            now,
            &Filter {
                exclude,
                model: None,
            },
        )?;
        Ok(Pick {
            local: Some(chosen) == self.local,
            node: self.nodes[chosen].id().to_string(),
        })
    }

    /// Picks a node for a request for `model` (any node when `None`), never
    /// one in `exclude`, and counts the request in flight there, in one
    /// step: concurrent callers holding the lock around this see each
    /// other's picks. Give the ticket back to [`finish`](Self::finish).
    ///
    /// Only nodes that advertise `model` as ready (or advertise no models)
    /// and have not answered `NOT_FOUND` for it are candidates;
    /// [`PickError::NoModel`] when no node at all would be.
    pub fn start(
        &mut self,
        now: Instant,
        exclude: &[NodeId],
        model: Option<&str>,
    ) -> Result<Ticket, PickError> {
        let chosen = match self.choose(now, &Filter { exclude, model }) {
            Err(PickError::AllUnavailable)
                if model.is_some_and(|m| !self.nodes.iter().any(|n| n.serves(m))) =>
            {
                return Err(PickError::NoModel);
            }
            other => other?,
        };
        let node = &mut self.nodes[chosen];
        node.on_send();
        Ok(Ticket {
            node: node.id().to_string(),
            local: Some(chosen) == self.local,
            sent: now,
            serial: node.serial,
        })
    }

    /// The request of `ticket` ended at `now` with `outcome`: as
    /// [`on_response`](Self::on_response) with the latency since the ticket
    /// was taken. Ignored if the node left since.
    pub fn finish(&mut self, now: Instant, ticket: &Ticket, outcome: Outcome) {
        let Some(index) = self.index(&ticket.node) else {
            return;
        };
        if self.nodes[index].serial != ticket.serial {
            return;
        }
        let latency = now.saturating_duration_since(ticket.sent);
        self.on_response(now, &ticket.node, latency, outcome);
    }

    /// Whether a request for `model` that has tried `exclude` and is now on
    /// `node` could still go somewhere else: the caller's cue to hold an
    /// attempt to its per-attempt timeout (another node can take over) or to
    /// give it all the time left (none can).
    pub fn has_other(
        &self,
        now: Instant,
        exclude: &[NodeId],
        node: &str,
        model: Option<&str>,
    ) -> bool {
        let filter = Filter { exclude, model };
        self.nodes
            .iter()
            .any(|n| n.id() != node && candidate(now, n, &filter, &self.config).is_some())
    }

    /// `node` answered `NOT_FOUND` for `model`: it is no candidate for that
    /// model until its advertised models change.
    pub fn model_missing(&mut self, node: &str, model: &str) {
        if let Some(n) = self.node_mut(node) {
            n.mark_missing(model);
        }
    }

    /// The per-attempt timeout for `node` (see
    /// [`BalancerConfig::attempt_timeout_factor`]); `None` for an unknown
    /// node or one with no latency sample yet.
    pub fn attempt_timeout(&self, node: &str) -> Option<Duration> {
        self.node(node)?.attempt_timeout(&self.config)
    }

    /// This client's requests in flight on `node`; `None` if unknown.
    pub fn in_flight(&self, node: &str) -> Option<u64> {
        self.node(node).map(Node::in_flight)
    }

    fn choose(&mut self, now: Instant, filter: &Filter<'_>) -> Result<usize, PickError> {
        if self.nodes.is_empty() {
            return Err(PickError::NoNodes);
        }
        match self.draw_serving_remote(now, filter, None) {
            Some(first) => self.pick_among_serving(now, filter, first),
            None => self.pick_by_scan(now, filter),
        }
        .ok_or(PickError::AllUnavailable)
    }

    /// Draws a serving, non-ejected remote candidate other than `skip`, by
    /// weight, by rejection sampling; `None` if that did not succeed (see
    /// `pick.rs`).
    fn draw_serving_remote(
        &mut self,
        now: Instant,
        filter: &Filter<'_>,
        skip: Option<usize>,
    ) -> Option<usize> {
        let (nodes, config, local) = (&self.nodes, &self.config, self.local);
        pick::draw_by_rejection(&mut self.rng, nodes.len(), self.weight_bound, |i| {
            if Some(i) == skip || Some(i) == local {
                return 0.0;
            }
            match candidate(now, &nodes[i], filter, config) {
                Some((Tier::Serving, weight)) => weight,
                _ => 0.0,
            }
        })
    }

    /// Steps 2 and 3 once `first`, a serving remote node, has been drawn:
    /// serving is then the best tier present.
    fn pick_among_serving(
        &mut self,
        now: Instant,
        filter: &Filter<'_>,
        first: usize,
    ) -> Option<usize> {
        let second = match self.draw_serving_remote(now, filter, Some(first)) {
            Some(second) => Some(second),
            None => self.draw_serving_remote_by_scan(now, filter, first),
        };
        let (nodes, config) = (&self.nodes, &self.config);
        let local = self.local.filter(|&l| {
            matches!(
                candidate(now, &nodes[l], filter, config),
                Some((Tier::Serving, _))
            )
        });
        Some(pick::decide(local, first, second, config.local_bias, |i| {
            nodes[i].cost(now, config)
        }))
    }

    /// The exact draw of a serving, non-ejected remote candidate other than
    /// `skip`, by weight; `None` if there is none.
    fn draw_serving_remote_by_scan(
        &mut self,
        now: Instant,
        filter: &Filter<'_>,
        skip: usize,
    ) -> Option<usize> {
        self.remotes.clear();
        for (index, node) in self.nodes.iter().enumerate() {
            if index == skip || Some(index) == self.local {
                continue;
            }
            if let Some((Tier::Serving, weight)) = candidate(now, node, filter, &self.config) {
                self.remotes.push(Candidate { index, weight });
            }
        }
        pick::sample_one(&mut self.rng, &self.remotes).map(|k| self.remotes[k].index)
    }

    /// The whole pick by scanning the membership: the candidates of the best
    /// tier present, then the exact draws.
    fn pick_by_scan(&mut self, now: Instant, filter: &Filter<'_>) -> Option<usize> {
        // The scan costs O(n) anyway: tighten a bound a lowered weight left
        // loose, so that the next picks take the fast path again.
        self.weight_bound = self.max_weight();
        let mut best_tier = None;
        let mut local = None;
        self.remotes.clear();
        for (index, node) in self.nodes.iter().enumerate() {
            let Some((tier, weight)) = candidate(now, node, filter, &self.config) else {
                continue;
            };
            match best_tier {
                Some(best) if tier > best => continue,
                Some(best) if tier == best => {}
                _ => {
                    best_tier = Some(tier);
                    local = None;
                    self.remotes.clear();
                }
            }
            let candidate = Candidate { index, weight };
            if Some(index) == self.local {
                local = Some(candidate);
            } else {
                self.remotes.push(candidate);
            }
        }
        let nodes = &self.nodes;
        let config = &self.config;
        pick::choose(
            &mut self.rng,
            local,
            &self.remotes,
            config.local_bias,
            |i| nodes[i].cost(now, config),
        )
    }

    /// A request was sent to `node`. Unknown nodes are ignored.
    pub fn on_send(&mut self, _now: Instant, node: &str) {
        if let Some(n) = self.node_mut(node) {
            n.on_send();
        }
    }

    /// A request to `node` finished after `latency` with `outcome`: the node's
    /// in-flight count drops; a success is a latency sample and ends a
    /// failure streak; a failure may eject the node. Unknown nodes (removed
    /// while the request was in flight) are ignored.
    pub fn on_response(&mut self, now: Instant, node: &str, latency: Duration, outcome: Outcome) {
        let Some(index) = self.index(node) else {
            return;
        };
        match outcome {
            Outcome::Success => self.nodes[index].on_success(now, latency, &self.config),
            Outcome::Neutral | Outcome::Cancelled => self.nodes[index].on_neutral(),
            Outcome::Failure => {
                if self.nodes[index].on_failure(now, &self.config) && self.may_eject(now) {
                    self.nodes[index].eject(now, &self.config, &mut self.rng);
                }
            }
            Outcome::TimedOut => {
                if self.nodes[index].on_timeout(now, latency, &self.config) && self.may_eject(now) {
                    self.nodes[index].eject(now, &self.config, &mut self.rng);
                }
            }
        }
    }

    /// Whether one more node may be ejected at `now` without exceeding
    /// `max_ejected_share` of the membership.
    fn may_eject(&self, now: Instant) -> bool {
        let share = self.config.max_ejected_share.clamp(0.0, 1.0);
        // Rounds down; NaN gives zero. A single node is never ejected with
        // the default share: there would be nothing to fail over to.
        let cap = (share * self.nodes.len() as f64).floor() as usize;
        let ejected = self.nodes.iter().filter(|n| n.is_ejected(now)).count();
        ejected < cap
    }

    /// The agent of `node` reported its load (from a response's trailers).
    /// Pass it after the [`on_response`](Self::on_response) of that response.
    pub fn on_load_report(&mut self, now: Instant, node: &str, report: LoadReport) {
        let Some(index) = self.index(node) else {
            return;
        };
        self.nodes[index].on_report(now, report, &self.config);
        self.weight_bound = self.weight_bound.max(self.nodes[index].max_weight());
    }

    /// The node's current cost (expected seconds of wait per unit of weight;
    /// infinite without weight), or `None` for an unknown node.
    pub fn cost(&self, now: Instant, node: &str) -> Option<f64> {
        self.node(node).map(|n| n.cost(now, &self.config))
    }

    /// Whether `node` is ejected at `now` (false for an unknown node).
    pub fn is_ejected(&self, now: Instant, node: &str) -> bool {
        self.node(node).is_some_and(|n| n.is_ejected(now))
    }

    /// The known nodes, sorted by id.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.info.id.clone()).collect()
    }

    fn index(&self, node: &str) -> Option<usize> {
        self.nodes.binary_search_by(|n| n.id().cmp(node)).ok()
    }

    fn node(&self, node: &str) -> Option<&Node> {
        self.index(node).map(|i| &self.nodes[i])
    }

    fn node_mut(&mut self, node: &str) -> Option<&mut Node> {
        self.index(node).map(|i| &mut self.nodes[i])
    }
}

/// Which nodes a pick may not choose.
struct Filter<'a> {
    /// Already tried by this request.
    exclude: &'a [NodeId],
    /// The request's model, if the caller routes by model.
    model: Option<&'a str>,
}

/// Where `node` stands as a candidate and its effective weight, or `None`
/// if it cannot be picked.
fn candidate(
    now: Instant,
    node: &Node,
    filter: &Filter<'_>,
    config: &BalancerConfig,
) -> Option<(Tier, f64)> {
    if node.info.state == NodeState::Draining {
        return None;
    }
    let weight = node.weight(now, config);
    if weight <= 0.0 || filter.exclude.iter().any(|e| e == node.id()) {
        return None;
    }
    if filter.model.is_some_and(|m| !node.serves(m)) {
        return None;
    }
    let tier = if node.is_ejected(now) {
        Tier::Ejected
    } else if node.info.state == NodeState::Serving {
        Tier::Serving
    } else {
        Tier::Degraded
    };
    Some((tier, weight))
}

#[cfg(test)]
mod tests;
