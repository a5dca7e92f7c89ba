//! Agent configuration: a TOML file (see `configs/agent.toml`) and/or flags,
//! parsed into serde structs that reject unknown fields, then checked into a
//! typed [`AgentConfig`]. [`AgentConfig::from_raw`] reports every problem at
//! once, so `infermesh agent --check-config` shows the whole list.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use infermesh_health::HealthCheck;

use infermesh_gpu::{Backend, XidAction, XidPolicy};
use infermesh_proto::registry::{DEFAULT_SESSION_TIMEOUT, RegistryUrl, valid_name};
use infermesh_sentinel::{FaultPatterns, SentinelConfig, StallWindow};
use serde::Deserialize;

pub mod limits;
pub mod shm;
pub mod slice;
pub mod stall;
pub mod tenants;

pub use limits::{Limits, RawLimits};
pub use shm::{RawShm, ShmLimits};
pub use slice::{GpuSlice, MpsShare, RawGpuRef, WorkerGpu};
pub use tenants::{RawTenant, TenantSpec};

/// The config file as written (all fields optional; defaults filled in by
/// [`AgentConfig::from_raw`]).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// This node's id in the registry and logs. Default: the host name.
    pub node_id: Option<String>,
    /// OIP gRPC address clients call.
    pub listen: Option<String>,
    /// Admin address: `/metrics`, `/livez`, `/readyz` and the admin gRPC service.
    pub admin_listen: Option<String>,
    /// KServe v2 HTTP/REST address (Triton's HTTP port is 8000); off unless set.
    pub http_listen: Option<String>,
    /// `"auto"` (the default): advertise the live capacity; a number pins
    /// the capacity score (× the share of ready workers).
    pub weight: Option<RawWeight>,
    /// OTLP/gRPC collector to export traces to (e.g. `http://127.0.0.1:4317`);
    /// tracing is off without one. `OTEL_EXPORTER_OTLP_ENDPOINT` also sets it.
    pub otlp_endpoint: Option<String>,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: Option<usize>,
    /// How long SIGTERM waits for in-flight requests before stopping workers.
    #[serde(default, with = "humantime_serde")]
    pub shutdown_grace: Option<Duration>,
    /// After SIGTERM, how long the agent keeps serving while advertising
    /// `draining`, so clients move away before it stops accepting.
    #[serde(default, with = "humantime_serde")]
    pub drain_delay: Option<Duration>,
    /// What one client can take of the OIP port.
    #[serde(default)]
    pub limits: RawLimits,
    /// How many shared-memory regions clients may register.
    #[serde(default)]
    pub shm: RawShm,
    /// Threads of the agent's async runtime. Default: one per CPU core.
    pub threads: Option<usize>,
    /// Per-model queue.
    #[serde(default)]
    pub queue: RawQueue,
    /// Fault detection and restart policy.
    #[serde(default)]
    pub sentinel: RawSentinel,
    /// GPU telemetry and the Xid policy.
    #[serde(default)]
    pub gpu: RawGpu,
    /// Where to advertise this node.
    #[serde(default)]
    pub registry: RawRegistry,
    /// Worker processes.
    #[serde(default)]
    pub workers: Vec<RawWorker>,
    /// Who the models belong to and what each owner gets under contention.
    #[serde(default)]
    pub tenants: Vec<RawTenant>,
    /// File holding the bearer token that mutating admin RPCs must present.
    pub admin_token_file: Option<PathBuf>,
    /// Health-check plugins and their schedule.
    #[serde(default)]
    pub health: RawHealth,
    /// Tensor transports the agent offers besides gRPC.
    #[serde(default)]
    pub transport: RawTransport,
    /// TLS on every port.
    #[serde(default)]
    pub tls: RawTls,
    /// Directory relative paths in the file resolve against (the config
    /// file's directory); not read from the file.
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
}

/// `[health]`: when checks run; `[[health.checks]]`: what they verify.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    /// Time between periodic rounds of a worker's checks.
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Random extra delay (0..jitter) added to each interval, so the workers
    /// of a fleet do not probe in lockstep.
    #[serde(default, with = "humantime_serde")]
    pub jitter: Option<Duration>,
    /// Deadline of one check; beyond it the check fails.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Consecutive failed rounds that restart a worker (fewer degrade it).
    pub failures: Option<u32>,
    /// The checks; each applies to the workers that serve its model.
    #[serde(default)]
    pub checks: Vec<infermesh_health::CheckSpec>,
}

/// `[transport]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTransport {
    /// The RDMA path: `auto` (a real device if present, else off with one
    /// log line), `emulated` (software, loopback only: tests and demos), `off`.
    pub rdma: Option<String>,
    /// Add the standard ORCA load report (`endpoint-load-metrics-bin`) to
    /// every response beside the `infermesh-*` trailers (default true).
    pub orca: Option<bool>,
    /// The QUIC rung: `on` or `off` (default `off`); needs `[tls]`.
    pub quic: Option<String>,
    /// UDP address of the QUIC rung. Default: the OIP address (same port, UDP).
    pub quic_listen: Option<String>,
    /// HTTP/2 connections to each worker process: one for small requests,
    /// the rest for large ones (default [`DEFAULT_WORKER_CONNECTIONS`]).
    pub worker_connections: Option<usize>,
}

/// `[tls]`: TLS on the OIP, admin and KServe HTTP ports (see [`crate::tls`]).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// Certificate chain (PEM); with `key`, every port serves TLS only.
    pub cert: Option<PathBuf>,
    /// Private key of `cert` (PEM).
    pub key: Option<PathBuf>,
    /// CA of client certificates: set, every port requires one (mTLS).
    pub client_ca: Option<PathBuf>,
    /// DNS names (SANs) of the clients allowed on the data plane (OIP and
    /// KServe HTTP ports); empty or absent: any client `client_ca` signed.
    #[serde(default)]
    pub allow_clients: Vec<String>,
    /// How often the certificate and key files are read again (a rotated
    /// Secret is picked up for new connections; open ones keep going).
    #[serde(default, with = "humantime_serde")]
    pub reload_interval: Option<Duration>,
    /// A plaintext address serving only `/livez` and `/readyz`, for
    /// Kubernetes probes when `client_ca` is set (the kubelet presents no
    /// client certificate; without `client_ca`, probes use `scheme: HTTPS`).
    pub probe_listen: Option<String>,
}

/// `[queue]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    /// Requests that may wait per model for a worker slot; beyond it the
    /// agent answers RESOURCE_EXHAUSTED at once.
    pub capacity: Option<usize>,
}

/// `[sentinel]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSentinel {
    /// First crash-loop backoff (the first restart is immediate).
    #[serde(default, with = "humantime_serde")]
    pub backoff_base: Option<Duration>,
    /// Longest crash-loop backoff.
    #[serde(default, with = "humantime_serde")]
    pub backoff_cap: Option<Duration>,
    /// Time ready after which the crash-loop backoff resets.
    #[serde(default, with = "humantime_serde")]
    pub stable_period: Option<Duration>,
    /// SIGTERM → SIGKILL grace when a *faulted* worker is killed. It has
    /// nothing to finish (its GPU context is gone or it hangs), so this is
    /// short; a graceful stop uses the worker's `stop_grace`.
    #[serde(default, with = "humantime_serde")]
    pub kill_grace: Option<Duration>,
    /// Interval of the liveness probe (ServerLive + ModelReady) on ready workers.
    #[serde(default, with = "humantime_serde")]
    pub probe_interval: Option<Duration>,
    /// A probe not answered within this is a timeout (hang).
    #[serde(default, with = "humantime_serde")]
    pub probe_timeout: Option<Duration>,
    /// Consecutive probe timeouts that count as a hang.
    pub probe_failures: Option<u32>,
    /// Internal errors from a worker within `error_window` that trigger a restart.
    pub error_burst: Option<u32>,
    /// Window of `error_burst`.
    #[serde(default, with = "humantime_serde")]
    pub error_window: Option<Duration>,
    /// Replaces the default fault patterns (substrings of worker output lines).
    pub fault_patterns: Option<Vec<String>>,
    /// Added to the fault patterns.
    #[serde(default)]
    pub extra_fault_patterns: Vec<String>,
}

/// `[registry]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegistry {
    /// `zk://host:port[,host:port...][/chroot]`; leave out to not register.
    pub url: Option<String>,
    /// Service this node serves.
    pub service: Option<String>,
    /// Zone (rack, availability zone).
    pub zone: Option<String>,
    /// ZooKeeper session timeout (a crashed node disappears after it).
    #[serde(default, with = "humantime_serde")]
    pub session_timeout: Option<Duration>,
    /// OIP address clients should use, when `listen` is not it (e.g. 0.0.0.0).
    pub advertise: Option<String>,
    /// Admin address operators' tools should use, when `admin_listen` is not it.
    pub admin_advertise: Option<String>,
    /// File holding `user:password` for ZooKeeper's digest scheme: the
    /// records are then writable by that identity only (readable by anyone).
    pub auth_file: Option<PathBuf>,
}

/// `[gpu]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    /// `auto` (NVML if the driver is there, else off), `nvml`, `fake`, `off`.
    pub backend: Option<String>,
    /// Devices of the fake backend.
    pub fake_devices: Option<u32>,
    /// MIG instances on each fake GPU, `MIG-fake-<gpu>-<instance>`.
    pub fake_mig_devices: Option<u32>,
    /// Whether the fake GPUs run MPS.
    pub fake_mps: Option<bool>,
    /// Xid code → action (`restart_worker`, `quarantine_gpu`,
    /// `quarantine_above_rate`, `ignore`), overriding the built-in table.
    #[serde(default)]
    pub xid: BTreeMap<String, String>,
    /// Action for Xid codes not in the table. Default `ignore` (logged, counted).
    pub unknown_xid: Option<String>,
    /// `quarantine_above_rate`: this many events ...
    pub xid_rate_count: Option<u32>,
    /// ... within this window quarantine the GPU.
    #[serde(default, with = "humantime_serde")]
    pub xid_rate_window: Option<Duration>,
    /// How long an application Xid that names no process holds its GPU's
    /// workers suspect (one that fails within it is restarted).
    #[serde(default, with = "humantime_serde")]
    pub suspect_window: Option<Duration>,
}

/// `[[workers]]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorker {
    /// Worker id in logs, metrics and the admin API. Default: `w<index>`.
    pub id: Option<String>,
    /// Command line, split like a shell does (no shell runs it). `{port}` is
    /// replaced by the port the agent picked for this worker.
    pub command: String,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// GPU index (`0`), GPU UUID (`"GPU-…"`) or MIG instance UUID
    /// (`"MIG-…"`), exported as `CUDA_VISIBLE_DEVICES`.
    pub gpu: Option<RawGpuRef>,
    /// CUDA MPS: percent of the GPU's SMs the worker may use
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`); needs an MPS daemon.
    pub mps_thread_percentage: Option<u32>,
    /// CUDA MPS: device memory the worker may pin, e.g. `"8GiB"`
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`); needs an MPS daemon. Both MPS
    /// settings need `gpu`.
    pub mps_memory_limit: Option<String>,
    /// Models the worker serves. Default: asked from the worker (RepositoryIndex).
    #[serde(default)]
    pub models: Vec<String>,
    /// Requests the agent sends to this worker at once.
    pub max_inflight: Option<usize>,
    /// How long the worker may take to become ready.
    #[serde(default, with = "humantime_serde")]
    pub startup_timeout: Option<Duration>,
    /// How long a stopping worker gets between SIGTERM and SIGKILL.
    #[serde(default, with = "humantime_serde")]
    pub stop_grace: Option<Duration>,
    /// The stall watchdog: `"auto"` (default: from the worker's service
    /// times), `"off"`, or a fixed window such as `"30s"`.
    pub stall_window: Option<String>,
    /// With `stall_window = "auto"`: the smallest window (default 5s).
    #[serde(default, with = "humantime_serde")]
    pub stall_floor: Option<Duration>,
}

/// `[transport] rdma`: whether the agent offers the RDMA path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RdmaMode {
    /// No RDMA path.
    Off,
    /// A real device if there is one ([`infermesh_rdma::RdmaEngine::probe`]), else off with
    /// one log line.
    #[default]
    Auto,
    /// The software emulation over loopback TCP: tests and demos only.
    Emulated,
}

impl FromStr for RdmaMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(RdmaMode::Off),
            "auto" => Ok(RdmaMode::Auto),
            "emulated" => Ok(RdmaMode::Emulated),
            _ => Err(format!("'{s}' is not one of off, auto, emulated")),
        }
    }
}

/// `weight` as written: a number or a word (only `"auto"` is valid).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum RawWeight {
    /// A pinned capacity score.
    Number(f64),
    /// `"auto"`.
    Word(String),
}

impl FromStr for RawWeight {
    type Err = std::convert::Infallible;

    /// `--weight auto` or `--weight 2.5`; checked with the rest of the config.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.parse::<f64>() {
            Ok(n) => RawWeight::Number(n),
            Err(_) => RawWeight::Word(s.to_string()),
        })
    }
}

/// The configured `weight`: estimated live (`"auto"`, the default) or
/// pinned to a number (× the share of workers ready).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weight {
    /// Estimated from what the workers serve ([`crate::dispatch::capacity`]).
    Auto,
    /// The operator's number.
    Fixed(f64),
}

impl From<f64> for Weight {
    fn from(w: f64) -> Self {
        Weight::Fixed(w)
    }
}

/// Longest `otlp_endpoint` accepted.
pub const MAX_OTLP_ENDPOINT: usize = 1024;

/// Checked agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Node id.
    pub node_id: String,
    /// OIP gRPC listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin_listen: SocketAddr,
    /// KServe v2 HTTP/REST listen address, if served.
    pub http_listen: Option<SocketAddr>,
    /// Live capacity or a pinned score.
    pub weight: Weight,
    /// OTLP trace collector; `None`: tracing off.
    pub otlp_endpoint: Option<String>,
    /// Largest gRPC message, bytes.
    pub max_message_bytes: usize,
    /// Wait for in-flight requests on SIGTERM.
    pub shutdown_grace: Duration,
    /// Keep serving while advertising `draining` after SIGTERM.
    pub drain_delay: Duration,
    /// Limits of the OIP port.
    pub limits: Limits,
    /// Limits of the shared-memory region table.
    pub shm: ShmLimits,
    /// Per-model queue capacity.
    pub queue_capacity: usize,
    /// Runtime threads; `None` = one per core.
    pub threads: Option<usize>,
    /// Sentinel policy shared by all workers (the startup timeout is per
    /// worker and set from the worker's spec).
    pub sentinel: SentinelConfig,
    /// Liveness probe interval.
    pub probe_interval: Duration,
    /// Liveness probe timeout.
    pub probe_timeout: Duration,
    /// Fault patterns matched against worker output.
    pub fault_patterns: FaultPatterns,
    /// GPU telemetry backend.
    pub gpu_backend: Backend,
    /// What the fake backend pretends the host has.
    pub fake_gpus: infermesh_gpu::FakeSetup,
    /// Xid policy.
    pub xid_policy: XidPolicy,
    /// How long an unattributed application Xid holds workers suspect.
    pub suspect_window: Duration,
    /// Registration, if any.
    pub registry: Option<RegistryConfig>,
    /// Whether responses carry the ORCA load report (`[transport] orca`).
    pub orca: bool,
    /// HTTP/2 connections to each worker process (`[transport]
    /// worker_connections`; [`crate::worker::upstream`]).
    pub worker_connections: usize,
    /// OIP address advertised to clients (`registry.advertise`); `None`:
    /// derived from the bound address by [`advertised`].
    pub advertise: Option<SocketAddr>,
    /// Admin address advertised to the ops CLI (`registry.admin_advertise`);
    /// `None`: derived like `advertise`.
    pub admin_advertise: Option<SocketAddr>,
    /// Workers.
    pub workers: Vec<WorkerSpec>,
    /// Tenants (`default` included, last unless configured).
    pub tenants: Vec<TenantSpec>,
    /// Bearer token of mutating admin RPCs; `None` refuses them all.
    pub admin_token: Option<AdminToken>,
    /// Health checks and their schedule.
    pub health: HealthConfig,
    /// The RDMA path.
    pub rdma: RdmaMode,
    /// TLS on every port (`[tls]`), if configured.
    pub tls: Option<crate::tls::TlsSettings>,
    /// The QUIC rung (`[transport] quic = "on"`): its UDP address, `None`
    /// for the OIP address.
    pub quic: Option<Option<SocketAddr>>,
    /// The `infermesh` binary to start workers through (see
    /// [`crate::supervision::launch`]); set by the CLI, not read from the file.
    pub worker_shim: Option<PathBuf>,
}

/// The admin bearer token; never printed.
#[derive(Clone)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Checked `[health]`.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// Time between periodic rounds.
    pub interval: Duration,
    /// Up to this much is added to each interval at random.
    pub jitter: Duration,
    /// Deadline of one check.
    pub timeout: Duration,
    /// The checks.
    pub checks: Vec<Arc<dyn HealthCheck>>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEALTH_INTERVAL,
            jitter: DEFAULT_HEALTH_JITTER,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            checks: Vec::new(),
        }
    }
}

/// One worker process to supervise.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Worker id.
    pub id: String,
    /// The command line as configured (with `{port}` unreplaced).
    pub command: String,
    /// Program and arguments, split, with `{port}` unreplaced.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The GPU or MIG instance (`CUDA_VISIBLE_DEVICES`) and its MPS share.
    pub gpu: Option<GpuSlice>,
    /// Models, or empty to ask the worker.
    pub models: Vec<String>,
    /// Concurrent requests to this worker.
    pub max_inflight: usize,
    /// Readiness deadline.
    pub startup_timeout: Duration,
    /// SIGTERM → SIGKILL grace.
    pub stop_grace: Duration,
    /// The stall watchdog's window.
    pub stall: StallWindow,
}

/// Default OIP listen address (Triton's gRPC port).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8001";
/// Default admin listen address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8002";
const DEFAULT_QUEUE_CAPACITY: usize = 256;
/// Connections to each worker: one for small requests, two for large ones
/// (BENCHMARKS.md, issue 27: a worker's HTTP/2 server reads each
/// connection on one task, so large requests spread over two keep its
/// threads busy; more measured no better on two cores).
pub const DEFAULT_WORKER_CONNECTIONS: usize = 3;
/// Most connections to one worker.
const MAX_WORKER_CONNECTIONS: usize = 16;
const DEFAULT_MAX_INFLIGHT: usize = 64;
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default `drain_delay`: above the time a registry change takes to reach
/// clients (a ZooKeeper watch fires in milliseconds; a client's record
/// cache and its in-flight picks settle within a second).
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(2);
const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
const DEFAULT_HEALTH_JITTER: Duration = Duration::from_secs(5);
const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

/// Every problem found in a configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid agent configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigError(pub Vec<String>);

impl RawConfig {
    /// Parses TOML text. Unknown fields and type errors are reported with
    /// their line.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(vec![e.to_string().trim_end().to_string()]))
    }
}

impl AgentConfig {
    /// Checks `raw` and fills in defaults; lists every problem at once.
    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let mut addr = |field: &str, value: Option<String>, default: &str| {
            let value = value.unwrap_or_else(|| default.to_string());
            value.parse::<SocketAddr>().map_err(|_| {
                problems.push(format!(
                    "{field}: '{value}' is not an address like 127.0.0.1:8001"
                ))
            })
        };
        let listen = addr("listen", raw.listen, DEFAULT_LISTEN);
        let admin_listen = addr("admin_listen", raw.admin_listen, DEFAULT_ADMIN_LISTEN);
        let http_listen = raw.http_listen.map(|h| {
            addr("http_listen", Some(h), "")
                .ok()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
        });
        if let (Ok(l), Ok(a)) = (&listen, &admin_listen) {
            if l == a && l.port() != 0 {
                problems.push(format!("listen and admin_listen are both {l}"));
            }
        }
        let advertise = advertise_addr(
            "registry.advertise",
            raw.registry.advertise.as_deref(),
            &mut problems,
        );
        let admin_advertise = advertise_addr(
            "registry.admin_advertise",
            raw.registry.admin_advertise.as_deref(),
            &mut problems,
        );
        let node_id = raw.node_id.unwrap_or_else(default_node_id);
        if node_id.is_empty() || node_id.contains('/') || node_id.chars().any(char::is_whitespace) {
            problems.push(format!(
                "node_id: '{node_id}' must be non-empty, without '/' or spaces"
            ));
        }
        let weight = match raw.weight {
            None => Weight::Auto,
            Some(RawWeight::Word(w)) if w == "auto" => Weight::Auto,
            Some(RawWeight::Word(w)) => {
                problems.push(format!(
                    "weight: '{}' must be \"auto\" or a positive number",
                    w.escape_debug()
                ));
                Weight::Auto
            }
            Some(RawWeight::Number(w)) => {
                if !(w.is_finite() && w > 0.0) {
                    problems.push(format!("weight: {w} must be a positive number"));
                }
                Weight::Fixed(w)
            }
        };
        let otlp_endpoint = raw.otlp_endpoint.filter(|e| !e.is_empty());
        if let Some(e) = &otlp_endpoint {
            if e.len() > MAX_OTLP_ENDPOINT
                || !(e.starts_with("http://") || e.starts_with("https://"))
                || e.parse::<http::Uri>().is_err()
            {
                problems.push(format!(
                    "otlp_endpoint: '{}' must be an http:// or https:// URL of at most {MAX_OTLP_ENDPOINT} bytes",
                    e.chars().take(128).collect::<String>().escape_debug()
                ));
            }
        }
        let max_message_bytes = raw
            .max_message_bytes
            .unwrap_or(infermesh_proto::DEFAULT_MAX_MESSAGE_BYTES);
        if max_message_bytes < 1024 {
            problems.push(format!(
                "max_message_bytes: {max_message_bytes} is below 1024"
            ));
        }
        let queue_capacity = raw.queue.capacity.unwrap_or(DEFAULT_QUEUE_CAPACITY);
        if raw.threads.is_some_and(|t| t == 0 || t > 1024) {
            problems.push("threads: must be between 1 and 1024".into());
        }
        if raw.workers.is_empty() {
            problems.push("no workers: give --worker \"COMMAND\" or a [[workers]] table".into());
        }
        let limits = Limits::from_raw(&raw.limits, &mut problems);
        let tenants = tenants::tenants(&raw.tenants, &mut problems);
        let shm = ShmLimits::from_raw(&raw.shm, &mut problems);
        let mut sentinel = sentinel_config(&raw.sentinel, &mut problems);
        let base_dir = raw.base_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let health = health_config(&raw.health, &base_dir, &mut problems);
        if let Some(n) = raw.health.failures {
            if n == 0 {
                problems.push("health.failures: must be at least 1".into());
            }
            sentinel.health_failure_threshold = n;
        }
        let admin_token = raw
            .admin_token_file
            .as_ref()
            .and_then(|p| read_token(&base_dir.join(p), &mut problems));
        let tls = tls_config(&raw.tls, &base_dir, &mut problems);
        let worker_connections = raw
            .transport
            .worker_connections
            .unwrap_or(DEFAULT_WORKER_CONNECTIONS);
        if !(1..=MAX_WORKER_CONNECTIONS).contains(&worker_connections) {
            problems.push(format!(
                "transport.worker_connections: {worker_connections} is out of range (1 to {MAX_WORKER_CONNECTIONS})"
            ));
        }
        let quic = match raw.transport.quic.as_deref() {
            None | Some("off") => None,
            Some("on") => {
                if tls.is_none() {
                    problems.push(
                        "transport.quic: QUIC is TLS 1.3 only: set tls.cert and tls.key".into(),
                    );
                }
                let listen = raw
                    .transport
                    .quic_listen
                    .as_ref()
                    .and_then(|q| match q.parse() {
                        Ok(a) => Some(a),
                        Err(_) => {
                            problems.push(format!(
                                "transport.quic_listen: '{q}' is not an address like 0.0.0.0:8001"
                            ));
                            None
                        }
                    });
                Some(listen)
            }
            Some(other) => {
                problems.push(format!("transport.quic: '{other}' is not on or off"));
                None
            }
        };
        let fault_patterns = fault_patterns(&raw.sentinel, &mut problems);
        let (gpu_backend, xid_policy) = gpu_config(&raw.gpu, &mut problems);
        let suspect_window = stall::suspect_window(raw.gpu.suspect_window, &mut problems);
        let registry = registry_config(&raw.registry, &base_dir, &mut problems);
        let rdma = match raw.transport.rdma.as_deref().map(str::parse::<RdmaMode>) {
            None => RdmaMode::default(),
            Some(Ok(mode)) => mode,
            Some(Err(e)) => {
                problems.push(format!("transport.rdma: {e}"));
                RdmaMode::Off
            }
        };
        let probe_interval = raw
            .sentinel
            .probe_interval
            .unwrap_or(DEFAULT_PROBE_INTERVAL);
        let probe_timeout = raw.sentinel.probe_timeout.unwrap_or(DEFAULT_PROBE_TIMEOUT);
        if probe_interval.is_zero() || probe_timeout.is_zero() {
            problems.push("sentinel: probe_interval and probe_timeout must be above zero".into());
        }
        let mut workers = Vec::new();
        for (i, w) in raw.workers.into_iter().enumerate() {
            let id = w.id.unwrap_or_else(|| format!("w{i}"));
            let at = format!("workers[{i}] ({id})");
            if id.is_empty()
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                problems.push(format!("{at}: id must be letters, digits, '-', '_' or '.'"));
            }
            if workers.iter().any(|s: &WorkerSpec| s.id == id) {
                problems.push(format!("{at}: duplicate worker id"));
            }
            let argv = match shlex::split(&w.command) {
                Some(argv) if !argv.is_empty() => argv,
                Some(_) => {
                    problems.push(format!("{at}: command is empty"));
                    vec![]
                }
                None => {
                    problems.push(format!(
                        "{at}: command has an unclosed quote: {}",
                        w.command
                    ));
                    vec![]
                }
            };
            let max_inflight = w.max_inflight.unwrap_or(DEFAULT_MAX_INFLIGHT);
            if max_inflight == 0 {
                problems.push(format!("{at}: max_inflight must be at least 1"));
            }
            if let Some(bad) = w.models.iter().find(|m| m.is_empty()) {
                problems.push(format!("{at}: empty model name '{bad}'"));
            }
            for key in w.env.keys() {
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    problems.push(format!("{at}: invalid environment variable name '{key}'"));
                }
            }
            let stall =
                stall::stall_window(&at, w.stall_window.as_deref(), w.stall_floor, &mut problems);
            let gpu = slice::gpu_slice(
                &at,
                w.gpu,
                w.mps_thread_percentage,
                w.mps_memory_limit.as_deref(),
                &w.env,
                &mut problems,
            );
            workers.push(WorkerSpec {
                id,
                command: w.command,
                argv,
                env: w.env,
                gpu,
                models: w.models,
                max_inflight,
                startup_timeout: w.startup_timeout.unwrap_or(DEFAULT_STARTUP_TIMEOUT),
                stop_grace: w.stop_grace.unwrap_or(DEFAULT_STOP_GRACE),
                stall,
            });
        }
        match (listen, admin_listen, problems.is_empty()) {
            (Ok(listen), Ok(admin_listen), true) => Ok(AgentConfig {
                node_id,
                listen,
                admin_listen,
                http_listen,
                weight,
                otlp_endpoint,
                max_message_bytes,
                shutdown_grace: raw.shutdown_grace.unwrap_or(DEFAULT_SHUTDOWN_GRACE),
                drain_delay: raw.drain_delay.unwrap_or(DEFAULT_DRAIN_DELAY),
                limits,
                shm,
                queue_capacity,
                threads: raw.threads,
                sentinel,
                probe_interval,
                probe_timeout,
                fault_patterns,
                gpu_backend,
                fake_gpus: infermesh_gpu::FakeSetup {
                    devices: raw.gpu.fake_devices.unwrap_or(2),
                    mig_per_device: raw.gpu.fake_mig_devices.unwrap_or(0),
                    mps: raw.gpu.fake_mps.unwrap_or(false),
                },
                xid_policy,
                suspect_window,
                registry,
                orca: raw.transport.orca.unwrap_or(true),
                worker_connections,
                advertise,
                admin_advertise,
                workers,
                tenants,
                admin_token,
                health,
                rdma,
                tls,
                quic,
                worker_shim: None,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

/// Checks `[tls]`, loading the files so that a bad certificate or key is
/// a configuration error (exit 78, and `--check-config` shows it).
fn tls_config(
    raw: &RawTls,
    base_dir: &Path,
    problems: &mut Vec<String>,
) -> Option<crate::tls::TlsSettings> {
    let (cert, key) = match (&raw.cert, &raw.key) {
        (Some(c), Some(k)) => (base_dir.join(c), base_dir.join(k)),
        (None, None) => {
            if raw.client_ca.is_some() || !raw.allow_clients.is_empty() {
                problems.push("tls: client_ca and allow_clients need tls.cert and tls.key".into());
            }
            return None;
        }
        _ => {
            problems.push("tls: give both cert and key (--tls-cert, --tls-key), or neither".into());
            return None;
        }
    };
    if !raw.allow_clients.is_empty() && raw.client_ca.is_none() {
        problems.push("tls.allow_clients: needs tls.client_ca (client certificates)".into());
    }
    if raw.allow_clients.len() > crate::tls::MAX_ALLOWED_CLIENTS {
        problems.push(format!(
            "tls.allow_clients: {} names (at most {})",
            raw.allow_clients.len(),
            crate::tls::MAX_ALLOWED_CLIENTS
        ));
    }
    for name in &raw.allow_clients {
        if rustls::pki_types::DnsName::try_from(name.as_str()).is_err() {
            problems.push(format!("tls.allow_clients: '{name}' is not a DNS name"));
        }
    }
    let reload_interval = raw
        .reload_interval
        .unwrap_or(crate::tls::DEFAULT_RELOAD_INTERVAL);
    if reload_interval < Duration::from_millis(100) || reload_interval > Duration::from_secs(3600) {
        problems.push("tls.reload_interval: between 100ms and 1h".into());
    }
    let probe_listen = raw.probe_listen.as_ref().and_then(|p| match p.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            problems.push(format!(
                "tls.probe_listen: '{p}' is not an address like 0.0.0.0:8003"
            ));
            None
        }
    });
    let settings = crate::tls::TlsSettings {
        cert,
        key,
        client_ca: raw.client_ca.as_ref().map(|c| base_dir.join(c)),
        allow_clients: raw.allow_clients.clone(),
        reload_interval,
        probe_listen,
    };
    if problems.is_empty() {
        if let Err(e) = crate::tls::ServerTls::load(&settings) {
            problems.push(e);
        }
    }
    Some(settings)
}

fn sentinel_config(raw: &RawSentinel, problems: &mut Vec<String>) -> SentinelConfig {
    let d = SentinelConfig::default();
    let cfg = SentinelConfig {
        backoff_base: raw.backoff_base.unwrap_or(d.backoff_base),
        backoff_cap: raw.backoff_cap.unwrap_or(d.backoff_cap),
        stable_period: raw.stable_period.unwrap_or(d.stable_period),
        error_burst: raw.error_burst.unwrap_or(d.error_burst),
        error_window: raw.error_window.unwrap_or(d.error_window),
        probe_failure_threshold: raw.probe_failures.unwrap_or(d.probe_failure_threshold),
        kill_grace: raw.kill_grace.unwrap_or(d.kill_grace),
        ..d
    };
    if cfg.backoff_cap < cfg.backoff_base {
        problems.push("sentinel: backoff_cap is below backoff_base".into());
    }
    if cfg.error_burst == 0 || cfg.probe_failure_threshold == 0 {
        problems.push("sentinel: error_burst and probe_failures must be at least 1".into());
    }
    cfg
}

fn fault_patterns(raw: &RawSentinel, problems: &mut Vec<String>) -> FaultPatterns {
    let mut list: Vec<String> = match &raw.fault_patterns {
        Some(list) => list.clone(),
        None => FaultPatterns::default_patterns()
            .iter()
            .map(|p| p.to_string())
            .collect(),
    };
    list.extend(raw.extra_fault_patterns.iter().cloned());
    FaultPatterns::new(list).unwrap_or_else(|e| {
        problems.push(format!("sentinel.fault_patterns: {e}"));
        FaultPatterns::defaults()
    })
}

fn health_config(raw: &RawHealth, base_dir: &Path, problems: &mut Vec<String>) -> HealthConfig {
    let mut checks = Vec::new();
    for (i, spec) in raw.checks.iter().enumerate() {
        match infermesh_health::build(spec, base_dir) {
            Ok(c) => checks.push(Arc::from(c)),
            Err(e) => problems.push(format!("health.checks[{i}]: {e}")),
        }
    }
    let cfg = HealthConfig {
        interval: raw.interval.unwrap_or(DEFAULT_HEALTH_INTERVAL),
        jitter: raw.jitter.unwrap_or(DEFAULT_HEALTH_JITTER),
        timeout: raw.timeout.unwrap_or(DEFAULT_HEALTH_TIMEOUT),
        checks,
    };
    if cfg.interval.is_zero() || cfg.timeout.is_zero() {
        problems.push("health: interval and timeout must be above zero".into());
    }
    cfg
}

/// Reads the admin token: the file's content without surrounding whitespace.
fn read_token(path: &Path, problems: &mut Vec<String>) -> Option<AdminToken> {
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().len() >= 16 => Some(AdminToken(t.trim().to_string())),
        Ok(_) => {
            problems.push(format!(
                "admin_token_file: {} holds fewer than 16 characters; generate one with `head -c 32 /dev/urandom | base64`",
                path.display()
            ));
            None
        }
        Err(e) => {
            problems.push(format!(
                "admin_token_file: cannot read {}: {e}",
                path.display()
            ));
            None
        }
    }
}

/// The environment variable that names this host's address, for the
/// addresses advertised when a listen address is `0.0.0.0` or `::` (the
/// DaemonSet sets it from the downward API's `status.hostIP`).
pub const ADVERTISE_IP_ENV: &str = "INFERMESH_ADVERTISE_IP";

/// A configured advertised address: `ip:port`, not unspecified, not port 0.
fn advertise_addr(
    key: &str,
    value: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<SocketAddr> {
    let value = value?;
    match value.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() || a.port() == 0 => {
            problems.push(format!(
                "{key}: '{value}' cannot be dialled; give this host's address and port"
            ));
            None
        }
        Ok(a) => Some(a),
        Err(_) => {
            problems.push(format!("{key}: '{value}' is not ip:port"));
            None
        }
    }
}

/// The address to advertise for a listener bound to `bound`: the configured
/// one if any; else `bound` itself unless it is unspecified (`0.0.0.0`,
/// `::`), in which case this host's address (`host_ip`) with the bound port.
/// Never an unspecified address: a record saying `0.0.0.0:8002` makes a CLI on
/// another host dial its own agent.
pub fn advertised(
    configured: Option<SocketAddr>,
    bound: SocketAddr,
    host_ip: impl FnOnce() -> Option<IpAddr>,
) -> Result<SocketAddr, String> {
    if let Some(a) = configured {
        return Ok(a);
    }
    if !bound.ip().is_unspecified() {
        return Ok(bound);
    }
    match host_ip() {
        Some(ip) if !ip.is_unspecified() => Ok(SocketAddr::new(ip, bound.port())),
        _ => Err(format!(
            "listening on {bound} and this host's address is unknown: set \
             {ADVERTISE_IP_ENV}, or registry.advertise / registry.admin_advertise"
        )),
    }
}

/// This host's address: [`ADVERTISE_IP_ENV`] if set, else the source address
/// of the default route (a UDP socket "connected" to a documentation address:
/// no packet is sent), of the family of `like`.
pub fn host_ip(like: IpAddr) -> Option<IpAddr> {
    if let Ok(v) = std::env::var(ADVERTISE_IP_ENV) {
        return v.trim().parse().ok();
    }
    let (bind, probe) = if like.is_ipv6() {
        ("[::]:0", "[2001:db8::1]:9")
    } else {
        ("0.0.0.0:0", "192.0.2.1:9")
    };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(probe).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// Registry settings of an agent.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Where to register.
    pub url: RegistryUrl,
    /// Service name.
    pub service: String,
    /// Zone.
    pub zone: String,
    /// ZooKeeper session timeout.
    pub session_timeout: Duration,
    /// Digest credentials (`registry.auth_file`).
    pub auth: Option<infermesh_registry::publish::DigestAuth>,
}

fn registry_config(
    raw: &RawRegistry,
    base_dir: &Path,
    problems: &mut Vec<String>,
) -> Option<RegistryConfig> {
    let url = raw.url.as_ref()?;
    let url = match url.parse::<RegistryUrl>() {
        Ok(u) => u,
        Err(e) => {
            problems.push(format!("registry.url: {e}"));
            return None;
        }
    };
    let service = raw.service.clone().unwrap_or_else(|| "default".into());
    if !valid_name(&service) {
        problems.push(format!(
            "registry.service: '{service}' must be letters, digits, '-', '_' or '.'"
        ));
    }
    let session_timeout = raw.session_timeout.unwrap_or(DEFAULT_SESSION_TIMEOUT);
    if session_timeout < Duration::from_secs(1) {
        problems.push("registry.session_timeout: at least 1s".into());
    }
    let auth = raw.auth_file.as_ref().and_then(|p| {
        let path = base_dir.join(p);
        match std::fs::read_to_string(&path) {
            Ok(text) => match infermesh_registry::publish::DigestAuth::parse(&text) {
                Ok(a) => Some(a),
                Err(e) => {
                    problems.push(format!("registry.auth_file: {} {e}", path.display()));
                    None
                }
            },
            Err(e) => {
                problems.push(format!(
                    "registry.auth_file: cannot read {}: {e}",
                    path.display()
                ));
                None
            }
        }
    });
    Some(RegistryConfig {
        url,
        service,
        zone: raw.zone.clone().unwrap_or_default(),
        session_timeout,
        auth,
    })
}

fn xid_action(name: &str) -> Option<XidAction> {
    Some(match name {
        "restart_worker" => XidAction::RestartWorker,
        "quarantine_gpu" => XidAction::QuarantineGpu,
        "quarantine_above_rate" => XidAction::QuarantineAboveRate,
        "ignore" => XidAction::Ignore,
        _ => return None,
    })
}

fn gpu_config(raw: &RawGpu, problems: &mut Vec<String>) -> (Backend, XidPolicy) {
    let backend = match raw.backend.as_deref().unwrap_or("auto").parse::<Backend>() {
        Ok(b) => b,
        Err(_) => {
            problems.push(format!(
                "gpu.backend: '{}' is not one of auto, nvml, fake, off",
                raw.backend.as_deref().unwrap_or_default()
            ));
            Backend::Off
        }
    };
    let actions = "restart_worker, quarantine_gpu, quarantine_above_rate, ignore";
    let mut overrides = Vec::new();
    for (code, action) in &raw.xid {
        match (code.parse::<u32>(), xid_action(action)) {
            (Ok(c), Some(a)) => overrides.push((c, a)),
            (Err(_), _) => problems.push(format!("gpu.xid: '{code}' is not an Xid number")),
            (_, None) => problems.push(format!(
                "gpu.xid.{code}: '{action}' is not one of {actions}"
            )),
        }
    }
    let unknown = match raw.unknown_xid.as_deref().map(xid_action) {
        None => XidAction::Ignore,
        Some(Some(a)) => a,
        Some(None) => {
            problems.push(format!("gpu.unknown_xid: expected one of {actions}"));
            XidAction::Ignore
        }
    };
    let policy = XidPolicy::new(
        &overrides,
        unknown,
        raw.xid_rate_count.unwrap_or(3),
        raw.xid_rate_window.unwrap_or(Duration::from_secs(60)),
    );
    (backend, policy)
}

fn default_node_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_gets_defaults() {
        let raw = RawConfig::from_toml("[[workers]]\ncommand = \"w --listen 127.0.0.1:{port}\"\n")
            .unwrap();
        let cfg = AgentConfig::from_raw(raw).unwrap();
        assert_eq!(cfg.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(cfg.workers[0].id, "w0");
        assert_eq!(cfg.workers[0].argv, ["w", "--listen", "127.0.0.1:{port}"]);
        assert_eq!(cfg.queue_capacity, DEFAULT_QUEUE_CAPACITY);
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../../configs/agent.toml");
        let mut raw = RawConfig::from_toml(text).unwrap();
        raw.base_dir = Some(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs"
        )));
        let cfg = AgentConfig::from_raw(raw).unwrap();
        assert!(!cfg.workers.is_empty());
        assert_eq!(cfg.health.checks.len(), 6);
        // The example states the defaults of these sections: docs = code.
        assert_eq!(cfg.limits, limits::Limits::default());
        assert_eq!(cfg.drain_delay, DEFAULT_DRAIN_DELAY);
        assert_eq!(cfg.worker_connections, DEFAULT_WORKER_CONNECTIONS);
    }

    #[test]
    fn weight_is_auto_unless_pinned() {
        let weight = |toml: &str| {
            AgentConfig::from_raw(
                RawConfig::from_toml(&format!("{toml}\n[[workers]]\ncommand = \"w\"\n")).unwrap(),
            )
            .map(|c| c.weight)
            .map_err(|e| e.to_string())
        };
        assert_eq!(weight(""), Ok(Weight::Auto));
        assert_eq!(weight("weight = \"auto\""), Ok(Weight::Auto));
        assert_eq!(weight("weight = 2.5"), Ok(Weight::Fixed(2.5)));
        assert_eq!(weight("weight = 4"), Ok(Weight::Fixed(4.0)));
        let err = weight("weight = \"fast\"").unwrap_err();
        assert!(
            err.contains("weight: 'fast' must be \"auto\" or a positive number"),
            "{err}"
        );
        assert!(weight("weight = 0").is_err());
        assert_eq!("auto".parse(), Ok(RawWeight::Word("auto".into())));
        assert_eq!("3".parse(), Ok(RawWeight::Number(3.0)));
    }

    #[test]
    fn otlp_endpoint_is_an_http_url() {
        let otlp = |toml: &str| {
            AgentConfig::from_raw(
                RawConfig::from_toml(&format!("{toml}\n[[workers]]\ncommand = \"w\"\n")).unwrap(),
            )
            .map(|c| c.otlp_endpoint)
            .map_err(|e| e.to_string())
        };
        assert_eq!(otlp(""), Ok(None));
        assert_eq!(otlp("otlp_endpoint = \"\""), Ok(None));
        assert_eq!(
            otlp("otlp_endpoint = \"http://127.0.0.1:4317\""),
            Ok(Some("http://127.0.0.1:4317".into()))
        );
        for bad in ["collector:4317", "ftp://x", "http://a b"] {
            let err = otlp(&format!("otlp_endpoint = \"{bad}\"")).unwrap_err();
            assert!(err.contains("otlp_endpoint"), "{err}");
        }
        let long = format!("otlp_endpoint = \"http://{}\"", "a".repeat(2000));
        assert!(otlp(&long).is_err());
    }

    #[test]
    fn reports_every_problem_at_once() {
        let raw = RawConfig::from_toml(
            r#"
            listen = "nope"
            weight = -1.0
            [[workers]]
            id = "a"
            command = ""
            max_inflight = 0
            [[workers]]
            id = "a"
            command = "x 'unclosed"
            "#,
        )
        .unwrap();
        let err = AgentConfig::from_raw(raw).unwrap_err();
        let text = err.to_string();
        for needle in [
            "listen",
            "weight",
            "command is empty",
            "max_inflight",
            "duplicate",
            "unclosed",
        ] {
            assert!(text.contains(needle), "missing '{needle}' in {text}");
        }
    }

    #[test]
    fn sentinel_and_gpu_sections_are_checked() {
        let raw = RawConfig::from_toml(
            r#"
            [sentinel]
            backoff_base = "10s"
            backoff_cap = "1s"
            fault_patterns = [""]
            [gpu]
            backend = "quantum"
            xid = { "79" = "explode", "x" = "ignore" }
            [[workers]]
            command = "w"
            "#,
        )
        .unwrap();
        let text = AgentConfig::from_raw(raw).unwrap_err().to_string();
        for needle in [
            "backoff_cap",
            "fault_patterns",
            "gpu.backend",
            "gpu.xid.79",
            "'x' is not an Xid",
        ] {
            assert!(text.contains(needle), "missing '{needle}' in {text}");
        }
    }

    #[test]
    fn extra_fault_patterns_extend_the_defaults() {
        let raw = RawConfig::from_toml(
            "[sentinel]\nextra_fault_patterns = [\"MY_FATAL\"]\n[[workers]]\ncommand = \"w\"\n",
        )
        .unwrap();
        let cfg = AgentConfig::from_raw(raw).unwrap();
        assert_eq!(
            cfg.fault_patterns.find("boom MY_FATAL here"),
            Some("MY_FATAL")
        );
        assert!(cfg.fault_patterns.find("CUDA error: x").is_some());
    }

    #[test]
    fn registry_section_is_checked() {
        let raw = RawConfig::from_toml(
            "[registry]\nurl = \"zk://127.0.0.1:2181/im\"\nservice = \"eta\"\n[[workers]]\ncommand = \"w\"\n",
        )
        .unwrap();
        let cfg = AgentConfig::from_raw(raw).unwrap();
        assert_eq!(cfg.registry.unwrap().service, "eta");
        let raw = RawConfig::from_toml(
            "[registry]\nurl = \"zk://nohost\"\nservice = \"a/b\"\n[[workers]]\ncommand = \"w\"\n",
        )
        .unwrap();
        let text = AgentConfig::from_raw(raw).unwrap_err().to_string();
        assert!(text.contains("registry.url"), "{text}");
    }

    #[test]
    fn tenants_section_is_checked() {
        let cfg = |text: &str| {
            AgentConfig::from_raw(
                RawConfig::from_toml(&format!("[[workers]]\ncommand = \"w\"\n{text}")).unwrap(),
            )
        };
        let t = cfg("").unwrap().tenants;
        assert_eq!(t, vec![TenantSpec::whole_node()]);
        let t = cfg(
            "[[tenants]]\nname = \"search\"\nmodels = [\"ranker\"]\npriority = 1\nshare = 0.7\n",
        )
        .unwrap()
        .tenants;
        assert_eq!(t[0].name, "search");
        assert_eq!(t[1].name, tenants::DEFAULT_TENANT);
        let text =
            cfg("[[tenants]]\nname = \"a\"\nshare = 0.7\n[[tenants]]\nname = \"b\"\nshare = 0.7\n")
                .unwrap_err()
                .to_string();
        assert!(text.contains("shares add up to 1.400"), "{text}");
    }

    #[test]
    fn transport_section_is_checked() {
        let cfg = |text: &str| {
            AgentConfig::from_raw(
                RawConfig::from_toml(&format!("{text}\n[[workers]]\ncommand = \"w\"\n")).unwrap(),
            )
        };
        assert_eq!(cfg("").unwrap().rdma, RdmaMode::Auto);
        assert_eq!(
            cfg("[transport]\nrdma = \"emulated\"").unwrap().rdma,
            RdmaMode::Emulated
        );
        assert_eq!(
            cfg("[transport]\nrdma = \"off\"").unwrap().rdma,
            RdmaMode::Off
        );
        let text = cfg("[transport]\nrdma = \"yes\"").unwrap_err().to_string();
        assert!(text.contains("transport.rdma"), "{text}");
        assert_eq!(
            cfg("").unwrap().worker_connections,
            DEFAULT_WORKER_CONNECTIONS
        );
        assert_eq!(
            cfg("[transport]\nworker_connections = 1")
                .unwrap()
                .worker_connections,
            1
        );
        for bad in [0, 17] {
            let text = cfg(&format!("[transport]\nworker_connections = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(text.contains("transport.worker_connections"), "{text}");
        }
    }

    #[test]
    fn tls_section_is_checked() {
        let dir = std::env::temp_dir().join(format!("infermesh-config-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["agent.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("k.pem"), key.serialize_pem()).unwrap();
        let cfg = |text: &str| {
            let mut raw =
                RawConfig::from_toml(&format!("[[workers]]\ncommand = \"w\"\n{text}")).unwrap();
            raw.base_dir = Some(dir.clone());
            AgentConfig::from_raw(raw)
        };
        assert!(cfg("").unwrap().tls.is_none());
        let ok = cfg("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"c.pem\"\nallow_clients = [\"a.test\"]")
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(ok.cert, dir.join("c.pem"));
        assert_eq!(ok.allow_clients, ["a.test"]);
        assert_eq!(ok.reload_interval, crate::tls::DEFAULT_RELOAD_INTERVAL);
        let quic = cfg("[transport]\nquic = \"on\"\nquic_listen = \"127.0.0.1:9001\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"")
            .unwrap()
            .quic;
        assert_eq!(quic, Some(Some("127.0.0.1:9001".parse().unwrap())));
        for (text, needle) in [
            ("[tls]\ncert = \"c.pem\"", "both cert and key"),
            ("[tls]\nclient_ca = \"c.pem\"", "need tls.cert"),
            (
                "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nallow_clients = [\"a.test\"]",
                "needs tls.client_ca",
            ),
            (
                "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"c.pem\"\nallow_clients = [\"not a name\"]",
                "not a DNS name",
            ),
            (
                "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nreload_interval = \"1ms\"",
                "reload_interval",
            ),
            ("[tls]\ncert = \"k.pem\"\nkey = \"k.pem\"", "no CERTIFICATE"),
            ("[transport]\nquic = \"on\"", "QUIC is TLS 1.3 only"),
            ("[transport]\nquic = \"yes\"", "transport.quic: 'yes'"),
        ] {
            let text = cfg(text).unwrap_err().to_string();
            assert!(text.contains(needle), "missing '{needle}' in {text}");
        }
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = RawConfig::from_toml("listn = \"x\"").unwrap_err();
        assert!(err.to_string().contains("listn"), "{err}");
    }

    #[test]
    fn advertised_addresses_are_never_unspecified() {
        let any: SocketAddr = "0.0.0.0:8002".parse().unwrap();
        let node: IpAddr = "10.0.0.7".parse().unwrap();
        let bound: SocketAddr = "10.0.0.7:8001".parse().unwrap();
        assert_eq!(advertised(None, bound, || None).unwrap(), bound);
        assert_eq!(
            advertised(None, any, || Some(node)).unwrap(),
            "10.0.0.7:8002".parse().unwrap()
        );
        let pinned: SocketAddr = "192.0.2.9:9".parse().unwrap();
        assert_eq!(advertised(Some(pinned), any, || None).unwrap(), pinned);
        let err = advertised(None, any, || None).unwrap_err();
        assert!(err.contains(ADVERTISE_IP_ENV), "{err}");
        assert!(advertised(None, any, || Some("0.0.0.0".parse().unwrap())).is_err());

        let cfg = |text: &str| {
            AgentConfig::from_raw(
                RawConfig::from_toml(&format!("[[workers]]\ncommand = \"w\"\n{text}")).unwrap(),
            )
        };
        let text =
            cfg("[registry]\nurl = \"zk://127.0.0.1:2181\"\nadmin_advertise = \"0.0.0.0:8002\"")
                .unwrap_err()
                .to_string();
        assert!(text.contains("registry.admin_advertise"), "{text}");
        let ok =
            cfg("[registry]\nurl = \"zk://127.0.0.1:2181\"\nadmin_advertise = \"10.0.0.7:8002\"")
                .unwrap();
        assert_eq!(ok.admin_advertise, Some("10.0.0.7:8002".parse().unwrap()));
    }
}
