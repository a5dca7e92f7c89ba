//! The balancer against round robin, uniform random and an oracle
//! join-shortest-queue over a simulated heterogeneous cluster, at low and
//! high load, with one node turning ten times slower halfway and another down
//! for two seconds. Run with `--nocapture` to see the table.

mod sim;

use std::time::Duration;

use sim::policy::{BalancerPolicy, Random, RoundRobin, ShortestQueue};
use sim::{Report, Scenario};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// Eight nodes of capacity 1x..4x; n7 (4x) is local, n8 (4x) turns slow at
/// 8 s, n3 (2x) refuses connections from 2 s to 4 s.
fn scenario(callers: usize) -> Scenario {
    Scenario {
        capacities: vec![1, 1, 2, 2, 3, 3, 4, 4],
        local: 6,
        service: 20 * MS,
        hop: MS / 2,
        slow_node: 7,
        slow_from: 8 * SEC,
        slowdown: 10,
        down_node: 2,
        down: 2 * SEC..4 * SEC,
        callers,
        length: 16 * SEC,
        seed: 7,
    }
}

struct Results {
    reports: Vec<Report>,
    ejections: u32,
    ejected_picks: u32,
}

fn compare(s: &Scenario) -> Results {
    let mut balancer = BalancerPolicy::new(&s.capacities, s.local, 11);
    let reports = vec![
        sim::run(s, &mut balancer),
        sim::run(s, &mut RoundRobin::new()),
        sim::run(s, &mut Random::new(12)),
        sim::run(s, &mut ShortestQueue::new(13)),
    ];
    Results {
        reports,
        ejections: balancer.ejections,
        ejected_picks: balancer.ejected_picks,
    }
}

fn print(title: &str, s: &Scenario, results: &Results) {
    let weight =
        |n: usize| f64::from(s.capacities[n]) / f64::from(s.capacities.iter().sum::<u32>()) * 100.0;
    println!(
        "\n{title}: {} callers, {} s; local n{} (fair share {:.0}%), n{} {}x slower from {} s",
        s.callers,
        s.length.as_secs(),
        s.local + 1,
        weight(s.local),
        s.slow_node + 1,
        s.slowdown,
        s.slow_from.as_secs(),
    );
    println!(
        "{:<14} {:>8} {:>9} {:>9} {:>7} {:>7} {:>12} {:>11}",
        "policy", "req/s", "mean ms", "p99 ms", "errors", "local%", "slow% before", "slow% after"
    );
    for r in &results.reports {
        println!(
            "{:<14} {:>8.0} {:>9.1} {:>9.1} {:>7} {:>7.1} {:>12.1} {:>11.1}",
            r.policy,
            r.throughput(),
            r.mean().as_secs_f64() * 1e3,
            r.p99().as_secs_f64() * 1e3,
            r.errors,
            r.share(s.local) * 100.0,
            r.share_before(s.slow_node) * 100.0,
            r.share_after(s.slow_node) * 100.0,
        );
    }
    println!(
        "balancer: {} ejections, {} picks of an ejected node while a healthy one was left",
        results.ejections, results.ejected_picks
    );
}

#[test]
fn balancer_against_baselines() {
    let low = scenario(3);
    let high = scenario(32);
    let low_results = compare(&low);
    let high_results = compare(&high);
    print("low load", &low, &low_results);
    print("high load", &high, &high_results);

    for results in [&low_results, &high_results] {
        assert_eq!(results.ejected_picks, 0, "picked an ejected node");
    }
    assert!(
        high_results.ejections > 0,
        "the down node was never ejected"
    );

    let [bal_low, ..] = &low_results.reports[..] else {
        unreachable!()
    };
    let [bal, rr, random, _jsq] = &high_results.reports[..] else {
        unreachable!()
    };
    let fair = f64::from(low.capacities[low.local]) / f64::from(low.capacities.iter().sum::<u32>());

    // Local first while it keeps up; spill to remote nodes under load.
    assert!(
        bal_low.share(low.local) > 2.0 * fair,
        "local share {:.2} at low load",
        bal_low.share(low.local)
    );
    assert!(bal.share(high.local) < bal_low.share(low.local));
    assert!(
        bal.share(high.local) < 0.5,
        "most traffic stays local at high load"
    );

    // The slow node loses most of its traffic once it is slow.
    let (before, after) = (
        bal.share_before(high.slow_node),
        bal.share_after(high.slow_node),
    );
    assert!(
        after < before / 2.0,
        "slow node share {before:.3} -> {after:.3}"
    );

    // Tail latency under the slow node beats the load-blind policies.
    assert!(bal.p99() < rr.p99(), "{:?} vs {:?}", bal.p99(), rr.p99());
    assert!(
        bal.p99() < random.p99(),
        "{:?} vs {:?}",
        bal.p99(),
        random.p99()
    );
    assert!(bal.throughput() > rr.throughput());
}

#[test]
fn the_simulation_is_deterministic() {
    let s = Scenario {
        length: 3 * SEC,
        slow_from: SEC,
        ..scenario(16)
    };
    let run = || {
        let mut policy = BalancerPolicy::new(&s.capacities, s.local, 11);
        let r = sim::run(&s, &mut policy);
        (r.ok, r.latencies, r.before, r.after)
    };
    assert_eq!(run(), run());
}
