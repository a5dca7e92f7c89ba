//! The choice itself: local first, else the better of two weighted samples.
//!
//! Power of two choices (Mitzenmacher, "The Power of Two Choices in
//! Randomized Load Balancing", 2001): comparing two random nodes and taking
//! the less loaded one avoids both the herd behaviour of always taking the
//! least loaded node on stale information and the long queues of pure random
//! choice. The two nodes are distinct and drawn with probability proportional
//! to their effective weight, so that a node with twice the capacity is
//! considered twice as often, and the cost comparison then accounts for live
//! load and latency.
//!
//! The local node, when it can be picked, is compared against the better of
//! two sampled remote nodes and kept unless its cost exceeds `local_bias`
//! times theirs: a local request skips the network and can use shared memory,
//! which the cost does not see, so local is allowed to be somewhat busier.
//!
//! # Drawing by weight in constant time
//!
//! The exact way to draw by weight ([`sample_two`]) walks the candidates
//! and their running sum, and needs the candidates first: a scan of the whole
//! membership for the best tier, O(n) per pick. The balancer instead first
//! tries rejection sampling ([`draw_by_rejection`], von Neumann 1951): pick
//! a node uniformly at random and accept it with probability `w / w_max`,
//! where `w` is its weight if it is a candidate (zero otherwise) and `w_max`
//! is at least every node's weight; else try again. One trial accepts node
//! `i` with probability `(1 / n) × (w_i / w_max)`, proportional to `w_i`,
//! so an accepted draw has exactly the distribution of the exact draw;
//! each trial is independent, so how many trials it took says nothing about
//! which node came out. With weights within a factor of four of each other
//! a trial accepts with probability at least a quarter whatever `n`.
//!
//! The trials are bounded. After [`REJECTION_TRIES`] rejections (or if a
//! node's weight turns out above the bound) the draw falls back to the exact
//! method. That keeps the distribution exact too: the fallback is used only
//! when no trial accepted, an event independent of which node a trial would
//! have accepted, and it draws from the same distribution. What the fallback
//! must not do is redraw an already accepted first node because the second
//! draw failed: whether the second draw fails depends on the first node. So
//! the second draw falls back on its own, the exact draw among the remaining
//! candidates.
//!
//! Which candidates there are depends on the best tier present (see the
//! [`Balancer`](super::Balancer) docs). The fast path only accepts serving,
//! non-ejected remote nodes: once it has accepted one, serving is the best
//! tier present, so the candidates it draws from are the right ones. When no
//! such node exists, it never accepts and the exact scan decides, as before.
//! Only the sequence of random numbers differs from the exact method; a seed
//! still fixes every pick.

use rand::RngExt;
use rand::rngs::SmallRng;
use thiserror::Error;

use super::node::NodeId;

/// The node chosen for a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The node to send the request to.
    pub node: NodeId,
    /// Whether it is the configured local node.
    pub local: bool,
}

/// Why no node could be picked.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PickError {
    /// Discovery knows no node at all.
    #[error("no nodes are known")]
    NoNodes,
    /// Every known node is draining, has no weight, or was excluded by the
    /// caller (already tried by this request).
    #[error("no node is available for this request")]
    AllUnavailable,
    /// No known node advertises the request's model as ready (or every one
    /// that did answered `NOT_FOUND` for it).
    #[error("no node serves the model")]
    NoModel,
}

/// A node that may be picked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    /// The node's index in the balancer's table.
    pub(crate) index: usize,
    /// Effective weight, positive and finite.
    pub(crate) weight: f64,
}

/// Rejected trials after which a draw by rejection gives up.
///
/// A trial accepts with probability (candidates' weight) / (nodes × the
/// weight bound): about 0.6 in a healthy fleet of weights 1 to 4, so giving
/// up almost never happens there; when most nodes are ejected, excluded or
/// degraded it does, and the exact scan, which is what those cases need,
/// costs these trials more.
pub(crate) const REJECTION_TRIES: u32 = 16;

/// Chooses among `local` (if it can be picked) and `remotes`; returns the
/// chosen node's index, or `None` if there is no candidate at all. `cost`
/// gives a node's cost by index; it is only asked about the sampled nodes.
pub(crate) fn choose(
    rng: &mut SmallRng,
    local: Option<Candidate>,
    remotes: &[Candidate],
    local_bias: f64,
    cost: impl Fn(usize) -> f64,
) -> Option<usize> {
    let local = local.map(|l| l.index);
    match sample_two(rng, remotes) {
        None => local,
        Some((a, b)) => Some(decide(
            local,
            remotes[a].index,
            b.map(|b| remotes[b].index),
            local_bias,
            cost,
        )),
    }
}

/// The node, by index, among `local` (if it can be picked) and the remote
/// nodes drawn `first` and `second` (if there was a second candidate).
pub(crate) fn decide(
    local: Option<usize>,
    first: usize,
    second: Option<usize>,
    local_bias: f64,
    cost: impl Fn(usize) -> f64,
) -> usize {
    // Each cost is computed at most once: it is most of a pick's time.
    let (best, best_cost) = match second {
        Some(b) => {
            let (cost_a, cost_b) = (cost(first), cost(b));
            // Ties go to the first draw, itself weighted by capacity.
            if cost_b < cost_a {
                (b, Some(cost_b))
            } else {
                (first, Some(cost_a))
            }
        }
        None => (first, None),
    };
    match local {
        Some(l) if cost(l) <= local_bias * best_cost.unwrap_or_else(|| cost(best)) => l,
        _ => best,
    }
}

/// Draws a position in `0..len` with probability proportional to
/// `weight(position)` by rejection (see the module docs), given that no
/// weight exceeds `bound`. `weight` is zero for positions that are not
/// candidates. Returns `None` after [`REJECTION_TRIES`] rejections, or at
/// once if a weight above `bound` shows up: the caller then draws exactly.
pub(crate) fn draw_by_rejection(
    rng: &mut SmallRng,
    len: usize,
    bound: f64,
    mut weight: impl FnMut(usize) -> f64,
) -> Option<usize> {
    // Also false for a NaN bound.
    if len == 0 || !bound.is_finite() || bound <= 0.0 {
        return None;
    }
    for _ in 0..REJECTION_TRIES {
        let i = rng.random_range(0..len);
        let w = weight(i);
        if w <= 0.0 {
            continue;
        }
        if w > bound {
            return None;
        }
        if rng.random::<f64>() * bound < w {
            return Some(i);
        }
    }
    None
}

/// Draws one position in `candidates` with probability proportional to
/// weight, exactly; `None` if there is none.
pub(crate) fn sample_one(rng: &mut SmallRng, candidates: &[Candidate]) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let total: f64 = candidates.iter().map(|c| c.weight).sum();
    Some(draw(rng, candidates, total, None))
}

/// Draws two distinct positions in `candidates`, each with probability
/// proportional to weight (the second among those left); one if there is only
/// one.
pub(crate) fn sample_two(
    rng: &mut SmallRng,
    candidates: &[Candidate],
) -> Option<(usize, Option<usize>)> {
    match candidates.len() {
        0 => None,
        1 => Some((0, None)),
        _ => {
            let total: f64 = candidates.iter().map(|c| c.weight).sum();
            let first = draw(rng, candidates, total, None);
            let rest = total - candidates[first].weight;
            let second = draw(rng, candidates, rest, Some(first));
            Some((first, Some(second)))
        }
    }
}

/// One weighted draw among `candidates` other than `skip`, whose weights sum
/// to `total`.
fn draw(rng: &mut SmallRng, candidates: &[Candidate], total: f64, skip: Option<usize>) -> usize {
    let mut point = rng.random::<f64>() * total;
    let mut last = 0;
    for (i, c) in candidates.iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        if point < c.weight {
            return i;
        }
        point -= c.weight;
        last = i;
    }
    // Only rounding in `total` gets here: the point fell just past the end.
    last
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn candidates(weights: &[f64]) -> Vec<Candidate> {
        weights
            .iter()
            .enumerate()
            .map(|(index, &weight)| Candidate { index, weight })
            .collect()
    }

    #[test]
    fn draws_are_proportional_to_weight() {
        let mut rng = SmallRng::seed_from_u64(7);
        let c = candidates(&[1.0, 2.0, 3.0, 4.0]);
        let n = 100_000;
        let mut counts = [0u32; 4];
        for _ in 0..n {
            let (first, _) = sample_two(&mut rng, &c).unwrap();
            counts[first] += 1;
        }
        for (i, &count) in counts.iter().enumerate() {
            let share = f64::from(count) / f64::from(n);
            let expected = (i + 1) as f64 / 10.0;
            assert!(
                (share - expected).abs() < 0.01,
                "node {i}: {share} vs {expected}"
            );
        }
    }

    #[test]
    fn two_draws_are_distinct_and_the_second_is_weighted_too() {
        let mut rng = SmallRng::seed_from_u64(8);
        let c = candidates(&[1.0, 1.0, 8.0]);
        let mut heavy_second = 0;
        let n = 20_000;
        for _ in 0..n {
            let (a, b) = sample_two(&mut rng, &c).unwrap();
            let b = b.unwrap();
            assert_ne!(a, b);
            if a != 2 && b == 2 {
                heavy_second += 1;
            }
        }
        // P(first is light) = 0.2, then the heavy one is 8/9 of the rest.
        let share = f64::from(heavy_second) / f64::from(n);
        assert!((share - 0.2 * 8.0 / 9.0).abs() < 0.02, "{share}");
    }

    #[test]
    fn one_candidate_is_the_only_choice() {
        let mut rng = SmallRng::seed_from_u64(9);
        assert_eq!(sample_two(&mut rng, &candidates(&[3.0])), Some((0, None)));
        assert_eq!(sample_two(&mut rng, &[]), None);
        let only = candidates(&[3.0]);
        assert_eq!(choose(&mut rng, None, &only, 1.5, |_| 1.0), Some(0));
        assert_eq!(choose(&mut rng, None, &[], 1.5, |_| 1.0), None);
    }

    #[test]
    fn rejection_draws_are_proportional_to_weight() {
        let mut rng = SmallRng::seed_from_u64(12);
        // Position 1 is not a candidate; the bound is loose.
        let weights = [1.0, 0.0, 2.0, 3.0, 4.0];
        let n = 100_000;
        let mut counts = [0u32; 5];
        let mut gave_up = 0;
        for _ in 0..n {
            match draw_by_rejection(&mut rng, weights.len(), 5.0, |i| weights[i]) {
                Some(i) => counts[i] += 1,
                None => gave_up += 1,
            }
        }
        assert_eq!(counts[1], 0);
        // A trial accepts with probability 10 / 25: all sixteen are rejected
        // with probability 0.6^16, about 28 times in 100,000.
        assert!(gave_up < 100, "{gave_up}");
        let drawn = f64::from(n - gave_up);
        for (i, &w) in weights.iter().enumerate() {
            let share = f64::from(counts[i]) / drawn;
            assert!((share - w / 10.0).abs() < 0.01, "{i}: {share}");
        }
    }

    #[test]
    fn rejection_gives_up_without_candidates_or_with_a_broken_bound() {
        let mut rng = SmallRng::seed_from_u64(13);
        assert_eq!(draw_by_rejection(&mut rng, 4, 1.0, |_| 0.0), None);
        assert_eq!(draw_by_rejection(&mut rng, 4, 1.0, |_| 2.0), None);
        assert_eq!(draw_by_rejection(&mut rng, 0, 1.0, |_| 1.0), None);
        assert_eq!(draw_by_rejection(&mut rng, 4, f64::NAN, |_| 1.0), None);
        assert_eq!(draw_by_rejection(&mut rng, 4, 0.0, |_| 1.0), None);
        assert_eq!(draw_by_rejection(&mut rng, 1, 1.0, |_| 1.0), Some(0));
    }

    #[test]
    fn sample_one_is_exact() {
        let mut rng = SmallRng::seed_from_u64(14);
        assert_eq!(sample_one(&mut rng, &[]), None);
        let c = candidates(&[1.0, 3.0]);
        let n = 40_000;
        let heavy = (0..n)
            .filter(|_| sample_one(&mut rng, &c) == Some(1))
            .count();
        let share = heavy as f64 / f64::from(n);
        assert!((share - 0.75).abs() < 0.01, "{share}");
    }

    #[test]
    fn p2c_takes_the_cheaper_of_the_two() {
        let mut rng = SmallRng::seed_from_u64(10);
        let c = candidates(&[1.0, 1.0]);
        for _ in 0..100 {
            let picked = choose(&mut rng, None, &c, 1.5, |i| [2.0, 1.0][i]);
            assert_eq!(picked, Some(1));
        }
    }

    #[test]
    fn local_is_kept_within_the_bias_and_left_beyond_it() {
        let mut rng = SmallRng::seed_from_u64(11);
        let local = Some(Candidate {
            index: 9,
            weight: 1.0,
        });
        let remotes = candidates(&[1.0, 1.0]);
        let costs = |local_cost: f64| move |i: usize| if i == 9 { local_cost } else { 1.0 };
        for _ in 0..100 {
            assert_eq!(choose(&mut rng, local, &remotes, 1.5, costs(1.5)), Some(9));
            assert_ne!(choose(&mut rng, local, &remotes, 1.5, costs(1.6)), Some(9));
        }
        // With no remote to compare with, local it is.
        assert_eq!(choose(&mut rng, local, &[], 1.5, costs(100.0)), Some(9));
        // A NaN bias never keeps local.
        assert_ne!(
            choose(&mut rng, local, &remotes, f64::NAN, costs(0.0)),
            Some(9)
        );
    }
}
