//! The client side of one HTTP/2 connection to a worker, without I/O: bytes
//! read go in ([`Conn::on_read`]), bytes to write come out ([`Conn::out`]),
//! and each stream's answer is kept until its request's future takes it.
//!
//! Unary requests only: a HEADERS block and the request's bytes as DATA
//! (within the worker's windows), then the response's HEADERS, DATA and
//! trailers. Everything a server may send is handled (SETTINGS, PING,
//! WINDOW_UPDATE, RST_STREAM, GOAWAY, CONTINUATION, padding) by the core
//! both roles share; what breaks the protocol ends the connection with
//! GOAWAY, failing its streams.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::chunks::Chunks;
use crate::connection::{ConnError, Core, Frame, SendQueue};
use crate::frame::{self, code, setting};
use crate::limits::{Limits, MAX_HEADER_FIELDS};
use crate::{Out, StreamMap, hpack, request};

/// The receive window of each stream, as the agent advertises it.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// The connection's receive window.
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// Why a stream or the connection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The connection ended or broke; the text says how.
    #[error("connection to the worker failed: {0}")]
    Connection(String),
    /// The worker reset the stream with this HTTP/2 error code.
    #[error("the worker reset the stream (HTTP/2 error {0:#x})")]
    Reset(u32),
    /// The worker did not process the stream (GOAWAY or REFUSED_STREAM).
    #[error("the worker refused the stream (going away)")]
    Refused,
    /// The worker's answer broke the protocol for this stream.
    #[error("malformed answer from the worker: {0}")]
    Malformed(&'static str),
}

/// Why a new stream cannot be opened now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The worker's MAX_CONCURRENT_STREAMS are in use: wait for one to end.
    Full,
    /// This connection takes no new streams: make a new one.
    Closed,
}

/// A response's status line and headers.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: u16,
    pub headers: HeaderMap,
    /// The stream ended with these headers (a trailers-only answer).
    pub end: bool,
}

#[derive(Debug)]
struct Stream {
    /// What the worker lets this stream send.
    send_window: i64,
    /// Request bytes not sent yet.
    body: SendQueue,
    /// More request bytes are to come ([`Conn::open_streaming`]): the
    /// queue emptying does not end the stream.
    body_open: bool,
    /// What the worker may still send on this stream.
    recv_window: i64,
    /// Bytes taken by the caller and not yet given back as window.
    unacked: u32,
    head: Option<ResponseHead>,
    /// The first header block has arrived (taken or not).
    headed: bool,
    data: Chunks,
    trailers: Option<HeaderMap>,
    /// The worker ended the stream.
    ended: bool,
    failure: Option<Failure>,
    waker: Option<Waker>,
}

/// The connection's state.
pub struct Conn {
    core: Core,
    authority: Bytes,
    path: &'static [u8],
    streams: StreamMap<Stream>,
    next_id: u32,
    /// Streams with request bytes waiting for window, oldest first.
    sending: VecDeque<u32>,
    peer_max_streams: usize,
    /// Where request heads are encoded (kept: no allocation per request).
    scratch: Vec<u8>,
    /// The worker's HPACK table as our blocks set it: empty (requests are
    /// literals), but a SETTINGS_HEADER_TABLE_SIZE below its size must be
    /// signalled at the start of the next block (RFC 7541 4.2; nghttp2
    /// refuses a block without it).
    table: hpack::Indexer,
    /// GOAWAY received: no new streams.
    going_away: bool,
    failed: Option<Failure>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("streams", &self.streams.len())
            .field("next_id", &self.next_id)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// A connection whose preface and settings are queued; every request
    /// goes to `path` at `authority`.
    pub fn new(authority: &str, path: &'static str) -> Self {
        let limits = Limits {
            stream_window: STREAM_WINDOW,
            connection_window: CONNECTION_WINDOW,
            ..Limits::default()
        };
        let mut conn = Self {
            core: Core::new(limits),
            authority: Bytes::copy_from_slice(authority.as_bytes()),
            path: path.as_bytes(),
            streams: StreamMap::default(),
            next_id: 1,
            sending: VecDeque::new(),
            peer_max_streams: usize::MAX,
            scratch: Vec::new(),
            table: hpack::Indexer::new(&[]),
            going_away: false,
            failed: None,
        };
        let out = conn.core.out.buf();
        out.extend_from_slice(frame::PREFACE);
        frame::put_settings(
            out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::MAX_CONCURRENT_STREAMS, 0),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            ],
        );
        conn.core.open_connection_window();
        conn
    }

    /// Bytes to write, in order.
    pub fn out(&mut self) -> &mut Out {
        &mut self.core.out
    }

    /// Whether new streams may be opened here.
    pub fn is_open(&self) -> bool {
        self.failed.is_none() && !self.going_away && self.next_id < (1 << 31)
    }

    /// Whether the connection has failed (its I/O should stop).
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Opens a stream carrying `meta` and `body`; its id.
    pub fn open<'a>(
        &mut self,
        meta: impl Into<request::Metadata<'a>>,
        body: Bytes,
    ) -> Result<u32, Refusal> {
        self.open_chunks(meta, std::slice::from_ref(&body))
    }

    /// Opens a stream carrying `meta` and a body made of `chunks` in order
    /// (a body received as several DATA frames is sent on as it came, with
    /// no copy into one buffer first); its id.
    pub fn open_chunks<'a>(
        &mut self,
        meta: impl Into<request::Metadata<'a>>,
        chunks: &[Bytes],
    ) -> Result<u32, Refusal> {
        self.open_with(meta.into(), chunks, false)
    }

    /// Opens a stream carrying `meta` and the first `chunks` of a body whose
    /// rest is still arriving: [`Conn::push_body`] appends to it, and its
    /// last call ends the stream (cut-through forwarding).
    pub fn open_streaming<'a>(
        &mut self,
        meta: impl Into<request::Metadata<'a>>,
        chunks: &[Bytes],
    ) -> Result<u32, Refusal> {
        self.open_with(meta.into(), chunks, true)
    }

    fn open_with(
        &mut self,
        meta: request::Metadata<'_>,
        chunks: &[Bytes],
        body_open: bool,
    ) -> Result<u32, Refusal> {
        if !self.is_open() {
            return Err(Refusal::Closed);
        }
        if self.streams.len() >= self.peer_max_streams {
            return Err(Refusal::Full);
        }
        let id = self.next_id;
        self.next_id += 2;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        self.table.begin(&mut scratch);
        request::put_request_block(&mut scratch, &self.authority, self.path, meta);
        let has_body = chunks.iter().any(|c| !c.is_empty());
        self.core.put_block(id, &scratch, !has_body && !body_open);
        self.scratch = scratch;
        let mut queue = SendQueue::default();
        for chunk in chunks {
            queue.push(chunk.clone());
        }
        self.streams.insert(
            id,
            Stream {
                send_window: self.core.peer_initial_window,
                body: queue,
                body_open,
                recv_window: i64::from(STREAM_WINDOW),
                unacked: 0,
                head: None,
                headed: false,
                data: Chunks::default(),
                trailers: None,
                ended: false,
                failure: None,
                waker: None,
            },
        );
        if has_body {
            self.sending.push_back(id);
            self.send_pending();
        }
        Ok(id)
    }

    /// Appends `chunk` to the body of stream `id` (opened by
    /// [`Conn::open_streaming`]); `last` ends the stream once the body is
    /// sent. An error if the stream failed (the worker reset or refused
    /// it, or the connection broke) or is gone.
    pub fn push_body(&mut self, id: u32, chunk: Bytes, last: bool) -> Result<(), Failure> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Err(gone());
        };
        if let Some(f) = &stream.failure {
            return Err(f.clone());
        }
        if !stream.body_open {
            return Err(Failure::Connection(
                "the request's body had already ended".into(),
            ));
        }
        let was_empty = stream.body.is_empty();
        stream.body.push(chunk);
        stream.body_open = !last;
        if stream.body.is_empty() {
            if last {
                // Nothing left to carry the END_STREAM flag.
                frame::put_head(
                    self.core.out.buf(),
                    0,
                    frame::kind::DATA,
                    frame::flag::END_STREAM,
                    id,
                );
            }
            return Ok(());
        }
        if was_empty {
            self.sending.push_back(id);
        }
        self.send_pending();
        Ok(())
    }

    /// Writes request bytes the windows allow, oldest stream first; a
    /// stream whose own window is shut does not hold up the others.
    fn send_pending(&mut self) {
        let mut waiting = self.sending.len();
        while waiting > 0 && self.core.send_window > 0 {
            waiting -= 1;
            let Some(id) = self.sending.pop_front() else {
                return;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            self.core.send_data(
                id,
                &mut stream.body,
                &mut stream.send_window,
                !stream.body_open,
                usize::MAX,
            );
            if !stream.body.is_empty() {
                // Blocked by a window: its turn comes again after the rest.
                self.sending.push_back(id);
            }
        }
    }

    /// Handles the frames complete in `buf` (consuming them) at `now`; the
    /// wakers of the streams that changed are added to `wake`, to be woken
    /// outside any lock.
    pub fn on_read(&mut self, buf: &mut BytesMut, now: Instant, wake: &mut Vec<Waker>) {
        while self.failed.is_none() {
            let result = match self.core.read(buf, now) {
                Ok(Some(frame)) => self.frame(frame, wake),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            if let Err((error, why)) = result {
                self.core
                    .fail(Some(error), why, self.next_id.saturating_sub(2));
                self.fail(Failure::Connection(why.to_string()), wake);
            }
        }
    }

    fn frame(&mut self, frame: Frame, wake: &mut Vec<Waker>) -> Result<(), ConnError> {
        match frame {
            Frame::Headers {
                stream,
                end_stream,
                block,
                ..
            } => self.headers(stream, end_stream, &block, wake),
            Frame::Data {
                stream,
                end_stream,
                data,
                flow,
            } => self.data(stream, end_stream, data, flow, wake),
            Frame::Reset { stream, code } => {
                let failure = if code == code::REFUSED_STREAM {
                    Failure::Refused
                } else {
                    Failure::Reset(code)
                };
                self.fail_stream(stream, failure, wake);
                Ok(())
            }
            Frame::GoAway { last } => {
                self.going_away = true;
                let refused: Vec<u32> = self
                    .streams
                    .keys()
                    .copied()
                    .filter(|&id| id > last)
                    .collect();
                for id in refused {
                    self.fail_stream(id, Failure::Refused, wake);
                }
                Ok(())
            }
            Frame::StreamWindow { stream, increment } => {
                if let Some(s) = self.streams.get_mut(&stream) {
                    s.send_window += increment;
                    if increment == 0 || s.send_window > frame::MAX_WINDOW {
                        let code = if increment == 0 {
                            code::PROTOCOL_ERROR
                        } else {
                            code::FLOW_CONTROL_ERROR
                        };
                        self.reset(stream, code);
                        self.fail_stream(stream, Failure::Malformed("bad window update"), wake);
                    }
                }
                self.send_pending();
                Ok(())
            }
            Frame::StreamError { stream, code } => {
                if stream % 2 == 0 || stream >= self.next_id {
                    // RST_STREAM may not name an idle stream (RFC 9113
                    // 6.4): the stream error is the connection's.
                    return Err((code, "a bad PRIORITY frame on an idle stream"));
                }
                if self.streams.contains_key(&stream) {
                    self.reset(stream, code);
                    self.fail_stream(stream, Failure::Malformed("bad PRIORITY frame"), wake);
                }
                Ok(())
            }
            Frame::Settings(set) => {
                if let Some(window) = set.initial_window {
                    let streams = self.streams.values_mut().map(|s| &mut s.send_window);
                    frame::shift_windows(&mut self.core.peer_initial_window, window, streams)?;
                }
                if let Some(max) = set.max_streams {
                    self.peer_max_streams = max as usize;
                }
                if let Some(size) = set.header_table_size {
                    self.table.set_limit(size);
                }
                // ENABLE_PUSH is for servers.
                self.send_pending();
                Ok(())
            }
            Frame::ConnectionWindow => {
                self.send_pending();
                Ok(())
            }
        }
    }

    fn data(
        &mut self,
        id: u32,
        end_stream: bool,
        data: Bytes,
        flow: u32,
        wake: &mut Vec<Waker>,
    ) -> Result<(), ConnError> {
        match self.streams.get_mut(&id) {
            Some(stream) if !stream.ended && stream.failure.is_none() => {
                if !stream.headed {
                    return Err((code::PROTOCOL_ERROR, "DATA before HEADERS"));
                }
                if i64::from(flow) > stream.recv_window {
                    return Err((code::FLOW_CONTROL_ERROR, "DATA beyond the stream window"));
                }
                stream.recv_window -= i64::from(flow);
                if !data.is_empty() {
                    stream.data.push_back(data);
                }
                if end_stream {
                    stream.ended = true;
                }
                wake.extend(stream.waker.take());
            }
            // A stream cancelled here, or ended: nobody takes its data.
            _ => self.core.credit(flow),
        }
        Ok(())
    }

    fn headers(
        &mut self,
        id: u32,
        end: bool,
        block: &[u8],
        wake: &mut Vec<Waker>,
    ) -> Result<(), ConnError> {
        // Decoded whatever the stream, to keep the HPACK state in step.
        let mut headers = HeaderMap::new();
        let mut status = None;
        let mut malformed = None;
        let mut fields = 0usize;
        self.core
            .decoder
            .decode(block, |name, value| {
                fields += 1;
                if fields > MAX_HEADER_FIELDS {
                    malformed = Some("too many header fields");
                    return;
                }
                if name.first() == Some(&b':') {
                    if name == b":status" {
                        status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                    }
                    return;
                }
                match (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
                    (Ok(n), Ok(v)) => {
                        headers.append(n, v);
                    }
                    _ => malformed = Some("an invalid header field"),
                }
            })
            .map_err(|_| (code::COMPRESSION_ERROR, "a header block did not decode"))?;
        let Some(stream) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if stream.ended || stream.failure.is_some() {
            return Ok(());
        }
        if let Some(why) = malformed {
            self.reset(id, code::PROTOCOL_ERROR);
            self.fail_stream(id, Failure::Malformed(why), wake);
            return Ok(());
        }
        if !stream.headed {
            let Some(status) = status else {
                self.reset(id, code::PROTOCOL_ERROR);
                self.fail_stream(id, Failure::Malformed("a response without :status"), wake);
                return Ok(());
            };
            if (100..200).contains(&status) && !end {
                // An informational answer: the real one follows.
                return Ok(());
            }
            stream.headed = true;
            stream.head = Some(ResponseHead {
                status,
                headers,
                end,
            });
        } else {
            if !end {
                self.reset(id, code::PROTOCOL_ERROR);
                self.fail_stream(id, Failure::Malformed("trailers without END_STREAM"), wake);
                return Ok(());
            }
            stream.trailers = Some(headers);
        }
        if end {
            stream.ended = true;
        }
        wake.extend(stream.waker.take());
        Ok(())
    }

    fn reset(&mut self, id: u32, error: u32) {
        frame::put_reset(self.core.out.buf(), id, error);
    }

    fn fail_stream(&mut self, id: u32, failure: Failure, wake: &mut Vec<Waker>) {
        if let Some(stream) = self.streams.get_mut(&id) {
            if stream.failure.is_none() && !(stream.ended && stream.data.is_empty()) {
                stream.failure = Some(failure);
            }
            stream.body.clear();
            wake.extend(stream.waker.take());
        }
    }

    /// Fails the connection and every stream on it.
    pub fn fail(&mut self, failure: Failure, wake: &mut Vec<Waker>) {
        if self.failed.is_none() {
            self.failed = Some(failure.clone());
        }
        for stream in self.streams.values_mut() {
            if stream.failure.is_none() && !stream.ended {
                stream.failure = Some(failure.clone());
            }
            wake.extend(stream.waker.take());
        }
    }

    /// The response head of stream `id`, or the waker is kept.
    pub fn poll_head(&mut self, id: u32, waker: &Waker) -> Option<Result<ResponseHead, Failure>> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Some(Err(gone()));
        };
        if let Some(head) = stream.head.take() {
            return Some(Ok(head));
        }
        if let Some(f) = &stream.failure {
            return Some(Err(f.clone()));
        }
        remember(&mut stream.waker, waker);
        None
    }

    /// The next response bytes of stream `id` (`Ok(None)` at the end, after
    /// which the trailers are ready), or the waker is kept. Bytes taken are
    /// given back to the worker as window.
    pub fn poll_data(&mut self, id: u32, waker: &Waker) -> Option<Result<Option<Bytes>, Failure>> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Some(Err(gone()));
        };
        if let Some(data) = stream.data.pop_front() {
            let n = data.len() as u32;
            stream.unacked += n;
            if !stream.ended && stream.unacked >= STREAM_WINDOW / 2 {
                let inc = stream.unacked;
                stream.unacked = 0;
                stream.recv_window += i64::from(inc);
                frame::put_window_update(self.core.out.buf(), id, inc);
            }
            self.core.credit(n);
            return Some(Ok(Some(data)));
        }
        if let Some(f) = &stream.failure {
            return Some(Err(f.clone()));
        }
        if stream.ended {
            return Some(Ok(None));
        }
        remember(&mut stream.waker, waker);
        None
    }

    /// The trailers of an ended stream (`None`: it ended without).
    pub fn take_trailers(&mut self, id: u32) -> Option<HeaderMap> {
        self.streams.get_mut(&id)?.trailers.take()
    }

    /// Forgets stream `id`; resets it first if the worker has not ended it.
    /// Data it held is given back to the connection's window.
    pub fn close(&mut self, id: u32) {
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        // A body not all sent leaves the worker waiting for its end, even
        // after it answered.
        let unsent = stream.body_open || !stream.body.is_empty();
        if (!stream.ended || unsent) && stream.failure.is_none() && self.failed.is_none() {
            self.reset(id, code::CANCEL);
        }
        let held: usize = stream.data.iter().map(Bytes::len).sum();
        if held > 0 && self.failed.is_none() {
            self.core.credit(held as u32);
        }
    }
}

fn gone() -> Failure {
    Failure::Connection("the stream is gone".into())
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
    use crate::frame::{flag, kind};
    use bytes::BufMut;

    /// A connection state with one request sent on it, and its stream id.
    fn one_stream() -> (Conn, u32) {
        let mut conn = Conn::new("127.0.0.1:1", "/inference.GRPCInferenceService/ModelInfer");
        let id = conn
            .open(&HeaderMap::new(), Bytes::from_static(b"0123456789"))
            .unwrap();
        // The worker's SETTINGS come first.
        feed(&mut conn, kind::SETTINGS, 0, 0, &[]);
        (conn, id)
    }

    /// Hands `conn` one frame, as if read from the worker.
    fn feed(conn: &mut Conn, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut buf = BytesMut::new();
        frame::put_head(&mut buf, payload.len(), kind, flags, stream);
        buf.put_slice(payload);
        conn.on_read(&mut buf, Instant::now(), &mut Vec::new());
    }

    /// A worker that breaks the protocol (a push with push disabled) loses the
    /// connection; the request on it fails instead of hanging.
    #[test]
    fn a_protocol_error_fails_the_connection_and_its_streams() {
        let (mut conn, id) = one_stream();
        // Promising stream 2.
        let promise = [0, 0, 0, 2];
        feed(
            &mut conn,
            kind::PUSH_PROMISE,
            flag::END_HEADERS,
            id,
            &promise,
        );
        assert!(conn.is_failed());
        let waker = Waker::noop();
        assert!(matches!(
            conn.poll_head(id, waker),
            Some(Err(Failure::Connection(_)))
        ));
        assert_eq!(
            conn.open(&HeaderMap::new(), Bytes::new()),
            Err(Refusal::Closed)
        );
    }

    /// A body given as chunks goes out as those bytes in order, in DATA
    /// frames within the frame size, the last one ending the stream.
    #[test]
    fn a_body_in_chunks_is_sent_as_its_bytes() {
        let mut conn = Conn::new("127.0.0.1:1", "/inference.GRPCInferenceService/ModelInfer");
        let chunks = [
            Bytes::from(vec![1u8; 20_000]),
            Bytes::new(),
            Bytes::from_static(b"tail"),
        ];
        let id = conn.open_chunks(&HeaderMap::new(), &chunks).unwrap();
        let mut out = Vec::new();
        let mut slices = [std::io::IoSlice::new(&[]); 64];
        let n = conn.out().slices(&mut slices);
        for s in &slices[..n] {
            out.extend_from_slice(s);
        }
        // Preface and SETTINGS first; then HEADERS and DATA frames.
        let mut rest = &out[frame::PREFACE.len()..];
        let mut body = Vec::new();
        let mut ends = Vec::new();
        while rest.len() >= frame::HEADER_LEN {
            let head = frame::parse_head(rest);
            let payload = &rest[frame::HEADER_LEN..frame::HEADER_LEN + head.len];
            if head.kind == kind::DATA {
                assert_eq!(head.stream, id);
                assert!(head.len <= frame::DEFAULT_MAX_FRAME);
                body.extend_from_slice(payload);
                ends.push(head.flags & flag::END_STREAM != 0);
            }
            rest = &rest[frame::HEADER_LEN + head.len..];
        }
        let want: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(body, want);
        assert_eq!(ends.last(), Some(&true), "the last DATA ends the stream");
        assert_eq!(ends.iter().filter(|&&e| e).count(), 1);
    }

    /// The frames `conn` queued after the preface: (kind, flags, payload).
    fn written(conn: &mut Conn) -> Vec<(u8, u8, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut slices = [std::io::IoSlice::new(&[]); 64];
            let n = conn.out().slices(&mut slices);
            if n == 0 {
                break;
            }
            let len: usize = slices[..n].iter().map(|s| s.len()).sum();
            for s in &slices[..n] {
                out.extend_from_slice(s);
            }
            conn.out().advance(len);
        }
        let mut rest = out.strip_prefix(frame::PREFACE).unwrap_or(&out);
        let mut frames = Vec::new();
        while rest.len() >= frame::HEADER_LEN {
            let head = frame::parse_head(rest);
            let payload = rest[frame::HEADER_LEN..frame::HEADER_LEN + head.len].to_vec();
            frames.push((head.kind, head.flags, payload));
            rest = &rest[frame::HEADER_LEN + head.len..];
        }
        frames
    }

    /// A connection with one stream opened by [`Conn::open_streaming`] with
    /// the body's first bytes (`head`), the rest still to come.
    fn streaming_with_head() -> (Conn, u32) {
        let mut conn = Conn::new("127.0.0.1:1", "/inference.GRPCInferenceService/ModelInfer");
        let id = conn
            .open_streaming(&HeaderMap::new(), &[Bytes::from_static(b"head")])
            .unwrap();
        (conn, id)
    }

    /// A stream opened before its body has all arrived sends what it has,
    /// leaves the stream open, sends what is pushed after, and ends the
    /// stream with the last push (also when the last push is empty).
    #[test]
    fn a_streaming_body_ends_the_stream_only_with_its_last_push() {
        for last_empty in [false, true] {
            let (mut conn, id) = streaming_with_head();
            let frames = written(&mut conn);
            let headers = frames.iter().find(|f| f.0 == kind::HEADERS).unwrap();
            assert_eq!(headers.1 & flag::END_STREAM, 0, "the stream stays open");
            assert!(frames.iter().all(|f| f.1 & flag::END_STREAM == 0));
            conn.push_body(id, Bytes::from(vec![7u8; 20_000]), false)
                .unwrap();
            let tail = if last_empty {
                Bytes::new()
            } else {
                Bytes::from_static(b"tail")
            };
            conn.push_body(id, tail.clone(), true).unwrap();
            let mut body = frames
                .iter()
                .filter(|f| f.0 == kind::DATA)
                .flat_map(|f| f.2.clone())
                .collect::<Vec<u8>>();
            let rest = written(&mut conn);
            body.extend(rest.iter().flat_map(|f| f.2.clone()));
            let mut want = b"head".to_vec();
            want.extend([7u8; 20_000]);
            want.extend_from_slice(&tail);
            assert_eq!(body, want);
            let ends: Vec<bool> = rest.iter().map(|f| f.1 & flag::END_STREAM != 0).collect();
            assert_eq!(ends.last(), Some(&true), "the last DATA ends the stream");
            assert_eq!(ends.iter().filter(|&&e| e).count(), 1);
            assert!(conn.push_body(id, Bytes::new(), true).is_err(), "ended");
        }
    }

    /// A stream whose body is still open is reset when closed, even if the
    /// worker has answered: otherwise the worker would wait for its end.
    #[test]
    fn closing_a_stream_whose_body_is_open_resets_it() {
        let (mut conn, id) = streaming_with_head();
        feed(&mut conn, kind::SETTINGS, 0, 0, &[]);
        // A trailers-only answer: :status 200, END_STREAM.
        feed(
            &mut conn,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            id,
            &[0x88],
        );
        written(&mut conn);
        conn.close(id);
        let frames = written(&mut conn);
        assert!(frames.iter().any(|f| f.0 == kind::RST_STREAM), "{frames:?}");
    }

    /// A pushed body on a stream the worker refused says so, so the caller
    /// can open it again with what it kept.
    #[test]
    fn pushing_to_a_refused_stream_reports_the_refusal() {
        let (mut conn, id) = streaming_with_head();
        feed(&mut conn, kind::SETTINGS, 0, 0, &[]);
        feed(
            &mut conn,
            kind::RST_STREAM,
            0,
            id,
            &code::REFUSED_STREAM.to_be_bytes(),
        );
        assert_eq!(
            conn.push_body(id, Bytes::from_static(b"more"), false),
            Err(Failure::Refused)
        );
    }

    /// DATA beyond the window the agent granted is a flow-control error.
    #[test]
    fn data_beyond_the_granted_window_fails_the_connection() {
        let (mut conn, id) = one_stream();
        // :status 200 (static index 8).
        feed(&mut conn, kind::HEADERS, flag::END_HEADERS, id, &[0x88]);
        let waker = Waker::noop();
        assert_eq!(conn.poll_head(id, waker).unwrap().unwrap().status, 200);
        // 4 MiB of window, then one byte more, in 16 KiB frames.
        let frame = vec![0u8; frame::DEFAULT_MAX_FRAME];
        for _ in 0..(STREAM_WINDOW as usize / frame::DEFAULT_MAX_FRAME) {
            feed(&mut conn, kind::DATA, 0, id, &frame);
        }
        assert!(!conn.is_failed(), "exactly the window is allowed");
        feed(&mut conn, kind::DATA, 0, id, &[0]);
        assert!(conn.is_failed());
    }
}
