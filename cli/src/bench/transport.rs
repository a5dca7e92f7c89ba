//! `bench --transport`: the path requests are to take, and the checks that
//! the target offers it, so that a benchmark never measures another path
//! than the one asked for without saying so (issue 27).
//!
//! Before any load, the target must offer the path: QUIC and RDMA are
//! advertised in a node's registry record (so they need `--registry`;
//! QUIC also `--tls-ca`, being TLS only), and shared memory needs the
//! caller on the target's host. Then one request is sent and must come back
//! over that path: the client's ladder falls back to gRPC silently when a
//! path breaks (a region the agent cannot open, a refused QUIC handshake),
//! which is right for callers and wrong for a benchmark. Either failure
//! exits 69 with what is missing; the report counts the requests each path
//! carried.

use infermesh_client::PathsConfig;
use infermesh_proto::registry::NodeRecord;
use infermesh_rdma::RdmaEngine;
use infermesh_transport::Path;

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    Shm,
    Rdma,
    Quic,
    Grpc,
    Auto,
}

impl TransportArg {
    /// The path every request must take; `None` for `auto`.
    pub fn path(self) -> Option<Path> {
        match self {
            TransportArg::Shm => Some(Path::Shm),
            TransportArg::Rdma => Some(Path::Rdma),
            TransportArg::Quic => Some(Path::Quic),
            TransportArg::Grpc => Some(Path::Grpc),
            TransportArg::Auto => None,
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self.path() {
            Some(p) => p.as_str(),
            None => "auto",
        }
    }

    /// The client's transports: this path, gRPC below it.
    pub fn paths(self, rdma: Option<RdmaEngine>) -> PathsConfig {
        let Some(path) = self.path() else {
            return PathsConfig::default();
        };
        let prefer = if path == Path::Grpc {
            vec![Path::Grpc]
        } else {
            vec![path, Path::Grpc]
        };
        PathsConfig {
            prefer,
            // Chosen explicitly: every request takes it, however small.
            shm_min_bytes: 0,
            rdma,
            ..Default::default()
        }
    }
}

/// Whether `--target ADDR` can carry `transport`: shared memory only to an
/// agent on this host (the address is one of this host's); QUIC and RDMA
/// only through `--registry`, where nodes advertise them.
pub fn check_target(transport: TransportArg, target: &str) -> Result<(), String> {
    match transport {
        TransportArg::Shm if !is_this_host(target) => Err(format!(
            "--transport shm: {target} is not an address of this host; shared memory works \
             only with an agent on the caller's host"
        )),
        TransportArg::Quic => Err(
            "--transport quic needs --registry and --tls-ca: a node's QUIC \
             endpoint is advertised in its registry record, and QUIC is TLS only"
                .into(),
        ),
        TransportArg::Rdma => Err("--transport rdma needs --registry: a node's RDMA endpoint \
             is advertised in its registry record"
            .into()),
        _ => Ok(()),
    }
}

/// Whether the nodes of `service` (`nodes`, as the registry has them) offer
/// `transport`; for RDMA, the engine to reach them with (a verbs device on
/// this host, or the emulation the nodes advertise).
pub async fn check_nodes(
    transport: TransportArg,
    service: &str,
    nodes: &[NodeRecord],
    local_node: Option<&str>,
    tls: bool,
) -> Result<Option<RdmaEngine>, String> {
    let names = || {
        nodes
            .iter()
            .map(|n| n.node_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match transport {
        TransportArg::Quic => {
            if !tls {
                return Err("--transport quic needs --tls-ca: QUIC is TLS only".into());
            }
            if !nodes.iter().any(|n| n.endpoints.quic.is_some()) {
                return Err(format!(
                    "--transport quic: no node of service '{service}' advertises QUIC (nodes: \
                     {}); an agent offers it with [transport] quic = \"on\" and [tls]",
                    names()
                ));
            }
            Ok(None)
        }
        TransportArg::Rdma => {
            let kinds: Vec<&str> = nodes
                .iter()
                .filter_map(|n| n.endpoints.rdma.as_deref())
                .collect();
            if kinds.is_empty() {
                return Err(format!(
                    "--transport rdma: no node of service '{service}' advertises RDMA (nodes: \
                     {}); an agent offers it with a verbs device, or [transport] rdma = \
                     \"emulated\"",
                    names()
                ));
            }
            if kinds.contains(&"emulated") {
                return RdmaEngine::emulated()
                    .await
                    .map(Some)
                    .map_err(|e| format!("--transport rdma: cannot start the emulation: {e}"));
            }
            RdmaEngine::probe().map(Some).ok_or_else(|| {
                "--transport rdma: this host has no RDMA (verbs) device to reach the nodes with"
                    .to_string()
            })
        }
        TransportArg::Shm => {
            let Some(local) = local_node else {
                return Err("--transport shm needs --local-node: the node on this host".into());
            };
            let Some(record) = nodes.iter().find(|n| n.node_id == local) else {
                return Err(format!(
                    "--transport shm: no node '{local}' in service '{service}' (nodes: {})",
                    names()
                ));
            };
            let here = hostname();
            match (record.host.as_str(), here.as_deref()) {
                (there, Some(here)) if !there.is_empty() && there != here => Err(format!(
                    "--transport shm: node '{local}' runs on host '{there}', this is '{here}'; \
                     shared memory works only with an agent on the caller's host"
                )),
                _ => Ok(None),
            }
        }
        TransportArg::Grpc | TransportArg::Auto => Ok(None),
    }
}

/// What the first request's path says: `Ok` when it took the path asked
/// for (any path for `auto`).
pub fn check_carried(transport: TransportArg, carried: Option<Path>) -> Result<(), String> {
    match (transport.path(), carried) {
        (None, _) => Ok(()),
        (Some(want), Some(got)) if want == got => Ok(()),
        (Some(want), got) => Err(format!(
            "--transport {want}: the first request went over {} instead: the target does not \
             take requests over {want}{}",
            got.map_or("an unknown path".to_string(), |p| p.to_string()),
            match want {
                Path::Shm =>
                    " (the agent cannot open this host's shared-memory regions: not on \
                              this host, or another /dev/shm)",
                _ => "",
            }
        )),
    }
}

/// This host's name, as agents advertise it in their records.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
}

/// Whether `target` (`host:port`) names this host: every address it
/// resolves to is one this host can bind.
fn is_this_host(target: &str) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(addrs) = target.to_socket_addrs() else {
        return false;
    };
    let addrs: Vec<_> = addrs.collect();
    !addrs.is_empty()
        && addrs
            .iter()
            .all(|a| std::net::UdpSocket::bind((a.ip(), 0)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_this_host_and_a_documentation_address_is_not() {
        assert!(is_this_host("127.0.0.1:8001"));
        assert!(!is_this_host("192.0.2.1:8001"));
        assert!(check_target(TransportArg::Shm, "192.0.2.1:8001").is_err());
        assert!(check_target(TransportArg::Quic, "127.0.0.1:8001").is_err());
        assert!(check_target(TransportArg::Grpc, "192.0.2.1:8001").is_ok());
    }

    #[test]
    fn the_first_request_must_take_the_path_asked_for() {
        assert!(check_carried(TransportArg::Shm, Some(Path::Shm)).is_ok());
        let e = check_carried(TransportArg::Shm, Some(Path::Grpc)).unwrap_err();
        assert!(e.contains("went over grpc"), "{e}");
        assert!(check_carried(TransportArg::Auto, Some(Path::Grpc)).is_ok());
    }

    #[tokio::test]
    async fn nodes_must_advertise_quic_and_rdma() {
        let node = NodeRecord {
            schema: infermesh_proto::registry::SCHEMA,
            node_id: "a".into(),
            zone: String::new(),
            host: String::new(),
            version: String::new(),
            state: infermesh_proto::registry::NodeState::Serving,
            weight: 1.0,
            capacity: Default::default(),
            endpoints: Default::default(),
            models: vec![],
            updated_ms: 1,
        };
        let e = check_nodes(
            TransportArg::Quic,
            "s",
            std::slice::from_ref(&node),
            None,
            true,
        )
        .await
        .unwrap_err();
        assert!(e.contains("no node of service 's' advertises QUIC"), "{e}");
        let e = check_nodes(
            TransportArg::Rdma,
            "s",
            std::slice::from_ref(&node),
            None,
            false,
        )
        .await
        .unwrap_err();
        assert!(e.contains("advertises RDMA"), "{e}");
        let e = check_nodes(
            TransportArg::Shm,
            "s",
            std::slice::from_ref(&node),
            None,
            false,
        )
        .await
        .unwrap_err();
        assert!(e.contains("--local-node"), "{e}");
    }
}
