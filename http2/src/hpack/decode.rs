//! HPACK decoding (RFC 7541): the header blocks of clients and workers.
//!
//! Written here rather than taken from `loona-hpack` (used before): its
//! decoder builds a `HashMap` of the whole Huffman code for every
//! Huffman-coded string it meets, about 250,000 instructions each, and
//! clients Huffman-code every literal (a `grpc-timeout` differs on every
//! request). Here the code is decoded bit by bit from its canonical form
//! (lengths only, tables built once), strings that are not Huffman-coded
//! are handed over as slices of the block, and decoded ones go through two
//! buffers kept by the decoder. Per field, nothing is allocated but entries
//! added to the dynamic table, and a Huffman-coded string remembered by
//! the small cache of recent ones (`HuffmanCache`: its first four
//! entries; after that their buffers are reused and grow only to a longer
//! string, of at most 128 bytes).

use std::collections::VecDeque;
use std::sync::OnceLock;

/// Why a header block did not decode; the connection must end
/// (COMPRESSION_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a header block ended inside a field")]
    Truncated,
    #[error("an integer over 2^28")]
    Overflow,
    #[error("an index outside the tables")]
    BadIndex,
    #[error("a Huffman-coded string did not decode")]
    BadHuffman,
    #[error("a dynamic table size update that is not allowed")]
    BadSizeUpdate,
}

/// A dynamic table entry: name, value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// Per-entry overhead in the dynamic table's size (RFC 7541 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// The decoding side of one connection's HPACK context.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// The most the peer may set `max_size` to (our SETTINGS).
    allowed: usize,
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
    /// Huffman-coded strings seen lately and what they decoded to (see
    /// [`HuffmanCache`]).
    recent: HuffmanCache,
}

/// The last few short Huffman-coded strings and their decoding. A peer
/// that sends the same literal on every request (`h2`'s encoder never
/// indexes `:path`, so tonic clients send the method's path as a Huffman
/// literal each time) then costs a comparison instead of a decode.
#[derive(Debug, Default)]
struct HuffmanCache {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    next: usize,
}

impl HuffmanCache {
    const ENTRIES: usize = 4;
    const MAX_LEN: usize = 128;

    /// Decodes `coded` into `out`, from the cache when it was seen lately.
    fn decode(&mut self, coded: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        if coded.len() > Self::MAX_LEN {
            return huffman_decode(coded, out);
        }
        if let Some((_, plain)) = self.entries.iter().find(|(c, _)| c[..] == *coded) {
            out.extend_from_slice(plain);
            return Ok(());
        }
        huffman_decode(coded, out)?;
        if self.entries.len() < Self::ENTRIES {
            self.entries.push((coded.to_vec(), out.clone()));
        } else {
            // The oldest entry's buffers are reused: once the cache is full
            // and they have grown to the strings met, a miss allocates nothing.
            let (c, plain) = &mut self.entries[self.next];
            c.clear();
            c.extend_from_slice(coded);
            plain.clear();
            plain.extend_from_slice(out);
            self.next = (self.next + 1) % Self::ENTRIES;
        }
        Ok(())
    }
}

impl Decoder {
    /// A decoder whose table may grow to `allowed` bytes (what the agent
    /// advertises as SETTINGS_HEADER_TABLE_SIZE; 4,096 by default).
    pub fn new(allowed: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: allowed,
            allowed,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
            recent: HuffmanCache::default(),
        }
    }

    /// Decodes `block`, calling `field(name, value)` for each field in
    /// order.
    pub fn decode(
        &mut self,
        mut block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let mut at_start = true;
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                let (name, value) = entry(&self.table, index)?;
                field(name, value);
            } else if first & 0xc0 == 0x40 {
                self.literal(&mut block, 6, true, &mut field)?;
            } else if first & 0xe0 == 0x20 {
                let size = integer(&mut block, 5)?;
                if !at_start || size > self.allowed {
                    return Err(DecodeError::BadSizeUpdate);
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Without indexing (0000) or never indexed (0001).
                self.literal(&mut block, 4, false, &mut field)?;
            }
            at_start = false;
        }
        Ok(())
    }

    fn literal(
        &mut self,
        block: &mut &[u8],
        prefix: u8,
        index: bool,
        field: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let name_index = integer(block, prefix)?;
        let name: &[u8] = if name_index == 0 {
            string(block, &mut self.name_buf, &mut self.recent)?
        } else {
            entry(&self.table, name_index)?.0
        };
        let value = string(block, &mut self.value_buf, &mut self.recent)?;
        field(name, value);
        let entry: Option<Entry> = index.then(|| (name.into(), value.into()));
        if let Some(entry) = entry {
            let size = entry.0.len() + entry.1.len() + ENTRY_OVERHEAD;
            self.evict(size);
            if size <= self.max_size {
                self.size += size;
                self.table.push_front(entry);
            }
        }
        Ok(())
    }

    /// Drops the oldest entries until `room` more bytes fit (all of them
    /// when it cannot).
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + ENTRY_OVERHEAD;
        }
    }
}

/// Entry `index` of the static table (1–61) or the dynamic one (62–).
fn entry(table: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
    match index {
        0 => Err(DecodeError::BadIndex),
        1..=61 => Ok(STATIC_TABLE[index - 1]),
        _ => table
            .get(index - 62)
            .map(|(n, v)| (&n[..], &v[..]))
            .ok_or(DecodeError::BadIndex),
    }
}

/// An integer with an `n`-bit prefix (RFC 7541 5.1).
fn integer(block: &mut &[u8], n: u8) -> Result<usize, DecodeError> {
    let (&first, rest) = block.split_first().ok_or(DecodeError::Truncated)?;
    *block = rest;
    let max = (1usize << n) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let (&b, rest) = block.split_first().ok_or(DecodeError::Truncated)?;
        *block = rest;
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
        if shift > 21 {
            return Err(DecodeError::Overflow);
        }
    }
}

/// A string literal (RFC 7541 5.2): a slice of `block`, or decoded into
/// `buf` when Huffman-coded.
fn string<'c, 'a: 'c, 'b: 'c>(
    block: &mut &'a [u8],
    buf: &'b mut Vec<u8>,
    recent: &mut HuffmanCache,
) -> Result<&'c [u8], DecodeError> {
    let huffman = block.first().ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(block, 7)?;
    if block.len() < len {
        return Err(DecodeError::Truncated);
    }
    let (s, rest) = block.split_at(len);
    *block = rest;
    if !huffman {
        return Ok(s);
    }
    buf.clear();
    recent.decode(s, buf)?;
    Ok(&buf[..])
}

/// HPACK's Huffman code in canonical form: for each code length, the first
/// code of that length, how many there are, and where their symbols start
/// in `symbols` (ordered by length, then symbol); and, for the codes of at
/// most 8 bits (most bytes of header text), a table indexed by the next 8
/// bits giving symbol and length at once.
struct Canonical {
    first: [u32; 31],
    count: [u32; 31],
    offset: [u16; 31],
    symbols: [u16; 257],
    /// (symbol, length); length 0: the code is longer than 8 bits.
    short: [(u8, u8); 256],
}

fn canonical() -> &'static Canonical {
    static CODE: OnceLock<Canonical> = OnceLock::new();
    CODE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols: [0; 257],
            short: [(0, 0); 256],
        };
        let mut order: Vec<u16> = (0..257).collect();
        order.sort_by_key(|&s| (HUFFMAN_LENGTHS[usize::from(s)], s));
        for &s in &order {
            c.count[usize::from(HUFFMAN_LENGTHS[usize::from(s)])] += 1;
        }
        let (mut code, mut at) = (0u32, 0u16);
        for len in 1..31 {
            c.first[len] = code;
            c.offset[len] = at;
            for i in 0..c.count[len] {
                let symbol = order[usize::from(at) + i as usize];
                if len <= 8 {
                    let shift = 8 - len;
                    let lo = ((code + i) << shift) as usize;
                    for e in &mut c.short[lo..lo + (1 << shift)] {
                        *e = (symbol as u8, len as u8);
                    }
                }
            }
            code = (code + c.count[len]) << 1;
            at += c.count[len] as u16;
        }
        c.symbols.copy_from_slice(&order);
        c
    })
}

/// Decodes a Huffman-coded string into `out` (RFC 7541 5.2: padding is at
/// most 7 bits, all ones; EOS inside is an error). Bits are taken from a
/// 64-bit window: a code of up to 8 bits is one table lookup, a longer one
/// is found length by length from the canonical form.
fn huffman_decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let c = canonical();
    // The next `bits` bits of input, most significant first.
    let (mut window, mut bits) = (0u64, 0u32);
    let mut rest = input;
    loop {
        while bits <= 56 {
            let Some((&b, more)) = rest.split_first() else {
                break;
            };
            window |= u64::from(b) << (56 - bits);
            bits += 8;
            rest = more;
        }
        if bits == 0 {
            return Ok(());
        }
        let (symbol, len) = c.short[(window >> 56) as usize];
        if len != 0 && u32::from(len) <= bits {
            out.push(symbol);
            window <<= len;
            bits -= u32::from(len);
            continue;
        }
        let mut found = None;
        for len in 9..=bits.min(30) as usize {
            let code = (window >> (64 - len)) as u32;
            let index = code.wrapping_sub(c.first[len]);
            if index < c.count[len] {
                found = Some((c.symbols[usize::from(c.offset[len]) + index as usize], len));
                break;
            }
        }
        match found {
            Some((256, _)) => return Err(DecodeError::BadHuffman),
            Some((symbol, len)) => {
                out.push(symbol as u8);
                window <<= len;
                bits -= len as u32;
            }
            // What is left must be padding: under a byte, all ones.
            None if rest.is_empty() && bits <= 7 && window >> (64 - bits) == (1 << bits) - 1 => {
                return Ok(());
            }
            None => return Err(DecodeError::BadHuffman),
        }
    }
}

/// Code length of each symbol of HPACK's Huffman code (RFC 7541
/// appendix B; 256 is EOS). The code is canonical, so the lengths define it.
const HUFFMAN_LENGTHS: [u8; 257] = [
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

/// HPACK's static table (RFC 7541 appendix A), from index 1.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
        let mut fields = Vec::new();
        d.decode(block, |n, v| {
            fields.push((
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            ))
        })?;
        Ok(fields)
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// RFC 7541 C.4: three requests with Huffman coding, one context.
    #[test]
    fn the_rfc_requests_with_huffman_coding_decode() {
        let mut d = Decoder::new(4096);
        let first = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        assert_eq!(
            decode_all(&mut d, &first).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        let second = hex("8286 84be 5886 a8eb 1064 9cbf");
        assert_eq!(
            decode_all(&mut d, &second).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        let third = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
        assert_eq!(
            decode_all(&mut d, &third).unwrap(),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.size, 164);
    }

    /// RFC 7541 C.6: responses with Huffman coding and a 256-byte table,
    /// so entries are evicted.
    #[test]
    fn the_rfc_responses_evict_from_a_small_table() {
        let mut d = Decoder::new(256);
        let first = hex(
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        );
        assert_eq!(
            decode_all(&mut d, &first).unwrap(),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        let second = hex("4883 640e ffc1 c0bf");
        assert_eq!(
            decode_all(&mut d, &second).unwrap()[0],
            pairs(&[(":status", "307")])[0]
        );
        assert_eq!(d.size, 222);
        let third = hex(
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        );
        let fields = decode_all(&mut d, &third).unwrap();
        assert_eq!(
            fields[5].1,
            "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
        );
        assert_eq!(d.size, 215);
    }

    /// A literal repeated on every request decodes the same from the
    /// cache, and a different one sharing nothing with it is not mixed up.
    #[test]
    fn repeated_huffman_literals_decode_the_same_from_the_cache() {
        let mut d = Decoder::new(4096);
        // Literal without indexing, :path, Huffman-coded.
        let path = b"/inference.GRPCInferenceService/ModelInfer";
        let coded = huffman_encode_for_test(path);
        let mut block = vec![0x04, 0x80 | coded.len() as u8];
        block.extend_from_slice(&coded);
        let other = huffman_encode_for_test(b"/other");
        let mut second = vec![0x04, 0x80 | other.len() as u8];
        second.extend_from_slice(&other);
        for _ in 0..6 {
            let fields = decode_all(&mut d, &block).unwrap();
            assert_eq!(fields[0].1.as_bytes(), path);
            assert_eq!(decode_all(&mut d, &second).unwrap()[0].1, "/other");
        }
    }

    /// More distinct literals than the cache holds, of different lengths,
    /// round after round: entries are overwritten in place (their buffers
    /// reused) and every literal still decodes to itself.
    #[test]
    fn a_full_cache_still_decodes_each_literal_round_after_round() {
        let mut d = Decoder::new(4096);
        let values: Vec<Vec<u8>> = (0..HuffmanCache::ENTRIES + 3)
            .map(|i| format!("/svc-{i}/{}", "m".repeat(i * 7)).into_bytes())
            .collect();
        for _ in 0..4 {
            for v in &values {
                let coded = huffman_encode_for_test(v);
                let mut block = vec![0x04, 0x80 | coded.len() as u8];
                block.extend_from_slice(&coded);
                assert_eq!(decode_all(&mut d, &block).unwrap()[0].1.as_bytes(), &v[..]);
            }
            assert_eq!(d.recent.entries.len(), HuffmanCache::ENTRIES);
        }
    }

    #[test]
    fn literals_without_huffman_are_slices_of_the_block() {
        // RFC 7541 C.2.2: literal without indexing, indexed name (:path).
        let mut d = Decoder::new(4096);
        let block = hex("040c 2f73 616d 706c 652f 7061 7468");
        assert_eq!(
            decode_all(&mut d, &block).unwrap(),
            pairs(&[(":path", "/sample/path")])
        );
        assert!(d.table.is_empty());
    }

    #[test]
    fn broken_blocks_are_errors_not_panics() {
        let mut d = Decoder::new(4096);
        for (block, error) in [
            (vec![0x80], DecodeError::BadIndex),
            (vec![0xbe], DecodeError::BadIndex),
            (vec![0x40, 0x05, b'a'], DecodeError::Truncated),
            (vec![0x0f], DecodeError::Truncated),
            (
                vec![0x7f, 0xff, 0xff, 0xff, 0xff, 0xff],
                DecodeError::Overflow,
            ),
            // A size update over what was allowed, and one after a field.
            (vec![0x3f, 0xe2, 0x1f], DecodeError::BadSizeUpdate),
            (vec![0x82, 0x20], DecodeError::BadSizeUpdate),
            // Padding that is not all ones; a whole byte of padding.
            (vec![0x00, 0x81, 0x00, 0x00], DecodeError::BadHuffman),
            (vec![0x00, 0x81, 0xff, 0x00], DecodeError::BadHuffman),
        ] {
            assert_eq!(decode_all(&mut d, &block), Err(error), "{block:x?}");
        }
    }

    /// The codes made from the lengths are RFC 7541's (a sample from
    /// appendix B), and every byte value survives coding and decoding.
    #[test]
    fn the_canonical_code_is_the_rfc_code_and_every_byte_decodes() {
        let codes = codes();
        for (symbol, code) in [
            (0, 0x1ff8),
            (10, 0x3fff_fffc),
            (48, 0x0),
            (97, 0x3),
            (122, 0x7b),
            (200, 0x3ff_ffe2),
            (255, 0x3ff_ffee),
            (256, 0x3fff_ffff),
        ] {
            assert_eq!(codes[symbol], code, "symbol {symbol}");
        }
        let all: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        huffman_decode(&huffman_encode_for_test(&all), &mut out).unwrap();
        assert_eq!(out, all);
    }

    fn codes() -> [u32; 257] {
        let c = canonical();
        let mut codes = [0u32; 257];
        for len in 1..31 {
            for i in 0..c.count[len] {
                let s = c.symbols[usize::from(c.offset[len]) + i as usize];
                codes[usize::from(s)] = c.first[len] + i;
            }
        }
        codes
    }

    /// A reference encoder from the canonical code (lengths → codes).
    fn huffman_encode_for_test(input: &[u8]) -> Vec<u8> {
        let codes = codes();
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for &b in input {
            let len = u32::from(HUFFMAN_LENGTHS[usize::from(b)]);
            acc = (acc << len) | u64::from(codes[usize::from(b)]);
            bits += len;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
        }
        out
    }
}
