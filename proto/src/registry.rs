//! What the registry holds: one [`NodeRecord`] per agent, as JSON in an
//! ephemeral ZooKeeper node at
//! `/infermesh/v1/services/<service>/nodes/<node-id>` (relative to the
//! registry URL's chroot), and the [`RegistryUrl`] that names a registry.
//!
//! Records come from the network and are never trusted to parse:
//! [`NodeRecord::from_json`] bounds the input ([`MAX_RECORD_BYTES`],
//! [`MAX_MODELS`]) and validates every field, and readers skip (and log)
//! records that fail.
//!
//! # Compatibility rule
//!
//! `schema` is the record's major version. Within one major version writers
//! only *add* optional fields, and readers ignore fields they do not know, so
//! agents and clients of one major version upgrade in any order. Anything
//! else — a field removed, renamed or re-typed, a new `state`, a changed
//! meaning — is a new major version. A reader skips a record of a major
//! version it does not know ([`RecordError::Schema`]; the client logs it once
//! per node) rather than guess at fields whose meaning changed: during a
//! rolling upgrade to a new major, upgrade clients first.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Schema (major) version written in every record; readers accept this one,
/// with unknown fields ignored (see the module's compatibility rule).
pub const SCHEMA: u32 = 1;

/// Largest record a reader parses, in bytes.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Most models one record may list.
pub const MAX_MODELS: usize = 1024;

/// Root of all infermesh data in a registry.
pub const ROOT: &str = "/infermesh/v1/services";

/// Path of a service's node directory.
pub fn nodes_path(service: &str) -> String {
    format!("{ROOT}/{service}/nodes")
}

/// Path of one node's record.
pub fn node_path(service: &str, node_id: &str) -> String {
    format!("{}/{node_id}", nodes_path(service))
}

/// Whether `name` is usable as a service or node id (one path segment).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A node's state as advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Takes new requests.
    Serving,
    /// Finishing in-flight requests; takes no new ones.
    Draining,
    /// Serving with reduced capacity (e.g. a quarantined GPU).
    Degraded,
}

/// Where a node can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Endpoints {
    /// OIP gRPC address.
    pub grpc: String,
    /// Admin address.
    pub admin: String,
    /// The gRPC and admin endpoints (and KServe HTTP) serve TLS only
    /// (issue 13): connect with TLS, verifying the certificate against the
    /// address's IP or the record's `host`. Absent (false) in records of
    /// agents without TLS and of older agents.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// QUIC endpoint, when advertised (transport issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<String>,
    /// RDMA endpoint, when advertised (transport issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<String>,
    /// Local shared-memory socket path, when advertised (transport issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<String>,
}

/// GPU capacity behind a node's weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Capacity {
    /// GPU model name (e.g. "NVIDIA H100 80GB HBM3"), empty when unknown.
    #[serde(default)]
    pub gpu_model: String,
    /// GPUs on the node.
    #[serde(default)]
    pub gpu_count: u32,
    /// Configured capacity score.
    pub score: f64,
}

/// A model and whether the node has a ready worker for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// A worker hosting it is routable.
    pub ready: bool,
}

/// One agent's advertisement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Always [`SCHEMA`].
    pub schema: u32,
    /// Node id (the znode name).
    pub node_id: String,
    /// Zone (rack, availability zone) for placement decisions.
    #[serde(default)]
    pub zone: String,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// Agent version.
    #[serde(default)]
    pub version: String,
    /// State.
    pub state: NodeState,
    /// Weight clients balance by: capacity score × share of workers ready.
    pub weight: f64,
    /// Capacity.
    pub capacity: Capacity,
    /// Endpoints.
    pub endpoints: Endpoints,
    /// Models.
    #[serde(default)]
    pub models: Vec<ModelEntry>,
    /// When this record was written, milliseconds since the Unix epoch.
    pub updated_ms: u64,
}

/// Why a record was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON of the record's shape.
    #[error("not a node record: {0}")]
    Malformed(String),
    /// A schema (major version) this reader does not know.
    #[error("schema {0} is not supported (this reader knows schema {SCHEMA})")]
    Schema(u32),
    /// A field with an impossible value.
    #[error("invalid {field}: {why}")]
    Invalid {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
}

impl NodeRecord {
    /// Serializes the record.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }

    /// Parses and validates a record read from the registry; `expected_id`
    /// is the znode name it was found under.
    pub fn from_json(bytes: &[u8], expected_id: &str) -> Result<Self, RecordError> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(RecordError::Malformed(format!(
                "{} bytes is over the {MAX_RECORD_BYTES}-byte cap",
                bytes.len()
            )));
        }
        let record: NodeRecord = match serde_json::from_slice(bytes) {
            Ok(r) => r,
            Err(e) => {
                // A record of another major version may not parse as this
                // one: say which schema it is rather than "malformed".
                #[derive(Deserialize)]
                struct Schema {
                    schema: u32,
                }
                return Err(match serde_json::from_slice::<Schema>(bytes) {
                    Ok(Schema { schema }) if schema != SCHEMA => RecordError::Schema(schema),
                    _ => RecordError::Malformed(e.to_string()),
                });
            }
        };
        record.validate(expected_id)?;
        Ok(record)
    }

    fn validate(&self, expected_id: &str) -> Result<(), RecordError> {
        let invalid = |field, why: String| Err(RecordError::Invalid { field, why });
        if self.schema != SCHEMA {
            return Err(RecordError::Schema(self.schema));
        }
        if self.node_id != expected_id || !valid_name(&self.node_id) {
            return invalid(
                "node_id",
                format!("'{}' under znode '{expected_id}'", self.node_id),
            );
        }
        if self.models.len() > MAX_MODELS {
            return invalid(
                "models",
                format!("{} entries (at most {MAX_MODELS})", self.models.len()),
            );
        }
        if !(self.weight.is_finite() && self.weight >= 0.0) {
            return invalid("weight", self.weight.to_string());
        }
        if !(self.capacity.score.is_finite() && self.capacity.score >= 0.0) {
            return invalid("capacity.score", self.capacity.score.to_string());
        }
        if self.endpoints.grpc.parse::<SocketAddr>().is_err() {
            return invalid(
                "endpoints.grpc",
                format!("'{}' is not host:port", self.endpoints.grpc),
            );
        }
        Ok(())
    }

    /// The OIP address (validated on read).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.endpoints.grpc.parse().expect("validated when read")
    }
}

/// A registry: ZooKeeper, or a fixed list of agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryUrl {
    /// `zk://host:port[,host:port...][/chroot]`.
    ZooKeeper {
        /// `host:port` list.
        hosts: Vec<String>,
        /// Chroot, `""` for none.
        chroot: String,
    },
    /// `static://host:port[,host:port...]`: the embedded default for one
    /// machine and tests. Node ids are the addresses.
    Static(Vec<SocketAddr>),
}

/// A malformed registry URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "registry URL '{url}': {why} (expected zk://host:port[,host:port...][/chroot] or static://host:port[,...])"
)]
pub struct RegistryUrlError {
    url: String,
    why: String,
}

impl std::str::FromStr for RegistryUrl {
    type Err = RegistryUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| RegistryUrlError {
            url: url.to_string(),
            why: why.to_string(),
        };
        if let Some(rest) = url.strip_prefix("zk://") {
            let (hosts, chroot) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
                None => (rest, ""),
            };
            let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
            let host_ok = |h: &String| {
                h.rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
            };
            if hosts.is_empty() || !hosts.iter().all(host_ok) {
                return Err(err("every host needs host:port"));
            }
            if chroot.split('/').skip(1).any(|seg| !valid_name(seg)) {
                return Err(err(
                    "chroot segments must be letters, digits, '-', '_' or '.'",
                ));
            }
            Ok(RegistryUrl::ZooKeeper {
                hosts,
                chroot: chroot.to_string(),
            })
        } else if let Some(rest) = url.strip_prefix("static://") {
            let addrs: Result<Vec<SocketAddr>, _> = rest.split(',').map(str::parse).collect();
            match addrs {
                Ok(a) if !a.is_empty() => Ok(RegistryUrl::Static(a)),
                _ => Err(err("every entry must be ip:port")),
            }
        } else {
            Err(err("unknown scheme"))
        }
    }
}

impl RegistryUrl {
    /// The ZooKeeper connect string (`host:port,...[/chroot]`).
    pub fn zk_connect_string(&self) -> Option<String> {
        match self {
            RegistryUrl::ZooKeeper { hosts, chroot } => {
                Some(format!("{}{chroot}", hosts.join(",")))
            }
            RegistryUrl::Static(_) => None,
        }
    }
}

/// Default ZooKeeper session timeout.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(4);

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> NodeRecord {
        NodeRecord {
            schema: SCHEMA,
            node_id: "gpu-1".into(),
            zone: "a".into(),
            host: "h".into(),
            version: "0.1.0".into(),
            state: NodeState::Serving,
            weight: 2.0,
            capacity: Capacity {
                gpu_model: "H100".into(),
                gpu_count: 8,
                score: 4.0,
            },
            endpoints: Endpoints {
                grpc: "127.0.0.1:8001".into(),
                admin: "127.0.0.1:8002".into(),
                ..Default::default()
            },
            models: vec![ModelEntry {
                name: "dense".into(),
                ready: true,
            }],
            updated_ms: 1,
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let r = record();
        assert_eq!(NodeRecord::from_json(&r.to_json(), "gpu-1"), Ok(r.clone()));
        assert!(matches!(
            NodeRecord::from_json(&r.to_json(), "other"),
            Err(RecordError::Invalid {
                field: "node_id",
                ..
            })
        ));
        assert!(matches!(
            NodeRecord::from_json(b"{nope", "gpu-1"),
            Err(RecordError::Malformed(_))
        ));
        let mut bad = r.clone();
        bad.schema = 2;
        assert_eq!(
            NodeRecord::from_json(&bad.to_json(), "gpu-1"),
            Err(RecordError::Schema(2))
        );
        let mut bad = r.clone();
        bad.weight = -1.0;
        assert!(NodeRecord::from_json(&bad.to_json(), "gpu-1").is_err());
        let mut bad = r;
        bad.endpoints.grpc = "nowhere".into();
        assert!(NodeRecord::from_json(&bad.to_json(), "gpu-1").is_err());
    }

    #[test]
    fn unknown_fields_are_ignored_within_the_schema() {
        // A newer agent of the same major version added fields at every level.
        let mut value: serde_json::Value = serde_json::from_slice(&record().to_json()).unwrap();
        value["placement"] = serde_json::json!({"rack": "r7"});
        value["capacity"]["hbm_gib"] = serde_json::json!(80);
        value["endpoints"]["quic2"] = serde_json::json!("127.0.0.1:9");
        value["models"][0]["max_batch"] = serde_json::json!(64);
        let bytes = serde_json::to_vec(&value).unwrap();
        assert_eq!(NodeRecord::from_json(&bytes, "gpu-1"), Ok(record()));
    }

    #[test]
    fn the_tls_flag_is_additive() {
        let plain = record();
        let json = String::from_utf8(plain.to_json()).unwrap();
        assert!(!json.contains("\"tls\""), "left out when false: {json}");
        assert!(
            !NodeRecord::from_json(json.as_bytes(), "gpu-1")
                .unwrap()
                .endpoints
                .tls
        );
        let mut tls = record();
        tls.endpoints.tls = true;
        let json = tls.to_json();
        assert!(NodeRecord::from_json(&json, "gpu-1").unwrap().endpoints.tls);
        let bad = String::from_utf8(json)
            .unwrap()
            .replace("\"tls\":true", "\"tls\":\"yes\"");
        assert!(NodeRecord::from_json(bad.as_bytes(), "gpu-1").is_err());
    }

    #[test]
    fn other_major_versions_are_refused_as_such() {
        // A schema-2 record whose fields no longer fit schema 1.
        let v2 = br#"{"schema":2,"node_id":"gpu-1","state":{"phase":"up"},"endpoints":["x"]}"#;
        assert_eq!(
            NodeRecord::from_json(v2, "gpu-1"),
            Err(RecordError::Schema(2))
        );
        let mut v0 = record();
        v0.schema = 0;
        assert_eq!(
            NodeRecord::from_json(&v0.to_json(), "gpu-1"),
            Err(RecordError::Schema(0))
        );
    }

    #[test]
    fn input_is_bounded() {
        let mut big = record();
        big.host = "h".repeat(MAX_RECORD_BYTES);
        assert!(matches!(
            NodeRecord::from_json(&big.to_json(), "gpu-1"),
            Err(RecordError::Malformed(_))
        ));
        let mut many = record();
        many.models = (0..=MAX_MODELS)
            .map(|i| ModelEntry {
                name: format!("m{i}"),
                ready: true,
            })
            .collect();
        assert!(matches!(
            NodeRecord::from_json(&many.to_json(), "gpu-1"),
            Err(RecordError::Invalid {
                field: "models",
                ..
            })
        ));
    }

    #[test]
    fn parses_registry_urls() {
        assert_eq!(
            "zk://10.0.0.1:2181,10.0.0.2:2181/infermesh".parse(),
            Ok(RegistryUrl::ZooKeeper {
                hosts: vec!["10.0.0.1:2181".into(), "10.0.0.2:2181".into()],
                chroot: "/infermesh".into()
            })
        );
        let zk: RegistryUrl = "zk://127.0.0.1:2181".parse().unwrap();
        assert_eq!(zk.zk_connect_string().unwrap(), "127.0.0.1:2181");
        assert_eq!(
            "static://127.0.0.1:8001,127.0.0.1:9001"
                .parse::<RegistryUrl>()
                .unwrap(),
            RegistryUrl::Static(vec![
                "127.0.0.1:8001".parse().unwrap(),
                "127.0.0.1:9001".parse().unwrap()
            ])
        );
        for bad in [
            "http://x",
            "zk://",
            "zk://host",
            "zk://h:99999",
            "static://",
            "static://nope",
            "zk://h:1/a/../b",
        ] {
            assert!(bad.parse::<RegistryUrl>().is_err(), "{bad}");
        }
    }
}
