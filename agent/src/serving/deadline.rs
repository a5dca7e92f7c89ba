//! The caller's deadline, from gRPC's `grpc-timeout` header.

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (`H`, `M`, `S`,
/// `m`, `u`, `n`). `None` for a malformed value, which gRPC says to treat as
/// no deadline.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The timeout the caller set on this request, if any.
pub fn request_timeout(metadata: &MetadataMap) -> Option<Duration> {
    parse_grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)
}

/// [`request_timeout`] from the HTTP headers.
pub fn header_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    // A name made once: looking a `&str` up parses and checks it first, on
    // every request.
    const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
    parse_grpc_timeout(headers.get(GRPC_TIMEOUT)?.to_str().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_garbage() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789m"), None);
    }
}
