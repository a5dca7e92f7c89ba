//! What the two ends of a connection tell each other over the control path
//! (gRPC) to set up a reliable-connected queue pair.

use std::net::{Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::RdmaError;

/// One end of a queue pair, as carried over the control path.
///
/// Encoded as JSON with a `kind` tag:
///
/// ```json
/// {"kind":"verbs","gid":"fe80::ba59:9f03:c:d3e2","lid":0,"qpn":4711,"psn":123456,"mtu":4096}
/// {"kind":"emulated","addr":"127.0.0.1:40123","qpn":3}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EndpointInfo {
    /// A queue pair on a real verbs device.
    Verbs(QpInfo),
    /// A queue pair of the software emulation.
    Emulated(EmulatedQpInfo),
}

/// The addressing of a verbs RC queue pair: what the peer needs for the
/// INIT → RTR → RTS transitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QpInfo {
    /// Port GID (RoCE: derived from the IP address; InfiniBand: subnet prefix
    /// and port GUID).
    pub gid: Ipv6Addr,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number of this end's send queue (24 bits).
    pub psn: u32,
    /// Active path MTU of this end's port in bytes (256, 512, 1024, 2048 or
    /// 4096); the connection uses the smaller of the two.
    pub mtu: u32,
}

/// The addressing of an emulated queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatedQpInfo {
    /// The TCP address of the endpoint's responder (always loopback).
    pub addr: SocketAddr,
    /// Queue pair number, unique within the endpoint.
    pub qpn: u32,
}

impl EndpointInfo {
    /// `"verbs"` or `"emulated"`.
    pub fn kind(&self) -> &'static str {
        match self {
            EndpointInfo::Verbs(_) => "verbs",
            EndpointInfo::Emulated(_) => "emulated",
        }
    }

    /// The queue pair number: the agent's QPN is what a client quotes in its
    /// requests so the agent finds the connection
    /// ([`RdmaEngine::connection`](crate::RdmaEngine::connection)).
    pub fn qpn(&self) -> u32 {
        match self {
            EndpointInfo::Verbs(info) => info.qpn,
            EndpointInfo::Emulated(info) => info.qpn,
        }
    }

    /// The JSON form carried over the control path.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("EndpointInfo always serializes")
    }

    /// Parses and validates [`encode`](Self::encode)'s form.
    pub fn decode(s: &str) -> Result<Self, RdmaError> {
        let info: EndpointInfo =
            serde_json::from_str(s).map_err(|e| RdmaError::InvalidEndpoint(e.to_string()))?;
        info.validate()?;
        Ok(info)
    }

    fn validate(&self) -> Result<(), RdmaError> {
        let bad = |msg: String| Err(RdmaError::InvalidEndpoint(msg));
        match self {
            EndpointInfo::Verbs(qp) => {
                if qp.qpn == 0 || qp.qpn > 0xff_ffff {
                    return bad(format!("qpn {} is not a 24-bit QP number above 0", qp.qpn));
                }
                if qp.psn > 0xff_ffff {
                    return bad(format!("psn {} exceeds 24 bits", qp.psn));
                }
                if ![256, 512, 1024, 2048, 4096].contains(&qp.mtu) {
                    return bad(format!("mtu {} is not an IB MTU", qp.mtu));
                }
                if qp.gid.is_unspecified() && qp.lid == 0 {
                    return bad("neither gid nor lid is set".into());
                }
            }
            EndpointInfo::Emulated(em) => {
                if !em.addr.ip().is_loopback() {
                    return bad(format!("emulated endpoint {} is not on loopback", em.addr));
                }
                if em.addr.port() == 0 {
                    return bad("emulated endpoint has port 0".into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verbs() -> EndpointInfo {
        EndpointInfo::Verbs(QpInfo {
            gid: "fe80::ba59:9f03:c:d3e2".parse().unwrap(),
            lid: 0,
            qpn: 4711,
            psn: 0x12_3456,
            mtu: 4096,
        })
    }

    #[test]
    fn round_trips_both_kinds() {
        let emulated = EndpointInfo::Emulated(EmulatedQpInfo {
            addr: "127.0.0.1:40123".parse().unwrap(),
            qpn: 3,
        });
        for info in [verbs(), emulated] {
            let s = info.encode();
            assert_eq!(EndpointInfo::decode(&s).unwrap(), info, "{s}");
        }
        assert_eq!(
            verbs().encode(),
            r#"{"kind":"verbs","gid":"fe80::ba59:9f03:c:d3e2","lid":0,"qpn":4711,"psn":1193046,"mtu":4096}"#
        );
    }

    #[test]
    fn rejects_bad_info() {
        for bad in [
            "",
            "{}",
            r#"{"kind":"ib","qpn":1}"#,
            r#"{"kind":"verbs","gid":"::","lid":0,"qpn":1,"psn":1,"mtu":1024}"#,
            r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":16777216,"psn":1,"mtu":1024}"#,
            r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":0,"psn":1,"mtu":1024}"#,
            r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":1,"psn":16777216,"mtu":1024}"#,
            r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":1,"psn":1,"mtu":1500}"#,
            r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":1,"psn":1,"mtu":1024,"extra":1}"#,
            r#"{"kind":"emulated","addr":"10.0.0.1:80","qpn":1}"#,
            r#"{"kind":"emulated","addr":"127.0.0.1:0","qpn":1}"#,
            r#"{"kind":"emulated","addr":"127.0.0.1:80"}"#,
        ] {
            assert!(
                matches!(
                    EndpointInfo::decode(bad),
                    Err(RdmaError::InvalidEndpoint(_))
                ),
                "{bad} was accepted"
            );
        }
    }
}
