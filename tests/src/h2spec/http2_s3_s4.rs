//! h2spec `http2/` sections 3 and 4: the connection preface, frame format
//! and size, and header block framing.

use super::conn::{Conn, Event, PREFACE, dummy, dummy_headers};
use super::frame::{Priority, code, kind, setting};
use super::{Case, Failure, Verdict, group, verify};

/// An unknown frame (type 0x16, 8 octets) on stream 0.
pub(crate) const UNKNOWN_FRAME: &[u8] = b"\x00\x00\x08\x16\x00\x00\x00\x00\x00\0\0\0\0\0\0\0\0";

/// h2spec's preface case (also `generic/1/1`): the first frame the server
/// sends is a SETTINGS frame without ACK.
pub(crate) fn server_preface(c: &mut Conn) -> Verdict {
    c.send(PREFACE);
    c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 65_535)]);
    match c.wait_event() {
        Event::Frame(f) if f.kind == kind::SETTINGS && !f.is_ack() => Ok(()),
        other => Err(Failure::Mismatch {
            expected: vec!["SETTINGS frame (flags:0x00)".into()],
            actual: other.to_string(),
        }),
    }
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "http2/3.5")
        .case("Sends client connection preface", server_preface)
        .case("Sends invalid connection preface", |c| {
            c.send(b"INVALID CONNECTION PREFACE\r\n\r\n");
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        });

    group(all, "http2/4.1")
        .case("Sends a frame with unknown type", |c| {
            c.handshake()?;
            c.send(UNKNOWN_FRAME);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        })
        .case("Sends a frame with undefined flag", |c| {
            c.handshake()?;
            c.send(b"\x00\x00\x08\x06\x16\x00\x00\x00\x00\0\0\0\0\0\0\0\0");
            verify::event_type(c, kind::PING)
        })
        .case("Sends a frame with reserved field bit", |c| {
            c.handshake()?;
            c.send(b"\x00\x00\x08\x06\x16\x80\x00\x00\x00\0\0\0\0\0\0\0\0");
            verify::event_type(c, kind::PING)
        });

    group(all, "http2/4.2")
        .case("Sends a DATA frame with 2^14 octets in length", |c| {
            c.handshake()?;
            let fields = c.post_headers();
            c.headers(1, &fields, false, true);
            let data = dummy(c.max_frame_size());
            c.write_data(1, true, data.as_bytes());
            verify::headers_frame(c, 1)
        })
        .case(
            "Sends a large size DATA frame that exceeds the SETTINGS_MAX_FRAME_SIZE",
            |c| {
                c.handshake()?;
                let fields = c.post_headers();
                c.headers(1, &fields, false, true);
                let data = dummy(c.max_frame_size() + 1);
                c.write_data(1, true, data.as_bytes());
                verify::stream_error(c, &[code::FRAME_SIZE_ERROR])
            },
        )
        .case(
            "Sends a large size HEADERS frame that exceeds the SETTINGS_MAX_FRAME_SIZE",
            |c| {
                c.handshake()?;
                let mut fields = c.common_headers();
                fields.extend(dummy_headers(5));
                c.headers(1, &fields, true, true);
                verify::connection_error(c, &[code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/4.3")
        .case("Sends invalid header block fragment", |c| {
            c.handshake()?;
            // Literal with incremental indexing, without length and string.
            c.send(b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x40");
            verify::connection_error(c, &[code::COMPRESSION_ERROR])
        })
        .case(
            "Sends a PRIORITY frame while sending the header blocks",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, false);
                c.write_priority(
                    1,
                    Priority {
                        depends_on: 0,
                        exclusive: false,
                        weight: 255,
                    },
                );
                let block = c.encode(&dummy_headers(1));
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a HEADERS frame to another stream while sending the header blocks",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, false);
                c.headers(3, &fields, true, true);
                let block = c.encode(&dummy_headers(1));
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        );
}
