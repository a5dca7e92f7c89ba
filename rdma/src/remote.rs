//! Descriptors of remote registered memory, as they travel in OIP request
//! parameters.

use crate::RdmaError;

/// A range of a peer's registered memory: what one-sided READ and WRITE
/// target.
///
/// The `rkey` is a capability: whoever holds it (and a connection to the
/// owner) may access `[addr, addr + len)` within the access the owner
/// granted. A `RemoteBuffer` always satisfies `addr + len <= u64::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteBuffer {
    addr: u64,
    len: u64,
    rkey: u32,
}

impl RemoteBuffer {
    /// A descriptor for `[addr, addr + len)` under `rkey`; `OutOfBounds` when
    /// the end overflows `u64`.
    pub fn new(addr: u64, len: u64, rkey: u32) -> Result<Self, RdmaError> {
        if addr.checked_add(len).is_none() {
            return Err(RdmaError::OutOfBounds {
                addr,
                len,
                reason: "addr + len overflows u64",
            });
        }
        Ok(RemoteBuffer { addr, len, rkey })
    }

    /// The remote start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The sub-range `[offset, offset + len)` of this buffer.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self, RdmaError> {
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > self.len) {
            return Err(RdmaError::OutOfBounds {
                addr: self.addr.wrapping_add(offset),
                len,
                reason: "slice outside the remote buffer",
            });
        }
        Ok(RemoteBuffer {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }

    /// The OIP parameter form: `addr:len:rkey`, each lowercase hexadecimal
    /// without prefix or leading zeros (e.g. `7f3a2c000000:1000:2a`).
    pub fn to_param_string(&self) -> String {
        format!("{:x}:{:x}:{:x}", self.addr, self.len, self.rkey)
    }

    /// Parses [`to_param_string`](Self::to_param_string)'s form, strictly:
    /// exactly three fields; lowercase hex digits only (no `0x`, sign,
    /// whitespace or leading zeros, so every descriptor has one spelling);
    /// at most 16 digits for `addr` and `len`, 8 for `rkey`; and `addr + len`
    /// must not overflow.
    pub fn parse(s: &str) -> Result<Self, RdmaError> {
        let invalid = |reason| RdmaError::InvalidDescriptor {
            input: s.chars().take(64).collect(),
            reason,
        };
        let mut fields = s.split(':');
        let (Some(addr), Some(len), Some(rkey), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(invalid("expected three fields addr:len:rkey"));
        };
        let addr = parse_hex(addr, 16).map_err(invalid)?;
        let len = parse_hex(len, 16).map_err(invalid)?;
        let rkey = parse_hex(rkey, 8).map_err(invalid)?;
        let rkey = u32::try_from(rkey).map_err(|_| invalid("rkey exceeds 32 bits"))?;
        if addr.checked_add(len).is_none() {
            return Err(invalid("addr + len overflows u64"));
        }
        Ok(RemoteBuffer { addr, len, rkey })
    }
}

impl std::fmt::Display for RemoteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_param_string())
    }
}

impl std::str::FromStr for RemoteBuffer {
    type Err = RdmaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RemoteBuffer::parse(s)
    }
}

fn parse_hex(field: &str, max_digits: usize) -> Result<u64, &'static str> {
    if field.is_empty() {
        return Err("empty field");
    }
    if field.len() > max_digits {
        return Err("field has too many digits");
    }
    if !field
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err("fields must be lowercase hexadecimal digits");
    }
    if field.len() > 1 && field.starts_with('0') {
        return Err("leading zeros are not allowed");
    }
    u64::from_str_radix(field, 16).map_err(|_| "field is not a hexadecimal number")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn param_string_round_trips(addr in any::<u64>(), len in any::<u64>(), rkey in any::<u32>()) {
            match RemoteBuffer::new(addr, len, rkey) {
                Ok(buf) => {
                    let s = buf.to_param_string();
                    prop_assert_eq!(RemoteBuffer::parse(&s).unwrap(), buf);
                }
                Err(_) => prop_assert!(addr.checked_add(len).is_none()),
            }
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical(s in "[0-9a-fA-Fx: +-]{0,40}") {
            if let Ok(buf) = RemoteBuffer::parse(&s) {
                prop_assert_eq!(buf.to_param_string(), s);
            }
        }
    }

    #[test]
    fn rejects_malformed_strings() {
        for bad in [
            "",
            "1:2",
            "1:2:3:4",
            "1::3",
            ":2:3",
            "1:2:",
            "0x10:2:3",
            "10:2:0x3",
            "1A:2:3",
            "-1:2:3",
            "+1:2:3",
            " 1:2:3",
            "1:2:3 ",
            "01:2:3",
            "1:02:3",
            "1:2:03",
            "1:2:100000000",
            "10000000000000000:1:1",
            "1:10000000000000000:1",
            "ffffffffffffffff:1:1",
            "8000000000000000:8000000000000000:1",
            "g:1:1",
            "1:2:3\n",
            "１:2:3",
        ] {
            assert!(
                matches!(
                    RemoteBuffer::parse(bad),
                    Err(RdmaError::InvalidDescriptor { .. })
                ),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn accepts_edges() {
        let b = RemoteBuffer::parse("0:0:0").unwrap();
        assert_eq!((b.addr(), b.len(), b.rkey()), (0, 0, 0));
        let b = RemoteBuffer::parse("ffffffffffffffff:0:ffffffff").unwrap();
        assert_eq!((b.addr(), b.len(), b.rkey()), (u64::MAX, 0, u32::MAX));
        let b = RemoteBuffer::parse("0:ffffffffffffffff:1").unwrap();
        assert_eq!(b.len(), u64::MAX);
    }

    #[test]
    fn slice_checks_bounds() {
        let b = RemoteBuffer::new(0x1000, 0x100, 7).unwrap();
        assert_eq!(
            b.slice(0x10, 0x20).unwrap(),
            RemoteBuffer::new(0x1010, 0x20, 7).unwrap()
        );
        assert!(b.slice(0x100, 0).is_ok());
        assert!(b.slice(0xf0, 0x11).is_err());
        assert!(b.slice(u64::MAX, 2).is_err());
    }
}
