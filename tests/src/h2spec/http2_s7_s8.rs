//! h2spec `http2/` sections 7 and 8: error codes, HTTP message exchange
//! (header fields, pseudo-headers, malformed requests), server push.

use super::conn::{Conn, Field, field};
use super::frame::code;
use super::http2_s6_7_to_10::H2SPEC;
use super::{Case, Verdict, group, verify};

/// Sends `fields` as a complete request on stream 1 and expects a stream
/// error PROTOCOL_ERROR (the malformed-request cases).
fn malformed(c: &mut Conn, fields: &[Field]) -> Verdict {
    c.headers(1, fields, true, true);
    verify::stream_error(c, &[code::PROTOCOL_ERROR])
}

/// GET with one more field.
fn common_and(c: &mut Conn, name: &str, value: &str) -> Vec<Field> {
    let mut fields = c.common_headers();
    fields.push(field(name, value));
    fields
}

/// POST headers on stream 1, then a DATA frame without END_STREAM, then a
/// trailing HEADERS frame holding `trailers` (without END_STREAM).
fn post_then_trailers(c: &mut Conn, trailers: &[Field]) -> Verdict {
    let fields = c.post_headers();
    c.headers(1, &fields, false, true);
    c.write_data(1, false, b"test");
    c.headers(1, trailers, false, true);
    verify::stream_error(c, &[code::PROTOCOL_ERROR])
}

/// POST with content-length 1 on stream 1, then `bodies` as DATA frames.
fn post_with_wrong_length(c: &mut Conn, bodies: usize) -> Verdict {
    let mut fields = c.post_headers();
    fields.push(field("content-length", "1"));
    c.headers(1, &fields, false, true);
    for i in 1..=bodies {
        c.write_data(1, i == bodies, b"test");
    }
    verify::stream_error(c, &[code::PROTOCOL_ERROR])
}

pub(crate) fn register(all: &mut Vec<Case>) {
    group(all, "http2/7")
        .case("Sends a GOAWAY frame with unknown error code", |c| {
            c.handshake()?;
            c.write_goaway(0, 0xff, &[]);
            c.write_ping(false, H2SPEC);
            verify::ping_ack_or_connection_close(c, H2SPEC)
        })
        .case("Sends a RST_STREAM frame with unknown error code", |c| {
            c.handshake()?;
            let fields = c.post_headers();
            c.headers(1, &fields, false, true);
            c.write_rst_stream(1, 0xff);
            c.write_ping(false, [0; 8]);
            verify::ping_ack_or_connection_close(c, [0; 8])
        });

    group(all, "http2/8.1").case(
        "Sends a second HEADERS frame without the END_STREAM flag",
        |c| {
            c.handshake()?;
            post_then_trailers(c, &[field("x-test", "ok")])
        },
    );

    group(all, "http2/8.1.2").case(
        "Sends a HEADERS frame that contains the header field name in uppercase letters",
        |c| {
            c.handshake()?;
            let fields = common_and(c, "X-TEST", "ok");
            malformed(c, &fields)
        },
    );

    group(all, "http2/8.1.2.1")
        .case(
            "Sends a HEADERS frame that contains a unknown pseudo-header field",
            |c| {
                c.handshake()?;
                let fields = common_and(c, ":test", "ok");
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that contains the pseudo-header field defined for response",
            |c| {
                c.handshake()?;
                let fields = common_and(c, ":status", "200");
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that contains a pseudo-header field as trailers",
            |c| {
                c.handshake()?;
                post_then_trailers(c, &[field(":method", "POST")])
            },
        )
        .case(
            "Sends a HEADERS frame that contains a pseudo-header field that appears in a header block after a regular header field",
            |c| {
                c.handshake()?;
                let mut fields = vec![field("x-test", "ok")];
                fields.extend(c.common_headers());
                malformed(c, &fields)
            },
        );

    group(all, "http2/8.1.2.2")
        .case(
            "Sends a HEADERS frame that contains the connection-specific header field",
            |c| {
                c.handshake()?;
                let fields = common_and(c, "connection", "keep-alive");
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that contains the TE header field with any value other than \"trailers\"",
            |c| {
                c.handshake()?;
                let mut fields = common_and(c, "trailers", "test");
                fields.push(field("te", "trailers, deflate"));
                malformed(c, &fields)
            },
        );

    group(all, "http2/8.1.2.3")
        .case(
            "Sends a HEADERS frame with empty \":path\" pseudo-header field",
            |c| {
                c.handshake()?;
                let mut fields = c.common_headers();
                fields[2].1 = String::new();
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that omits \":method\" pseudo-header field",
            |c| {
                c.handshake()?;
                // As h2spec: it drops `:scheme` too (`headers[1:]` of a
                // list that already lacks `:method`).
                let fields = c.common_headers()[2..].to_vec();
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that omits \":scheme\" pseudo-header field",
            |c| {
                c.handshake()?;
                let mut fields = c.common_headers();
                fields.remove(1);
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame that omits \":path\" pseudo-header field",
            |c| {
                c.handshake()?;
                let mut fields = c.common_headers();
                fields.remove(2);
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame with duplicated \":method\" pseudo-header field",
            |c| {
                c.handshake()?;
                let fields = common_and(c, ":method", "GET");
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame with duplicated \":scheme\" pseudo-header field",
            |c| {
                c.handshake()?;
                let fields = common_and(c, ":scheme", "http");
                malformed(c, &fields)
            },
        )
        .case(
            "Sends a HEADERS frame with duplicated \":path\" pseudo-header field",
            |c| {
                c.handshake()?;
                let path = c.target.path.clone();
                let fields = common_and(c, ":path", &path);
                malformed(c, &fields)
            },
        );

    group(all, "http2/8.1.2.6")
        .case(
            "Sends a HEADERS frame with the \"content-length\" header field which does not equal the DATA frame payload length",
            |c| {
                c.handshake()?;
                post_with_wrong_length(c, 1)
            },
        )
        .case(
            "Sends a HEADERS frame with the \"content-length\" header field which does not equal the sum of the multiple DATA frames payload length",
            |c| {
                c.handshake()?;
                post_with_wrong_length(c, 2)
            },
        );

    group(all, "http2/8.2").case("Sends a PUSH_PROMISE frame", |c| {
        c.handshake()?;
        let block = c.encode(&c.common_headers());
        c.write_push_promise(1, 3, &block);
        verify::connection_error(c, &[code::PROTOCOL_ERROR])
    });
}
