//! The HPACK decoder (`infermesh_http2::hpack::Decoder`) against
//! `loona-hpack`'s, differentially (issue 24: "the HPACK decoder
//! differentially against a reference decoder"): sequences of header
//! blocks on one context, built from valid and invalid representations
//! (`block`) and plain arbitrary bytes, a fixed number of cases each so
//! CI's run is bounded. Longer runs: the `hpack_differential` cargo-fuzz
//! target in `fuzz/`, which shares `compare.rs`.

mod block;
mod compare;
mod huffman_code;

use compare::{Pair, Verdict};
use proptest::collection::vec;
use proptest::prelude::*;

/// Decodes `blocks` in order on one context with both decoders, until
/// both reject one (the connection would end there).
fn decode_alike(blocks: &[Vec<u8>]) -> Result<(), TestCaseError> {
    let mut pair = Pair::default();
    for block in blocks {
        match pair.block(block) {
            Ok(Verdict::Accepted(_)) => {}
            Ok(Verdict::Rejected | Verdict::RejectedStricter(_) | Verdict::AcceptedLooser(_)) => {
                break;
            }
            Err(diff) => return Err(TestCaseError::fail(diff)),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn built_blocks_decode_alike(blocks in vec(block::block(), 1..8)) {
        let blocks: Vec<Vec<u8>> = blocks.iter().map(|b| block::encode(b)).collect();
        decode_alike(&blocks)?;
    }

    #[test]
    fn arbitrary_bytes_decode_alike(blocks in vec(vec(any::<u8>(), 0..64), 1..6)) {
        decode_alike(&blocks)?;
    }
}

#[test]
fn the_test_huffman_encoder_matches_rfc_7541() {
    // Appendix C.4.1 and C.4.2.
    assert_eq!(
        huffman_code::encode(b"www.example.com"),
        [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff
        ]
    );
    assert_eq!(
        huffman_code::encode(b"no-cache"),
        [0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]
    );
}

#[test]
fn rfc_7541_request_examples_decode_alike() {
    // Appendix C.4: three requests with Huffman coding on one context.
    let blocks: [&[u8]; 3] = [
        &[
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
        ],
        &[
            0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
        ],
        &[
            0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
            0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
        ],
    ];
    let mut pair = Pair::default();
    let mut last = Vec::new();
    for block in blocks {
        match pair.block(block) {
            Ok(Verdict::Accepted(fields)) => last = fields,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(last[4], (b"custom-key".to_vec(), b"custom-value".to_vec()));
}

#[test]
fn a_size_update_after_a_field_is_ours_to_reject() {
    // loona-hpack takes it; RFC 7541 4.2 does not.
    let mut pair = Pair::default();
    assert!(matches!(
        pair.block(&[0x82, 0x3f, 0x61, 0x84]),
        Ok(Verdict::RejectedStricter(_))
    ));
}
