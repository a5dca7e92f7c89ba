//! [`Layout`]: where one request's tensors lie in its region — each input
//! at a 64-byte-aligned offset, then one window per requested output.
//!
//! Used both when the client library copies a request's inline inputs into
//! a region ([`ShmTransport::stage`](super::ShmTransport)) and when a caller
//! leases a region to build them in place: the same layout, so the two
//! paths send the same references.

/// Alignment of every tensor in a region: a cache line, and enough for any
/// element type (the mapping itself is page-aligned).
pub const TENSOR_ALIGN: u64 = 64;

/// A byte range of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Offset from the start of the region.
    pub offset: u64,
    /// Bytes in the window.
    pub len: u64,
}

/// Windows of a request's inputs and outputs in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// One per input, in input order (an empty input gets an empty window).
    pub inputs: Vec<Window>,
    /// One per requested output, in output order.
    pub outputs: Vec<Window>,
    /// Bytes the region must hold.
    pub len: u64,
}

/// `n` rounded up to [`TENSOR_ALIGN`] (saturating).
fn align(n: u64) -> u64 {
    n.saturating_add(TENSOR_ALIGN - 1) & !(TENSOR_ALIGN - 1)
}

impl Layout {
    /// Inputs of `inputs` bytes each, then output windows of `outputs`
    /// bytes each, every one 64-byte aligned. Sizes that overflow saturate
    /// to a length no region can hold (the lease then fails).
    pub fn new(
        inputs: impl IntoIterator<Item = u64>,
        outputs: impl IntoIterator<Item = u64>,
    ) -> Self {
        let mut cursor = 0u64;
        let mut place = |len: u64| {
            let w = Window {
                offset: cursor,
                len,
            };
            cursor = align(cursor.saturating_add(len));
            w
        };
        let inputs = inputs.into_iter().map(&mut place).collect();
        let outputs = outputs.into_iter().map(&mut place).collect();
        Self {
            inputs,
            outputs,
            len: cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_and_disjoint() {
        let l = Layout::new([10, 0, 64], [100]);
        let offsets: Vec<u64> = l
            .inputs
            .iter()
            .chain(&l.outputs)
            .map(|w| w.offset)
            .collect();
        assert_eq!(offsets, [0, 64, 64, 128]);
        assert_eq!(l.len, 256);
        assert!(offsets.iter().all(|o| o % TENSOR_ALIGN == 0));
        let huge = Layout::new([u64::MAX, 1], []);
        assert!(
            huge.len >= u64::MAX - TENSOR_ALIGN,
            "saturates: no region fits"
        );
    }
}
