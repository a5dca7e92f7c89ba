//! An attacker's HTTP/2 connection: frames queued and written in batches
//! (one batch, one `write`), a reader thread that records what the server
//! answers (GOAWAY, resets, responses, flow-control credit) and can pause
//! to play a client that does not read.
//!
//! The frames are `h2spec::frame`'s, header blocks `loona-hpack`'s: nothing
//! of the agent's codec.

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::h2spec::conn::{Field, PREFACE};
use crate::h2spec::frame::{Frame, Headers, flag, kind, setting};

/// How long one blocked write waits before it counts as blocked.
const WRITE_PATIENCE: Duration = Duration::from_millis(500);
/// The largest window HTTP/2 allows.
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The first GOAWAY the server sent.
#[derive(Clone, Copy, Debug)]
pub struct GoAway {
    pub code: u32,
    pub last_stream: u32,
    /// Since the connection started.
    pub at: Duration,
    /// Streams and frames the attacker had queued by then.
    pub streams_sent: u64,
    pub frames_sent: u64,
}

/// What came back on one stream.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    /// Decoded fields of every header block (response headers, trailers).
    pub fields: Vec<(String, String)>,
    pub data: u64,
    pub reset: Option<u32>,
    pub ended: bool,
}

impl Answer {
    /// The value of the first field `name`.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the reader has seen.
#[derive(Debug, Default)]
pub struct Seen {
    pub goaway: Option<GoAway>,
    /// When the reader saw the server close (EOF or reset), since the start.
    pub closed: Option<Duration>,
    /// When a write found the connection gone, since the start.
    pub write_failed: Option<Duration>,
    /// The server's SETTINGS, once they arrived.
    pub server_settings: Option<HashMap<u16, u32>>,
    /// RST_STREAM frames received, by error code.
    pub resets: BTreeMap<u32, u64>,
    pub answers: HashMap<u32, Answer>,
    /// Credit for our DATA: connection, per stream, initial.
    conn_window: i64,
    windows: HashMap<u32, i64>,
    initial_window: i64,
}

impl Seen {
    /// RST_STREAM frames received.
    pub fn reset_count(&self) -> u64 {
        self.resets.values().sum()
    }

    /// Streams that got response headers.
    pub fn answered(&self) -> usize {
        self.answers
            .values()
            .filter(|a| !a.fields.is_empty())
            .count()
    }

    /// Whether the connection is over: GOAWAY received, or closed.
    pub fn over(&self) -> bool {
        self.goaway.is_some() || self.closed.is_some() || self.write_failed.is_some()
    }

    /// When the connection ended, as the reader or a write saw it first.
    pub fn ended(&self) -> Option<Duration> {
        match (self.closed, self.write_failed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// State shared by the writer and the reader thread.
struct Shared {
    /// Whole frames waiting to be written (the first maybe partly written):
    /// the attacker's, and the reader's PING acknowledgements.
    outbox: Mutex<Vec<u8>>,
    seen: Mutex<Seen>,
    changed: Condvar,
    started: Instant,
    streams: AtomicU64,
    frames: AtomicU64,
    paused: AtomicBool,
    stop: AtomicBool,
}

/// How a batch went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Sent,
    /// The server is not reading: the batch waits (its rest kept).
    Blocked,
    /// The connection is gone.
    Closed,
}

/// Connection options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Our SETTINGS.
    pub settings: Vec<(u16, u32)>,
    /// Open the connection window to the maximum (else 65,535).
    pub open_connection_window: bool,
    /// Start with the reader paused (a client that never reads).
    pub paused: bool,
    /// Our socket's receive buffer, to make a non-reader stall sooner.
    pub recv_buffer: Option<usize>,
}

impl Default for Options {
    /// A reading client that takes whatever the server sends.
    fn default() -> Self {
        Options {
            settings: vec![(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW)],
            open_connection_window: true,
            paused: false,
            recv_buffer: None,
        }
    }
}

/// An attacker's connection.
pub struct Wire {
    out: TcpStream,
    encoder: loona_hpack::Encoder<'static>,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    next_stream: u32,
    /// Time writes spent blocked.
    pub blocked: Duration,
    /// The `:authority` of requests.
    pub authority: String,
}

impl Wire {
    /// Connects, sends the preface, our SETTINGS and an ACK of the
    /// server's (servers send theirs first), and starts the reader.
    pub fn connect(addr: SocketAddr, opts: &Options) -> std::io::Result<Wire> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        if let Some(size) = opts.recv_buffer {
            sock.set_recv_buffer_size(size)?;
        }
        sock.connect(&addr.into())?;
        let out: TcpStream = sock.into();
        out.set_nodelay(true)?;
        out.set_write_timeout(Some(WRITE_PATIENCE))?;
        let shared = Arc::new(Shared {
            outbox: Mutex::new(PREFACE.to_vec()),
            seen: Mutex::new(Seen {
                conn_window: 65_535,
                initial_window: 65_535,
                ..Seen::default()
            }),
            changed: Condvar::new(),
            started: Instant::now(),
            streams: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            paused: AtomicBool::new(opts.paused),
            stop: AtomicBool::new(false),
        });
        let input = out.try_clone()?;
        let acks = out.try_clone()?;
        let reader = {
            let shared = shared.clone();
            std::thread::spawn(move || read_loop(input, &acks, &shared))
        };
        let mut wire = Wire {
            out,
            encoder: loona_hpack::Encoder::new(),
            shared,
            reader: Some(reader),
            next_stream: 1,
            blocked: Duration::ZERO,
            authority: addr.to_string(),
        };
        let settings = opts
            .settings
            .iter()
            .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
            .collect();
        wire.queue(Frame::new(kind::SETTINGS, 0, 0, settings));
        wire.queue(Frame::new(kind::SETTINGS, flag::ACK, 0, Vec::new()));
        if opts.open_connection_window {
            wire.queue(window_update(0, MAX_WINDOW - 65_535));
        }
        if wire.flush() == Flow::Closed {
            return Err(std::io::Error::other("closed during the preface"));
        }
        Ok(wire)
    }

    /// Queues a frame for the next batch.
    pub fn queue(&mut self, frame: Frame) {
        self.queue_encoded(&frame.encode(), 1);
    }

    /// Queues raw bytes of already encoded frames (`frames` of them).
    pub fn queue_encoded(&mut self, bytes: &[u8], frames: u64) {
        self.shared.outbox.lock().unwrap().extend_from_slice(bytes);
        self.shared.frames.fetch_add(frames, Ordering::Relaxed);
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.shared.outbox.lock().unwrap().len()
    }

    /// Writes the batch in one `write` where the socket takes it; a write
    /// the server does not drain within [`WRITE_PATIENCE`] is `Blocked`
    /// (what is left stays queued).
    pub fn flush(&mut self) -> Flow {
        let t = Instant::now();
        let flow = write_out(&self.out, &mut self.shared.outbox.lock().unwrap());
        match flow {
            Flow::Blocked => self.blocked += t.elapsed(),
            Flow::Closed => {
                self.mark_closed();
            }
            Flow::Sent => {}
        }
        flow
    }

    fn mark_closed(&mut self) -> Flow {
        let at = self.elapsed();
        let mut seen = self.shared.seen.lock().unwrap();
        seen.write_failed.get_or_insert(at);
        Flow::Closed
    }

    /// Time since the connection started.
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Streams opened so far.
    pub fn streams(&self) -> u64 {
        self.shared.streams.load(Ordering::Relaxed)
    }

    /// Frames queued so far.
    pub fn frames(&self) -> u64 {
        self.shared.frames.load(Ordering::Relaxed)
    }

    /// Encodes `fields` into a header block (the connection's HPACK context).
    pub fn encode(&mut self, fields: &[Field]) -> Vec<u8> {
        self.encoder
            .encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    /// Queues HEADERS opening the next client stream; returns its id.
    pub fn open(&mut self, fields: &[Field], end_stream: bool) -> u32 {
        let stream = self.next_stream;
        self.next_stream += 2;
        let block = self.encode(fields);
        let mut parts = block.chunks(16_384);
        let first = parts.next().unwrap_or_default();
        let rest: Vec<&[u8]> = parts.collect();
        let headers = Headers {
            stream,
            block: first.to_vec(),
            end_stream,
            end_headers: rest.is_empty(),
            ..Default::default()
        };
        self.queue(headers.frame());
        for (i, part) in rest.iter().enumerate() {
            let flags = if i + 1 == rest.len() {
                flag::END_HEADERS
            } else {
                0
            };
            self.queue(Frame::new(kind::CONTINUATION, flags, stream, part.to_vec()));
        }
        self.shared.streams.fetch_add(1, Ordering::Relaxed);
        stream
    }

    /// The id the next [`Wire::open`] uses (for frames written by hand).
    pub fn take_stream_id(&mut self) -> u32 {
        let stream = self.next_stream;
        self.next_stream += 2;
        self.shared.streams.fetch_add(1, Ordering::Relaxed);
        stream
    }

    /// Queues `body` as DATA on `stream` within the server's flow-control
    /// credit, writing and waiting for more as needed; `false` if the
    /// connection ended first.
    pub fn send_body(&mut self, stream: u32, body: &[u8], end: bool) -> bool {
        let mut rest = body;
        loop {
            let take = {
                let mut seen = self.shared.seen.lock().unwrap();
                if seen.over() {
                    return false;
                }
                let initial = seen.initial_window;
                let stream_window = *seen.windows.entry(stream).or_insert(initial);
                let take = rest
                    .len()
                    .min(16_384)
                    .min(seen.conn_window.max(0) as usize)
                    .min(stream_window.max(0) as usize);
                if take > 0 || rest.is_empty() {
                    seen.conn_window -= take as i64;
                    *seen.windows.get_mut(&stream).unwrap() -= take as i64;
                }
                take
            };
            if take == 0 && !rest.is_empty() {
                if self.flush() == Flow::Closed {
                    return false;
                }
                self.wait_for(Duration::from_millis(100), |_| false);
                continue;
            }
            let last = take == rest.len();
            let flags = if last && end { flag::END_STREAM } else { 0 };
            self.queue(Frame::new(kind::DATA, flags, stream, rest[..take].to_vec()));
            rest = &rest[take..];
            if last {
                return true;
            }
        }
    }

    /// Waits up to `timeout` until `done` holds for what the reader saw;
    /// whether it did.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut seen = self.shared.seen.lock().unwrap();
        loop {
            if done(&seen) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            seen = self.shared.changed.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Reads what the reader saw so far.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.shared.seen.lock().unwrap())
    }

    /// Stops (`true`) or resumes reading the socket.
    pub fn pause_reading(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Relaxed);
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.out.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Writes what `outbox` holds to `sock` (see [`Wire::flush`]).
fn write_out(mut sock: &TcpStream, outbox: &mut Vec<u8>) -> Flow {
    while !outbox.is_empty() {
        match sock.write(outbox) {
            Ok(0) => return Flow::Closed,
            Ok(n) => {
                outbox.drain(..n);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Flow::Blocked;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Flow::Closed,
        }
    }
    Flow::Sent
}

/// A WINDOW_UPDATE frame.
pub fn window_update(stream: u32, increment: u32) -> Frame {
    Frame::new(
        kind::WINDOW_UPDATE,
        0,
        stream,
        increment.to_be_bytes().to_vec(),
    )
}

fn read_loop(mut sock: TcpStream, acks: &TcpStream, shared: &Shared) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut decoder = loona_hpack::Decoder::new();
    let mut block: Option<(u32, Vec<u8>)> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let n = match sock.read(&mut chunk) {
            Ok(0) => 0,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        let mut seen = shared.seen.lock().unwrap();
        if n == 0 {
            seen.closed.get_or_insert(shared.started.elapsed());
            shared.changed.notify_all();
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut pongs = Vec::new();
        while let Some(f) = Frame::parse(&mut buf) {
            if f.kind == kind::PING && !f.is_ack() {
                // A reading client's stack answers pings (else the server
                // closes it as dead, which is not what is being tried).
                pongs.extend(Frame::new(kind::PING, flag::ACK, 0, f.payload.clone()).encode());
            }
            on_frame(&mut seen, shared, &mut decoder, &mut block, f);
        }
        shared.changed.notify_all();
        drop(seen);
        if !pongs.is_empty() {
            let mut outbox = shared.outbox.lock().unwrap();
            outbox.extend_from_slice(&pongs);
            let _ = write_out(acks, &mut outbox);
        }
    }
}

fn on_frame(
    seen: &mut Seen,
    shared: &Shared,
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &mut Option<(u32, Vec<u8>)>,
    f: Frame,
) {
    match f.kind {
        kind::HEADERS => {
            let mut p = &f.payload[..];
            let mut pad = 0;
            if f.has(flag::PADDED) && !p.is_empty() {
                pad = p[0] as usize;
                p = &p[1..];
            }
            if f.has(flag::PRIORITY) && p.len() >= 5 {
                p = &p[5..];
            }
            let p = &p[..p.len().saturating_sub(pad)];
            let answer = seen.answers.entry(f.stream).or_default();
            answer.ended |= f.has(flag::END_STREAM);
            *block = Some((f.stream, p.to_vec()));
            if f.has(flag::END_HEADERS) {
                decode(seen, decoder, block);
            }
        }
        kind::CONTINUATION => {
            if let Some((_, b)) = block.as_mut() {
                b.extend_from_slice(&f.payload);
            }
            if f.has(flag::END_HEADERS) {
                decode(seen, decoder, block);
            }
        }
        kind::DATA => {
            let answer = seen.answers.entry(f.stream).or_default();
            answer.data += f.payload.len() as u64;
            answer.ended |= f.has(flag::END_STREAM);
        }
        kind::RST_STREAM => {
            let code = f.error_code().unwrap_or(u32::MAX);
            *seen.resets.entry(code).or_default() += 1;
            seen.answers.entry(f.stream).or_default().reset = Some(code);
        }
        kind::GOAWAY if seen.goaway.is_none() && f.payload.len() >= 8 => {
            let p = &f.payload;
            seen.goaway = Some(GoAway {
                code: f.error_code().unwrap_or(u32::MAX),
                last_stream: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & MAX_WINDOW,
                at: shared.started.elapsed(),
                streams_sent: shared.streams.load(Ordering::Relaxed),
                frames_sent: shared.frames.load(Ordering::Relaxed),
            });
        }
        kind::SETTINGS if !f.is_ack() => {
            let known = seen.server_settings.get_or_insert_with(HashMap::new);
            known.extend(f.settings());
            for (id, v) in f.settings() {
                if id == setting::INITIAL_WINDOW_SIZE {
                    let delta = i64::from(v) - seen.initial_window;
                    seen.initial_window = i64::from(v);
                    for w in seen.windows.values_mut() {
                        *w += delta;
                    }
                }
            }
        }
        kind::WINDOW_UPDATE if f.payload.len() == 4 => {
            let p = &f.payload;
            let inc = i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & MAX_WINDOW);
            if f.stream == 0 {
                seen.conn_window += inc;
            } else {
                let initial = seen.initial_window;
                *seen.windows.entry(f.stream).or_insert(initial) += inc;
            }
        }
        _ => {}
    }
}

fn decode(
    seen: &mut Seen,
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &mut Option<(u32, Vec<u8>)>,
) {
    let Some((stream, bytes)) = block.take() else {
        return;
    };
    let fields = match decoder.decode(&bytes) {
        Ok(fields) => fields
            .into_iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(&n).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect(),
        Err(e) => vec![("x-attacker-decode-error".into(), format!("{e:?}"))],
    };
    seen.answers
        .entry(stream)
        .or_default()
        .fields
        .extend(fields);
}
