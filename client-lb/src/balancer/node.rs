//! What the balancer is told about nodes, and what it keeps per node.

use std::time::{Duration, Instant};

use rand::rngs::SmallRng;

use super::config::BalancerConfig;
use super::ejection::Ejection;
use super::load::{LatestReport, LoadReport};
use super::peak_ewma::PeakEwma;
use super::slow_start::SlowStart;

/// How long a load report of zero weight is believed (see `base_weight`).
pub const ZERO_REPORT_TTL: Duration = Duration::from_millis(250);

/// A node's name in discovery (the agent's registration name).
pub type NodeId = String;

/// A node's advertised state, from discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Healthy; takes traffic.
    Serving,
    /// Being drained by an operator or shutting down: takes no new requests.
    Draining,
    /// Up, but its sentinel reports soft faults: used only when no serving
    /// node is available.
    Degraded,
}

/// A node as discovery advertises it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// The node's name.
    pub id: NodeId,
    /// Relative capacity (GPU kind × count × share of workers ready). Zero,
    /// negative or non-finite weights make the node unpickable.
    pub weight: f64,
    /// The node's state.
    pub state: NodeState,
    /// The node's zone (informational for now).
    pub zone: String,
    /// The models the node advertises as ready; `None` when it advertises
    /// none (a static list): then any model may be sent and only a
    /// `NOT_FOUND` answer rules one out (see [`Balancer::model_missing`]).
    ///
    /// [`Balancer::model_missing`]: super::Balancer::model_missing
    pub models: Option<Vec<String>>,
}

/// How a request ended, as far as the node's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The node answered; its latency is a load sample.
    Success,
    /// The node could not serve it: connection error, `UNAVAILABLE`,
    /// `RESOURCE_EXHAUSTED`, an internal error. Counts toward ejection.
    Failure,
    /// The caller's fault (`INVALID_ARGUMENT`, `NOT_FOUND`): says nothing
    /// about the node.
    Neutral,
    /// The caller gave up (its future was dropped: a timeout of its own, a
    /// `select!`): neither a success nor a failure, and no latency sample.
    Cancelled,
    /// The attempt ran past its per-attempt timeout (see
    /// [`BalancerConfig::attempt_timeout_factor`]): a failure towards
    /// ejection, and its elapsed time is a latency sample (a lower bound of
    /// the real one), so that the node's cost rises at once and its next
    /// timeout is longer.
    ///
    /// [`BalancerConfig::attempt_timeout_factor`]: super::BalancerConfig::attempt_timeout_factor
    TimedOut,
}

/// Everything the balancer keeps about one node.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) info: NodeInfo,
    /// Unique per `Node` value of a balancer: a ticket taken before the node
    /// left and came back does not count against the new one.
    pub(crate) serial: u64,
    latency: PeakEwma,
    /// A slow-moving high estimate of the node's latency in seconds (a sample
    /// above replaces it, each sample below pulls it down by 1%): what the
    /// per-attempt timeout is derived from. `None` before the first sample.
    slow_latency: Option<f64>,
    /// Models the node answered `NOT_FOUND` for since its advertised models
    /// last changed.
    missing: Vec<String>,
    /// This client's requests sent to the node and not yet answered.
    in_flight: u64,
    report: Option<LatestReport>,
    slow_start: SlowStart,
    ejection: Ejection,
}

impl Node {
    /// A node that joins at `now`; it starts its slow start.
    pub(crate) fn new(now: Instant, info: NodeInfo, config: &BalancerConfig, serial: u64) -> Self {
        Self {
            info,
            serial,
            slow_latency: None,
            missing: Vec::new(),
            latency: PeakEwma::new(now, config.default_rtt, config.ewma_decay),
            in_flight: 0,
            report: None,
            slow_start: SlowStart::new(now),
            ejection: Ejection::default(),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.info.id
    }

    /// Takes discovery's new view of the node, keeping its statistics.
    pub(crate) fn update(&mut self, now: Instant, info: NodeInfo, config: &BalancerConfig) {
        let before = self.admits(now, config.load_report_ttl);
        if self.info.models != info.models {
            self.missing.clear();
        }
        self.info = info;
        self.ramp_if_returning(now, before, config.load_report_ttl);
    }

    /// Takes a load report received at `now`.
    pub(crate) fn on_report(&mut self, now: Instant, report: LoadReport, config: &BalancerConfig) {
        let before = self.admits(now, config.load_report_ttl);
        self.report = Some(LatestReport::new(now, report, self.in_flight));
        self.ramp_if_returning(now, before, config.load_report_ttl);
    }

    /// A node that comes back from draining or from zero weight has been idle
    /// as surely as a new one: it slow-starts too.
    fn ramp_if_returning(&mut self, now: Instant, before: bool, ttl: Duration) {
        if !before && self.admits(now, ttl) {
            self.slow_start.restart(now);
        }
    }

    /// Whether discovery and the agent let the node take new requests at all.
    fn admits(&self, now: Instant, ttl: Duration) -> bool {
        self.info.state != NodeState::Draining && self.base_weight(now, ttl) > 0.0
    }

    /// The weight before slow start: a fresh report's, else the advertised
    /// one; zero if not a positive finite number.
    ///
    /// A report of zero weight (the agent had no ready worker when it
    /// answered) is trusted only for [`ZERO_REPORT_TTL`]: no request goes to
    /// a zero-weight node, so no newer report could ever replace it, and a
    /// worker restarted in milliseconds would stay unused for the whole TTL.
    fn base_weight(&self, now: Instant, ttl: Duration) -> f64 {
        let weight = self
            .report
            .and_then(|r| {
                let ttl = if positive_or_zero(r.weight_at_any_age()) == 0.0 {
                    ttl.min(ZERO_REPORT_TTL)
                } else {
                    ttl
                };
                r.weight(now, ttl)
            })
            .unwrap_or(self.info.weight);
        positive_or_zero(weight)
    }

    /// An upper bound on the effective weight at any time until the next
    /// report or membership update: the larger of the advertised and the
    /// reported weight (whichever is in use, slow start only scales it down).
    pub(crate) fn max_weight(&self) -> f64 {
        let reported = self
            .report
            .map_or(0.0, |r| positive_or_zero(r.weight_at_any_age()));
        positive_or_zero(self.info.weight).max(reported)
    }

    /// The effective weight: base weight × slow-start factor. Zero means the
    /// node cannot be picked.
    pub(crate) fn weight(&self, now: Instant, config: &BalancerConfig) -> f64 {
        self.base_weight(now, config.load_report_ttl)
            * self.slow_start.factor(now, config.slow_start)
    }

    /// `latency × (in_flight + others + 1) / weight`: the expected wait, in
    /// seconds, for one more request; infinite when the node has no weight.
    pub(crate) fn cost(&self, now: Instant, config: &BalancerConfig) -> f64 {
        let weight = self.weight(now, config);
        if weight <= 0.0 {
            return f64::INFINITY;
        }
        let others = self
            .report
            .and_then(|r| r.others(now, config.load_report_ttl))
            .unwrap_or(0);
        let load = self.in_flight.saturating_add(others).saturating_add(1);
        self.latency.get(now) * load as f64 / weight
    }

    pub(crate) fn is_ejected(&self, now: Instant) -> bool {
        self.ejection.is_ejected(now)
    }

    pub(crate) fn on_send(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
    }

    pub(crate) fn on_success(&mut self, now: Instant, latency: Duration, config: &BalancerConfig) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.observe(now, latency);
        self.ejection.on_success(now, config.eject_max);
    }

    fn observe(&mut self, now: Instant, latency: Duration) {
        self.latency.observe(now, latency);
        let sample = latency.as_secs_f64();
        self.slow_latency = Some(match self.slow_latency {
            Some(old) if old > sample => old * 0.99 + sample * 0.01,
            _ => sample,
        });
    }

    /// Records an attempt that timed out after `elapsed`; returns whether
    /// the node should now be ejected.
    pub(crate) fn on_timeout(
        &mut self,
        now: Instant,
        elapsed: Duration,
        config: &BalancerConfig,
    ) -> bool {
        self.observe(now, elapsed);
        self.on_failure(now, config)
    }

    /// The node's in-flight count (this client's requests).
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether the node may be sent a request for `model`.
    pub(crate) fn serves(&self, model: &str) -> bool {
        let advertised = match &self.info.models {
            Some(models) => models.iter().any(|m| m == model),
            None => true,
        };
        advertised && !self.missing.iter().any(|m| m == model)
    }

    /// The node answered `NOT_FOUND` for `model`.
    pub(crate) fn mark_missing(&mut self, model: &str) {
        // Bounded: at most one entry per advertised model, and 64 otherwise.
        if !self.missing.iter().any(|m| m == model) && self.missing.len() < 64 {
            self.missing.push(model.to_string());
        }
    }

    /// The per-attempt timeout: `factor × slow latency`, at least `floor`;
    /// `None` before the first sample (only the caller's deadline applies).
    pub(crate) fn attempt_timeout(&self, config: &BalancerConfig) -> Option<Duration> {
        let secs = self.slow_latency? * config.attempt_timeout_factor;
        let t = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        Some(t.max(config.attempt_timeout_floor))
    }

    /// Records a failure; returns whether the node should now be ejected.
    pub(crate) fn on_failure(&mut self, now: Instant, config: &BalancerConfig) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.ejection.on_failure(now, config.eject_after)
    }

    pub(crate) fn on_neutral(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Ejects the node; it slow-starts when it comes back.
    pub(crate) fn eject(&mut self, now: Instant, config: &BalancerConfig, rng: &mut SmallRng) {
        let until = self
            .ejection
            .eject(now, config.eject_base, config.eject_max, rng);
        self.slow_start.restart(until);
    }
}

/// `weight` if it is a positive finite number, else zero.
fn positive_or_zero(weight: f64) -> f64 {
    if weight.is_finite() && weight > 0.0 {
        weight
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> BalancerConfig {
        BalancerConfig {
            slow_start: Duration::ZERO,
            ..BalancerConfig::default()
        }
    }

    fn info(weight: f64, state: NodeState) -> NodeInfo {
        NodeInfo {
            id: "a".into(),
            weight,
            state,
            zone: "z".into(),
            models: None,
        }
    }

    fn report(in_flight: u64, weight: f64) -> LoadReport {
        LoadReport {
            in_flight,
            queued: 0,
            busy_ratio: 0.0,
            weight,
        }
    }

    #[test]
    fn cost_is_latency_times_load_over_weight() {
        let t0 = Instant::now();
        let cfg = config();
        let mut n = Node::new(t0, info(2.0, NodeState::Serving), &cfg, 0);
        assert!((n.cost(t0, &cfg) - 0.005 / 2.0).abs() < 1e-12);
        n.on_send();
        n.on_send();
        assert!((n.cost(t0, &cfg) - 0.005 * 3.0 / 2.0).abs() < 1e-12);
        // Three requests from other clients, per the agent.
        n.on_report(t0, report(5, 2.0), &cfg);
        assert!((n.cost(t0, &cfg) - 0.005 * 6.0 / 2.0).abs() < 1e-12);
    }

    #[test]
    fn a_fresh_report_overrides_the_advertised_weight() {
        let t0 = Instant::now();
        let cfg = config();
        let mut n = Node::new(t0, info(2.0, NodeState::Serving), &cfg, 0);
        n.on_report(t0, report(0, 4.0), &cfg);
        assert_eq!(n.weight(t0, &cfg), 4.0);
        let stale = t0 + cfg.load_report_ttl + MS;
        assert_eq!(n.weight(stale, &cfg), 2.0);
    }

    #[test]
    fn max_weight_bounds_the_weight_whichever_is_in_use() {
        let t0 = Instant::now();
        let cfg = BalancerConfig::default();
        let mut n = Node::new(t0, info(2.0, NodeState::Serving), &cfg, 0);
        assert_eq!(n.max_weight(), 2.0);
        n.on_report(t0, report(0, 3.0), &cfg);
        assert_eq!(n.max_weight(), 3.0);
        n.on_report(t0, report(0, 1.0), &cfg);
        assert_eq!(n.max_weight(), 2.0);
        let stale = t0 + cfg.load_report_ttl + MS;
        for now in [t0, t0 + cfg.slow_start / 2, stale, stale + cfg.slow_start] {
            assert!(n.weight(now, &cfg) <= n.max_weight());
        }
        n.on_report(t0, report(0, f64::NAN), &cfg);
        assert_eq!(n.max_weight(), 2.0);
        let n = Node::new(t0, info(f64::INFINITY, NodeState::Serving), &cfg, 0);
        assert_eq!(n.max_weight(), 0.0);
    }

    #[test]
    fn a_zero_weight_report_expires_quickly() {
        let t0 = Instant::now();
        let cfg = BalancerConfig {
            slow_start: Duration::ZERO,
            ..BalancerConfig::default()
        };
        let mut n = Node::new(t0, info(2.0, NodeState::Serving), &cfg, 0);
        n.on_report(t0, report(0, 0.0), &cfg);
        assert_eq!(n.weight(t0 + ZERO_REPORT_TTL / 2, &cfg), 0.0);
        // No request could refresh it: past the short TTL the advertised
        // weight counts again, long before the normal report TTL.
        assert!(ZERO_REPORT_TTL < cfg.load_report_ttl);
        assert_eq!(n.weight(t0 + ZERO_REPORT_TTL + MS, &cfg), 2.0);
        // A positive report keeps the normal TTL.
        n.on_report(t0, report(0, 1.0), &cfg);
        assert_eq!(n.weight(t0 + ZERO_REPORT_TTL + MS, &cfg), 1.0);
    }

    #[test]
    fn no_weight_means_infinite_cost() {
        let t0 = Instant::now();
        let cfg = config();
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let n = Node::new(t0, info(w, NodeState::Serving), &cfg, 0);
            assert_eq!(n.weight(t0, &cfg), 0.0);
            assert_eq!(n.cost(t0, &cfg), f64::INFINITY);
        }
    }

    #[test]
    fn returning_from_draining_or_zero_weight_slow_starts() {
        let t0 = Instant::now();
        let cfg = BalancerConfig::default();
        let later = t0 + 2 * cfg.slow_start;
        let mut n = Node::new(t0, info(2.0, NodeState::Draining), &cfg, 0);
        n.update(later, info(2.0, NodeState::Serving), &cfg);
        assert!((n.weight(later, &cfg) - 0.2).abs() < 1e-12);

        let much_later = later + 2 * cfg.slow_start;
        assert_eq!(n.weight(much_later, &cfg), 2.0);
        n.on_report(much_later, report(0, 0.0), &cfg);
        n.on_report(much_later + MS, report(0, 2.0), &cfg);
        assert!(n.weight(much_later + MS, &cfg) < 0.21);
    }

    #[test]
    fn staying_up_does_not_restart_the_ramp() {
        let t0 = Instant::now();
        let cfg = BalancerConfig::default();
        let later = t0 + 2 * cfg.slow_start;
        let mut n = Node::new(t0, info(2.0, NodeState::Serving), &cfg, 0);
        n.update(later, info(3.0, NodeState::Degraded), &cfg);
        assert_eq!(n.weight(later, &cfg), 3.0);
    }
}
