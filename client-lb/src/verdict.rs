//! How the retry layer reads a failed attempt's status: whether the node
//! answered it (and what the answer says about the node) or the connection
//! failed under it, and so whether another node gets the request.
//!
//! An agent writes its load report (`infermesh-inflight`, ...) into every
//! status it sends, in the trailers or in the headers of a trailers-only
//! answer (`infermesh_proto::load`); tonic keeps them in the status's
//! metadata, the QUIC rung puts them there too. A status without one never
//! came from an agent: it is tonic's or h2's account of a connection that
//! failed under the call. With the cause in its source chain that is plain;
//! but tonic also makes statuses of a failing stream *without* a source —
//! INTERNAL "Unexpected EOF decoding stream." or "Missing response
//! message." when the stream ends early, `From<io::Error>` statuses
//! (INTERNAL/UNKNOWN "broken pipe"), codes mapped from an h2 reset. They
//! were once taken for the node's own answer and ended the call (issue 24:
//! 3 of 26,742 requests of `client_fleet::sigstopped_agent_under_load_fails_no_request`
//! ended UNKNOWN "BrokenPipe" beside a healthy node). `ModelInfer` is
//! idempotent, so a request that may not have run, or ran on a node that
//! then could not answer, is sent elsewhere within the retry budget and
//! the deadline.

use infermesh_proto::load::LoadReport;
use tonic::{Code, Status};

use crate::balancer::Outcome;

/// What the retry layer does with a failed attempt.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Try another node (spends an attempt and the retry budget).
    Retry(Status),
    /// The node does not have the model: try another node for free.
    ModelMissing(Status),
    /// The attempt ran past its deadline.
    TimedOut,
    /// Give up with this error.
    Fatal(Status),
}

/// How `status`, the failure of one attempt, counts for its node and what
/// the call does next.
pub(crate) fn classify(status: Status) -> (Outcome, Verdict) {
    // A status the node sent has no source. tonic reports its own
    // enforcement of the attempt's gRPC deadline as CANCELLED with
    // `TimeoutExpired` in the source chain: a timeout like ours. Any other
    // source is a connection that broke or could not be made (the node
    // died, or hangs and the connect timed out), reported as UNKNOWN or
    // CANCELLED: inference requests are safe to run again, so it is
    // retried like a refused connection.
    let (timed_out, broken) = match std::error::Error::source(&status) {
        None => (false, false),
        Some(source) => (caused_by::<tonic::TimeoutExpired>(source), true),
    };
    let from_agent = LoadReport::sent_in(status.metadata());
    match status.code() {
        _ if timed_out => (Outcome::TimedOut, Verdict::TimedOut),
        _ if broken => (Outcome::Failure, Verdict::Retry(connection_failed(&status))),
        // Down, unreachable or restarting its worker: retry elsewhere.
        Code::Unavailable => (Outcome::Failure, Verdict::Retry(status)),
        // Full: retry elsewhere, but it is healthy.
        Code::ResourceExhausted => (Outcome::Neutral, Verdict::Retry(status)),
        // The node does not have the model: says nothing about its health.
        Code::NotFound => (Outcome::Neutral, Verdict::ModelMissing(status)),
        // The node gave up on the attempt's deadline: a timeout.
        Code::DeadlineExceeded => (Outcome::TimedOut, Verdict::TimedOut),
        // The agent or its worker failed the request: final.
        Code::Internal | Code::Unknown | Code::Cancelled if from_agent => {
            (Outcome::Failure, Verdict::Fatal(status))
        }
        // No agent said so: the connection failed under the call.
        Code::Internal | Code::Unknown | Code::Cancelled => {
            (Outcome::Failure, Verdict::Retry(connection_failed(&status)))
        }
        // The caller's mistake: says nothing about the node.
        _ => (Outcome::Neutral, Verdict::Fatal(status)),
    }
}

/// A connection that broke or could not be made, as gRPC's own clients
/// report it: UNAVAILABLE, the message naming the cause. tonic reports it as
/// UNKNOWN "transport error" with the cause (a refused TLS handshake, a
/// reset connection) only in the source chain, which callers in other
/// languages never see.
pub(crate) fn connection_failed(status: &Status) -> Status {
    let mut message = status.message().to_string();
    for e in chain(std::error::Error::source(status)).take(8) {
        infermesh_proto::causes::append(&mut message, &e.to_string());
    }
    Status::unavailable(message)
}

/// Whether `error` or one of its sources is an `E`.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(Some(error)).any(|e| e.is::<E>())
}

/// `first` and its sources, at most 16: error chains are short, and a cycle
/// must not hang the caller.
fn chain<'a>(
    first: Option<&'a (dyn std::error::Error + 'static)>,
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(first, |e| e.source()).take(16)
}

#[cfg(test)]
mod tests {
    use infermesh_proto::load::LoadReport;

    use super::*;

    /// `status` as an agent sends it: with its load report.
    fn from_agent(mut status: Status) -> Status {
        LoadReport {
            in_flight: 3,
            queued: 0,
            busy_ratio: 0.5,
            weight: 1.0,
        }
        .write_to(status.metadata_mut());
        status
    }

    fn is_retry(v: &Verdict) -> bool {
        matches!(v, Verdict::Retry(_))
    }

    /// Finding (issue 24): `client_fleet::sigstopped_agent_under_load_fails_no_request`
    /// lost 3 of 26,742 requests as UNKNOWN "BrokenPipe". A status that
    /// tonic or h2 made of a failing connection without keeping the cause
    /// carries no load report: no agent answered it, so the request goes
    /// to another node like any broken connection's.
    #[test]
    fn a_failure_no_agent_answered_is_retried_elsewhere() {
        for status in [
            Status::unknown("BrokenPipe"),
            Status::internal("h2 protocol error: error reading a body from connection"),
            Status::internal("Unexpected EOF decoding stream."),
            Status::internal("Missing response message."),
            Status::cancelled("h2 protocol error: stream error received: operation was canceled"),
        ] {
            let code = status.code();
            let (outcome, verdict) = classify(status);
            assert_eq!(outcome, Outcome::Failure, "{code:?}");
            match verdict {
                Verdict::Retry(s) => assert_eq!(s.code(), Code::Unavailable, "{code:?}"),
                other => panic!("{code:?} without a load report: {other:?}"),
            }
        }
    }

    /// What an agent (or its worker, through it) really answered stays as
    /// it was: an internal error is final and counts against the node; the
    /// caller's mistake says nothing about it.
    #[test]
    fn what_an_agent_answered_keeps_its_meaning() {
        for code in [Code::Internal, Code::Unknown, Code::Cancelled] {
            let (outcome, verdict) = classify(from_agent(Status::new(code, "worker failed")));
            assert_eq!(outcome, Outcome::Failure);
            assert!(
                matches!(verdict, Verdict::Fatal(ref s) if s.code() == code),
                "{verdict:?}"
            );
        }
        let (outcome, verdict) = classify(from_agent(Status::invalid_argument("bad shape")));
        assert_eq!(outcome, Outcome::Neutral);
        assert!(matches!(verdict, Verdict::Fatal(_)));
        let (outcome, verdict) = classify(from_agent(Status::unavailable("no worker")));
        assert_eq!(outcome, Outcome::Failure);
        assert!(is_retry(&verdict));
        let (outcome, verdict) = classify(from_agent(Status::resource_exhausted("full")));
        assert_eq!(outcome, Outcome::Neutral);
        assert!(is_retry(&verdict));
        // A request the agent shed for its tenant's rate or priority: the
        // same, whatever retry hint (gRPC's pushback) it carries.
        let mut shed =
            Status::resource_exhausted("shed for a higher-priority one; retry elsewhere");
        shed.metadata_mut()
            .insert("grpc-retry-pushback-ms", "40".parse().unwrap());
        let (outcome, verdict) = classify(from_agent(shed));
        assert_eq!(outcome, Outcome::Neutral);
        assert!(is_retry(&verdict));
        let (_, verdict) = classify(from_agent(Status::not_found("no model")));
        assert!(matches!(verdict, Verdict::ModelMissing(_)));
        let (outcome, verdict) = classify(from_agent(Status::deadline_exceeded("late")));
        assert_eq!(outcome, Outcome::TimedOut);
        assert!(matches!(verdict, Verdict::TimedOut));
    }

    /// A status with a cause in its source chain is a connection that broke
    /// (retried as UNAVAILABLE naming the cause), or tonic's own deadline.
    #[test]
    fn a_status_with_a_source_is_a_broken_connection_or_a_timeout() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let (outcome, verdict) = classify(Status::from_error(Box::new(io)));
        assert_eq!(outcome, Outcome::Failure);
        match verdict {
            Verdict::Retry(s) => {
                assert_eq!(s.code(), Code::Unavailable);
                assert!(s.message().contains("broken pipe"), "{}", s.message());
            }
            other => panic!("{other:?}"),
        }
        // tonic's `TimeoutExpired` is not constructible outside tonic; a
        // timed-out tonic call is covered by `tests/attempt_timeout.rs`.
    }
}
