//! HPACK (RFC 7541): the decoder both connection roles read header blocks
//! with, and the encoding of the blocks they write.

pub mod decode;
pub mod encode;

pub use decode::{DecodeError, Decoder};
pub use encode::Indexer;
