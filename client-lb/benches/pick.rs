//! Cost of [`Balancer::pick`], and of one request's bookkeeping (pick, send,
//! response), over 10, 100 and 1,000 nodes, without and with a local node.
//!
//! The balancer is warmed up as in production: mixed weights (1 to 4), every
//! node past its slow start with latency samples, a fresh load report and
//! requests in flight, so that each cost it computes takes the full path.
//!
//! ```sh
//! cargo bench -p infermesh-client --bench pick -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use infermesh_client::{
    Balancer, BalancerConfig, LoadReport, NodeId, NodeInfo, NodeState, Outcome,
};

const SIZES: [usize; 3] = [10, 100, 1_000];
const MS: Duration = Duration::from_millis(1);

fn id(i: usize) -> NodeId {
    format!("node-{i:04}")
}

/// A balancer over `n` nodes, warmed up, and the time to pick at.
fn warmed_up(n: usize, local: bool) -> (Balancer, Instant) {
    let config = BalancerConfig {
        // A node in the middle of the id order: no position is favoured.
        local_node: local.then(|| id(n / 2)),
        ..BalancerConfig::default()
    };
    let mut b = Balancer::new(config, 42);
    let t0 = Instant::now();
    let nodes = (0..n)
        .map(|i| NodeInfo {
            id: id(i),
            weight: (i % 4 + 1) as f64,
            state: NodeState::Serving,
            zone: "z1".into(),
            models: None,
        })
        .collect();
    b.set_nodes(t0, nodes);
    // Past the 10 s slow start; samples from the last second.
    let now = t0 + Duration::from_secs(30);
    for i in 0..n {
        let node = id(i);
        let at = now - Duration::from_millis(1_000 - (i % 1_000) as u64);
        for round in 0..4u64 {
            b.on_send(at, &node);
            b.on_send(at, &node);
            let latency = MS * (2 + ((i as u64 * 7 + round * 3) % 20) as u32);
            b.on_response(at, &node, latency, Outcome::Success);
            b.on_load_report(
                at,
                &node,
                LoadReport {
                    in_flight: 3 + (i as u64 + round) % 8,
                    queued: (i as u64) % 3,
                    busy_ratio: 0.5,
                    weight: (i % 4 + 1) as f64,
                },
            );
        }
        // Four sent, four answered, then a varied number left in flight.
        for _ in 0..(i % 3) {
            b.on_send(at, &node);
        }
    }
    (b, now)
}

fn cases() -> impl Iterator<Item = (usize, bool, String)> {
    [false, true].into_iter().flat_map(|local| {
        SIZES.into_iter().map(move |n| {
            let label = if local { "local" } else { "remote_only" };
            (n, local, label.to_string())
        })
    })
}

fn pick(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    for (n, local, label) in cases() {
        let (mut b, now) = warmed_up(n, local);
        group.bench_function(BenchmarkId::new(label, n), |bench| {
            bench.iter(|| black_box(b.pick(black_box(now), black_box(&[]))))
        });
    }
    group.finish();
}

/// One request's work in the balancer: pick, send, and a successful response.
/// All at one instant, so that the load reports stay fresh however many
/// iterations criterion runs (the arithmetic is the same at any time).
fn request(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick_send_respond");
    for (n, local, label) in cases() {
        let (mut b, now) = warmed_up(n, local);
        let mut k = 0u32;
        group.bench_function(BenchmarkId::new(label, n), |bench| {
            bench.iter(|| {
                k = k.wrapping_add(1);
                let pick = b.pick(now, &[]).expect("nodes are available");
                b.on_send(now, &pick.node);
                let latency = MS * (2 + k % 20);
                b.on_response(now, &pick.node, latency, Outcome::Success);
                black_box(pick)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pick, request);
criterion_main!(benches);
