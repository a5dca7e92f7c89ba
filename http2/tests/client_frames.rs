//! Frame sequences from a worker into `client::Conn`, with the invariants
//! of `harness::client` checked after every step (see `harness/mod.rs`).
//!
//! CI runs a fixed number of cases from a fixed seed. A long run:
//! `PROPTEST_CASES=100000 PROPTEST_RNG_SEED=$RANDOM cargo test --release -p infermesh-http2 --test client_frames`
//! (or the `http2_client` cargo-fuzz target).

mod harness;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    Config {
        cases: 300,
        rng_seed: RngSeed::Fixed(24),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn client_frame_sequences(data in vec(any::<u8>(), 0..6000)) {
        harness::client::Run::run(&data);
    }
}
