//! The server side of one HTTP/2 connection from a client, without I/O:
//! bytes read go in ([`Conn::on_read`]), new requests come out
//! ([`Conn::accept`]), each request's body is taken by its handler
//! ([`Conn::poll_data`]) and its response goes in as head, data and
//! trailers; bytes to write come out ([`Conn::out`]).
//!
//! Everything a client may send is handled (the preface, SETTINGS, PING,
//! WINDOW_UPDATE, RST_STREAM, GOAWAY, PRIORITY, CONTINUATION, padding) and
//! bounded: streams at once (`max_streams`, beyond it REFUSED_STREAM), both
//! receive windows, the header list (`max_header_list`), a header block's
//! bytes, streams reset by the client without one request completing
//! between them (the "rapid reset" attack). What breaks the protocol ends
//! the connection with GOAWAY; what breaks one stream resets that stream.
//!
//! Header blocks towards the client are literals and static-table
//! references, except the few names every response repeats, which go into
//! the client's dynamic table once and are referred to by index after
//! ([`hpack::Indexer`], within the client's HEADER_TABLE_SIZE);
//! the client's blocks are decoded with [`hpack::Decoder`] and the default
//! 4,096-byte table.

use std::collections::VecDeque;
use std::task::Waker;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::frame::{self, code, flag, kind, setting};
use crate::{Out, StreamMap, fields, hpack};

/// Response bytes a stream may queue beyond what the client's windows let
/// it send: a small response then leaves with its headers in one write;
/// beyond it, the response's sender waits for the client to read.
pub const EAGER_BYTES: usize = 64 << 10;
/// Most streams the client may reset with no request completing between
/// them before the connection is closed (ENHANCE_YOUR_CALM). Not small:
/// while the agent stalls, a good client's timed-out attempts pile up as
/// opened-then-reset streams and are read at once (`server.rs`).
pub const MAX_RESETS: usize = 1024;
/// Largest header block in bytes (HEADERS and its CONTINUATIONs), beyond
/// the header list limit: a block that decodes to little can still be long.
const MAX_HEADER_BLOCK: usize = 64 << 10;
/// Most header fields in one block.
const MAX_HEADER_FIELDS: usize = 256;

/// What the agent advertises and enforces on a connection.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Header names every response repeats: added to the client's HPACK
    /// table once and referred to by index after ([`hpack::Indexer`]).
    pub response_names: &'static [&'static str],
    /// Request paths parsed once per connection rather than per request.
    pub known_paths: &'static [&'static str],
    pub max_streams: u32,
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_header_list: u32,
}

/// Why a request's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The client reset the stream with this HTTP/2 error code.
    #[error("the client reset the stream (HTTP/2 error {0:#x})")]
    Reset(u32),
    /// The connection ended or broke.
    #[error("the connection closed")]
    Closed,
}

#[derive(Debug)]
struct Stream {
    /// Request bytes received and not taken yet.
    data: VecDeque<Bytes>,
    /// What the client may still send on this stream.
    recv_window: i64,
    /// Bytes taken and not yet given back as window.
    unacked: u32,
    /// The client ended its side (END_STREAM).
    recv_ended: bool,
    /// Reset by the client (its code) or by the agent.
    reset: Option<u32>,
    /// The body's reader, waiting for data.
    reader: Option<Waker>,
    /// The request's handler, woken when the stream is reset.
    handler: Option<Waker>,
    /// What the client lets this stream send.
    send_window: i64,
    /// Response bytes waiting for window.
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// The response's last frame, sent after `pending`.
    last: Option<Last>,
    /// The response is complete on the wire.
    sent_end: bool,
    /// The response's sender, waiting for `pending` to drain.
    writer: Option<Waker>,
    /// The handler has finished (or was dropped).
    done: bool,
}

/// The frame that ends a response.
#[derive(Debug)]
enum Last {
    /// Trailers, encoded when they are written: blocks must be encoded in
    /// the order they leave ([`hpack::Indexer`]).
    Trailers(HeaderMap),
    /// END_STREAM on an empty DATA frame (a response without trailers).
    Data,
}

/// The connection's state.
pub struct Conn {
    /// Bytes to write, in order.
    pub out: Out,
    settings: Settings,
    streams: StreamMap<Stream>,
    /// New requests, for the driver to start.
    accepted: VecDeque<(u32, Request<()>)>,
    /// Highest stream id the client opened.
    last_id: u32,
    /// Streams with response bytes waiting for window, oldest first.
    sending: VecDeque<u32>,
    send_window: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    recv_window: i64,
    unacked: u32,
    decoder: hpack::Decoder,
    /// [`Settings::known_paths`], parsed.
    known_paths: Vec<Uri>,
    /// The client's dynamic table, as the agent's response blocks fill it.
    indexer: hpack::Indexer,
    /// Where header blocks are encoded (kept: no allocation per block).
    scratch: Vec<u8>,
    /// A header block waiting for its CONTINUATION frames.
    block: Option<(u32, u8, BytesMut)>,
    /// Bytes of the client's preface still expected.
    preface_left: usize,
    /// The client's first SETTINGS has arrived.
    settled: bool,
    /// GOAWAY sent: streams above this id are refused.
    going_away: Option<u32>,
    /// The connection broke (why); its I/O should end after `out` is written.
    failed: Option<&'static str>,
    /// The client sent GOAWAY or closed: no new streams will come.
    peer_gone: bool,
    /// Client resets since a request last completed.
    resets: usize,
    /// A PING of ours is out.
    ping_out: bool,
    /// Its ACK arrived (taken by [`Conn::take_pong`]).
    pong: bool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("streams", &self.streams.len())
            .field("last_id", &self.last_id)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// The opaque payload of the agent's keep-alive pings.
const PING_PAYLOAD: &[u8; 8] = b"infermsh";

impl Conn {
    /// A connection whose SETTINGS (and connection window) are queued.
    pub fn new(settings: Settings) -> Self {
        let mut conn = Self {
            out: Out::default(),
            settings,
            streams: StreamMap::default(),
            accepted: VecDeque::new(),
            last_id: 0,
            sending: VecDeque::new(),
            send_window: frame::DEFAULT_WINDOW,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            recv_window: i64::from(settings.connection_window).max(frame::DEFAULT_WINDOW),
            unacked: 0,
            decoder: hpack::Decoder::new(4096),
            known_paths: settings
                .known_paths
                .iter()
                .map(|p| Uri::from_static(p))
                .collect(),
            indexer: hpack::Indexer::new(settings.response_names),
            scratch: Vec::new(),
            block: None,
            preface_left: frame::PREFACE.len(),
            settled: false,
            going_away: None,
            failed: None,
            peer_gone: false,
            resets: 0,
            ping_out: false,
            pong: false,
        };
        let out = conn.out.buf();
        frame::put_settings(
            out,
            &[
                (setting::MAX_CONCURRENT_STREAMS, settings.max_streams),
                (setting::INITIAL_WINDOW_SIZE, settings.stream_window),
                (setting::MAX_HEADER_LIST_SIZE, settings.max_header_list),
            ],
        );
        let extra = i64::from(settings.connection_window) - frame::DEFAULT_WINDOW;
        if extra > 0 {
            frame::put_window_update(out, 0, extra as u32);
        }
        conn
    }

    /// Why the connection broke, if it did.
    pub fn failed(&self) -> Option<&'static str> {
        self.failed
    }

    /// The preface and the client's SETTINGS have arrived.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Streams open (a handler running or a response being sent).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Nothing more will happen here: GOAWAY went out (or the client
    /// left) and every stream is finished.
    pub fn is_finished(&self) -> bool {
        (self.going_away.is_some() || self.peer_gone) && self.streams.is_empty()
    }

    /// The next new request and its stream id.
    pub fn accept(&mut self) -> Option<(u32, Request<()>)> {
        self.accepted.pop_front()
    }

    /// Sends GOAWAY (no error): streams opened so far finish, later ones
    /// are refused.
    pub fn go_away(&mut self) {
        if self.going_away.is_none() && self.failed.is_none() {
            self.going_away = Some(self.last_id);
            frame::put_goaway(self.out.buf(), self.last_id, code::NO_ERROR);
        }
    }

    /// Sends a keep-alive PING unless one is out; whether it was sent.
    pub fn ping(&mut self) -> bool {
        if self.ping_out || self.failed.is_some() {
            return false;
        }
        frame::put_head(self.out.buf(), 8, kind::PING, 0, 0);
        self.out.buf().extend_from_slice(PING_PAYLOAD);
        self.ping_out = true;
        true
    }

    /// Whether the answer to the PING out has arrived (once).
    pub fn take_pong(&mut self) -> bool {
        std::mem::take(&mut self.pong)
    }

    /// Handles the bytes in `buf` (consuming complete frames); returns the
    /// wakers of the streams that changed, to be woken outside any lock.
    pub fn on_read(&mut self, buf: &mut BytesMut, wake: &mut Vec<Waker>) {
        if self.preface_left > 0 {
            let at = frame::PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(buf.len());
            if buf[..n] != frame::PREFACE[at..at + n] {
                // Not HTTP/2 (an HTTP/1 request, a scanner): no GOAWAY.
                self.fail(None, "not an HTTP/2 connection preface", wake);
                return;
            }
            buf.advance(n);
            self.preface_left -= n;
            if self.preface_left > 0 {
                return;
            }
        }
        while self.failed.is_none() && buf.len() >= frame::HEADER_LEN {
            let head = frame::parse_head(buf);
            if head.len > frame::DEFAULT_MAX_FRAME {
                self.fail(
                    Some(code::FRAME_SIZE_ERROR),
                    "a frame over the maximum size",
                    wake,
                );
                return;
            }
            if buf.len() < frame::HEADER_LEN + head.len {
                buf.reserve(frame::HEADER_LEN + head.len - buf.len());
                return;
            }
            buf.advance(frame::HEADER_LEN);
            let payload = buf.split_to(head.len).freeze();
            if !self.settled && head.kind != kind::SETTINGS {
                self.fail(
                    Some(code::PROTOCOL_ERROR),
                    "the first frame was not SETTINGS",
                    wake,
                );
                return;
            }
            if let Err((error, why)) = self.frame(head, payload, wake) {
                self.fail(Some(error), why, wake);
            }
        }
    }

    fn frame(
        &mut self,
        head: frame::Head,
        payload: Bytes,
        wake: &mut Vec<Waker>,
    ) -> Result<(), (u32, &'static str)> {
        if self.block.is_some() && head.kind != kind::CONTINUATION {
            return Err((code::PROTOCOL_ERROR, "a header block was interrupted"));
        }
        match head.kind {
            kind::DATA => self.data(head, payload, wake),
            kind::HEADERS => {
                if head.stream == 0 {
                    return Err((code::PROTOCOL_ERROR, "HEADERS on stream 0"));
                }
                let range = frame::unpad(&payload, head.flags, kind::HEADERS)
                    .ok_or((code::PROTOCOL_ERROR, "bad padding"))?;
                if head.flags & flag::END_HEADERS != 0 {
                    self.headers(head.stream, head.flags, &payload[range], wake)
                } else {
                    let block = BytesMut::from(&payload[range]);
                    self.block = Some((head.stream, head.flags, block));
                    Ok(())
                }
            }
            kind::CONTINUATION => {
                let Some((stream, flags, mut block)) = self.block.take() else {
                    return Err((code::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
                };
                if stream != head.stream {
                    return Err((code::PROTOCOL_ERROR, "CONTINUATION on another stream"));
                }
                let limit = MAX_HEADER_BLOCK.max(self.settings.max_header_list as usize);
                if block.len() + payload.len() > limit {
                    return Err((code::ENHANCE_YOUR_CALM, "a header block too long"));
                }
                block.extend_from_slice(&payload);
                if head.flags & flag::END_HEADERS != 0 {
                    self.headers(stream, flags, &block, wake)
                } else {
                    self.block = Some((stream, flags, block));
                    Ok(())
                }
            }
            kind::RST_STREAM => {
                if payload.len() != 4 {
                    return Err((code::FRAME_SIZE_ERROR, "RST_STREAM of the wrong size"));
                }
                if head.stream == 0 || head.stream > self.last_id {
                    return Err((code::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
                }
                let error = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if let Some(stream) = self.streams.get_mut(&head.stream) {
                    if stream.reset.is_none() && !stream.sent_end {
                        self.resets += 1;
                        if self.resets > MAX_RESETS {
                            return Err((code::ENHANCE_YOUR_CALM, "too many streams reset"));
                        }
                    }
                    self.reset_stream(head.stream, error, false, wake);
                }
                Ok(())
            }
            kind::SETTINGS => self.settings(head, &payload, wake),
            kind::PING => {
                if payload.len() != 8 {
                    return Err((code::FRAME_SIZE_ERROR, "PING of the wrong size"));
                }
                if head.stream != 0 {
                    return Err((code::PROTOCOL_ERROR, "PING on a stream"));
                }
                if head.flags & flag::ACK == 0 {
                    frame::put_head(self.out.buf(), 8, kind::PING, flag::ACK, 0);
                    self.out.buf().extend_from_slice(&payload);
                } else if self.ping_out && &payload[..] == PING_PAYLOAD {
                    self.ping_out = false;
                    self.pong = true;
                }
                Ok(())
            }
            kind::GOAWAY => {
                // The client opens nothing more; what it has open finishes.
                self.peer_gone = true;
                Ok(())
            }
            kind::WINDOW_UPDATE => {
                let inc = frame::window_increment(&payload)?;
                if head.stream == 0 {
                    frame::grow_connection_window(&mut self.send_window, inc)?;
                    self.send_pending(wake);
                } else if let Some(stream) = self.streams.get_mut(&head.stream) {
                    stream.send_window += inc;
                    if inc == 0 || stream.send_window > frame::MAX_WINDOW {
                        self.reset_stream(head.stream, code::FLOW_CONTROL_ERROR, true, wake);
                    } else {
                        self.send_pending(wake);
                    }
                }
                Ok(())
            }
            kind::PUSH_PROMISE => Err((code::PROTOCOL_ERROR, "PUSH_PROMISE from a client")),
            // PRIORITY and unknown frame types are ignored.
            _ => Ok(()),
        }
    }

    fn data(
        &mut self,
        head: frame::Head,
        payload: Bytes,
        wake: &mut Vec<Waker>,
    ) -> Result<(), (u32, &'static str)> {
        if head.stream == 0 {
            return Err((code::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        if head.stream > self.last_id {
            return Err((code::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let len = payload.len() as i64;
        if len > self.recv_window {
            return Err((
                code::FLOW_CONTROL_ERROR,
                "DATA beyond the connection window",
            ));
        }
        self.recv_window -= len;
        let range = frame::unpad(&payload, head.flags, kind::DATA)
            .ok_or((code::PROTOCOL_ERROR, "bad padding"))?;
        // Padding is given back at once; data when the handler takes it.
        let mut credit = (len as usize - range.len()) as u32;
        let end = head.flags & flag::END_STREAM != 0;
        match self.streams.get_mut(&head.stream) {
            Some(stream) if stream.reset.is_none() => {
                if stream.recv_ended {
                    self.reset_stream(head.stream, code::STREAM_CLOSED, true, wake);
                    credit = len as u32;
                } else if len > stream.recv_window {
                    self.reset_stream(head.stream, code::FLOW_CONTROL_ERROR, true, wake);
                    credit = len as u32;
                } else {
                    stream.recv_window -= len;
                    if !range.is_empty() {
                        stream.data.push_back(payload.slice(range));
                    }
                    stream.recv_ended = end;
                    wake.extend(stream.reader.take());
                    if end {
                        self.reap(head.stream);
                    }
                }
            }
            // A stream reset or finished here: nobody takes its data.
            _ => credit = len as u32,
        }
        self.credit(credit);
        Ok(())
    }

    fn headers(
        &mut self,
        id: u32,
        flags: u8,
        block: &[u8],
        wake: &mut Vec<Waker>,
    ) -> Result<(), (u32, &'static str)> {
        // Decoded whatever the stream, to keep the HPACK state in step.
        let mut head = RequestHead::default();
        let limit = self.settings.max_header_list as usize;
        self.decoder
            .decode(block, |name, value| {
                head.field(name, value, limit, &self.known_paths)
            })
            .map_err(|_| (code::COMPRESSION_ERROR, "a header block did not decode"))?;
        let end = flags & flag::END_STREAM != 0;
        if id <= self.last_id {
            // Trailers of a request (or headers on a closed stream).
            if let Some(stream) = self.streams.get_mut(&id) {
                if stream.reset.is_none() {
                    if !end || stream.recv_ended {
                        self.reset_stream(id, code::PROTOCOL_ERROR, true, wake);
                    } else {
                        stream.recv_ended = true;
                        wake.extend(stream.reader.take());
                        self.reap(id);
                    }
                }
            }
            return Ok(());
        }
        if id % 2 == 0 {
            return Err((code::PROTOCOL_ERROR, "a client opened an even stream id"));
        }
        self.last_id = id;
        if self.going_away.is_some() || self.streams.len() >= self.settings.max_streams as usize {
            frame::put_reset(self.out.buf(), id, code::REFUSED_STREAM);
            return Ok(());
        }
        let mut stream = Stream {
            data: VecDeque::new(),
            recv_window: i64::from(self.settings.stream_window).max(frame::DEFAULT_WINDOW),
            unacked: 0,
            recv_ended: end,
            reset: None,
            reader: None,
            handler: None,
            send_window: self.peer_initial_window,
            pending: VecDeque::new(),
            pending_len: 0,
            last: None,
            sent_end: false,
            writer: None,
            done: false,
        };
        match head.into_request() {
            Ok(req) => {
                self.streams.insert(id, stream);
                self.accepted.push_back((id, req));
            }
            Err(Refusal::TooLarge) => {
                // Answered here, as gRPC: the caller sees why.
                stream.done = true;
                self.streams.insert(id, stream);
                let mut trailers = HeaderMap::new();
                trailers.insert("content-type", HeaderValue::from_static("application/grpc"));
                trailers.insert("grpc-status", HeaderValue::from_static("8"));
                trailers.insert(
                    "grpc-message",
                    HeaderValue::from_static("request headers over the agent's limit"),
                );
                self.send_head(id, 200, &trailers, true);
            }
            Err(Refusal::Malformed) => {
                frame::put_reset(self.out.buf(), id, code::PROTOCOL_ERROR);
            }
        }
        Ok(())
    }

    fn settings(
        &mut self,
        head: frame::Head,
        payload: &[u8],
        wake: &mut Vec<Waker>,
    ) -> Result<(), (u32, &'static str)> {
        let Some(set) = frame::read_settings(head, payload)? else {
            return Ok(());
        };
        self.settled = true;
        if let Some(window) = set.initial_window {
            let streams = self.streams.values_mut().map(|s| &mut s.send_window);
            frame::shift_windows(&mut self.peer_initial_window, window, streams)?;
        }
        if let Some(max) = set.max_frame {
            self.peer_max_frame = max;
        }
        if let Some(size) = set.header_table_size {
            self.indexer.set_limit(size);
        }
        // The client's stream limit binds pushes only.
        frame::put_head(self.out.buf(), 0, kind::SETTINGS, flag::ACK, 0);
        self.send_pending(wake);
        Ok(())
    }

    /// Gives `n` bytes of connection window back when enough is owed.
    fn credit(&mut self, n: u32) {
        self.unacked += n;
        if self.unacked >= self.settings.connection_window / 2 {
            frame::put_window_update(self.out.buf(), 0, self.unacked);
            self.recv_window += i64::from(self.unacked);
            self.unacked = 0;
        }
    }

    /// Resets stream `id` (sending RST_STREAM with `error` when `send`),
    /// dropping what it holds and waking whoever waits on it.
    fn reset_stream(&mut self, id: u32, error: u32, send: bool, wake: &mut Vec<Waker>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.reset.is_some() {
            return;
        }
        stream.reset = Some(error);
        if send {
            frame::put_reset(self.out.buf(), id, error);
        }
        let held: usize = stream.data.drain(..).map(|d| d.len()).sum();
        stream.pending.clear();
        stream.pending_len = 0;
        stream.last = None;
        wake.extend(stream.reader.take());
        wake.extend(stream.writer.take());
        wake.extend(stream.handler.take());
        if held > 0 {
            self.credit(held as u32);
        }
        self.reap(id);
    }

    /// Ends the connection: GOAWAY with `error` (when given), every
    /// stream failed.
    fn fail(&mut self, error: Option<u32>, why: &'static str, wake: &mut Vec<Waker>) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(why);
        if let Some(error) = error {
            frame::put_goaway(self.out.buf(), self.last_id, error);
        }
        self.close_all(wake);
    }

    /// The connection is gone (closed by the client, or dropped): every
    /// stream is failed and its waiters woken.
    pub fn close_all(&mut self, wake: &mut Vec<Waker>) {
        self.peer_gone = true;
        for stream in self.streams.values_mut() {
            if stream.reset.is_none() {
                stream.reset = Some(code::CANCEL);
            }
            stream.data.clear();
            stream.pending.clear();
            wake.extend(stream.reader.take());
            wake.extend(stream.writer.take());
            wake.extend(stream.handler.take());
        }
        self.sending.clear();
    }

    /// Removes stream `id` once nothing more happens on it: the handler is
    /// done and the response is on the wire (or the stream was reset). A
    /// client still sending is told to stop (RST_STREAM NO_ERROR).
    fn reap(&mut self, id: u32) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        if !stream.done || !(stream.sent_end || stream.reset.is_some()) {
            return;
        }
        let stream = self.streams.remove(&id).expect("present");
        if stream.reset.is_none() {
            self.resets = 0;
            if !stream.recv_ended && self.failed.is_none() {
                frame::put_reset(self.out.buf(), id, code::NO_ERROR);
            }
        }
        let held: usize = stream.data.iter().map(Bytes::len).sum();
        if held > 0 {
            self.credit(held as u32);
        }
    }

    /// The next request bytes of stream `id` (`None` at the end), or the
    /// waker is kept. Bytes taken are given back to the client as window.
    pub fn poll_data(
        &mut self,
        id: u32,
        waker: &Waker,
    ) -> Option<Option<Result<Bytes, StreamError>>> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Some(Some(Err(StreamError::Closed)));
        };
        if let Some(error) = stream.reset {
            return Some(Some(Err(if self.failed.is_some() || self.peer_gone {
                StreamError::Closed
            } else {
                StreamError::Reset(error)
            })));
        }
        if let Some(data) = stream.data.pop_front() {
            let n = data.len() as u32;
            stream.unacked += n;
            if !stream.recv_ended && stream.unacked >= self.settings.stream_window / 2 {
                let inc = stream.unacked;
                stream.unacked = 0;
                stream.recv_window += i64::from(inc);
                frame::put_window_update(self.out.buf(), id, inc);
            }
            self.credit(n);
            return Some(Some(Ok(data)));
        }
        if stream.recv_ended {
            return Some(None);
        }
        remember(&mut stream.reader, waker);
        None
    }

    /// Whether the request body of `id` has ended (all of it taken).
    pub fn is_end_stream(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .is_none_or(|s| s.recv_ended && s.data.is_empty())
    }

    /// Whether stream `id` was reset (or the connection lost); if not, the
    /// handler's waker is kept to be woken when it is.
    pub fn poll_reset(&mut self, id: u32, waker: &Waker) -> bool {
        match self.streams.get_mut(&id) {
            Some(stream) if stream.reset.is_none() => {
                remember(&mut stream.handler, waker);
                false
            }
            _ => true,
        }
    }

    /// Queues the response head of stream `id` (`end`: it is the whole
    /// response, a trailers-only answer).
    pub fn send_head(&mut self, id: u32, status: u16, headers: &HeaderMap, end: bool) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.reset.is_some() {
            return;
        }
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        hpack::encode::put_response_block(&mut block, &mut self.indexer, status, headers);
        self.put_block(id, &block, end);
        self.scratch = block;
        if end {
            if let Some(stream) = self.streams.get_mut(&id) {
                stream.sent_end = true;
            }
            self.reap(id);
        }
    }

    /// A header block as HEADERS and CONTINUATIONs within the client's
    /// frame size.
    fn put_block(&mut self, id: u32, block: &[u8], end: bool) {
        frame::put_header_frames(self.out.buf(), id, block, end, self.peer_max_frame);
    }

    /// Ready when stream `id` may queue more response data (less than
    /// [`EAGER_BYTES`] wait for window); `Some(false)`: the stream is gone.
    pub fn poll_send_ready(&mut self, id: u32, waker: &Waker) -> Option<bool> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Some(false);
        };
        if stream.reset.is_some() {
            return Some(false);
        }
        if stream.pending_len < EAGER_BYTES {
            return Some(true);
        }
        remember(&mut stream.writer, waker);
        None
    }

    /// Queues response data of stream `id`; it leaves as the windows allow.
    pub fn send_data(&mut self, id: u32, data: Bytes, wake: &mut Vec<Waker>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.reset.is_some() || stream.last.is_some() || data.is_empty() {
            return;
        }
        let waiting = !stream.pending.is_empty();
        stream.pending_len += data.len();
        stream.pending.push_back(data);
        if !waiting {
            self.sending.push_back(id);
        }
        self.send_pending(wake);
    }

    /// Ends the response of stream `id` with `trailers` (or, without,
    /// with an empty DATA frame), after its data.
    pub fn send_end(&mut self, id: u32, trailers: Option<&HeaderMap>, wake: &mut Vec<Waker>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.reset.is_some() || stream.last.is_some() || stream.sent_end {
            return;
        }
        if !stream.pending.is_empty() {
            // After the data still waiting for window.
            stream.last = Some(match trailers {
                Some(t) => Last::Trailers(t.clone()),
                None => Last::Data,
            });
            self.send_pending(wake);
            return;
        }
        stream.sent_end = true;
        match trailers {
            Some(t) => {
                let mut block = std::mem::take(&mut self.scratch);
                block.clear();
                hpack::encode::put_trailer_block(&mut block, &mut self.indexer, t);
                self.put_block(id, &block, true);
                self.scratch = block;
            }
            None => frame::put_head(self.out.buf(), 0, kind::DATA, flag::END_STREAM, id),
        }
        self.reap(id);
    }

    /// Writes stream `id`'s last frame, now that its data has left.
    fn put_last(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(last) = stream.last.take() else {
            return;
        };
        stream.sent_end = true;
        match last {
            Last::Trailers(t) => {
                let mut block = std::mem::take(&mut self.scratch);
                block.clear();
                hpack::encode::put_trailer_block(&mut block, &mut self.indexer, &t);
                self.put_block(id, &block, true);
                self.scratch = block;
            }
            Last::Data => frame::put_head(self.out.buf(), 0, kind::DATA, flag::END_STREAM, id),
        }
        self.reap(id);
    }

    /// Resets stream `id` from the agent's side (the handler failed).
    pub fn send_reset(&mut self, id: u32, error: u32, wake: &mut Vec<Waker>) {
        self.reset_stream(id, error, true, wake);
    }

    /// The handler of stream `id` is finished (or dropped): a response not
    /// complete is reset (CANCEL), one still waiting for window finishes.
    pub fn finish(&mut self, id: u32, wake: &mut Vec<Waker>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.done = true;
        stream.handler = None;
        if stream.reset.is_none() && !stream.sent_end && stream.last.is_none() {
            self.reset_stream(id, code::CANCEL, true, wake);
        }
        self.reap(id);
    }

    /// Writes response data the windows allow, oldest stream first; a
    /// stream whose own window is shut does not hold up the others.
    fn send_pending(&mut self, wake: &mut Vec<Waker>) {
        let mut waiting = self.sending.len();
        while waiting > 0 && self.send_window > 0 {
            waiting -= 1;
            let Some(id) = self.sending.pop_front() else {
                return;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            while let Some(front) = stream.pending.front_mut() {
                let n = (front.len() as i64)
                    .min(self.send_window)
                    .min(stream.send_window)
                    .min(self.peer_max_frame as i64);
                if n <= 0 {
                    break;
                }
                let chunk = if n as usize == front.len() {
                    stream.pending.pop_front().expect("front")
                } else {
                    front.split_to(n as usize)
                };
                stream.pending_len -= chunk.len();
                frame::put_head(self.out.buf(), chunk.len(), kind::DATA, 0, id);
                self.out.payload(chunk);
                self.send_window -= n;
                stream.send_window -= n;
            }
            if stream.pending_len < EAGER_BYTES {
                wake.extend(stream.writer.take());
            }
            if !stream.pending.is_empty() {
                // Blocked by a window: its turn comes again after the rest.
                self.sending.push_back(id);
            } else if stream.last.is_some() {
                self.put_last(id);
            }
        }
    }
}

/// Why a request head was not accepted.
enum Refusal {
    /// Over the header list limit (answered with RESOURCE_EXHAUSTED).
    TooLarge,
    /// Broke HTTP/2's rules for requests (the stream is reset).
    Malformed,
}

/// A request head as it is decoded.
#[derive(Default)]
struct RequestHead {
    method: Option<Method>,
    path: Option<Uri>,
    scheme: bool,
    headers: HeaderMap,
    size: usize,
    fields: usize,
    too_large: bool,
    malformed: bool,
}

impl RequestHead {
    fn field(&mut self, name: &[u8], value: &[u8], limit: usize, known: &[Uri]) {
        self.fields += 1;
        self.size += name.len() + value.len() + 32;
        if self.size > limit || self.fields > MAX_HEADER_FIELDS {
            self.too_large = true;
        }
        if self.too_large || self.malformed {
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.headers.is_empty() {
                self.malformed = true;
                return;
            }
            match pseudo {
                b"method" if self.method.is_none() => match value {
                    b"POST" => self.method = Some(Method::POST),
                    _ => match Method::from_bytes(value) {
                        Ok(m) => self.method = Some(m),
                        Err(_) => self.malformed = true,
                    },
                },
                b"path" if self.path.is_none() => {
                    // A known path is cloned: parsing is most of the cost.
                    let uri = match known.iter().find(|u| u.path().as_bytes() == value) {
                        Some(u) => Ok(u.clone()),
                        None => Uri::try_from(value),
                    };
                    match uri {
                        Ok(u) if u.scheme().is_none() && value.first() == Some(&b'/') => {
                            self.path = Some(u)
                        }
                        _ => self.malformed = true,
                    }
                }
                b"scheme" if !self.scheme => self.scheme = true,
                b"authority" => {}
                _ => self.malformed = true,
            }
            return;
        }
        if fields::connection_specific_bytes(name) || (name == b"te" && value != b"trailers") {
            self.malformed = true;
            return;
        }
        match (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            (Ok(n), Ok(v)) if n.as_str().as_bytes() == name => {
                self.headers.append(n, v);
            }
            // Upper case names are malformed in HTTP/2.
            _ => self.malformed = true,
        }
    }

    fn into_request(self) -> Result<Request<()>, Refusal> {
        if self.too_large {
            return Err(Refusal::TooLarge);
        }
        let (Some(method), Some(path), true, false) =
            (self.method, self.path, self.scheme, self.malformed)
        else {
            return Err(Refusal::Malformed);
        };
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = path;
        *req.version_mut() = Version::HTTP_2;
        *req.headers_mut() = self.headers;
        Ok(req)
    }
}

fn remember(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

    const SETTINGS: Settings = Settings {
        response_names: &["content-type", "grpc-status", "infermesh-busy"],
        known_paths: &[MODEL_INFER_PATH],
        max_streams: 4,
        stream_window: 1 << 20,
        connection_window: 4 << 20,
        max_header_list: 16 << 10,
    };

    /// A frame as the agent wrote it.
    #[derive(Debug)]
    struct Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    }

    /// Takes everything the connection has queued, as frames.
    fn written(conn: &mut Conn) -> Vec<Frame> {
        let mut bytes = Vec::new();
        loop {
            let mut slices = [IoSlice::new(&[]); 8];
            let n = conn.out.slices(&mut slices);
            if n == 0 {
                break;
            }
            let len: usize = slices[..n].iter().map(|s| s.len()).sum();
            for s in &slices[..n] {
                bytes.extend_from_slice(s);
            }
            conn.out.advance(len);
        }
        let mut frames = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let head = frame::parse_head(&bytes[at..]);
            at += frame::HEADER_LEN;
            frames.push(Frame {
                kind: head.kind,
                flags: head.flags,
                stream: head.stream,
                payload: bytes[at..at + head.len].to_vec(),
            });
            at += head.len;
        }
        frames
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> BytesMut {
        let mut f = BytesMut::new();
        frame::put_head(&mut f, payload.len(), kind, flags, stream);
        f.extend_from_slice(payload);
        f
    }

    fn feed(conn: &mut Conn, bytes: &[u8]) -> Vec<Waker> {
        let mut buf = BytesMut::from(bytes);
        let mut wake = Vec::new();
        conn.on_read(&mut buf, &mut wake);
        wake
    }

    /// A connection past the handshake, with the client's `settings`.
    fn settled(settings: Settings, client: &[(u16, u32)]) -> Conn {
        let mut conn = Conn::new(settings);
        let mut hello = BytesMut::from(frame::PREFACE);
        let mut payload = Vec::new();
        for &(id, value) in client {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        hello.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &payload));
        feed(&mut conn, &hello);
        assert!(conn.is_settled());
        written(&mut conn);
        conn
    }

    fn request_block() -> Vec<u8> {
        let mut meta = HeaderMap::new();
        meta.insert("content-type", HeaderValue::from_static("application/grpc"));
        let mut block = Vec::new();
        crate::request::put_request_block(
            &mut block,
            b"agent",
            MODEL_INFER_PATH.as_bytes(),
            (&meta).into(),
        );
        block
    }

    fn open(conn: &mut Conn, id: u32, body: &[u8]) {
        let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, id, &request_block());
        bytes.extend_from_slice(&frame(kind::DATA, flag::END_STREAM, id, body));
        feed(conn, &bytes);
    }

    fn decode(block: &[u8]) -> Vec<(String, String)> {
        loona_hpack::Decoder::new()
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    fn noop() -> Waker {
        Waker::noop().clone()
    }

    #[test]
    fn the_handshake_sends_settings_and_acknowledges_the_clients() {
        let mut conn = Conn::new(SETTINGS);
        let frames = written(&mut conn);
        assert_eq!(frames[0].kind, kind::SETTINGS);
        assert_eq!(frames[0].payload.len(), 18, "three settings");
        assert_eq!(frames[1].kind, kind::WINDOW_UPDATE);
        // The preface may arrive in pieces.
        feed(&mut conn, &frame::PREFACE[..10]);
        assert!(conn.failed().is_none());
        let mut rest = BytesMut::from(&frame::PREFACE[10..]);
        rest.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &[]));
        feed(&mut conn, &rest);
        assert!(conn.is_settled());
        let frames = written(&mut conn);
        assert_eq!(
            (frames[0].kind, frames[0].flags),
            (kind::SETTINGS, flag::ACK)
        );
    }

    #[test]
    fn a_client_that_does_not_speak_http2_is_dropped_without_goaway() {
        let mut conn = Conn::new(SETTINGS);
        written(&mut conn);
        feed(&mut conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(conn.failed().is_some());
        assert!(written(&mut conn).is_empty());
        let mut conn = Conn::new(SETTINGS);
        let mut bytes = BytesMut::from(frame::PREFACE);
        bytes.extend_from_slice(&frame(kind::PING, 0, 0, b"12345678"));
        feed(&mut conn, &bytes);
        assert_eq!(conn.failed(), Some("the first frame was not SETTINGS"));
    }

    #[test]
    fn a_request_is_accepted_read_and_answered_in_order() {
        let mut conn = settled(SETTINGS, &[]);
        open(&mut conn, 1, b"hello");
        let (id, req) = conn.accept().expect("a request");
        assert_eq!(id, 1);
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), MODEL_INFER_PATH);
        assert_eq!(req.headers()["content-type"], "application/grpc");
        let waker = noop();
        assert_eq!(
            conn.poll_data(1, &waker),
            Some(Some(Ok(Bytes::from_static(b"hello"))))
        );
        assert_eq!(conn.poll_data(1, &waker), Some(None));
        assert!(conn.is_end_stream(1));

        let mut head = HeaderMap::new();
        head.insert("content-type", HeaderValue::from_static("application/grpc"));
        conn.send_head(1, 200, &head, false);
        let mut wake = Vec::new();
        conn.send_data(1, Bytes::from_static(b"world"), &mut wake);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        conn.send_end(1, Some(&trailers), &mut wake);
        conn.finish(1, &mut wake);
        assert_eq!(conn.open_streams(), 0);
        let frames = written(&mut conn);
        let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.kind, f.flags)).collect();
        assert_eq!(
            kinds,
            [
                (kind::HEADERS, flag::END_HEADERS),
                (kind::DATA, 0),
                (kind::HEADERS, flag::END_HEADERS | flag::END_STREAM),
            ]
        );
        assert_eq!(
            decode(&frames[0].payload),
            [
                (":status".into(), "200".into()),
                ("content-type".into(), "application/grpc".into())
            ]
        );
        assert_eq!(frames[1].payload, b"world");
        assert_eq!(
            decode(&frames[2].payload),
            [("grpc-status".into(), "0".into())]
        );
    }

    #[test]
    fn response_data_waits_for_the_clients_windows_and_trailers_wait_for_the_data() {
        let mut conn = settled(SETTINGS, &[(setting::INITIAL_WINDOW_SIZE, 10)]);
        open(&mut conn, 1, b"x");
        conn.accept().unwrap();
        conn.send_head(1, 200, &HeaderMap::new(), false);
        let mut wake = Vec::new();
        conn.send_data(1, Bytes::from(vec![7u8; 25]), &mut wake);
        conn.send_end(1, Some(&HeaderMap::new()), &mut wake);
        conn.finish(1, &mut wake);
        let frames = written(&mut conn);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[1].payload.len(), 10);
        assert_eq!(conn.open_streams(), 1, "finishing after the handler ended");
        let update = 15u32.to_be_bytes();
        feed(&mut conn, &frame(kind::WINDOW_UPDATE, 0, 1, &update));
        let frames = written(&mut conn);
        assert_eq!(frames[0].payload.len(), 15);
        assert_eq!(frames[1].kind, kind::HEADERS);
        assert_ne!(frames[1].flags & flag::END_STREAM, 0);
        assert_eq!(conn.open_streams(), 0);
    }

    fn fields(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for &(n, v) in pairs {
            map.insert(n, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    /// Every header block written, in wire order, decoded by one decoder
    /// (loona-hpack) whose table has the size `table` the client set.
    fn decode_all(frames: &[Frame], table: usize) -> Vec<(u32, Vec<(String, String)>)> {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(table);
        decoder.set_max_table_size(table);
        frames
            .iter()
            .filter(|f| f.kind == kind::HEADERS)
            .map(|f| {
                let fields = decoder
                    .decode(&f.payload)
                    .unwrap_or_else(|e| panic!("stream {}: {e:?}", f.stream))
                    .into_iter()
                    .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                    .collect();
                (f.stream, fields)
            })
            .collect()
    }

    fn strings(status: Option<&str>, map: &HeaderMap) -> Vec<(String, String)> {
        let status = status.map(|s| (":status".to_string(), s.to_string()));
        status
            .into_iter()
            .chain(
                map.iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())),
            )
            .collect()
    }

    /// Response blocks add their names to the client's HPACK table only
    /// within the size its SETTINGS allow, after telling it the size: a
    /// decoder holding the client's 50 bytes reads every block of three
    /// responses (the agent's table would otherwise overflow it, and the
    /// later references would miss).
    #[test]
    fn response_blocks_fill_the_clients_table_only_within_its_size() {
        for table in [50, 0, 4096] {
            let mut conn = settled(SETTINGS, &[(setting::HEADER_TABLE_SIZE, table as u32)]);
            let head = fields(&[("content-type", "application/grpc")]);
            let mut want = Vec::new();
            let mut wake = Vec::new();
            for (id, busy) in [(1, "0.5"), (3, "0.5"), (5, "0.75")] {
                open(&mut conn, id, b"x");
                conn.accept().unwrap();
                let end = fields(&[("grpc-status", "0"), ("infermesh-busy", busy)]);
                conn.send_head(id, 200, &head, false);
                conn.send_data(id, Bytes::from_static(b"y"), &mut wake);
                conn.send_end(id, Some(&end), &mut wake);
                conn.finish(id, &mut wake);
                want.push((id, strings(Some("200"), &head)));
                want.push((id, strings(None, &end)));
            }
            assert_eq!(
                decode_all(&written(&mut conn), table),
                want,
                "table {table}"
            );
        }
    }

    /// Trailers that wait for window are encoded when they leave, so that
    /// a block encoded meanwhile for another stream, which adds to the
    /// client's table, is read before them as the table was when each was
    /// encoded.
    #[test]
    fn trailers_that_wait_are_encoded_in_the_order_they_leave() {
        let mut conn = settled(SETTINGS, &[(setting::INITIAL_WINDOW_SIZE, 10)]);
        let mut wake = Vec::new();
        let late = fields(&[("grpc-status", "0"), ("infermesh-busy", "0.1")]);
        let early = fields(&[("grpc-status", "0"), ("infermesh-busy", "0.2")]);
        open(&mut conn, 1, b"a");
        open(&mut conn, 3, b"b");
        conn.accept().unwrap();
        conn.accept().unwrap();
        conn.send_head(1, 200, &HeaderMap::new(), false);
        conn.send_data(1, Bytes::from(vec![7u8; 25]), &mut wake);
        conn.send_end(1, Some(&late), &mut wake);
        conn.send_head(3, 200, &HeaderMap::new(), false);
        conn.send_end(3, Some(&early), &mut wake);
        let mut frames = written(&mut conn);
        feed(
            &mut conn,
            &frame(kind::WINDOW_UPDATE, 0, 1, &15u32.to_be_bytes()),
        );
        feed(
            &mut conn,
            &frame(kind::WINDOW_UPDATE, 0, 0, &15u32.to_be_bytes()),
        );
        frames.extend(written(&mut conn));
        let blocks = decode_all(&frames, 4096);
        let trailers: Vec<_> = blocks.into_iter().filter(|(_, f)| f.len() == 2).collect();
        assert_eq!(
            trailers,
            [(3, strings(None, &early)), (1, strings(None, &late))]
        );
    }

    #[test]
    fn streams_beyond_the_limit_are_refused_and_a_goaway_refuses_new_ones() {
        let mut conn = settled(
            Settings {
                max_streams: 1,
                ..SETTINGS
            },
            &[],
        );
        open(&mut conn, 1, b"a");
        open(&mut conn, 3, b"b");
        assert!(conn.accept().is_some());
        assert!(conn.accept().is_none());
        let frames = written(&mut conn);
        assert_eq!((frames[0].kind, frames[0].stream), (kind::RST_STREAM, 3));
        assert_eq!(frames[0].payload, code::REFUSED_STREAM.to_be_bytes());
        let mut wake = Vec::new();
        conn.send_head(1, 200, &HeaderMap::new(), true);
        conn.finish(1, &mut wake);
        conn.go_away();
        open(&mut conn, 5, b"c");
        assert!(conn.accept().is_none());
        let frames = written(&mut conn);
        let goaway = frames.iter().find(|f| f.kind == kind::GOAWAY).unwrap();
        assert_eq!(goaway.payload[..4], 3u32.to_be_bytes(), "the last id seen");
        assert!(
            frames
                .iter()
                .any(|f| f.kind == kind::RST_STREAM && f.stream == 5)
        );
        assert!(conn.is_finished());
    }

    #[test]
    fn a_client_reset_wakes_and_cancels_the_request() {
        let mut conn = settled(SETTINGS, &[]);
        let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, 1, &request_block());
        bytes.extend_from_slice(&frame(kind::DATA, 0, 1, b"part"));
        feed(&mut conn, &bytes);
        conn.accept().unwrap();
        let waker = noop();
        assert!(!conn.poll_reset(1, &waker));
        let wake = feed(
            &mut conn,
            &frame(kind::RST_STREAM, 0, 1, &code::CANCEL.to_be_bytes()),
        );
        assert_eq!(wake.len(), 1, "the handler is woken");
        assert!(conn.poll_reset(1, &waker));
        assert_eq!(
            conn.poll_data(1, &waker),
            Some(Some(Err(StreamError::Reset(code::CANCEL))))
        );
        let mut wake = Vec::new();
        conn.finish(1, &mut wake);
        assert_eq!(conn.open_streams(), 0);
        // The 4 bytes it held go back to the connection's window in time.
        assert!(
            written(&mut conn)
                .iter()
                .all(|f| f.kind != kind::RST_STREAM)
        );
    }

    /// Opens and resets `n` streams from `id` on; the next free id.
    fn storm(conn: &mut Conn, mut id: u32, n: usize) -> u32 {
        let block = request_block();
        for _ in 0..n {
            let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, id, &block);
            bytes.extend_from_slice(&frame(kind::RST_STREAM, 0, id, &code::CANCEL.to_be_bytes()));
            feed(conn, &bytes);
            let mut wake = Vec::new();
            while let Some((s, _)) = conn.accept() {
                conn.finish(s, &mut wake);
            }
            id += 2;
        }
        id
    }

    #[test]
    fn resets_without_a_completed_request_between_them_end_the_connection() {
        let mut conn = settled(SETTINGS, &[]);
        let id = storm(&mut conn, 1, MAX_RESETS);
        assert!(conn.failed().is_none(), "a stalled good client's pile-up");
        // One request completes: the count starts again.
        let block = request_block();
        feed(
            &mut conn,
            &frame(
                kind::HEADERS,
                flag::END_HEADERS | flag::END_STREAM,
                id,
                &block,
            ),
        );
        let (s, _) = conn.accept().unwrap();
        conn.send_head(s, 200, &HeaderMap::new(), true);
        let mut wake = Vec::new();
        conn.finish(s, &mut wake);
        storm(&mut conn, id + 2, MAX_RESETS);
        assert!(conn.failed().is_none());

        let mut conn = settled(SETTINGS, &[]);
        storm(&mut conn, 1, MAX_RESETS + 1);
        assert_eq!(conn.failed(), Some("too many streams reset"));
        let frames = written(&mut conn);
        let goaway = frames.iter().find(|f| f.kind == kind::GOAWAY).unwrap();
        assert_eq!(goaway.payload[4..], code::ENHANCE_YOUR_CALM.to_be_bytes());
    }

    #[test]
    fn headers_over_the_list_limit_get_a_grpc_error_and_the_connection_lives() {
        let mut conn = settled(
            Settings {
                max_header_list: 200,
                ..SETTINGS
            },
            &[],
        );
        let mut block = request_block();
        hpack::encode::put_literal(&mut block, b"x-big", &[b'a'; 300], false);
        feed(
            &mut conn,
            &frame(
                kind::HEADERS,
                flag::END_HEADERS | flag::END_STREAM,
                1,
                &block,
            ),
        );
        assert!(conn.accept().is_none());
        assert!(conn.failed().is_none());
        let frames = written(&mut conn);
        let fields = decode(&frames[0].payload);
        assert!(
            fields.contains(&("grpc-status".into(), "8".into())),
            "{fields:?}"
        );
        assert_ne!(frames[0].flags & flag::END_STREAM, 0);
        assert_eq!(conn.open_streams(), 0);
    }

    #[test]
    fn window_and_framing_violations_are_answered_as_the_rfc_says() {
        // DATA beyond the stream's window: that stream is reset.
        let mut conn = settled(
            Settings {
                stream_window: 65_535,
                ..SETTINGS
            },
            &[],
        );
        feed(
            &mut conn,
            &frame(kind::HEADERS, flag::END_HEADERS, 1, &request_block()),
        );
        conn.accept().unwrap();
        for _ in 0..4 {
            feed(&mut conn, &frame(kind::DATA, 0, 1, &[0u8; 16_384]));
        }
        assert!(conn.failed().is_none());
        let frames = written(&mut conn);
        assert!(
            frames.iter().any(|f| f.kind == kind::RST_STREAM
                && f.payload == code::FLOW_CONTROL_ERROR.to_be_bytes()),
            "{frames:?}"
        );
        // A header block that never ends: the connection.
        let mut conn = settled(SETTINGS, &[]);
        feed(&mut conn, &frame(kind::HEADERS, 0, 1, &request_block()));
        for _ in 0..8 {
            feed(&mut conn, &frame(kind::CONTINUATION, 0, 1, &[0u8; 16_000]));
        }
        assert_eq!(conn.failed(), Some("a header block too long"));
        // An even stream id, and a frame over the size limit.
        let mut conn = settled(SETTINGS, &[]);
        feed(
            &mut conn,
            &frame(kind::HEADERS, flag::END_HEADERS, 2, &request_block()),
        );
        assert!(conn.failed().is_some());
        let mut conn = settled(SETTINGS, &[]);
        feed(&mut conn, &frame(kind::DATA, 0, 1, &vec![0u8; 20_000]));
        assert_eq!(conn.failed(), Some("a frame over the maximum size"));
    }

    #[test]
    fn pings_are_answered_and_our_pings_matched() {
        let mut conn = settled(SETTINGS, &[]);
        feed(&mut conn, &frame(kind::PING, 0, 0, b"abcdefgh"));
        let frames = written(&mut conn);
        assert_eq!((frames[0].kind, frames[0].flags), (kind::PING, flag::ACK));
        assert_eq!(frames[0].payload, b"abcdefgh");
        assert!(conn.ping());
        assert!(!conn.ping(), "one at a time");
        let ours = written(&mut conn);
        feed(
            &mut conn,
            &frame(kind::PING, flag::ACK, 0, &ours[0].payload),
        );
        assert!(conn.take_pong());
        assert!(!conn.take_pong());
        assert!(conn.ping());
    }
}
