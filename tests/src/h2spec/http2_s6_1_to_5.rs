//! h2spec `http2/` sections 6.1 to 6.5: DATA, HEADERS, PRIORITY,
//! RST_STREAM and SETTINGS frames.

use super::conn::{Conn, dummy_headers, field, server_data_length};
use super::frame::{Priority, code, kind, setting};
use super::{Case, Failure, Verdict, group, verify};

/// The flow-control cases' check: the response's first DATA frame on
/// stream 1 carries exactly one octet.
pub(crate) fn one_octet_of_data(c: &mut Conn) -> Verdict {
    verify::frame_where(
        c,
        kind::DATA,
        |f| f.payload.len() == 1,
        "DATA frame (length:1, flags:0x00, stream_id:1)",
    )
}

/// Skips a case whose response must carry at least `min` DATA octets.
pub(crate) fn need_data(c: &Conn, min: usize) -> Verdict {
    let len = server_data_length(&c.target)?;
    if len < min {
        return Err(Failure::Skipped(format!(
            "the response has {len} octets of DATA, the case needs {min}"
        )));
    }
    Ok(())
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "http2/6.1")
        .case("Sends a DATA frame with 0x0 stream identifier", |c| {
            c.handshake()?;
            c.write_data(0, true, b"test");
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case(
            "Sends a DATA frame on the stream that is not in \"open\" or \"half-closed (local)\" state",
            |c| {
                c.handshake()?;
                let fields = c.post_headers();
                c.headers(1, &fields, true, true);
                c.write_data(1, true, b"test");
                verify::stream_error(c, &[code::STREAM_CLOSED])
            },
        )
        .case("Sends a DATA frame with invalid pad length", |c| {
            c.handshake()?;
            let mut fields = c.post_headers();
            fields.push(field("content-length", "4"));
            c.headers(1, &fields, false, true);
            // Padded, END_STREAM; pad length 6 in a 5-octet payload.
            c.send(b"\x00\x00\x05\x00\x09\x00\x00\x00\x01\x06Test");
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        });

    group(all, "http2/6.2")
        .case(
            "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, false);
                let p = Priority {
                    depends_on: 0,
                    exclusive: false,
                    weight: 255,
                };
                c.write_priority(1, p);
                let block = c.encode(&dummy_headers(1));
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a HEADERS frame to another stream while sending a HEADERS frame",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, false, false);
                c.headers(3, &fields, true, true);
                let block = c.encode(&dummy_headers(1));
                c.write_continuation(1, true, &block);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case("Sends a HEADERS frame with 0x0 stream identifier", |c| {
            c.handshake()?;
            let fields = c.common_headers();
            c.headers(0, &fields, true, true);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("Sends a HEADERS frame with invalid pad length", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            // PADDED, END_HEADERS, END_STREAM; the pad length exceeds the
            // payload.
            let mut frame = b"\x00\x00\x00\x01\x0d\x00\x00\x00\x01".to_vec();
            frame[2] = (block.len() + 1) as u8;
            frame.push((block.len() + 2) as u8);
            frame.extend_from_slice(&block);
            c.send(&frame);
            verify::stream_error(c, &[code::PROTOCOL_ERROR])
        });

    group(all, "http2/6.3")
        .case("Sends a PRIORITY frame with 0x0 stream identifier", |c| {
            c.handshake()?;
            let p = Priority {
                depends_on: 0,
                exclusive: false,
                weight: 255,
            };
            c.write_priority(0, p);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case(
            "Sends a PRIORITY frame with a length other than 5 octets",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, true, true);
                c.send(b"\x00\x00\x04\x02\x00\x00\x00\x00\x01\x80\x00\x00\x01");
                verify::stream_error(c, &[code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/6.4")
        .case("Sends a RST_STREAM frame with 0x0 stream identifier", |c| {
            c.handshake()?;
            c.write_rst_stream(0, code::CANCEL);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("Sends a RST_STREAM frame on a idle stream", |c| {
            c.handshake()?;
            c.write_rst_stream(1, code::CANCEL);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case(
            "Sends a RST_STREAM frame with a length other than 4 octets",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, true, true);
                c.send(b"\x00\x00\x03\x03\x00\x00\x00\x00\x01\x00\x00\x00");
                verify::stream_error(c, &[code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/6.5")
        .case("Sends a SETTINGS frame with ACK flag and payload", |c| {
            c.handshake()?;
            c.send(b"\x00\x00\x01\x04\x01\x00\x00\x00\x00\x00");
            verify::connection_error(c, &[code::FRAME_SIZE_ERROR])
        })
        .case(
            "Sends a SETTINGS frame with a stream identifier other than 0x0",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x01\x00\x03\x00\x00\x00\x64");
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "Sends a SETTINGS frame with a length other than a multiple of 6 octets",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x03\x04\x00\x00\x00\x00\x00\x00\x03\x00");
                verify::stream_error(c, &[code::PROTOCOL_ERROR, code::FRAME_SIZE_ERROR])
            },
        );

    group(all, "http2/6.5.2")
        .case(
            "SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1",
            |c| {
                c.handshake()?;
                c.write_settings(&[(setting::ENABLE_PUSH, 2)]);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow control window size",
            |c| {
                c.handshake()?;
                c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 1 << 31)]);
                verify::connection_error(c, &[code::FLOW_CONTROL_ERROR])
            },
        )
        .case(
            "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value",
            |c| {
                c.handshake()?;
                c.write_settings(&[(setting::MAX_FRAME_SIZE, 16_383)]);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case(
            "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size",
            |c| {
                c.handshake()?;
                c.write_settings(&[(setting::MAX_FRAME_SIZE, 1 << 24)]);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        )
        .case("Sends a SETTINGS frame with unknown identifier", |c| {
            c.handshake()?;
            c.write_settings(&[(0xff, 1)]);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        });

    group(all, "http2/6.5.3")
        .case(
            "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE",
            |c| {
                need_data(c, 1)?;
                c.handshake()?;
                c.write_settings(&[
                    (setting::INITIAL_WINDOW_SIZE, 100),
                    (setting::INITIAL_WINDOW_SIZE, 1),
                ]);
                verify::settings_ack(c)?;
                c.send_data_request(1);
                one_octet_of_data(c)
            },
        )
        .case("Sends a SETTINGS frame without ACK flag", |c| {
            c.handshake()?;
            c.write_settings(&[(setting::ENABLE_PUSH, 0)]);
            verify::settings_ack(c)
        });
}
