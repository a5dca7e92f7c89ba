//! Header fields HTTP/2 treats specially.

/// Headers that HTTP/2 forbids (RFC 9113 8.2.2).
pub fn connection_specific(name: &str) -> bool {
    connection_specific_bytes(name.as_bytes())
}

/// [`connection_specific`], of a name as received.
pub fn connection_specific_bytes(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
    )
}

/// Headers of a caller's request that do not travel to the worker: the
/// hop-by-hop ones, and `te` and `grpc-timeout`, which the agent sets.
pub fn hop_only(name: &str) -> bool {
    matches!(
        name,
        "te" | "grpc-timeout"
            | "content-length"
            | "host"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
    )
}
