//! The invariants of a server run, checked after every step, and the end
//! of a run (see the parent module's doc).

use std::time::Duration;

use super::super::wire::{self, Seen};
use super::{Handler, Run, response_byte};

impl Run {
    /// Reads what the connection wrote since the last look, with the
    /// client's model of it.
    pub(super) fn observe(&mut self) {
        let all = self.peek_out();
        let new = &all[self.out_seen..];
        self.out_seen = all.len();
        self.written += new.len() as u64;
        if self.failed_at_written.is_some_and(|at| self.written > at) {
            // Output after the failure is allowed only to finish what was
            // queued at that moment (the GOAWAY), which `at` counts.
            panic!(
                "{} bytes written after the connection failed",
                self.written - self.failed_at_written.unwrap()
            );
        }
        let seen = self
            .out
            .read(new)
            .unwrap_or_else(|e| panic!("invalid output: {e}"));
        for s in seen {
            if std::env::var_os("HARNESS_TRACE").is_some() {
                let text = format!("{s:?}");
                eprintln!("  wrote {}", &text[..text.len().min(160)]);
            }
            self.seen(s);
        }
        self.out.end_step();
    }

    fn seen(&mut self, seen: Seen) {
        match seen {
            Seen::Block {
                stream,
                fields,
                end_stream,
                first,
            } => {
                let s = self.streams.entry(stream).or_default();
                if first && matches!(s.handler, Handler::Pending | Handler::Never) {
                    // Answered by the connection itself: too large a head.
                    let status = fields.iter().find(|(n, _)| n == b"grpc-status");
                    assert!(
                        end_stream && status.is_some_and(|(_, v)| v == b"8"),
                        "stream {stream} answered unasked: {fields:?}"
                    );
                }
            }
            Seen::Data { stream, data, .. } => {
                let s = self.streams.entry(stream).or_default();
                for (k, b) in data.iter().enumerate() {
                    assert_eq!(
                        *b,
                        response_byte(stream, s.data_out + k as u64),
                        "stream {stream} response byte {}",
                        s.data_out + k as u64
                    );
                }
                s.data_out += data.len() as u64;
                assert!(
                    s.data_out <= s.given,
                    "stream {stream}: {} bytes written of {} given",
                    s.data_out,
                    s.given
                );
            }
            Seen::Reset { stream, code } => {
                if self.polite {
                    let allowed = [wire::REFUSED_STREAM, wire::CANCEL, wire::NO_ERROR];
                    assert!(
                        allowed.contains(&code) || self.handler_resets.contains(&code),
                        "a well-behaved client's stream {stream} reset with {code:#x}"
                    );
                }
            }
            Seen::GoAway { last, code } => {
                assert!(
                    !self.polite || code == wire::NO_ERROR,
                    "a well-behaved client failed with {code:#x}"
                );
                assert!(
                    code != wire::NO_ERROR || self.server_go_away,
                    "GOAWAY NO_ERROR unasked"
                );
                self.goaway_seen = Some(last);
            }
            Seen::WindowUpdate { stream, increment } => {
                *self.server_granted.entry(stream).or_default() += i64::from(increment);
            }
            Seen::Settings(values) => {
                for (id, v) in values {
                    match id {
                        wire::INITIAL_WINDOW_SIZE => self.server_initial = i64::from(v),
                        wire::MAX_CONCURRENT_STREAMS => self.server_max_streams = v,
                        _ => {}
                    }
                }
            }
            Seen::Ping {
                ack: false,
                payload,
            } if self.polite => {
                self.stage(
                    wire::PING,
                    wire::ACK,
                    0,
                    &payload,
                    super::peer::Mark::Nothing,
                );
            }
            Seen::SettingsAck | Seen::Ping { .. } => {}
        }
    }

    /// Streams whose handler may still run, or whose handler finished
    /// but whose response is neither written whole nor reset.
    fn possibly_open(&self) -> usize {
        self.streams
            .iter()
            .filter(|(id, s)| match s.handler {
                Handler::Pending | Handler::Running => true,
                Handler::Finished => !(s.reset_in || self.out.is_done(**id)),
                Handler::Unopened | Handler::Never => false,
            })
            .count()
    }

    /// Every invariant that holds between steps.
    pub(super) fn check(&mut self) {
        self.observe();
        let failed = self.conn.failed().is_some();
        if failed && self.failed_at_written.is_none() {
            self.failed_at_written = Some(self.written);
        }
        let open = self.conn.open_streams();
        assert!(
            open <= self.limits.max_concurrent_streams as usize,
            "{open} streams open, over the limit of {}",
            self.limits.max_concurrent_streams
        );
        if !failed {
            let possible = self.possibly_open();
            assert!(
                self.lost || open <= possible,
                "{open} streams open, of which only {possible} may be: {:?}",
                self.streams
            );
            let queued: u64 = self.streams.keys().map(|id| self.model_queued(*id)).sum();
            assert_eq!(
                self.conn.queued() as u64,
                queued,
                "queued(): {:?}",
                self.streams
            );
            let per_stream = self.limits.stream_send_buffer as u64 + 70_000;
            for id in self.streams.keys() {
                assert!(
                    self.model_queued(*id) <= per_stream,
                    "stream {id} queued past its buffer"
                );
            }
            assert_eq!(
                self.conn.is_backlogged(),
                self.conn.queued() > self.limits.connection_send_buffer
            );
        } else {
            assert_eq!(self.conn.queued(), 0, "bytes queued on a failed connection");
            assert!(
                self.conn.accept().is_none(),
                "a request accepted after the connection failed"
            );
        }
        assert!(
            self.written <= self.budget,
            "{} bytes written for {} allowed by what was read and handed in",
            self.written,
            self.budget
        );
        if self.polite {
            assert_eq!(
                self.conn.failed(),
                None,
                "a well-behaved client's connection failed"
            );
        }
    }

    /// Every handler finishes, the client reads and opens its windows
    /// (`polite`) and the send timeout passes: no stream is left.
    pub(super) fn finish(mut self) {
        let wake = &mut Vec::new();
        self.deliver(self.staged.len());
        self.check();
        self.accept();
        let running: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.handler == Handler::Running)
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            let s = &self.streams[&id];
            if !s.head_sent {
                self.send_head(id, false);
            }
            self.send_end(id, true, wake);
            self.conn.finish(id, wake);
            self.budget += 100;
            self.streams.get_mut(&id).unwrap().handler = Handler::Finished;
            self.check();
        }
        if self.polite {
            self.read_out(usize::MAX);
            self.open_windows();
            self.deliver(self.staged.len());
            self.check();
            // The client reads until every response has left.
            for _ in 0..10_000 {
                if self.conn.queued() == 0 {
                    break;
                }
                self.read_out(usize::MAX);
                self.check();
            }
        }
        let wait =
            self.limits.send_timeout + self.limits.goaway_ping_timeout + Duration::from_secs(1);
        self.advance(wait);
        self.read_out(usize::MAX);
        self.check();
        if self.conn.failed().is_some() {
            return;
        }
        assert_eq!(
            self.conn.open_streams(),
            0,
            "streams outlived their handlers and responses: {:?}",
            self.streams
        );
        assert_eq!(self.conn.queued(), 0);
        if self.polite {
            let last = self.goaway_seen.unwrap_or(u32::MAX);
            for (id, s) in &self.streams {
                if s.handler == Handler::Unopened || *id > last {
                    continue;
                }
                assert!(
                    self.out.is_done(*id) || s.client_reset,
                    "stream {id} never answered: {s:?}"
                );
            }
        }
    }

    /// A well-behaved client grants what every response still needs.
    fn open_windows(&mut self) {
        let need: Vec<(u32, i64)> = self
            .streams
            .keys()
            .map(|id| (*id, self.model_queued(*id) as i64))
            .filter(|(_, n)| *n > 0)
            .collect();
        let total: i64 = need.iter().map(|(_, n)| n).sum();
        let (_, conn) = self.out.windows(0);
        if conn < total {
            let inc = (total - conn).min(wire::MAX_WINDOW - conn);
            self.stage(
                wire::WINDOW_UPDATE,
                0,
                0,
                &(inc as u32).to_be_bytes(),
                super::peer::Mark::Grants(vec![wire::Grant::Window {
                    stream: 0,
                    increment: inc,
                }]),
            );
        }
        for (id, n) in need {
            let (sw, _) = self.out.windows(id);
            if sw < n {
                let inc = (n - sw).min(wire::MAX_WINDOW - sw);
                self.stage(
                    wire::WINDOW_UPDATE,
                    0,
                    id,
                    &(inc as u32).to_be_bytes(),
                    super::peer::Mark::Grants(vec![wire::Grant::Window {
                        stream: id,
                        increment: inc,
                    }]),
                );
            }
        }
    }
}
