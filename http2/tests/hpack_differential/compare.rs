//! One HPACK decoding context held twice: by `infermesh_http2::hpack`'s
//! decoder and by `loona-hpack`'s (a decoder we did not write), fed the
//! same header blocks in order. Both must accept a block with the same
//! fields, or both reject it (after which the connection is over), so the
//! dynamic tables stay alike block after block.
//!
//! Also included by the `hpack_differential` cargo-fuzz target
//! (`fuzz/fuzz_targets/hpack_differential.rs`): keep it free of anything
//! but the two decoders.

/// Header fields as decoded.
pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The table size both decoders allow (SETTINGS_HEADER_TABLE_SIZE).
pub const TABLE_SIZE: usize = 4096;

/// How one block went.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Both decoded it to these fields.
    Accepted(Fields),
    /// Both rejected it: the connection would end.
    Rejected,
    /// Ours rejected a block loona-hpack accepts, for a reason RFC 7541
    /// gives and loona-hpack does not check: the connection would end.
    RejectedStricter(&'static str),
    /// Ours accepted a block loona-hpack rejects for a rule of its own,
    /// not RFC 7541's; the contexts may differ from here on.
    AcceptedLooser(&'static str),
}

/// The two decoders.
pub struct Pair {
    ours: infermesh_http2::hpack::Decoder,
    reference: loona_hpack::Decoder<'static>,
}

impl Default for Pair {
    fn default() -> Self {
        let mut reference = loona_hpack::Decoder::new();
        reference.set_max_allowed_table_size(TABLE_SIZE);
        Pair {
            ours: infermesh_http2::hpack::Decoder::new(TABLE_SIZE),
            reference,
        }
    }
}

impl Pair {
    /// Decodes `block` with both; `Err` says how they differ.
    pub fn block(&mut self, block: &[u8]) -> Result<Verdict, String> {
        let mut ours = Vec::new();
        let ours = self
            .ours
            .decode(block, |n, v| ours.push((n.to_vec(), v.to_vec())))
            .map(|()| ours);
        let reference = self.reference.decode(block);
        match (ours, reference) {
            (Ok(a), Ok(b)) if a == b => Ok(Verdict::Accepted(a)),
            (Err(_), Err(_)) => Ok(Verdict::Rejected),
            (Err(e), Ok(_)) => match stricter(block) {
                Some(why) => Ok(Verdict::RejectedStricter(why)),
                None => Err(format!(
                    "ours rejected ({e}), loona-hpack accepted: {block:02x?}"
                )),
            },
            (Ok(a), Err(loona_hpack::decoder::DecoderError::SizeUpdateAtEnd)) if a.is_empty() => {
                // A block of size updates only: each is at the block's
                // start as RFC 7541 4.2 asks; loona-hpack refuses any block
                // whose last representation is one.
                Ok(Verdict::AcceptedLooser(
                    "a block of dynamic table size updates only",
                ))
            }
            (Ok(a), Err(e)) => Err(format!(
                "ours accepted {a:?}, loona-hpack rejected ({e:?}): {block:02x?}"
            )),
            (Ok(a), Ok(b)) => Err(format!(
                "fields differ: ours {a:?}, loona-hpack {b:?}: {block:02x?}"
            )),
        }
    }
}

/// Why RFC 7541 rejects `block` where loona-hpack does not look: a dynamic
/// table size update after the block's first field (§4.2: it must come
/// first). Found by walking the representations' lengths only.
fn stricter(block: &[u8]) -> Option<&'static str> {
    let mut b = block;
    let mut after_field = false;
    while let Some(&first) = b.first() {
        if first & 0x80 != 0 {
            integer(&mut b, 7)?;
        } else if first & 0xc0 == 0x40 {
            literal(&mut b, 6)?;
        } else if first & 0xe0 == 0x20 {
            if after_field {
                return Some("a dynamic table size update after a field (RFC 7541 4.2)");
            }
            integer(&mut b, 5)?;
            continue;
        } else {
            literal(&mut b, 4)?;
        }
        after_field = true;
    }
    None
}

/// Skips a literal field: name index or string, then value string.
fn literal(b: &mut &[u8], prefix: u8) -> Option<()> {
    if integer(b, prefix)? == 0 {
        string(b)?;
    }
    string(b)
}

fn string(b: &mut &[u8]) -> Option<()> {
    let len = integer(b, 7)?;
    *b = b.get(len..)?;
    Some(())
}

/// An integer with a `prefix`-bit prefix (RFC 7541 5.1).
fn integer(b: &mut &[u8], prefix: u8) -> Option<usize> {
    let (&first, mut rest) = b.split_first()?;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value == max {
        let mut shift = 0;
        loop {
            let (&byte, more) = rest.split_first()?;
            rest = more;
            value = value.checked_add(usize::from(byte & 0x7f).checked_shl(shift)?)?;
            shift += 7;
            if byte & 0x80 == 0 || shift > 56 {
                break;
            }
        }
    }
    *b = rest;
    Some(value)
}
