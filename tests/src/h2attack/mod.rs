//! The HTTP/2 attacks of issue 24, as a library the cross-process tests
//! (`tests/tests/h2_attacks.rs`) and the `h2-attack` binary of
//! `scripts/h2-attacks.sh` share: reset-before-handler, zero-window
//! readers, rapid reset (plain and interleaved with requests the server
//! answers itself), MadeYouReset (CVE-2025-8671: frames that make the
//! *server* reset streams), CONTINUATION floods (CVE-2024-27316, empty
//! frames included), SETTINGS/PING/empty-DATA floods from a client that
//! does not read, a client that does not read its answer, and (issue 27)
//! large requests whose bodies trickle once forwarded.
//!
//! Each attack runs against an agent (gRPC requests) or a web server such
//! as nghttpd (GETs), within a [`Budget`], and returns a [`Report`] of what
//! the server did: when it sent GOAWAY (and with which code, after how many
//! streams and frames), when it closed, what it reset.

mod attacks;
pub mod good;
pub mod process;
mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

pub use attacks::{Attack, TRICKLE_EVERY, Trickle, describe, exchange};
pub use server::{Call, Server};
pub use wire::{Answer, Flow, GoAway, Options, Seen, Wire};

use crate::h2spec::frame::code_name;

/// How far an attack goes: it stops at the first limit reached, or when the
/// server ends the connection.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub duration: Duration,
    pub max_streams: u64,
    pub max_frames: u64,
}

impl Budget {
    /// A budget of `duration` with no count limit (the script's).
    pub fn for_duration(duration: Duration) -> Budget {
        Budget {
            duration,
            max_streams: u64::MAX,
            max_frames: u64::MAX,
        }
    }
}

/// What one attack saw the server do.
#[derive(Clone, Debug)]
pub struct Report {
    pub attack: &'static str,
    pub seconds: f64,
    pub streams: u64,
    pub frames: u64,
    pub goaway: Option<GoAway>,
    pub closed: Option<Duration>,
    /// RST_STREAM frames the server sent, by code.
    pub resets: BTreeMap<u32, u64>,
    /// Streams that got response headers.
    pub answered: usize,
    /// Time the attacker's writes waited for the server to read.
    pub blocked: Duration,
    /// What the attack itself observed (e.g. the follow-up request's answer).
    pub note: String,
}

impl Report {
    /// Whether the server sent GOAWAY with `code`.
    pub fn goaway_with(&self, code: u32) -> bool {
        self.goaway.is_some_and(|g| g.code == code)
    }

    /// One JSON object (the script's table is made of these).
    pub fn json(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"attack\":\"{}\",\"seconds\":{:.3},\"streams\":{},\"frames\":{},",
            self.attack, self.seconds, self.streams, self.frames
        );
        match &self.goaway {
            Some(g) => {
                let _ = write!(
                    s,
                    "\"goaway\":{{\"code\":\"{}\",\"at_s\":{:.3},\"streams_sent\":{},\"frames_sent\":{},\"last_stream\":{}}},",
                    code_name(g.code),
                    g.at.as_secs_f64(),
                    g.streams_sent,
                    g.frames_sent,
                    g.last_stream
                );
            }
            None => s.push_str("\"goaway\":null,"),
        }
        match self.closed {
            Some(c) => {
                let _ = write!(s, "\"closed_at_s\":{:.3},", c.as_secs_f64());
            }
            None => s.push_str("\"closed_at_s\":null,"),
        }
        s.push_str("\"resets\":{");
        let resets: Vec<String> = self
            .resets
            .iter()
            .map(|(c, n)| format!("\"{}\":{n}", code_name(*c)))
            .collect();
        s.push_str(&resets.join(","));
        let _ = write!(
            s,
            "}},\"answered\":{},\"blocked_s\":{:.3},\"note\":\"{}\"}}",
            self.answered,
            self.blocked.as_secs_f64(),
            self.note.replace('\\', "\\\\").replace('"', "\\\"")
        );
        s
    }
}

/// Runs `attack` against the server at `addr`: connects with the attack's
/// options, drives it within `budget`, holds what it holds until the
/// budget's time is up (or the server ends the connection), then reads what
/// the server said last.
pub fn run(attack: Attack, addr: SocketAddr, server: Server, budget: Budget) -> Report {
    let mut wire = Wire::connect(addr, &attack.options()).expect("connect to the server");
    let note = attack.drive(&mut wire, server, budget);
    if attack.holds() {
        let left = budget.duration.saturating_sub(wire.elapsed());
        wire.wait_for(left, Seen::over);
    }
    report(attack, &mut wire, note)
}

/// The report of an attack driven by hand on `wire` (resumes reading to
/// catch a GOAWAY the server sent while the attacker did not read).
pub fn report(attack: Attack, wire: &mut Wire, note: String) -> Report {
    wire.pause_reading(false);
    let _ = wire.flush();
    // Until the reader has read to the end (a GOAWAY may sit before it).
    wire.wait_for(Duration::from_secs(2), |s| s.closed.is_some());
    let seconds = wire.elapsed().as_secs_f64();
    let (streams, frames, blocked) = (wire.streams(), wire.frames(), wire.blocked);
    wire.seen(|seen| Report {
        attack: attack.name(),
        seconds,
        streams,
        frames,
        goaway: seen.goaway,
        closed: seen.ended(),
        resets: seen.resets.clone(),
        answered: seen.answered(),
        blocked,
        note,
    })
}
