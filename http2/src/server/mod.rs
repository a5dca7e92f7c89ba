//! The server side of one HTTP/2 connection from a client, without I/O:
//! bytes read go in ([`Conn::on_read`]), new requests come out
//! ([`Conn::accept`]), each request's body is taken by its handler
//! ([`Conn::poll_data`]) and its response goes in as head, data and
//! trailers; bytes to write come out ([`Conn::out`]); time goes in as
//! [`Conn::on_timeout`] when [`Conn::next_timeout`] says.
//!
//! Streams follow RFC 9113 5.1: a frame on a stream in the wrong state is
//! the stream error or connection error the RFC names (the h2spec cases in
//! `tests/tests/h2_conformance.rs` hold it to that). Frames on a stream this
//! side reset are ignored, as 5.1 allows, for the last [`CLOSED_MEMORY`]
//! closed streams; a HEADERS frame on a stream id below the last one opened
//! that is not among them is a connection error (PROTOCOL_ERROR), as h2spec
//! asks and `h2` does.
//!
//! Everything a client may take is bounded by [`Limits`]: streams at once,
//! windows, the header list and block, CONTINUATION frames, streams it
//! resets and streams it makes this side reset, frames that carry no work,
//! response bytes queued beyond its windows (per stream and per
//! connection), and how long a stream may wait for window.
//!
//! Shutting down is two-phase (RFC 9113 6.8): GOAWAY naming 2^31-1 and a
//! PING; when the PING is answered (or [`Limits::goaway_ping_timeout`]
//! passes) a second GOAWAY names the last stream that will be processed.
//!
//! Header blocks towards the client are literals and static-table
//! references, except the few names every response repeats, which go into
//! the client's dynamic table once and are referred to by index after
//! ([`hpack::Indexer`], within the client's HEADER_TABLE_SIZE); the
//! client's blocks are decoded with [`hpack::Decoder`] and the default
//! 4,096-byte table.

mod head;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Uri};

use crate::chunks::Chunks;
use crate::connection::{ConnError, Core, Frame, PING_DRAIN, PING_KEEPALIVE, SendQueue};
use crate::frame::{self, code, flag, kind, setting};
use crate::limits::{Bucket, Limits};
use crate::{Out, StreamMap, hpack};
use head::{Refusal, RequestHead, Trailers};

/// The highest stream id (the first GOAWAY of a graceful shutdown names
/// it: no stream is refused yet).
pub const MAX_STREAM_ID: u32 = (1 << 31) - 1;
/// Closed streams whose ids are remembered, to tell a late frame on a
/// stream this side reset (ignored) from one on a stream that ended.
pub const CLOSED_MEMORY: usize = 1024;

/// What the server advertises and enforces on a connection.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Header names every response repeats: added to the client's HPACK
    /// table once and referred to by index after ([`hpack::Indexer`]).
    pub response_names: &'static [&'static str],
    /// Request paths parsed once per connection rather than per request.
    pub known_paths: &'static [&'static str],
    /// Every bound on what the client may take.
    pub limits: Limits,
}

/// Why a request's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The stream was reset (by the client, or by this side for the
    /// client's error) with this HTTP/2 error code.
    #[error("the stream was reset (HTTP/2 error {0:#x})")]
    Reset(u32),
    /// The connection ended or broke.
    #[error("the connection closed")]
    Closed,
}

#[derive(Debug)]
struct Stream {
    /// Request bytes received and not taken yet.
    data: Chunks,
    /// What the client may still send on this stream.
    recv_window: i64,
    /// Bytes taken and not yet given back as window.
    unacked: u32,
    /// The client ended its side (END_STREAM).
    recv_ended: bool,
    /// The body length the request announced, and what arrived.
    content_length: Option<u64>,
    received: u64,
    /// The body's reader, waiting for data.
    reader: Option<Waker>,
    /// Reset (its code); by this side when `reset_here`.
    reset: Option<u32>,
    reset_here: bool,
    /// The request's handler, woken when the stream is reset.
    handler: Option<Waker>,
    /// Taken by [`Conn::accept`]: a handler runs for it.
    started: bool,
    /// The handler has finished, or never ran (reset before it started).
    done: bool,
    /// What the client lets this stream send.
    send_window: i64,
    /// Response bytes waiting for window.
    queue: SendQueue,
    /// The response's last frame, sent after `queue`.
    last: Option<Last>,
    /// The response is complete on the wire.
    sent_end: bool,
    /// The response's sender, waiting for room in `queue`.
    writer: Option<Waker>,
    /// Since when bytes have waited for window with none sent.
    blocked_since: Option<Instant>,
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

/// Where a connection is in shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    Open,
    /// GOAWAY(2^31-1) and a PING are out; the final GOAWAY is sent when
    /// the PING is answered or at `until`.
    Draining {
        until: Instant,
    },
    /// The final GOAWAY is out: streams above `last` are ignored.
    Closing {
        last: u32,
    },
}

/// The connection's state.
pub struct Conn {
    core: Core,
    settings: Settings,
    streams: StreamMap<Stream>,
    /// New requests, for the driver to start.
    accepted: VecDeque<(u32, Request<()>)>,
    /// Highest stream id the client opened.
    last_id: u32,
    /// Recently closed streams, newest last, and whether this side reset
    /// them.
    closed: VecDeque<(u32, bool)>,
    /// Streams with response bytes waiting for window, oldest first.
    sending: VecDeque<u32>,
    /// Response bytes waiting for window, all streams.
    queued: usize,
    /// The client's dynamic table, as our response blocks fill it.
    indexer: hpack::Indexer,
    /// [`Settings::known_paths`], parsed.
    known_paths: Vec<Uri>,
    /// Where header blocks are encoded (kept: no allocation per block).
    scratch: Vec<u8>,
    /// Bytes of the client's preface still expected.
    preface_left: usize,
    shutdown: Shutdown,
    /// The client sent GOAWAY or closed: no new streams will come.
    peer_gone: bool,
    /// Streams the client reset before their response ended, per time.
    peer_resets: Bucket,
    /// Streams this side reset for the client's errors.
    local_resets: u32,
    /// The time as last told (reads, timeouts, [`Conn::set_time`]).
    now: Instant,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("streams", &self.streams.len())
            .field("last_id", &self.last_id)
            .field("failed", &self.core.failed)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// A connection whose SETTINGS (and connection window) are queued;
    /// `now` starts its clock.
    pub fn new(settings: Settings, now: Instant) -> Self {
        let limits = settings.limits;
        let mut conn = Self {
            core: Core::new(limits),
            settings,
            streams: StreamMap::default(),
            accepted: VecDeque::new(),
            last_id: 0,
            closed: VecDeque::new(),
            sending: VecDeque::new(),
            queued: 0,
            indexer: hpack::Indexer::new(settings.response_names),
            known_paths: settings
                .known_paths
                .iter()
                .map(|p| Uri::from_static(p))
                .collect(),
            scratch: Vec::new(),
            preface_left: frame::PREFACE.len(),
            shutdown: Shutdown::Open,
            peer_gone: false,
            peer_resets: Bucket::new(limits.reset_stream_burst, limits.reset_stream_rate),
            local_resets: 0,
            now,
        };
        frame::put_settings(
            conn.core.out.buf(),
            &[
                (
                    setting::MAX_CONCURRENT_STREAMS,
                    limits.max_concurrent_streams,
                ),
                (setting::INITIAL_WINDOW_SIZE, limits.stream_window),
                (setting::MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
            ],
        );
        conn.core.open_connection_window();
        conn
    }

    /// Bytes to write, in order.
    pub fn out(&mut self) -> &mut Out {
        &mut self.core.out
    }

    /// Why the connection broke, if it did.
    pub fn failed(&self) -> Option<&'static str> {
        self.core.failed
    }

    /// The preface and the client's SETTINGS have arrived.
    pub fn is_settled(&self) -> bool {
        self.core.settled
    }

    /// Streams open (a handler running or a response being sent).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Response bytes queued beyond the client's windows, all streams.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// The client is not reading what it asked for: more response bytes
    /// wait for its windows than [`Limits::connection_send_buffer`]. New
    /// work for it should wait until it reads (and be refused if it does not).
    pub fn is_backlogged(&self) -> bool {
        self.queued > self.settings.limits.connection_send_buffer
    }

    /// Nothing more will happen here: the final GOAWAY went out (or the
    /// client left) and every stream is finished.
    pub fn is_finished(&self) -> bool {
        (matches!(self.shutdown, Shutdown::Closing { .. }) || self.peer_gone)
            && self.streams.is_empty()
    }

    /// Tells the connection the time (the driver does at each pass, so
    /// that a response that starts waiting for window is timed from then).
    pub fn set_time(&mut self, now: Instant) {
        self.now = now;
    }

    /// The next new request and its stream id. A stream reset before its
    /// request was taken is gone: its handler never runs.
    pub fn accept(&mut self) -> Option<(u32, Request<()>)> {
        while let Some((id, req)) = self.accepted.pop_front() {
            if let Some(stream) = self.streams.get_mut(&id) {
                stream.started = true;
                return Some((id, req));
            }
        }
        None
    }

    /// Starts a graceful shutdown: GOAWAY naming 2^31-1 (no stream is
    /// refused yet: a client may have requests in flight) and a PING; the
    /// final GOAWAY follows its answer (or [`Limits::goaway_ping_timeout`]).
    pub fn go_away(&mut self) {
        if self.shutdown != Shutdown::Open || self.core.failed.is_some() {
            return;
        }
        frame::put_goaway(self.core.out.buf(), MAX_STREAM_ID, code::NO_ERROR);
        self.core.ping(PING_DRAIN);
        self.shutdown = Shutdown::Draining {
            until: self.now + self.settings.limits.goaway_ping_timeout,
        };
    }

    /// The final GOAWAY: streams opened so far finish, later ones are
    /// ignored. Not written once the connection failed: its GOAWAY with
    /// the error was the last frame.
    fn final_go_away(&mut self) {
        if self.core.failed.is_none() {
            frame::put_goaway(self.core.out.buf(), self.last_id, code::NO_ERROR);
        }
        self.shutdown = Shutdown::Closing { last: self.last_id };
    }

    /// Sends a keep-alive PING unless one is out; whether it was sent.
    pub fn ping(&mut self) -> bool {
        self.core.ping(PING_KEEPALIVE)
    }

    /// Whether the answer to the keep-alive PING has arrived (once).
    pub fn take_pong(&mut self) -> bool {
        self.core.take_pong(PING_KEEPALIVE)
    }

    /// When [`Conn::on_timeout`] is next due, if ever.
    pub fn next_timeout(&self) -> Option<Instant> {
        let drain = match self.shutdown {
            Shutdown::Draining { until } => Some(until),
            _ => None,
        };
        if self.sending.is_empty() {
            // Asked on every pass of the driver; most find nothing waiting.
            return drain;
        }
        let timeout = self.settings.limits.send_timeout;
        let blocked = self
            .sending
            .iter()
            .filter_map(|id| self.streams.get(id)?.blocked_since)
            .min()
            .map(|since| since + timeout);
        match (drain, blocked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Acts on the time: the final GOAWAY when its PING went unanswered,
    /// and streams that waited [`Limits::send_timeout`] for window with
    /// nothing sent are reset (CANCEL).
    pub fn on_timeout(&mut self, now: Instant, wake: &mut Vec<Waker>) {
        self.now = now;
        if let Shutdown::Draining { until } = self.shutdown {
            if now >= until {
                self.final_go_away();
            }
        }
        let timeout = self.settings.limits.send_timeout;
        let expired: Vec<u32> = self
            .sending
            .iter()
            .copied()
            .filter(|id| {
                self.streams
                    .get(id)
                    .and_then(|s| s.blocked_since)
                    .is_some_and(|since| since + timeout <= now)
            })
            .collect();
        for id in expired {
            self.reset_stream(id, code::CANCEL, true, wake);
        }
    }

    /// Handles the bytes in `buf` (consuming complete frames) at `now`;
    /// the wakers of the streams that changed are added to `wake`, to be
    /// woken outside any lock.
    pub fn on_read(&mut self, buf: &mut BytesMut, now: Instant, wake: &mut Vec<Waker>) {
        self.now = now;
        if self.preface_left > 0 {
            let at = frame::PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(buf.len());
            if buf[..n] != frame::PREFACE[at..at + n] {
                // Not HTTP/2 (an HTTP/1 request, a scanner): no GOAWAY.
                self.fail(None, "not an HTTP/2 connection preface", wake);
                return;
            }
            let _ = buf.split_to(n);
            self.preface_left -= n;
            if self.preface_left > 0 {
                return;
            }
        }
        while self.core.failed.is_none() {
            let result = match self.core.read(buf, now) {
                Ok(Some(frame)) => self.frame(frame, wake),
                Ok(None) => break,
                Err(e) => Err(e),
            };
            if let Err((error, why)) = result {
                self.fail(Some(error), why, wake);
            }
        }
        if matches!(self.shutdown, Shutdown::Draining { .. }) && self.core.take_pong(PING_DRAIN) {
            self.final_go_away();
        }
    }

    fn frame(&mut self, frame: Frame, wake: &mut Vec<Waker>) -> Result<(), ConnError> {
        match frame {
            Frame::Headers {
                stream,
                end_stream,
                block,
                depends_on_itself,
            } => {
                if stream > self.last_id {
                    self.open(stream, end_stream, &block, depends_on_itself, wake)
                } else {
                    self.trailers(stream, end_stream, &block, depends_on_itself, wake)
                }
            }
            Frame::Data {
                stream,
                end_stream,
                data,
                flow,
            } => self.data(stream, end_stream, data, flow, wake),
            Frame::Reset { stream, code } => {
                if stream > self.last_id {
                    return Err((code::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
                }
                let Some(s) = self.streams.get(&stream) else {
                    // Closed: a reset may cross ours, or our END_STREAM.
                    return Ok(());
                };
                if s.reset.is_none() && !s.sent_end && !self.peer_resets.take(self.now) {
                    return Err((
                        code::ENHANCE_YOUR_CALM,
                        "the client reset too many streams (rapid reset)",
                    ));
                }
                self.reset_stream(stream, code, false, wake);
                Ok(())
            }
            Frame::StreamWindow { stream, increment } => {
                if stream > self.last_id {
                    return Err((code::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
                }
                let Some(s) = self.streams.get_mut(&stream) else {
                    return Ok(());
                };
                if s.reset.is_some() {
                    return Ok(());
                }
                if increment == 0 {
                    return self.local_reset(stream, code::PROTOCOL_ERROR, wake);
                }
                s.send_window += increment;
                if s.send_window > frame::MAX_WINDOW {
                    return self.local_reset(stream, code::FLOW_CONTROL_ERROR, wake);
                }
                if !s.queue.is_empty() || s.last.is_some() {
                    self.send_pending(wake);
                }
                Ok(())
            }
            Frame::StreamError { stream, code } => {
                if stream % 2 == 0 || stream > self.last_id {
                    // RST_STREAM may not name an idle stream (RFC 9113
                    // 6.4): the stream error is the connection's.
                    return Err((code, "a bad PRIORITY frame on an idle stream"));
                }
                self.local_reset(stream, code, wake)
            }
            Frame::Settings(set) => {
                if let Some(window) = set.initial_window {
                    let streams = self.streams.values_mut().map(|s| &mut s.send_window);
                    frame::shift_windows(&mut self.core.peer_initial_window, window, streams)?;
                }
                if let Some(size) = set.header_table_size {
                    self.indexer.set_limit(size);
                }
                // The client's stream limit binds pushes only.
                self.send_pending(wake);
                Ok(())
            }
            Frame::ConnectionWindow => {
                self.send_pending(wake);
                Ok(())
            }
            Frame::GoAway { .. } => {
                // The client opens nothing more; what it has open finishes.
                self.peer_gone = true;
                Ok(())
            }
        }
    }

    /// A HEADERS block opening stream `id` (above every id so far).
    fn open(
        &mut self,
        id: u32,
        end_stream: bool,
        block: &[u8],
        depends_on_itself: bool,
        wake: &mut Vec<Waker>,
    ) -> Result<(), ConnError> {
        if id % 2 == 0 {
            return Err((code::PROTOCOL_ERROR, "a client opened an even stream id"));
        }
        // Decoded whatever becomes of the stream, to keep HPACK in step.
        let mut head = RequestHead::default();
        let limit = self.settings.limits.max_header_list_size as usize;
        let known = &self.known_paths;
        self.core
            .decoder
            .decode(block, |name, value| head.field(name, value, limit, known))
            .map_err(|_| (code::COMPRESSION_ERROR, "a header block did not decode"))?;
        self.last_id = id;
        if let Shutdown::Closing { last } = self.shutdown {
            if id > last {
                // After the final GOAWAY: ignored (RFC 9113 6.8).
                self.remember_closed(id, true);
                return Ok(());
            }
        }
        if depends_on_itself {
            return self.local_reset(id, code::PROTOCOL_ERROR, wake);
        }
        if self.streams.len() >= self.settings.limits.max_concurrent_streams as usize {
            return self.local_reset(id, code::REFUSED_STREAM, wake);
        }
        let limits = &self.settings.limits;
        let mut stream = Stream {
            data: Chunks::default(),
            recv_window: i64::from(limits.stream_window).max(frame::DEFAULT_WINDOW),
            unacked: 0,
            recv_ended: end_stream,
            content_length: None,
            received: 0,
            reader: None,
            reset: None,
            reset_here: false,
            handler: None,
            started: false,
            done: false,
            send_window: self.core.peer_initial_window,
            queue: SendQueue::default(),
            last: None,
            sent_end: false,
            writer: None,
            blocked_since: None,
        };
        match head.into_request() {
            Ok((req, length)) => {
                if end_stream && length.is_some_and(|n| n != 0) {
                    return self.local_reset(id, code::PROTOCOL_ERROR, wake);
                }
                stream.content_length = length;
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
            Err(Refusal::Malformed) => return self.local_reset(id, code::PROTOCOL_ERROR, wake),
        }
        Ok(())
    }

    /// A HEADERS block on stream `id`, at or below the last opened: a
    /// request's trailers, or a frame on a stream no longer open.
    fn trailers(
        &mut self,
        id: u32,
        end_stream: bool,
        block: &[u8],
        depends_on_itself: bool,
        wake: &mut Vec<Waker>,
    ) -> Result<(), ConnError> {
        let mut trailers = Trailers::default();
        self.core
            .decoder
            .decode(block, |name, value| trailers.field(name, value))
            .map_err(|_| (code::COMPRESSION_ERROR, "a header block did not decode"))?;
        // On a closed stream the client ended or reset: 5.1 lets either be
        // a connection error, and h2spec (5.1/12) asks for one.
        const CLOSED: ConnError = (code::STREAM_CLOSED, "HEADERS on a closed stream");
        let Some(stream) = self.streams.get_mut(&id) else {
            return match self.was_reset_here(id) {
                Some(true) => Ok(()),
                Some(false) => Err(CLOSED),
                None => Err((
                    code::PROTOCOL_ERROR,
                    "HEADERS on a stream id below one already opened",
                )),
            };
        };
        if stream.reset.is_some() {
            return match stream.reset_here {
                true => Ok(()),
                false => Err(CLOSED),
            };
        }
        if stream.recv_ended {
            // Half-closed (remote): 5.1.
            return self.local_reset(id, code::STREAM_CLOSED, wake);
        }
        if !end_stream || trailers.malformed || depends_on_itself {
            return self.local_reset(id, code::PROTOCOL_ERROR, wake);
        }
        if stream.content_length.is_some_and(|n| n != stream.received) {
            return self.local_reset(id, code::PROTOCOL_ERROR, wake);
        }
        stream.recv_ended = true;
        wake.extend(stream.reader.take());
        self.reap(id);
        Ok(())
    }

    fn data(
        &mut self,
        id: u32,
        end_stream: bool,
        data: Bytes,
        flow: u32,
        wake: &mut Vec<Waker>,
    ) -> Result<(), ConnError> {
        if id > self.last_id {
            return Err((code::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let fault = match self.streams.get_mut(&id) {
            None => match self.was_reset_here(id) {
                Some(false) => Some(code::STREAM_CLOSED),
                // Reset here (it may cross our reset), or long closed.
                _ => None,
            },
            Some(s) if s.reset.is_some() => (!s.reset_here).then_some(code::STREAM_CLOSED),
            Some(s) if s.recv_ended => Some(code::STREAM_CLOSED),
            Some(s) if i64::from(flow) > s.recv_window => Some(code::FLOW_CONTROL_ERROR),
            Some(s) => {
                let received = s.received + data.len() as u64;
                let length_broken = s
                    .content_length
                    .is_some_and(|n| received > n || (end_stream && received != n));
                if length_broken {
                    Some(code::PROTOCOL_ERROR)
                } else {
                    s.recv_window -= i64::from(flow);
                    s.received = received;
                    if !data.is_empty() {
                        s.data.push_back(data);
                    }
                    s.recv_ended = end_stream;
                    wake.extend(s.reader.take());
                    if end_stream {
                        self.reap(id);
                    }
                    return Ok(());
                }
            }
        };
        // Nobody takes these bytes: their window goes back at once.
        self.core.credit(flow);
        match fault {
            Some(code) => self.local_reset(id, code, wake),
            None => Ok(()),
        }
    }

    /// Whether stream `id` is among the recently closed, and if so
    /// whether this side reset it.
    fn was_reset_here(&self, id: u32) -> Option<bool> {
        self.closed
            .iter()
            .rev()
            .find(|(closed, _)| *closed == id)
            .map(|&(_, here)| here)
    }

    fn remember_closed(&mut self, id: u32, reset_here: bool) {
        if self.closed.len() == CLOSED_MEMORY {
            self.closed.pop_front();
        }
        self.closed.push_back((id, reset_here));
    }

    /// Resets stream `id` for the client's error on it, counted against
    /// [`Limits::max_local_error_resets`].
    fn local_reset(&mut self, id: u32, error: u32, wake: &mut Vec<Waker>) -> Result<(), ConnError> {
        self.local_resets += 1;
        if self.local_resets > self.settings.limits.max_local_error_resets {
            return Err((
                code::ENHANCE_YOUR_CALM,
                "too many streams reset for the client's errors",
            ));
        }
        match self.streams.get(&id) {
            Some(stream) if stream.reset.is_none() => self.reset_stream(id, error, true, wake),
            // Already reset, or closed: the RST_STREAM alone.
            Some(_) => frame::put_reset(self.core.out.buf(), id, error),
            None => {
                frame::put_reset(self.core.out.buf(), id, error);
                if id <= self.last_id && self.was_reset_here(id).is_none() {
                    self.remember_closed(id, true);
                }
            }
        }
        Ok(())
    }

    /// Resets stream `id` (sending RST_STREAM with `error` when `here`:
    /// this side resets it), dropping what it holds and waking whoever
    /// waits on it.
    fn reset_stream(&mut self, id: u32, error: u32, here: bool, wake: &mut Vec<Waker>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.reset.is_some() {
            return;
        }
        stream.reset = Some(error);
        stream.reset_here = here;
        if !stream.started {
            // No handler will run: nothing holds the stream.
            stream.done = true;
        }
        if here {
            frame::put_reset(self.core.out.buf(), id, error);
        }
        let held: usize = stream.data.iter().map(Bytes::len).sum();
        stream.data.clear();
        self.queued -= stream.queue.clear();
        stream.last = None;
        stream.blocked_since = None;
        wake.extend(stream.reader.take());
        wake.extend(stream.writer.take());
        wake.extend(stream.handler.take());
        if held > 0 {
            self.core.credit(held as u32);
        }
        self.reap(id);
    }

    /// Ends the connection: GOAWAY with `error` (when given), every
    /// stream failed.
    fn fail(&mut self, error: Option<u32>, why: &'static str, wake: &mut Vec<Waker>) {
        // After the final GOAWAY, streams above its last were ignored: a
        // GOAWAY may not name a higher one (RFC 9113 6.8).
        let last = match self.shutdown {
            Shutdown::Closing { last } => last,
            _ => self.last_id,
        };
        self.core.fail(error, why, last);
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
            stream.queue.clear();
            wake.extend(stream.reader.take());
            wake.extend(stream.writer.take());
            wake.extend(stream.handler.take());
        }
        self.queued = 0;
        self.sending.clear();
        // Requests not yet taken are never handed out: no handler runs for
        // a connection that is gone, and nothing holds their streams.
        self.accepted.clear();
        self.streams.retain(|_, s| s.started);
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
        let mut here = stream.reset_here;
        if stream.reset.is_none() && !stream.recv_ended && self.core.failed.is_none() {
            frame::put_reset(self.core.out.buf(), id, code::NO_ERROR);
            here = true;
        }
        self.remember_closed(id, here);
        let held: usize = stream.data.iter().map(Bytes::len).sum();
        if held > 0 {
            self.core.credit(held as u32);
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
            return Some(Some(Err(if self.core.failed.is_some() || self.peer_gone {
                StreamError::Closed
            } else {
                StreamError::Reset(error)
            })));
        }
        if let Some(data) = stream.data.pop_front() {
            let n = data.len() as u32;
            stream.unacked += n;
            if !stream.recv_ended && stream.unacked >= self.settings.limits.stream_window / 2 {
                let inc = stream.unacked;
                stream.unacked = 0;
                stream.recv_window += i64::from(inc);
                frame::put_window_update(self.core.out.buf(), id, inc);
            }
            self.core.credit(n);
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
        // A response gives back a token of the budget of frames without
        // work: a busy client's pings follow its responses.
        self.core.control.give();
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        hpack::encode::put_response_block(&mut block, &mut self.indexer, status, headers);
        self.core.put_block(id, &block, end);
        self.scratch = block;
        if end {
            if let Some(stream) = self.streams.get_mut(&id) {
                stream.sent_end = true;
            }
            self.reap(id);
        }
    }

    /// Ready when stream `id` may queue more response data (less than
    /// [`Limits::stream_send_buffer`] waits for window); `Some(false)`: the
    /// stream is gone.
    pub fn poll_send_ready(&mut self, id: u32, waker: &Waker) -> Option<bool> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Some(false);
        };
        if stream.reset.is_some() {
            return Some(false);
        }
        if stream.queue.len() < self.settings.limits.stream_send_buffer {
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
        if stream.queue.is_empty() {
            // Timed from now until bytes of it leave (`send_pending`).
            stream.blocked_since = Some(self.now);
            self.sending.push_back(id);
        }
        self.queued += data.len();
        stream.queue.push(data);
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
        if stream.queue.is_empty() {
            // Nothing waits for window: the last frame leaves now, encoded
            // from the caller's trailers (no copy of them).
            self.put_end(id, trailers);
        } else {
            // After the data still waiting for window.
            stream.last = Some(match trailers {
                Some(t) => Last::Trailers(t.clone()),
                None => Last::Data,
            });
            self.send_pending(wake);
        }
    }

    /// Writes stream `id`'s last frame as kept by [`Conn::send_end`], now
    /// that its data has left.
    fn put_last(&mut self, id: u32) {
        let Some(last) = self.streams.get_mut(&id).and_then(|s| s.last.take()) else {
            return;
        };
        match last {
            Last::Trailers(t) => self.put_end(id, Some(&t)),
            Last::Data => self.put_end(id, None),
        }
    }

    /// Writes stream `id`'s last frame: `trailers`, or an empty DATA frame
    /// with END_STREAM.
    fn put_end(&mut self, id: u32, trailers: Option<&HeaderMap>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.sent_end = true;
        match trailers {
            Some(t) => {
                let mut block = std::mem::take(&mut self.scratch);
                block.clear();
                hpack::encode::put_trailer_block(&mut block, &mut self.indexer, t);
                self.core.put_block(id, &block, true);
                self.scratch = block;
            }
            None => frame::put_head(self.core.out.buf(), 0, kind::DATA, flag::END_STREAM, id),
        }
        self.reap(id);
    }

    /// Resets stream `id` from this side (the handler failed).
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

    /// Bytes left the socket: response data that waited for room in the
    /// write buffer ([`Limits::write_buffer`]) may follow.
    pub fn on_written(&mut self, wake: &mut Vec<Waker>) {
        if !self.sending.is_empty() && self.core.out.len() < self.settings.limits.write_buffer {
            self.send_pending(wake);
        }
    }

    /// Writes response data the windows and the write buffer allow,
    /// oldest stream first; a stream whose own window is shut does not
    /// hold up the others.
    fn send_pending(&mut self, wake: &mut Vec<Waker>) {
        let mut waiting = self.sending.len();
        while waiting > 0
            && self.core.send_window > 0
            && self.core.out.len() < self.settings.limits.write_buffer
        {
            waiting -= 1;
            let Some(id) = self.sending.pop_front() else {
                return;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            if stream.queue.is_empty() {
                continue;
            }
            let sent = self.core.send_data(
                id,
                &mut stream.queue,
                &mut stream.send_window,
                false,
                self.settings.limits.write_buffer,
            );
            self.queued -= sent;
            if stream.queue.len() < self.settings.limits.stream_send_buffer {
                wake.extend(stream.writer.take());
            }
            if !stream.queue.is_empty() {
                // Blocked by a window: its turn comes again after the rest,
                // and it is timed from the last byte it sent.
                if sent > 0 {
                    stream.blocked_since = Some(self.now);
                }
                self.sending.push_back(id);
            } else {
                stream.blocked_since = None;
                if stream.last.is_some() {
                    self.put_last(id);
                }
            }
        }
    }
}

fn remember(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
