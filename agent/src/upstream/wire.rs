//! HTTP/2 frames and the HPACK encoding the agent writes towards a worker
//! (RFC 9113, RFC 7541). Pure functions over byte buffers.
//!
//! Header blocks are encoded with the static table and literals only: no
//! dynamic table, so nothing is looked up or inserted per header and the
//! worker's decoder state never depends on earlier requests. Values marked
//! sensitive are sent as never-indexed literals, as `h2` does.

use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Streams by id, hashed cheaply: ids are small integers chosen by the
/// peer, and a stream table is bounded by the connection's stream limit.
pub type StreamMap<V> =
    std::collections::HashMap<u32, V, std::hash::BuildHasherDefault<StreamIdHasher>>;

/// Fibonacci hashing of a stream id (see [`StreamMap`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamIdHasher(u64);

impl std::hash::Hasher for StreamIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The path of `ModelInfer`, the one method sent on these connections.
pub const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";
/// Length of a frame header.
pub const HEADER_LEN: usize = 9;
/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest frame payload before SETTINGS_MAX_FRAME_SIZE is raised; the
/// agent never raises it.
pub const DEFAULT_MAX_FRAME: usize = 16_384;
/// A window's initial size before SETTINGS say otherwise.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// The largest a flow-control window may become.
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// A frame header as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Parses the frame header at the start of `buf` (at least [`HEADER_LEN`]
/// bytes).
pub fn parse_head(buf: &[u8]) -> Head {
    Head {
        len: (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]),
        kind: buf[3],
        flags: buf[4],
        stream: u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff,
    }
}

/// Appends a frame header.
pub fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    let id = (stream & 0x7fff_ffff).to_be_bytes();
    // One copy: `BytesMut`'s `put_u8` and friends each go through
    // `put_slice` (a capacity check and a `memcpy` call per byte).
    out.extend_from_slice(&[
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        kind,
        flags,
        id[0],
        id[1],
        id[2],
        id[3],
    ]);
}

/// Appends a SETTINGS frame with `values`.
pub fn put_settings(out: &mut BytesMut, values: &[(u16, u32)]) {
    put_head(out, values.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, value) in values {
        let (i, v) = (id.to_be_bytes(), value.to_be_bytes());
        out.extend_from_slice(&[i[0], i[1], v[0], v[1], v[2], v[3]]);
    }
}

/// Appends a WINDOW_UPDATE frame.
pub fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends an RST_STREAM frame.
pub fn put_reset(out: &mut BytesMut, stream: u32, error: u32) {
    put_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&error.to_be_bytes());
}

/// Appends a GOAWAY frame.
pub fn put_goaway(out: &mut BytesMut, last_stream: u32, error: u32) {
    put_head(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
}

/// Strips the padding of a DATA or HEADERS payload (and, for HEADERS with
/// the PRIORITY flag, its priority fields): the range of what is left.
pub fn unpad(payload: &[u8], flags: u8, kind: u8) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & flag::PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if kind == kind::HEADERS && flags & flag::PRIORITY != 0 {
        start += 5;
    }
    (start <= end).then_some(start..end)
}

/// Appends an HPACK integer with an `n`-bit prefix whose high bits are
/// `first` (RFC 7541 §5.1).
fn put_int(out: &mut Vec<u8>, first: u8, n: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// Appends a string literal without Huffman coding.
fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends a header field from the static table, indexed whole.
pub fn put_indexed(out: &mut Vec<u8>, index: usize) {
    put_int(out, 0x80, 7, index);
}

/// Appends a literal field whose name is static-table entry `index`;
/// never indexed when `sensitive`.
pub fn put_literal_indexed_name(out: &mut Vec<u8>, index: usize, value: &[u8], sensitive: bool) {
    put_int(out, if sensitive { 0x10 } else { 0 }, 4, index);
    put_str(out, value);
}

/// Appends a literal field with a literal name.
pub fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8], sensitive: bool) {
    out.push(if sensitive { 0x10 } else { 0 });
    put_str(out, name);
    put_str(out, value);
}

/// Static-table index of the names the agent sends often.
fn static_name(name: &str) -> Option<usize> {
    Some(match name {
        "content-type" => 31,
        "user-agent" => 58,
        "accept-encoding" => 16,
        "authorization" => 23,
        _ => return None,
    })
}

/// One header field as a literal that is not indexed (never indexed when
/// its value is marked sensitive), its name from the static table when
/// there.
pub fn put_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    let sensitive = value.is_sensitive();
    match static_name(name.as_str()) {
        Some(i) => put_literal_indexed_name(out, i, value.as_bytes(), sensitive),
        None => put_literal(out, name.as_str().as_bytes(), value.as_bytes(), sensitive),
    }
}

/// A response's header block: `:status`, then `headers` less the
/// connection-specific ones (RFC 9113 8.2.2).
pub fn put_response_block(out: &mut Vec<u8>, status: u16, headers: &HeaderMap) {
    match status {
        200 => put_indexed(out, 8),
        _ => {
            let mut n = itoa::Buffer::new();
            put_literal_indexed_name(out, 8, n.format(status).as_bytes(), false);
        }
    }
    put_fields(out, headers);
}

/// `headers` less the connection-specific ones, as [`put_field`]s (a
/// trailer block).
pub fn put_fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        if !connection_specific(name.as_str()) {
            put_field(out, name, value);
        }
    }
}

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

    #[test]
    fn integers_use_the_prefix_then_continuation_bytes() {
        // RFC 7541 C.1.1 and C.1.2.
        let mut out = Vec::new();
        put_int(&mut out, 0, 5, 10);
        assert_eq!(&out[..], &[10]);
        out.clear();
        put_int(&mut out, 0, 5, 1337);
        assert_eq!(&out[..], &[31, 154, 10]);
        out.clear();
        put_int(&mut out, 0x80, 7, 127);
        assert_eq!(&out[..], &[0xff, 0]);
    }

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

    #[test]
    fn sensitive_values_are_never_indexed_literals() {
        let mut out = Vec::new();
        put_literal(&mut out, b"grpc-timeout", b"5u", true);
        assert_eq!(out[0], 0x10);
        out.clear();
        put_literal_indexed_name(&mut out, 31, b"application/grpc", true);
        assert_eq!(out[0], 0x1f);
        assert_eq!(out[1], 16, "the index continues past the 4-bit prefix");
    }

    #[test]
    fn frame_heads_round_trip() {
        let mut out = BytesMut::new();
        put_head(&mut out, 70_000, kind::DATA, flag::END_STREAM, 0x8000_0003);
        assert_eq!(
            parse_head(&out),
            Head {
                len: 70_000,
                kind: kind::DATA,
                flags: flag::END_STREAM,
                stream: 3
            }
        );
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        // Pad length 2, priority 5 bytes, 3 bytes of block, 2 of padding.
        let payload = [2, 0, 0, 0, 0, 9, b'a', b'b', b'c', 0, 0];
        let range = unpad(&payload, flag::PADDED | flag::PRIORITY, kind::HEADERS).unwrap();
        assert_eq!(&payload[range], b"abc");
        assert_eq!(unpad(&[9, 1], flag::PADDED, kind::DATA), None);
        assert_eq!(unpad(b"xy", 0, kind::DATA), Some(0..2));
    }
}
