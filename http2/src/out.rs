//! The bytes a connection has to write.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

/// Payloads up to this size are copied next to their frame header (one
/// write); larger ones are written from their own buffer.
const COPY_BELOW: usize = 1024;

/// Bytes waiting to be written: small frames gathered in one buffer, large
/// payloads kept as they are.
#[derive(Debug, Default)]
pub struct Out {
    chunks: VecDeque<Bytes>,
    /// Bytes in `chunks`.
    chunked: usize,
    tail: BytesMut,
}

impl Out {
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.chunked + self.tail.len()
    }

    /// The buffer frames are written into.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// A frame's payload, after its header: copied next to it when small,
    /// else kept as it is.
    pub fn payload(&mut self, data: Bytes) {
        if data.len() < COPY_BELOW {
            self.tail.extend_from_slice(&data);
        } else {
            if !self.tail.is_empty() {
                self.chunked += self.tail.len();
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.chunked += data.len();
            self.chunks.push_back(data);
        }
    }

    /// Up to `slices.len()` buffers to write, in order; how many.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let bufs = self.chunks.iter().map(|c| &c[..]);
        for c in bufs.chain(std::iter::once(&self.tail[..])) {
            if n == slices.len() {
                break;
            }
            if !c.is_empty() {
                slices[n] = IoSlice::new(c);
                n += 1;
            }
        }
        n
    }

    /// Drops the first `n` bytes (written).
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            match self.chunks.front_mut() {
                Some(c) if c.len() <= n => {
                    n -= c.len();
                    self.chunked -= c.len();
                    self.chunks.pop_front();
                }
                Some(c) => {
                    c.advance(n);
                    self.chunked -= n;
                    return;
                }
                None => {
                    self.tail.advance(n);
                    return;
                }
            }
        }
    }
}
