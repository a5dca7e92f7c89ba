//! Per-request overhead of the whole client stack without the network:
//! `Client::infer_on` through retry → balancer (pick + count in flight under
//! one lock) → node (per-attempt timeout, in-flight guard, outcome) → a
//! transport that answers at once. Over 10, 100 and 1,000 nodes (a static
//! list), on a current-thread runtime; each measurement runs its calls in
//! one `block_on`, so the runtime's entry is not counted per call.
//!
//! ```sh
//! cargo bench -p infermesh-client --bench stack -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use infermesh_client::paths::BoxFuture;
use infermesh_client::{BalancerConfig, Client, PathError, Peer, Transport};
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::Path;

const SIZES: [usize; 3] = [10, 100, 1_000];

/// Answers every request at once with an empty response.
struct NoOp;

impl Transport for NoOp {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        _peer: &'a Peer,
        _req: &'a ModelInferRequest,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<tonic::Response<ModelInferResponse>, PathError>> {
        Box::pin(async { Ok(tonic::Response::new(ModelInferResponse::default())) })
    }
}

fn client(rt: &tokio::runtime::Runtime, n: usize) -> Client {
    let addrs: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 1000 + i)).collect();
    rt.block_on(
        Client::builder()
            .registry(format!("static://{}", addrs.join(",")))
            .balancer(BalancerConfig {
                slow_start: Duration::ZERO,
                ..BalancerConfig::default()
            })
            .seed(1)
            .transport(Arc::new(NoOp))
            .build(),
    )
    .expect("client")
}

fn stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let req = ModelInferRequest {
        model_name: "dense".into(),
        ..Default::default()
    };
    let mut group = c.benchmark_group("stack_no_op_transport");
    for n in SIZES {
        let client = client(&rt, n);
        group.bench_function(BenchmarkId::new("infer_on", n), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(client.infer_on(req.clone()).await.expect("answered"));
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, stack);
criterion_main!(benches);
