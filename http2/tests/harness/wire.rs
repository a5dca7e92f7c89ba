//! HTTP/2 frames as the peer of the connection under test writes and reads
//! them, written apart from the crate's `frame` module (RFC 9113 4, 6), and
//! [`OutputCheck`]: everything the connection writes, read back and held
//! to the RFC — frame sizes, header blocks whole and decodable (by
//! loona-hpack, in order), stream states, and no DATA beyond the windows
//! its peer granted.
//!
//! Windows are checked against what the connection had *processed* of its
//! peer's frames, in order. Within one step the order between a frame read
//! and a frame written is not seen, so a grant (SETTINGS, WINDOW_UPDATE)
//! processed in the step is applied only when a frame written needs it
//! ([`OutputCheck::grant`]): the most lenient order the connection could
//! have followed. What fails the check was not allowed in any order.

use std::collections::{HashMap, VecDeque};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const STREAM_CLOSED: u32 = 0x5;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;

pub const HEADER_TABLE_SIZE: u16 = 0x1;
pub const ENABLE_PUSH: u16 = 0x2;
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const MAX_FRAME_SIZE: u16 = 0x5;
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;

pub const DEFAULT_WINDOW: i64 = 65_535;
pub const MAX_WINDOW: i64 = (1 << 31) - 1;
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// Appends a frame header announcing `len` bytes (which need not follow).
pub fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// Appends a whole frame.
pub fn put(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    put_head(out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
}

/// A SETTINGS payload.
pub fn settings_payload(values: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in values {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    p
}

/// A frame as read.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// What a WINDOW_UPDATE payload grants, if it is valid.
pub fn window_grants(stream: u32, payload: &[u8]) -> Vec<Grant> {
    if payload.len() != 4 {
        return Vec::new();
    }
    let inc = u32::from_be_bytes(payload.try_into().unwrap()) & 0x7fff_ffff;
    if inc == 0 {
        return Vec::new();
    }
    vec![Grant::Window {
        stream,
        increment: i64::from(inc),
    }]
}

/// What a SETTINGS payload grants; `None` when the frame is an error.
pub fn settings_grants(payload: &[u8]) -> Option<Vec<Grant>> {
    if payload.len() % 6 != 0 {
        return None;
    }
    let mut grants = Vec::new();
    for c in payload.chunks(6) {
        let id = u16::from_be_bytes([c[0], c[1]]);
        let v = u32::from_be_bytes([c[2], c[3], c[4], c[5]]);
        match id {
            INITIAL_WINDOW_SIZE if i64::from(v) > MAX_WINDOW => return None,
            INITIAL_WINDOW_SIZE => grants.push(Grant::InitialWindow(i64::from(v))),
            MAX_FRAME_SIZE if !(16_384..(1 << 24)).contains(&v) => return None,
            MAX_FRAME_SIZE => grants.push(Grant::MaxFrame(v as usize)),
            ENABLE_PUSH if v > 1 => return None,
            HEADER_TABLE_SIZE => grants.push(Grant::TableSize(v as usize)),
            _ => {}
        }
    }
    Some(grants)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// What the checked side's peer had said, once the checked side processed
/// it, that changes what the checked side may write.
#[derive(Debug, Clone, Copy)]
pub enum Grant {
    InitialWindow(i64),
    Window { stream: u32, increment: i64 },
    MaxFrame(usize),
    TableSize(usize),
}

/// What the checked side wrote, frame by frame, for its user to act on.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A whole header block, decoded.
    Block {
        stream: u32,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        end_stream: bool,
        /// The stream's first block (a head, not trailers).
        first: bool,
    },
    Data {
        stream: u32,
        data: Vec<u8>,
        /// Bytes the frame took of the windows (padding included).
        flow: usize,
        end_stream: bool,
    },
    Reset {
        stream: u32,
        code: u32,
    },
    GoAway {
        last: u32,
        code: u32,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Settings(Vec<(u16, u32)>),
    SettingsAck,
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
}

/// Which role wrote the bytes checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// What the checked side did on one stream.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    headed: bool,
    ended: bool,
    reset: bool,
}

/// The reader of everything one connection writes (see the module doc).
pub struct OutputCheck {
    role: Role,
    preface_left: usize,
    bytes: Vec<u8>,
    frames: u64,
    /// A GOAWAY with an error was written: nothing may follow.
    closed: bool,
    goaway_last: Option<u32>,
    /// A header block waiting for CONTINUATIONs: stream, bytes, END_STREAM.
    block: Option<(u32, Vec<u8>, bool)>,
    decoder: loona_hpack::Decoder<'static>,
    /// The dynamic table size as the blocks set it, and the most the peer
    /// allows.
    table_max: usize,
    table_allowed: usize,
    conn_window: i64,
    initial: i64,
    added: HashMap<u32, i64>,
    sent_data: HashMap<u32, i64>,
    max_frame: usize,
    pending: VecDeque<Grant>,
    streams: HashMap<u32, Sent>,
    /// Client role: the last stream it opened.
    highest_opened: u32,
    /// Server role: the highest stream id its client opened (set by the
    /// harness as the client's HEADERS are processed).
    pub peer_max_id: u32,
}

impl OutputCheck {
    pub fn new(role: Role) -> Self {
        Self {
            role,
            preface_left: if role == Role::Client {
                PREFACE.len()
            } else {
                0
            },
            bytes: Vec::new(),
            frames: 0,
            closed: false,
            goaway_last: None,
            block: None,
            decoder: loona_hpack::Decoder::new(),
            table_max: 4096,
            table_allowed: 4096,
            conn_window: DEFAULT_WINDOW,
            initial: DEFAULT_WINDOW,
            added: HashMap::new(),
            sent_data: HashMap::new(),
            max_frame: DEFAULT_MAX_FRAME,
            pending: VecDeque::new(),
            streams: HashMap::new(),
            highest_opened: 0,
            peer_max_id: 0,
        }
    }

    /// The checked side processed a frame of its peer that grants this.
    pub fn grant(&mut self, grant: Grant) {
        self.pending.push_back(grant);
    }

    /// A step ended: every grant processed in it applies from now on.
    pub fn end_step(&mut self) {
        while self.pop() {}
    }

    /// Whether a GOAWAY with an error was written.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The lowest last-stream id of the GOAWAYs written.
    pub fn goaway_last(&self) -> Option<u32> {
        self.goaway_last
    }

    /// Whether the checked side ended (END_STREAM) or reset stream `id`.
    pub fn is_done(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.ended || s.reset)
    }

    /// Whether the checked side reset stream `id`.
    pub fn is_reset(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.reset)
    }

    /// Bytes of DATA written on stream `id`.
    pub fn data_sent(&self, id: u32) -> i64 {
        self.sent_data.get(&id).copied().unwrap_or(0)
    }

    /// What the checked side may still send on stream `id`, and on the
    /// connection, with every grant applied.
    pub fn windows(&self, id: u32) -> (i64, i64) {
        let stream = self.initial + self.added.get(&id).copied().unwrap_or(0) - self.data_sent(id);
        (stream, self.conn_window)
    }

    fn pop(&mut self) -> bool {
        let Some(g) = self.pending.pop_front() else {
            return false;
        };
        match g {
            Grant::InitialWindow(v) => self.initial = v,
            Grant::Window {
                stream: 0,
                increment,
            } => self.conn_window += increment,
            Grant::Window { stream, increment } => {
                *self.added.entry(stream).or_default() += increment
            }
            Grant::MaxFrame(v) => self.max_frame = v,
            Grant::TableSize(v) => self.table_allowed = v,
        }
        true
    }

    /// Reads `bytes` written by the checked side (appended to what came
    /// before): the frames made whole, or what broke the rules.
    pub fn read(&mut self, mut bytes: &[u8]) -> Result<Vec<Seen>, String> {
        if self.preface_left > 0 {
            let n = self.preface_left.min(bytes.len());
            let at = PREFACE.len() - self.preface_left;
            if bytes[..n] != PREFACE[at..at + n] {
                return Err("the client did not start with the preface".into());
            }
            self.preface_left -= n;
            bytes = &bytes[n..];
        }
        self.bytes.extend_from_slice(bytes);
        let mut seen = Vec::new();
        let mut at = 0;
        while self.bytes.len() - at >= 9 {
            let b = &self.bytes[at..];
            let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
            if b.len() < 9 + len {
                break;
            }
            let frame = Frame {
                kind: b[3],
                flags: b[4],
                stream: be32(&b[5..9]) & 0x7fff_ffff,
                payload: b[9..9 + len].to_vec(),
            };
            at += 9 + len;
            self.frame(frame, &mut seen)?;
        }
        self.bytes.drain(..at);
        Ok(seen)
    }

    /// Whether bytes of a frame not yet whole wait.
    pub fn has_partial(&self) -> bool {
        !self.bytes.is_empty()
    }

    fn check_stream_id(&self, f: &Frame) -> Result<(), String> {
        if f.stream == 0 {
            return Err(format!("a stream frame on stream 0: {f:?}"));
        }
        let opened = match self.role {
            Role::Server => self.peer_max_id,
            Role::Client => self.highest_opened,
        };
        if f.stream % 2 == 0 || f.stream > opened {
            return Err(format!(
                "a frame on stream {} that its client never opened (highest {opened}): kind {}",
                f.stream, f.kind
            ));
        }
        Ok(())
    }

    fn frame(&mut self, f: Frame, seen: &mut Vec<Seen>) -> Result<(), String> {
        if self.closed {
            return Err(format!("a frame after a GOAWAY with an error: {f:?}"));
        }
        if self.frames == 0 && (f.kind != SETTINGS || f.flags & ACK != 0) {
            return Err(format!("the first frame is not SETTINGS: {f:?}"));
        }
        self.frames += 1;
        while f.payload.len() > self.max_frame {
            if !self.pop() {
                return Err(format!(
                    "a frame of {} bytes over the peer's maximum {}",
                    f.payload.len(),
                    self.max_frame
                ));
            }
        }
        if let Some((stream, ..)) = &self.block {
            if f.kind != CONTINUATION || f.stream != *stream {
                return Err(format!(
                    "a header block of stream {stream} interrupted: {f:?}"
                ));
            }
        }
        match f.kind {
            DATA => {
                self.check_stream_id(&f)?;
                let s = self.streams.get(&f.stream).copied().unwrap_or_default();
                if !s.headed || s.ended || s.reset {
                    return Err(format!("DATA on stream {} in state {s:?}", f.stream));
                }
                let data = unpad(&f)?;
                self.spend(f.stream, f.payload.len() as i64)?;
                let end_stream = f.flags & END_STREAM != 0;
                self.streams.entry(f.stream).or_default().ended |= end_stream;
                seen.push(Seen::Data {
                    stream: f.stream,
                    data,
                    flow: f.payload.len(),
                    end_stream,
                });
            }
            HEADERS => {
                self.check_stream_id(&f).or_else(|e| {
                    // A client's HEADERS opens the stream it names.
                    if self.role == Role::Client
                        && f.stream % 2 == 1
                        && f.stream > self.highest_opened
                    {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?;
                let s = self.streams.get(&f.stream).copied().unwrap_or_default();
                if s.ended || s.reset {
                    return Err(format!("HEADERS on stream {} in state {s:?}", f.stream));
                }
                let end_stream = f.flags & END_STREAM != 0;
                if s.headed && !end_stream {
                    return Err(format!(
                        "trailers without END_STREAM on stream {}",
                        f.stream
                    ));
                }
                if self.role == Role::Client && !s.headed {
                    if f.stream <= self.highest_opened {
                        return Err(format!("stream {} opened out of order", f.stream));
                    }
                    self.highest_opened = f.stream;
                }
                let mut block = unpad(&f)?;
                if f.flags & PRIORITY_FLAG != 0 {
                    block.drain(..5.min(block.len()));
                }
                self.block = Some((f.stream, block, end_stream));
                if f.flags & END_HEADERS != 0 {
                    self.finish_block(seen)?;
                }
            }
            CONTINUATION => {
                let Some((_, block, _)) = &mut self.block else {
                    return Err(format!("CONTINUATION without HEADERS: {f:?}"));
                };
                block.extend_from_slice(&f.payload);
                if f.flags & END_HEADERS != 0 {
                    self.finish_block(seen)?;
                }
            }
            RST_STREAM => {
                self.check_stream_id(&f)?;
                if f.payload.len() != 4 {
                    return Err(format!("RST_STREAM of {} bytes", f.payload.len()));
                }
                self.streams.entry(f.stream).or_default().reset = true;
                seen.push(Seen::Reset {
                    stream: f.stream,
                    code: be32(&f.payload),
                });
            }
            SETTINGS => {
                if f.stream != 0 {
                    return Err("SETTINGS on a stream".into());
                }
                if f.flags & ACK != 0 {
                    if !f.payload.is_empty() {
                        return Err("a SETTINGS ACK with a payload".into());
                    }
                    seen.push(Seen::SettingsAck);
                } else {
                    if f.payload.len() % 6 != 0 {
                        return Err("SETTINGS of a wrong length".into());
                    }
                    let values = f
                        .payload
                        .chunks(6)
                        .map(|c| (u16::from_be_bytes([c[0], c[1]]), be32(&c[2..])))
                        .collect();
                    seen.push(Seen::Settings(values));
                }
            }
            PING => {
                if f.stream != 0 || f.payload.len() != 8 {
                    return Err(format!("a bad PING: {f:?}"));
                }
                seen.push(Seen::Ping {
                    ack: f.flags & ACK != 0,
                    payload: f.payload[..].try_into().unwrap(),
                });
            }
            GOAWAY => {
                if f.stream != 0 || f.payload.len() < 8 {
                    return Err(format!("a bad GOAWAY: {f:?}"));
                }
                let last = be32(&f.payload) & 0x7fff_ffff;
                let code = be32(&f.payload[4..]);
                if self.goaway_last.is_some_and(|prev| last > prev) {
                    return Err(format!("a GOAWAY raised the last stream to {last}"));
                }
                self.goaway_last = Some(last);
                self.closed = code != NO_ERROR;
                seen.push(Seen::GoAway { last, code });
            }
            WINDOW_UPDATE => {
                if f.payload.len() != 4 {
                    return Err("WINDOW_UPDATE of a wrong length".into());
                }
                let increment = be32(&f.payload) & 0x7fff_ffff;
                if increment == 0 {
                    return Err(format!("a zero WINDOW_UPDATE on stream {}", f.stream));
                }
                if f.stream != 0 {
                    self.check_stream_id(&f)?;
                    if self.streams.get(&f.stream).is_some_and(|s| s.reset) {
                        return Err(format!(
                            "WINDOW_UPDATE on stream {} after resetting it",
                            f.stream
                        ));
                    }
                }
                seen.push(Seen::WindowUpdate {
                    stream: f.stream,
                    increment,
                });
            }
            k => return Err(format!("a frame of a kind this side never writes ({k})")),
        }
        Ok(())
    }

    fn spend(&mut self, stream: u32, n: i64) -> Result<(), String> {
        loop {
            let (sw, cw) = self.windows(stream);
            // An empty frame takes nothing, whatever the windows.
            if n == 0 || (sw >= n && cw >= n) {
                self.conn_window -= n;
                *self.sent_data.entry(stream).or_default() += n;
                return Ok(());
            }
            if !self.pop() {
                return Err(format!(
                    "DATA of {n} bytes on stream {stream} beyond the windows \
                     (stream {sw}, connection {cw})"
                ));
            }
        }
    }

    fn finish_block(&mut self, seen: &mut Vec<Seen>) -> Result<(), String> {
        let (stream, block, end_stream) = self.block.take().expect("a block");
        // Size updates first, each within what the peer allows.
        let mut rest = &block[..];
        while rest.first().is_some_and(|b| b & 0xe0 == 0x20) {
            let size = integer(&mut rest, 5).ok_or("a bad size update")?;
            while size > self.table_allowed {
                if !self.pop() {
                    return Err(format!(
                        "a table size update to {size} over {}",
                        self.table_allowed
                    ));
                }
            }
            self.table_max = size;
        }
        if self.table_max > self.table_allowed {
            return Err(format!(
                "a block without the size update the peer's table size {} asks for",
                self.table_allowed
            ));
        }
        let fields = self
            .decoder
            .decode(&block)
            .map_err(|e| format!("a header block of stream {stream} did not decode: {e:?}"))?;
        let s = self.streams.entry(stream).or_default();
        let first = !s.headed;
        check_fields(self.role, &fields, first)
            .map_err(|e| format!("stream {stream}: {e}: {fields:?}"))?;
        s.headed = true;
        s.ended |= end_stream;
        seen.push(Seen::Block {
            stream,
            fields,
            end_stream,
            first,
        });
        Ok(())
    }
}

/// A DATA or HEADERS payload without its padding.
fn unpad(f: &Frame) -> Result<Vec<u8>, String> {
    if f.flags & PADDED == 0 {
        return Ok(f.payload.clone());
    }
    let pad = usize::from(*f.payload.first().ok_or("padded and empty")?);
    if pad + 1 > f.payload.len() {
        return Err("padding longer than the frame".into());
    }
    Ok(f.payload[1..f.payload.len() - pad].to_vec())
}

/// An HPACK integer with an `n`-bit prefix.
fn integer(b: &mut &[u8], n: u8) -> Option<usize> {
    let (&first, rest) = b.split_first()?;
    *b = rest;
    let max = (1usize << n) - 1;
    let mut v = usize::from(first) & max;
    if v < max {
        return Some(v);
    }
    for shift in (0..35).step_by(7) {
        let (&x, rest) = b.split_first()?;
        *b = rest;
        v += usize::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of a block written by `role`: pseudo-headers first and only
/// in a head (`:status` for a response, the request's four for a
/// request), lower-case names, none that HTTP/2 forbids.
fn check_fields(role: Role, fields: &[(Vec<u8>, Vec<u8>)], head: bool) -> Result<(), String> {
    let mut regular = false;
    let mut pseudo = Vec::new();
    for (name, value) in fields {
        if name.first() == Some(&b':') {
            if regular || !head {
                return Err("a pseudo-header out of place".into());
            }
            pseudo.push(name.as_slice());
            if name == b":status" && (value.len() != 3 || !value.iter().all(u8::is_ascii_digit)) {
                return Err("a bad :status".into());
            }
            continue;
        }
        regular = true;
        if name.is_empty() || name.iter().any(|c| c.is_ascii_uppercase()) {
            return Err("an empty or upper-case name".into());
        }
        if matches!(
            &name[..],
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
        ) {
            return Err("a connection-specific field".into());
        }
    }
    if head {
        let want: &[&[u8]] = match role {
            Role::Server => &[b":status"],
            Role::Client => &[b":method", b":scheme", b":path", b":authority"],
        };
        if pseudo != want {
            return Err(format!("pseudo-headers {pseudo:?}"));
        }
    }
    Ok(())
}
