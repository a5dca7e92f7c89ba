//! `[limits]`: what one client can take of the OIP port and, for connections
//! and their timeouts, of the KServe HTTP port (issue: nothing a client sends
//! is unbounded). Every default is here, once; the README and
//! `configs/agent.toml` name them and a test checks they agree.

use std::time::Duration;

use serde::Deserialize;

/// Connections each client port (OIP gRPC, KServe HTTP) holds at once
/// (lowered at start to fit the file-descriptor limit, see [`FD_HEADROOM`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// File descriptors kept free of client connections: worker processes and
/// their pipes, worker restarts, the admin port, ZooKeeper, shared memory.
pub const FD_HEADROOM: usize = 1024;
/// HTTP/2 streams per connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 256;
/// A new connection must send its first byte within this.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no new request for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest time to receive one request body, and longest a request waits,
/// unread, while its connection's client is behind on reading its answers
/// (then RESOURCE_EXHAUSTED; docs/DECISIONS.md).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A large request is forwarded as it arrives (cut-through) for this long
/// from its head, extended while its body keeps coming at 1 MiB/s or
/// faster (at most four times this); one whose body has not all come by
/// then gives its worker slot (or its place in the queue) back and is read
/// whole before it queues again (docs/DECISIONS.md, "Trickling uploads"):
/// a client that sends a head and then trickles holds receive budget, not
/// a worker.
pub const DEFAULT_CUT_THROUGH_GRACE: Duration = Duration::from_secs(1);
/// Longest unary call other than `ModelInfer`.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of request bodies being received at once, node-wide.
pub const DEFAULT_RECEIVE_BUDGET_BYTES: usize = 1 << 30;
/// Interval of HTTP/2 keep-alive pings.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A peer that does not answer a ping within this is disconnected.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest message of calls other than `ModelInfer`/`ModelStreamInfer`.
pub const SMALL_MESSAGE_BYTES: usize = 4 << 20;

/// `[limits]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Connections each client port (OIP gRPC, KServe HTTP) holds at once.
    pub max_connections: Option<usize>,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: Option<u32>,
    /// A new connection must send its first byte within this.
    #[serde(default, with = "humantime_serde")]
    pub handshake_timeout: Option<Duration>,
    /// A connection with no new request for this long is closed.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Longest time to receive one request body.
    #[serde(default, with = "humantime_serde")]
    pub read_timeout: Option<Duration>,
    /// Time from a request's head to its body's end within which it may be
    /// forwarded as it arrives.
    #[serde(default, with = "humantime_serde")]
    pub cut_through_grace: Option<Duration>,
    /// Longest unary call other than inference.
    #[serde(default, with = "humantime_serde")]
    pub call_timeout: Option<Duration>,
    /// Bytes of request bodies being received at once, node-wide.
    pub receive_budget_bytes: Option<usize>,
    /// Interval of HTTP/2 keep-alive pings.
    #[serde(default, with = "humantime_serde")]
    pub keepalive_interval: Option<Duration>,
    /// A peer that does not answer a ping within this is disconnected.
    #[serde(default, with = "humantime_serde")]
    pub keepalive_timeout: Option<Duration>,
}

/// Checked `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Connections at once (before fitting the fd limit).
    pub max_connections: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// First-byte deadline of a connection.
    pub handshake_timeout: Duration,
    /// Idle connection timeout.
    pub idle_timeout: Duration,
    /// Request body read timeout.
    pub read_timeout: Duration,
    /// Time from a request's head to its body's end within which it may be
    /// forwarded as it arrives.
    pub cut_through_grace: Duration,
    /// Timeout of other unary calls.
    pub call_timeout: Duration,
    /// Node-wide bytes of request bodies in reception.
    pub receive_budget_bytes: usize,
    /// Keep-alive ping interval.
    pub keepalive_interval: Duration,
    /// Keep-alive ping timeout.
    pub keepalive_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            cut_through_grace: DEFAULT_CUT_THROUGH_GRACE,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            receive_budget_bytes: DEFAULT_RECEIVE_BUDGET_BYTES,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

impl Limits {
    /// Checks `raw`, adding what is wrong to `problems`.
    pub fn from_raw(raw: &RawLimits, problems: &mut Vec<String>) -> Self {
        let d = Limits::default();
        let limits = Limits {
            max_connections: raw.max_connections.unwrap_or(d.max_connections),
            max_concurrent_streams: raw
                .max_concurrent_streams
                .unwrap_or(d.max_concurrent_streams),
            handshake_timeout: raw.handshake_timeout.unwrap_or(d.handshake_timeout),
            idle_timeout: raw.idle_timeout.unwrap_or(d.idle_timeout),
            read_timeout: raw.read_timeout.unwrap_or(d.read_timeout),
            cut_through_grace: raw.cut_through_grace.unwrap_or(d.cut_through_grace),
            call_timeout: raw.call_timeout.unwrap_or(d.call_timeout),
            receive_budget_bytes: raw.receive_budget_bytes.unwrap_or(d.receive_budget_bytes),
            keepalive_interval: raw.keepalive_interval.unwrap_or(d.keepalive_interval),
            keepalive_timeout: raw.keepalive_timeout.unwrap_or(d.keepalive_timeout),
        };
        if limits.max_connections == 0 || limits.max_concurrent_streams == 0 {
            problems.push(
                "limits: max_connections and max_concurrent_streams must be at least 1".into(),
            );
        }
        let durations = [
            ("handshake_timeout", limits.handshake_timeout),
            ("idle_timeout", limits.idle_timeout),
            ("read_timeout", limits.read_timeout),
            ("cut_through_grace", limits.cut_through_grace),
            ("call_timeout", limits.call_timeout),
            ("keepalive_interval", limits.keepalive_interval),
            ("keepalive_timeout", limits.keepalive_timeout),
        ];
        for (name, d) in durations {
            if d.is_zero() {
                problems.push(format!("limits.{name}: must be above zero"));
            }
        }
        limits
    }

    /// `max_connections` per port, lowered so that `ports` full ports
    /// leave [`FD_HEADROOM`] descriptors of `fd_limit` free.
    pub fn connections_within(&self, fd_limit: u64, ports: usize) -> usize {
        let room = (fd_limit as usize).saturating_sub(FD_HEADROOM) / ports.max(1);
        self.max_connections.min(room.max(16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let mut problems = Vec::new();
        assert_eq!(
            Limits::from_raw(&RawLimits::default(), &mut problems),
            Limits::default()
        );
        assert!(problems.is_empty());
        let raw = RawLimits {
            max_connections: Some(0),
            idle_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        Limits::from_raw(&raw, &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn connections_leave_headroom_below_the_fd_limit() {
        let l = Limits::default();
        assert_eq!(l.connections_within(1 << 20, 2), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(l.connections_within(4096, 1), 4096 - FD_HEADROOM);
        assert_eq!(l.connections_within(4096, 2), (4096 - FD_HEADROOM) / 2);
        assert_eq!(l.connections_within(100, 1), 16);
    }
}
