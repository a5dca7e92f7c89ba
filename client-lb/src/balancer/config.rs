//! Tunables of the balancer.

use std::time::Duration;

/// Policy knobs of a [`Balancer`](super::Balancer).
///
/// Every value is accepted; odd ones behave as documented on each field
/// rather than failing, so that a bad config degrades balancing quality, not
/// availability. Checking a config file for mistakes belongs to the config
/// loader.
#[derive(Debug, Clone)]
pub struct BalancerConfig {
    /// The node on this host, if any (its [`NodeId`](super::NodeId)): it is preferred while healthy and not
    /// overloaded. `None` balances over remote nodes only.
    pub local_node: Option<String>,
    /// How much costlier than the better of two sampled remote nodes the local
    /// node may be and still be picked: local is kept while
    /// `local_cost <= local_bias * min(remote costs)`. Values below one make
    /// local less attractive than a remote node; NaN never keeps local.
    pub local_bias: f64,
    /// Time constant of the peak-EWMA latency estimate (see `peak_ewma.rs`):
    /// the weight of an old estimate after `t` without samples is
    /// `exp(-t / ewma_decay)`. Zero keeps only the latest sample.
    pub ewma_decay: Duration,
    /// The latency estimate a node starts with, before its first successful
    /// response; like any estimate it decays while no sample arrives.
    pub default_rtt: Duration,
    /// Consecutive failures that eject a node. Zero behaves like one.
    pub eject_after: u32,
    /// Nominal length of a node's first ejection; each further ejection in a
    /// bad spell doubles it, and the actual length is jittered within
    /// `[nominal / 2, nominal]`.
    pub eject_base: Duration,
    /// Upper bound on the nominal ejection length. A node that has been back
    /// for this long without a new ejection starts its next bad spell from
    /// `eject_base` again.
    pub eject_max: Duration,
    /// Largest share of the membership that may be ejected at once, clamped
    /// to `[0, 1]`; a failing node beyond it stays in rotation ("panic mode":
    /// when many nodes fail together, the problem is more likely on the
    /// client's side or fleet-wide, and ejecting them all would only
    /// concentrate the load on the rest).
    pub max_ejected_share: f64,
    /// Length of the slow start of a node that joins or comes back: its weight
    /// ramps linearly from 10% to 100% over this time. Zero disables it.
    pub slow_start: Duration,
    /// How long an agent's load report is used: its weight overrides the
    /// advertised one, and its count of other clients' requests adds to the
    /// node's load. Older reports are ignored.
    pub load_report_ttl: Duration,
    /// An attempt to a node is given up after `attempt_timeout_factor ×` the
    /// node's slow latency estimate (a high, slowly decaying estimate of its
    /// recent latencies, roughly its p99), at least
    /// [`attempt_timeout_floor`](Self::attempt_timeout_floor), and never
    /// past the caller's deadline. A timed-out attempt is a failure towards
    /// ejection and is retried on another node. Before a node's first answer
    /// only the deadline applies.
    pub attempt_timeout_factor: f64,
    /// The shortest per-attempt timeout.
    pub attempt_timeout_floor: Duration,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            local_node: None,
            local_bias: 1.5,
            ewma_decay: Duration::from_secs(10),
            default_rtt: Duration::from_millis(5),
            eject_after: 5,
            eject_base: Duration::from_secs(1),
            eject_max: Duration::from_secs(60),
            max_ejected_share: 0.5,
            slow_start: Duration::from_secs(10),
            load_report_ttl: Duration::from_secs(5),
            attempt_timeout_factor: 4.0,
            attempt_timeout_floor: Duration::from_millis(250),
        }
    }
}
