//! The emulation's wire format and the responder's access check, without
//! I/O.
//!
//! A request is a 29-byte header (`op` u8, `wr_id` u64, `rkey` u32, `addr`
//! u64, `len` u64, big-endian), followed for a WRITE by `len` bytes of
//! payload. A response is a 17-byte header (`wr_id` u64, `status` u8,
//! `payload_len` u64), followed for a successful READ by the payload.
//! Requests on one connection are executed and answered in order, like an
//! RC queue pair.

use std::ops::Range;

use crate::memory::Access;
use crate::verbs::{Opcode, WcStatus};

pub(crate) const REQUEST_LEN: usize = 29;
pub(crate) const RESPONSE_LEN: usize = 17;
/// The largest READ/WRITE the emulation carries (its `max_transfer`).
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;

/// A one-sided request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub opcode: Opcode,
    pub wr_id: u64,
    pub rkey: u32,
    pub addr: u64,
    pub len: u64,
}

/// A response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub wr_id: u64,
    pub status: WireStatus,
    pub payload_len: u64,
}

/// Status codes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireStatus {
    Success = 0,
    RemoteAccess = 1,
    RemoteInvalidRequest = 2,
}

impl WireStatus {
    pub(crate) fn to_wc(self) -> WcStatus {
        match self {
            WireStatus::Success => WcStatus::Success,
            WireStatus::RemoteAccess => WcStatus::RemoteAccess,
            WireStatus::RemoteInvalidRequest => WcStatus::RemoteInvalidRequest,
        }
    }
}

impl Request {
    pub(crate) fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = match self.opcode {
            Opcode::Read => 1,
            Opcode::Write => 2,
        };
        b[1..9].copy_from_slice(&self.wr_id.to_be_bytes());
        b[9..13].copy_from_slice(&self.rkey.to_be_bytes());
        b[13..21].copy_from_slice(&self.addr.to_be_bytes());
        b[21..29].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// `None` for an unknown opcode.
    pub(crate) fn decode(b: &[u8; REQUEST_LEN]) -> Option<Self> {
        let opcode = match b[0] {
            1 => Opcode::Read,
            2 => Opcode::Write,
            _ => return None,
        };
        Some(Request {
            opcode,
            wr_id: u64::from_be_bytes(b[1..9].try_into().ok()?),
            rkey: u32::from_be_bytes(b[9..13].try_into().ok()?),
            addr: u64::from_be_bytes(b[13..21].try_into().ok()?),
            len: u64::from_be_bytes(b[21..29].try_into().ok()?),
        })
    }
}

impl Response {
    pub(crate) fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..8].copy_from_slice(&self.wr_id.to_be_bytes());
        b[8] = self.status as u8;
        b[9..17].copy_from_slice(&self.payload_len.to_be_bytes());
        b
    }

    /// `None` for an unknown status.
    pub(crate) fn decode(b: &[u8; RESPONSE_LEN]) -> Option<Self> {
        let status = match b[8] {
            0 => WireStatus::Success,
            1 => WireStatus::RemoteAccess,
            2 => WireStatus::RemoteInvalidRequest,
            _ => return None,
        };
        Some(Response {
            wr_id: u64::from_be_bytes(b[0..8].try_into().ok()?),
            status,
            payload_len: u64::from_be_bytes(b[9..17].try_into().ok()?),
        })
    }
}

/// The registered region an rkey names, as the responder sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegionBounds {
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

/// The responder's check, as an HCA does it: the rkey must name a live
/// region registered with the access the operation needs, and
/// `[addr, addr + len)` must lie inside it without overflowing. Any failure
/// is a remote access error, without saying which. Returns the byte range
/// within the region.
pub(crate) fn check_access(
    region: Option<RegionBounds>,
    opcode: Opcode,
    addr: u64,
    len: u64,
) -> Result<Range<usize>, WireStatus> {
    let region = region.ok_or(WireStatus::RemoteAccess)?;
    let allowed = match opcode {
        Opcode::Read => region.access.remote_read(),
        Opcode::Write => region.access.remote_write(),
    };
    if !allowed {
        return Err(WireStatus::RemoteAccess);
    }
    let end = addr.checked_add(len).ok_or(WireStatus::RemoteAccess)?;
    let region_end = region
        .addr
        .checked_add(region.len)
        .ok_or(WireStatus::RemoteAccess)?;
    if addr < region.addr || end > region_end {
        return Err(WireStatus::RemoteAccess);
    }
    let start = usize::try_from(addr - region.addr).map_err(|_| WireStatus::RemoteAccess)?;
    let len = usize::try_from(len).map_err(|_| WireStatus::RemoteAccess)?;
    Ok(start..start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let req = Request {
            opcode: Opcode::Write,
            wr_id: u64::MAX - 1,
            rkey: 0xdead_beef,
            addr: 0x7f00_0000_1000,
            len: 1 << 24,
        };
        assert_eq!(Request::decode(&req.encode()), Some(req));
        let resp = Response {
            wr_id: 7,
            status: WireStatus::RemoteAccess,
            payload_len: 0,
        };
        assert_eq!(Response::decode(&resp.encode()), Some(resp));
        let mut bad = req.encode();
        bad[0] = 9;
        assert_eq!(Request::decode(&bad), None);
    }

    #[test]
    fn access_check_like_hardware() {
        let rw = RegionBounds {
            addr: 0x1000,
            len: 0x100,
            access: Access::RemoteReadWrite,
        };
        let ok = |op, addr, len| check_access(Some(rw), op, addr, len);
        assert_eq!(ok(Opcode::Read, 0x1000, 0x100), Ok(0..0x100));
        assert_eq!(ok(Opcode::Write, 0x10ff, 1), Ok(0xff..0x100));
        assert_eq!(ok(Opcode::Read, 0x1100, 0), Ok(0x100..0x100));
        for (addr, len) in [(0xfff, 1), (0x1000, 0x101), (0x1100, 1), (0x1001, u64::MAX)] {
            assert_eq!(ok(Opcode::Read, addr, len), Err(WireStatus::RemoteAccess));
        }
        assert_eq!(
            check_access(None, Opcode::Read, 0x1000, 1),
            Err(WireStatus::RemoteAccess)
        );
        let read_only = RegionBounds {
            access: Access::RemoteRead,
            ..rw
        };
        assert!(check_access(Some(read_only), Opcode::Read, 0x1000, 1).is_ok());
        assert!(check_access(Some(read_only), Opcode::Write, 0x1000, 1).is_err());
        let write_only = RegionBounds {
            access: Access::RemoteWrite,
            ..rw
        };
        assert!(check_access(Some(write_only), Opcode::Read, 0x1000, 1).is_err());
        let local = RegionBounds {
            access: Access::Local,
            ..rw
        };
        assert!(check_access(Some(local), Opcode::Read, 0x1000, 1).is_err());
        assert!(check_access(Some(local), Opcode::Write, 0x1000, 1).is_err());
    }
}
