//! h2spec's verifiers (`spec/verifier.go`), with its semantics: a
//! connection error passes on a GOAWAY with an expected code *or* on the
//! connection closing; a stream error also on a RST_STREAM with an expected
//! code; other frames are skipped while waiting, and a timeout fails.

use super::conn::{Conn, Event};
use super::frame::{Frame, code_name, kind};
use super::{Failure, Verdict};

fn mismatch(expected: Vec<String>, actual: Option<&Event>) -> Failure {
    Failure::Mismatch {
        expected,
        actual: actual.map_or_else(|| "nothing".to_string(), Event::to_string),
    }
}

/// Waits until some event passes `pass`; fails with what was seen first
/// (a timeout only if nothing else came) once the connection ends.
fn wait_until(
    conn: &mut Conn,
    mut pass: impl FnMut(&Event) -> bool,
    expected: impl FnOnce() -> Vec<String>,
) -> Verdict {
    let mut actual: Option<Event> = None;
    while !conn.closed {
        let ev = conn.wait_event();
        if pass(&ev) {
            return Ok(());
        }
        if !matches!(ev, Event::Timeout) || actual.is_none() {
            actual = Some(ev);
        }
    }
    Err(mismatch(expected(), actual.as_ref()))
}

fn goaway(code: u32) -> String {
    format!("GOAWAY frame (error code: {})", code_name(code))
}

fn rst_stream(code: u32) -> String {
    format!("RST_STREAM frame (error code: {})", code_name(code))
}

/// The connection is closed.
pub fn connection_close(conn: &mut Conn) -> Verdict {
    wait_until(
        conn,
        |ev| matches!(ev, Event::Closed),
        || vec!["connection closed".into()],
    )
}

/// A connection error: GOAWAY with one of `codes`, or the connection closed.
pub fn connection_error(conn: &mut Conn, codes: &[u32]) -> Verdict {
    wait_until(
        conn,
        |ev| match ev {
            Event::Closed => true,
            Event::Frame(f) if f.kind == kind::GOAWAY => {
                f.error_code().is_some_and(|c| codes.contains(&c))
            }
            _ => false,
        },
        || {
            let mut e: Vec<String> = codes.iter().map(|&c| goaway(c)).collect();
            e.push("connection closed".into());
            e
        },
    )
}

/// A stream error: RST_STREAM or GOAWAY with one of `codes`, or the
/// connection closed.
pub fn stream_error(conn: &mut Conn, codes: &[u32]) -> Verdict {
    wait_until(
        conn,
        |ev| match ev {
            Event::Closed => true,
            Event::Frame(f) if matches!(f.kind, kind::GOAWAY | kind::RST_STREAM) => {
                f.error_code().is_some_and(|c| codes.contains(&c))
            }
            _ => false,
        },
        || {
            let mut e = Vec::new();
            for &c in codes {
                e.push(goaway(c));
                e.push(rst_stream(c));
            }
            e.push("connection closed".into());
            e
        },
    )
}

/// The stream ends: DATA or HEADERS with END_STREAM, or RST_STREAM NO_ERROR.
pub fn stream_close(conn: &mut Conn) -> Verdict {
    wait_until(
        conn,
        |ev| match ev {
            Event::Frame(f) if f.kind == kind::RST_STREAM => f.error_code() == Some(0),
            Event::Frame(f) => f.ends_stream(),
            _ => false,
        },
        || vec!["stream closed".into()],
    )
}

/// Waits for a frame of `k` and checks it with `check` (h2spec's cases that
/// call `WaitEventByType` and then look at the frame).
pub fn frame_where(
    conn: &mut Conn,
    k: u8,
    check: impl FnOnce(&Frame) -> bool,
    expected: &str,
) -> Verdict {
    let (actual, found) = conn.wait_event_by_type(k);
    let passed = found && matches!(&actual, Some(Event::Frame(f)) if check(f));
    if passed {
        Ok(())
    } else {
        Err(mismatch(vec![expected.to_string()], actual.as_ref()))
    }
}

/// A HEADERS frame on `stream`.
pub fn headers_frame(conn: &mut Conn, stream: u32) -> Verdict {
    frame_where(
        conn,
        kind::HEADERS,
        |f| f.stream == stream,
        &format!("HEADERS frame (stream_id:{stream})"),
    )
}

/// A SETTINGS frame with ACK.
pub fn settings_ack(conn: &mut Conn) -> Verdict {
    frame_where(
        conn,
        kind::SETTINGS,
        Frame::is_ack,
        "SETTINGS frame (length:0, flags:0x01, stream_id:0)",
    )
}

/// A PING ACK echoing `data`.
pub fn ping_ack(conn: &mut Conn, data: [u8; 8]) -> Verdict {
    frame_where(
        conn,
        kind::PING,
        |f| f.is_ack() && f.payload == data,
        &format!("PING frame (flags:0x01, opaque_data:{data:?})"),
    )
}

/// A PING ACK echoing `data`, or the connection closed.
pub fn ping_ack_or_connection_close(conn: &mut Conn, data: [u8; 8]) -> Verdict {
    wait_until(
        conn,
        |ev| match ev {
            Event::Closed => true,
            Event::Frame(f) if f.kind == kind::PING => f.is_ack() && f.payload == data,
            _ => false,
        },
        || {
            vec![
                "connection closed".into(),
                format!("PING frame (flags:0x01, opaque_data:{data:?})"),
            ]
        },
    )
}

/// Any frame of kind `k`.
pub fn event_type(conn: &mut Conn, k: u8) -> Verdict {
    frame_where(conn, k, |_| true, &format!("frame of type {k}"))
}
