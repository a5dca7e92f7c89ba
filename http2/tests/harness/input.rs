//! Choices read from fuzz bytes, as `arbitrary`'s `Unstructured` does:
//! every read succeeds, with zeros once the bytes run out (so a short input
//! is a short run, not a failure to decode).

/// The bytes a run is decoded from.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let raw = if n <= 256 {
            usize::from(self.u8())
        } else if n <= 65_536 {
            usize::from(self.u16())
        } else {
            self.u32() as usize
        };
        raw % n
    }

    /// Up to `max` bytes, as many as the next choice says.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1).min(self.data.len());
        let (taken, rest) = self.data.split_at(n);
        self.data = rest;
        taken.to_vec()
    }

    /// One of `choices`, by weight: index into it.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut pick = (self.u16() as u32) % total;
        for (i, &w) in weights.iter().enumerate() {
            if pick < w {
                return i;
            }
            pick -= w;
        }
        weights.len() - 1
    }
}
