//! The stream table of a connection.

/// Streams by id, hashed cheaply: ids are small integers chosen by the
/// peer, and a stream table is bounded by the connection's stream limit.
pub type StreamMap<V> =
    std::collections::HashMap<u32, V, std::hash::BuildHasherDefault<StreamIdHasher>>;

/// Fibonacci hashing of a stream id (see [`StreamMap`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamIdHasher(u64);

impl std::hash::Hasher for StreamIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
