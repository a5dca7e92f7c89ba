//! The HPACK decoder against loona-hpack's on arbitrary header blocks, one
//! context per input: the input's first byte is how many blocks it holds
//! (1–4), split evenly. Both must accept a block with the same fields or
//! both reject it, except where `compare.rs` names a difference (a rule of
//! RFC 7541 loona-hpack does not check, or one of its own). The CI-sized
//! property test of the same comparison is
//! `http2/tests/hpack_differential`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../http2/tests/hpack_differential/compare.rs"]
mod compare;

use compare::{Pair, Verdict};

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 4) + 1;
    let size = rest.len().div_ceil(n).max(1);
    let mut pair = Pair::default();
    for block in rest.chunks(size) {
        match pair.block(block) {
            Ok(Verdict::Accepted(_)) => {}
            Ok(_) => break,
            Err(diff) => panic!("{diff}"),
        }
    }
});
