//! HPACK encoding (RFC 7541) of the blocks this crate writes.
//!
//! Request header blocks are encoded with the static table and literals
//! only: no dynamic table, so nothing is looked up or inserted per header
//! and the worker's decoder state never depends on earlier requests. The
//! response blocks a server sends add a few names, handed in by its user,
//! to the client's dynamic table once per connection ([`Indexer`]). Values
//! marked sensitive are sent as never-indexed literals, as `h2` does.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::fields::connection_specific;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The names an agent's responses repeat (its load report among them).
    const RESPONSE_NAMES: &[&str] = &[
        "content-type",
        "grpc-status",
        "infermesh-inflight",
        "infermesh-queued",
        "infermesh-busy",
        "infermesh-weight",
        "endpoint-load-metrics-bin",
    ];

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
    fn sensitive_values_are_never_indexed_literals() {
        let mut out = Vec::new();
        put_literal(&mut out, b"grpc-timeout", b"5u", true);
        assert_eq!(out[0], 0x10);
        out.clear();
        put_literal_indexed_name(&mut out, 31, b"application/grpc", true);
        assert_eq!(out[0], 0x1f);
        assert_eq!(out[1], 16, "the index continues past the 4-bit prefix");
    }
}
