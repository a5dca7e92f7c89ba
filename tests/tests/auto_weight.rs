//! Issues 14 and 26: `weight = "auto"` with default settings. Three agents
//! whose test workers run 4 requests at once at 4 ms each, 4 at 10 ms and 2
//! at 40 ms (true capacities 1,000, 400 and 50 requests/s: 20 : 8 : 1; the
//! issue's 2/5/20 ms at half the rate, so that a debug build on two shared
//! cores is less CPU-bound; `scripts/auto-weight.sh` runs the issue's own
//! figures in a release build), all
//! configured as a new user would — no `max_inflight`, no weight — and the
//! workers not saying how many they run at once (`--no-model-config`, like
//! a Python server): the agents learn it. Under load from the client
//! library (real ZooKeeper) the weights their registry records advertise
//! order by real capacity, and fastest/slowest and middle/slowest are each
//! within ±30% of the true ratio. (Before issue 26 the agent multiplied by
//! the default `max_inflight` of 64 and advertised about 4 : 3.5 : 1 for the
//! issue's fleet.)
//!
//! The true ratio is measured, not assumed: every node saturated at once by
//! its own client serves `P / (service time + the agent's and gRPC's share)`
//! per second, and on a busy 2-core machine that share is not negligible
//! next to 2 ms. Both the nominal ratios and the measured ones are printed.
//!
//! What is compared with that truth, and how closely (an honest tolerance
//! rather than one a noisy machine breaks):
//!
//! - the weight each agent advertises *now* (its admin `Status`, the number
//!   its trailers and ORCA reports carry), all three read together: within
//!   ±30% of the true ratios. Under a starved CPU this once read 11.61 for a
//!   true 7.49: the agents answered late, the limiter read the delay as
//!   requests queueing inside the worker and cut the fast workers' limits
//!   in a spiral (fixed in `agent/src/worker/concurrency.rs`, "Adaptive
//!   concurrency" in docs/DECISIONS.md; pinned to one core, this test read
//!   limits of 2–3 for a 4-slot worker before, 5–9 after).
//! - the weights in the registry records: each lags its agent's by up to
//!   the publisher's hysteresis (`WEIGHT_HYSTERESIS`, 10%: records are not
//!   rewritten for smaller moves), so a ratio of two records may be off by
//!   a further 1.1 / 0.9 either way; that is their bound.
//! - order: both faster nodes above the slowest, in the balanced phase and
//!   saturated. Not the 4 ms node above the 10 ms one: where the CPU rather
//!   than the workers bounds throughput they serve about the same (pinned
//!   to one core: 179 and 169 requests/s), and no estimate can order a tie.
//!
//! `scripts/auto-weight.sh` compares the client's throughput on that fleet
//! with auto weights against hand-set correct ones (BENCHMARKS.md).

use std::time::Instant;

use infermesh_client::Client;
use infermesh_proto::inference::ModelInferRequest;
use infermesh_registry::publish::WEIGHT_HYSTERESIS;
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, Load, dense, eventually, testworker};

const SERVICE_MS: [u32; 3] = [4, 10, 40];
/// Requests each worker runs at once, in `SERVICE_MS` order.
const SLOTS: [u32; 3] = [4, 4, 2];

fn node_id(ms: u32) -> String {
    format!("node-{ms}ms")
}

/// An agent with one worker of `ms` per request running `slots` at once,
/// everything else at the defaults (weight auto, max_inflight 64).
fn agent(zk: &Zk, service: &str, ms: u32, slots: u32) -> Agent {
    Agent::builder()
        .config(format!(
            "node_id = \"{}\"\n[registry]\nurl = \"{}\"\nservice = \"{service}\"\n\
             session_timeout = \"5s\"\n[[workers]]\ncommand = \"{}\"\n",
            node_id(ms),
            zk.url("/im"),
            testworker(&format!(
                "--service-time-ms {ms} --concurrency {slots} --no-model-config"
            ))
        ))
        .spawn()
}

fn request(input: &[f32]) -> ModelInferRequest {
    dense::request(input, true)
}

async fn fleet(zk: &Zk, service: &str) -> (Vec<Agent>, Client) {
    let agents: Vec<Agent> = SERVICE_MS
        .iter()
        .zip(SLOTS)
        .map(|(&ms, slots)| agent(zk, service, ms, slots))
        .collect();
    for a in &agents {
        a.wait_ready().await;
    }
    let client = Client::builder()
        .registry(zk.url("/im"))
        .service(service)
        .seed(14)
        .build()
        .await
        .unwrap();
    eventually("the client sees the three nodes", || async {
        (client.membership().nodes.len() == 3).then_some(())
    })
    .await;
    (agents, client)
}

/// The advertised weight of each node, in `SERVICE_MS` order, as the
/// client's copy of the registry has it.
fn advertised(client: &Client) -> Vec<f64> {
    let m = client.membership();
    SERVICE_MS
        .iter()
        .map(|&ms| {
            m.nodes
                .iter()
                .find(|r| r.node_id == node_id(ms))
                .map_or(0.0, |r| r.weight)
        })
        .collect()
}

/// Waits until `n` more requests have been sent by `load`.
async fn run_for(load: &Load, n: u64) {
    let until = load.sent() + n;
    eventually(&format!("{n} more requests"), || async {
        (load.sent() >= until).then_some(())
    })
    .await;
}

/// What each agent advertises now (its admin Status), in `SERVICE_MS`
/// order, read one after another.
async fn live(agents: &[Agent]) -> Vec<f64> {
    let mut out = Vec::new();
    for a in agents {
        out.push(a.status().await.weight);
    }
    out
}

/// Saturates every node at once, each with its own client (a static list
/// of that node, 4 callers a slot), until the slowest has served
/// `n` more requests: the requests per second each served is its capacity
/// under the same conditions. Returns those, the weights the agents
/// advertise at the end, and the weights their records say.
async fn saturate_each(agents: &[Agent], fleet: &Client, n: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut loads = Vec::new();
    for (a, slots) in agents.iter().zip(SLOTS) {
        let client = Client::builder()
            .registry(format!("static://{}", a.oip))
            .build()
            .await
            .unwrap();
        loads.push(Load::start(&client, 4 * slots, 1, request));
    }
    // Warm up, and let the estimates forget the balanced phase (several
    // half-lives of traffic at the slowest node).
    run_for(&loads[2], n).await;
    let start = Instant::now();
    let from: Vec<u64> = loads.iter().map(Load::sent).collect();
    run_for(&loads[2], n).await;
    let elapsed = start.elapsed().as_secs_f64();
    let rates = loads
        .iter()
        .zip(from)
        .map(|(l, f)| (l.sent() - f) as f64 / elapsed)
        .collect();
    let now = live(agents).await;
    let records = advertised(fleet);
    for l in loads {
        assert_eq!(l.stop().await, 0, "no request failed");
    }
    (rates, now, records)
}

#[tokio::test]
async fn auto_weights_order_by_real_capacity() {
    let zk = Zk::start().await;
    let (agents, client) = fleet(&zk, "auto").await;
    // Before any traffic every node advertises the same prior (100 requests/s
    // while its worker's concurrency is unknown, less on a host whose CPUs
    // are saturated: the host factor), not 64 × that.
    let prior = advertised(&client);
    assert!(prior.iter().all(|&w| w > 0.0 && w <= 100.0), "{prior:?}");

    // Balanced load through the registry: the client spreads it by the
    // weights the nodes advertise (16 callers, as in the issue).
    let load = Load::start(&client, 16, 1, request);
    // Enough traffic and time for every node's limit to find its worker's
    // parallelism (slow start, then a window that queues) and for the
    // registry records (rewritten at most once a second) to say so.
    // (A duration of load, not a wait for an event.)
    let settled = tokio::time::Instant::now() + std::time::Duration::from_secs(6);
    run_for(&load, 6_000).await;
    tokio::time::sleep_until(settled).await;
    let balanced = advertised(&client);
    let stats = client.node_stats();
    assert_eq!(load.stop().await, 0, "no request failed");
    eprintln!(
        "balanced load: advertised weights (4, 10, 40 ms) {balanced:?}, fastest/slowest {:.2}",
        balanced[0] / balanced[2]
    );
    for ms in SERVICE_MS {
        eprintln!("  {}: {:?}", node_id(ms), stats.get(&node_id(ms)));
    }
    assert!(
        balanced[0] > balanced[2] && balanced[1] > balanced[2],
        "the faster nodes weigh more than the slowest: {balanced:?}"
    );

    // The true capacities: every node saturated at once, under the same
    // conditions as one another; then what the records say.
    let (truth, weights, records) = saturate_each(&agents, &client, 200).await;
    eprintln!(
        "saturated: served {truth:.1?} req/s, advertised {weights:.1?}, records {records:.1?} \
         (nominal 1000, 400, 50)"
    );
    for w in [&weights, &records] {
        assert!(
            w[0] > w[2] && w[1] > w[2],
            "the faster nodes weigh more than the slowest: {w:?}"
        );
    }
    let lag = (1.0 + WEIGHT_HYSTERESIS) / (1.0 - WEIGHT_HYSTERESIS);
    for (i, nominal) in [(0, 20), (1, 8)] {
        let true_ratio = truth[i] / truth[2];
        let advertised_ratio = weights[i] / weights[2];
        let record_ratio = records[i] / records[2];
        eprintln!(
            "{}/slowest: true {true_ratio:.2} (nominal {nominal}), advertised {advertised_ratio:.2}, \
             records {record_ratio:.2}",
            node_id(SERVICE_MS[i])
        );
        let off = advertised_ratio / true_ratio;
        assert!(
            (0.7..=1.3).contains(&off),
            "{}: advertised ratio {advertised_ratio:.2} within ±30% of the true {true_ratio:.2}",
            node_id(SERVICE_MS[i])
        );
        let off = record_ratio / true_ratio;
        assert!(
            (0.7 / lag..=1.3 * lag).contains(&off),
            "{}: the records' ratio {record_ratio:.2} within ±30% of the true {true_ratio:.2} \
             and the records' lag",
            node_id(SERVICE_MS[i])
        );
    }
}
