//! Each limit against a hostile client, with the attack it stops.

use super::*;

/// HEADERS and RST_STREAM of each of `n` streams from `id` on, in one
/// read (as a cancelling client writes them); the next free id.
fn open_and_reset(conn: &mut Conn, mut id: u32, n: usize, now: Instant) -> u32 {
    let mut bytes = BytesMut::new();
    for _ in 0..n {
        bytes.extend_from_slice(&headers(id, false));
        bytes.extend_from_slice(&frame(kind::RST_STREAM, 0, id, &code::CANCEL.to_be_bytes()));
        id += 2;
    }
    feed_at(conn, &bytes, now);
    id
}

/// A stream reset in the same read that opened it never reaches a
/// handler and does not hold a stream slot (it used to: 300 such pairs
/// left the last streams, and then good requests, REFUSED_STREAM).
#[test]
fn a_stream_reset_before_its_request_is_taken_never_starts_and_frees_its_slot() {
    let mut conn = settled(settings(), &[]);
    let next = open_and_reset(&mut conn, 1, 300, t0());
    assert!(conn.failed().is_none());
    assert!(conn.accept().is_none(), "no handler runs");
    assert_eq!(conn.open_streams(), 0);
    open(&mut conn, next, b"good");
    assert_eq!(conn.accept().map(|(id, _)| id), Some(next));
    assert!(resets(&written(&mut conn)).is_empty());
}

/// Rapid reset (CVE-2023-44487): streams the client resets spend a
/// budget that only time refills. Good requests in between do not (they
/// used to reset the count).
#[test]
fn client_resets_beyond_the_budget_end_the_connection_whatever_completes_between() {
    let settings = with(|l| {
        l.reset_stream_burst = 10;
        l.reset_stream_rate = 2;
    });
    let mut conn = settled(settings, &[]);
    let mut id = 1;
    for _ in 0..10 {
        id = open_and_reset(&mut conn, id, 1, t0());
        open(&mut conn, id, b"good");
        let (good, _) = conn.accept().unwrap();
        answer(&mut conn, good);
        id += 2;
    }
    assert!(conn.failed().is_none());
    // One second later, two more are allowed; the third is one too many.
    let later = t0() + Duration::from_secs(1);
    id = open_and_reset(&mut conn, id, 2, later);
    assert!(conn.failed().is_none());
    open_and_reset(&mut conn, id, 1, later);
    assert_eq!(
        conn.failed(),
        Some("the client reset too many streams (rapid reset)")
    );
    assert_eq!(
        goaways(&written(&mut conn)).last().map(|&(_, code)| code),
        Some(code::ENHANCE_YOUR_CALM)
    );
}

/// MadeYouReset (CVE-2025-8671): frames that make this side reset a
/// stream (here a zero WINDOW_UPDATE, and DATA after END_STREAM) count
/// against a budget no completed request refills, and the request's
/// handler is cancelled (or never started) each time.
#[test]
fn streams_the_client_makes_this_side_reset_are_bounded() {
    let settings = with(|l| l.max_local_error_resets = 6);
    let mut conn = settled(settings, &[]);
    let mut id = 1;
    for n in 0..6 {
        let mut bytes = headers(id, n % 2 == 1);
        bytes.extend_from_slice(&match n % 2 {
            0 => frame(kind::WINDOW_UPDATE, 0, id, &[0; 4]),
            _ => frame(kind::DATA, 0, id, b"late"),
        });
        feed(&mut conn, &bytes);
        assert!(conn.accept().is_none(), "reset before its handler ran");
        open(&mut conn, id + 2, b"good");
        let (good, _) = conn.accept().unwrap();
        answer(&mut conn, good);
        id += 4;
    }
    assert!(conn.failed().is_none());
    assert_eq!(conn.open_streams(), 0);
    feed(&mut conn, &headers(id, false));
    feed(&mut conn, &frame(kind::WINDOW_UPDATE, 0, id, &[0; 4]));
    assert_eq!(
        conn.failed(),
        Some("too many streams reset for the client's errors")
    );
}

/// CONTINUATION flood (CVE-2024-27316): empty CONTINUATION frames cost
/// nothing in bytes, so their number is bounded too.
#[test]
fn a_header_block_of_too_many_continuations_ends_the_connection() {
    let mut conn = settled(settings(), &[]);
    let mut bytes = frame(kind::HEADERS, 0, 1, &request_block());
    for _ in 0..settings().limits.max_continuations() {
        bytes.extend_from_slice(&frame(kind::CONTINUATION, 0, 1, &[]));
    }
    feed(&mut conn, &bytes);
    assert!(conn.failed().is_none(), "up to the limit");
    feed(&mut conn, &frame(kind::CONTINUATION, 0, 1, &[]));
    assert_eq!(
        conn.failed(),
        Some("too many CONTINUATION frames in one header block")
    );
    assert_eq!(goaways(&written(&mut conn)), [(0, code::ENHANCE_YOUR_CALM)]);
}

/// PING, settings(), PRIORITY, unknown and empty DATA floods
/// (CVE-2019-9512, -9515, -9518) spend a budget that time refills, and a
/// response sent gives a token back.
#[test]
fn frames_that_carry_no_work_spend_a_budget() {
    let settings = with(|l| {
        l.control_frame_burst = 5;
        l.control_frame_rate = 1;
    });
    let floods = [
        frame(kind::PING, 0, 0, b"12345678"),
        frame(kind::SETTINGS, 0, 0, &[]),
        frame(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 1]),
        frame(0xfa, 0, 0, b"unknown"),
        frame(kind::DATA, 0, 1, &[]),
    ];
    for flood in floods {
        let mut conn = settled(settings, &[]);
        feed(&mut conn, &headers(1, false));
        conn.accept().unwrap();
        for _ in 0..5 {
            feed(&mut conn, &flood);
        }
        assert!(conn.failed().is_none());
        // A response earns one; a second later, one more.
        conn.send_head(1, 200, &HeaderMap::new(), false);
        feed(&mut conn, &flood);
        feed_at(&mut conn, &flood, t0() + Duration::from_secs(1));
        assert!(conn.failed().is_none());
        feed_at(&mut conn, &flood, t0() + Duration::from_secs(1));
        assert_eq!(
            conn.failed(),
            Some("too many frames that carry no work (SETTINGS, PING, PRIORITY, empty DATA)"),
            "{flood:?}"
        );
    }
}

/// A client that does not read (here: a zero initial window): each stream
/// queues up to its send buffer, then its sender waits; past the
/// connection's buffer the connection says it is backlogged; after the
/// send timeout the waiting streams are reset and what they held dropped.
#[test]
fn responses_a_client_does_not_read_are_bounded_and_time_out() {
    let small = with(|l| {
        l.stream_send_buffer = 100;
        l.connection_send_buffer = 150;
    });
    let mut conn = settled(small, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    let mut wake = Vec::new();
    let waker = noop();
    for id in [1, 3] {
        open(&mut conn, id, b"x");
        conn.accept().unwrap();
        conn.send_head(id, 200, &HeaderMap::new(), false);
        assert_eq!(conn.poll_send_ready(id, &waker), Some(true));
        conn.send_data(id, Bytes::from(vec![1; 100]), &mut wake);
        assert_eq!(conn.poll_send_ready(id, &waker), None, "the sender waits");
    }
    assert_eq!(conn.queued(), 200);
    assert!(conn.is_backlogged());
    // The clock starts when the bytes were queued.
    let due = conn.next_timeout().expect("a send timeout");
    assert_eq!(due, t0() + settings().limits.send_timeout);
    conn.on_timeout(due - Duration::from_millis(1), &mut wake);
    assert_eq!(conn.open_streams(), 2);
    conn.on_timeout(due, &mut wake);
    assert_eq!(wake.len(), 2, "both senders are woken");
    assert_eq!(conn.poll_send_ready(1, &waker), Some(false));
    conn.finish(1, &mut wake);
    conn.finish(3, &mut wake);
    assert_eq!(conn.open_streams(), 0);
    assert_eq!(conn.queued(), 0);
    assert!(!conn.is_backlogged());
    assert_eq!(
        resets(&written(&mut conn)),
        [(1, code::CANCEL), (3, code::CANCEL)]
    );
}

/// A stream that sends some bytes is timed from its last progress.
#[test]
fn a_stream_that_makes_progress_is_timed_from_its_last_bytes() {
    let mut conn = settled(settings(), &[(setting::INITIAL_WINDOW_SIZE, 10)]);
    let mut wake = Vec::new();
    open(&mut conn, 1, b"x");
    conn.accept().unwrap();
    conn.send_data(1, Bytes::from(vec![1; 50]), &mut wake);
    let later = t0() + Duration::from_secs(20);
    conn.set_time(later);
    feed_at(
        &mut conn,
        &frame(kind::WINDOW_UPDATE, 0, 1, &10u32.to_be_bytes()),
        later,
    );
    assert_eq!(
        conn.next_timeout(),
        Some(later + settings().limits.send_timeout)
    );
}

/// Graceful shutdown in two phases (RFC 9113 6.8): GOAWAY(2^31-1) and a
/// PING; a stream opened meanwhile is still served; the final GOAWAY names
/// the last stream when the PING is answered (or its timeout passes), and
/// streams after it are ignored.
#[test]
fn a_graceful_goaway_is_two_phase() {
    for answered in [true, false] {
        let mut conn = settled(settings(), &[]);
        open(&mut conn, 1, b"a");
        conn.accept().unwrap();
        conn.go_away();
        let frames = written(&mut conn);
        assert_eq!(goaways(&frames), [(MAX_STREAM_ID, code::NO_ERROR)]);
        let ping = frames.iter().find(|f| f.kind == kind::PING).unwrap();
        open(&mut conn, 3, b"in flight");
        assert_eq!(conn.accept().map(|(id, _)| id), Some(3));
        if answered {
            feed(&mut conn, &frame(kind::PING, flag::ACK, 0, &ping.payload));
        } else {
            let due = conn.next_timeout().unwrap();
            assert_eq!(due, t0() + settings().limits.goaway_ping_timeout);
            conn.on_timeout(due, &mut Vec::new());
        }
        assert_eq!(goaways(&written(&mut conn)), [(3, code::NO_ERROR)]);
        open(&mut conn, 5, b"too late");
        assert!(conn.accept().is_none());
        assert!(written(&mut conn).is_empty(), "ignored, not answered");
        answer(&mut conn, 1);
        assert!(!conn.is_finished());
        answer(&mut conn, 3);
        assert!(conn.is_finished());
    }
}

/// Streams beyond the advertised limit are refused (and counted as the
/// client's errors).
#[test]
fn streams_beyond_the_limit_are_refused() {
    let mut conn = settled(with(|l| l.max_concurrent_streams = 1), &[]);
    open(&mut conn, 1, b"a");
    open(&mut conn, 3, b"b");
    assert!(conn.accept().is_some());
    assert!(conn.accept().is_none());
    assert_eq!(resets(&written(&mut conn)), [(3, code::REFUSED_STREAM)]);
    // Its late DATA is ignored: this side reset it.
    feed(&mut conn, &frame(kind::DATA, 0, 3, b"more"));
    assert!(written(&mut conn).is_empty());
}
