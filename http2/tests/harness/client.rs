//! [`client::Conn`] (the agent's connection to a worker) driven by a
//! worker's frames — anything at all, or a well-behaved worker's answers
//! (`polite`) — and by its callers' actions, with the invariants checked
//! after every step:
//!
//! - nothing panics, and everything written is a valid frame sequence
//!   ([`OutputCheck`]): the preface and SETTINGS first, request heads that
//!   decode, request bodies as given and within the worker's windows;
//! - `open` refuses exactly when it must (`Full` at the worker's stream
//!   limit, `Closed` after GOAWAY or a failure);
//! - a caller never waits on a failed connection, nor on a stream the
//!   worker's GOAWAY refused;
//! - what a caller reads is what the worker sent on that stream, never
//!   more; a worker sending beyond the connection window fails it;
//! - a well-behaved worker's answers reach their callers whole, and its
//!   connection never fails.

use std::collections::{BTreeMap, VecDeque};
use std::io::IoSlice;
use std::task::Waker;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use infermesh_http2::client::{Conn, Failure, Refusal};

use super::hpack_block::BlockBuilder;
use super::input::Input;
use super::wire::{self, Grant, OutputCheck, Role, Seen};

const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";
const MAX_STEPS: usize = 400;

/// What the model learns once the client processed a staged frame.
#[derive(Debug, Clone)]
enum Mark {
    Nothing,
    Grants(Vec<Grant>),
    /// A valid SETTINGS: its grants and stream limit.
    Settings(Vec<Grant>, Option<u32>),
    GoAway(u32),
    /// DATA on a stream: flow (padding included) and bytes.
    Data {
        id: u32,
        flow: u64,
        len: u64,
    },
}

#[derive(Debug, Default)]
struct Stream {
    body: u64,
    body_out: u64,
    closed: bool,
    // What the worker staged (polite: its whole answer).
    answered: bool,
    data_staged: u64,
    // What the client processed, and what its caller took.
    data_in: u64,
    data_read: u64,
    head_taken: bool,
    ended_read: bool,
    trailers_taken: bool,
}

fn request_byte(id: u32, k: u64) -> u8 {
    (u64::from(id) * 5 + k * 11) as u8
}

fn answer_byte(id: u32, k: u64) -> u8 {
    (u64::from(id) * 17 + k * 5 + 3) as u8
}

pub struct Run {
    conn: Conn,
    polite: bool,
    now: Instant,
    staged: Vec<u8>,
    staged_total: u64,
    marks: VecDeque<(u64, Mark)>,
    inbuf: BytesMut,
    fed: u64,
    encoder: loona_hpack::Encoder<'static>,
    streams: BTreeMap<u32, Stream>,
    out: OutputCheck,
    // Processed worker state.
    max_streams: u32,
    goaway: Option<u32>,
    conn_flow_in: u64,
    // The client's grants, from its output.
    conn_granted: u64,
    // A polite worker's view of the client's windows.
    client_initial: i64,
    stream_granted: BTreeMap<u32, i64>,
    flow_staged: BTreeMap<u32, i64>,
    conn_staged: i64,
}

impl Run {
    /// Runs the whole of `data`, panicking with the invariant that broke.
    pub fn run(data: &[u8]) {
        let mut input = Input::new(data);
        let polite = input.below(3) == 0;
        let mut run = Run {
            conn: Conn::new("worker:1", PATH),
            polite,
            now: Instant::now(),
            staged: Vec::new(),
            staged_total: 0,
            marks: VecDeque::new(),
            inbuf: BytesMut::new(),
            fed: 0,
            encoder: loona_hpack::Encoder::new(),
            streams: BTreeMap::new(),
            out: OutputCheck::new(Role::Client),
            max_streams: u32::MAX,
            goaway: None,
            conn_flow_in: 0,
            conn_granted: wire::DEFAULT_WINDOW as u64,
            client_initial: wire::DEFAULT_WINDOW,
            stream_granted: BTreeMap::new(),
            flow_staged: BTreeMap::new(),
            conn_staged: 0,
        };
        run.settings(&mut input);
        run.check();
        let mut steps = 0;
        while !input.is_empty() && steps < MAX_STEPS {
            steps += 1;
            run.step(&mut input);
            run.check();
        }
        run.finish();
    }

    fn stage(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8], mark: Mark) {
        if std::env::var_os("HARNESS_TRACE").is_some() {
            eprintln!(
                "  stage kind {kind} flags {flags:#x} stream {stream} len {} {mark:?}",
                payload.len()
            );
        }
        wire::put(&mut self.staged, kind, flags, stream, payload);
        self.staged_total += 9 + payload.len() as u64;
        self.marks.push_back((self.staged_total, mark));
    }

    fn settings(&mut self, input: &mut Input) {
        let mut values = Vec::new();
        for _ in 0..input.below(4) {
            let id = 1 + input.below(6) as u16;
            let v = match id {
                wire::INITIAL_WINDOW_SIZE if self.polite => input.below(1 << 20) as u32,
                wire::INITIAL_WINDOW_SIZE => {
                    [0, 1, 0x7fff_ffff, 0x8000_0000, input.u32()][input.below(5)]
                }
                wire::MAX_FRAME_SIZE if self.polite => 16_384 + input.below(1 << 20) as u32,
                wire::MAX_FRAME_SIZE => 16_383 + input.below(4) as u32 * (1 << 22),
                wire::MAX_CONCURRENT_STREAMS => input.below(6) as u32,
                wire::ENABLE_PUSH => input.below(2) as u32,
                _ => input.below(8192) as u32,
            };
            values.push((id, v));
        }
        let payload = wire::settings_payload(&values);
        let Some(grants) = wire::settings_grants(&payload) else {
            if !self.polite {
                self.stage(wire::SETTINGS, 0, 0, &payload, Mark::Nothing);
            }
            return;
        };
        let last = |want: u16| {
            values
                .iter()
                .rev()
                .find(|(id, _)| *id == want)
                .map(|(_, v)| *v)
        };
        let max = last(wire::MAX_CONCURRENT_STREAMS);
        self.stage(wire::SETTINGS, 0, 0, &payload, Mark::Settings(grants, max));
    }

    /// A stream id: one opened, or any.
    fn stream_id(&self, input: &mut Input) -> u32 {
        match input.below(6) {
            0..=3 if !self.streams.is_empty() => {
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                ids[input.below(ids.len())]
            }
            4 => u32::from(input.u8() % 16),
            _ => input.u32() & 0x7fff_ffff,
        }
    }

    fn step(&mut self, input: &mut Input) {
        let action = input.weighted(&[40, 12, 10, 6, 6, 6, 3]);
        if std::env::var_os("HARNESS_TRACE").is_some() {
            eprintln!(
                "action {action}; failed {}; streams {:?}",
                self.conn.is_failed(),
                self.streams
            );
        }
        match action {
            0 => {
                if self.polite {
                    self.polite_frame(input)
                } else {
                    self.chaos_frame(input)
                }
            }
            1 => {
                let n = if input.bool() {
                    self.staged.len()
                } else {
                    input.below(self.staged.len() + 1)
                };
                self.deliver(n);
            }
            2 => self.open(input),
            3 => {
                if let Some(id) = self.pick(input) {
                    self.poll_head(id);
                }
            }
            4 => {
                if let Some(id) = self.pick(input) {
                    self.poll_data(id);
                }
            }
            5 => {
                if let Some(id) = self.pick(input) {
                    if self.conn.take_trailers(id).is_some() {
                        self.streams.get_mut(&id).unwrap().trailers_taken = true;
                    }
                }
            }
            _ => {
                if let Some(id) = self.pick(input) {
                    self.conn.close(id);
                    self.streams.get_mut(&id).unwrap().closed = true;
                }
            }
        }
    }

    /// A stream its caller has not closed.
    fn pick(&self, input: &mut Input) -> Option<u32> {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.closed)
            .map(|(id, _)| *id)
            .collect();
        ids.get(input.below(ids.len())).copied()
    }

    fn open(&mut self, input: &mut Input) {
        let len = match input.below(6) {
            0 => 0,
            1 => 70_000 + input.below(100_000),
            _ => input.below(5000),
        };
        let live = self.streams.values().filter(|s| !s.closed).count();
        let next = self.streams.keys().last().map_or(1, |id| id + 2);
        let body: Bytes = (0..len as u64).map(|k| request_byte(next, k)).collect();
        let mut meta = HeaderMap::new();
        meta.insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        let result = self.conn.open(&meta, body);
        let failed = self.conn.is_failed();
        match result {
            Ok(id) => {
                assert_eq!(id, next, "stream ids in order");
                assert!(
                    !failed && self.goaway.is_none(),
                    "a stream opened on a closed connection"
                );
                assert!(
                    live < self.max_streams as usize,
                    "a stream opened past the worker's limit of {}",
                    self.max_streams
                );
                self.streams.insert(
                    id,
                    Stream {
                        body: len as u64,
                        ..Stream::default()
                    },
                );
            }
            Err(Refusal::Full) => assert!(
                live >= self.max_streams as usize,
                "Full with {live} of {} open",
                self.max_streams
            ),
            Err(Refusal::Closed) => assert!(
                failed || self.goaway.is_some(),
                "Closed on an open connection"
            ),
        }
    }

    fn poll_head(&mut self, id: u32) {
        if self.streams[&id].head_taken {
            // A caller asks for its head once.
            return;
        }
        let failed = self.conn.is_failed();
        let refused = self.goaway.is_some_and(|last| id > last);
        match self.conn.poll_head(id, Waker::noop()) {
            Some(Ok(_)) => self.streams.get_mut(&id).unwrap().head_taken = true,
            Some(Err(_)) => {}
            None => assert!(
                !failed && !refused,
                "a caller waits on stream {id} of a failed or refusing connection"
            ),
        }
    }

    fn poll_data(&mut self, id: u32) {
        let failed = self.conn.is_failed();
        let polite = self.polite;
        let result = self.conn.poll_data(id, Waker::noop());
        let s = self.streams.get_mut(&id).unwrap();
        match result {
            Some(Ok(Some(bytes))) => {
                for (k, b) in bytes.iter().enumerate() {
                    assert_eq!(
                        *b,
                        answer_byte(id, s.data_read + k as u64),
                        "stream {id} answer byte {}",
                        s.data_read + k as u64
                    );
                }
                s.data_read += bytes.len() as u64;
                assert!(
                    s.data_read <= s.data_in,
                    "stream {id}: read {} of {} received",
                    s.data_read,
                    s.data_in
                );
            }
            Some(Ok(None)) => {
                s.ended_read = true;
                if polite {
                    assert_eq!(s.data_read, s.data_staged, "stream {id} ended early");
                }
            }
            Some(Err(f)) => assert!(
                !polite || matches!(f, Failure::Refused),
                "a well-behaved worker's stream {id} failed: {f:?}"
            ),
            None => assert!(
                !failed,
                "a caller waits on stream {id} of a failed connection"
            ),
        }
    }

    fn deliver(&mut self, n: usize) {
        let bytes: Vec<u8> = self.staged.drain(..n).collect();
        self.inbuf.extend_from_slice(&bytes);
        self.fed += n as u64;
        self.conn
            .on_read(&mut self.inbuf, self.now, &mut Vec::new());
        let consumed = self.fed - self.inbuf.len() as u64;
        while self.marks.front().is_some_and(|(end, _)| *end <= consumed) {
            let (_, mark) = self.marks.pop_front().unwrap();
            match mark {
                Mark::Nothing => {}
                Mark::Grants(g) => g.into_iter().for_each(|g| self.out.grant(g)),
                Mark::Settings(g, max) => {
                    g.into_iter().for_each(|g| self.out.grant(g));
                    if let Some(max) = max {
                        self.max_streams = max;
                    }
                }
                Mark::GoAway(last) => self.goaway = Some(self.goaway.map_or(last, |l| l.min(last))),
                Mark::Data { id, flow, len } => {
                    self.conn_flow_in += flow;
                    if let Some(s) = self.streams.get_mut(&id) {
                        s.data_in += len;
                    }
                }
            }
        }
    }

    /// Every byte the connection has queued to write.
    fn take_out(&mut self) -> Vec<u8> {
        let out = self.conn.out();
        let mut n = 64;
        loop {
            let mut slices = vec![IoSlice::new(&[]); n];
            let k = out.slices(&mut slices);
            if k < n {
                let all: Vec<u8> = slices[..k].iter().flat_map(|s| s.iter().copied()).collect();
                out.advance(all.len());
                return all;
            }
            n *= 4;
        }
    }

    fn check(&mut self) {
        let bytes = self.take_out();
        let seen = self
            .out
            .read(&bytes)
            .unwrap_or_else(|e| panic!("invalid output: {e}"));
        for s in seen {
            match s {
                Seen::Data {
                    stream,
                    data,
                    end_stream,
                    ..
                } => {
                    let st = self
                        .streams
                        .get_mut(&stream)
                        .expect("DATA on a stream opened");
                    for (k, b) in data.iter().enumerate() {
                        assert_eq!(
                            *b,
                            request_byte(stream, st.body_out + k as u64),
                            "stream {stream} body byte"
                        );
                    }
                    st.body_out += data.len() as u64;
                    assert!(st.body_out <= st.body);
                    if end_stream {
                        assert_eq!(st.body_out, st.body, "stream {stream} body ended early");
                    }
                }
                Seen::Settings(values) => {
                    for (id, v) in values {
                        if id == wire::INITIAL_WINDOW_SIZE {
                            self.client_initial = i64::from(v);
                        }
                    }
                }
                Seen::WindowUpdate {
                    stream: 0,
                    increment,
                } => self.conn_granted += u64::from(increment),
                Seen::WindowUpdate { stream, increment } => {
                    *self.stream_granted.entry(stream).or_default() += i64::from(increment);
                }
                Seen::GoAway { code, .. } => assert!(
                    !self.polite,
                    "a well-behaved worker's connection failed ({code:#x})"
                ),
                Seen::Reset { stream, code } => assert!(
                    !self.polite || code == wire::CANCEL,
                    "a well-behaved worker's stream {stream} reset ({code:#x})"
                ),
                _ => {}
            }
        }
        self.out.end_step();
        if self.conn_flow_in > self.conn_granted {
            assert!(
                self.conn.is_failed(),
                "the worker sent {} bytes on a window of {}",
                self.conn_flow_in,
                self.conn_granted
            );
        }
        if self.polite {
            assert!(
                !self.conn.is_failed(),
                "a well-behaved worker's connection failed"
            );
        }
        if self.conn.is_failed() {
            assert!(!self.conn.is_open());
        }
    }

    fn finish(mut self) {
        self.deliver(self.staged.len());
        self.check();
        if self.polite {
            // Every answer staged reaches its caller whole.
            // (Streams above a GOAWAY's last are refused, answered or not.)
            let last = self.goaway.unwrap_or(u32::MAX);
            let ids: Vec<u32> = self
                .streams
                .iter()
                .filter(|(id, s)| s.answered && !s.closed && **id <= last)
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                self.poll_head(id);
                for _ in 0..10_000 {
                    self.poll_data(id);
                    let s = &self.streams[&id];
                    if s.ended_read {
                        break;
                    }
                    self.check();
                }
                let s = &self.streams[&id];
                assert!(
                    s.ended_read && s.data_read == s.data_staged,
                    "stream {id} answer not read whole: {s:?}"
                );
                let taken = self.streams[&id].trailers_taken;
                assert!(
                    taken || self.conn.take_trailers(id).is_some(),
                    "stream {id} trailers"
                );
            }
        }
    }
}

impl Run {
    /// Stages a header block on `id`, in one to four frames.
    fn stage_block(&mut self, input: &mut Input, id: u32, block: &[u8], end_stream: bool) {
        let pieces = 1 + input.below(4);
        let cut = (block.len() / pieces).max(1);
        let parts: Vec<&[u8]> = if block.is_empty() {
            vec![&[]]
        } else {
            block.chunks(cut).collect()
        };
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let end_headers = if i + 1 == n { wire::END_HEADERS } else { 0 };
            if i == 0 {
                let flags = end_headers | if end_stream { wire::END_STREAM } else { 0 };
                self.stage(wire::HEADERS, flags, id, part, Mark::Nothing);
            } else {
                self.stage(wire::CONTINUATION, end_headers, id, part, Mark::Nothing);
            }
        }
    }

    fn stage_data(&mut self, id: u32, flags: u8, payload: &[u8], len: u64) {
        let flow = payload.len() as u64;
        self.stage(wire::DATA, flags, id, payload, Mark::Data { id, flow, len });
    }

    /// What a well-behaved worker may send on stream `id` and on the
    /// connection, from the client's SETTINGS and WINDOW_UPDATEs.
    fn window_for(&self, id: u32) -> i64 {
        let stream = self.client_initial + self.stream_granted.get(&id).copied().unwrap_or(0)
            - self.flow_staged.get(&id).copied().unwrap_or(0);
        let conn = self.conn_granted as i64 - self.conn_staged;
        stream.min(conn)
    }

    fn polite_frame(&mut self, input: &mut Input) {
        match input.weighted(&[20, 3, 2, 2, 1, 1]) {
            0 => {
                let ids: Vec<u32> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| !s.answered && !s.closed)
                    .map(|(id, _)| *id)
                    .collect();
                let Some(&id) = ids.get(input.below(ids.len())) else {
                    return;
                };
                if self.goaway.is_some_and(|last| id > last) {
                    return;
                }
                let head = self.encoder.encode([
                    (&b":status"[..], &b"200"[..]),
                    (b"content-type", b"application/grpc"),
                ]);
                self.stage_block(input, id, &head, false);
                let room = self.window_for(id).max(0) as usize;
                let mut len = input.below(room.min(40_000) + 1) as u64;
                let s = self.streams.get_mut(&id).unwrap();
                s.answered = true;
                let mut offset = 0;
                while len > 0 {
                    let n = len.min(wire::DEFAULT_MAX_FRAME as u64);
                    let payload: Vec<u8> =
                        (offset..offset + n).map(|k| answer_byte(id, k)).collect();
                    self.stage_data(id, 0, &payload, n);
                    *self.flow_staged.entry(id).or_default() += n as i64;
                    self.conn_staged += n as i64;
                    offset += n;
                    len -= n;
                }
                self.streams.get_mut(&id).unwrap().data_staged = offset;
                let trailers = self.encoder.encode([(&b"grpc-status"[..], &b"0"[..])]);
                self.stage_block(input, id, &trailers, true);
            }
            1 => {
                let inc = 1 + input.below(1 << 16) as u32;
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                let id = if input.bool() {
                    0
                } else {
                    ids.get(input.below(ids.len())).copied().unwrap_or(0)
                };
                let payload = inc.to_be_bytes();
                let grants = wire::window_grants(id, &payload);
                self.stage(wire::WINDOW_UPDATE, 0, id, &payload, Mark::Grants(grants));
            }
            2 => self.settings(input),
            3 => {
                let payload = input.u32().to_be_bytes().repeat(2);
                self.stage(wire::PING, 0, 0, &payload, Mark::Nothing);
            }
            4 => {
                let payload = input.bytes(10);
                self.stage(0x20 + input.u8() % 200, 0, 0, &payload, Mark::Nothing);
            }
            _ => {
                let last = self.streams.keys().last().copied().unwrap_or(0);
                let mut payload = last.to_be_bytes().to_vec();
                payload.extend_from_slice(&0u32.to_be_bytes());
                self.stage(wire::GOAWAY, 0, 0, &payload, Mark::GoAway(last));
            }
        }
    }

    fn chaos_frame(&mut self, input: &mut Input) {
        match input.weighted(&[12, 12, 2, 4, 5, 3, 2, 2, 2, 2, 1, 1]) {
            0 => {
                let id = self.stream_id(input);
                let block = match input.below(8) {
                    0..=2 => self
                        .encoder
                        .encode([(&b":status"[..], &b"200"[..]), (b"x-a", b"1")]),
                    3 => self.encoder.encode([(&b":status"[..], &b"103"[..])]),
                    4 => self.encoder.encode([(&b"grpc-status"[..], &b"0"[..])]),
                    5 => BlockBuilder::default().block(input).0,
                    6 => self
                        .encoder
                        .encode([(&b":status"[..], &b"200"[..]), (b"Bad Name", b"1")]),
                    _ => input.bytes(30),
                };
                let end_stream = input.bool();
                if input.below(8) == 0 {
                    // Padded, with priority, maybe broken.
                    let mut payload = vec![input.u8() % 8];
                    payload.extend_from_slice(&id.to_be_bytes());
                    payload.push(0);
                    payload.extend_from_slice(&block);
                    payload.extend(std::iter::repeat_n(0, input.below(8)));
                    let flags = wire::PADDED
                        | wire::PRIORITY_FLAG
                        | wire::END_HEADERS
                        | if end_stream { wire::END_STREAM } else { 0 };
                    self.stage(wire::HEADERS, flags, id, &payload, Mark::Nothing);
                } else {
                    self.stage_block(input, id, &block, end_stream);
                }
            }
            1 => {
                let id = self.stream_id(input);
                let len = match input.below(8) {
                    0 => 16_385,
                    _ => input.below(16_000),
                };
                let mut flags = if input.below(3) == 0 {
                    wire::END_STREAM
                } else {
                    0
                };
                let offset = self.streams.get(&id).map_or(0, |s| s.data_staged);
                let mut payload = Vec::new();
                let padded = input.below(5) == 0;
                let pad = input.below(40);
                if padded {
                    flags |= wire::PADDED;
                    payload.push(pad as u8);
                }
                payload.extend((offset..offset + len as u64).map(|k| answer_byte(id, k)));
                if padded && input.below(6) != 0 {
                    payload.extend(std::iter::repeat_n(0, pad));
                }
                if let Some(s) = self.streams.get_mut(&id) {
                    s.data_staged += len as u64;
                }
                self.stage_data(id, flags, &payload, len as u64);
            }
            2 => {
                let id = self.stream_id(input);
                let payload = input.bytes(20);
                self.stage(
                    wire::CONTINUATION,
                    input.u8() & wire::END_HEADERS,
                    id,
                    &payload,
                    Mark::Nothing,
                );
            }
            3 => {
                let id = self.stream_id(input);
                let code =
                    [wire::REFUSED_STREAM, wire::CANCEL, wire::PROTOCOL_ERROR, 0][input.below(4)];
                self.stage(wire::RST_STREAM, 0, id, &code.to_be_bytes(), Mark::Nothing);
            }
            4 => {
                let id = if input.bool() {
                    0
                } else {
                    self.stream_id(input)
                };
                let inc = [0, 1, 0x7fff_ffff, input.u32(), u32::from(input.u16())][input.below(5)];
                let payload = inc.to_be_bytes();
                let grants = wire::window_grants(id, &payload);
                self.stage(wire::WINDOW_UPDATE, 0, id, &payload, Mark::Grants(grants));
            }
            5 => self.settings(input),
            6 => {
                let flags = if input.bool() { wire::ACK } else { 0 };
                let payload = input.u32().to_be_bytes().repeat(2);
                self.stage(wire::PING, flags, 0, &payload, Mark::Nothing);
            }
            7 => {
                let last = if input.bool() {
                    self.stream_id(input)
                } else {
                    input.u32() & 0x7fff_ffff
                };
                let mut payload = last.to_be_bytes().to_vec();
                payload.extend_from_slice(&u32::from(input.u8() % 14).to_be_bytes());
                self.stage(wire::GOAWAY, 0, 0, &payload, Mark::GoAway(last));
            }
            8 => {
                let id = self.stream_id(input);
                let dep = if input.bool() { id } else { input.u32() };
                let mut payload = dep.to_be_bytes().to_vec();
                payload.push(0);
                payload.truncate(if input.below(3) == 0 {
                    input.below(6)
                } else {
                    5
                });
                self.stage(wire::PRIORITY, 0, id, &payload, Mark::Nothing);
            }
            9 => {
                let id = self.stream_id(input);
                let payload = input.bytes(20);
                self.stage(
                    10 + input.u8() % 200,
                    input.u8(),
                    id,
                    &payload,
                    Mark::Nothing,
                );
            }
            10 => {
                let id = self.stream_id(input);
                self.stage(
                    wire::PUSH_PROMISE,
                    wire::END_HEADERS,
                    id,
                    &[0, 0, 0, 2, 0x88],
                    Mark::Nothing,
                );
            }
            _ => {
                let raw = input.bytes(20);
                self.staged.extend_from_slice(&raw);
                self.staged_total += raw.len() as u64;
                self.marks.push_back((self.staged_total, Mark::Nothing));
            }
        }
    }
}
