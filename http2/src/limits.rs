//! What a peer may make a connection hold or do, each bound named after
//! the `h2` or nghttp2 setting that stops the same attack (this crate's
//! README lists them with the attack each one stops).
//!
//! Time-based budgets are token buckets refilled by the clock only: no
//! request that completes gives tokens back, so interleaving good requests
//! with an attack does not reset its count (the bypass of the count this
//! replaced).

use std::time::{Duration, Instant};

/// Largest header block (HEADERS and its CONTINUATIONs) in bytes, whatever
/// the header list limit: a block that decodes to little can still be long.
pub const MIN_HEADER_BLOCK: usize = 64 << 10;
/// CONTINUATION frames one header block may take at least (nghttp2's
/// `max_continuations`); more when the block limit needs more full frames.
pub const MIN_CONTINUATIONS: usize = 8;
/// Most header fields in one block.
pub const MAX_HEADER_FIELDS: usize = 256;

/// The limits of one connection; [`Limits::default`] are the documented
/// defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Streams open at once (SETTINGS_MAX_CONCURRENT_STREAMS); beyond it a
    /// new stream is refused (REFUSED_STREAM).
    pub max_concurrent_streams: u32,
    /// Receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    pub stream_window: u32,
    /// Receive window of the connection.
    pub connection_window: u32,
    /// Largest decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE); a
    /// request over it is answered (gRPC RESOURCE_EXHAUSTED), not read.
    pub max_header_list_size: u32,
    /// Streams the peer may reset (RST_STREAM before the response ended)
    /// in a burst, and per second after it; beyond, GOAWAY
    /// ENHANCE_YOUR_CALM. nghttp2's `stream_reset_rate_limit` (1000, 33).
    /// Streams reset before their handler ran count too (`h2`'s
    /// `max_pending_accept_reset_streams`): "rapid reset", CVE-2023-44487.
    pub reset_stream_burst: u32,
    /// See `reset_stream_burst`.
    pub reset_stream_rate: u32,
    /// Streams this side may reset because of the peer's errors on them
    /// (a zero WINDOW_UPDATE, DATA after END_STREAM, a malformed request,
    /// a stream beyond the limit) before the connection is closed with
    /// ENHANCE_YOUR_CALM. `h2`'s `max_local_error_reset_streams` (1024):
    /// "MadeYouReset", CVE-2025-8671.
    pub max_local_error_resets: u32,
    /// Frames that ask for work but carry none — SETTINGS, PING,
    /// PRIORITY, frames of unknown type, empty DATA without END_STREAM —
    /// in a burst, and per second after it; beyond, GOAWAY
    /// ENHANCE_YOUR_CALM (CVE-2019-9512 ping flood, CVE-2019-9515 settings
    /// flood, CVE-2019-9518 empty frames). Each response sent gives one
    /// back, as a busy client's pings (gRPC's BDP probes) follow data.
    pub control_frame_burst: u32,
    /// See `control_frame_burst`.
    pub control_frame_rate: u32,
    /// Response bytes one stream may queue beyond what the peer's windows
    /// let it send (`h2`'s `max_send_buffer_size`); its sender then waits.
    pub stream_send_buffer: usize,
    /// Response bytes all streams of a connection may queue beyond the
    /// peer's windows; past it [`crate::server::Conn::is_backlogged`] says
    /// so and new work should wait until it is not (and be refused if it
    /// stays so: a client that does not read).
    pub connection_send_buffer: usize,
    /// Bytes queued for the socket beyond which response data stays in its
    /// streams' buffers (and the driver stops reading: a client that sends
    /// but does not read, e.g. a PING flood, is not read further). Without
    /// it, a client granting a 2 GiB window and not reading would have the
    /// whole of every response queued for the socket.
    pub write_buffer: usize,
    /// A stream with bytes waiting for the peer's window that sends none
    /// for this long is reset (CANCEL) and what it held dropped (a slow or
    /// zero-window reader; linkerd2-proxy's `stream_idle_timeout`).
    pub send_timeout: Duration,
    /// After a graceful GOAWAY (last stream 2^31-1) and its PING, the
    /// final GOAWAY follows the PING's answer or this, whichever is first.
    pub goaway_ping_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 256,
            stream_window: 4 << 20,
            connection_window: 16 << 20,
            max_header_list_size: 16 << 10,
            reset_stream_burst: 1000,
            reset_stream_rate: 33,
            max_local_error_resets: 1024,
            control_frame_burst: 1000,
            control_frame_rate: 100,
            stream_send_buffer: 4 << 20,
            connection_send_buffer: 16 << 20,
            write_buffer: 1 << 20,
            send_timeout: Duration::from_secs(30),
            goaway_ping_timeout: Duration::from_secs(1),
        }
    }
}

impl Limits {
    /// Largest header block in bytes.
    pub fn max_header_block(&self) -> usize {
        MIN_HEADER_BLOCK.max(self.max_header_list_size as usize)
    }

    /// Most CONTINUATION frames in one header block: enough for the
    /// largest block in full frames, and never fewer than
    /// [`MIN_CONTINUATIONS`]. Empty ones count: a flood of them ends the
    /// connection (CVE-2024-27316).
    pub fn max_continuations(&self) -> usize {
        MIN_CONTINUATIONS.max(self.max_header_block() / crate::frame::DEFAULT_MAX_FRAME + 1)
    }
}

/// A token bucket refilled by time only.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    capacity: u32,
    per_second: u32,
    tokens: u32,
    /// When `tokens` was last topped up (the time of whole tokens only, so
    /// that fractions are not lost).
    since: Option<Instant>,
}

impl Bucket {
    pub(crate) fn new(capacity: u32, per_second: u32) -> Self {
        Self {
            capacity,
            per_second,
            tokens: capacity,
            since: None,
        }
    }

    /// Takes a token at `now`; `false` when there is none.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Gives one token back (never beyond the capacity).
    pub(crate) fn give(&mut self) {
        self.tokens = (self.tokens + 1).min(self.capacity);
    }

    fn refill(&mut self, now: Instant) {
        let Some(since) = self.since else {
            self.since = Some(now);
            return;
        };
        if self.per_second == 0 || self.tokens >= self.capacity {
            self.since = Some(now);
            return;
        }
        let elapsed = now.saturating_duration_since(since);
        let earned = elapsed.as_nanos() * u128::from(self.per_second) / 1_000_000_000;
        if earned == 0 {
            return;
        }
        let room = u128::from(self.capacity - self.tokens);
        self.tokens += earned.min(room) as u32;
        // Keep the fraction of a token earned but not yet whole.
        let used =
            Duration::from_nanos((earned * 1_000_000_000 / u128::from(self.per_second)) as u64);
        self.since = Some(if earned >= room { now } else { since + used });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_spends_its_burst_then_refills_with_time_only() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3, 2);
        for _ in 0..3 {
            assert!(b.take(t0));
        }
        assert!(!b.take(t0));
        // Half a second earns one token at 2/s; a quarter more, nothing.
        assert!(b.take(t0 + Duration::from_millis(500)));
        assert!(!b.take(t0 + Duration::from_millis(750)));
        // The quarter was kept: at 1 s the second token is whole.
        assert!(b.take(t0 + Duration::from_millis(1000)));
        // A long pause fills it to capacity, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.take(later));
        }
        assert!(!b.take(later));
        b.give();
        assert!(b.take(later));
    }

    #[test]
    fn continuations_scale_with_the_block_limit() {
        let mut l = Limits::default();
        assert_eq!(l.max_continuations(), MIN_CONTINUATIONS);
        l.max_header_list_size = 1 << 20;
        assert_eq!(l.max_continuations(), 65);
    }
}
