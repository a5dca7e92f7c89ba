//! The client's configuration file (see `configs/client.toml`): serde structs
//! that reject unknown fields ([`RawClientConfig`]), checked into a typed
//! [`ClientConfig`] that lists every problem at once, then applied to a
//! [`ClientBuilder`] through its public methods only — so a file can do
//! nothing code could not.
//!
//! ```no_run
//! # async fn demo(text: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let config = infermesh_client::ClientConfig::from_toml(text)?;
//! let client = config
//!     .apply(infermesh_client::Client::builder())
//!     .local_node("gpu-node-7") // code may still override the file
//!     .build()
//!     .await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use infermesh_proto::registry::{RegistryUrl, valid_name};
use serde::Deserialize;

use crate::balancer::BalancerConfig;
use crate::client::ClientBuilder;
pub use crate::client::{
    DEFAULT_BUDGET_PER_SEC, DEFAULT_BUDGET_RATIO, DEFAULT_DEADLINE, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_REGISTRY, DEFAULT_SERVICE,
};
pub use crate::paths::{DEFAULT_REPROBE_AFTER, DEFAULT_SHM_MIN_BYTES, DEFAULT_SHM_POOL_BYTES};

/// A pool smaller than this could not hold a useful batch.
const MIN_SHM_POOL_BYTES: u64 = 1 << 20;

/// The file as written: every field optional, defaults filled in by
/// [`ClientConfig::from_raw`].
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientConfig {
    /// `zk://host:port[,...][/chroot]` or `static://host:port[,...]`.
    pub registry: Option<String>,
    /// Service to call.
    pub service: Option<String>,
    /// This host's node id, preferred while healthy and not overloaded.
    pub local_node: Option<String>,
    /// Deadline of each call, retries included.
    #[serde(default, with = "humantime_serde")]
    pub deadline: Option<Duration>,
    /// Seed of the balancer's randomness. Default: from the clock.
    pub seed: Option<u64>,
    /// Retries.
    #[serde(default)]
    pub retry: RawRetry,
    /// Balancer tuning.
    #[serde(default)]
    pub balancer: RawBalancer,
    /// Tensor transport ladder.
    #[serde(default)]
    pub transport: RawTransport,
    /// TLS to agents (issue 13).
    #[serde(default)]
    pub tls: RawTls,
}

/// `[tls]`: used for agents whose records say they serve TLS. Without a
/// `ca` here, the environment's `INFERMESH_TLS_CA`, `INFERMESH_TLS_CERT`
/// and `INFERMESH_TLS_KEY` are used.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// CA certificate(s) (PEM) that signed the agents' certificates.
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for agents that require one (mTLS).
    pub cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of `cert`.
    pub key: Option<std::path::PathBuf>,
}

impl RawTls {
    /// These files, or the environment's when none is given.
    pub fn files(&self) -> infermesh_tls::TlsFiles {
        use infermesh_tls::{ENV_CA, ENV_CERT, ENV_KEY, TlsFiles};
        if self.ca.is_none() && self.cert.is_none() && self.key.is_none() {
            let var = |name| {
                std::env::var_os(name)
                    .filter(|v| !v.is_empty())
                    .map(Into::into)
            };
            return TlsFiles {
                ca: var(ENV_CA),
                cert: var(ENV_CERT),
                key: var(ENV_KEY),
            };
        }
        TlsFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// `[retry]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// Attempts per call, the first included.
    pub max_attempts: Option<usize>,
    /// Retries earned per request, in `[0, 1]`.
    pub budget_ratio: Option<f64>,
    /// Retries earned per second regardless of traffic.
    pub budget_per_sec: Option<f64>,
}

/// `[balancer]`: the fields of [`BalancerConfig`] (documented there).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBalancer {
    /// See [`BalancerConfig::local_bias`].
    pub local_bias: Option<f64>,
    /// See [`BalancerConfig::ewma_decay`].
    #[serde(default, with = "humantime_serde")]
    pub ewma_decay: Option<Duration>,
    /// See [`BalancerConfig::default_rtt`].
    #[serde(default, with = "humantime_serde")]
    pub default_rtt: Option<Duration>,
    /// See [`BalancerConfig::eject_after`].
    pub eject_after: Option<u32>,
    /// See [`BalancerConfig::eject_base`].
    #[serde(default, with = "humantime_serde")]
    pub eject_base: Option<Duration>,
    /// See [`BalancerConfig::eject_max`].
    #[serde(default, with = "humantime_serde")]
    pub eject_max: Option<Duration>,
    /// See [`BalancerConfig::max_ejected_share`].
    pub max_ejected_share: Option<f64>,
    /// See [`BalancerConfig::slow_start`].
    #[serde(default, with = "humantime_serde")]
    pub slow_start: Option<Duration>,
    /// See [`BalancerConfig::load_report_ttl`].
    #[serde(default, with = "humantime_serde")]
    pub load_report_ttl: Option<Duration>,
    /// See [`BalancerConfig::attempt_timeout_factor`].
    pub attempt_timeout_factor: Option<f64>,
    /// See [`BalancerConfig::attempt_timeout_floor`].
    #[serde(default, with = "humantime_serde")]
    pub attempt_timeout_floor: Option<Duration>,
}

/// `[transport]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTransport {
    /// Paths to try, fastest first; `grpc` is always the last rung.
    pub prefer: Option<Vec<String>>,
    /// Bytes of the shared-memory pool registered with a same-host agent.
    pub shm_pool_bytes: Option<u64>,
    /// Smallest request (raw input bytes) sent through shared memory.
    pub shm_min_bytes: Option<usize>,
    /// How long a path that failed for a peer is skipped before a retry.
    #[serde(default, with = "humantime_serde")]
    pub reprobe_after: Option<Duration>,
}

/// Checked client configuration; [`Default`] is the library's defaults.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Registry URL (checked to parse).
    pub registry: String,
    /// Service to call.
    pub service: String,
    /// This host's node id, if any.
    pub local_node: Option<String>,
    /// Deadline of each call, retries included.
    pub deadline: Duration,
    /// Seed of the balancer's randomness; `None` leaves the builder's.
    pub seed: Option<u64>,
    /// Retries.
    pub retry: RetryConfig,
    /// Balancer tuning. Its `local_node` is always `None`: the top-level
    /// [`ClientConfig::local_node`] holds it.
    pub balancer: BalancerConfig,
    /// TLS to agents that serve it (`[tls]` or the environment), loaded.
    pub tls: Option<infermesh_tls::ClientTls>,
    /// Transport ladder, applied with [`ClientBuilder::transports`]
    /// (`quic` is used with nodes that advertise it when TLS is configured).
    pub transport: TransportConfig,
}

/// Retries of a call to a different node.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Attempts per call, the first included (at least 1).
    pub max_attempts: usize,
    /// Retries earned per request, in `[0, 1]`.
    pub budget_ratio: f64,
    /// Retries earned per second regardless of traffic (at least 0).
    pub budget_per_sec: f64,
}

/// One rung of the tensor transport ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Shared memory with an agent on the same host.
    Shm,
    /// RDMA between hosts that both advertise a verbs device.
    Rdma,
    /// QUIC streams between hosts that both advertise a QUIC endpoint.
    Quic,
    /// Tensors inline in gRPC messages: always available.
    Grpc,
}

impl TransportKind {
    /// Every kind, in the design's order (fastest first).
    pub const ALL: [TransportKind; 4] = [Self::Shm, Self::Rdma, Self::Quic, Self::Grpc];

    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Rdma => "rdma",
            Self::Quic => "quic",
            Self::Grpc => "grpc",
        }
    }

    /// The kind named `name` in a config file.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Which tensor paths to use, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportConfig {
    /// Paths to try, fastest first; always ends with [`TransportKind::Grpc`]
    /// (added when the file leaves it out) and holds no kind twice.
    pub prefer: Vec<TransportKind>,
    /// Bytes of the shared-memory pool registered with a same-host agent.
    pub shm_pool_bytes: u64,
    /// Smallest request (raw input bytes) sent through shared memory;
    /// smaller ones go inline.
    pub shm_min_bytes: usize,
    /// How long a path that failed for a peer is skipped before it is
    /// probed again.
    pub reprobe_after: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            prefer: vec![TransportKind::Shm, TransportKind::Rdma, TransportKind::Grpc],
            shm_pool_bytes: DEFAULT_SHM_POOL_BYTES,
            shm_min_bytes: DEFAULT_SHM_MIN_BYTES,
            reprobe_after: DEFAULT_REPROBE_AFTER,
        }
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            registry: DEFAULT_REGISTRY.into(),
            service: DEFAULT_SERVICE.into(),
            local_node: None,
            deadline: DEFAULT_DEADLINE,
            seed: None,
            retry: RetryConfig {
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                budget_ratio: DEFAULT_BUDGET_RATIO,
                budget_per_sec: DEFAULT_BUDGET_PER_SEC,
            },
            balancer: BalancerConfig::default(),
            transport: TransportConfig::default(),
            tls: None,
        }
    }
}

/// Every problem found in a client configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid client configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigError(pub Vec<String>);

impl RawClientConfig {
    /// Parses TOML text. Unknown fields and type errors are reported with
    /// their line.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(vec![e.to_string().trim_end().to_string()]))
    }
}

impl ClientConfig {
    /// Parses and checks TOML text (see `configs/client.toml`).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_raw(RawClientConfig::from_toml(text)?)
    }

    /// Checks `raw` and fills in defaults; lists every problem at once.
    pub fn from_raw(raw: RawClientConfig) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let d = ClientConfig::default();
        let registry = raw.registry.unwrap_or(d.registry);
        if let Err(e) = registry.parse::<RegistryUrl>() {
            problems.push(format!("registry: {e}"));
        }
        let service = raw.service.unwrap_or(d.service);
        if !valid_name(&service) {
            problems.push(format!(
                "service: '{service}' must be letters, digits, '-', '_' or '.'"
            ));
        }
        if let Some(n) = &raw.local_node {
            if n.is_empty() || n.contains('/') || n.chars().any(char::is_whitespace) {
                problems.push(format!(
                    "local_node: '{n}' must be non-empty, without '/' or spaces"
                ));
            }
        }
        let deadline = raw.deadline.unwrap_or(d.deadline);
        if deadline.is_zero() {
            problems.push("deadline: must be above zero".into());
        }
        let config = ClientConfig {
            registry,
            service,
            local_node: raw.local_node,
            deadline,
            seed: raw.seed,
            retry: retry_config(&raw.retry, d.retry, &mut problems),
            balancer: balancer_config(&raw.balancer, &mut problems),
            transport: transport_config(&raw.transport, &mut problems),
            tls: raw.tls.files().load().unwrap_or_else(|e| {
                problems.push(format!("tls: {e}"));
                None
            }),
        };
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(problems))
        }
    }

    /// Sets every option of `builder` from this config (file values, or the
    /// library defaults where the file had none), except the seed, which is
    /// set only when the file gives one, and the local node, which is kept
    /// when the file gives none. Call it first and override in code after.
    /// The `[transport]` section is not applied yet.
    pub fn apply(&self, builder: ClientBuilder) -> ClientBuilder {
        let mut builder = builder
            .registry(self.registry.clone())
            .service(self.service.clone())
            .deadline(self.deadline)
            .max_attempts(self.retry.max_attempts)
            .retry_budget(self.retry.budget_ratio, self.retry.budget_per_sec)
            .balancer(self.balancer.clone());
        if let Some(node) = &self.local_node {
            builder = builder.local_node(node.clone());
        }
        if let Some(seed) = self.seed {
            builder = builder.seed(seed);
        }
        let prefer = self
            .transport
            .prefer
            .iter()
            .map(|k| match k {
                TransportKind::Shm => infermesh_transport::Path::Shm,
                TransportKind::Rdma => infermesh_transport::Path::Rdma,
                TransportKind::Grpc => infermesh_transport::Path::Grpc,
                TransportKind::Quic => infermesh_transport::Path::Quic,
            })
            .collect();
        builder.transports(crate::PathsConfig {
            prefer,
            shm_pool_bytes: self.transport.shm_pool_bytes,
            shm_min_bytes: self.transport.shm_min_bytes,
            reprobe_after: self.transport.reprobe_after,
            tls: self.tls.clone(),
            ..Default::default()
        })
    }
}

fn retry_config(raw: &RawRetry, d: RetryConfig, problems: &mut Vec<String>) -> RetryConfig {
    let cfg = RetryConfig {
        max_attempts: raw.max_attempts.unwrap_or(d.max_attempts),
        budget_ratio: raw.budget_ratio.unwrap_or(d.budget_ratio),
        budget_per_sec: raw.budget_per_sec.unwrap_or(d.budget_per_sec),
    };
    if cfg.max_attempts == 0 {
        problems.push("retry.max_attempts: must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&cfg.budget_ratio) {
        problems.push(format!(
            "retry.budget_ratio: {} must be between 0 and 1",
            cfg.budget_ratio
        ));
    }
    if !(cfg.budget_per_sec.is_finite() && cfg.budget_per_sec >= 0.0) {
        problems.push(format!(
            "retry.budget_per_sec: {} must be a number of at least 0",
            cfg.budget_per_sec
        ));
    }
    cfg
}

fn balancer_config(raw: &RawBalancer, problems: &mut Vec<String>) -> BalancerConfig {
    let d = BalancerConfig::default();
    let cfg = BalancerConfig {
        local_node: None,
        local_bias: raw.local_bias.unwrap_or(d.local_bias),
        ewma_decay: raw.ewma_decay.unwrap_or(d.ewma_decay),
        default_rtt: raw.default_rtt.unwrap_or(d.default_rtt),
        eject_after: raw.eject_after.unwrap_or(d.eject_after),
        eject_base: raw.eject_base.unwrap_or(d.eject_base),
        eject_max: raw.eject_max.unwrap_or(d.eject_max),
        max_ejected_share: raw.max_ejected_share.unwrap_or(d.max_ejected_share),
        slow_start: raw.slow_start.unwrap_or(d.slow_start),
        load_report_ttl: raw.load_report_ttl.unwrap_or(d.load_report_ttl),
        attempt_timeout_factor: raw
            .attempt_timeout_factor
            .unwrap_or(d.attempt_timeout_factor),
        attempt_timeout_floor: raw.attempt_timeout_floor.unwrap_or(d.attempt_timeout_floor),
    };
    if !(cfg.attempt_timeout_factor.is_finite() && cfg.attempt_timeout_factor >= 1.0) {
        problems.push(format!(
            "balancer.attempt_timeout_factor: {} must be a number of at least 1",
            cfg.attempt_timeout_factor
        ));
    }
    if cfg.attempt_timeout_floor.is_zero() {
        problems.push("balancer.attempt_timeout_floor: must be above zero".into());
    }
    if !(cfg.local_bias.is_finite() && cfg.local_bias > 0.0) {
        problems.push(format!(
            "balancer.local_bias: {} must be a positive number",
            cfg.local_bias
        ));
    }
    if cfg.default_rtt.is_zero() {
        problems.push("balancer.default_rtt: must be above zero".into());
    }
    if cfg.eject_after == 0 {
        problems.push("balancer.eject_after: must be at least 1".into());
    }
    if cfg.eject_base.is_zero() {
        problems.push("balancer.eject_base: must be above zero".into());
    }
    if cfg.eject_max < cfg.eject_base {
        problems.push("balancer.eject_max: is below eject_base".into());
    }
    if !(0.0..=1.0).contains(&cfg.max_ejected_share) {
        problems.push(format!(
            "balancer.max_ejected_share: {} must be between 0 and 1",
            cfg.max_ejected_share
        ));
    }
    cfg
}

fn transport_config(raw: &RawTransport, problems: &mut Vec<String>) -> TransportConfig {
    let d = TransportConfig::default();
    let mut prefer = Vec::new();
    match &raw.prefer {
        None => prefer = d.prefer,
        Some(names) => {
            let known: Vec<&str> = TransportKind::ALL.iter().map(|k| k.name()).collect();
            for (i, name) in names.iter().enumerate() {
                match TransportKind::from_name(name) {
                    None => problems.push(format!(
                        "transport.prefer: '{name}' is not one of {}",
                        known.join(", ")
                    )),
                    Some(k) if prefer.contains(&k) => {
                        problems.push(format!("transport.prefer: '{name}' is listed twice"))
                    }
                    Some(TransportKind::Grpc) if i + 1 != names.len() => problems
                        .push("transport.prefer: 'grpc' is always the last path".to_string()),
                    Some(k) => prefer.push(k),
                }
            }
            if !prefer.contains(&TransportKind::Grpc) {
                prefer.push(TransportKind::Grpc);
            }
        }
    }
    let shm_pool_bytes = raw.shm_pool_bytes.unwrap_or(d.shm_pool_bytes);
    if shm_pool_bytes < MIN_SHM_POOL_BYTES {
        problems.push(format!(
            "transport.shm_pool_bytes: {shm_pool_bytes} is below 1 MiB"
        ));
    }
    let reprobe_after = raw.reprobe_after.unwrap_or(d.reprobe_after);
    if reprobe_after.is_zero() {
        problems.push("transport.reprobe_after: must be above zero".into());
    }
    TransportConfig {
        prefer,
        shm_pool_bytes,
        shm_min_bytes: raw.shm_min_bytes.unwrap_or(d.shm_min_bytes),
        reprobe_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_section_is_checked() {
        let text = ClientConfig::from_toml("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"")
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("tls: a TLS client certificate needs the CA"),
            "{text}"
        );
        let text = ClientConfig::from_toml("[tls]\nca = \"/nonexistent/ca.pem\"")
            .unwrap_err()
            .to_string();
        assert!(text.contains("cannot read /nonexistent/ca.pem"), "{text}");
    }

    #[test]
    fn example_file_holds_the_documented_defaults() {
        let cfg = ClientConfig::from_toml(include_str!("../../configs/client.toml")).unwrap();
        // The example writes out every default: it must agree with the library.
        assert_eq!(format!("{cfg:?}"), format!("{:?}", ClientConfig::default()));
        assert_eq!(cfg.registry, "static://127.0.0.1:8001");
        assert_eq!(cfg.service, "default");
        assert_eq!(cfg.deadline, Duration::from_secs(10));
        assert_eq!(cfg.retry.max_attempts, 3);
        assert_eq!(cfg.retry.budget_ratio, 0.2);
        assert_eq!(cfg.retry.budget_per_sec, 10.0);
        assert_eq!(cfg.balancer.local_bias, 1.5);
        assert_eq!(cfg.balancer.eject_after, 5);
        assert_eq!(cfg.balancer.eject_max, Duration::from_secs(60));
        assert_eq!(cfg.balancer.max_ejected_share, 0.5);
        assert_eq!(
            cfg.transport.prefer,
            [TransportKind::Shm, TransportKind::Rdma, TransportKind::Grpc]
        );
        assert_eq!(cfg.transport.shm_pool_bytes, 256 * 1024 * 1024);
        assert_eq!(cfg.transport.shm_min_bytes, 32 * 1024);
        assert_eq!(cfg.transport.reprobe_after, Duration::from_secs(30));
    }

    /// The README's table of client defaults names every key of the
    /// example file, and each stated value, read as that key, gives the
    /// library's default.
    #[test]
    fn readme_states_the_defaults() {
        let readme = include_str!("../../README.md");
        let table = readme
            .split("### Client defaults")
            .nth(1)
            .expect("README has a client defaults table");
        let mut stated = Vec::new();
        for line in table.lines().skip_while(|l| !l.starts_with("| `")) {
            let Some(row) = line.strip_prefix("| `") else {
                break;
            };
            let cells: Vec<&str> = row.split(" | ").collect();
            let key = cells[0].trim_end_matches('`');
            let value = cells[1].trim_matches('`');
            let toml = match key.split_once('.') {
                Some((section, field)) => format!("[{section}]\n{field} = {value}\n"),
                None => format!("{key} = {value}\n"),
            };
            let cfg = ClientConfig::from_toml(&toml)
                .unwrap_or_else(|e| panic!("README row '{key}': {e}"));
            assert_eq!(
                format!("{cfg:?}"),
                format!("{:?}", ClientConfig::default()),
                "README states {key} = {value}, the code's default differs"
            );
            stated.push(key.to_string());
        }
        let mut section = String::new();
        let mut keys = Vec::new();
        for line in include_str!("../../configs/client.toml").lines() {
            if let Some(name) = line.strip_prefix('[') {
                section = format!("{}.", name.trim_end_matches(']'));
            } else if let Some((key, _)) = line.split_once(" = ") {
                if !key.starts_with('#') {
                    keys.push(format!("{section}{key}"));
                }
            }
        }
        assert_eq!(
            stated, keys,
            "README table and configs/client.toml list the same keys"
        );
    }

    #[test]
    fn defaults_are_the_builders() {
        let applied = ClientConfig::default().apply(ClientBuilder::default().seed(7));
        let plain = ClientBuilder::default().seed(7);
        assert_eq!(format!("{applied:?}"), format!("{plain:?}"));
    }

    #[test]
    fn file_values_reach_the_builder() {
        let cfg = ClientConfig::from_toml(
            r#"
            registry = "zk://10.0.0.5:2181,10.0.0.6:2181/infermesh"
            service = "eta"
            local_node = "gpu-node-7"
            deadline = "2s"
            seed = 42
            [retry]
            max_attempts = 2
            budget_ratio = 0.1
            [balancer]
            local_bias = 2.0
            slow_start = "0s"
            [transport]
            prefer = ["rdma", "shm"]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.local_node.as_deref(), Some("gpu-node-7"));
        assert_eq!(cfg.retry.budget_per_sec, DEFAULT_BUDGET_PER_SEC);
        assert_eq!(
            cfg.transport.prefer,
            [TransportKind::Rdma, TransportKind::Shm, TransportKind::Grpc]
        );
        let built = format!("{:?}", cfg.apply(ClientBuilder::default()));
        for needle in [
            "zk://10.0.0.5:2181,10.0.0.6:2181/infermesh",
            "\"eta\"",
            "Some(\"gpu-node-7\")",
            "deadline: 2s",
            "max_attempts: 2",
            "budget: (0.1, 10.0)",
            "local_bias: 2.0",
            "slow_start: 0ns",
            "seed: 42",
        ] {
            assert!(built.contains(needle), "missing {needle} in {built}");
        }
    }

    #[test]
    fn a_file_without_local_node_keeps_the_builders() {
        let cfg = ClientConfig::from_toml("").unwrap();
        let built = format!(
            "{:?}",
            cfg.apply(ClientBuilder::default().local_node("here"))
        );
        assert!(built.contains("Some(\"here\")"), "{built}");
    }

    #[test]
    fn rejects_unknown_fields() {
        for text in ["deadlin = \"1s\"", "[balancer]\nlocal_bais = 2.0"] {
            let err = ClientConfig::from_toml(text).unwrap_err().to_string();
            assert!(err.contains("unknown field"), "{err}");
        }
    }

    #[test]
    fn reports_every_problem_at_once() {
        let err = ClientConfig::from_toml(
            r#"
            registry = "http://zk:2181"
            service = "a/b"
            local_node = "has space"
            deadline = "0s"
            [retry]
            max_attempts = 0
            budget_ratio = 1.5
            budget_per_sec = -1.0
            [balancer]
            local_bias = 0.0
            eject_after = 0
            eject_base = "10s"
            eject_max = "1s"
            max_ejected_share = 2.0
            [transport]
            prefer = ["grpc", "shm", "shm", "carrier-pigeon"]
            shm_pool_bytes = 1024
            reprobe_after = "0s"
            "#,
        )
        .unwrap_err();
        let text = err.to_string();
        for needle in [
            "registry:",
            "service:",
            "local_node:",
            "deadline:",
            "retry.max_attempts",
            "retry.budget_ratio",
            "retry.budget_per_sec",
            "balancer.local_bias",
            "balancer.eject_after",
            "balancer.eject_max",
            "balancer.max_ejected_share",
            "'grpc' is always the last",
            "'shm' is listed twice",
            "'carrier-pigeon' is not one of shm, rdma, quic, grpc",
            "transport.shm_pool_bytes",
            "transport.reprobe_after",
        ] {
            assert!(text.contains(needle), "missing '{needle}' in {text}");
        }
        assert_eq!(err.0.len(), 16, "{text}");
    }

    #[test]
    fn grpc_alone_turns_the_fast_paths_off() {
        let cfg = ClientConfig::from_toml("[transport]\nprefer = [\"grpc\"]").unwrap();
        assert_eq!(cfg.transport.prefer, [TransportKind::Grpc]);
        let cfg = ClientConfig::from_toml("[transport]\nprefer = []").unwrap();
        assert_eq!(cfg.transport.prefer, [TransportKind::Grpc]);
    }
}
