//! HPACK blocks built representation by representation (RFC 7541 6):
//! indexed fields from both tables, literals of each indexing kind with
//! indexed or literal names, Huffman coding on or off per string, dynamic
//! table size updates (some over the limit), long values that evict; and
//! [`Differential`], which holds the crate's decoder to loona-hpack's
//! block by block.
//!
//! The builder keeps its own model of the dynamic table, so each block
//! comes with the fields it must decode to: both decoders are checked
//! against the intent, not only against each other.

use std::collections::VecDeque;

use infermesh_http2::hpack::Decoder;

use super::input::Input;

/// The most a peer may set the table to: the default, which both
/// connection roles keep.
pub const TABLE: usize = 4096;

pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// Appends an integer with an `n`-bit prefix under `first`'s high bits.
pub fn put_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends a string literal, Huffman-coded when `huffman`.
pub fn put_str(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
    if !huffman {
        put_int(out, 0, 7, s.len());
        out.extend_from_slice(s);
        return;
    }
    let codes = codes();
    let (mut acc, mut bits, mut coded) = (0u64, 0u32, Vec::new());
    for &b in s {
        let (code, len) = codes[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            coded.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        // Padded with the EOS code's leading ones.
        coded.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    put_int(out, 0x80, 7, coded.len());
    out.extend_from_slice(&coded);
}

/// The Huffman code of each byte, made canonical from the code lengths
/// of RFC 7541 appendix B (the RFC's code is canonical).
fn codes() -> [(u32, u8); 256] {
    let mut order: Vec<usize> = (0..257).collect();
    order.sort_by_key(|&s| (HUFFMAN_LENGTHS[s], s));
    let mut out = [(0u32, 0u8); 256];
    let (mut code, mut prev) = (0u32, HUFFMAN_LENGTHS[order[0]]);
    for (i, &s) in order.iter().enumerate() {
        let len = HUFFMAN_LENGTHS[s];
        if i > 0 {
            code = (code + 1) << (len - prev);
        }
        prev = len;
        if s < 256 {
            out[s] = (code, len);
        }
    }
    out
}

pub const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

/// The static table's fields (RFC 7541 appendix A), the few the builder
/// needs by value: it takes the rest from the decoders' agreement.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Values and names the builder draws from, so that strings repeat (the
/// decoder remembers recent Huffman strings) and some are long.
const WORDS: [&str; 8] = [
    "application/grpc",
    "/inference.GRPCInferenceService/ModelInfer",
    "x-custom",
    "grpc-timeout",
    "trailers",
    "",
    "0",
    "te",
];

/// An encoder's model of the peer's dynamic table, and the blocks it
/// writes with it.
pub struct BlockBuilder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Default for BlockBuilder {
    fn default() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max: TABLE,
        }
    }
}

impl BlockBuilder {
    fn field(&self, index: usize) -> (Vec<u8>, Vec<u8>) {
        if index <= 61 {
            let (n, v) = STATIC[index - 1];
            (n.as_bytes().to_vec(), v.as_bytes().to_vec())
        } else {
            self.table[index - 62].clone()
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front((name, value));
        }
    }

    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn string(input: &mut Input) -> Vec<u8> {
        match input.below(8) {
            0..=3 => WORDS[input.below(WORDS.len())].as_bytes().to_vec(),
            4 => vec![b'v'; 100 + input.below(1500)],
            5 => input.bytes(8),
            _ => input
                .bytes(24)
                .iter()
                .map(|b| b"abcdefghijklmnopqrstuvwxyz-0123"[usize::from(b % 31)])
                .collect(),
        }
    }

    /// A block drawn from `input`, and the fields it decodes to; `None`
    /// when the block must be refused (a size update over the limit: it is
    /// still returned, to see both decoders refuse it).
    pub fn block(&mut self, input: &mut Input) -> (Vec<u8>, Option<Fields>) {
        let mut out = Vec::new();
        let mut fields = Vec::new();
        let mut valid = true;
        for _ in 0..input.below(3) {
            if input.below(4) == 0 {
                break;
            }
            let size = match input.below(32) {
                0 => TABLE + 1 + input.below(1000),
                1..=4 => 0,
                5..=8 => TABLE,
                _ => input.below(TABLE + 1),
            };
            put_int(&mut out, 0x20, 5, size);
            if size > TABLE {
                valid = false;
            } else {
                self.max = size;
                self.evict(0);
            }
        }
        for _ in 0..input.below(12) {
            let huffman_name = input.bool();
            let huffman_value = input.bool();
            match input.below(6) {
                0 => {
                    let index = 1 + input.below(61 + self.table.len());
                    put_int(&mut out, 0x80, 7, index);
                    fields.push(self.field(index));
                }
                kind => {
                    // Incremental indexing (twice as likely), without, never.
                    let (first, prefix, index) = match kind {
                        1 | 2 => (0x40, 6, true),
                        3 => (0x00, 4, false),
                        _ => (0x10, 4, false),
                    };
                    let name = if input.bool() {
                        let i = 1 + input.below(61 + self.table.len());
                        put_int(&mut out, first, prefix, i);
                        self.field(i).0
                    } else {
                        let name = Self::string(input);
                        out.push(first);
                        put_str(&mut out, &name, huffman_name);
                        name
                    };
                    let value = Self::string(input);
                    put_str(&mut out, &value, huffman_value);
                    if index {
                        self.insert(name.clone(), value.clone());
                    }
                    fields.push((name, value));
                }
            }
        }
        (out, valid.then_some(fields))
    }
}

/// The crate's decoder and loona-hpack's, fed the same blocks.
pub struct Differential {
    ours: Decoder,
    theirs: loona_hpack::Decoder<'static>,
    /// A block was refused: the connection would have ended.
    pub ended: bool,
}

impl Default for Differential {
    fn default() -> Self {
        let mut theirs = loona_hpack::Decoder::new();
        theirs.set_max_allowed_table_size(TABLE);
        Self {
            ours: Decoder::new(TABLE),
            theirs,
            ended: false,
        }
    }
}

/// Whether `block` starts with size updates and holds nothing else.
fn only_size_updates(block: &[u8]) -> bool {
    let mut rest = block;
    while let Some(&b) = rest.first() {
        if b & 0xe0 != 0x20 {
            return false;
        }
        // Skip the integer.
        rest = &rest[1..];
        if b & 0x1f == 0x1f {
            while let Some((&x, more)) = rest.split_first() {
                rest = more;
                if x & 0x80 == 0 {
                    break;
                }
            }
        }
    }
    true
}

/// Whether `block` has a size update after a field: refused by the
/// crate (RFC 7541 4.2: updates come first), taken by loona-hpack.
fn size_update_after_a_field(theirs: &Fields, block: &[u8]) -> bool {
    // loona-hpack took the block, so it parses: walk its representations.
    let _ = theirs;
    let mut rest = block;
    let mut seen_field = false;
    let int = |rest: &mut &[u8], n: u8| -> usize {
        let (&first, more) = rest.split_first().unwrap();
        *rest = more;
        let max = (1usize << n) - 1;
        let mut v = usize::from(first) & max;
        if v == max {
            let mut shift = 0;
            while let Some((&x, more)) = rest.split_first() {
                *rest = more;
                v += usize::from(x & 0x7f) << shift;
                shift += 7;
                if x & 0x80 == 0 {
                    break;
                }
            }
        }
        v
    };
    let skip_str = |rest: &mut &[u8]| {
        let len = int(rest, 7);
        *rest = &rest[len..];
    };
    while let Some(&b) = rest.first() {
        if b & 0x80 != 0 {
            int(&mut rest, 7);
            seen_field = true;
        } else if b & 0xe0 == 0x20 {
            if seen_field {
                return true;
            }
            int(&mut rest, 5);
        } else {
            let prefix = if b & 0x40 != 0 { 6 } else { 4 };
            if int(&mut rest, prefix) == 0 {
                skip_str(&mut rest);
            }
            skip_str(&mut rest);
            seen_field = true;
        }
    }
    false
}

impl Differential {
    /// Decodes `block` with both; an error says how they disagreed (or
    /// disagreed with `expected`, the fields the block was built from, or
    /// `None` when it must be refused). Once either refuses a block the
    /// tables may differ: later blocks are not compared.
    pub fn block(&mut self, block: &[u8], expected: Option<Option<&Fields>>) -> Result<(), String> {
        if self.ended {
            return Ok(());
        }
        let mut ours = Vec::new();
        let ours = self
            .ours
            .decode(block, |n, v| ours.push((n.to_vec(), v.to_vec())))
            .map(|()| ours);
        let theirs = self.theirs.decode(block);
        let agreed = match (&ours, &theirs) {
            (Ok(a), Ok(b)) if a == b => Some(a.clone()),
            (Ok(a), Ok(b)) => {
                return Err(format!(
                    "different fields for {}: ours {}, theirs {}",
                    short(block),
                    brief(a),
                    brief(b)
                ));
            }
            (Err(_), Err(_)) => None,
            // Documented differences: loona-hpack refuses a block of size
            // updates alone (RFC 7541 does not; the crate's encoder avoids
            // sending one), and takes updates after a field (4.2 puts them
            // first; the crate, as h2, refuses).
            (Ok(a), Err(loona_hpack::decoder::DecoderError::SizeUpdateAtEnd))
                if a.is_empty() && only_size_updates(block) =>
            {
                // loona-hpack applied the updates before refusing: the
                // tables still agree.
                Some(Vec::new())
            }
            (Err(infermesh_http2::hpack::DecodeError::BadSizeUpdate), Ok(b))
                if size_update_after_a_field(b, block) =>
            {
                None
            }
            (a, b) => {
                let (a, b) = (a.as_ref().map(brief), b.as_ref().map(brief));
                return Err(format!("for {}: ours {a:?}, theirs {b:?}", short(block)));
            }
        };
        match (expected, &agreed) {
            (None, _) => {}
            (Some(Some(want)), Some(got)) if want == got => {}
            (Some(None), None) => {}
            (Some(want), got) => {
                let (want, got) = (want.map(brief), got.as_ref().map(brief));
                return Err(format!(
                    "block {} built as {want:?} decoded as {got:?}",
                    short(block)
                ));
            }
        }
        if agreed.is_none() {
            self.ended = true;
        }
        Ok(())
    }
}

/// Runs the blocks `data` decodes to through [`Differential`]: arbitrary
/// bytes, blocks built with their expected fields, and built blocks
/// truncated or with a byte changed; panics on a disagreement.
pub fn differential(data: &[u8]) {
    let mut input = Input::new(data);
    let mut builder = BlockBuilder::default();
    let mut diff = Differential::default();
    // A block the builder did not build (or changed after) may change the
    // tables: from then on only the decoders are compared.
    let mut model = true;
    while !input.is_empty() && !diff.ended {
        let result = match input.below(8) {
            0 => {
                let block = input.bytes(64);
                model = false;
                diff.block(&block, None)
            }
            1 => {
                let (mut block, _) = builder.block(&mut input);
                if input.bool() {
                    block.truncate(input.below(block.len() + 1));
                } else if !block.is_empty() {
                    let at = input.below(block.len());
                    block[at] ^= 1 << input.below(8);
                }
                model = false;
                diff.block(&block, None)
            }
            _ => {
                let (block, fields) = builder.block(&mut input);
                diff.block(&block, model.then_some(fields.as_ref()))
            }
        };
        result.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The start of a block, for messages.
fn short(block: &[u8]) -> String {
    format!(
        "{:02x?}{} ({} bytes)",
        &block[..block.len().min(48)],
        if block.len() > 48 { "..." } else { "" },
        block.len()
    )
}

/// Fields, each cut to its first bytes, for messages.
fn brief(fields: &Fields) -> String {
    let cut = |b: &[u8]| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&b[..b.len().min(24)]),
            if b.len() > 24 {
                format!("..({})", b.len())
            } else {
                String::new()
            }
        )
    };
    let parts: Vec<String> = fields
        .iter()
        .map(|(n, v)| format!("{}: {}", cut(n), cut(v)))
        .collect();
    format!("[{}]", parts.join(", "))
}
