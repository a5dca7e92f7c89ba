//! A sans-IO HTTP/2 codec (RFC 9113, RFC 7541): both connection roles
//! without I/O, for the agent's hop between its clients and its workers.
//!
//! Bytes read go in, bytes to write come out ([`Out`]), and each side's
//! streams are polled by whoever handles them; no clock is read and no
//! task is spawned here. [`server::Conn`] serves a client's requests;
//! [`client::Conn`] sends unary gRPC requests to a server. Frames are
//! read and written by [`frame`], header blocks decoded and encoded by
//! [`hpack`].
//!
//! Written rather than taken from `h2` because it halves the instructions
//! per request of the hop (docs/DECISIONS.md); the price is holding it to
//! `h2`'s and nghttp2's standard: the h2spec cases against it and against
//! nghttpd (`tests/tests/h2_conformance.rs`), fuzzing, and every limit
//! either library sets against a hostile peer, listed in this crate's
//! README with the attack each one stops.

#![forbid(unsafe_code)]

mod chunks;
pub mod client;
mod connection;
pub mod fields;
pub mod frame;
pub mod hpack;
pub mod limits;
pub mod out;
pub mod request;
pub mod server;
pub mod stream_map;

pub use frame::{code, flag, kind, setting};
pub use limits::Limits;
pub use out::Out;
pub use stream_map::StreamMap;
