//! A request body as it arrives: read frame by frame within the limits
//! (the receive budget taken for the size its gRPC header declares, the
//! read timeout or the deadline), scanned for the point where it can be
//! forwarded before the rest has come (cut-through, docs/DECISIONS.md),
//! and checked to carry exactly the message its header declares.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Body;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use super::{InferPath, copy_prefix};
use crate::serving::grpc::{FRAME_HEADER, frame_header};
use crate::serving::request_view::{RequestView, Scan};

/// A request body as far as it has been received.
pub(super) struct Incoming {
    /// Its DATA frames so far.
    pub(super) chunks: Vec<Bytes>,
    received: usize,
    /// Its gRPC header once here: compressed, and the message's length.
    message: Option<(bool, usize)>,
    /// The receive budget taken for that length.
    permit: Option<OwnedSemaphorePermit>,
    /// The body has ended.
    pub(super) ended: bool,
    /// When the body must have arrived (the read timeout or the deadline).
    read_until: Instant,
    deadline: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Incoming {
    pub(super) fn new(deadline: Option<Instant>, read_timeout: Duration) -> Self {
        let read_until = Instant::now() + read_timeout;
        let read_until = deadline.map_or(read_until, |d| d.min(read_until));
        Self {
            chunks: Vec::new(),
            received: 0,
            message: None,
            permit: None,
            ended: false,
            read_until,
            deadline,
            timer: Box::pin(tokio::time::sleep_until(read_until.into())),
        }
    }

    /// Bytes of the body received so far.
    pub(super) fn received(&self) -> usize {
        self.received
    }

    /// The receive budget held for the message (taken once its header
    /// was here).
    pub(super) fn permit(&mut self) -> Result<OwnedSemaphorePermit, Status> {
        self.permit
            .take()
            .ok_or_else(|| Status::internal("request body is shorter than a gRPC message header"))
    }
}

/// A body whose length is not the one its gRPC header says.
fn length_mismatch(received: usize, len: usize) -> Status {
    let carried = received.saturating_sub(FRAME_HEADER);
    Status::invalid_argument(format!(
        "a unary request must carry exactly one gRPC message: its header says {len} bytes, the body carried {} {carried}",
        if carried > len { "at least" } else { "only" }
    ))
}

impl InferPath {
    /// Reads `body` into `incoming` until it ends, or — cut-through —
    /// until it has not all arrived but its head has and the rest of the
    /// message is the last raw tensor's bytes: then the head and the
    /// tensors' sizes, and the caller reads on ([`InferPath::read_frame`])
    /// while forwarding.
    pub(super) async fn read_head<B>(
        &self,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<Option<RequestView>, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let mut scan = Scan::default();
        while self.read_frame(body, incoming).await?.is_some() {
            match incoming.message {
                Some((false, len)) if incoming.received < FRAME_HEADER + len => {
                    if let Some(view) = scan.step(&incoming.chunks, len)? {
                        return Ok(Some(view));
                    }
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Reads the rest of `body` into `incoming`, within the limits
    /// ([`InferPath::read_frame`]).
    pub(super) async fn read_rest<B>(
        &self,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<(), Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        while self.read_frame(body, incoming).await?.is_some() {}
        Ok(())
    }

    /// Reads the next DATA frame of `body` into `incoming`, within the
    /// limits; `None` at the end of the body, which must have carried
    /// exactly one gRPC message of the length its header says.
    pub(super) async fn read_frame<B>(
        &self,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<Option<Bytes>, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        loop {
            let timer = &mut incoming.timer;
            let next = std::future::poll_fn(|cx| {
                if let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(cx) {
                    return Poll::Ready(Some(frame));
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            let Some(frame) = next else {
                return Err(match incoming.deadline {
                    Some(d) if d <= incoming.read_until => {
                        Status::deadline_exceeded("deadline exceeded while receiving the request")
                    }
                    _ => Status::deadline_exceeded(format!(
                        "request body not received within {:?}",
                        self.limits.read_timeout
                    )),
                });
            };
            let Some(frame) = frame else {
                incoming.ended = true;
                let (_, len) = incoming.message.ok_or_else(|| {
                    Status::internal("request body is shorter than a gRPC message header")
                })?;
                return match incoming.received == FRAME_HEADER + len {
                    true => Ok(None),
                    false => Err(length_mismatch(incoming.received, len)),
                };
            };
            let frame = frame.map_err(|e| Status::cancelled(format!("request body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            incoming.received += data.len();
            incoming.chunks.push(data.clone());
            if incoming.message.is_none() && incoming.received >= FRAME_HEADER {
                let mut header = [0u8; FRAME_HEADER];
                copy_prefix(&incoming.chunks, &mut header);
                let (compressed, len) = frame_header(&header);
                incoming.permit = Some(self.reserve(len)?);
                incoming.message = Some((compressed, len));
            }
            if let Some((_, len)) = incoming.message {
                if incoming.received > FRAME_HEADER + len {
                    return Err(length_mismatch(incoming.received, len));
                }
            }
            return Ok(Some(data));
        }
    }
}
