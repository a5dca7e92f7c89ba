//! Prometheus metrics of the agent, served as OpenMetrics text at `/metrics`
//! on the admin address. Gauges that mirror live state (in-flight, queue,
//! weight, worker states) are refreshed from the pool at scrape time.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::pool::Pool;
use infermesh_sentinel::State;

type Labels = Vec<(&'static str, String)>;

/// The agent's metric families.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
    in_flight: Gauge,
    queued: Gauge,
    busy: Gauge<f64, AtomicU64>,
    weight: Gauge<f64, AtomicU64>,
    worker_state: Family<Labels, Gauge>,
    worker_exits: Family<Labels, Counter>,
    worker_restarts: Family<Labels, Counter>,
    worker_faults: Family<Labels, Counter>,
    gpu_xids: Family<Labels, Counter>,
    health_checks: Family<Labels, Counter>,
    health_pass: Family<Labels, Gauge>,
    health_latency: Family<Labels, Histogram>,
    transport: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("infermesh");
        let requests = Family::<Labels, Counter>::default();
        let latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~52 s
            Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
        });
        let in_flight = Gauge::default();
        let queued = Gauge::default();
        let busy = Gauge::<f64, AtomicU64>::default();
        let weight = Gauge::<f64, AtomicU64>::default();
        let worker_state = Family::<Labels, Gauge>::default();
        let worker_exits = Family::<Labels, Counter>::default();
        let worker_restarts = Family::<Labels, Counter>::default();
        let worker_faults = Family::<Labels, Counter>::default();
        let gpu_xids = Family::<Labels, Counter>::default();
        let transport = Family::<Labels, Counter>::default();
        registry.register(
            "transport_requests",
            "Inference requests by how their tensors arrived: grpc (inline), shm_passthrough (worker reads the client's shared memory), shm_inline (the agent copies), rdma",
            transport.clone(),
        );
        let health_checks = Family::<Labels, Counter>::default();
        let health_pass = Family::<Labels, Gauge>::default();
        let health_latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
        });
        registry.register(
            "worker_restarts",
            "Worker restarts the sentinel scheduled, by worker and fault reason",
            worker_restarts.clone(),
        );
        registry.register(
            "worker_faults",
            "Faults the sentinel detected, by worker and reason",
            worker_faults.clone(),
        );
        registry.register(
            "gpu_xids",
            "GPU Xid events seen, by GPU, Xid and verdict",
            gpu_xids.clone(),
        );
        registry.register(
            "health_checks",
            "Health-check verdicts, by worker, check, model and result (pass|fail)",
            health_checks.clone(),
        );
        registry.register(
            "health_check_pass",
            "1 if the latest verdict of the check passed, 0 if it failed",
            health_pass.clone(),
        );
        registry.register(
            "health_check_duration_seconds",
            "Latency of health-check probe requests, by check",
            health_latency.clone(),
        );
        registry.register(
            "requests",
            "Inference requests answered, by model and gRPC code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request arrival to response, by model",
            latency.clone(),
        );
        registry.register(
            "inflight",
            "Requests accepted and not yet answered",
            in_flight.clone(),
        );
        registry.register(
            "queued",
            "Requests waiting for a worker slot",
            queued.clone(),
        );
        registry.register(
            "busy_ratio",
            "Share of the last 10 s with work in flight",
            busy.clone(),
        );
        registry.register(
            "weight",
            "Advertised weight: capacity x share of workers ready",
            weight.clone(),
        );
        registry.register(
            "worker_state",
            "1 for the sentinel state each worker is in",
            worker_state.clone(),
        );
        registry.register(
            "worker_exits",
            "Times a worker process ended",
            worker_exits.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            requests,
            latency,
            in_flight,
            queued,
            busy,
            weight,
            worker_state,
            worker_exits,
            worker_restarts,
            worker_faults,
            gpu_xids,
            health_checks,
            health_pass,
            health_latency,
            transport,
        }
    }

    /// Counts a request by the path its tensors took.
    pub fn transport(&self, path: &'static str) {
        self.transport
            .get_or_create(&vec![("path", path.to_string())])
            .inc();
    }

    /// Records a health-check verdict.
    pub fn health_verdict(&self, worker: &str, v: &infermesh_health::Verdict) {
        let mut labels = vec![
            ("worker", worker.to_string()),
            ("check", v.check.clone()),
            ("model", v.model.clone()),
        ];
        self.health_pass
            .get_or_create(&labels)
            .set(i64::from(v.pass));
        labels.push(("result", if v.pass { "pass" } else { "fail" }.to_string()));
        self.health_checks.get_or_create(&labels).inc();
        self.health_latency
            .get_or_create(&vec![("check", v.check.clone())])
            .observe(v.latency.as_secs_f64());
    }

    /// Records one answered inference request.
    pub fn request(&self, model: &str, code: tonic::Code, took: Duration) {
        let code = format!("{code:?}");
        self.requests
            .get_or_create(&vec![("model", model.to_string()), ("code", code)])
            .inc();
        self.latency
            .get_or_create(&vec![("model", model.to_string())])
            .observe(took.as_secs_f64());
    }

    /// Records a worker process ending.
    pub fn worker_exited(&self, worker: &str) {
        self.worker_exits
            .get_or_create(&vec![("worker", worker.to_string())])
            .inc();
    }

    /// Records a restart the sentinel scheduled.
    pub fn worker_restarted(&self, worker: &str, reason: &str) {
        let labels = vec![
            ("worker", worker.to_string()),
            ("reason", reason.to_string()),
        ];
        self.worker_restarts.get_or_create(&labels).inc();
    }

    /// Records a fault the sentinel detected.
    pub fn worker_fault(&self, worker: &str, reason: &str) {
        let labels = vec![
            ("worker", worker.to_string()),
            ("reason", reason.to_string()),
        ];
        self.worker_faults.get_or_create(&labels).inc();
    }

    /// Records a GPU Xid event and its verdict.
    pub fn gpu_xid(&self, gpu: u32, xid: u32, verdict: &str) {
        let labels = vec![
            ("gpu", gpu.to_string()),
            ("xid", xid.to_string()),
            ("verdict", verdict.to_string()),
        ];
        self.gpu_xids.get_or_create(&labels).inc();
    }

    /// Refreshes the live gauges from `pool` and encodes everything.
    pub fn render(&self, pool: &Pool) -> String {
        let load = pool.load();
        self.in_flight.set(load.in_flight as i64);
        self.queued.set(load.queued as i64);
        self.busy.set(load.busy_ratio);
        self.weight.set(load.weight);
        for w in pool.workers() {
            for s in State::ALL {
                let labels = vec![
                    ("worker", w.id().to_string()),
                    ("state", s.as_str().to_string()),
                ];
                self.worker_state
                    .get_or_create(&labels)
                    .set(i64::from(w.state() == s));
            }
        }
        let mut out = String::new();
        let registry = self.registry.lock().expect("metrics lock");
        encode(&mut out, &registry).expect("encoding to a String cannot fail");
        out
    }
}
