//! The paths a tensor can take to a peer.

use std::fmt;
use std::str::FromStr;

/// A way to move tensors to a peer, ordered best first: `Shm < Rdma < Quic < Grpc`
/// in `Ord`, so sorting a list puts the preferred path first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Path {
    /// Same-host shared memory: tensors referenced by region, offset, size.
    Shm,
    /// One-sided RDMA into registered memory.
    Rdma,
    /// A QUIC stream per request (TLS 1.3, the agent's certificate).
    Quic,
    /// Tensors inline in the gRPC message; always works.
    Grpc,
}

impl Path {
    /// Every path, best first.
    pub const ALL: [Path; 4] = [Path::Shm, Path::Rdma, Path::Quic, Path::Grpc];

    /// The name used in configs, metrics and node records.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Shm => "shm",
            Path::Rdma => "rdma",
            Path::Quic => "quic",
            Path::Grpc => "grpc",
        }
    }

    /// Position in [`Path::ALL`], for per-path arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`Path`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport path '{0}' (expected shm, rdma, quic or grpc)")]
pub struct UnknownPath(pub String);

impl FromStr for Path {
    type Err = UnknownPath;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Path::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPath(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_is_best_first() {
        for p in Path::ALL {
            assert_eq!(p.to_string().parse::<Path>(), Ok(p));
        }
        assert!("tcp".parse::<Path>().is_err());
        let mut v = vec![Path::Grpc, Path::Quic, Path::Shm, Path::Rdma];
        v.sort();
        assert_eq!(v, Path::ALL);
    }
}
