//! The server connection fed frames as a client would send them, its
//! output read back as frames (header blocks decoded by loona-hpack, a
//! decoder the project did not write), with time given explicitly.

mod limits;
mod streams;

use super::*;
use std::io::IoSlice;
use std::sync::OnceLock;
use std::time::Duration;

use http::Method;

const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

/// Settings with a small stream limit and windows; every other limit
/// its default.
fn settings() -> Settings {
    Settings {
        response_names: &["content-type", "grpc-status", "infermesh-busy"],
        known_paths: &[MODEL_INFER_PATH],
        limits: Limits {
            max_concurrent_streams: 4,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            ..Limits::default()
        },
    }
}

/// [`settings`] with other limits.
fn with(f: impl FnOnce(&mut Limits)) -> Settings {
    let mut s = settings();
    f(&mut s.limits);
    s
}

/// The time every test starts at.
fn t0() -> Instant {
    static T0: OnceLock<Instant> = OnceLock::new();
    *T0.get_or_init(Instant::now)
}

/// A frame as the server wrote it.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    /// The error code of an RST_STREAM or GOAWAY.
    fn error(&self) -> u32 {
        let at = if self.kind == kind::GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }
}

/// Takes everything the connection has queued, as frames.
fn written(conn: &mut Conn) -> Vec<Frame> {
    let mut bytes = Vec::new();
    loop {
        let mut slices = [IoSlice::new(&[]); 8];
        let out = conn.out();
        let n = out.slices(&mut slices);
        if n == 0 {
            break;
        }
        let len: usize = slices[..n].iter().map(|s| s.len()).sum();
        for s in &slices[..n] {
            bytes.extend_from_slice(s);
        }
        out.advance(len);
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

/// The RST_STREAM frames written, as (stream, code).
fn resets(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames
        .iter()
        .filter(|f| f.kind == kind::RST_STREAM)
        .map(|f| (f.stream, f.error()))
        .collect()
}

/// The GOAWAY frames written, as (last stream, code).
fn goaways(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames
        .iter()
        .filter(|f| f.kind == kind::GOAWAY)
        .map(|f| {
            let last = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
            (last, f.error())
        })
        .collect()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> BytesMut {
    let mut f = BytesMut::new();
    frame::put_head(&mut f, payload.len(), kind, flags, stream);
    f.extend_from_slice(payload);
    f
}

fn feed(conn: &mut Conn, bytes: &[u8]) -> Vec<Waker> {
    feed_at(conn, bytes, t0())
}

fn feed_at(conn: &mut Conn, bytes: &[u8], now: Instant) -> Vec<Waker> {
    let mut buf = BytesMut::from(bytes);
    let mut wake = Vec::new();
    conn.on_read(&mut buf, now, &mut wake);
    wake
}

/// A connection past the handshake, with the client's `settings`.
fn settled(settings: Settings, client: &[(u16, u32)]) -> Conn {
    let mut conn = Conn::new(settings, t0());
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

/// HEADERS opening stream `id` (END_STREAM when `end`).
fn headers(id: u32, end: bool) -> BytesMut {
    let flags = flag::END_HEADERS | if end { flag::END_STREAM } else { 0 };
    frame(kind::HEADERS, flags, id, &request_block())
}

/// A whole request with `body` on stream `id`.
fn open(conn: &mut Conn, id: u32, body: &[u8]) {
    let mut bytes = headers(id, false);
    bytes.extend_from_slice(&frame(kind::DATA, flag::END_STREAM, id, body));
    feed(conn, &bytes);
}

/// Answers stream `id` whole (trailers-only) and ends its handler.
fn answer(conn: &mut Conn, id: u32) {
    let mut wake = Vec::new();
    conn.send_head(id, 200, &HeaderMap::new(), true);
    conn.finish(id, &mut wake);
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
