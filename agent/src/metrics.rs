//! Prometheus metrics of the agent, served as OpenMetrics text at `/metrics`
//! on the admin address. Gauges that mirror live state (in-flight, queue,
//! weight, worker states) are refreshed from the pool at scrape time.
//!
//! Label values are bounded: a model label is only ever a model a worker
//! serves (the pool's model table), and requests naming anything else are
//! counted under `model="_unknown"`. The request path uses label handles
//! resolved once per model ([`ModelMetrics`]), so recording a request builds
//! no strings.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub mod gpu_usage;
mod gpu_use;
mod mig;
mod tenant;
mod worker_limit;

use crate::dispatch::models::{ModelId, Models};
use crate::dispatch::pool::Pool;
use crate::dispatch::tenant::Tenants;
use infermesh_gpu::{GpuDevice, GpuSample};
use infermesh_sentinel::State;

type Labels = Vec<(&'static str, String)>;

/// The model label of requests for models this node does not serve.
pub const UNKNOWN_MODEL: &str = "_unknown";

/// gRPC codes by number, for labels (`Ok`, `NotFound`, ... as tonic spells them).
const CODES: usize = 17;

/// How a request's tensors arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPath {
    /// Inline in the request.
    Grpc,
    /// The worker reads the client's shared memory.
    ShmPassthrough,
    /// The agent copies between shared memory and the request.
    ShmInline,
    /// The agent moves them by RDMA.
    Rdma,
    /// Inline, in a QUIC request frame (`[transport] quic`).
    Quic,
}

impl TransportPath {
    const ALL: [TransportPath; 5] = [
        TransportPath::Grpc,
        TransportPath::ShmPassthrough,
        TransportPath::ShmInline,
        TransportPath::Rdma,
        TransportPath::Quic,
    ];

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportPath::Grpc => "grpc",
            TransportPath::ShmPassthrough => "shm_passthrough",
            TransportPath::ShmInline => "shm_inline",
            TransportPath::Rdma => "rdma",
            TransportPath::Quic => "quic",
        }
    }
}

/// One model's request metrics, resolved once.
pub struct ModelMetrics {
    name: Arc<str>,
    requests: Family<Labels, Counter>,
    by_code: [OnceLock<Counter>; CODES],
    latency: Histogram,
    /// Its tenant's latency of served requests.
    tenant_latency: Histogram,
}

impl ModelMetrics {
    /// Records one answered request.
    pub fn request(&self, code: tonic::Code, took: Duration) {
        self.touch(code).inc();
        let secs = took.as_secs_f64();
        self.latency.observe(secs);
        if code == tonic::Code::Ok {
            self.tenant_latency.observe(secs);
        }
    }

    /// The counter of `code`, created (at zero) if it is not yet.
    fn touch(&self, code: tonic::Code) -> &Counter {
        let i = (code as usize).min(CODES - 1);
        self.by_code[i].get_or_init(|| {
            let labels = vec![
                ("model", self.name.to_string()),
                ("code", format!("{code:?}")),
            ];
            self.requests.get_or_create(&labels).clone()
        })
    }
}

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
    transport: [Counter; TransportPath::ALL.len()],
    cut_through_demotions: Counter,
    cut_through_deferrals: Counter,
    backlog_waits: Counter,
    backlog_refusals: Counter,
    node_state: Family<Labels, Gauge>,
    /// Set once every worker's zero-valued series exist.
    workers_primed: OnceLock<()>,
    gpu: GpuGauges,
    gpu_use: gpu_use::GpuUseMetrics,
    mig: mig::MigMetrics,
    worker_limit: worker_limit::WorkerLimitMetrics,
    tenant: tenant::TenantMetrics,
    host: HostGauges,
    models: RwLock<Vec<Arc<ModelMetrics>>>,
    unknown: Arc<ModelMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family; every model is the `default` tenant's.
    pub fn new() -> Self {
        Self::with_tenants(Tenants::default())
    }

    /// Registers every family, with each model's requests counted for its
    /// tenant among `tenants`.
    pub fn with_tenants(tenants: Tenants) -> Self {
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
        let transport_family = Family::<Labels, Counter>::default();
        registry.register(
            "transport_requests",
            "Inference requests by how their tensors arrived: grpc (inline), shm_passthrough (worker reads the client's shared memory), shm_inline (the agent copies), rdma, quic (inline, over the QUIC rung)",
            transport_family.clone(),
        );
        let transport = TransportPath::ALL.map(|p| {
            transport_family
                .get_or_create(&vec![("path", p.as_str().to_string())])
                .clone()
        });
        let cut_through_demotions = Counter::default();
        registry.register(
            "cut_through_demotions",
            "Requests being forwarded as they arrived whose body had not all come when their cut-through window closed (limits.cut_through_grace after the head, extended while the body arrives at 1 MiB/s or faster): the worker's stream reset and its slot given back (or the queue left), the rest read before queueing again",
            cut_through_demotions.clone(),
        );
        let cut_through_deferrals = Counter::default();
        registry.register(
            "cut_through_deferrals",
            "Requests that took a worker with their body still arriving when unfinished uploads already held all of that worker's slots but one: the slot given back, the body read whole before queueing again (so a request that is all here always finds a slot)",
            cut_through_deferrals.clone(),
        );
        let backlog_waits = Counter::default();
        registry.register(
            "backlog_waits",
            "Requests that waited, unread, because their connection had more answers waiting for the client to read than limits.connection_send_buffer (a client behind on reading)",
            backlog_waits.clone(),
        );
        let backlog_refusals = Counter::default();
        registry.register(
            "backlog_refusals",
            "Requests refused RESOURCE_EXHAUSTED because their client was still behind on reading its answers after limits.read_timeout",
            backlog_refusals.clone(),
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
            "Advertised weight: the live capacity in requests per second (weight = \"auto\"), or the pinned weight x share of workers ready",
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
        let build_info = Family::<Labels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the agent's version as a label",
            build_info.clone(),
        );
        build_info
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())])
            .set(1);
        let node_state = Family::<Labels, Gauge>::default();
        registry.register(
            "node_state",
            "1 for the state the node is in: serving, degraded (a GPU quarantined), draining (an operator drained it), stopping (shutting down)",
            node_state.clone(),
        );
        let gpu = GpuGauges::register(&mut registry);
        let gpu_use = gpu_use::GpuUseMetrics::register(&mut registry);
        let mig = mig::MigMetrics::register(&mut registry);
        let worker_limit = worker_limit::WorkerLimitMetrics::register(&mut registry);
        let tenant = tenant::TenantMetrics::register(&mut registry, tenants);
        let host = HostGauges::register(&mut registry);
        let unknown = Arc::new(model_metrics(
            UNKNOWN_MODEL.into(),
            &requests,
            &latency,
            tenant.latency_of(UNKNOWN_MODEL),
        ));
        Self {
            node_state,
            workers_primed: OnceLock::new(),
            gpu,
            gpu_use,
            mig,
            worker_limit,
            tenant,
            host,
            models: RwLock::new(Vec::new()),
            unknown,
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
            cut_through_demotions,
            cut_through_deferrals,
            backlog_waits,
            backlog_refusals,
        }
    }

    /// Counts a request by the path its tensors took.
    pub fn transport(&self, path: TransportPath) {
        self.transport[path as usize].inc();
    }

    /// Counts a request demoted from cut-through forwarding
    /// ([`crate::serving::forward`]).
    pub fn cut_through_demoted(&self) {
        self.cut_through_demotions.inc();
    }

    /// Counts a request deferred from cut-through forwarding: its worker's
    /// slots were all but one held by unfinished uploads.
    pub fn cut_through_deferred(&self) {
        self.cut_through_deferrals.inc();
    }

    /// Counts a request that waits for its client to read its earlier
    /// answers (once per request).
    pub fn backlog_wait(&self) {
        self.backlog_waits.inc();
    }

    /// Counts a request refused because its client was still behind on
    /// reading after the wait.
    pub fn backlog_refused(&self) {
        self.backlog_refusals.inc();
    }

    /// The request metrics of `model` (a served model), or of
    /// [`UNKNOWN_MODEL`] for `None`.
    pub fn model(&self, model: Option<ModelId>, models: &Models) -> Arc<ModelMetrics> {
        let Some(id) = model else {
            return Arc::clone(&self.unknown);
        };
        if let Some(m) = self
            .models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id.index())
        {
            return Arc::clone(m);
        }
        let mut all = self.models.write().unwrap_or_else(PoisonError::into_inner);
        while all.len() <= id.index() {
            let name = models.name(ModelId(all.len() as u32));
            let tenant_latency = self.tenant.latency_of(&name);
            all.push(Arc::new(model_metrics(
                name,
                &self.requests,
                &self.latency,
                tenant_latency,
            )));
        }
        Arc::clone(&all[id.index()])
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

    /// Records a GPU Xid event and its verdict; `gpu` is its index, or
    /// `unknown` for a device NVML does not list.
    pub fn gpu_xid(&self, gpu: &str, xid: u32, verdict: &str) {
        let labels = vec![
            ("gpu", gpu.to_string()),
            ("xid", xid.to_string()),
            ("verdict", verdict.to_string()),
        ];
        self.gpu_xids.get_or_create(&labels).inc();
    }

    /// Records a reading of every GPU (at scrape time), labelled with its
    /// NVML index and UUID as DCGM's exporter labels its series (`gpu`,
    /// `UUID` there), so the two can be joined.
    pub fn record_gpus(&self, devices: &[GpuDevice], samples: &[GpuSample]) {
        for s in samples {
            let device = devices.iter().find(|d| d.index == s.index);
            let uuid = device.map(|d| d.uuid.clone()).unwrap_or_default();
            let labels = vec![("gpu", s.index.to_string()), ("uuid", uuid)];
            let g = &self.gpu;
            g.utilization
                .get_or_create(&labels)
                .set(f64::from(s.utilization_pct) / 100.0);
            g.memory_used
                .get_or_create(&labels)
                .set(s.memory_used_bytes as i64);
            if let Some(d) = device {
                g.memory_total
                    .get_or_create(&labels)
                    .set(d.memory_total_bytes as i64);
            }
            g.power
                .get_or_create(&labels)
                .set(f64::from(s.power_mw) / 1000.0);
            g.temperature
                .get_or_create(&labels)
                .set(i64::from(s.temperature_c));
            for (kind, n) in [
                ("corrected", s.ecc_corrected),
                ("uncorrected", s.ecc_uncorrected),
            ] {
                let mut l = labels.clone();
                l.push(("type", kind.to_string()));
                g.ecc.get_or_create(&l).set(n as i64);
            }
            g.throttle_reasons
                .get_or_create(&labels)
                .set(s.throttle_reasons as i64);
            for (bit, reason) in infermesh_gpu::throttle::ALL {
                let mut l = labels.clone();
                l.push(("reason", reason.to_string()));
                g.throttled
                    .get_or_create(&l)
                    .set(i64::from(s.throttle_reasons & bit != 0));
            }
        }
    }

    /// Records the MIG instances NVML lists now (at scrape time).
    pub fn record_mig(&self, mig: &[infermesh_gpu::MigDevice]) {
        self.mig.record(mig);
    }

    /// Creates every worker's exits, restarts and faults series at zero.
    fn prime_workers(&self, pool: &Pool) {
        for w in pool.workers() {
            let worker = w.id().to_string();
            drop(
                self.worker_exits
                    .get_or_create(&vec![("worker", worker.clone())]),
            );
            for r in infermesh_sentinel::FaultReason::ALL {
                let labels = vec![
                    ("worker", worker.clone()),
                    ("reason", r.as_label().to_string()),
                ];
                drop(self.worker_restarts.get_or_create(&labels));
                if r != infermesh_sentinel::FaultReason::Operator {
                    drop(self.worker_faults.get_or_create(&labels));
                }
            }
        }
    }

    /// Refreshes the live gauges from `pool` and encodes everything.
    pub fn render(&self, pool: &Pool) -> String {
        let load = pool.load();
        self.in_flight.set(load.in_flight as i64);
        self.queued.set(load.queued as i64);
        self.busy.set(load.busy_ratio);
        self.weight.set(load.weight);
        self.worker_limit.refresh(pool);
        self.tenant.refresh(pool);
        self.host.refresh();
        let node = node_state(pool);
        for s in NODE_STATES {
            self.node_state
                .get_or_create(&vec![("state", s.to_string())])
                .set(i64::from(s == node));
        }
        // Series exist from the start (at zero), so `rate()` and alerts see
        // them before the first event: every served model's `Ok` count and
        // latency, every worker's exits, faults and restarts by reason.
        let models = pool.models();
        for i in 0..models.len() {
            let m = self.model(Some(ModelId(i as u32)), models);
            m.touch(tonic::Code::Ok);
        }
        // The workers are fixed for the agent's life: their series once.
        self.workers_primed.get_or_init(|| self.prime_workers(pool));
        for w in pool.workers() {
            let state = w.snapshot().state;
            for s in State::ALL {
                let labels = vec![
                    ("worker", w.id().to_string()),
                    ("state", s.as_str().to_string()),
                ];
                self.worker_state
                    .get_or_create(&labels)
                    .set(i64::from(state == s));
            }
        }
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        encode(&mut out, &registry).expect("encoding to a String cannot fail");
        out
    }
}

/// Per-GPU gauges, refreshed from telemetry at scrape time.
struct GpuGauges {
    utilization: Family<Labels, Gauge<f64, AtomicU64>>,
    memory_used: Family<Labels, Gauge>,
    memory_total: Family<Labels, Gauge>,
    power: Family<Labels, Gauge<f64, AtomicU64>>,
    temperature: Family<Labels, Gauge>,
    ecc: Family<Labels, Gauge>,
    throttle_reasons: Family<Labels, Gauge>,
    throttled: Family<Labels, Gauge>,
}

impl GpuGauges {
    fn register(registry: &mut Registry) -> Self {
        let g = GpuGauges {
            utilization: Family::default(),
            memory_used: Family::default(),
            memory_total: Family::default(),
            power: Family::default(),
            temperature: Family::default(),
            ecc: Family::default(),
            throttle_reasons: Family::default(),
            throttled: Family::default(),
        };
        registry.register(
            "gpu_utilization_ratio",
            "Share of the last sample period a kernel ran on the GPU (NVML), by gpu index and uuid",
            g.utilization.clone(),
        );
        registry.register(
            "gpu_memory_used_bytes",
            "GPU framebuffer memory in use",
            g.memory_used.clone(),
        );
        registry.register(
            "gpu_memory_total_bytes",
            "GPU framebuffer memory installed",
            g.memory_total.clone(),
        );
        registry.register("gpu_power_watts", "GPU board power draw", g.power.clone());
        registry.register(
            "gpu_temperature_celsius",
            "GPU die temperature",
            g.temperature.clone(),
        );
        registry.register(
            "gpu_ecc_errors",
            "ECC errors since the driver loaded, by type (corrected|uncorrected)",
            g.ecc.clone(),
        );
        registry.register(
            "gpu_throttle_reasons",
            "Why the GPU's clocks are held down: NVML's clocks-throttle-reasons bitmask (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
            g.throttle_reasons.clone(),
        );
        registry.register(
            "gpu_throttled",
            "1 while the GPU's clocks are held down for this reason (the bits of gpu_throttle_reasons)",
            g.throttled.clone(),
        );
        g
    }
}

/// The host's CPU load and memory, read from /proc at scrape time.
struct HostGauges {
    load1: Gauge<f64, AtomicU64>,
    cpus: Gauge,
    memory_total: Gauge,
    memory_available: Gauge,
}

impl HostGauges {
    fn register(registry: &mut Registry) -> Self {
        let h = HostGauges {
            load1: Gauge::default(),
            cpus: Gauge::default(),
            memory_total: Gauge::default(),
            memory_available: Gauge::default(),
        };
        registry.register(
            "host_load1",
            "The host's one-minute load average (/proc/loadavg)",
            h.load1.clone(),
        );
        registry.register("host_cpus", "CPUs available to the agent", h.cpus.clone());
        registry.register(
            "host_memory_total_bytes",
            "The host's memory (/proc/meminfo MemTotal)",
            h.memory_total.clone(),
        );
        registry.register(
            "host_memory_available_bytes",
            "The host's memory available for new work (/proc/meminfo MemAvailable)",
            h.memory_available.clone(),
        );
        h
    }

    fn refresh(&self) {
        let host = crate::dispatch::capacity::HostSample::read();
        if let Some(load) = host.load1 {
            self.load1.set(load);
        }
        if let Some(n) = host.cpus {
            self.cpus.set(n as i64);
        }
        if let Some(t) = host.memory_total_bytes {
            self.memory_total.set(t as i64);
        }
        if let Some(a) = host.memory_available_bytes {
            self.memory_available.set(a as i64);
        }
    }
}

/// The values of `infermesh_node_state`'s `state` label.
pub const NODE_STATES: [&str; 4] = ["serving", "degraded", "draining", "stopping"];

/// The node's state as `infermesh_node_state` shows it; the most severe wins.
fn node_state(pool: &Pool) -> &'static str {
    if pool.is_stopping() {
        "stopping"
    } else if pool.is_draining() {
        "draining"
    } else if pool.degraded() {
        "degraded"
    } else {
        "serving"
    }
}

fn model_metrics(
    name: Arc<str>,
    requests: &Family<Labels, Counter>,
    latency: &Family<Labels, Histogram>,
    tenant_latency: Histogram,
) -> ModelMetrics {
    ModelMetrics {
        tenant_latency,
        latency: latency
            .get_or_create(&vec![("model", name.to_string())])
            .clone(),
        requests: requests.clone(),
        by_code: Default::default(),
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the docs name is one the agent exports, spelled alike.
    #[test]
    fn metrics_named_in_the_docs_exist() {
        // Families without a sample are not rendered: record one of each.
        let metrics = Metrics::new();
        let models = Models::default();
        metrics
            .model(None, &models)
            .request(tonic::Code::Ok, Duration::ZERO);
        metrics.health_verdict(
            "w0",
            &infermesh_health::Verdict {
                check: "live".into(),
                model: String::new(),
                pass: true,
                reason: String::new(),
                latency: Duration::ZERO,
            },
        );
        metrics.worker_exited("w0");
        metrics.worker_restarted("w0", "exit");
        metrics.worker_fault("w0", "exit");
        metrics.gpu_xid("0", 79, "restart_worker");
        metrics.gpu_xid_attribution("0", 43, "worker");
        metrics.record_worker_gpu(&[(
            "w0".into(),
            vec![crate::metrics::gpu_usage::WorkerGpuUse {
                gpu: 0,
                memory_bytes: 1,
                sm_util_pct: Some(1),
                processes: 1,
            }],
        )]);
        let fake = infermesh_gpu::FakeTelemetry::from_setup(infermesh_gpu::FakeSetup {
            devices: 1,
            mig_per_device: 1,
            mps: false,
        });
        use infermesh_gpu::GpuTelemetry as _;
        metrics.record_gpus(&fake.devices(), &fake.sample());
        metrics.record_mig(&fake.mig_devices());
        metrics.worker_limit.record(
            "w0",
            &crate::dispatch::pool::WorkerLimit {
                limit: 3,
                probing: false,
                concurrency: Some(2.0),
                unloaded: Some(Duration::from_millis(10)),
                capacity: Some(200.0),
            },
        );
        let text = metrics.render(&crate::testing::idle_pool());
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let exported = |name: &str| {
            families.iter().any(|f| {
                name == *f
                    || name
                        .strip_prefix(f)
                        .is_some_and(|s| ["_total", "_bucket", "_sum", "_count"].contains(&s))
            })
        };
        let docs = [
            ("README.md", include_str!("../../README.md")),
            ("docs/SENTINEL.md", include_str!("../../docs/SENTINEL.md")),
            ("docs/DECISIONS.md", include_str!("../../docs/DECISIONS.md")),
            ("BENCHMARKS.md", include_str!("../../BENCHMARKS.md")),
            (
                "configs/k8s/alerts.yaml",
                include_str!("../../configs/k8s/alerts.yaml"),
            ),
            (
                "configs/grafana/infermesh-dashboard.json",
                include_str!("../../configs/grafana/infermesh-dashboard.json"),
            ),
        ];
        let mut named = 0;
        for (doc, body) in docs {
            let mut rest = body;
            while let Some(at) = rest.find("infermesh_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                let (name, after) = tail.split_at(end);
                rest = after;
                // Crate paths (`infermesh_client::`) and request parameters
                // (`infermesh_fault=`) are not metrics.
                if after.starts_with("::") || after.starts_with('=') {
                    continue;
                }
                assert!(
                    exported(name),
                    "{doc} names metric {name}, which the agent does not export (it does: {families:?})"
                );
                named += 1;
            }
        }
        assert!(
            named > 50,
            "the docs, alerts and dashboard name metrics ({named})"
        );
    }

    /// A fresh agent already shows its version, its state and zero-valued
    /// series for every model and worker, so alerts and `rate()` see them.
    #[test]
    fn series_exist_from_the_start() {
        let metrics = Metrics::new();
        let pool = crate::testing::idle_pool();
        pool.models().intern("dense").unwrap();
        let text = metrics.render(&pool);
        let version = env!("CARGO_PKG_VERSION");
        for line in [
            format!(r#"infermesh_build_info{{version="{version}"}} 1"#),
            r#"infermesh_node_state{state="serving"} 1"#.to_string(),
            r#"infermesh_node_state{state="draining"} 0"#.to_string(),
            r#"infermesh_requests_total{model="dense",code="Ok"} 0"#.to_string(),
            r#"infermesh_worker_exits_total{worker="w0"} 0"#.to_string(),
            r#"infermesh_worker_faults_total{worker="w0",reason="exit"} 0"#.to_string(),
            r#"infermesh_worker_restarts_total{worker="w0",reason="operator"} 0"#.to_string(),
        ] {
            assert!(text.contains(&line), "missing {line} in:\n{text}");
        }
        assert!(!text.contains(r#"infermesh_worker_faults_total{worker="w0",reason="operator"}"#));
        assert!(text.contains("infermesh_request_duration_seconds_count{model=\"dense\"} 0"));
        pool.set_draining(true);
        let text = metrics.render(&pool);
        assert!(text.contains(r#"infermesh_node_state{state="draining"} 1"#));
        assert!(text.contains(r#"infermesh_node_state{state="serving"} 0"#));
    }

    /// MIG instances get a series each, labelled with the parent GPU, and
    /// lose it when the GPU is re-partitioned.
    #[test]
    fn mig_instances_from_telemetry() {
        use infermesh_gpu::GpuTelemetry as _;
        let metrics = Metrics::new();
        let fake = infermesh_gpu::FakeTelemetry::from_setup(infermesh_gpu::FakeSetup {
            devices: 1,
            mig_per_device: 2,
            mps: false,
        });
        metrics.record_mig(&fake.mig_devices());
        let text = metrics.render(&crate::testing::idle_pool());
        let half = (80u64 << 30) / 2;
        for i in 0..2 {
            let labels = format!(r#"{{gpu="0",uuid="MIG-fake-0-{i}"}}"#);
            assert!(text.contains(&format!("infermesh_gpu_mig_memory_used_bytes{labels} 0\n")));
            assert!(text.contains(&format!(
                "infermesh_gpu_mig_memory_total_bytes{labels} {half}\n"
            )));
        }
        fake.set_mig_devices(Vec::new());
        metrics.record_mig(&fake.mig_devices());
        let text = metrics.render(&crate::testing::idle_pool());
        assert!(
            !text.contains("infermesh_gpu_mig_memory_used_bytes{"),
            "{text}"
        );
    }

    /// GPU readings carry the index and UUID (the fake backend's here);
    /// host figures come from /proc.
    #[test]
    fn gpu_and_host_gauges_from_telemetry() {
        use infermesh_gpu::GpuTelemetry as _;
        let metrics = Metrics::new();
        let fake = infermesh_gpu::FakeTelemetry::new(2);
        let devices = fake.devices();
        metrics.record_gpus(&devices, &fake.sample());
        let text = metrics.render(&crate::testing::idle_pool());
        for d in &devices {
            let labels = format!(r#"{{gpu="{}",uuid="{}"}}"#, d.index, d.uuid);
            for family in [
                "infermesh_gpu_utilization_ratio",
                "infermesh_gpu_memory_used_bytes",
                "infermesh_gpu_power_watts",
                "infermesh_gpu_temperature_celsius",
            ] {
                assert!(
                    text.contains(&format!("{family}{labels}")),
                    "{family}{labels} in:\n{text}"
                );
            }
            assert!(text.contains(&format!(
                "infermesh_gpu_memory_total_bytes{labels} {}",
                d.memory_total_bytes
            )));
        }
        // Throttle reasons: the bitmask and one series per reason.
        let l0 = format!(r#"gpu="0",uuid="{}""#, devices[0].uuid);
        assert!(
            text.contains(&format!("infermesh_gpu_throttle_reasons{{{l0}}} 1\n")),
            "an idle fake GPU reports gpu_idle: {text}"
        );
        fake.set_sample(infermesh_gpu::GpuSample {
            index: 0,
            throttle_reasons: infermesh_gpu::throttle::HW_THERMAL_SLOWDOWN
                | infermesh_gpu::throttle::SW_POWER_CAP,
            ..Default::default()
        });
        metrics.record_gpus(&devices, &fake.sample());
        let text = metrics.render(&crate::testing::idle_pool());
        assert!(text.contains(&format!("infermesh_gpu_throttle_reasons{{{l0}}} 68\n")));
        for (reason, on) in [
            ("hw_thermal_slowdown", 1),
            ("sw_power_cap", 1),
            ("gpu_idle", 0),
        ] {
            let line = format!(r#"infermesh_gpu_throttled{{{l0},reason="{reason}"}} {on}"#);
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
        assert_eq!(
            text.matches("infermesh_gpu_throttled{").count(),
            devices.len() * infermesh_gpu::throttle::ALL.len()
        );
        assert!(
            text.contains("infermesh_host_memory_total_bytes "),
            "{text}"
        );
        assert!(
            !text.contains("infermesh_host_memory_total_bytes 0\n"),
            "{text}"
        );
    }

    #[test]
    fn unknown_models_share_one_label_value() {
        let metrics = Metrics::new();
        let models = Models::default();
        let dense = models.intern("dense").unwrap();
        metrics
            .model(Some(dense), &models)
            .request(tonic::Code::Ok, Duration::from_millis(1));
        for _ in 0..100 {
            metrics
                .model(None, &models)
                .request(tonic::Code::NotFound, Duration::ZERO);
        }
        let text = metrics.render(&crate::testing::idle_pool());
        assert!(
            text.contains(r#"infermesh_requests_total{model="dense",code="Ok"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"infermesh_requests_total{model="_unknown",code="NotFound"} 100"#));
        assert_eq!(text.matches("infermesh_requests_total{").count(), 2);
    }
}
