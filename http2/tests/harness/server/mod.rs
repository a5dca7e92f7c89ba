//! [`server::Conn`] driven by a client's frames (see [`peer`]) and by the
//! actions of its requests' handlers, with the invariants checked after
//! every step:
//!
//! - nothing panics, and everything written is a valid frame sequence
//!   ([`OutputCheck`]): no DATA beyond the client's windows, frames within
//!   its maximum size, header blocks that decode in order, response data
//!   as the handler gave it;
//! - once the connection failed, nothing more is written or accepted;
//! - streams open never exceed `max_concurrent_streams`, nor the streams
//!   whose handler may still run or whose response is not yet written or
//!   reset: no stream outlives its handler plus its response;
//! - `queued()` is exactly the response bytes handed in and neither
//!   written nor dropped by a reset, within `stream_send_buffer` plus one
//!   chunk per stream;
//! - what is written is bounded by what was read and handed in (no
//!   amplification), and `next_timeout` never asks to be woken at once
//!   after `on_timeout` (no busy loop);
//! - a well-behaved client (`polite`) is never failed nor has a stream
//!   reset for an error, and reads every body byte it sent in order.
//!
//! At the end every handler finishes, the windows open (`polite`) and the
//! send timeout passes: no stream may be left.

mod check;
mod peer;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::IoSlice;
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use infermesh_http2::Limits;
use infermesh_http2::server::{Conn, Settings, StreamError};

use super::input::Input;
use super::wire::{self, OutputCheck, Role};
use peer::{Mark, body_byte};

pub const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";
const NAMES: &[&str] = &["content-type", "grpc-status", "infermesh-busy"];
/// Steps in one run at most.
const MAX_STEPS: usize = 400;

/// Where a stream's handler is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Handler {
    /// Staged by the client, not yet processed.
    #[default]
    Unopened,
    /// Opened; `accept` may still hand it out.
    Pending,
    Running,
    Finished,
    /// Never handed out (refused, reset first, answered by the connection).
    Never,
}

/// The model of one stream.
#[derive(Debug, Default)]
struct Stream {
    // What the client staged (its own view).
    client_ended: bool,
    client_reset: bool,
    body_sent: u64,
    // What the server processed.
    data_in: u64,
    reset_in: bool,
    // The handler.
    handler: Handler,
    head_sent: bool,
    end_sent: bool,
    given: u64,
    body_read: u64,
    // The output.
    data_out: u64,
}

/// A response data byte at `offset` of stream `id`.
fn response_byte(id: u32, offset: u64) -> u8 {
    (u64::from(id) * 13 + offset * 3 + 1) as u8
}

/// One run: the connection, the client's bytes, and the model.
pub struct Run {
    conn: Conn,
    limits: Limits,
    polite: bool,
    now: Instant,
    // Input.
    staged: Vec<u8>,
    staged_total: u64,
    marks: VecDeque<(u64, Mark)>,
    inbuf: BytesMut,
    fed: u64,
    encoder: loona_hpack::Encoder<'static>,
    next_id: u32,
    max_processed: u32,
    processed_frames: u64,
    // The model.
    streams: BTreeMap<u32, Stream>,
    // The output.
    out: OutputCheck,
    out_seen: usize,
    written: u64,
    budget: u64,
    goaway_seen: Option<u32>,
    failed_at_written: Option<u64>,
    // A well-behaved client's view of the server's grants.
    server_initial: i64,
    server_granted: HashMap<u32, i64>,
    server_max_streams: u32,
    client_sent_flow: HashMap<u32, i64>,
    client_sent_conn: i64,
    granted: HashMap<u32, i64>,
    handler_resets: Vec<u32>,
    server_go_away: bool,
    /// Of a chaotic client's frames, the percentage that are good.
    good_share: usize,
    /// A header block staged without END_HEADERS: its stream, END_STREAM.
    open_block: Option<(u32, bool)>,
    /// Raw bytes were sent: which streams the client opened is unknown.
    lost: bool,
}

/// Limits drawn from the input: small, so that every bound is reached.
/// (Limits added later keep their defaults.)
#[allow(clippy::needless_update)]
fn limits(input: &mut Input, polite: bool) -> Limits {
    let small =
        |input: &mut Input, lo: u32, hi: u32| lo + input.below((hi - lo) as usize + 1) as u32;
    let budget = |input: &mut Input| if polite { 1000 } else { small(input, 1, 60) };
    Limits {
        max_concurrent_streams: small(input, 1, 8),
        stream_window: small(input, 1, 1 << 18),
        connection_window: small(input, 1, 1 << 20),
        max_header_list_size: small(input, 64, 20_000),
        reset_stream_burst: budget(input),
        reset_stream_rate: small(input, 0, 40),
        max_local_error_resets: budget(input),
        control_frame_burst: budget(input),
        control_frame_rate: small(input, 0, 100),
        stream_send_buffer: small(input, 1, 1 << 17) as usize,
        connection_send_buffer: small(input, 1, 1 << 19) as usize,
        write_buffer: small(input, 1, 1 << 18) as usize,
        send_timeout: Duration::from_millis(u64::from(small(input, 1, 60_000))),
        goaway_ping_timeout: Duration::from_millis(u64::from(small(input, 1, 5_000))),
        ..Limits::default()
    }
}

impl Run {
    /// Runs the whole of `data`, panicking with the invariant that broke.
    pub fn run(data: &[u8]) {
        let mut input = Input::new(data);
        let mut run = Run::new(&mut input);
        run.check();
        let mut steps = 0;
        while !input.is_empty() && steps < MAX_STEPS {
            steps += 1;
            run.step(&mut input);
            run.check();
        }
        if std::env::var_os("HARNESS_STATS").is_some() {
            let answered = run
                .streams
                .keys()
                .filter(|id| run.out.is_done(**id))
                .count();
            eprintln!(
                "stats polite={} steps={steps} streams={} answered={answered} failed={:?}",
                run.polite,
                run.streams.len(),
                run.conn.failed()
            );
        }
        run.finish();
    }

    fn new(input: &mut Input) -> Self {
        let polite = input.below(3) == 0;
        let limits = limits(input, polite);
        let now = Instant::now();
        let settings = Settings {
            response_names: NAMES,
            known_paths: &[PATH],
            limits,
        };
        let mut run = Run {
            conn: Conn::new(settings, now),
            limits,
            polite,
            now,
            staged: Vec::new(),
            staged_total: 0,
            marks: VecDeque::new(),
            inbuf: BytesMut::new(),
            fed: 0,
            encoder: loona_hpack::Encoder::new(),
            next_id: 1,
            max_processed: 0,
            processed_frames: 0,
            streams: BTreeMap::new(),
            out: OutputCheck::new(Role::Server),
            out_seen: 0,
            written: 0,
            budget: 256,
            goaway_seen: None,
            failed_at_written: None,
            server_initial: wire::DEFAULT_WINDOW,
            server_granted: HashMap::new(),
            server_max_streams: u32::MAX,
            client_sent_flow: HashMap::new(),
            client_sent_conn: 0,
            granted: HashMap::new(),
            handler_resets: Vec::new(),
            server_go_away: false,
            good_share: 0,
            open_block: None,
            lost: false,
        };
        if polite || input.below(16) != 0 {
            run.stage_raw(wire::PREFACE);
        } else {
            let junk = input.bytes(30);
            run.stage_raw(&junk);
        }
        run.good_share = input.below(100);
        if polite || input.below(8) != 0 {
            let payload =
                wire::settings_payload(&[(wire::INITIAL_WINDOW_SIZE, input.below(1 << 17) as u32)]);
            let grants = wire::settings_grants(&payload).unwrap();
            run.stage(wire::SETTINGS, 0, 0, &payload, Mark::Grants(grants));
        } else {
            run.chaos_frame(input);
        }
        run
    }

    fn step(&mut self, input: &mut Input) {
        let wake = &mut Vec::new();
        let action = input.weighted(&[45, 14, 5, 6, 6, 5, 6, 5, 1, 5, 4, 1, 1]);
        if std::env::var_os("HARNESS_TRACE").is_some() {
            eprintln!(
                "action {action}; failed {:?}; streams {}",
                self.conn.failed(),
                self.conn.open_streams()
            );
        }
        match action {
            0 => {
                // A chaotic client still sends mostly good frames, so that
                // runs get past the first error.
                if self.polite || input.below(100) < self.good_share {
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
            2 => {
                let n = if input.bool() {
                    usize::MAX
                } else {
                    input.below(1 << 16)
                };
                self.read_out(n);
            }
            3 => self.accept(),
            4 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    self.poll_data(id);
                }
            }
            5 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    if !self.streams[&id].head_sent {
                        let end = input.below(4) == 0;
                        self.send_head(id, end);
                    }
                }
            }
            6 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    let len = match input.below(10) {
                        0 => 70_000,
                        _ => 1 + input.below(5000),
                    };
                    self.send_data(id, len, wake);
                }
            }
            7 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    let trailers = input.bool();
                    self.send_end(id, trailers, wake);
                }
            }
            8 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    let code = [wire::CANCEL, 2][input.below(2)];
                    self.handler_resets.push(code);
                    self.conn.send_reset(id, code, wake);
                }
            }
            9 => {
                if let Some(id) = self.pick(input, Handler::Running) {
                    self.conn.finish(id, wake);
                    self.budget += 100;
                    self.streams.get_mut(&id).unwrap().handler = Handler::Finished;
                }
            }
            10 => {
                let ms = match input.below(4) {
                    0 => input.below(100_000),
                    _ => input.below(2000),
                };
                self.advance(Duration::from_millis(ms as u64));
            }
            11 => {
                self.conn.go_away();
                self.server_go_away = true;
                self.budget += 64;
            }
            _ => {
                self.conn.ping();
                self.conn.take_pong();
                self.budget += 17;
            }
        }
    }

    /// A stream whose handler is in `state`, if any.
    fn pick(&self, input: &mut Input, state: Handler) -> Option<u32> {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.handler == state)
            .map(|(id, _)| *id)
            .collect();
        ids.get(input.below(ids.len())).copied()
    }

    fn deliver(&mut self, n: usize) {
        let bytes: Vec<u8> = self.staged.drain(..n).collect();
        self.inbuf.extend_from_slice(&bytes);
        self.fed += n as u64;
        if std::env::var_os("HARNESS_TRACE").is_some() {
            eprintln!(
                "  deliver {n} bytes: {:02x?}",
                &bytes[..bytes.len().min(300)]
            );
        }
        let mut wake = Vec::new();
        self.conn.on_read(&mut self.inbuf, self.now, &mut wake);
        let consumed = self.fed - self.inbuf.len() as u64;
        while self.marks.front().is_some_and(|(end, _)| *end <= consumed) {
            let (_, mark) = self.marks.pop_front().unwrap();
            self.processed_frames += 1;
            self.budget += 48 + 9 * u64::from(self.limits.max_concurrent_streams);
            self.apply(mark);
        }
        self.budget += 3 * n as u64;
    }

    fn apply(&mut self, mark: Mark) {
        match mark {
            Mark::Nothing => {}
            Mark::Grants(grants) => grants.into_iter().for_each(|g| self.out.grant(g)),
            Mark::Headers { id, .. } => {
                if id % 2 == 1 && id > self.max_processed {
                    self.max_processed = id;
                    self.out.peer_max_id = self.out.peer_max_id.max(id);
                    self.streams.entry(id).or_default().handler = Handler::Pending;
                }
            }
            Mark::Data { id, len, .. } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.data_in += len;
                }
            }
            Mark::Reset { id } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.reset_in = true;
                }
            }
        }
    }

    /// Every byte the connection has queued to write.
    fn peek_out(&mut self) -> Vec<u8> {
        let out = self.conn.out();
        let mut n = 64;
        loop {
            let mut slices = vec![IoSlice::new(&[]); n];
            let k = out.slices(&mut slices);
            if k < n {
                return slices[..k].iter().flat_map(|s| s.iter().copied()).collect();
            }
            n *= 4;
        }
    }

    /// The client reads `n` bytes of what was written (all, if fewer),
    /// and the connection is told they left.
    fn read_out(&mut self, n: usize) {
        self.observe();
        let n = n.min(self.out_seen);
        self.conn.out().advance(n);
        self.out_seen -= n;
        let mut wake = Vec::new();
        self.conn.on_written(&mut wake);
        // Data waiting for room in the write buffer may now leave, one
        // more DATA frame header per stream.
        self.budget += 9 * (1 + self.streams.len() as u64);
    }

    fn accept(&mut self) {
        while let Some((id, req)) = self.conn.accept() {
            let polite = self.polite;
            let lost = self.lost;
            let s = self.streams.entry(id).or_default();
            if lost && s.handler == Handler::Unopened {
                // Opened by frames the model did not follow.
                s.handler = Handler::Pending;
            }
            assert_eq!(
                s.handler,
                Handler::Pending,
                "stream {id} accepted in state {:?}",
                s.handler
            );
            s.handler = Handler::Running;
            if polite {
                assert_eq!(req.uri().path(), PATH);
            }
            assert!(
                self.conn.failed().is_none(),
                "stream {id} accepted after the connection failed"
            );
        }
        for s in self.streams.values_mut() {
            if s.handler == Handler::Pending {
                s.handler = Handler::Never;
            }
        }
    }

    fn poll_data(&mut self, id: u32) {
        let polite = self.polite;
        let failed = self.conn.failed().is_some();
        let result = self.conn.poll_data(id, Waker::noop());
        self.budget += 26;
        let s = self.streams.get_mut(&id).unwrap();
        match result {
            Some(Some(Ok(bytes))) => {
                assert!(!failed, "stream {id} read data after the connection failed");
                for (k, b) in bytes.iter().enumerate() {
                    assert_eq!(
                        *b,
                        body_byte(id, s.body_read + k as u64),
                        "stream {id} body byte {}",
                        s.body_read + k as u64
                    );
                }
                s.body_read += bytes.len() as u64;
                assert!(
                    s.body_read <= s.data_in,
                    "stream {id} read {} of {} bytes received",
                    s.body_read,
                    s.data_in
                );
            }
            Some(None) => {
                if polite && !s.client_reset {
                    assert_eq!(s.body_read, s.body_sent, "stream {id} ended early");
                }
            }
            Some(Some(Err(StreamError::Reset(_) | StreamError::Closed))) | None => {}
        }
    }

    fn send_head(&mut self, id: u32, end: bool) {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        if end {
            headers.insert("grpc-status", HeaderValue::from_static("0"));
        }
        self.conn.send_head(id, 200, &headers, end);
        self.budget += 300;
        let s = self.streams.get_mut(&id).unwrap();
        s.head_sent = true;
        s.end_sent = end;
    }

    fn send_data(&mut self, id: u32, len: usize, wake: &mut Vec<Waker>) {
        let s = &self.streams[&id];
        if !s.head_sent || s.end_sent {
            return;
        }
        let queued = self.model_queued(id);
        match self.conn.poll_send_ready(id, Waker::noop()) {
            Some(true) => {
                assert!(
                    queued < self.limits.stream_send_buffer as u64,
                    "stream {id} ready with {queued} queued"
                );
                let given = s.given;
                let data: Bytes = (0..len as u64)
                    .map(|k| response_byte(id, given + k))
                    .collect();
                self.conn.send_data(id, data, wake);
                self.streams.get_mut(&id).unwrap().given += len as u64;
                self.budget += len as u64 + 9 * (len as u64 / 16_384 + 1);
            }
            Some(false) => {}
            None => assert!(
                queued >= self.limits.stream_send_buffer as u64,
                "stream {id} not ready with {queued} queued"
            ),
        }
    }

    fn send_end(&mut self, id: u32, trailers: bool, wake: &mut Vec<Waker>) {
        let s = self.streams.get_mut(&id).unwrap();
        if !s.head_sent || s.end_sent {
            return;
        }
        s.end_sent = true;
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        self.conn.send_end(id, trailers.then_some(&t), wake);
        self.budget += 300;
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.conn.set_time(self.now);
        if self.conn.next_timeout().is_some_and(|t| t <= self.now) {
            let mut wake = Vec::new();
            self.conn.on_timeout(self.now, &mut wake);
            self.budget += 64 + 13 * self.streams.len() as u64;
            if let Some(t) = self.conn.next_timeout() {
                assert!(
                    t > self.now,
                    "next_timeout() is due at once after on_timeout: a busy loop"
                );
            }
        }
    }

    /// Response bytes of `id` handed in and neither written nor dropped.
    fn model_queued(&self, id: u32) -> u64 {
        let s = &self.streams[&id];
        if self.conn.failed().is_some() || s.reset_in || self.out.is_reset(id) {
            return 0;
        }
        s.given - s.data_out
    }
}
