//! Requests and responses, and each stream state's rules (RFC 9113 5.1).

use super::*;

#[test]
fn the_handshake_sends_settings_and_acknowledges_the_clients() {
    let mut conn = Conn::new(settings(), t0());
    let frames = written(&mut conn);
    assert_eq!(frames[0].kind, kind::SETTINGS);
    assert_eq!(frames[0].payload.len(), 18, "three settings");
    assert_eq!(frames[1].kind, kind::WINDOW_UPDATE);
    // The preface may arrive in pieces.
    feed(&mut conn, &frame::PREFACE[..10]);
    assert!(conn.failed().is_none());
    let mut rest = BytesMut::from(&frame::PREFACE[10..]);
    rest.extend_from_slice(&frame(kind::SETTINGS, 0, 0, &[]));
    feed(&mut conn, &rest);
    assert!(conn.is_settled());
    let frames = written(&mut conn);
    assert_eq!(
        (frames[0].kind, frames[0].flags),
        (kind::SETTINGS, flag::ACK)
    );
}

#[test]
fn a_client_that_does_not_speak_http2_is_dropped_without_goaway() {
    let mut conn = Conn::new(settings(), t0());
    written(&mut conn);
    feed(&mut conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(conn.failed().is_some());
    assert!(written(&mut conn).is_empty());
    let mut conn = Conn::new(settings(), t0());
    let mut bytes = BytesMut::from(frame::PREFACE);
    bytes.extend_from_slice(&frame(kind::PING, 0, 0, b"12345678"));
    feed(&mut conn, &bytes);
    assert_eq!(conn.failed(), Some("the first frame was not SETTINGS"));
}

#[test]
fn a_request_is_accepted_read_and_answered_in_order() {
    let mut conn = settled(settings(), &[]);
    open(&mut conn, 1, b"hello");
    let (id, req) = conn.accept().expect("a request");
    assert_eq!(id, 1);
    assert_eq!(req.method(), Method::POST);
    assert_eq!(req.uri().path(), MODEL_INFER_PATH);
    assert_eq!(req.headers()["content-type"], "application/grpc");
    let waker = noop();
    assert_eq!(
        conn.poll_data(1, &waker),
        Some(Some(Ok(Bytes::from_static(b"hello"))))
    );
    assert_eq!(conn.poll_data(1, &waker), Some(None));
    assert!(conn.is_end_stream(1));

    let mut head = HeaderMap::new();
    head.insert("content-type", HeaderValue::from_static("application/grpc"));
    conn.send_head(1, 200, &head, false);
    let mut wake = Vec::new();
    conn.send_data(1, Bytes::from_static(b"world"), &mut wake);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    conn.send_end(1, Some(&trailers), &mut wake);
    conn.finish(1, &mut wake);
    assert_eq!(conn.open_streams(), 0);
    let frames = written(&mut conn);
    let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.kind, f.flags)).collect();
    assert_eq!(
        kinds,
        [
            (kind::HEADERS, flag::END_HEADERS),
            (kind::DATA, 0),
            (kind::HEADERS, flag::END_HEADERS | flag::END_STREAM),
        ]
    );
    assert_eq!(
        decode(&frames[0].payload),
        [
            (":status".into(), "200".into()),
            ("content-type".into(), "application/grpc".into())
        ]
    );
    assert_eq!(frames[1].payload, b"world");
    assert_eq!(
        decode(&frames[2].payload),
        [("grpc-status".into(), "0".into())]
    );
}

#[test]
fn response_data_waits_for_the_clients_windows_and_trailers_wait_for_the_data() {
    let mut conn = settled(settings(), &[(setting::INITIAL_WINDOW_SIZE, 10)]);
    open(&mut conn, 1, b"x");
    conn.accept().unwrap();
    conn.send_head(1, 200, &HeaderMap::new(), false);
    let mut wake = Vec::new();
    conn.send_data(1, Bytes::from(vec![7u8; 25]), &mut wake);
    conn.send_end(1, Some(&HeaderMap::new()), &mut wake);
    conn.finish(1, &mut wake);
    let frames = written(&mut conn);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[1].payload.len(), 10);
    assert_eq!(conn.open_streams(), 1, "finishing after the handler ended");
    let update = 15u32.to_be_bytes();
    feed(&mut conn, &frame(kind::WINDOW_UPDATE, 0, 1, &update));
    let frames = written(&mut conn);
    assert_eq!(frames[0].payload.len(), 15);
    assert_eq!(frames[1].kind, kind::HEADERS);
    assert_ne!(frames[1].flags & flag::END_STREAM, 0);
    assert_eq!(conn.open_streams(), 0);
}

fn fields(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for &(n, v) in pairs {
        map.insert(n, HeaderValue::from_str(v).unwrap());
    }
    map
}

/// Every header block written, in wire order, decoded by one decoder
/// (loona-hpack) whose table has the size `table` the client set.
fn decode_all(frames: &[Frame], table: usize) -> Vec<(u32, Vec<(String, String)>)> {
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(table);
    decoder.set_max_table_size(table);
    frames
        .iter()
        .filter(|f| f.kind == kind::HEADERS)
        .map(|f| {
            let fields = decoder
                .decode(&f.payload)
                .unwrap_or_else(|e| panic!("stream {}: {e:?}", f.stream))
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            (f.stream, fields)
        })
        .collect()
}

fn strings(status: Option<&str>, map: &HeaderMap) -> Vec<(String, String)> {
    let status = status.map(|s| (":status".to_string(), s.to_string()));
    status
        .into_iter()
        .chain(
            map.iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())),
        )
        .collect()
}

/// Response blocks add their names to the client's HPACK table only
/// within the size its settings() allow, after telling it the size: a
/// decoder holding the client's 50 bytes reads every block of three
/// responses (the server's table would otherwise overflow it, and the
/// later references would miss).
#[test]
fn response_blocks_fill_the_clients_table_only_within_its_size() {
    for table in [50, 0, 4096] {
        let mut conn = settled(settings(), &[(setting::HEADER_TABLE_SIZE, table as u32)]);
        let head = fields(&[("content-type", "application/grpc")]);
        let mut want = Vec::new();
        let mut wake = Vec::new();
        for (id, busy) in [(1, "0.5"), (3, "0.5"), (5, "0.75")] {
            open(&mut conn, id, b"x");
            conn.accept().unwrap();
            let end = fields(&[("grpc-status", "0"), ("infermesh-busy", busy)]);
            conn.send_head(id, 200, &head, false);
            conn.send_data(id, Bytes::from_static(b"y"), &mut wake);
            conn.send_end(id, Some(&end), &mut wake);
            conn.finish(id, &mut wake);
            want.push((id, strings(Some("200"), &head)));
            want.push((id, strings(None, &end)));
        }
        assert_eq!(
            decode_all(&written(&mut conn), table),
            want,
            "table {table}"
        );
    }
}

/// Trailers that wait for window are encoded when they leave, so that
/// a block encoded meanwhile for another stream, which adds to the
/// client's table, is read before them as the table was when each was
/// encoded.
#[test]
fn trailers_that_wait_are_encoded_in_the_order_they_leave() {
    let mut conn = settled(settings(), &[(setting::INITIAL_WINDOW_SIZE, 10)]);
    let mut wake = Vec::new();
    let late = fields(&[("grpc-status", "0"), ("infermesh-busy", "0.1")]);
    let early = fields(&[("grpc-status", "0"), ("infermesh-busy", "0.2")]);
    open(&mut conn, 1, b"a");
    open(&mut conn, 3, b"b");
    conn.accept().unwrap();
    conn.accept().unwrap();
    conn.send_head(1, 200, &HeaderMap::new(), false);
    conn.send_data(1, Bytes::from(vec![7u8; 25]), &mut wake);
    conn.send_end(1, Some(&late), &mut wake);
    conn.send_head(3, 200, &HeaderMap::new(), false);
    conn.send_end(3, Some(&early), &mut wake);
    let mut frames = written(&mut conn);
    feed(
        &mut conn,
        &frame(kind::WINDOW_UPDATE, 0, 1, &15u32.to_be_bytes()),
    );
    feed(
        &mut conn,
        &frame(kind::WINDOW_UPDATE, 0, 0, &15u32.to_be_bytes()),
    );
    frames.extend(written(&mut conn));
    let blocks = decode_all(&frames, 4096);
    let trailers: Vec<_> = blocks.into_iter().filter(|(_, f)| f.len() == 2).collect();
    assert_eq!(
        trailers,
        [(3, strings(None, &early)), (1, strings(None, &late))]
    );
}

#[test]
fn a_client_reset_wakes_and_cancels_the_request() {
    let mut conn = settled(settings(), &[]);
    let mut bytes = headers(1, false);
    bytes.extend_from_slice(&frame(kind::DATA, 0, 1, b"part"));
    feed(&mut conn, &bytes);
    conn.accept().unwrap();
    let waker = noop();
    assert!(!conn.poll_reset(1, &waker));
    let wake = feed(
        &mut conn,
        &frame(kind::RST_STREAM, 0, 1, &code::CANCEL.to_be_bytes()),
    );
    assert_eq!(wake.len(), 1, "the handler is woken");
    assert!(conn.poll_reset(1, &waker));
    assert_eq!(
        conn.poll_data(1, &waker),
        Some(Some(Err(StreamError::Reset(code::CANCEL))))
    );
    let mut wake = Vec::new();
    conn.finish(1, &mut wake);
    assert_eq!(conn.open_streams(), 0);
    assert!(resets(&written(&mut conn)).is_empty());
}

#[test]
fn headers_over_the_list_limit_get_a_grpc_error_and_the_connection_lives() {
    let mut conn = settled(with(|l| l.max_header_list_size = 200), &[]);
    let mut block = request_block();
    hpack::encode::put_literal(&mut block, b"x-big", &[b'a'; 300], false);
    feed(
        &mut conn,
        &frame(
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            1,
            &block,
        ),
    );
    assert!(conn.accept().is_none());
    assert!(conn.failed().is_none());
    let frames = written(&mut conn);
    let fields = decode(&frames[0].payload);
    assert!(
        fields.contains(&("grpc-status".into(), "8".into())),
        "{fields:?}"
    );
    assert_ne!(frames[0].flags & flag::END_STREAM, 0);
    assert_eq!(conn.open_streams(), 0);
}

#[test]
fn window_and_framing_violations_are_answered_as_the_rfc_says() {
    // DATA beyond the stream's window: that stream is reset.
    let mut conn = settled(with(|l| l.stream_window = 65_535), &[]);
    feed(&mut conn, &headers(1, false));
    conn.accept().unwrap();
    for _ in 0..4 {
        feed(&mut conn, &frame(kind::DATA, 0, 1, &[0u8; 16_384]));
    }
    assert!(conn.failed().is_none());
    assert_eq!(resets(&written(&mut conn)), [(1, code::FLOW_CONTROL_ERROR)]);
    // A header block that never ends: the connection.
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &frame(kind::HEADERS, 0, 1, &request_block()));
    for _ in 0..8 {
        feed(&mut conn, &frame(kind::CONTINUATION, 0, 1, &[0u8; 16_000]));
    }
    assert_eq!(conn.failed(), Some("a header block too long"));
    // An even stream id, and a frame over the size limit.
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &headers(2, false));
    assert!(conn.failed().is_some());
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &frame(kind::DATA, 0, 1, &vec![0u8; 20_000]));
    assert_eq!(conn.failed(), Some("a frame over the maximum size"));
}

#[test]
fn pings_are_answered_and_our_pings_matched() {
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &frame(kind::PING, 0, 0, b"abcdefgh"));
    let frames = written(&mut conn);
    assert_eq!((frames[0].kind, frames[0].flags), (kind::PING, flag::ACK));
    assert_eq!(frames[0].payload, b"abcdefgh");
    assert!(conn.ping());
    assert!(!conn.ping(), "one at a time");
    let ours = written(&mut conn);
    feed(
        &mut conn,
        &frame(kind::PING, flag::ACK, 0, &ours[0].payload),
    );
    assert!(conn.take_pong());
    assert!(!conn.take_pong());
    assert!(conn.ping());
}

/// RFC 9113 5.1 (idle): WINDOW_UPDATE, RST_STREAM and DATA on a stream
/// never opened end the connection with PROTOCOL_ERROR.
#[test]
fn frames_on_an_idle_stream_are_a_connection_error() {
    for (kind, payload) in [
        (kind::WINDOW_UPDATE, &1u32.to_be_bytes()[..]),
        (kind::RST_STREAM, &code::CANCEL.to_be_bytes()[..]),
        (kind::DATA, &b"x"[..]),
    ] {
        let mut conn = settled(settings(), &[]);
        feed(&mut conn, &frame(kind, 0, 1, payload));
        assert!(conn.failed().is_some(), "kind {kind}");
        assert_eq!(
            goaways(&written(&mut conn)),
            [(0, code::PROTOCOL_ERROR)],
            "kind {kind}"
        );
    }
}

/// RFC 9113 5.1 (half-closed remote): once the client ended its side, a
/// second HEADERS or DATA is a stream error STREAM_CLOSED.
#[test]
fn frames_after_the_clients_end_stream_are_stream_closed() {
    for late in [headers(1, true), frame(kind::DATA, 0, 1, b"x")] {
        let mut conn = settled(settings(), &[]);
        open(&mut conn, 1, b"body");
        conn.accept().unwrap();
        feed(&mut conn, &late);
        assert!(conn.failed().is_none());
        assert_eq!(resets(&written(&mut conn)), [(1, code::STREAM_CLOSED)]);
        assert!(conn.poll_reset(1, &noop()), "the handler is cancelled");
    }
}

/// RFC 9113 5.1 (closed): DATA after the client's RST_STREAM, or on a
/// stream whose request and response both ended, is a stream error
/// STREAM_CLOSED, HEADERS a connection error STREAM_CLOSED (h2spec
/// 5.1/12); a HEADERS block on a stream id below the last opened that was
/// never seen is a connection error PROTOCOL_ERROR (h2spec 5.1.1/2).
#[test]
fn frames_on_closed_streams_are_stream_closed_and_lower_ids_a_protocol_error() {
    let reset = frame(kind::RST_STREAM, 0, 1, &code::CANCEL.to_be_bytes());
    for (late, connection_error) in [
        (headers(1, true), true),
        (frame(kind::DATA, 0, 1, b"x"), false),
    ] {
        for handler_done in [false, true] {
            let mut conn = settled(settings(), &[]);
            feed(&mut conn, &headers(1, false));
            let (id, _) = conn.accept().unwrap();
            feed(&mut conn, &reset);
            if handler_done {
                conn.finish(id, &mut Vec::new());
            }
            feed(&mut conn, &late);
            let frames = written(&mut conn);
            match connection_error {
                true => assert_eq!(goaways(&frames), [(1, code::STREAM_CLOSED)]),
                false => assert_eq!(resets(&frames), [(1, code::STREAM_CLOSED)]),
            }
        }
    }
    // Both sides ended: DATA is STREAM_CLOSED.
    let mut conn = settled(settings(), &[]);
    open(&mut conn, 1, b"x");
    conn.accept().unwrap();
    answer(&mut conn, 1);
    written(&mut conn);
    feed(&mut conn, &frame(kind::DATA, 0, 1, b"x"));
    assert_eq!(resets(&written(&mut conn)), [(1, code::STREAM_CLOSED)]);
    // Stream 3 skipped, then opened after 5.
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &headers(5, true));
    feed(&mut conn, &headers(3, true));
    assert!(conn.failed().is_some());
    assert_eq!(goaways(&written(&mut conn)), [(5, code::PROTOCOL_ERROR)]);
}

/// Frames on a stream this side reset may have crossed its RST_STREAM:
/// they are ignored (RFC 9113 5.1), and DATA's window is given back.
#[test]
fn frames_on_a_stream_this_side_reset_are_ignored() {
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &headers(1, false));
    let (id, _) = conn.accept().unwrap();
    // The response is complete before the request: RST_STREAM(NO_ERROR).
    answer(&mut conn, id);
    assert_eq!(resets(&written(&mut conn)), [(1, code::NO_ERROR)]);
    let mut late = frame(kind::DATA, flag::END_STREAM, 1, &[0u8; 100]);
    late.extend_from_slice(&headers(1, true));
    late.extend_from_slice(&frame(kind::WINDOW_UPDATE, 0, 1, &5u32.to_be_bytes()));
    feed(&mut conn, &late);
    assert!(conn.failed().is_none());
    assert!(written(&mut conn).is_empty());
}

/// RFC 9113 5.3.1 and 6.3: PRIORITY on stream 0 is a connection error, of
/// the wrong length a stream error FRAME_SIZE_ERROR, and a stream that
/// depends on itself (PRIORITY or HEADERS) a stream error PROTOCOL_ERROR.
#[test]
fn priority_fields_are_checked() {
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &frame(kind::PRIORITY, 0, 0, &[0, 0, 0, 1, 16]));
    assert_eq!(goaways(&written(&mut conn)), [(0, code::PROTOCOL_ERROR)]);

    // On open streams (on an idle one, RST_STREAM may not be sent: a
    // connection error, tests/regressions.rs).
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &headers(1, false));
    feed(&mut conn, &headers(3, false));
    feed(
        &mut conn,
        &frame(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 16, 0]),
    );
    feed(&mut conn, &frame(kind::PRIORITY, 0, 3, &[0, 0, 0, 3, 16]));
    // A valid one, on an idle stream, changes nothing.
    feed(&mut conn, &frame(kind::PRIORITY, 0, 7, &[0, 0, 0, 1, 16]));
    let mut self_dependent = vec![0, 0, 0, 9, 16];
    self_dependent.extend_from_slice(&request_block());
    feed(
        &mut conn,
        &frame(
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM | flag::PRIORITY,
            9,
            &self_dependent,
        ),
    );
    assert!(conn.failed().is_none());
    assert!(conn.accept().is_none());
    assert_eq!(
        resets(&written(&mut conn)),
        [
            (1, code::FRAME_SIZE_ERROR),
            (3, code::PROTOCOL_ERROR),
            (9, code::PROTOCOL_ERROR)
        ]
    );
}

/// RFC 9113 6.9: a zero increment on a stream is a stream error
/// PROTOCOL_ERROR (not FLOW_CONTROL_ERROR); on the connection, a
/// connection error.
#[test]
fn a_zero_window_increment_is_a_protocol_error() {
    let mut conn = settled(settings(), &[]);
    feed(&mut conn, &headers(1, false));
    conn.accept().unwrap();
    feed(&mut conn, &frame(kind::WINDOW_UPDATE, 0, 1, &[0; 4]));
    assert_eq!(resets(&written(&mut conn)), [(1, code::PROTOCOL_ERROR)]);
    feed(&mut conn, &frame(kind::WINDOW_UPDATE, 0, 0, &[0; 4]));
    assert_eq!(goaways(&written(&mut conn)), [(1, code::PROTOCOL_ERROR)]);
}

/// RFC 9113 8.1.1: a content-length that the DATA received does not
/// match makes the request malformed (stream error PROTOCOL_ERROR).
#[test]
fn a_content_length_the_data_disagrees_with_is_malformed() {
    let with_length = |n: &str| {
        let mut block = request_block();
        hpack::encode::put_literal(&mut block, b"content-length", n.as_bytes(), false);
        frame(kind::HEADERS, flag::END_HEADERS, 1, &block)
    };
    // Too little, too much, and exactly right.
    for (declared, sent, ok) in [("10", 4, false), ("3", 4, false), ("4", 4, true)] {
        let mut conn = settled(settings(), &[]);
        let mut bytes = with_length(declared);
        bytes.extend_from_slice(&frame(kind::DATA, flag::END_STREAM, 1, &vec![1; sent]));
        feed(&mut conn, &bytes);
        let frames = written(&mut conn);
        match ok {
            true => assert!(resets(&frames).is_empty() && conn.accept().is_some()),
            false => assert_eq!(resets(&frames), [(1, code::PROTOCOL_ERROR)]),
        }
    }
}

/// RFC 9113 8.1: trailers must end the stream and hold no pseudo-header.
#[test]
fn request_trailers_that_break_the_rules_reset_the_stream() {
    let mut pseudo = Vec::new();
    hpack::encode::put_literal(&mut pseudo, b":path", b"/x", false);
    for (flags, block) in [
        (flag::END_HEADERS, Vec::new()),
        (flag::END_HEADERS | flag::END_STREAM, pseudo),
    ] {
        let mut conn = settled(settings(), &[]);
        feed(&mut conn, &headers(1, false));
        conn.accept().unwrap();
        feed(&mut conn, &frame(kind::HEADERS, flags, 1, &block));
        assert_eq!(resets(&written(&mut conn)), [(1, code::PROTOCOL_ERROR)]);
    }
}
