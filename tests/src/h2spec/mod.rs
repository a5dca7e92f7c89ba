//! The server test cases of h2spec (github.com/summerwind/h2spec: `http2/`,
//! `hpack/` and `generic/`, 147 cases with the one `--strict` case), ported
//! case by case to run against any plaintext HTTP/2 server: the agent, and
//! nghttpd as the reference that keeps the port honest.
//!
//! Each case keeps h2spec's id (`http2/5.1/1`: the section's group and the
//! case's place in it), its frames and its verdict (see [`verify`]): a
//! connection error passes on GOAWAY with the expected code or on the
//! connection closing, a stream error also on RST_STREAM with the code, and
//! a wait that times out fails. The frames are written and read by this
//! module ([`frame`]), and header blocks encoded by `loona-hpack`, never by
//! the agent's codec.
//!
//! One deliberate difference: the cases that need a response carrying DATA
//! (flow control: `http2/5.1.2/1`, `http2/6.5.3/1`, `http2/6.9.1/1`,
//! `http2/6.9.2/1`, `http2/6.9.2/2`, `generic/2/2`, `generic/2/3`) send the
//! target's [`DataRequest`]: a GET for a web server as h2spec does, a unary
//! gRPC call with an empty message for a gRPC server, whose answer to a
//! GET is trailers-only.
//!
//! Cases run on connections of their own, several at once, so a failing
//! case costs one timeout of wall time shared with the others.

pub mod conn;
pub mod frame;
pub mod verify;

mod generic_s1_s3;
mod generic_s4_s5;
mod hpack;
mod http2_s3_s4;
mod http2_s5;
mod http2_s6_1_to_5;
mod http2_s6_7_to_10;
mod http2_s7_s8;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use conn::{Conn, DataRequest, Target};

/// Why a case did not pass.
#[derive(Clone, Debug)]
pub enum Failure {
    /// The server answered otherwise than the case requires.
    Mismatch {
        expected: Vec<String>,
        actual: String,
    },
    /// The case does not apply to this server (h2spec's `ErrSkipped`).
    Skipped(String),
    /// The case could not run: no connection, no handshake.
    Broken(String),
}

/// What a case's run returns.
pub type Verdict = Result<(), Failure>;

/// One conformance case.
pub struct Case {
    /// h2spec's id, e.g. `http2/5.1/1`.
    pub id: String,
    /// h2spec's description.
    pub desc: &'static str,
    run: fn(&mut Conn) -> Verdict,
}

/// Every case, in h2spec's order.
pub fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    http2_s3_s4::register(&mut all);
    http2_s5::register(&mut all);
    http2_s6_1_to_5::register(&mut all);
    http2_s6_7_to_10::register(&mut all);
    http2_s7_s8::register(&mut all);
    hpack::register(&mut all);
    generic_s1_s3::register(&mut all);
    generic_s4_s5::register(&mut all);
    all
}

/// The cases of one h2spec group, numbered in the order they are added.
pub(crate) struct Group<'a> {
    all: &'a mut Vec<Case>,
    prefix: &'static str,
    next: usize,
}

/// Starts the group `prefix` (e.g. `http2/5.1`).
pub(crate) fn group<'a>(all: &'a mut Vec<Case>, prefix: &'static str) -> Group<'a> {
    Group {
        all,
        prefix,
        next: 1,
    }
}

impl Group<'_> {
    /// Adds the group's next case.
    pub(crate) fn case(&mut self, desc: &'static str, run: fn(&mut Conn) -> Verdict) -> &mut Self {
        self.all.push(Case {
            id: format!("{}/{}", self.prefix, self.next),
            desc,
            run,
        });
        self.next += 1;
        self
    }
}

/// How one case went against one server.
#[derive(Clone, Debug)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

impl Outcome {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Pass)
    }

    /// One word for the table.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "FAIL",
            Outcome::Skip(_) => "skip",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Pass => write!(f, "pass"),
            Outcome::Fail(why) => write!(f, "FAIL: {why}"),
            Outcome::Skip(why) => write!(f, "skip: {why}"),
        }
    }
}

fn outcome(verdict: Verdict) -> Outcome {
    match verdict {
        Ok(()) => Outcome::Pass,
        Err(Failure::Mismatch { expected, actual }) => {
            Outcome::Fail(format!("expected {}; got {actual}", expected.join(" or ")))
        }
        Err(Failure::Skipped(why)) => Outcome::Skip(why),
        Err(Failure::Broken(why)) => Outcome::Fail(why),
    }
}

/// Runs every case against `target`, `parallel` at a time, each on a
/// connection of its own; the outcomes in the order of `cases`.
pub fn run(cases: &[Case], target: &Target, parallel: usize) -> Vec<Outcome> {
    let target = Arc::new(target.clone());
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Outcome>> = vec![None; cases.len()];
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..parallel)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(case) = cases.get(i) else { break };
                        let verdict = match Conn::dial(target.clone()) {
                            Ok(mut conn) => (case.run)(&mut conn),
                            Err(e) => Err(Failure::Broken(format!("connect: {e}"))),
                        };
                        mine.push((i, outcome(verdict)));
                    }
                    mine
                })
            })
            .collect();
        for w in workers {
            for (i, o) in w.join().expect("a case panicked") {
                results[i] = Some(o);
            }
        }
    });
    results
        .into_iter()
        .map(|o| o.expect("every case ran"))
        .collect()
}

/// The table of outcomes: one row per case, one column per server, then
/// each failure's detail.
pub fn table(cases: &[Case], columns: &[(&str, &[Outcome])]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = write!(out, "{:<18}", "case");
    for (name, _) in columns {
        let _ = write!(out, " {name:<8}");
    }
    let _ = writeln!(out, " description");
    for (i, case) in cases.iter().enumerate() {
        let _ = write!(out, "{:<18}", case.id);
        for (_, outcomes) in columns {
            let _ = write!(out, " {:<8}", outcomes[i].word());
        }
        let _ = writeln!(out, " {}", case.desc);
    }
    for (name, outcomes) in columns {
        let passed = outcomes.iter().filter(|o| o.passed()).count();
        let _ = writeln!(out, "\n{name}: {passed} of {} passed", cases.len());
        for (case, o) in cases.iter().zip(outcomes.iter()) {
            if !o.passed() {
                let _ = writeln!(out, "  {} {o}", case.id);
            }
        }
    }
    out
}
