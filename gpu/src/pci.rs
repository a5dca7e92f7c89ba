//! PCI addresses, to match the kernel log's Xid lines to NVML's devices.
//!
//! NVML names a device `00000000:3B:00.0` (eight-digit domain, upper-case
//! hex, with the function); the driver's Xid lines say `PCI:0000:3b:00`
//! (four-digit domain, lower case, no function). Both reduce to the same
//! (domain, bus, device) triple; the function is left out because the
//! kernel log does not give it and a GPU is function 0.

use std::fmt;

/// A PCI device address without its function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number on the bus.
    pub device: u8,
}

impl PciAddress {
    /// Parses `[PCI:][domain:]bus:device[.function]` in hex, as NVML, sysfs
    /// and the driver's log lines write it; `None` if it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix("PCI:").unwrap_or(text);
        let mut parts: Vec<&str> = text.split(':').collect();
        if !(2..=3).contains(&parts.len()) {
            return None;
        }
        let last = parts.pop()?;
        let device = last.split_once('.').map_or(last, |(d, _function)| d);
        let bus = parts.pop()?;
        let domain = parts.pop().unwrap_or("0");
        let hex = |s: &str, max_digits: usize| {
            (!s.is_empty() && s.len() <= max_digits && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some(Self {
            domain: hex(domain, 8)?,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok()?,
        })
    }
}

impl fmt::Display for PciAddress {
    /// The kernel log's form, `0000:3b:00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_sysfs_and_kernel_log_forms_are_the_same_device() {
        let nvml = PciAddress::parse("00000000:3B:00.0").unwrap();
        let sysfs = PciAddress::parse("0000:3b:00.0").unwrap();
        let nvrm = PciAddress::parse("PCI:0000:3b:00").unwrap();
        assert_eq!(nvml, sysfs);
        assert_eq!(nvml, nvrm);
        assert_eq!(
            nvml,
            PciAddress {
                domain: 0,
                bus: 0x3b,
                device: 0
            }
        );
        assert_eq!(nvml.to_string(), "0000:3b:00");
        assert_eq!(PciAddress::parse("06:00").unwrap().bus, 6);
    }

    #[test]
    fn rejects_what_is_not_an_address() {
        for bad in [
            "",
            "PCI:",
            "0000",
            "zz:00",
            "0000:100:00",
            "0000:00:00:00:00",
            "123456789:00:00",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }
}
