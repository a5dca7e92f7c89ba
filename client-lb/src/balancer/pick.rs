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
}

/// A node that may be picked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    /// The node's index in the balancer's table.
    pub(crate) index: usize,
    /// Effective weight, positive and finite.
    pub(crate) weight: f64,
}

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
    let best = match sample_two(rng, remotes) {
        None => return local.map(|l| l.index),
        Some((a, None)) => remotes[a].index,
        Some((a, Some(b))) => {
            let (a, b) = (remotes[a].index, remotes[b].index);
            // Ties go to the first draw, itself weighted by capacity.
            if cost(b) < cost(a) { b } else { a }
        }
    };
    match local {
        Some(l) if cost(l.index) <= local_bias * cost(best) => Some(l.index),
        _ => Some(best),
    }
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
