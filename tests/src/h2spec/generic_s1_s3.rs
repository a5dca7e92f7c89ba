//! h2spec `generic/` sections 1 to 3: what any HTTP/2 server must accept
//! (preface, frames on streams in every state, each frame type used
//! correctly), each answered normally.

use super::conn::Conn;
use super::frame::{Headers, Priority, code, kind, setting};
use super::http2_s3_s4::server_preface;
use super::http2_s6_7_to_10::H2SPEC;
use super::{Case, Verdict, group, verify};

const WEIGHT_256: Priority = Priority {
    depends_on: 0,
    exclusive: false,
    weight: 255,
};

/// A GET on stream 1 with END_STREAM.
fn get(c: &mut Conn) {
    let fields = c.common_headers();
    c.headers(1, &fields, true, true);
}

/// A POST on stream 1 without END_STREAM.
fn post(c: &mut Conn) {
    let fields = c.post_headers();
    c.headers(1, &fields, false, true);
}

/// A request whose response waits for window, with `between` sent before
/// one octet of window: the server must send DATA.
fn data_after_window(c: &mut Conn, between: fn(&mut Conn)) -> Verdict {
    c.handshake()?;
    c.write_settings(&[(setting::INITIAL_WINDOW_SIZE, 0)]);
    c.send_data_request(1);
    between(c);
    c.write_window_update(1, 1);
    verify::event_type(c, kind::DATA)
}

/// A PRIORITY frame for `stream`, then a GET on stream 1.
fn priority_then_get(c: &mut Conn, stream: u32, p: Priority) -> Verdict {
    c.handshake()?;
    c.write_priority(stream, p);
    get(c);
    verify::headers_frame(c, 1)
}

/// A GET on stream 1 whose block is split at `cuts` into a HEADERS frame
/// and CONTINUATION frames.
fn split_block(c: &mut Conn, cuts: &[usize]) -> Verdict {
    c.handshake()?;
    let block = c.encode(&c.common_headers());
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(block.len());
    for (i, w) in bounds.windows(2).enumerate() {
        let (part, last) = (block[w[0]..w[1]].to_vec(), i == bounds.len() - 2);
        if i == 0 {
            c.write_headers(Headers {
                stream: 1,
                block: part,
                end_stream: true,
                end_headers: last,
                ..Default::default()
            });
        } else {
            c.write_continuation(1, last, &part);
        }
    }
    verify::headers_frame(c, 1)
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "generic/1").case("Sends a client connection preface", server_preface);

    group(all, "generic/2")
        .case("Sends a PRIORITY frame on idle stream", |c| {
            c.handshake()?;
            c.write_priority(1, WEIGHT_256);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        })
        .case(
            "Sends a WINDOW_UPDATE frame on half-closed (remote) stream",
            |c| data_after_window(c, |_| {}),
        )
        .case(
            "Sends a PRIORITY frame on half-closed (remote) stream",
            |c| data_after_window(c, |c| c.write_priority(1, WEIGHT_256)),
        )
        .case(
            "Sends a RST_STREAM frame on half-closed (remote) stream",
            |c| {
                c.handshake()?;
                get(c);
                c.write_rst_stream(1, code::CANCEL);
                c.write_ping(false, [0; 8]);
                verify::ping_ack_or_connection_close(c, [0; 8])
            },
        )
        .case("Sends a PRIORITY frame on closed stream", |c| {
            c.handshake()?;
            get(c);
            verify::stream_close(c)?;
            c.write_priority(1, WEIGHT_256);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        });

    group(all, "generic/3.1")
        .case("Sends a DATA frame", |c| {
            c.handshake()?;
            post(c);
            c.write_data(1, true, b"test");
            verify::headers_frame(c, 1)
        })
        .case("Sends multiple DATA frames", |c| {
            c.handshake()?;
            post(c);
            c.write_data(1, false, b"test");
            c.write_data(1, true, b"test");
            verify::headers_frame(c, 1)
        })
        .case("Sends a DATA frame with padding", |c| {
            c.handshake()?;
            post(c);
            c.write_data_padded(1, true, b"test", &[0; 5]);
            verify::headers_frame(c, 1)
        });

    group(all, "generic/3.2")
        .case("Sends a HEADERS frame", |c| {
            c.handshake()?;
            get(c);
            verify::headers_frame(c, 1)
        })
        .case("Sends a HEADERS frame with padding", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            c.write_headers(Headers {
                stream: 1,
                block,
                end_stream: true,
                end_headers: true,
                pad_length: 8,
                ..Default::default()
            });
            verify::headers_frame(c, 1)
        })
        .case("Sends a HEADERS frame with priority", |c| {
            c.handshake()?;
            let block = c.encode(&c.common_headers());
            c.write_headers(Headers {
                stream: 1,
                block,
                end_stream: true,
                end_headers: true,
                priority: WEIGHT_256,
                ..Default::default()
            });
            verify::headers_frame(c, 1)
        });

    group(all, "generic/3.3")
        .case("Sends a PRIORITY frame with priority 1", |c| {
            priority_then_get(c, 1, Priority::default())
        })
        .case("Sends a PRIORITY frame with priority 256", |c| {
            priority_then_get(c, 1, WEIGHT_256)
        })
        .case("Sends a PRIORITY frame with stream dependency", |c| {
            let p = Priority {
                depends_on: 1,
                ..Default::default()
            };
            priority_then_get(c, 3, p)
        })
        .case("Sends a PRIORITY frame with exclusive", |c| {
            let p = Priority {
                exclusive: true,
                ..Default::default()
            };
            priority_then_get(c, 1, p)
        })
        .case(
            "Sends a PRIORITY frame for an idle stream, then send a HEADER frame for a lower stream ID",
            |c| priority_then_get(c, 3, WEIGHT_256),
        );

    group(all, "generic/3.4").case("Sends a RST_STREAM frame", |c| {
        c.handshake()?;
        let fields = c.common_headers();
        c.headers(1, &fields, false, true);
        c.write_rst_stream(1, code::CANCEL);
        c.write_ping(false, [0; 8]);
        verify::ping_ack_or_connection_close(c, [0; 8])
    });

    group(all, "generic/3.5").case("Sends a SETTINGS frame", |c| {
        c.handshake()?;
        c.write_settings(&[
            (setting::HEADER_TABLE_SIZE, 4096),
            (setting::ENABLE_PUSH, 1),
            (setting::MAX_CONCURRENT_STREAMS, 100),
            (setting::INITIAL_WINDOW_SIZE, 65_535),
            (setting::MAX_FRAME_SIZE, 16_384),
            (setting::MAX_HEADER_LIST_SIZE, 100),
        ]);
        verify::settings_ack(c)
    });

    group(all, "generic/3.7").case("Sends a PING frame", |c| {
        c.handshake()?;
        c.write_ping(false, H2SPEC);
        verify::ping_ack(c, H2SPEC)
    });

    group(all, "generic/3.8").case("Sends a GOAWAY frame", |c| {
        c.handshake()?;
        c.write_goaway(0, code::NO_ERROR, b"h2spec");
        c.write_ping(false, H2SPEC);
        verify::ping_ack_or_connection_close(c, H2SPEC)
    });

    group(all, "generic/3.9")
        .case("Sends a WINDOW_UPDATE frame with stream ID 0", |c| {
            c.handshake()?;
            c.write_window_update(0, 1);
            c.write_ping(false, [0; 8]);
            verify::ping_ack(c, [0; 8])
        })
        .case("Sends a WINDOW_UPDATE frame with stream ID 1", |c| {
            c.handshake()?;
            get(c);
            c.write_window_update(1, 1);
            verify::headers_frame(c, 1)
        });

    group(all, "generic/3.10")
        .case("Sends a CONTINUATION frame", |c| split_block(c, &[5]))
        .case("Sends multiple CONTINUATION frames", |c| {
            split_block(c, &[5, 10])
        });
}
