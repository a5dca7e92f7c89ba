//! One client connection of a conformance case (h2spec's `spec.Conn`): raw
//! frame writes, event reads with a deadline, the client handshake, HPACK
//! encoding through `loona-hpack`, and the automatic WINDOW_UPDATEs h2spec
//! sends as response data arrives.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{Frame, Headers, Priority, flag, kind, setting};
use super::{Failure, Verdict};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The default flow-control window.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// The default SETTINGS_MAX_FRAME_SIZE.
pub const DEFAULT_FRAME_SIZE: usize = 16_384;
/// h2spec's `--max-header-length` default: the value length of dummy headers.
pub const MAX_HEADER_LEN: usize = 4000;

/// How a case gets a response that carries DATA from the server under test.
#[derive(Clone, Debug)]
pub enum DataRequest {
    /// A GET of the target path (h2spec's own way: a web server answers
    /// with a body).
    Get,
    /// A unary gRPC call at this path with one empty message: a gRPC server
    /// answers a GET with a trailers-only response, which has no DATA.
    Grpc(&'static str),
}

/// The server a suite runs against.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its name in the table.
    pub name: &'static str,
    /// Where it listens (plaintext HTTP/2, prior knowledge).
    pub addr: SocketAddr,
    /// The `:path` of the cases' requests (h2spec's `--path`).
    pub path: String,
    /// How to get a response with DATA (flow-control cases).
    pub data_request: DataRequest,
    /// How long one wait for the next frame lasts (h2spec's `--timeout`).
    pub timeout: Duration,
}

/// A header field to encode.
pub type Field = (String, String);

/// A header field from string slices.
pub fn field(name: &str, value: &str) -> Field {
    (name.to_string(), value.to_string())
}

/// What one wait on the connection saw.
#[derive(Clone, Debug)]
pub enum Event {
    Frame(Frame),
    /// The server closed (FIN at a frame boundary, or a reset).
    Closed,
    /// Nothing arrived within the target's timeout.
    Timeout,
    /// Anything else: a read error, a close in the middle of a frame.
    Error(String),
}

impl Event {
    /// The frame, if it is one of `kind`.
    pub fn frame_of(&self, k: u8) -> Option<&Frame> {
        match self {
            Event::Frame(f) if f.kind == k => Some(f),
            _ => None,
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Frame(frame) => write!(f, "{frame}"),
            Event::Closed => write!(f, "connection closed"),
            Event::Timeout => write!(f, "timeout"),
            Event::Error(e) => write!(f, "error: {e}"),
        }
    }
}

/// A client connection to the [`Target`].
pub struct Conn {
    sock: TcpStream,
    buf: Vec<u8>,
    /// The server's SETTINGS seen in the handshake.
    pub settings: HashMap<u16, u32>,
    /// Whether a wait saw the end (close, timeout or error), as in h2spec.
    pub closed: bool,
    windows: HashMap<u32, i64>,
    encoder: loona_hpack::Encoder<'static>,
    /// The server under test.
    pub target: Arc<Target>,
}

impl Conn {
    /// Connects to the target.
    pub fn dial(target: Arc<Target>) -> std::io::Result<Conn> {
        let sock = TcpStream::connect_timeout(&target.addr, target.timeout)?;
        sock.set_nodelay(true)?;
        Ok(Conn {
            sock,
            buf: Vec::new(),
            settings: HashMap::new(),
            closed: false,
            windows: HashMap::from([(0, DEFAULT_WINDOW)]),
            encoder: loona_hpack::Encoder::new(),
            target,
        })
    }

    /// The client side of the handshake: preface and SETTINGS out, then
    /// frames in until the server's SETTINGS (acknowledged) and the ACK of
    /// ours have both arrived, within one timeout.
    pub fn handshake(&mut self) -> Verdict {
        self.send(PREFACE);
        self.write_settings(&[(setting::INITIAL_WINDOW_SIZE, DEFAULT_WINDOW as u32)]);
        let deadline = Instant::now() + self.target.timeout;
        let (mut local, mut remote) = (false, false);
        while !(local && remote) {
            match self.read_frame(deadline) {
                Event::Frame(f) if f.kind == kind::SETTINGS => {
                    if f.is_ack() {
                        local = true;
                    } else {
                        remote = true;
                        self.settings.extend(f.settings());
                        self.write_settings_ack();
                    }
                }
                Event::Frame(_) => {}
                other => return Err(Failure::Broken(format!("handshake: {other}"))),
            }
        }
        Ok(())
    }

    /// The server's SETTINGS_MAX_FRAME_SIZE.
    pub fn max_frame_size(&self) -> usize {
        self.settings
            .get(&setting::MAX_FRAME_SIZE)
            .map_or(DEFAULT_FRAME_SIZE, |&v| v as usize)
    }

    /// h2spec's `CommonHeaders`: a GET of the target path.
    pub fn common_headers(&self) -> Vec<Field> {
        vec![
            field(":method", "GET"),
            field(":scheme", "http"),
            field(":path", &self.target.path),
            field(":authority", &self.target.addr.to_string()),
        ]
    }

    /// Encodes `fields` with the connection's HPACK context.
    pub fn encode(&mut self, fields: &[Field]) -> Vec<u8> {
        self.encoder
            .encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    /// Shrinks the encoder's dynamic table; the caller signals it to the
    /// server with a dynamic table size update.
    pub fn set_max_dynamic_table_size(&mut self, size: usize) {
        self.encoder.set_max_table_size(size);
    }

    /// Sends raw bytes. Write errors are ignored as in h2spec: a server
    /// that closed is seen by the next wait.
    pub fn send(&mut self, bytes: &[u8]) {
        let _ = self.sock.write_all(bytes);
    }

    /// Sends a frame.
    pub fn write(&mut self, frame: Frame) {
        self.send(&frame.encode());
    }

    pub fn write_data(&mut self, stream: u32, end: bool, data: &[u8]) {
        let flags = if end { flag::END_STREAM } else { 0 };
        self.write(Frame::new(kind::DATA, flags, stream, data.to_vec()));
    }

    pub fn write_data_padded(&mut self, stream: u32, end: bool, data: &[u8], pad: &[u8]) {
        let flags = flag::PADDED | if end { flag::END_STREAM } else { 0 };
        let mut payload = vec![pad.len() as u8];
        payload.extend_from_slice(data);
        payload.extend_from_slice(pad);
        self.write(Frame::new(kind::DATA, flags, stream, payload));
    }

    pub fn write_headers(&mut self, h: Headers) {
        self.write(h.frame());
    }

    pub fn write_priority(&mut self, stream: u32, p: Priority) {
        self.write(Frame::new(kind::PRIORITY, 0, stream, p.encode().to_vec()));
    }

    pub fn write_rst_stream(&mut self, stream: u32, code: u32) {
        let payload = code.to_be_bytes().to_vec();
        self.write(Frame::new(kind::RST_STREAM, 0, stream, payload));
    }

    pub fn write_settings(&mut self, settings: &[(u16, u32)]) {
        let payload = settings
            .iter()
            .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
            .collect();
        self.write(Frame::new(kind::SETTINGS, 0, 0, payload));
    }

    pub fn write_settings_ack(&mut self) {
        self.write(Frame::new(kind::SETTINGS, flag::ACK, 0, Vec::new()));
    }

    pub fn write_push_promise(&mut self, stream: u32, promised: u32, block: &[u8]) {
        let mut payload = promised.to_be_bytes().to_vec();
        payload.extend_from_slice(block);
        self.write(Frame::new(
            kind::PUSH_PROMISE,
            flag::END_HEADERS,
            stream,
            payload,
        ));
    }

    pub fn write_ping(&mut self, ack: bool, data: [u8; 8]) {
        let flags = if ack { flag::ACK } else { 0 };
        self.write(Frame::new(kind::PING, flags, 0, data.to_vec()));
    }

    pub fn write_goaway(&mut self, last: u32, code: u32, debug: &[u8]) {
        let mut payload = last.to_be_bytes().to_vec();
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(debug);
        self.write(Frame::new(kind::GOAWAY, 0, 0, payload));
    }

    pub fn write_window_update(&mut self, stream: u32, increment: u32) {
        let payload = increment.to_be_bytes().to_vec();
        self.write(Frame::new(kind::WINDOW_UPDATE, 0, stream, payload));
    }

    pub fn write_continuation(&mut self, stream: u32, end_headers: bool, block: &[u8]) {
        let flags = if end_headers { flag::END_HEADERS } else { 0 };
        self.write(Frame::new(
            kind::CONTINUATION,
            flags,
            stream,
            block.to_vec(),
        ));
    }

    /// h2spec's `CommonHeaders` with `:method` POST.
    pub fn post_headers(&self) -> Vec<Field> {
        let mut fields = self.common_headers();
        fields[0].1 = "POST".into();
        fields
    }

    /// Encodes `fields` and sends them in one HEADERS frame on `stream`.
    pub fn headers(&mut self, stream: u32, fields: &[Field], end_stream: bool, end_headers: bool) {
        let block = self.encode(fields);
        self.write_headers(Headers {
            stream,
            block,
            end_stream,
            end_headers,
            ..Default::default()
        });
    }

    /// Sends, on `stream`, a request the target answers with DATA (see
    /// [`DataRequest`]).
    pub fn send_data_request(&mut self, stream: u32) {
        match self.target.data_request {
            DataRequest::Get => {
                let block = self.encode(&self.common_headers());
                self.write_headers(Headers {
                    stream,
                    block,
                    end_stream: true,
                    end_headers: true,
                    ..Default::default()
                });
            }
            DataRequest::Grpc(path) => {
                let mut fields = self.common_headers();
                fields[0].1 = "POST".into();
                fields[2].1 = path.into();
                fields.push(field("content-type", "application/grpc"));
                fields.push(field("te", "trailers"));
                let block = self.encode(&fields);
                self.write_headers(Headers {
                    stream,
                    block,
                    end_stream: false,
                    end_headers: true,
                    ..Default::default()
                });
                // One uncompressed, empty message.
                self.write_data(stream, true, &[0, 0, 0, 0, 0]);
            }
        }
    }

    /// Waits for the next event (h2spec's `WaitEvent`): anything but a frame
    /// ends the connection for the case; DATA is acknowledged with
    /// WINDOW_UPDATEs as h2spec does.
    pub fn wait_event(&mut self) -> Event {
        let ev = self.read_frame(Instant::now() + self.target.timeout);
        match &ev {
            Event::Frame(f) if f.kind == kind::DATA => {
                let (stream, len) = (f.stream, f.payload.len() as i64);
                self.consume_window(stream, len);
            }
            Event::Frame(_) => {}
            _ => self.closed = true,
        }
        ev
    }

    /// Waits for a frame of `kind` (h2spec's `WaitEventByType`): gives up at
    /// the end of the connection or at a timeout after other events, and
    /// returns what it saw last.
    pub fn wait_event_by_type(&mut self, k: u8) -> (Option<Event>, bool) {
        let mut last = None;
        while !self.closed {
            let ev = self.wait_event();
            if ev.frame_of(k).is_some() {
                return (Some(ev), true);
            }
            if matches!(ev, Event::Timeout) && last.is_some() {
                break;
            }
            last = Some(ev);
        }
        (last, false)
    }

    fn consume_window(&mut self, stream: u32, len: i64) {
        for id in [stream, 0] {
            let w = self.windows.entry(id).or_insert(DEFAULT_WINDOW);
            *w -= len;
            if *w <= 0 {
                let increment = DEFAULT_WINDOW - *w;
                *w += increment;
                self.write_window_update(id, increment as u32);
            }
        }
    }

    fn read_frame(&mut self, deadline: Instant) -> Event {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(frame) = Frame::parse(&mut self.buf) {
                return Event::Frame(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Event::Timeout;
            }
            if let Err(e) = self.sock.set_read_timeout(Some(left)) {
                return Event::Error(e.to_string());
            }
            match self.sock.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Event::Closed,
                Ok(0) => return Event::Error("unexpected EOF inside a frame".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Event::Timeout;
                }
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Event::Closed,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Event::Error(e.to_string()),
            }
        }
    }
}

/// h2spec's `DummyString`: `len` times "x".
pub fn dummy(len: usize) -> String {
    "x".repeat(len)
}

/// h2spec's `DummyHeaders`: `n` fields `x-dummyI` of [`MAX_HEADER_LEN`] octets.
pub fn dummy_headers(n: usize) -> Vec<Field> {
    (0..n)
        .map(|i| (format!("x-dummy{i}"), dummy(MAX_HEADER_LEN)))
        .collect()
}

/// h2spec's `ServerDataLength`: on a connection of its own, the DATA
/// octets of the response to [`Conn::send_data_request`].
pub fn server_data_length(target: &Arc<Target>) -> Result<usize, Failure> {
    let mut conn = Conn::dial(target.clone()).map_err(|e| Failure::Broken(e.to_string()))?;
    conn.handshake()?;
    conn.send_data_request(1);
    let mut len = 0;
    while !conn.closed {
        if let Event::Frame(f) = conn.wait_event() {
            if f.kind == kind::DATA {
                len += f.payload.len();
            }
            if f.ends_stream() {
                return Ok(len);
            }
        }
    }
    Err(Failure::Broken(
        "unable to get the server's data length".into(),
    ))
}
