//! The hot path: `ModelInfer` passed through as the bytes that arrived.
//!
//! A plain inline request (no shared-memory or RDMA parameters) is read
//! (bounded by `max_message_bytes`, a node-wide receive budget taken for
//! the size its gRPC header declares, and a read timeout) as the DATA
//! frames it came in. One frame is decoded once into a view whose tensor
//! bytes are slices of it; several (a large request) are read where they
//! lie ([`crate::serving::request_view`]: the fields but the tensors
//! decoded, the tensors' sizes noted, nothing gathered). It is validated
//! against the model's metadata, and — once it holds a worker permit — the
//! *received frames* are sent to the worker on its HTTP/2 connection
//! ([`crate::worker::upstream`]), with the caller's metadata and what is
//! left of its deadline. A large request is *cut through*: once its head
//! is here and the rest of the message is its last tensor's bytes, it is
//! validated and sent with what has arrived, and each later frame follows
//! as it comes (docs/DECISIONS.md); one whose body stops coming (not all
//! here `limits.cut_through_grace` after its head, extended while it
//! arrives at 1 MiB/s or faster) is demoted — its worker slot given back
//! (or its place in the queue), the rest read whole, then queued again
//! (`forward/cut_through.rs`). The worker's response headers and body
//! go back unchanged; only the trailers are touched: the load report is
//! added, and an internal error that names a GPU fault is turned into
//! UNAVAILABLE (so clients retry elsewhere) and reported to the worker's
//! sentinel. The worker permit is freed when the answer's trailers are read
//! off the worker's connection: at once for an answer that fits in the
//! caller's flow-control windows plus the stream's send buffer
//! (`stream_send_buffer`, 4 MiB; see `server::connection::pipe`), otherwise
//! only as the caller reads — a caller that stops reading a larger answer
//! holds its worker's permit until the send timeout resets the stream.
//!
//! Requests with shared-memory or RDMA parameters need their tensors
//! rewritten; they go through [`Front::infer_decoded`] instead, and so do
//! their responses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use infermesh_proto::inference::ModelInferRequest;
use infermesh_proto::tensor::{validate_request, validate_request_sizes};
use infermesh_sentinel::FaultPatterns;
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Code, Status};
use tracing::Instrument;

use crate::dispatch::pool::{Lease, Pool, Ticket};
use crate::error::AgentError;
use crate::metrics::{Metrics, TransportPath};
use crate::serving::deadline::header_timeout;
use crate::serving::front::Front;
use crate::serving::front_body::FrontBody;
use crate::serving::grpc::{self, FRAME_HEADER, message_response, status_response};
use crate::transports::conn::ConnInfo;
use crate::worker::upstream::Metadata;

pub(crate) mod body;
mod cut_through;
mod incoming;

pub use body::ForwardBody;
use body::{Done, grpc_code};
use cut_through::{Queued, Sent, Window};
use incoming::Incoming;

/// Limits on what a caller may send.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest message.
    pub max_message_bytes: usize,
    /// Bytes of request bodies being received at once, node-wide.
    pub receive_budget_bytes: usize,
    /// Longest time to receive one request body.
    pub read_timeout: Duration,
    /// Longest time from a request's head to the end of its body for it to
    /// be forwarded as it arrives; then it is demoted
    /// (`forward/cut_through.rs`).
    pub cut_through_grace: Duration,
}

/// Serves `ModelInfer` by pass-through.
#[derive(Clone)]
pub struct InferPath {
    pool: Arc<Pool>,
    metrics: Arc<Metrics>,
    patterns: Arc<FaultPatterns>,
    front: Front,
    limits: BodyLimits,
    budget: Arc<Semaphore>,
}

/// How and when a request arrived.
struct Arrival<'a> {
    via: TransportPath,
    started: Instant,
    deadline: Option<Instant>,
    /// The client connection, when it came over the OIP port.
    conn: Option<&'a ConnInfo>,
}

impl InferPath {
    /// The path over `pool`; rewriting requests go to `front`.
    pub fn new(
        pool: Arc<Pool>,
        metrics: Arc<Metrics>,
        patterns: Arc<FaultPatterns>,
        front: Front,
        limits: BodyLimits,
    ) -> Self {
        let budget = Arc::new(Semaphore::new(
            limits
                .receive_budget_bytes
                .min(Semaphore::MAX_PERMITS)
                .max(limits.max_message_bytes + FRAME_HEADER),
        ));
        Self {
            pool,
            metrics,
            patterns,
            front,
            limits,
            budget,
        }
    }

    /// Answers one `ModelInfer` request that came over HTTP/2 on
    /// connection `conn`.
    pub async fn call<B>(&self, req: Request<B>, conn: Option<&ConnInfo>) -> Response<FrontBody>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        self.call_via(req, TransportPath::Grpc, conn).await
    }

    /// Answers one `ModelInfer` request of connection `conn` (shared memory
    /// and RDMA regions are the connection's; a request of a connection
    /// behind on reading its responses waits for it, and is refused if it
    /// does not catch up); inline tensors count as `via`
    /// in `infermesh_transport_requests_total`.
    pub async fn call_via<B>(
        &self,
        req: Request<B>,
        via: TransportPath,
        conn: Option<&ConnInfo>,
    ) -> Response<FrontBody>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let started = Instant::now();
        let deadline = header_timeout(req.headers()).map(|t| started + t);
        let ticket = self.pool.admit();
        let (parts, body) = req.into_parts();
        let mut model = None;
        // Off unless an OTLP endpoint is set (crate::trace).
        let span = crate::trace::request_span(&parts.headers);
        let result = self
            .serve(
                &parts,
                body,
                Arrival {
                    via,
                    started,
                    deadline,
                    conn,
                },
                ticket,
                &mut model,
            )
            .instrument(span.clone())
            .await;
        match result {
            Ok(resp) => resp,
            Err(status) => {
                // Without its source; with its metadata (a shed request's
                // retry hint).
                let status = Status::with_metadata(
                    status.code(),
                    status.message().to_string(),
                    status.metadata().clone(),
                );
                let _in = span.enter();
                crate::trace::record("outcome", &format_args!("{:?}", status.code()));
                self.metrics
                    .model(model, self.pool.models())
                    .request(status.code(), started.elapsed());
                status_response(status, &self.pool)
            }
        }
    }

    async fn serve<B>(
        &self,
        parts: &http::request::Parts,
        body: B,
        arrival: Arrival<'_>,
        ticket: Ticket,
        model: &mut Option<crate::dispatch::models::ModelId>,
    ) -> Result<Response<FrontBody>, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let Arrival {
            via,
            started,
            deadline,
            conn,
        } = arrival;
        // A name made once, as `header_timeout`'s.
        const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
        if parts
            .headers
            .get(GRPC_ENCODING)
            .is_some_and(|e| e != "identity")
        {
            return Err(Status::unimplemented(
                "compressed requests are not supported; send them uncompressed",
            ));
        }
        let mut body = body;
        let mut incoming = Incoming::new(deadline, self.limits.read_timeout);
        // Read until the body ends, or (cut-through) until the head is here
        // and the rest of the message is one tensor's bytes.
        let cut = self.read_head(&mut body, &mut incoming).await?;
        let window = Window::new(self.limits.cut_through_grace, incoming.received());
        // One frame: decoded as it is (its tensors are slices of it). More
        // (a large request): read where it lies, the tensors' sizes noted
        // and their bytes left in the frames, which go to the worker as
        // they came.
        let (mut req, mut raw_lens) = match (cut, &incoming.chunks[..]) {
            (Some(v), _) => (v.head, Some(v.raw_lens)),
            (None, [frame]) => (decode(frame)?, None),
            (None, chunks) => {
                let v = crate::serving::request_view::view(chunks)?;
                (v.head, Some(v.raw_lens))
            }
        };
        if req.model_name.is_empty() {
            return Err(AgentError::BadRequest("model_name is empty".into()).into());
        }
        let (id, meta) = match self.pool.models().lookup(&req.model_name) {
            Some((id, meta)) => {
                *model = Some(id);
                crate::trace::record("model", &req.model_name);
                (id, meta)
            }
            None => return Err(self.pool.unavailable_reason(&req.model_name).into()),
        };
        let meta = meta.ok_or_else(|| self.pool.unavailable_reason(&req.model_name))?;
        let metrics = self.metrics.model(Some(id), self.pool.models());
        // The decoded path and BYTES inputs need the tensors themselves.
        let needs_contents = crate::transports::shm::uses_shm(&req)
            || crate::transports::rdma::uses_rdma(&req)
            || req.inputs.iter().any(|i| i.datatype == "BYTES");
        if raw_lens.is_some() && needs_contents {
            self.read_rest(&mut body, &mut incoming).await?;
            req = decode(&gather(&incoming.chunks))?;
            raw_lens = None;
        }
        let permit = incoming.permit()?;
        if crate::transports::shm::uses_shm(&req) || crate::transports::rdma::uses_rdma(&req) {
            drop(permit);
            let owner = conn.map_or(0, |c| c.id);
            // Boxed: this path's future is large, and the plain path's
            // future (moved into place on every request) would be as large.
            let (resp, path) = Box::pin(
                self.front
                    .infer_decoded(owner, deadline, &mut req, id, &meta),
            )
            .await?;
            self.metrics.transport(path);
            drop(ticket);
            metrics.request(Code::Ok, started.elapsed());
            return Ok(message_response(&resp, &self.pool));
        }
        match &raw_lens {
            Some(lens) => validate_request_sizes(&req, lens, &meta),
            None => validate_request(&req, &meta),
        }
        .map_err(AgentError::from)?;
        let priority = crate::dispatch::tenant::request_priority(&req.parameters)?;
        drop(req);
        // The worker's spans are children of this request's (when tracing).
        let trace = crate::trace::enabled().then(|| {
            let mut map = HeaderMap::new();
            crate::trace::inject(&mut map);
            map
        });
        let mut demoted = false;
        // When this request stops waiting for its client to read (set at
        // its first wait).
        let mut reader_wait = None;
        let (lease, exchange, head) = loop {
            self.wait_for_reader(conn, deadline, &mut reader_wait)
                .await?;
            let mut lease = match self
                .take_worker(id, deadline, priority, window, &mut body, &mut incoming)
                .await?
            {
                Queued::Got(lease) => lease,
                Queued::Late => {
                    // Queued past its window with the body still arriving:
                    // read the rest (within the read timeout), then queue
                    // again.
                    self.demote(&incoming, "queued");
                    self.read_rest(&mut body, &mut incoming).await?;
                    continue;
                }
            };
            // Checked again: the client may have fallen behind while this
            // request queued. The slot goes back (a client that does not
            // read gets no work onto a worker), and the request waits for
            // it (within what is left of its wait) before it queues again.
            if conn.is_some_and(ConnInfo::is_backlogged) {
                lease.withdrawn();
                continue;
            }
            crate::trace::record("worker", &lease.worker().id());
            if !demoted {
                self.metrics.transport(via);
            }
            let meta = Metadata {
                caller: &parts.headers,
                timeout: time_left(deadline)?,
                extra: trace.as_ref(),
            };
            let sent = self.send(&lease, meta, window, &mut body, &mut incoming);
            // A stalled or hung worker's calls fail when the sentinel gives
            // up on it (`Upstream::abort`), not when (if ever) the worker
            // answers.
            let sent = match deadline {
                Some(d) => tokio::time::timeout_at(d.into(), sent)
                    .await
                    .map_err(|_| {
                        Status::deadline_exceeded("deadline exceeded waiting for the worker")
                    })??,
                None => sent.await?,
            };
            match sent {
                Sent::Answered(exchange, head) => break (lease, exchange, head),
                // The body is late, or unfinished uploads hold the
                // worker's other slots (this one stays free for requests
                // that are all here).
                Sent::Demoted => self.demote(&incoming, "sent"),
                Sent::Deferred => self.defer(&incoming),
            }
            // Its slot goes to other requests while the rest is read
            // (within the read timeout); then it queues again with every
            // frame kept.
            lease.withdrawn();
            drop(lease);
            demoted = true;
            self.read_rest(&mut body, &mut incoming).await?;
        };
        let process = Arc::clone(lease.process());
        let unreachable = |e: &dyn std::fmt::Display| worker_unreachable(&lease, e);
        drop(trace);
        drop(permit);
        if head.status != 200 {
            return Err(unreachable(&format!(
                "worker answered HTTP {}",
                head.status
            )));
        }
        let mut headers = head.headers;
        // Trailers-only: the status is in the headers.
        let trailers_only =
            match head.end {
                true => Some(grpc_code(&headers).ok_or_else(|| {
                    unreachable(&"the worker's answer ended without a gRPC status")
                })?),
                false => None,
            };
        let done = Done {
            span: tracing::Span::current(),
            reporter: lease.worker().reporter().clone(),
            pid: process.pid,
            lease: Some(lease),
            ticket: Some(ticket),
            metrics,
            started,
            patterns: Arc::clone(&self.patterns),
            pool: Arc::clone(&self.pool),
        };
        if let Some(code) = trailers_only {
            let mut done = done;
            done.finish(&mut headers, code, true);
            let mut resp = Response::new(FrontBody::Empty);
            *resp.headers_mut() = headers;
            return Ok(resp);
        }
        let mut resp = Response::new(FrontBody::Forward(ForwardBody {
            exchange,
            done: Some(done),
        }));
        *resp.headers_mut() = headers;
        Ok(resp)
    }

    /// Counts and logs a request demoted from cut-through forwarding;
    /// `had`: how far it had got ("queued" for a worker, or "sent" to one,
    /// whose slot it gave back).
    fn demote(&self, incoming: &Incoming, had: &'static str) {
        tracing::debug!(
            received = incoming.received(),
            grace = ?self.limits.cut_through_grace,
            had,
            "request body not all here when its cut-through window closed: \
             reading the rest before it queues again"
        );
        self.metrics.cut_through_demoted();
    }

    /// Counts and logs a request deferred from cut-through forwarding: it
    /// took a worker's last slot not held by an unfinished upload.
    fn defer(&self, incoming: &Incoming) {
        tracing::debug!(
            received = incoming.received(),
            "the worker's slots but one are held by unfinished uploads: \
             reading this request whole before it queues again"
        );
        self.metrics.cut_through_deferred();
    }

    /// Waits while `conn`'s client is behind on reading its answers
    /// ([`crate::transports::conn::Backlog`]): backpressure, not refusal.
    /// The request's body is not read meanwhile, so the client's windows
    /// push back on it. The wait ends at `until`, set at the first wait to
    /// `read_timeout` from then and kept for later ones (a request waits
    /// that long in all): then the request is refused RESOURCE_EXHAUSTED —
    /// the client is not reading, and its requests must not hold what
    /// they took (receive budget, a stream) for longer — or
    /// DEADLINE_EXCEEDED if its deadline came first (docs/DECISIONS.md, "A
    /// client behind on reading waits").
    async fn wait_for_reader(
        &self,
        conn: Option<&ConnInfo>,
        deadline: Option<Instant>,
        until: &mut Option<tokio::time::Instant>,
    ) -> Result<(), Status> {
        let Some(conn) = conn.filter(|c| c.is_backlogged()) else {
            return Ok(());
        };
        if until.is_none() {
            self.metrics.backlog_wait();
        }
        let until =
            *until.get_or_insert_with(|| tokio::time::Instant::now() + self.limits.read_timeout);
        let deadline = deadline.map(tokio::time::Instant::from_std);
        let by = deadline.map_or(until, |d| d.min(until));
        tracing::debug!(conn = conn.id, "waiting for the client to read its answers");
        if conn.backlog.cleared_by(by).await {
            return Ok(());
        }
        if deadline.is_some_and(|d| d <= tokio::time::Instant::now()) {
            return Err(Status::deadline_exceeded(
                "deadline exceeded while this connection's earlier answers waited for the client to read them",
            ));
        }
        self.metrics.backlog_refused();
        Err(Status::resource_exhausted(
            "this connection is not reading its responses; read them, or retry on another connection",
        ))
    }

    /// Takes `len` bytes of the receive budget, or refuses the request.
    fn reserve(&self, len: usize) -> Result<OwnedSemaphorePermit, Status> {
        if len > self.limits.max_message_bytes {
            return Err(AgentError::MessageTooLarge {
                size: len,
                limit: self.limits.max_message_bytes,
            }
            .into());
        }
        let n = u32::try_from(len + FRAME_HEADER).unwrap_or(u32::MAX);
        Arc::clone(&self.budget)
            .try_acquire_many_owned(n)
            .map_err(|_| AgentError::ReceiveBudget.into())
    }
}

/// The error for a request that `lease`'s worker could not be reached for
/// (or answered as no worker should), with `why`.
fn worker_unreachable(lease: &Lease, why: &dyn std::fmt::Display) -> Status {
    AgentError::WorkerUnreachable {
        worker: lease.worker().id().to_string(),
        reason: why.to_string(),
    }
    .into()
}

/// Decodes a request that arrived as one gRPC frame.
fn decode(frame: &Bytes) -> Result<ModelInferRequest, Status> {
    let message = grpc::unary_message(frame)?;
    ModelInferRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("malformed ModelInferRequest: {e}")))
}

/// `chunks` in one buffer (the decoded path and BYTES inputs, which need
/// the tensors themselves).
fn gather(chunks: &[Bytes]) -> Bytes {
    let mut all = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        all.extend_from_slice(c);
    }
    all.freeze()
}

/// Fills `out` with the first bytes of `chunks` (as many as there are).
pub(crate) fn copy_prefix(chunks: &[Bytes], out: &mut [u8]) {
    let mut at = 0;
    for c in chunks {
        let n = (out.len() - at).min(c.len());
        out[at..at + n].copy_from_slice(&c[..n]);
        at += n;
        if at == out.len() {
            return;
        }
    }
}

/// What is left of `deadline`, sent to the worker as `grpc-timeout`; an
/// error when nothing is.
fn time_left(deadline: Option<Instant>) -> Result<Option<Duration>, Status> {
    let Some(d) = deadline else {
        return Ok(None);
    };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Status::deadline_exceeded(
            "deadline exceeded before the request reached a worker",
        ));
    }
    Ok(Some(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_gets_what_is_left_of_the_deadline_or_nothing_once_it_passed() {
        let deadline = Instant::now() + Duration::from_millis(1500);
        let left = time_left(Some(deadline)).unwrap().unwrap();
        assert!(
            left <= Duration::from_millis(1500) && !left.is_zero(),
            "{left:?}"
        );
        assert_eq!(time_left(None).unwrap(), None);
        let past = Instant::now() - Duration::from_millis(1);
        let err = time_left(Some(past)).unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
    }
}
