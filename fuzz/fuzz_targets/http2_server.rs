//! Bytes from libFuzzer as a run of `infermesh_http2::server::Conn` (issue 24):
//! the frames its peer sends, split across reads, interleaved with what
//! its user does, every invariant checked after every step. The harness is
//! the one the property test `http2/tests/server_frames.rs` runs in CI
//! (`http2/tests/harness/`); a crash input replays with
//! `HARNESS_ROLE=server HARNESS_INPUT=path cargo test -p infermesh-http2 --test replay -- --ignored`.
#![no_main]

#[path = "../../http2/tests/harness/mod.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::server::Run::run(data);
});
