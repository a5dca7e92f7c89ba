//! Frame-sequence fuzzing of both connection roles and the HPACK decoder,
//! as `h2` fuzzes its codec: a run is decoded from bytes (so that the
//! property tests, which draw the bytes from a fixed seed, and the
//! `cargo fuzz` targets in `fuzz/`, which take them from libFuzzer, drive
//! the same code) into frames a peer sends, split across reads at random,
//! interleaved with what the connection's user does; after every step the
//! invariants are checked.
//!
//! The output is read back with a frame parser and HPACK decoder written
//! apart from the crate ([`wire`], loona-hpack), so that a bug shared by
//! the crate's writer and reader is not hidden.
//!
//! Included by the integration tests of this directory and, by path, by
//! the fuzz targets: it uses the crate's public API only.

#![allow(dead_code)]

pub mod client;
pub mod hpack_block;
pub mod input;
pub mod server;
pub mod wire;
