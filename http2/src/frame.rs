//! HTTP/2 frames (RFC 9113 4, 6): frame heads, the frames either side
//! writes, padding, SETTINGS and WINDOW_UPDATE payloads, and the windows
//! they move. Pure functions over byte buffers.

use bytes::BytesMut;

/// Length of a frame header.
pub const HEADER_LEN: usize = 9;
/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest frame payload before SETTINGS_MAX_FRAME_SIZE is raised; the
/// agent never raises it.
pub const DEFAULT_MAX_FRAME: usize = 16_384;
/// A window's initial size before SETTINGS say otherwise.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// The largest a flow-control window may become.
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// A frame header as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Parses the frame header at the start of `buf` (at least [`HEADER_LEN`]
/// bytes).
pub fn parse_head(buf: &[u8]) -> Head {
    Head {
        len: (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]),
        kind: buf[3],
        flags: buf[4],
        stream: u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff,
    }
}

/// Appends a frame header.
pub fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    let id = (stream & 0x7fff_ffff).to_be_bytes();
    // One copy: `BytesMut`'s `put_u8` and friends each go through
    // `put_slice` (a capacity check and a `memcpy` call per byte).
    out.extend_from_slice(&[
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        kind,
        flags,
        id[0],
        id[1],
        id[2],
        id[3],
    ]);
}

/// Appends a SETTINGS frame with `values`.
pub fn put_settings(out: &mut BytesMut, values: &[(u16, u32)]) {
    put_head(out, values.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, value) in values {
        let (i, v) = (id.to_be_bytes(), value.to_be_bytes());
        out.extend_from_slice(&[i[0], i[1], v[0], v[1], v[2], v[3]]);
    }
}

/// Appends a WINDOW_UPDATE frame.
pub fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends an RST_STREAM frame.
pub fn put_reset(out: &mut BytesMut, stream: u32, error: u32) {
    put_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&error.to_be_bytes());
}

/// Appends a GOAWAY frame.
pub fn put_goaway(out: &mut BytesMut, last_stream: u32, error: u32) {
    put_head(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
}

/// Strips the padding of a DATA or HEADERS payload (and, for HEADERS with
/// the PRIORITY flag, its priority fields): the range of what is left.
pub fn unpad(payload: &[u8], flags: u8, kind: u8) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & flag::PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if kind == kind::HEADERS && flags & flag::PRIORITY != 0 {
        start += 5;
    }
    (start <= end).then_some(start..end)
}

/// The stream a HEADERS (with the PRIORITY flag) or PRIORITY frame's
/// priority fields make this one depend on; `None` when too short.
pub fn priority_dependency(payload: &[u8], flags: u8) -> Option<u32> {
    let at = usize::from(flags & flag::PADDED != 0);
    let b = payload.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
}

/// What a peer's SETTINGS frame set that the agent's connections act on
/// (the last value of each, as RFC 9113 6.5.3 processes them in order).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeerSettings {
    pub header_table_size: Option<u32>,
    pub initial_window: Option<i64>,
    pub max_frame: Option<usize>,
    pub max_streams: Option<u32>,
}

/// Reads a SETTINGS frame, checked as RFC 9113 6.5 asks of either side:
/// `None` for an ACK; an error is the connection error's code and why.
pub fn read_settings(
    head: Head,
    payload: &[u8],
) -> Result<Option<PeerSettings>, (u32, &'static str)> {
    if head.stream != 0 {
        return Err((code::PROTOCOL_ERROR, "SETTINGS on a stream"));
    }
    if head.flags & flag::ACK != 0 {
        if !payload.is_empty() {
            return Err((code::FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload"));
        }
        return Ok(None);
    }
    if payload.len() % 6 != 0 {
        return Err((code::FRAME_SIZE_ERROR, "SETTINGS of the wrong size"));
    }
    let mut out = PeerSettings::default();
    for s in payload.chunks_exact(6) {
        let id = u16::from_be_bytes([s[0], s[1]]);
        let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
        match id {
            setting::HEADER_TABLE_SIZE => out.header_table_size = Some(value),
            setting::INITIAL_WINDOW_SIZE => {
                if i64::from(value) > MAX_WINDOW {
                    return Err((code::FLOW_CONTROL_ERROR, "an initial window over 2^31-1"));
                }
                out.initial_window = Some(i64::from(value));
            }
            setting::MAX_FRAME_SIZE => {
                if !(16_384..=16_777_215).contains(&value) {
                    return Err((code::PROTOCOL_ERROR, "a bad MAX_FRAME_SIZE"));
                }
                out.max_frame = Some(value as usize);
            }
            setting::ENABLE_PUSH if value > 1 => {
                return Err((code::PROTOCOL_ERROR, "a bad ENABLE_PUSH"));
            }
            setting::MAX_CONCURRENT_STREAMS => out.max_streams = Some(value),
            // Unknown settings are ignored (RFC 9113 6.5.2).
            _ => {}
        }
    }
    Ok(Some(out))
}

/// Appends header block `block` of stream `id` as a HEADERS frame and
/// CONTINUATIONs of at most `max_frame` bytes each (`end`: the block ends
/// the stream).
pub fn put_header_frames(
    out: &mut BytesMut,
    id: u32,
    mut block: &[u8],
    end: bool,
    max_frame: usize,
) {
    let end = if end { flag::END_STREAM } else { 0 };
    let mut first = true;
    while first || !block.is_empty() {
        let (part, rest) = block.split_at(block.len().min(max_frame));
        block = rest;
        let last = if block.is_empty() {
            flag::END_HEADERS
        } else {
            0
        };
        let (k, flags) = if first {
            (kind::HEADERS, end | last)
        } else {
            (kind::CONTINUATION, last)
        };
        put_head(out, part.len(), k, flags, id);
        out.extend_from_slice(part);
        first = false;
    }
}

/// A WINDOW_UPDATE's increment (RFC 9113 6.9).
pub fn window_increment(payload: &[u8]) -> Result<i64, (u32, &'static str)> {
    let Ok(bytes) = <[u8; 4]>::try_from(payload) else {
        return Err((code::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"));
    };
    Ok(i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff))
}

/// Adds a connection-level WINDOW_UPDATE's increment to `window`: a
/// zero increment and a window past 2^31-1 are connection errors.
pub fn grow_connection_window(window: &mut i64, inc: i64) -> Result<(), (u32, &'static str)> {
    if inc == 0 {
        return Err((code::PROTOCOL_ERROR, "a zero window increment"));
    }
    *window += inc;
    if *window > MAX_WINDOW {
        return Err((code::FLOW_CONTROL_ERROR, "the window overflowed"));
    }
    Ok(())
}

/// The peer's initial window became `window` (it was `*initial`): each
/// stream's send window moves by the difference (RFC 9113 6.9.2).
pub fn shift_windows<'a>(
    initial: &mut i64,
    window: i64,
    windows: impl Iterator<Item = &'a mut i64>,
) -> Result<(), (u32, &'static str)> {
    let delta = window - std::mem::replace(initial, window);
    for window in windows {
        *window += delta;
        if *window > MAX_WINDOW {
            return Err((code::FLOW_CONTROL_ERROR, "a stream window overflowed"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_heads_round_trip() {
        let mut out = BytesMut::new();
        put_head(&mut out, 70_000, kind::DATA, flag::END_STREAM, 0x8000_0003);
        assert_eq!(
            parse_head(&out),
            Head {
                len: 70_000,
                kind: kind::DATA,
                flags: flag::END_STREAM,
                stream: 3
            }
        );
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        // Pad length 2, priority 5 bytes, 3 bytes of block, 2 of padding.
        let payload = [2, 0, 0, 0, 0, 9, b'a', b'b', b'c', 0, 0];
        let range = unpad(&payload, flag::PADDED | flag::PRIORITY, kind::HEADERS).unwrap();
        assert_eq!(&payload[range], b"abc");
        assert_eq!(unpad(&[9, 1], flag::PADDED, kind::DATA), None);
        assert_eq!(unpad(b"xy", 0, kind::DATA), Some(0..2));
    }
}
