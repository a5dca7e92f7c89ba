//! The header block of a gRPC request a client connection sends.

use std::time::Duration;

use http::HeaderMap;

use crate::fields::hop_only;
use crate::hpack::encode::{put_field, put_indexed, put_literal, put_literal_indexed_name};

/// What a request to a worker carries besides its path and body.
#[derive(Debug, Clone, Copy)]
pub struct Metadata<'a> {
    /// The caller's headers (lower-case names, as `http` keeps them); the
    /// [`hop_only`] ones are left out.
    pub caller: &'a HeaderMap,
    /// What is left of the caller's deadline, sent as `grpc-timeout`.
    pub timeout: Option<Duration>,
    /// Headers the agent adds (the trace context, when tracing); they
    /// replace the caller's headers of the same names.
    pub extra: Option<&'a HeaderMap>,
}

impl<'a> From<&'a HeaderMap> for Metadata<'a> {
    fn from(caller: &'a HeaderMap) -> Self {
        Self {
            caller,
            timeout: None,
            extra: None,
        }
    }
}

/// Appends the header block of a gRPC POST to `path` at `authority`
/// carrying `meta`, encoded straight from the caller's map: no map is built
/// per request.
pub fn put_request_block(out: &mut Vec<u8>, authority: &[u8], path: &[u8], meta: Metadata<'_>) {
    put_indexed(out, 3); // :method POST
    put_indexed(out, 6); // :scheme http
    put_literal_indexed_name(out, 4, path, false);
    put_literal_indexed_name(out, 1, authority, false);
    let put_map = |out: &mut Vec<u8>, map: &HeaderMap, skip: &dyn Fn(&str) -> bool| {
        for (name, value) in map {
            if !skip(name.as_str()) {
                put_field(out, name, value);
            }
        }
    };
    // What the agent adds replaces the caller's header of that name (the
    // caller's `traceparent` names the caller's span, not the agent's).
    match meta.extra {
        None => put_map(out, meta.caller, &hop_only),
        Some(extra) => put_map(out, meta.caller, &|name: &str| {
            hop_only(name) || extra.contains_key(name)
        }),
    }
    put_literal(out, b"te", b"trailers", false);
    if let Some(left) = meta.timeout {
        // gRPC allows at most 8 digits. Different on every request: never
        // indexed, so that it does not churn the worker's HPACK table.
        let micros = left.as_micros().min(99_999_999) as u64;
        let mut n = itoa::Buffer::new();
        let digits = n.format(micros).as_bytes();
        let mut text = [b'u'; 9];
        text[..digits.len()].copy_from_slice(digits);
        put_literal(out, b"grpc-timeout", &text[..digits.len() + 1], true);
    }
    if let Some(extra) = meta.extra {
        put_map(out, extra, &|_| false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hpack::encode::put_literal;
    use http::HeaderValue;

    #[test]
    fn a_request_block_decodes_to_what_was_encoded() {
        // The caller's map: its own deadline, `te` and the hop-by-hop
        // headers are replaced or left out; the rest goes as it came.
        let mut caller = HeaderMap::new();
        caller.insert("content-type", HeaderValue::from_static("application/grpc"));
        caller.insert("te", HeaderValue::from_static("trailers"));
        caller.insert("grpc-timeout", HeaderValue::from_static("5S"));
        caller.insert("host", HeaderValue::from_static("agent"));
        caller.insert("traceparent", HeaderValue::from_static("00-caller-span-01"));
        let long = "x".repeat(300);
        caller.insert("x-long", HeaderValue::from_str(&long).unwrap());
        let mut extra = HeaderMap::new();
        extra.insert("traceparent", HeaderValue::from_static("00-abc-def-01"));
        let meta = Metadata {
            caller: &caller,
            timeout: Some(Duration::from_micros(1234)),
            extra: Some(&extra),
        };
        let mut out = Vec::new();
        put_request_block(
            &mut out,
            b"127.0.0.1:8001",
            b"/inference.GRPCInferenceService/ModelInfer",
            meta,
        );
        let mut decoder = loona_hpack::Decoder::new();
        let fields: Vec<(String, String)> = decoder
            .decode(&out)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        let want = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", "127.0.0.1:8001"),
            ("content-type", "application/grpc"),
            ("x-long", long.as_str()),
            ("te", "trailers"),
            ("grpc-timeout", "1234u"),
            ("traceparent", "00-abc-def-01"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(fields, want);
        // Nothing was added to the decoder's dynamic table: a second block
        // decodes alone.
        let mut again = loona_hpack::Decoder::new();
        assert_eq!(again.decode(&out).unwrap().len(), want.len());
    }

    #[test]
    fn the_deadline_left_is_capped_at_eight_digits_and_never_indexed() {
        let caller = HeaderMap::new();
        let meta = Metadata {
            caller: &caller,
            timeout: Some(Duration::from_secs(1_000_000)),
            extra: None,
        };
        let mut out = Vec::new();
        put_request_block(&mut out, b"a", b"/p", meta);
        let mut marker = Vec::new();
        put_literal(&mut marker, b"grpc-timeout", b"99999999u", true);
        assert!(out.ends_with(&marker), "a never-indexed literal at the end");
    }
}
