//! HTTP/2 frames as the conformance cases see them: a header (length, type,
//! flags, stream) and an opaque payload, written and read without checking
//! anything (the cases send illegal frames on purpose), with just enough
//! accessors to tell what the server answered.
//!
//! Written here, not taken from the agent's codec, so that the suite holds
//! the agent to RFC 9113 rather than to itself.

use std::fmt;

/// Frame types (RFC 9113 §6).
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

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers.
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
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// The name RFC 9113 gives an error code.
pub fn code_name(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    NAMES.get(code as usize).map_or_else(
        || format!("unknown error code 0x{code:x}"),
        |n| n.to_string(),
    )
}

/// One frame: its header fields and its payload as sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame of `kind` with `flags` on `stream` carrying `payload`.
    pub fn new(kind: u8, flags: u8, stream: u32, payload: Vec<u8>) -> Frame {
        Frame {
            kind,
            flags,
            stream,
            payload,
        }
    }

    /// The frame on the wire: 9-octet header, then the payload.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.payload.len() as u32;
        let mut out = Vec::with_capacity(9 + self.payload.len());
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Takes one whole frame off the front of `buf`, if it holds one.
    pub fn parse(buf: &mut Vec<u8>) -> Option<Frame> {
        if buf.len() < 9 {
            return None;
        }
        let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
        if buf.len() < 9 + len {
            return None;
        }
        let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
        let frame = Frame::new(buf[3], buf[4], stream, buf[9..9 + len].to_vec());
        buf.drain(..9 + len);
        Some(frame)
    }

    /// Whether the flag bit `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Whether a DATA or HEADERS frame ends its stream.
    pub fn ends_stream(&self) -> bool {
        matches!(self.kind, kind::DATA | kind::HEADERS) && self.has(flag::END_STREAM)
    }

    /// Whether a SETTINGS or PING frame is an acknowledgement.
    pub fn is_ack(&self) -> bool {
        matches!(self.kind, kind::SETTINGS | kind::PING) && self.has(flag::ACK)
    }

    /// The error code of a RST_STREAM or GOAWAY frame.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            kind::RST_STREAM => 0,
            kind::GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The settings a (non-ACK) SETTINGS frame carries.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }

    fn name(&self) -> String {
        const NAMES: [&str; 10] = [
            "DATA",
            "HEADERS",
            "PRIORITY",
            "RST_STREAM",
            "SETTINGS",
            "PUSH_PROMISE",
            "PING",
            "GOAWAY",
            "WINDOW_UPDATE",
            "CONTINUATION",
        ];
        NAMES.get(self.kind as usize).map_or_else(
            || format!("unknown (type 0x{:x})", self.kind),
            |n| n.to_string(),
        )
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} frame (length:{}, flags:0x{:02x}, stream_id:{}",
            self.name(),
            self.payload.len(),
            self.flags,
            self.stream
        )?;
        if let Some(code) = self.error_code() {
            write!(f, ", error_code:{}", code_name(code))?;
        }
        write!(f, ")")
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A stream dependency (RFC 9113 §5.3.2, deprecated but still framed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Priority {
    pub depends_on: u32,
    pub exclusive: bool,
    pub weight: u8,
}

impl Priority {
    /// The five octets of a PRIORITY frame or HEADERS priority fields.
    pub fn encode(&self) -> [u8; 5] {
        let dep = self.depends_on | if self.exclusive { 0x8000_0000 } else { 0 };
        let d = dep.to_be_bytes();
        [d[0], d[1], d[2], d[3], self.weight]
    }

    /// Whether it is all zero (Go's framer then leaves the fields out).
    fn is_zero(&self) -> bool {
        self.depends_on == 0 && !self.exclusive && self.weight == 0
    }
}

/// What a HEADERS frame carries (Go's `http2.HeadersFrameParam`).
#[derive(Clone, Debug, Default)]
pub struct Headers {
    pub stream: u32,
    pub block: Vec<u8>,
    pub end_stream: bool,
    pub end_headers: bool,
    pub pad_length: u8,
    pub priority: Priority,
}

impl Headers {
    /// The frame: padding and priority fields only where set.
    pub fn frame(&self) -> Frame {
        let mut flags = 0;
        let mut payload = Vec::new();
        if self.end_stream {
            flags |= flag::END_STREAM;
        }
        if self.end_headers {
            flags |= flag::END_HEADERS;
        }
        if self.pad_length > 0 {
            flags |= flag::PADDED;
            payload.push(self.pad_length);
        }
        if !self.priority.is_zero() {
            flags |= flag::PRIORITY;
            payload.extend_from_slice(&self.priority.encode());
        }
        payload.extend_from_slice(&self.block);
        payload.resize(payload.len() + self.pad_length as usize, 0);
        Frame::new(kind::HEADERS, flags, self.stream, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_wait_for_their_whole_payload() {
        let f = Frame::new(kind::GOAWAY, 0, 0, vec![0, 0, 0, 1, 0, 0, 0, 0xb]);
        let mut wire = f.encode();
        assert_eq!(&wire[..9], b"\x00\x00\x08\x07\x00\x00\x00\x00\x00");
        let mut partial = wire[..12].to_vec();
        assert_eq!(Frame::parse(&mut partial), None);
        wire.extend_from_slice(b"\x00\x00");
        assert_eq!(Frame::parse(&mut wire), Some(f.clone()));
        assert_eq!(wire, b"\x00\x00");
        assert_eq!(f.error_code(), Some(0xb));
        assert_eq!(code_name(0xb), "ENHANCE_YOUR_CALM");
    }

    #[test]
    fn headers_frames_carry_padding_and_priority_only_when_set() {
        let plain = Headers {
            stream: 1,
            block: vec![0x82],
            end_stream: true,
            end_headers: true,
            ..Default::default()
        };
        assert_eq!(
            plain.frame().encode(),
            b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x82"
        );
        let padded = Headers {
            pad_length: 2,
            priority: Priority {
                depends_on: 3,
                exclusive: true,
                weight: 255,
            },
            ..plain
        };
        let f = padded.frame();
        assert_eq!(
            f.flags,
            flag::END_STREAM | flag::END_HEADERS | flag::PADDED | flag::PRIORITY
        );
        assert_eq!(f.payload, b"\x02\x80\x00\x00\x03\xff\x82\x00\x00");
    }
}
