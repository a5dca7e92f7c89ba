//! HTTP/2 frames and the HPACK encoding the agent writes towards a worker
//! (RFC 9113, RFC 7541). Pure functions over byte buffers.
//!
//! Request header blocks are encoded with the static table and literals
//! only: no dynamic table, so nothing is looked up or inserted per header
//! and the worker's decoder state never depends on earlier requests. The
//! response blocks the agent sends its own clients add a few names to the
//! client's dynamic table once per connection ([`Indexer`]). Values marked
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

/// What a peer's SETTINGS frame set that the agent's connections act on
/// (the last value of each, as RFC 9113 6.5.3 processes them in order).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeerSettings {
    pub header_table_size: Option<u32>,
    pub initial_window: Option<i64>,
    pub max_frame: Option<usize>,
    pub max_streams: Option<u32>,
}

/// Reads a SETTINGS frame, checked as RFC 9113 6.5 asks of either side:
/// `None` for an ACK; an error is the connection error's code and why.
pub fn read_settings(
    head: Head,
    payload: &[u8],
) -> Result<Option<PeerSettings>, (u32, &'static str)> {
    if head.stream != 0 {
        return Err((code::PROTOCOL_ERROR, "SETTINGS on a stream"));
    }
    if head.flags & flag::ACK != 0 {
        if !payload.is_empty() {
            return Err((code::FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload"));
        }
        return Ok(None);
    }
    if payload.len() % 6 != 0 {
        return Err((code::FRAME_SIZE_ERROR, "SETTINGS of the wrong size"));
    }
    let mut out = PeerSettings::default();
    for s in payload.chunks_exact(6) {
        let id = u16::from_be_bytes([s[0], s[1]]);
        let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
        match id {
            setting::HEADER_TABLE_SIZE => out.header_table_size = Some(value),
            setting::INITIAL_WINDOW_SIZE => {
                if i64::from(value) > MAX_WINDOW {
                    return Err((code::FLOW_CONTROL_ERROR, "an initial window over 2^31-1"));
                }
                out.initial_window = Some(i64::from(value));
            }
            setting::MAX_FRAME_SIZE => {
                if !(16_384..=16_777_215).contains(&value) {
                    return Err((code::PROTOCOL_ERROR, "a bad MAX_FRAME_SIZE"));
                }
                out.max_frame = Some(value as usize);
            }
            setting::ENABLE_PUSH if value > 1 => {
                return Err((code::PROTOCOL_ERROR, "a bad ENABLE_PUSH"));
            }
            setting::MAX_CONCURRENT_STREAMS => out.max_streams = Some(value),
            // Unknown settings are ignored (RFC 9113 6.5.2).
            _ => {}
        }
    }
    Ok(Some(out))
}

/// Appends header block `block` of stream `id` as a HEADERS frame and
/// CONTINUATIONs of at most `max_frame` bytes each (`end`: the block ends
/// the stream).
pub fn put_header_frames(
    out: &mut BytesMut,
    id: u32,
    mut block: &[u8],
    end: bool,
    max_frame: usize,
) {
    let end = if end { flag::END_STREAM } else { 0 };
    let mut first = true;
    while first || !block.is_empty() {
        let (part, rest) = block.split_at(block.len().min(max_frame));
        block = rest;
        let last = if block.is_empty() {
            flag::END_HEADERS
        } else {
            0
        };
        let (k, flags) = if first {
            (kind::HEADERS, end | last)
        } else {
            (kind::CONTINUATION, last)
        };
        put_head(out, part.len(), k, flags, id);
        out.extend_from_slice(part);
        first = false;
    }
}

/// A WINDOW_UPDATE's increment (RFC 9113 6.9).
pub fn window_increment(payload: &[u8]) -> Result<i64, (u32, &'static str)> {
    let Ok(bytes) = <[u8; 4]>::try_from(payload) else {
        return Err((code::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
    };
    Ok(i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff))
}

/// Adds a connection-level WINDOW_UPDATE's increment to `window`: a
/// zero increment and a window past 2^31-1 are connection errors.
pub fn grow_connection_window(window: &mut i64, inc: i64) -> Result<(), (u32, &'static str)> {
    if inc == 0 {
        return Err((code::PROTOCOL_ERROR, "a zero window increment"));
    }
    *window += inc;
    if *window > MAX_WINDOW {
        return Err((code::FLOW_CONTROL_ERROR, "the window overflowed"));
    }
    Ok(())
}

/// The peer's initial window became `window` (it was `*initial`): each
/// stream's send window moves by the difference (RFC 9113 6.9.2).
pub fn shift_windows<'a>(
    initial: &mut i64,
    window: i64,
    windows: impl Iterator<Item = &'a mut i64>,
) -> Result<(), (u32, &'static str)> {
    let delta = window - std::mem::replace(initial, window);
    for window in windows {
        *window += delta;
        if *window > MAX_WINDOW {
            return Err((code::FLOW_CONTROL_ERROR, "a stream window overflowed"));
        }
    }
    Ok(())
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
        "date" => 33,
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
pub fn put_response_block(
    out: &mut Vec<u8>,
    index: &mut Indexer,
    status: u16,
    headers: &HeaderMap,
) {
    index.begin(out);
    match status {
        200 => put_indexed(out, 8),
        _ => {
            let mut n = itoa::Buffer::new();
            put_literal_indexed_name(out, 8, n.format(status).as_bytes(), false);
        }
    }
    put_fields(out, index, headers);
}

/// A trailer block: `headers` less the connection-specific ones.
pub fn put_trailer_block(out: &mut Vec<u8>, index: &mut Indexer, headers: &HeaderMap) {
    if headers.is_empty() {
        // Size updates wait for a block with fields: a block of updates
        // alone is an error to some decoders.
        return;
    }
    index.begin(out);
    put_fields(out, index, headers);
}

fn put_fields(out: &mut Vec<u8>, index: &mut Indexer, headers: &HeaderMap) {
    for (name, value) in headers {
        if !connection_specific(name.as_str()) {
            index.put(out, name, value);
        }
    }
}

/// The most the agent lets a peer's HPACK dynamic table hold of its
/// entries: the size every decoder starts with (RFC 9113 6.5.2).
pub const TABLE_SIZE: usize = 4096;

/// The names every response of the agent carries: the worker's content
/// type and status, and the load report the agent adds.
pub const RESPONSE_NAMES: &[&str] = &[
    "content-type",
    "grpc-status",
    infermesh_proto::load::INFLIGHT_KEY,
    infermesh_proto::load::QUEUED_KEY,
    infermesh_proto::load::BUSY_KEY,
    infermesh_proto::load::WEIGHT_KEY,
    crate::trailer::ORCA_KEY,
];

/// The encoding half of one connection's HPACK dynamic table, for a fixed
/// set of names sent on every message (RFC 7541 2.3, 6.2.1).
///
/// Each name is added to the peer's table once, with the value it first
/// has; later blocks refer to it by index, and to the whole field when the
/// value is the same again (`grpc-status: 0`). Without it the seven names
/// of a response's head and load report went as literals, about 200 bytes
/// that the client decoded, validated and copied on every response.
/// Nothing is ever evicted: an entry is added only while the table has
/// room for it within the peer's SETTINGS_HEADER_TABLE_SIZE, so an entry's
/// index depends only on how many were added after it. When the peer
/// changes that setting the table is emptied with size updates at the
/// start of the next block (RFC 7541 4.2) and fills again.
///
/// Blocks must reach the wire in the order they are encoded.
#[derive(Debug)]
pub struct Indexer {
    names: &'static [&'static str],
    /// Per name: when it was added (0 = first) and the value it has there.
    entries: Vec<Option<(usize, Box<[u8]>)>>,
    added: usize,
    /// Bytes of the table in use (RFC 7541 4.1).
    used: usize,
    /// The table's maximum size, as last signalled (or the default).
    max: usize,
    /// Size updates owed at the start of the next block: the smallest
    /// size since the last block (0 when the table held entries), then
    /// the size now.
    owed: Option<(usize, usize)>,
}

impl Indexer {
    /// An empty table of the default size, for `names`.
    pub fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            entries: vec![None; names.len()],
            added: 0,
            used: 0,
            max: TABLE_SIZE,
            owed: None,
        }
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE arrived: the table (never more
    /// than [`TABLE_SIZE`]) takes that size from the next block on.
    pub fn set_limit(&mut self, limit: u32) {
        let max = (limit as usize).min(TABLE_SIZE);
        if max == self.max && self.owed.is_none() {
            return;
        }
        // Emptied first when it held entries, so that no entry is left
        // whose index the agent would have to work out after an eviction;
        // and of several changes before a block, the smallest is signalled
        // first (RFC 7541 4.2).
        let floor = if self.added > 0 { 0 } else { max };
        let smallest = self.owed.map_or(floor, |(smallest, _)| smallest.min(floor));
        self.owed = Some((smallest, max));
        self.max = max;
        self.entries.iter_mut().for_each(|e| *e = None);
        self.added = 0;
        self.used = 0;
    }

    /// Starts a header block: the size updates owed, if any.
    pub fn begin(&mut self, out: &mut Vec<u8>) {
        if let Some((smallest, max)) = self.owed.take() {
            if smallest < max {
                put_int(out, 0x20, 5, smallest);
            }
            put_int(out, 0x20, 5, max);
        }
    }

    /// One header field: by index when its name is in the table (the whole
    /// field when the value is the one there), added to the table when its
    /// name is one of the set and fits, else as [`put_field`] writes it.
    pub fn put(&mut self, out: &mut Vec<u8>, name: &HeaderName, field: &HeaderValue) {
        let name_str = name.as_str();
        let slot = match self.names.iter().position(|n| *n == name_str) {
            Some(slot) if !field.is_sensitive() => slot,
            _ => return put_field(out, name, field),
        };
        let value = field.as_bytes();
        match &self.entries[slot] {
            Some((order, there)) => {
                // Newest entry first, after the 61 static ones.
                let index = 62 + (self.added - 1 - order);
                if **there == *value {
                    put_indexed(out, index);
                } else {
                    put_literal_indexed_name(out, index, value, false);
                }
            }
            None => {
                let size = name_str.len() + value.len() + 32;
                if self.used + size > self.max {
                    return put_field(out, name, field);
                }
                match static_name(name_str) {
                    Some(i) => put_int(out, 0x40, 6, i),
                    None => {
                        out.push(0x40);
                        put_str(out, name_str.as_bytes());
                    }
                }
                put_str(out, value);
                self.entries[slot] = Some((self.added, value.into()));
                self.added += 1;
                self.used += size;
            }
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

    /// Decodes `block` with `decoder` (loona-hpack, a decoder the project
    /// did not write) into `(name, value)` strings.
    fn decode_with(decoder: &mut loona_hpack::Decoder, block: &[u8]) -> Vec<(String, String)> {
        decoder
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    fn response(busy: &str, status: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert("grpc-status", HeaderValue::from_str(status).unwrap());
        map.insert("infermesh-busy", HeaderValue::from_str(busy).unwrap());
        map.insert("x-other", HeaderValue::from_static("v"));
        let mut secret = HeaderValue::from_static("s");
        secret.set_sensitive(true);
        map.insert("content-type", HeaderValue::from_static("application/grpc"));
        map.insert("infermesh-weight", secret);
        map
    }

    fn strings(map: &HeaderMap) -> Vec<(String, String)> {
        map.iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect()
    }

    /// Response names go into the client's table once and are referred to
    /// by index after; values that repeat go as one byte; what is not in
    /// the set, or is sensitive, stays a literal. A decoder with state
    /// across blocks reads every block back.
    #[test]
    fn response_names_are_indexed_once_and_decode_across_blocks() {
        let mut index = Indexer::new(RESPONSE_NAMES);
        let mut decoder = loona_hpack::Decoder::new();
        let mut sizes = Vec::new();
        for (busy, status) in [("0.5", "0"), ("0.5", "0"), ("0.25", "0"), ("0.25", "14")] {
            let map = response(busy, status);
            let mut out = Vec::new();
            put_trailer_block(&mut out, &mut index, &map);
            assert_eq!(decode_with(&mut decoder, &out), strings(&map));
            sizes.push(out.len());
        }
        // Literals first; then grpc-status, busy and content-type indexed
        // whole, and the two literals as before.
        assert!(sizes[1] < sizes[0] - 40, "{sizes:?}");
        // A new value: its name by index (two bytes beyond index 14), the
        // value a literal, in place of the one byte of the whole field.
        assert_eq!(sizes[2], sizes[1] - 1 + 2 + 1 + "0.25".len());
        assert_eq!(sizes[3], sizes[2] - 1 + 2 + 1 + "14".len());
        // The sensitive value was never added (it is sent never-indexed).
        assert_eq!(index.added, 3);
    }

    /// The client shrinking, emptying and growing its table through
    /// SETTINGS: each next block starts with the size updates (RFC 7541
    /// 4.2), which a strict decoder demands, and the entries fill again
    /// within the new size.
    #[test]
    fn a_table_size_change_is_signalled_and_the_table_refilled() {
        let mut index = Indexer::new(RESPONSE_NAMES);
        let mut decoder = loona_hpack::Decoder::new();
        let map = response("0.5", "0");
        let block = |index: &mut Indexer, decoder: &mut loona_hpack::Decoder| {
            let mut out = Vec::new();
            put_response_block(&mut out, index, 200, &map);
            let mut want = vec![(":status".to_string(), "200".to_string())];
            want.extend(strings(&map));
            assert_eq!(decode_with(decoder, &out), want);
            out
        };
        block(&mut index, &mut decoder);
        // Emptied: no entry may be added, and the first byte says size 0.
        index.set_limit(0);
        decoder.set_max_allowed_table_size(0);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[..2], [0x20, 0x88]);
        assert_eq!(index.added, 0);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[0], 0x88, "the update goes once");
        // Room for one entry only ("grpc-status: 0" is 11 + 1 + 32 bytes).
        index.set_limit(50);
        decoder.set_max_allowed_table_size(50);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[..3], [0x3f, 50 - 31, 0x88]);
        assert_eq!((index.added, index.used), (1, 44));
        // Back to the default: emptied (0), then 4096, and refilled.
        index.set_limit(1 << 20);
        decoder.set_max_allowed_table_size(4096);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[..4], [0x20, 0x3f, 0xe1, 0x1f]);
        assert_eq!(index.added, 3);
        // A limit that does not change the size sends nothing.
        index.set_limit(8192);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[0], 0x88);
        // Emptied and restored between two blocks: the smallest size goes
        // first (RFC 7541 4.2), so the decoder drops what it held too.
        index.set_limit(0);
        index.set_limit(4096);
        let out = block(&mut index, &mut decoder);
        assert_eq!(out[..4], [0x20, 0x3f, 0xe1, 0x1f]);
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
