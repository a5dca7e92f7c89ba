//! What both connection roles share: reading frames and assembling header
//! blocks, the connection-level frames (SETTINGS, PING, connection
//! WINDOW_UPDATE, GOAWAY, PRIORITY, unknown types), both connection
//! windows, the budget of frames that carry no work, and writing DATA
//! within the peer's windows.
//!
//! A role ([`crate::server::Conn`], [`crate::client::Conn`]) feeds bytes to
//! [`Core::read`] and gets back the frames that concern its streams; it
//! never sees a frame the core can answer alone. Errors are the
//! connection's: the role ends it with [`Core::fail`].

use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};

use crate::chunks::Chunks;
use crate::frame::{self, PeerSettings, code, flag, kind};
use crate::limits::{Bucket, Limits};
use crate::{Out, hpack};

/// A connection error: its code and why.
pub(crate) type ConnError = (u32, &'static str);

/// The payload of keep-alive pings.
pub(crate) const PING_KEEPALIVE: [u8; 8] = *b"infermsh";
/// The payload of the ping that follows a graceful GOAWAY.
pub(crate) const PING_DRAIN: [u8; 8] = *b"draining";

/// A frame for the role: about a stream, or news it must act on.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A whole header block (HEADERS and its CONTINUATIONs), not decoded.
    Headers {
        stream: u32,
        end_stream: bool,
        block: Bytes,
        /// The HEADERS frame's priority made the stream depend on itself
        /// (a stream error once the block is decoded).
        depends_on_itself: bool,
    },
    /// DATA: its bytes less padding, and what it took of the connection
    /// window that the role has yet to give back ([`Core::credit`]).
    Data {
        stream: u32,
        end_stream: bool,
        data: Bytes,
        flow: u32,
    },
    /// RST_STREAM.
    Reset { stream: u32, code: u32 },
    /// WINDOW_UPDATE of a stream (the increment may be 0: a stream error).
    StreamWindow { stream: u32, increment: i64 },
    /// A frame the core checked broke the rules for one stream (PRIORITY):
    /// reset it with `code`.
    StreamError { stream: u32, code: u32 },
    /// SETTINGS (already acknowledged; the core applied what is its own).
    Settings(PeerSettings),
    /// The connection window grew: data may go.
    ConnectionWindow,
    /// GOAWAY: no stream above `last` was or will be processed.
    GoAway { last: u32 },
}

/// A header block waiting for its CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    depends_on_itself: bool,
    bytes: BytesMut,
    continuations: usize,
}

/// The shared half of a connection.
#[derive(Debug)]
pub(crate) struct Core {
    /// Bytes to write, in order.
    pub out: Out,
    pub limits: Limits,
    /// What the peer lets the connection send.
    pub send_window: i64,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE.
    pub peer_initial_window: i64,
    /// The peer's SETTINGS_MAX_FRAME_SIZE.
    pub peer_max_frame: usize,
    /// What the peer may still send on the connection.
    recv_window: i64,
    /// Bytes taken and not yet given back as window.
    unacked: u32,
    pub decoder: hpack::Decoder,
    block: Option<Block>,
    /// The peer's first SETTINGS has arrived.
    pub settled: bool,
    /// Frames that carry no work, per time ([`Limits::control_frame_burst`]).
    pub control: Bucket,
    /// Our pings answered (taken by [`Core::take_pong`]).
    pongs: Vec<[u8; 8]>,
    /// Pings of ours out.
    pings_out: Vec<[u8; 8]>,
    /// Why the connection broke; its I/O ends once `out` is written.
    pub failed: Option<&'static str>,
}

impl Core {
    /// A connection core with `limits`; the role queues its preface and
    /// SETTINGS.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            out: Out::default(),
            limits,
            send_window: frame::DEFAULT_WINDOW,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            recv_window: i64::from(limits.connection_window).max(frame::DEFAULT_WINDOW),
            unacked: 0,
            decoder: hpack::Decoder::new(hpack::encode::TABLE_SIZE),
            block: None,
            settled: false,
            control: Bucket::new(limits.control_frame_burst, limits.control_frame_rate),
            pongs: Vec::new(),
            pings_out: Vec::new(),
            failed: None,
        }
    }

    /// Raises the connection's receive window from the default to the
    /// limit (after the role's SETTINGS).
    pub(crate) fn open_connection_window(&mut self) {
        let extra = i64::from(self.limits.connection_window) - frame::DEFAULT_WINDOW;
        if extra > 0 {
            frame::put_window_update(self.out.buf(), 0, extra as u32);
        }
    }

    /// The next frame for the role from `buf` (consuming it), once one is
    /// whole; connection-level frames are handled on the way.
    pub(crate) fn read(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
    ) -> Result<Option<Frame>, ConnError> {
        loop {
            if buf.len() < frame::HEADER_LEN {
                return Ok(None);
            }
            let head = frame::parse_head(buf);
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err((code::FRAME_SIZE_ERROR, "a frame over the maximum size"));
            }
            if buf.len() < frame::HEADER_LEN + head.len {
                // No `reserve` here: the caller's next read reserves room
                // for the rest and more at once (one copy of the partial
                // frame, not two).
                return Ok(None);
            }
            buf.advance(frame::HEADER_LEN);
            let payload = buf.split_to(head.len).freeze();
            if !self.settled && head.kind != kind::SETTINGS {
                return Err((code::PROTOCOL_ERROR, "the first frame was not SETTINGS"));
            }
            if self.block.is_some() && head.kind != kind::CONTINUATION {
                return Err((code::PROTOCOL_ERROR, "a header block was interrupted"));
            }
            if let Some(frame) = self.frame(head, payload, now)? {
                return Ok(Some(frame));
            }
        }
    }

    fn frame(
        &mut self,
        head: frame::Head,
        payload: Bytes,
        now: Instant,
    ) -> Result<Option<Frame>, ConnError> {
        let stream = head.stream;
        match head.kind {
            kind::DATA => {
                if stream == 0 {
                    return Err((code::PROTOCOL_ERROR, "DATA on stream 0"));
                }
                let flow = payload.len() as u32;
                if i64::from(flow) > self.recv_window {
                    return Err((
                        code::FLOW_CONTROL_ERROR,
                        "DATA beyond the connection window",
                    ));
                }
                self.recv_window -= i64::from(flow);
                let range = frame::unpad(&payload, head.flags, kind::DATA)
                    .ok_or((code::PROTOCOL_ERROR, "bad padding"))?;
                let end_stream = head.flags & flag::END_STREAM != 0;
                if flow == 0 && !end_stream {
                    self.spend_control(now)?;
                }
                // Padding is given back at once; the data when it is taken.
                let data = within(payload, range);
                self.credit(flow - data.len() as u32);
                Ok(Some(Frame::Data {
                    stream,
                    end_stream,
                    flow: data.len() as u32,
                    data,
                }))
            }
            kind::HEADERS => {
                if stream == 0 {
                    return Err((code::PROTOCOL_ERROR, "HEADERS on stream 0"));
                }
                let range = frame::unpad(&payload, head.flags, kind::HEADERS)
                    .ok_or((code::PROTOCOL_ERROR, "bad padding"))?;
                let depends_on_itself = head.flags & flag::PRIORITY != 0
                    && frame::priority_dependency(&payload, head.flags) == Some(stream);
                let end_stream = head.flags & flag::END_STREAM != 0;
                if head.flags & flag::END_HEADERS != 0 {
                    return Ok(Some(Frame::Headers {
                        stream,
                        end_stream,
                        block: within(payload, range),
                        depends_on_itself,
                    }));
                }
                self.block = Some(Block {
                    stream,
                    end_stream,
                    depends_on_itself,
                    bytes: BytesMut::from(&payload[range]),
                    continuations: 0,
                });
                Ok(None)
            }
            kind::CONTINUATION => {
                let Some(mut block) = self.block.take() else {
                    return Err((code::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
                };
                if block.stream != stream {
                    return Err((code::PROTOCOL_ERROR, "CONTINUATION on another stream"));
                }
                block.continuations += 1;
                if block.continuations > self.limits.max_continuations() {
                    return Err((
                        code::ENHANCE_YOUR_CALM,
                        "too many CONTINUATION frames in one header block",
                    ));
                }
                if block.bytes.len() + payload.len() > self.limits.max_header_block() {
                    return Err((code::ENHANCE_YOUR_CALM, "a header block too long"));
                }
                block.bytes.extend_from_slice(&payload);
                if head.flags & flag::END_HEADERS == 0 {
                    self.block = Some(block);
                    return Ok(None);
                }
                Ok(Some(Frame::Headers {
                    stream,
                    end_stream: block.end_stream,
                    block: block.bytes.freeze(),
                    depends_on_itself: block.depends_on_itself,
                }))
            }
            kind::PRIORITY => {
                if stream == 0 {
                    return Err((code::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                self.spend_control(now)?;
                if payload.len() != 5 {
                    return Ok(Some(Frame::StreamError {
                        stream,
                        code: code::FRAME_SIZE_ERROR,
                    }));
                }
                if frame::priority_dependency(&payload, flag::PRIORITY) == Some(stream) {
                    return Ok(Some(Frame::StreamError {
                        stream,
                        code: code::PROTOCOL_ERROR,
                    }));
                }
                Ok(None)
            }
            kind::RST_STREAM => {
                if payload.len() != 4 {
                    return Err((code::FRAME_SIZE_ERROR, "RST_STREAM of the wrong size"));
                }
                if stream == 0 {
                    return Err((code::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
                }
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                Ok(Some(Frame::Reset { stream, code }))
            }
            kind::SETTINGS => {
                let Some(set) = frame::read_settings(head, &payload)? else {
                    return Ok(None);
                };
                if self.settled {
                    self.spend_control(now)?;
                }
                self.settled = true;
                if let Some(max) = set.max_frame {
                    self.peer_max_frame = max;
                }
                frame::put_head(self.out.buf(), 0, kind::SETTINGS, flag::ACK, 0);
                Ok(Some(Frame::Settings(set)))
            }
            kind::PING => {
                if payload.len() != 8 {
                    return Err((code::FRAME_SIZE_ERROR, "PING of the wrong size"));
                }
                if stream != 0 {
                    return Err((code::PROTOCOL_ERROR, "PING on a stream"));
                }
                let data: [u8; 8] = payload[..].try_into().expect("8 bytes");
                if head.flags & flag::ACK == 0 {
                    self.spend_control(now)?;
                    frame::put_head(self.out.buf(), 8, kind::PING, flag::ACK, 0);
                    self.out.buf().extend_from_slice(&data);
                } else if let Some(at) = self.pings_out.iter().position(|p| *p == data) {
                    self.pings_out.swap_remove(at);
                    self.pongs.push(data);
                }
                Ok(None)
            }
            kind::GOAWAY => {
                if stream != 0 {
                    return Err((code::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err((code::FRAME_SIZE_ERROR, "GOAWAY too short"));
                }
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                Ok(Some(Frame::GoAway { last }))
            }
            kind::WINDOW_UPDATE => {
                let increment = frame::window_increment(&payload)?;
                if stream != 0 {
                    return Ok(Some(Frame::StreamWindow { stream, increment }));
                }
                frame::grow_connection_window(&mut self.send_window, increment)?;
                Ok(Some(Frame::ConnectionWindow))
            }
            kind::PUSH_PROMISE => Err((code::PROTOCOL_ERROR, "PUSH_PROMISE with push disabled")),
            // Unknown frame types are ignored (RFC 9113 4.1), within the
            // budget of frames that carry no work.
            _ => {
                self.spend_control(now)?;
                Ok(None)
            }
        }
    }

    /// Spends one token of the budget of frames that carry no work.
    fn spend_control(&mut self, now: Instant) -> Result<(), ConnError> {
        if self.control.take(now) {
            Ok(())
        } else {
            Err((
                code::ENHANCE_YOUR_CALM,
                "too many frames that carry no work (SETTINGS, PING, PRIORITY, empty DATA)",
            ))
        }
    }

    /// Gives `n` bytes of connection window back when enough is owed.
    pub(crate) fn credit(&mut self, n: u32) {
        self.unacked += n;
        // Never a zero increment (a protocol error), however small the
        // window.
        if self.unacked > 0 && self.unacked >= self.limits.connection_window / 2 {
            frame::put_window_update(self.out.buf(), 0, self.unacked);
            self.recv_window += i64::from(self.unacked);
            self.unacked = 0;
        }
    }

    /// Sends a PING with `payload` unless one with it is out; whether it
    /// was sent.
    pub(crate) fn ping(&mut self, payload: [u8; 8]) -> bool {
        if self.pings_out.contains(&payload) || self.failed.is_some() {
            return false;
        }
        frame::put_head(self.out.buf(), 8, kind::PING, 0, 0);
        self.out.buf().extend_from_slice(&payload);
        self.pings_out.push(payload);
        true
    }

    /// Whether the answer to our PING with `payload` has arrived (once).
    pub(crate) fn take_pong(&mut self, payload: [u8; 8]) -> bool {
        match self.pongs.iter().position(|p| *p == payload) {
            Some(at) => {
                self.pongs.swap_remove(at);
                true
            }
            None => false,
        }
    }

    /// Ends the connection: GOAWAY with `error` naming `last` as the last
    /// stream processed (none when `error` is `None`: the peer does not
    /// speak HTTP/2).
    pub(crate) fn fail(&mut self, error: Option<u32>, why: &'static str, last: u32) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(why);
        if let Some(error) = error {
            frame::put_goaway(self.out.buf(), last, error);
        }
    }

    /// Writes a header block of stream `id` as HEADERS and CONTINUATIONs
    /// within the peer's frame size.
    pub(crate) fn put_block(&mut self, id: u32, block: &[u8], end_stream: bool) {
        frame::put_header_frames(self.out.buf(), id, block, end_stream, self.peer_max_frame);
    }

    /// Writes what `queue` holds for stream `id` as DATA frames, as far as
    /// the windows allow and while fewer than `max_out` bytes wait for the
    /// socket (`end_stream`: the frame that empties it ends the stream);
    /// the bytes written.
    pub(crate) fn send_data(
        &mut self,
        id: u32,
        queue: &mut SendQueue,
        stream_window: &mut i64,
        end_stream: bool,
        max_out: usize,
    ) -> usize {
        let mut sent = 0;
        while let Some(front) = queue.chunks.front_mut() {
            let room = max_out.saturating_sub(self.out.len());
            let n = (front.len() as i64)
                .min(self.send_window)
                .min(*stream_window)
                .min(self.peer_max_frame as i64)
                .min(room.min(i64::MAX as usize) as i64);
            if n <= 0 {
                break;
            }
            let chunk = if n as usize == front.len() {
                queue.chunks.pop_front().expect("front")
            } else {
                front.split_to(n as usize)
            };
            queue.len -= chunk.len();
            let end = if end_stream && queue.chunks.is_empty() {
                flag::END_STREAM
            } else {
                0
            };
            frame::put_head(self.out.buf(), chunk.len(), kind::DATA, end, id);
            sent += chunk.len();
            self.out.payload(chunk);
            self.send_window -= n;
            *stream_window -= n;
        }
        sent
    }
}

/// Bytes of one stream waiting for the peer's windows.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    chunks: Chunks,
    len: usize,
}

impl SendQueue {
    pub(crate) fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.len += data.len();
            self.chunks.push_back(data);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops what is queued; how many bytes.
    pub(crate) fn clear(&mut self) -> usize {
        self.chunks.clear();
        std::mem::take(&mut self.len)
    }
}

/// `payload` cut to `range` in place: unlike `Bytes::slice`, no second
/// reference to the read buffer is taken and dropped (two atomic updates
/// per frame).
#[inline]
fn within(mut payload: Bytes, range: std::ops::Range<usize>) -> Bytes {
    payload.truncate(range.end);
    payload.advance(range.start);
    payload
}
