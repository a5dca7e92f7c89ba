//! Header blocks built representation by representation on one
//! connection's table (`harness::hpack_block`: both tables, every literal
//! kind, Huffman on and off, size updates, evicting values) must decode,
//! with the crate's decoder and loona-hpack's alike, to the fields they
//! were built from; such blocks cut short or with a bit flipped, and
//! arbitrary bytes, must make both decoders agree. This complements
//! `tests/hpack_differential/` (the decoders against each other on blocks
//! of its own), which holds the list of their documented differences.
//!
//! CI runs a fixed number of cases from a fixed seed. A long run:
//! `PROPTEST_CASES=100000 PROPTEST_RNG_SEED=$RANDOM cargo test --release -p infermesh-http2 --test hpack_built_blocks`.

mod harness;

use harness::hpack_block::{BlockBuilder, Differential, put_str};
use harness::input::Input;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    Config {
        cases: 200,
        rng_seed: RngSeed::Fixed(24),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn built_blocks_and_their_mutations(data in vec(any::<u8>(), 0..2000)) {
        harness::hpack_block::differential(&data);
    }
}

/// The builder's own Huffman coder and table model are right: a block of
/// each kind decodes, with both decoders, to the fields it was built from
/// (RFC 7541 C.4.1's first request, Huffman-coded, as a fixed point).
#[test]
fn built_blocks_decode_to_what_they_were_built_from() {
    let mut block = vec![0x82, 0x86, 0x84, 0x41];
    put_str(&mut block, b"www.example.com", true);
    assert_eq!(
        block,
        [
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff
        ]
    );
    let mut diff = Differential::default();
    let want = vec![
        (b":method".to_vec(), b"GET".to_vec()),
        (b":scheme".to_vec(), b"http".to_vec()),
        (b":path".to_vec(), b"/".to_vec()),
        (b":authority".to_vec(), b"www.example.com".to_vec()),
    ];
    diff.block(&block, Some(Some(&want))).unwrap();

    // Blocks from a fixed input, a new connection after each refused one.
    let seed: Vec<u8> = (0..20_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let mut input = Input::new(&seed);
    let (mut builder, mut diff) = (BlockBuilder::default(), Differential::default());
    let (mut blocks, mut fields_seen) = (0, 0);
    while !input.is_empty() {
        if diff.ended {
            (builder, diff) = (BlockBuilder::default(), Differential::default());
        }
        let (block, fields) = builder.block(&mut input);
        diff.block(&block, Some(fields.as_ref())).unwrap();
        blocks += 1;
        fields_seen += fields.map_or(0, |f| f.len());
    }
    assert!(
        blocks > 100 && fields_seen > 300,
        "{blocks} blocks, {fields_seen} fields"
    );
}
