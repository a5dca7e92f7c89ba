//! The NVIDIA driver's Xid lines in the kernel log, parsed.
//!
//! NVML's Xid event says which GPU and which Xid, but not which process:
//! the driver's log line does. Its forms, by driver generation:
//!
//! ```text
//! NVRM: Xid (PCI:0000:00:06): 31, pid=3323, name=python3, channel 0x0000000a, intr 00000000. MMU Fault: ...
//! NVRM: Xid (PCI:0000:86:00): 31, pid=23599, Ch 00000008, intr 10000000. MMU Fault: ...
//! NVRM: Xid (PCI:0000:0b:00): 31, Ch 00000008, intr 10000000. MMU Fault: ...
//! NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
//! ```
//!
//! Read from `/dev/kmsg` a record starts with `prio,seq,usec,flags;` and
//! may carry continuation lines (` SUBSYSTEM=pci`); from `dmesg` or a
//! journal it starts with a timestamp or a syslog header. The parser looks
//! for `NVRM: Xid (` wherever it is on the first line, so every form
//! parses, and NVSwitch `SXid` lines do not. The pid is the kernel's
//! (thread) id in the host's pid namespace, or absent (older drivers,
//! `'<unknown>'`, or 0 for the driver's own context).

use crate::pci::PciAddress;

/// The marker of an Xid line.
const MARKER: &str = "NVRM: Xid (";

/// Longest detail kept, in bytes.
const MAX_DETAIL: usize = 256;

/// One Xid as the driver logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelXid {
    /// The GPU's PCI address.
    pub pci: PciAddress,
    /// The Xid code.
    pub xid: u32,
    /// The process (thread) the driver blamed, when it named one.
    pub pid: Option<u32>,
    /// Its command name as the driver printed it, when known.
    pub process: Option<String>,
    /// The rest of the line (channel, fault type, ...), shortened.
    pub detail: String,
}

impl KernelXid {
    /// Parses one kernel log record or line; `None` unless it is an Xid.
    pub fn parse(record: &str) -> Option<Self> {
        let line = record.lines().next()?;
        let rest = &line[line.find(MARKER)? + MARKER.len()..];
        let (address, rest) = rest.split_once(')')?;
        let pci = PciAddress::parse(address)?;
        let rest = rest.strip_prefix(':')?.trim_start();
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let xid: u32 = rest[..digits].parse().ok()?;
        let mut rest = rest[digits..].trim_start();
        if !(rest.is_empty() || rest.starts_with(',')) {
            return None;
        }
        let (mut pid, mut process) = (None, None);
        // `pid=` and `name=` lead the detail on drivers that print them.
        loop {
            let field = rest.trim_start_matches(',').trim_start();
            let (value, after) = match field.split_once(", ") {
                Some((v, a)) => (v, a),
                None => (field, ""),
            };
            if let Some(p) = value.strip_prefix("pid=") {
                pid = p.parse::<u32>().ok().filter(|&p| p != 0);
            } else if let Some(n) = value.strip_prefix("name=") {
                process = Some(n.to_string()).filter(|n| !n.is_empty() && n != "<unknown>");
            } else {
                rest = field;
                break;
            }
            rest = after;
        }
        Some(Self {
            pci,
            xid,
            pid,
            process,
            detail: shorten(rest.trim()),
        })
    }
}

fn shorten(text: &str) -> String {
    if text.len() <= MAX_DETAIL {
        return text.to_string();
    }
    let mut end = MAX_DETAIL;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci(bus: u8, device: u8) -> PciAddress {
        PciAddress {
            domain: 0,
            bus,
            device,
        }
    }

    #[test]
    fn the_h100_line_of_issue_25_names_the_thread() {
        // As an H100 (driver 580) logged it for a wild-pointer store.
        let line = "NVRM: Xid (PCI:0000:00:06): 31, pid=3323, name=python3, channel 0x0000000a, \
                    intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_00000000. \
                    Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE";
        let x = KernelXid::parse(line).unwrap();
        assert_eq!(x.pci, pci(0, 6));
        assert_eq!(x.xid, 31);
        assert_eq!(x.pid, Some(3323));
        assert_eq!(x.process.as_deref(), Some("python3"));
        assert!(
            x.detail
                .starts_with("channel 0x0000000a, intr 00000000. MMU Fault"),
            "{}",
            x.detail
        );
    }

    #[test]
    fn kmsg_records_dmesg_and_syslog_lines_parse_alike() {
        let kmsg = "4,1437,123456789012,-;NVRM: Xid (PCI:0000:00:06): 43, pid=3323, name=python3, Ch 00000008\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:06.0";
        let dmesg =
            "[ 4321.123456] NVRM: Xid (PCI:0000:00:06): 43, pid=3323, name=python3, Ch 00000008";
        let syslog = "Jun  3 10:00:01 gpu-node-7 kernel: [ 4321.123456] NVRM: Xid (PCI:0000:00:06): 43, pid=3323, name=python3, Ch 00000008";
        let expected = KernelXid {
            pci: pci(0, 6),
            xid: 43,
            pid: Some(3323),
            process: Some("python3".into()),
            detail: "Ch 00000008".into(),
        };
        for line in [kmsg, dmesg, syslog] {
            assert_eq!(KernelXid::parse(line).as_ref(), Some(&expected), "{line}");
        }
    }

    #[test]
    fn older_drivers_name_no_process() {
        let x = KernelXid::parse(
            "NVRM: Xid (PCI:0000:0b:00): 31, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS \
             GPCCLIENT_T1_0 faulted @ 0x1_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
        )
        .unwrap();
        assert_eq!(
            (x.pci, x.xid, x.pid, x.process),
            (pci(0x0b, 0), 31, None, None)
        );
        assert!(x.detail.starts_with("Ch 00000008"));
        // The generation between: a pid but no name.
        let x = KernelXid::parse(
            "NVRM: Xid (PCI:0000:86:00): 31, pid=23599, Ch 00000008, intr 10000000. MMU Fault: ...",
        )
        .unwrap();
        assert_eq!((x.pid, x.process), (Some(23599), None));
        // An Xid with nothing after the code.
        let x = KernelXid::parse("NVRM: Xid (PCI:0000:01:00): 45").unwrap();
        assert_eq!((x.xid, x.pid, x.detail.as_str()), (45, None, ""));
    }

    #[test]
    fn device_level_xids_name_no_process() {
        for (line, xid) in [
            (
                "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                79,
            ),
            (
                "NVRM: Xid (PCI:0000:86:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double \
                 bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
                48,
            ),
            (
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
                79,
            ),
        ] {
            let x = KernelXid::parse(line).unwrap();
            assert_eq!(
                (x.xid, x.pid, x.process.as_deref()),
                (xid, None, None),
                "{line}"
            );
        }
    }

    #[test]
    fn application_xids_of_several_kinds() {
        let cases = [
            (
                "NVRM: Xid (PCI:0000:01:00): 13, pid=28511, name=python, Graphics SM Warp Exception on \
                 (GPC 0, TPC 1, SM 0): Out Of Range Address",
                13,
                28511,
                "python",
                "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
            ),
            (
                "NVRM: Xid (PCI:0000:00:06): 45, pid=3322, name=python3, Ch 00000008",
                45,
                3322,
                "python3",
                "Ch 00000008",
            ),
            (
                // GSP timeout blamed on the container toolkit's process.
                "NVRM: Xid (PCI:0000:c1:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s of \
                 waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x2081001d 0x4).",
                119,
                1582259,
                "nvc:[driver]",
                "Timeout after 6s",
            ),
        ];
        for (line, xid, pid, name, detail) in cases {
            let x = KernelXid::parse(line).unwrap();
            assert_eq!(x.xid, xid, "{line}");
            assert_eq!(x.pid, Some(pid), "{line}");
            assert_eq!(x.process.as_deref(), Some(name), "{line}");
            assert!(x.detail.starts_with(detail), "{}", x.detail);
        }
    }

    #[test]
    fn other_driver_lines_are_not_xids() {
        for line in [
            "NVRM: GPU at PCI:0000:00:06: GPU-5f1c2d3e-0000-1111-2222-333344445555",
            "NVRM: GPU Board Serial Number: 1650123456789",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:29 UTC 2025",
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 41 egress non-posted PRIV error",
            "NVRM: Xid (PCI:0000:00:06): , pid=1",
            "NVRM: Xid (PCI:0000:00:06): 31x, pid=1",
            "NVRM: Xid (PCI:zz): 31, pid=1",
            "",
        ] {
            assert_eq!(KernelXid::parse(line), None, "{line}");
        }
    }

    #[test]
    fn long_details_are_shortened() {
        let line = format!(
            "NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=x, {}",
            "é".repeat(1000)
        );
        let x = KernelXid::parse(&line).unwrap();
        assert!(x.detail.len() <= MAX_DETAIL + '…'.len_utf8());
    }
}
