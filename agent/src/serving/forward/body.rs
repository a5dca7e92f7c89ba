//! [`ForwardBody`]: a worker's answer on its way to the caller, passed
//! through frame by frame. When it ends, the worker permit is freed, a
//! worker's internal error is judged ([`crate::serving::worker_status`]), the
//! request is recorded and the load report added to the trailers.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use infermesh_sentinel::FaultPatterns;
use tonic::{Code, Status};

use crate::dispatch::pool::{Lease, Pool, Ticket};
use crate::error::AgentError;
use crate::metrics::ModelMetrics;
use crate::serving::load_report::add_report;
use crate::serving::worker_status::judge_worker_status;
use crate::worker::inbox::Reporter;

/// The code of the `grpc-status` in `map` (a worker's trailers, or the
/// headers of a trailers-only answer); `None` when it is missing, and
/// `Unknown` when it is not a code, as tonic reads it. Read directly:
/// building a `Status` (message, details) for every answer cost as much as
/// the rest of the agent's handling of the trailers.
pub(super) fn grpc_code(map: &HeaderMap) -> Option<Code> {
    // A name made once, as `header_timeout`'s.
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    Some(Code::from_bytes(map.get(GRPC_STATUS)?.as_bytes()))
}

/// What is left to do when the worker's answer ends.
pub(super) struct Done {
    /// The request's trace span (none unless tracing), open until the end.
    pub(super) span: tracing::Span,
    pub(super) lease: Option<Lease>,
    pub(super) ticket: Option<Ticket>,
    pub(super) metrics: Arc<ModelMetrics>,
    pub(super) started: Instant,
    pub(super) reporter: Reporter,
    pub(super) pid: u32,
    pub(super) patterns: Arc<FaultPatterns>,
    pub(super) pool: Arc<Pool>,
}

impl Done {
    /// Frees the permit, reports worker errors, records the request, and
    /// writes the final status (maybe rewritten) and the load report into
    /// `trailers`. `answered`: the status is the worker's, not one the
    /// agent made up because the worker's answer broke off.
    pub(super) fn finish(&mut self, trailers: &mut HeaderMap, code: Code, answered: bool) {
        match (self.lease.as_mut(), code) {
            (Some(lease), Code::Ok) => lease.served(),
            (Some(lease), _) if answered => lease.answered(),
            _ => {}
        }
        self.lease = None;
        self.ticket = None;
        // Only an internal error is judged (a GPU fault?): the status with
        // its message is built for that case alone, not for every answer.
        let code = if matches!(code, Code::Internal | Code::Unknown) {
            let status = Status::from_header_map(trailers).unwrap_or_else(|| Status::new(code, ""));
            let judged = judge_worker_status(&self.reporter, self.pid, &self.patterns, status);
            if judged.code() != code {
                for key in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
                    trailers.remove(key);
                }
                let _ = judged.add_header(trailers);
            }
            judged.code()
        } else {
            code
        };
        self.metrics.request(code, self.started.elapsed());
        if !self.span.is_none() {
            let _in = self.span.enter();
            crate::trace::record("outcome", &format_args!("{code:?}"));
        }
        add_report(&self.pool, trailers);
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.ticket.is_some() {
            // The caller went away before the worker answered.
            self.metrics
                .request(Code::Cancelled, self.started.elapsed());
            if !self.span.is_none() {
                let _in = self.span.enter();
                crate::trace::record("outcome", &"Cancelled");
            }
        }
    }
}

/// A worker's response body on its way to the caller.
pub struct ForwardBody {
    pub(super) exchange: crate::worker::upstream::Exchange,
    pub(super) done: Option<Done>,
}

impl ForwardBody {
    fn end(&mut self, mut trailers: HeaderMap, code: Code, answered: bool) -> Frame<Bytes> {
        if let Some(mut done) = self.done.take() {
            done.finish(&mut trailers, code, answered);
        }
        Frame::trailers(trailers)
    }

    fn failed(&mut self, why: String) -> Frame<Bytes> {
        let status: Status = AgentError::WorkerUnreachable {
            worker: format!("pid {}", self.done.as_ref().map_or(0, |d| d.pid)),
            reason: why,
        }
        .into();
        let mut trailers = HeaderMap::new();
        let _ = status.add_header(&mut trailers);
        self.end(trailers, status.code(), false)
    }
}

impl Body for ForwardBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.done.is_none() {
            return Poll::Ready(None);
        }
        let frame = match ready!(this.exchange.poll_data(cx)) {
            Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
            Ok(None) => match this.exchange.trailers() {
                Some(trailers) => match grpc_code(&trailers) {
                    Some(code) => this.end(trailers, code, true),
                    None => this.failed("the worker's response ended without a gRPC status".into()),
                },
                None => this.failed("the worker's response ended without trailers".into()),
            },
            Err(e) => this.failed(e.to_string()),
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done.is_none()
    }
}
