//! h2spec `hpack/`: header blocks that break RFC 7541 (bad indexes, bad
//! Huffman padding, misplaced or oversized table size updates), each a
//! connection error COMPRESSION_ERROR.

use super::conn::Conn;
use super::frame::{Headers, code, setting};
use super::{Case, Verdict, group, verify};

/// Sends a GET whose block is the encoded common headers followed by
/// `after`, and expects COMPRESSION_ERROR.
fn bad_block(c: &mut Conn, after: &[u8]) -> Verdict {
    c.handshake()?;
    let mut block = c.encode(&c.common_headers());
    block.extend_from_slice(after);
    c.write_headers(Headers {
        stream: 1,
        block,
        end_stream: true,
        end_headers: true,
        ..Default::default()
    });
    verify::connection_error(c, &[code::COMPRESSION_ERROR])
}

/// A dynamic table size update to `size` (RFC 7541 §6.3: 001 + 5-bit
/// prefix integer).
pub(crate) fn table_size_update(size: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let k = (1 << 5) - 1;
    if size < k {
        out.push(size as u8);
    } else {
        out.push(k as u8);
        let mut rest = size - k;
        while rest >= 128 {
            out.push(0x80 | (rest & 0x7f) as u8);
            rest >>= 7;
        }
        out.push(rest as u8);
    }
    out[0] |= 0x20;
    out
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "hpack/2.3.3")
        .case(
            "Sends a indexed header field representation with invalid index",
            |c| bad_block(c, b"\xc6"),
        )
        .case(
            "Sends a literal header field representation with invalid index",
            |c| bad_block(c, b"\x7f\x07\x00"),
        );

    group(all, "hpack/4.2").case(
        "Sends a dynamic table size update at the end of header block",
        |c| bad_block(c, b"\x21"),
    );

    group(all, "hpack/5.2")
        .case(
            "Sends a Huffman-encoded string literal representation with padding longer than 7 bits",
            |c| bad_block(c, b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff"),
        )
        .case(
            "Sends a Huffman-encoded string literal representation padded by zero",
            |c| bad_block(c, b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90"),
        )
        .case(
            "Sends a Huffman-encoded string literal representation containing the EOS symbol",
            |c| {
                bad_block(
                    c,
                    b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f",
                )
            },
        );

    group(all, "hpack/6.1").case(
        "Sends a indexed header field representation with index 0",
        |c| bad_block(c, b"\x80"),
    );

    group(all, "hpack/6.3").case(
        "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE",
        |c| {
            // The update comes first in the block.
            c.handshake()?;
            let max = c
                .settings
                .get(&setting::HEADER_TABLE_SIZE)
                .copied()
                .unwrap_or(4096);
            let mut block = table_size_update(u64::from(max) + 1);
            block.extend(c.encode(&c.common_headers()));
            c.write_headers(Headers {
                stream: 1,
                block,
                end_stream: true,
                end_headers: true,
                ..Default::default()
            });
            verify::connection_error(c, &[code::COMPRESSION_ERROR])
        },
    );
}

#[cfg(test)]
mod tests {
    use super::table_size_update;

    #[test]
    fn table_size_updates_match_h2spec_bytes() {
        // generic/5/15 sends these literally: 128, then 4096.
        assert_eq!(table_size_update(128), b"\x3f\x61");
        assert_eq!(table_size_update(4096), b"\x3f\xe1\x1f");
        assert_eq!(table_size_update(1), b"\x21");
    }
}
