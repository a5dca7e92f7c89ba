//! A queue of byte chunks that keeps its first chunk inline.
//!
//! A stream's request or response body is mostly one DATA frame, and a
//! `VecDeque` per stream allocated (and grew into) a buffer for it: four
//! allocations per request the agent relays (its client's stream and its
//! worker's, each way), about 1k instructions at concurrency 1
//! (callgrind; BENCHMARKS.md). Chunks after the first go to a `VecDeque`
//! as before.

use std::collections::VecDeque;

use bytes::Bytes;

/// See the module docs. Invariant: `rest` is empty while `first` is.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Chunks {
    pub(crate) fn push_back(&mut self, chunk: Bytes) {
        if self.first.is_none() {
            self.first = Some(chunk);
        } else {
            self.rest.push_back(chunk);
        }
    }

    pub(crate) fn pop_front(&mut self) -> Option<Bytes> {
        let front = self.first.take();
        if front.is_some() {
            self.first = self.rest.pop_front();
        }
        front
    }

    pub(crate) fn front_mut(&mut self) -> Option<&mut Bytes> {
        self.first.as_mut()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Bytes> {
        self.first.iter().chain(&self.rest)
    }

    pub(crate) fn clear(&mut self) {
        self.first = None;
        self.rest.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In order, whether the chunks fit inline or not, and empty again
    /// after the last one or a clear.
    #[test]
    fn chunks_come_out_in_the_order_they_went_in() {
        let mut q = Chunks::default();
        assert!(q.is_empty());
        for round in 0..2 {
            for i in 0..4u8 {
                q.push_back(Bytes::from(vec![i; usize::from(i) + 1]));
            }
            assert_eq!(q.iter().map(Bytes::len).collect::<Vec<_>>(), [1, 2, 3, 4]);
            if round == 0 {
                for i in 0..4u8 {
                    assert_eq!(q.front_mut().map(|b| b[0]), Some(i));
                    assert_eq!(q.pop_front().map(|b| b.len()), Some(usize::from(i) + 1));
                }
                assert_eq!(q.pop_front(), None);
            } else {
                q.clear();
            }
            assert!(q.is_empty());
            assert_eq!(q.iter().count(), 0);
        }
    }
}
