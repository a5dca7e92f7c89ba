//! The cases the frame-sequence fuzzing (`server_frames`, `client_frames`)
//! found, each reduced to the frames that show it; every one failed before
//! its fix. Frames are written and read back with the harness's own
//! parser (`harness::wire`).

mod harness;

use std::io::IoSlice;
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use harness::wire::{self, Frame};
use http::HeaderMap;
use infermesh_http2::server::{Conn, Settings};
use infermesh_http2::{Limits, client};

const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

fn settings(limits: Limits) -> Settings {
    Settings {
        response_names: &[],
        known_paths: &[PATH],
        limits,
    }
}

fn request_block() -> Vec<u8> {
    loona_hpack::Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", PATH.as_bytes()),
    ])
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    wire::put(&mut out, kind, flags, stream, payload);
    out
}

/// Everything queued in `out`, taken, as frames (after a client's
/// preface when `preface`).
fn take(out: &mut infermesh_http2::Out, preface: bool) -> Vec<Frame> {
    let mut bytes = Vec::new();
    loop {
        let mut slices = [IoSlice::new(&[]); 16];
        let n = out.slices(&mut slices);
        if n == 0 {
            break;
        }
        let len: usize = slices[..n].iter().map(|s| s.len()).sum();
        slices[..n].iter().for_each(|s| bytes.extend_from_slice(s));
        out.advance(len);
    }
    let mut at = if preface { wire::PREFACE.len() } else { 0 };
    let mut frames = Vec::new();
    while at < bytes.len() {
        let len = (usize::from(bytes[at]) << 16)
            | (usize::from(bytes[at + 1]) << 8)
            | usize::from(bytes[at + 2]);
        frames.push(Frame {
            kind: bytes[at + 3],
            flags: bytes[at + 4],
            stream: u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()),
            payload: bytes[at + 9..at + 9 + len].to_vec(),
        });
        at += 9 + len;
    }
    frames
}

fn word(f: &Frame, at: usize) -> u32 {
    u32::from_be_bytes(f.payload[at..at + 4].try_into().unwrap())
}

/// A server connection past the client's preface and SETTINGS.
fn server(limits: Limits, now: Instant) -> Conn {
    let mut conn = Conn::new(settings(limits), now);
    let mut hello = wire::PREFACE.to_vec();
    hello.extend(frame(wire::SETTINGS, 0, 0, &[]));
    feed(&mut conn, &hello, now);
    take(conn.out(), false);
    conn
}

fn feed(conn: &mut Conn, bytes: &[u8], now: Instant) {
    conn.on_read(&mut BytesMut::from(bytes), now, &mut Vec::new());
}

/// After `go_away()`, a connection error, then the drain timeout: the
/// final GOAWAY (NO_ERROR) was written after the GOAWAY with the error.
#[test]
fn nothing_follows_the_goaway_of_a_failed_connection() {
    let t0 = Instant::now();
    let mut conn = server(Limits::default(), t0);
    conn.go_away();
    // PING on a stream: a connection error.
    feed(&mut conn, &frame(wire::PING, 0, 1, &[0; 8]), t0);
    assert!(conn.failed().is_some());
    let mut wake = Vec::new();
    let later = t0 + Duration::from_secs(5);
    conn.on_timeout(later, &mut wake);
    let frames = take(conn.out(), false);
    let last = frames.last().unwrap();
    assert_eq!(last.kind, wire::GOAWAY);
    assert_eq!(word(last, 4), wire::PROTOCOL_ERROR, "{frames:?}");
    // And nothing is due again at once (no busy timer).
    assert!(conn.next_timeout().is_none_or(|t| t > later));
}
/// Requests read in the same bytes as a connection error were handed to
/// handlers by `accept()` after the connection had failed.
#[test]
fn a_failed_connection_hands_out_no_request() {
    let t0 = Instant::now();
    let mut conn = server(Limits::default(), t0);
    let block = request_block();
    let mut bytes = frame(
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &block,
    );
    bytes.extend(frame(wire::PING, 0, 1, &[0; 8]));
    feed(&mut conn, &bytes, t0);
    assert!(conn.failed().is_some());
    assert!(conn.accept().is_none());
    assert_eq!(conn.open_streams(), 0);
}
/// A PRIORITY frame of the wrong size on an idle stream was answered with
/// RST_STREAM on that idle stream, which RFC 9113 6.4 forbids (and a
/// client must treat as a connection error): it is the connection's error.
#[test]
fn a_bad_priority_on_an_idle_stream_is_a_connection_error() {
    let t0 = Instant::now();
    let mut conn = server(Limits::default(), t0);
    feed(&mut conn, &frame(wire::PRIORITY, 0, 5, &[0, 0, 0, 1]), t0);
    let frames = take(conn.out(), false);
    assert!(
        frames.iter().all(|f| f.kind != wire::RST_STREAM),
        "{frames:?}"
    );
    assert!(conn.failed().is_some());

    // The agent's client, fed a worker's PRIORITY that makes an idle
    // stream depend on itself.
    let mut c = client::Conn::new("worker:1", PATH);
    let mut bytes = BytesMut::from(&frame(wire::SETTINGS, 0, 0, &[])[..]);
    bytes.extend_from_slice(&frame(wire::PRIORITY, 0, 9, &[0, 0, 0, 9, 0]));
    c.on_read(&mut bytes, t0, &mut Vec::new());
    let frames = take(c.out(), true);
    assert!(
        frames.iter().all(|f| f.kind != wire::RST_STREAM),
        "{frames:?}"
    );
    assert!(c.is_failed());
}
/// With a connection window of 1 byte, every empty DATA frame made the
/// server give back "0 bytes": a WINDOW_UPDATE with a zero increment,
/// which its client must treat as a connection error.
#[test]
fn no_window_update_of_zero_however_small_the_window() {
    let t0 = Instant::now();
    let limits = Limits {
        connection_window: 1,
        ..Limits::default()
    };
    let mut conn = server(limits, t0);
    let mut bytes = frame(wire::HEADERS, wire::END_HEADERS, 1, &request_block());
    bytes.extend(frame(wire::DATA, 0, 1, &[]));
    bytes.extend(frame(wire::DATA, wire::END_STREAM, 1, &[]));
    feed(&mut conn, &bytes, t0);
    let frames = take(conn.out(), false);
    for f in frames.iter().filter(|f| f.kind == wire::WINDOW_UPDATE) {
        assert_ne!(word(f, 0), 0, "{frames:?}");
    }
    assert!(conn.failed().is_none());
}
/// After the final GOAWAY named stream 1, a HEADERS on stream 3 (ignored)
/// still raised the last stream id, and a later connection error's GOAWAY
/// named 3: a GOAWAY may not raise the last stream (RFC 9113 6.8).
#[test]
fn a_goaway_never_raises_the_last_stream() {
    let t0 = Instant::now();
    let mut conn = server(Limits::default(), t0);
    feed(
        &mut conn,
        &frame(
            wire::HEADERS,
            wire::END_HEADERS | wire::END_STREAM,
            1,
            &request_block(),
        ),
        t0,
    );
    conn.go_away();
    // The drain timeout passes: the final GOAWAY names stream 1.
    let later = t0 + Duration::from_secs(5);
    conn.on_timeout(later, &mut Vec::new());
    // A request on stream 3 (ignored), then an error.
    let mut bytes = frame(
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        3,
        &request_block(),
    );
    bytes.extend(frame(wire::PING, 0, 1, &[0; 8]));
    feed(&mut conn, &bytes, later);
    let lasts: Vec<u32> = take(conn.out(), false)
        .iter()
        .filter(|f| f.kind == wire::GOAWAY)
        .map(|f| word(f, 0))
        .collect();
    assert_eq!(lasts, [(1 << 31) - 1, 1, 1]);
}
/// A worker that lowers SETTINGS_HEADER_TABLE_SIZE must see the size
/// update at the start of the next request head (RFC 7541 4.2); nghttp2
/// refuses a block without it (COMPRESSION_ERROR).
#[test]
fn the_client_signals_a_smaller_header_table() {
    let t0 = Instant::now();
    let mut c = client::Conn::new("worker:1", PATH);
    let settings = wire::settings_payload(&[(wire::HEADER_TABLE_SIZE, 100)]);
    c.on_read(
        &mut BytesMut::from(&frame(wire::SETTINGS, 0, 0, &settings)[..]),
        t0,
        &mut Vec::new(),
    );
    let meta = HeaderMap::new();
    c.open(&meta, Bytes::new()).unwrap();
    c.open(&meta, Bytes::new()).unwrap();
    let heads: Vec<Frame> = take(c.out(), true)
        .into_iter()
        .filter(|f| f.kind == wire::HEADERS)
        .collect();
    // 0x3f 0x45: a size update to 100; only in the first block after.
    assert_eq!(&heads[0].payload[..2], &[0x3f, 0x45]);
    assert_ne!(heads[1].payload[0] & 0xe0, 0x20);
    let _ = Waker::noop();
}
