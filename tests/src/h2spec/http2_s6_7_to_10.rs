//! h2spec `http2/` sections 6.7 to 6.10: PING, GOAWAY, WINDOW_UPDATE and
//! flow control, CONTINUATION.

use super::conn::{Conn, dummy_headers};
use super::frame::{code, kind, setting};
use super::http2_s6_1_to_5::{need_data, one_octet_of_data};
use super::{Case, group, verify};

/// The opaque data h2spec's PINGs carry.
pub(crate) const H2SPEC: [u8; 8] = *b"h2spec\0\0";

const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Sends a GET (or POST) HEADERS frame on stream 1 without END_HEADERS.
fn open_unfinished(c: &mut Conn, post: bool, end_stream: bool) {
    let fields = if post {
        c.post_headers()
    } else {
        c.common_headers()
    };
    c.headers(1, &fields, end_stream, false);
}

fn dummy_block(c: &mut Conn) -> Vec<u8> {
    c.encode(&dummy_headers(1))
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "http2/6.7")
        .case("Sends a PING frame", |c| {
            c.handshake()?;
            c.write_ping(false, H2SPEC);
            verify::ping_ack(c, H2SPEC)
        })
        .case("Sends a PING frame with ACK", |c| {
            c.handshake()?;
            c.write_ping(true, *b"invalid\0");
            c.write_ping(false, H2SPEC);
            verify::ping_ack(c, H2SPEC)
        })
        .case(
            "Sends a PING frame with a stream identifier field value other than 0x0",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x01\0\0\0\0\0\0\0\0");
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a PING frame with a length field value other than 8",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x06\x06\x00\x00\x00\x00\x00\0\0\0\0\0\0");
                verify::connection_error(c, &[code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/6.8").case(
        "Sends a GOAWAY frame with a stream identifier other than 0x0",
        |c| {
            c.handshake()?;
            c.send(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01\0\0\0\0\0\0\0\0");
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        },
    );

    group(all, "http2/6.9")
        .case(
            "Sends a WINDOW_UPDATE frame with a flow control window increment of 0",
            |c| {
                c.handshake()?;
                c.write_window_update(0, 0);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, true);
                c.write_window_update(1, 0);
                verify::stream_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a WINDOW_UPDATE frame with a length other than 4 octets",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x03\x08\x00\x00\x00\x00\x00\x00\x00\x01");
                verify::connection_error(c, &[code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/6.9.1")
        .case(
            "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame",
            |c| {
                need_data(c, 1)?;
                c.handshake()?;
                c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 1)]);
                verify::settings_ack(c)?;
                c.send_data_request(1);
                one_octet_of_data(c)
            },
        )
        .case(
            "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1",
            |c| {
                c.handshake()?;
                c.write_window_update(0, MAX_WINDOW);
                c.write_window_update(0, MAX_WINDOW);
                verify::frame_where(
                    c,
                    kind::GOAWAY,
                    |f| f.error_code() == Some(code::FLOW_CONTROL_ERROR),
                    "GOAWAY frame (error code: FLOW_CONTROL_ERROR)",
                )
            },
        )
        .case(
            "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, true);
                c.write_window_update(1, MAX_WINDOW);
                c.write_window_update(1, MAX_WINDOW);
                verify::frame_where(
                    c,
                    kind::RST_STREAM,
                    |f| f.stream == 1 && f.error_code() == Some(code::FLOW_CONTROL_ERROR),
                    "RST_STREAM frame (stream_id:1, error code: FLOW_CONTROL_ERROR)",
                )
            },
        );

    group(all, "http2/6.9.2")
        .case(
            "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame",
            |c| {
                need_data(c, 1)?;
                c.handshake()?;
                c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 0)]);
                verify::settings_ack(c)?;
                c.send_data_request(1);
                c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 1)]);
                one_octet_of_data(c)
            },
        )
        .case("Sends a SETTINGS frame for window size to be negative", |c| {
            need_data(c, 5)?;
            c.handshake()?;
            c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 3)]);
            verify::settings_ack(c)?;
            c.send_data_request(1);
            verify::event_type(c, kind::DATA)?;
            c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 2)]);
            verify::settings_ack(c)?;
            c.write_window_update(1, 2);
            one_octet_of_data(c)
        })
        .case(
            "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size value",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x80\x00\x00\x00");
                verify::connection_error(c, &[code::FLOW_CONTROL_ERROR])
            },
        );

    group(all, "http2/6.10")
        .case(
            "Sends multiple CONTINUATION frames preceded by a HEADERS frame",
            |c| {
                c.handshake()?;
                open_unfinished(c, false, true);
                let block = dummy_block(c);
                c.write_continuation(1, false, &block);
                let block = dummy_block(c);
                c.write_continuation(1, true, &block);
                verify::headers_frame(c, 1)
            },
        )
        .case(
            "Sends a CONTINUATION frame followed by any frame other than CONTINUATION",
            |c| {
                c.handshake()?;
                open_unfinished(c, true, false);
                let block = dummy_block(c);
                c.write_continuation(1, false, &block);
                c.write_data(1, true, b"test");
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a CONTINUATION frame with 0x0 stream identifier",
            |c| {
                c.handshake()?;
                open_unfinished(c, false, true);
                let block = dummy_block(c);
                c.write_continuation(0, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, true, true);
                let block = dummy_block(c);
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag",
            |c| {
                c.handshake()?;
                open_unfinished(c, false, true);
                let block = dummy_block(c);
                c.write_continuation(1, true, &block);
                let block = dummy_block(c);
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case("Sends a CONTINUATION frame preceded by a DATA frame", |c| {
            c.handshake()?;
            open_unfinished(c, true, false);
            c.write_data(1, true, b"test");
            let block = dummy_block(c);
            c.write_continuation(1, false, &block);
            let block = dummy_block(c);
            c.write_continuation(0, true, &block);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        });
}
