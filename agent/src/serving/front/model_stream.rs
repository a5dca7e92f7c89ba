//! `ModelStreamInfer`: a bidirectional stream proxied to one worker.
//!
//! The first request picks the worker (least loaded hosting its model); the
//! stream stays on it, so responses keep their order. A stream holds worker
//! permits only for requests in flight: each request takes a permit on that
//! worker (waiting in its model's queue like any request, pinned to the
//! worker) and the permit is released by the request's final response — an
//! idle stream holds nothing. A response is final unless it carries
//! Triton's `triton_final_response = false` (decoupled models that send
//! several responses per request); permits are released in request order,
//! which is the order a worker answers a stream in.
//!
//! Every request is checked like a unary one: its model must be one the
//! pinned worker serves, plain requests are validated against the model's
//! metadata, and shared-memory references are resolved through the
//! caller's own connection ([`crate::transports::shm`]) — passed through to a worker
//! that speaks shared memory under the connection's private names, or
//! copied by the agent (outputs written back when the response arrives). A
//! request that fails these checks is answered in the stream with
//! `error_message`; the stream goes on.
//!
//! A client that stops reading holds no worker slot (issue 24's slow
//! readers, on a stream): the worker's answers are always read off its
//! connection (their permits released) into the stream's queue of
//! [`Answers`], and the stream admits no new request while that queue
//! holds [`FORWARD_BUFFER`] answers the client has not taken. Before, the
//! task forwarding answers waited for the client, stopped reading the
//! worker's, and every request admitted meanwhile kept its permit until
//! the stream was reset — a few streams held all of a worker's slots, and
//! its stall watchdog took it for hung.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{ModelInferRequest, ModelStreamInferResponse};
use infermesh_proto::tensor::validate_request;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::Front;
use crate::dispatch::pool::Lease;
use crate::error::AgentError;
use crate::metrics::TransportPath;
use crate::serving::deadline::request_timeout;
use crate::serving::worker_status::worker_status;
use crate::transports::conn;
use crate::transports::shm;

/// Requests forwarded ahead of the worker's reading them, and answers the
/// client has not taken beyond which no new request is admitted.
const FORWARD_BUFFER: usize = 16;
/// Answers of a decoupled model (several per request) the client has not
/// taken beyond which the worker's are not read (holding only the permits
/// of the requests already admitted).
const MAX_UNREAD: usize = 4 * FORWARD_BUFFER;
/// Parameter of decoupled responses that says whether more follow.
const FINAL_RESPONSE_PARAM: &str = "triton_final_response";

/// A request in flight on the stream: its permit, and where its outputs
/// go when the agent copies them.
struct InFlight {
    lease: Lease,
    outputs: Option<shm::Prepared>,
}

type Pending = Arc<Mutex<VecDeque<InFlight>>>;

/// Serves one `ModelStreamInfer` call of `front`. The response headers go
/// out at once (clients may wait for them before sending anything); a
/// driver task then admits requests and forwards responses.
pub async fn serve(
    front: Front,
    req: Request<Streaming<ModelInferRequest>>,
) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
    let deadline = request_timeout(req.metadata()).map(|t| Instant::now() + t);
    let owner = conn::owner(&req);
    let incoming = req.into_inner();
    let (out, out_rx) = mpsc::channel(FORWARD_BUFFER);
    let tasks = front.tasks.clone();
    tasks.spawn(drive(front, owner, deadline, incoming, out));
    Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
}

type Answer = Result<ModelStreamInferResponse, Status>;
type Out = mpsc::Sender<Answer>;

/// The stream's answers on their way to the client: queued here at once,
/// in order, and handed to the client's stream by a task of their own as
/// the client takes them.
#[derive(Clone)]
struct Answers {
    queue: mpsc::UnboundedSender<Answer>,
    unread: Arc<Unread>,
}

/// Answers queued that the client has not taken.
#[derive(Default)]
struct Unread {
    count: AtomicUsize,
    taken: tokio::sync::Notify,
}

impl Answers {
    /// Queues the answers for `out`, forwarded by a task spawned on
    /// `front`'s tracker.
    fn new(front: &Front, out: Out) -> Self {
        let (queue, mut rx) = mpsc::unbounded_channel::<Answer>();
        let unread = Arc::new(Unread::default());
        let counted = Arc::clone(&unread);
        front.tasks.spawn(async move {
            while let Some(answer) = rx.recv().await {
                let sent = out.send(answer).await;
                counted.count.fetch_sub(1, Ordering::SeqCst);
                counted.taken.notify_waiters();
                if sent.is_err() {
                    return;
                }
            }
        });
        Self { queue, unread }
    }

    /// Queues `answer`; false once the client is gone.
    fn push(&self, answer: Answer) -> bool {
        self.unread.count.fetch_add(1, Ordering::SeqCst);
        self.queue.send(answer).is_ok()
    }

    /// Waits until fewer than `n` answers wait for the client.
    async fn below(&self, n: usize) {
        let unread = &self.unread;
        crate::condition::until(&unread.taken, || unread.count.load(Ordering::SeqCst) < n).await;
    }
}

/// The next request of the stream; `None` when the client is done or its
/// stream failed (the failure is answered in the stream).
async fn next(
    incoming: &mut Streaming<ModelInferRequest>,
    answers: &Answers,
) -> Option<ModelInferRequest> {
    match incoming.message().await {
        Ok(m) => m,
        Err(s) => {
            answers.push(Ok(in_stream_error(&oversize(s))));
            None
        }
    }
}

/// Runs one stream: the first admitted request picks the worker; a reader
/// admits the later ones pinned to it while this task forwards the
/// worker's responses.
async fn drive(
    front: Front,
    owner: u64,
    deadline: Option<Instant>,
    mut incoming: Streaming<ModelInferRequest>,
    out: Out,
) {
    let answers = Answers::new(&front, out.clone());
    let (first, in_flight) = loop {
        answers.below(FORWARD_BUFFER).await;
        let Some(msg) = next(&mut incoming, &answers).await else {
            return;
        };
        match admit(&front, owner, None, deadline, msg).await {
            Ok(admitted) => break admitted,
            Err(s) => {
                if !answers.push(Ok(in_stream_error(&s))) {
                    return;
                }
            }
        }
    };
    let worker = Arc::clone(in_flight.lease.worker());
    let process = Arc::clone(in_flight.lease.process());
    let pending: Pending = Arc::new(Mutex::new(VecDeque::from([in_flight])));
    let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
    if tx.send(first).await.is_err() {
        return;
    }
    let reader = {
        let (front, pending, answers, index) = (
            front.clone(),
            Arc::clone(&pending),
            answers.clone(),
            worker.index,
        );
        front.tasks.clone().spawn(async move {
            loop {
                // A client that does not take its answers gets no more
                // work onto the worker.
                answers.below(FORWARD_BUFFER).await;
                let Some(msg) = next(&mut incoming, &answers).await else {
                    break;
                };
                match admit(&front, owner, Some(index), deadline, msg).await {
                    Ok((msg, in_flight)) => {
                        pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push_back(in_flight);
                        if tx.send(msg).await.is_err() {
                            break;
                        }
                    }
                    Err(s) => {
                        if !answers.push(Ok(in_stream_error(&s))) {
                            break;
                        }
                    }
                }
            }
        })
    };
    // The reader ends with this task: its permits and requests belong to
    // an upstream call that is gone.
    let _reader = tokio_util::task::AbortOnDropHandle::new(reader);
    let mut upstream = match process
        .client
        .clone()
        .model_stream_infer(ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => {
            answers.push(Err(worker_status(&worker, s)));
            return;
        }
    };
    loop {
        let item = tokio::select! {
            item = upstream.next() => item,
            () = out.closed() => return,
        };
        let Some(item) = item else { return };
        let mut resp = match item {
            Ok(r) => r,
            Err(s) => {
                answers.push(Err(worker_status(&worker, s)));
                return;
            }
        };
        if is_final(&resp) {
            let mut done = pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front();
            if let Some(d) = done.as_mut() {
                d.lease.served();
            }
            if let (
                Some(InFlight {
                    outputs: Some(p), ..
                }),
                Some(r),
            ) = (done, resp.infer_response.as_mut())
            {
                if let Err(s) = shm::finish(&front.shm, owner, p, r) {
                    resp = in_stream_error(&s);
                }
            }
        } else {
            // A partial answer (decoupled model): progress for the watchdog.
            front.pool.progressed(worker.index);
        }
        if !answers.push(Ok(resp)) {
            return;
        }
        // Only a decoupled model's answers can pile up past the reader's
        // bound: past this one the worker's wait.
        tokio::select! {
            () = answers.below(MAX_UNREAD) => {}
            () = out.closed() => return,
        }
    }
}

/// Checks one request of the stream and takes its permit: on any worker
/// serving its model for the first request, on the stream's `worker` for
/// the later ones.
async fn admit(
    front: &Front,
    owner: u64,
    worker: Option<usize>,
    deadline: Option<Instant>,
    mut msg: ModelInferRequest,
) -> Result<(ModelInferRequest, InFlight), Status> {
    let (model, meta) = front
        .pool
        .models()
        .lookup(&msg.model_name)
        .ok_or_else(|| front.pool.unavailable_reason(&msg.model_name))?;
    if !shm::uses_shm(&msg) {
        let meta = meta.ok_or_else(|| front.pool.unavailable_reason(&msg.model_name))?;
        validate_request(&msg, &meta).map_err(AgentError::from)?;
    }
    let priority = crate::dispatch::tenant::request_priority(&msg.parameters)?;
    let lease = front
        .pool
        .acquire_prioritized(model, worker, deadline, priority)
        .await?;
    let outputs = prepare(front, owner, &lease, &mut msg).await?;
    Ok((msg, InFlight { lease, outputs }))
}

/// Resolves a request's shared-memory references for the lease's worker;
/// returns what must be done with its outputs when the agent copies.
async fn prepare(
    front: &Front,
    owner: u64,
    lease: &Lease,
    msg: &mut ModelInferRequest,
) -> Result<Option<shm::Prepared>, Status> {
    if !shm::uses_shm(msg) {
        front.metrics.transport(TransportPath::Grpc);
        return Ok(None);
    }
    let p = shm::prepare(&front.shm, owner, lease.worker(), lease.process(), msg).await?;
    Ok(match p {
        shm::Prepared::PassThrough => {
            front.metrics.transport(TransportPath::ShmPassthrough);
            None
        }
        inline @ shm::Prepared::Inline(_) => {
            front.metrics.transport(TransportPath::ShmInline);
            Some(inline)
        }
    })
}

/// Whether `resp` is the last response to its request.
fn is_final(resp: &ModelStreamInferResponse) -> bool {
    let flag = resp
        .infer_response
        .as_ref()
        .and_then(|r| r.parameters.get(FINAL_RESPONSE_PARAM))
        .and_then(|p| p.parameter_choice.as_ref());
    !matches!(flag, Some(ParameterChoice::BoolParam(false)))
}

fn in_stream_error(s: &Status) -> ModelStreamInferResponse {
    ModelStreamInferResponse {
        error_message: s.message().to_string(),
        infer_response: None,
    }
}

/// tonic reports a message over the size limit as OUT_OF_RANGE; gRPC
/// clients expect RESOURCE_EXHAUSTED.
fn oversize(s: Status) -> Status {
    if s.code() == Code::OutOfRange {
        Status::resource_exhausted(s.message().to_string())
    } else {
        s
    }
}
