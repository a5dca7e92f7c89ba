//! What a worker's error status means, to the caller and to the worker's
//! sentinel: the one place the serving paths (pass-through, the tonic
//! service, streams) turn a worker's failure into what the caller sees.

use infermesh_sentinel::FaultPatterns;
use tonic::{Code, Status};

use crate::error::AgentError;
use crate::worker::inbox::Reporter;
use crate::worker::state::Worker;

/// A worker's error as the caller sees it: its own statuses pass through; a
/// broken connection becomes UNAVAILABLE naming the worker, so clients retry
/// elsewhere.
pub(crate) fn worker_status(worker: &Worker, s: Status) -> Status {
    // A status the worker sent has no source error; one tonic made from a
    // broken connection does, whatever its code (UNKNOWN for a reset body,
    // INTERNAL for an h2 stream reset while the worker is being killed).
    let from_transport = std::error::Error::source(&s).is_some();
    if s.code() == Code::Unavailable || from_transport {
        AgentError::WorkerUnreachable {
            worker: worker.id().to_string(),
            reason: s.message().to_string(),
        }
        .into()
    } else {
        s
    }
}

/// The answer to a request whose worker the sentinel gave up on (it stopped
/// answering): UNAVAILABLE, so the caller retries elsewhere at once.
pub(crate) fn aborted(worker: &str) -> Status {
    AgentError::WorkerUnreachable {
        worker: worker.to_string(),
        reason: crate::supervision::supervisor::ABORTED.into(),
    }
    .into()
}

/// Tells a worker's sentinel about an internal error it answered, and
/// decides what the caller sees. An error naming a fatal GPU fault (the
/// worker's CUDA context is gone, e.g. Triton after an illegal address) is
/// reported as a fault and answered UNAVAILABLE, so the client retries
/// elsewhere; other internal errors count towards the error burst.
pub(crate) fn judge_worker_status(
    reporter: &Reporter,
    pid: u32,
    patterns: &FaultPatterns,
    status: Status,
) -> Status {
    if !matches!(status.code(), Code::Internal | Code::Unknown) {
        return status;
    }
    match patterns.find(status.message()) {
        Some(pattern) => {
            reporter.fault_line(pid, pattern, status.message());
            Status::unavailable(format!("worker failed: {}", status.message()))
        }
        None => {
            reporter.request_error(pid);
            status
        }
    }
}
