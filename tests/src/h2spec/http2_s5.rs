//! h2spec `http2/` section 5: stream states, identifiers and concurrency,
//! stream dependencies, connection error handling, extensions.

use super::conn::Conn;
use super::frame::{Headers, Priority, code, kind, setting};
use super::http2_s3_s4::UNKNOWN_FRAME;
use super::{Case, Failure, Verdict, group, verify};

/// Opens stream 1 with a GET (END_STREAM and END_HEADERS as given).
fn open(c: &mut Conn, end_stream: bool) {
    let fields = c.common_headers();
    c.headers(1, &fields, end_stream, true);
}

/// Opens stream 1 without END_STREAM and resets it.
fn open_and_reset(c: &mut Conn) -> Verdict {
    c.handshake()?;
    open(c, false);
    c.write_rst_stream(1, code::CANCEL);
    Ok(())
}

/// Opens stream 1 with END_STREAM and waits for the response to end.
fn open_until_closed(c: &mut Conn) -> Result<Headers, Failure> {
    c.handshake()?;
    let fields = c.common_headers();
    let h = Headers {
        stream: 1,
        block: c.encode(&fields),
        end_stream: true,
        end_headers: true,
        ..Default::default()
    };
    c.write_headers(h.clone());
    verify::stream_close(c)?;
    Ok(h)
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "http2/5.1")
        .case("idle: Sends a DATA frame", |c| {
            c.handshake()?;
            c.write_data(1, true, b"test");
            verify::stream_error(c, &[code::PROTOCOL_ERROR, code::STREAM_CLOSED])
        })
        .case("idle: Sends a RST_STREAM frame", |c| {
            c.handshake()?;
            c.write_rst_stream(1, code::CANCEL);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("idle: Sends a WINDOW_UPDATE frame", |c| {
            c.handshake()?;
            c.write_window_update(1, 100);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("idle: Sends a CONTINUATION frame", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            c.write_continuation(1, true, &block);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("half closed (remote): Sends a DATA frame", |c| {
            c.handshake()?;
            open(c, true);
            c.write_data(1, true, b"test");
            verify::stream_error(c, &[code::STREAM_CLOSED])
        })
        .case("half closed (remote): Sends a HEADERS frame", |c| {
            c.handshake()?;
            open(c, true);
            open(c, true);
            verify::stream_error(c, &[code::STREAM_CLOSED])
        })
        .case("half closed (remote): Sends a CONTINUATION frame", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            c.write_headers(Headers {
                stream: 1,
                block: block.clone(),
                end_stream: true,
                end_headers: true,
                ..Default::default()
            });
            c.write_continuation(1, true, &block);
            verify::stream_error(c, &[code::STREAM_CLOSED, code::PROTOCOL_ERROR])
        })
        .case(
            "closed: Sends a DATA frame after sending RST_STREAM frame",
            |c| {
                open_and_reset(c)?;
                c.write_data(1, true, b"test");
                verify::stream_error(c, &[code::STREAM_CLOSED])
            },
        )
        .case(
            "closed: Sends a HEADERS frame after sending RST_STREAM frame",
            |c| {
                open_and_reset(c)?;
                open(c, true);
                verify::stream_error(c, &[code::STREAM_CLOSED])
            },
        )
        .case(
            "closed: Sends a CONTINUATION frame after sending RST_STREAM frame",
            |c| {
                open_and_reset(c)?;
                let block = c.encode(&super::conn::dummy_headers(1));
                c.write_continuation(1, true, &block);
                verify::stream_error(c, &[code::STREAM_CLOSED, code::PROTOCOL_ERROR])
            },
        )
        .case("closed: Sends a DATA frame", |c| {
            open_until_closed(c)?;
            c.write_data(1, true, b"test");
            verify::stream_error(c, &[code::STREAM_CLOSED])
        })
        .case("closed: Sends a HEADERS frame", |c| {
            let h = open_until_closed(c)?;
            c.write_headers(h);
            verify::connection_error(c, &[code::STREAM_CLOSED])
        })
        .case("closed: Sends a CONTINUATION frame", |c| {
            open_until_closed(c)?;
            let block = c.encode(&super::conn::dummy_headers(1));
            c.write_continuation(1, true, &block);
            verify::connection_error(c, &[code::STREAM_CLOSED, code::PROTOCOL_ERROR])
        });

    group(all, "http2/5.1.1")
        .case("Sends even-numbered stream identifier", |c| {
            c.handshake()?;
            let fields = c.common_headers();
            c.headers(2, &fields, true, true);
            verify::connection_error(c, &[code::PROTOCOL_ERROR])
        })
        .case(
            "Sends stream identifier that is numerically smaller than previous",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(5, &fields, true, true);
                c.headers(3, &fields, true, true);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        );

    group(all, "http2/5.1.2").case(
        "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded",
        |c| {
            c.handshake()?;
            let Some(&max) = c.settings.get(&setting::MAX_CONCURRENT_STREAMS) else {
                return Err(Failure::Skipped(
                    "no SETTINGS_MAX_CONCURRENT_STREAMS advertised".into(),
                ));
            };
            // Responses wait for window, so every stream stays open.
            c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 0)]);
            for i in 0..=max {
                c.send_data_request(1 + 2 * i);
            }
            verify::stream_error(c, &[code::PROTOCOL_ERROR, code::REFUSED_STREAM])
        },
    );

    group(all, "http2/5.3.1")
        .case("Sends HEADERS frame that depends on itself", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            c.write_headers(Headers {
                stream: 1,
                block,
                end_stream: true,
                end_headers: true,
                priority: Priority {
                    depends_on: 1,
                    exclusive: false,
                    weight: 255,
                },
                ..Default::default()
            });
            verify::stream_error(c, &[code::PROTOCOL_ERROR])
        })
        .case("Sends PRIORITY frame that depend on itself", |c| {
            c.handshake()?;
            let p = Priority {
                depends_on: 1,
                exclusive: false,
                weight: 255,
            };
            c.write_priority(1, p);
            verify::stream_error(c, &[code::PROTOCOL_ERROR])
        });

    group(all, "http2/5.4.1")
        .case("Sends an invalid PING frame for connection close", |c| {
            c.handshake()?;
            c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03\0\0\0\0\0\0\0\0");
            verify::connection_close(c)
        })
        .case(
            "Sends an invalid PING frame to receive GOAWAY frame (h2spec --strict)",
            |c| {
                c.handshake()?;
                c.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x03\0\0\0\0\0\0\0\0");
                verify::frame_where(c, kind::GOAWAY, |_| true, "GOAWAY frame (PROTOCOL_ERROR)")
            },
        );

    group(all, "http2/5.5")
        .case("Sends an unknown extension frame", |c| {
            c.handshake()?;
            c.send(UNKNOWN_FRAME);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        })
        .case(
            "Sends an unknown extension frame in the middle of a header block",
            |c| {
                c.handshake()?;
                let fields = c.common_headers();
                c.headers(1, &fields, true, false);
                c.send(UNKNOWN_FRAME);
                verify::connection_error(c, &[code::PROTOCOL_ERROR])
            },
        );
}
