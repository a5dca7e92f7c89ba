//! Sharing a GPU budget among services by priority (`infermesh scale
//! --priority SERVICE=N ... --gpu-budget G`), after Alibaba's high_service:
//! when the fleet's GPUs are short, low-value services give way first.
//! Sans-IO: numbers in, numbers out.
//!
//! Each service claims the nodes its own rule wants ([`super::rule`]); a
//! node costs its GPUs. When the claims fit the budget every service gets
//! what it wants. When they do not:
//!
//! 1. **Floors first, by priority.** Each service, highest priority first,
//!    gets its floor (`--min-nodes`, or what it wants if less) while the
//!    budget lasts: a service is not taken to zero so that another can
//!    grow, unless the budget cannot even hold the floors of those above it.
//! 2. **Then the rest, by priority.** The highest priority tops up to what
//!    it wants, then the next; services of equal priority take one node
//!    each in turn, so they share what is left evenly.
//!
//! A service that gets less than it wants *gave way*; the grant says how
//! many nodes and to whom (the services of higher or equal priority that
//! hold budget). Higher numbers are more important, as in Kubernetes
//! PriorityClasses.

use serde::Serialize;

/// One service's claim on the budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Service name.
    pub service: String,
    /// Higher is more important.
    pub priority: i64,
    /// Nodes its own rule asks for.
    pub wants: usize,
    /// Nodes it keeps ahead of lower priorities' growth (the rule's floor).
    pub floor: usize,
    /// GPUs one of its nodes holds (at least 1).
    pub gpus_per_node: u64,
}

/// What a service gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grant {
    /// Nodes granted.
    pub gets: usize,
    /// Set when it gets less than it wants.
    pub gave_way: Option<GaveWay>,
}

/// Nodes a service did not get, and who holds the budget instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GaveWay {
    /// Nodes wanted and not granted.
    pub nodes: usize,
    /// Services of higher or equal priority holding budget, highest first.
    pub to: Vec<String>,
}

/// Grants for `claims` (in their order) under `budget` GPUs (`None`: no
/// budget, everyone gets what it wants).
pub fn share(claims: &[Claim], budget: Option<u64>) -> Vec<Grant> {
    let Some(budget) = budget else {
        return claims
            .iter()
            .map(|c| Grant {
                gets: c.wants,
                gave_way: None,
            })
            .collect();
    };
    let cost = |c: &Claim| c.gpus_per_node.max(1);
    let mut order: Vec<usize> = (0..claims.len()).collect();
    // Stable: equal priorities keep the order they were given in.
    order.sort_by_key(|&i| std::cmp::Reverse(claims[i].priority));
    let mut gets = vec![0usize; claims.len()];
    let mut left = budget;
    for &i in &order {
        let c = &claims[i];
        let n = c
            .floor
            .min(c.wants)
            .min(usize::try_from(left / cost(c)).unwrap_or(usize::MAX));
        gets[i] = n;
        left -= n as u64 * cost(c);
    }
    for group in order.chunk_by(|&a, &b| claims[a].priority == claims[b].priority) {
        loop {
            let mut grew = false;
            for &i in group {
                let c = &claims[i];
                if gets[i] < c.wants && left >= cost(c) {
                    gets[i] += 1;
                    left -= cost(c);
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
    }
    claims
        .iter()
        .enumerate()
        .map(|(i, c)| Grant {
            gets: gets[i],
            gave_way: (gets[i] < c.wants).then(|| GaveWay {
                nodes: c.wants - gets[i],
                to: order
                    .iter()
                    .filter(|&&j| j != i && claims[j].priority >= c.priority && gets[j] > 0)
                    .map(|&j| claims[j].service.clone())
                    .collect(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(service: &str, priority: i64, wants: usize) -> Claim {
        Claim {
            service: service.into(),
            priority,
            wants,
            floor: 1,
            gpus_per_node: 1,
        }
    }

    fn gets(grants: &[Grant]) -> Vec<usize> {
        grants.iter().map(|g| g.gets).collect()
    }

    #[test]
    fn within_budget_everyone_gets_what_it_wants() {
        let claims = [claim("eta", 10, 5), claim("zeta", 1, 3)];
        let g = share(&claims, Some(8));
        assert_eq!(gets(&g), [5, 3]);
        assert!(g.iter().all(|g| g.gave_way.is_none()));
        assert_eq!(gets(&share(&claims, None)), [5, 3]);
    }

    #[test]
    fn the_lower_priority_gives_way_first_down_to_its_floor() {
        // Listed low first: the order given does not matter, priority does.
        let claims = [claim("zeta", 1, 4), claim("eta", 10, 7)];
        let g = share(&claims, Some(8));
        assert_eq!(gets(&g), [1, 7]);
        assert_eq!(
            g[0].gave_way,
            Some(GaveWay {
                nodes: 3,
                to: vec!["eta".into()]
            })
        );
        assert_eq!(g[1].gave_way, None);
        // The high one wants more than the budget less the low one's
        // floor: the floor stays, the high one gives way too.
        let claims = [claim("zeta", 1, 4), claim("eta", 10, 9)];
        let g = share(&claims, Some(8));
        assert_eq!(gets(&g), [1, 7]);
        assert_eq!(g[1].gave_way.as_ref().unwrap().nodes, 2);
        assert!(g[1].gave_way.as_ref().unwrap().to.is_empty());
    }

    #[test]
    fn floors_go_by_priority_when_even_they_do_not_fit() {
        let mut claims = [claim("low", 1, 3), claim("high", 10, 3), claim("mid", 5, 3)];
        for c in &mut claims {
            c.floor = 2;
        }
        let g = share(&claims, Some(3));
        assert_eq!(gets(&g), [0, 2, 1]);
        assert_eq!(g[0].gave_way.as_ref().unwrap().to, ["high", "mid"]);
    }

    #[test]
    fn equal_priorities_share_evenly_and_gpus_per_node_count() {
        let claims = [claim("a", 5, 6), claim("b", 5, 6), claim("top", 9, 2)];
        let g = share(&claims, Some(8));
        assert_eq!(gets(&g), [3, 3, 2]);
        assert_eq!(g[0].gave_way.as_ref().unwrap().to, ["top", "b"]);
        // Nodes of 4 GPUs: a budget of 10 holds two of them and two of 1.
        let mut big = claim("big", 10, 3);
        big.gpus_per_node = 4;
        let g = share(&[big, claim("small", 1, 5)], Some(10));
        assert_eq!(gets(&g), [2, 2]);
        // Zero GPUs per node counts as one.
        let mut free = claim("free", 1, 3);
        free.gpus_per_node = 0;
        assert_eq!(gets(&share(&[free], Some(2))), [2]);
    }

    #[test]
    fn a_service_that_wants_less_than_its_floor_keeps_what_it_wants() {
        let mut c = claim("idle", 1, 0);
        c.floor = 2;
        let g = share(&[c, claim("busy", 10, 9)], Some(8));
        assert_eq!(gets(&g), [0, 8]);
        assert_eq!(g[0].gave_way, None);
    }
}
