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
//! caller's own connection ([`crate::shm`]) — passed through to a worker
//! that speaks shared memory under the connection's private names, or
//! copied by the agent (outputs written back when the response arrives). A
//! request that fails these checks is answered in the stream with
//! `error_message`; the stream goes on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{ModelInferRequest, ModelStreamInferResponse};
use infermesh_proto::tensor::validate_request;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::conn;
use crate::deadline::request_timeout;
use crate::error::AgentError;
use crate::front::{Front, worker_status};
use crate::metrics::TransportPath;
use crate::pool::Lease;
use crate::shm;

/// Requests forwarded ahead of the worker's reading them.
const FORWARD_BUFFER: usize = 16;
/// Parameter of decoupled responses that says whether more follow.
const FINAL_RESPONSE_PARAM: &str = "triton_final_response";

/// A request in flight on the stream: its permit, and where its outputs
/// go when the agent copies them.
struct InFlight {
    _lease: Lease,
    outputs: Option<shm::Prepared>,
}

type Pending = Arc<Mutex<VecDeque<InFlight>>>;

/// Serves one `ModelStreamInfer` call of `front`.
pub async fn serve(
    front: Front,
    req: Request<Streaming<ModelInferRequest>>,
) -> Result<Response<BoxStream<ModelStreamInferResponse>>, Status> {
    let deadline = request_timeout(req.metadata()).map(|t| Instant::now() + t);
    let owner = conn::owner(&req);
    let mut incoming = req.into_inner();
    let Some(mut first) = incoming.message().await.map_err(oversize)? else {
        return Ok(Response::new(Box::pin(tokio_stream::empty())));
    };
    let (model, _) = front
        .pool
        .models()
        .lookup(&first.model_name)
        .ok_or_else(|| front.pool.unavailable_reason(&first.model_name))?;
    let lease = front.pool.acquire(model, None, deadline).await?;
    let worker = Arc::clone(lease.worker());
    let process = Arc::clone(lease.process());
    let pending: Pending = Arc::default();
    let outputs = prepare(&front, owner, &lease, &mut first).await?;
    pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push_back(InFlight {
            _lease: lease,
            outputs,
        });
    let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
    tx.send(first)
        .await
        .map_err(|_| Status::internal("stream closed"))?;
    let (errors, error_rx) = mpsc::unbounded_channel();
    {
        let (front, pending, worker) = (front.clone(), Arc::clone(&pending), Arc::clone(&worker));
        front.tasks.clone().spawn(async move {
            loop {
                let msg = match incoming.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(s) => {
                        let _ = errors.send(in_stream_error(&oversize(s)));
                        break;
                    }
                };
                match admit(&front, owner, worker.index, deadline, msg).await {
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
                        let _ = errors.send(in_stream_error(&s));
                    }
                }
            }
        });
    }
    let mut client = process.client.clone();
    let upstream = client
        .model_stream_infer(ReceiverStream::new(rx))
        .await
        .map_err(|s| worker_status(&worker, s))?
        .into_inner();
    let (shm_state, answered) = (front.shm.clone(), Arc::clone(&pending));
    let responses = upstream.map(move |item| {
        let mut resp = item.map_err(|s| worker_status(&worker, s))?;
        if is_final(&resp) {
            let done = answered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front();
            if let (
                Some(InFlight {
                    outputs: Some(p), ..
                }),
                Some(r),
            ) = (done, resp.infer_response.as_mut())
            {
                if let Err(s) = shm::finish(&shm_state, owner, p, r) {
                    resp = in_stream_error(&s);
                }
            }
        }
        Ok(resp)
    });
    let errors = UnboundedReceiverStream::new(error_rx).map(Ok);
    Ok(Response::new(Box::pin(responses.merge(errors))))
}

/// Checks one later request of the stream and takes its permit on the
/// stream's worker.
async fn admit(
    front: &Front,
    owner: u64,
    worker: usize,
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
    let lease = front.pool.acquire(model, Some(worker), deadline).await?;
    let outputs = prepare(front, owner, &lease, &mut msg).await?;
    Ok((
        msg,
        InFlight {
            _lease: lease,
            outputs,
        },
    ))
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
