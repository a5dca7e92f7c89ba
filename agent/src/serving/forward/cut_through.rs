//! Sending a request to its worker while its body may still be arriving
//! (cut-through forwarding, docs/DECISIONS.md): the request waits for a
//! worker reading on, then goes with what has arrived and each later frame
//! follows as it comes.
//!
//! A worker slot held for a body that does not come is a slot other
//! requests wait for: a client that sends a large request's head and then
//! trickles would hold it until `read_timeout` (30 s), and an idle worker
//! with a request held and none answered looks stuck to the stall
//! watchdog. So a request may be cut through only within
//! `limits.cut_through_grace` (1 s) of its head's arrival (its [`Window`]);
//! one whose body has not all come by then is **demoted**: if it has a
//! worker ([`Sent::Demoted`]) the worker's stream is reset (it never saw
//! the message end, so it never ran the request) and the slot goes back;
//! if it is still queued ([`Queued::Late`]) it leaves the queue. Either way
//! the caller reads the rest of the body whole — holding receive budget,
//! not a worker — and queues again with the frames kept, as a stream the
//! worker refused is sent again. The window starts at the head, not at the
//! slot: a burst of tricklers larger than the worker's slots costs the
//! others one grace, not one per wave of slots.

use bytes::Bytes;
use http_body::Body;
use tokio::time::Instant;
use tonic::Status;

use super::{Incoming, InferPath};
use crate::dispatch::models::ModelId;
use crate::dispatch::pool::Lease;
use crate::error::AgentError;
use crate::worker::upstream::{Exchange, Metadata, ResponseHead};

/// Until when a request may be forwarded as it arrives: its head's arrival
/// plus the cut-through grace.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub(super) until: Instant,
}

/// What became of a request waiting for a worker.
pub(super) enum Queued {
    /// It has one.
    Got(Lease),
    /// Its window closed before it had one, its body still arriving: it
    /// has left the queue.
    Late,
}

/// What became of a request sent to its worker.
pub(super) enum Sent {
    /// The worker's answer has begun.
    Answered(Exchange, ResponseHead),
    /// Its body had not all come when its window closed: the worker's
    /// stream was reset; the body is to be read on and the request to
    /// queue again.
    Demoted,
}

impl InferPath {
    /// A permit on a worker for model `id`, queueing until `deadline`. The
    /// body goes on being read while the request waits: the connection's
    /// window is given back as bodies are read, so queued requests holding
    /// their unread frames would starve the one that has a worker (16 × 16
    /// MiB stalled until the deadline). [`Queued::Late`] when `window`
    /// closes first with the body still arriving.
    pub(super) async fn take_worker<B>(
        &self,
        id: ModelId,
        deadline: Option<std::time::Instant>,
        priority: Option<u64>,
        window: Window,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<Queued, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let acquire = self.pool.acquire_prioritized(id, None, deadline, priority);
        tokio::pin!(acquire);
        let late = tokio::time::sleep_until(window.until);
        tokio::pin!(late);
        loop {
            if incoming.ended {
                return Ok(Queued::Got(acquire.await?));
            }
            tokio::select! {
                biased;
                lease = &mut acquire => return Ok(Queued::Got(lease?)),
                more = self.read_frame(body, incoming) => {
                    more?;
                }
                // Returning drops `acquire`: the request leaves the queue
                // (a permit handed over meanwhile goes back).
                () = &mut late => return Ok(Queued::Late),
            }
        }
    }

    /// Sends the request to `lease`'s worker with `meta`: whole if its body
    /// has ended, otherwise what has arrived now and the rest as it comes —
    /// unless the body has not ended when `window` closes
    /// ([`Sent::Demoted`]).
    pub(super) async fn send<B>(
        &self,
        lease: &Lease,
        meta: Metadata<'_>,
        window: Window,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<Sent, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let upstream = &lease.process().upstream;
        let unreachable = |e: &dyn std::fmt::Display| -> Status {
            AgentError::WorkerUnreachable {
                worker: lease.worker().id().to_string(),
                reason: e.to_string(),
            }
            .into()
        };
        if incoming.ended {
            let (exchange, head) = upstream
                .call_chunks(meta, &incoming.chunks)
                .await
                .map_err(|e| unreachable(&e))?;
            return Ok(Sent::Answered(exchange, head));
        }
        let grace = tokio::time::sleep_until(window.until);
        tokio::pin!(grace);
        let mut upload = upstream
            .upload(meta, &incoming.chunks)
            .await
            .map_err(|e| unreachable(&e))?;
        loop {
            let more = tokio::select! {
                biased;
                more = self.read_frame(body, incoming) => more?,
                // Dropping the upload resets the worker's stream.
                () = &mut grace => return Ok(Sent::Demoted),
            };
            if more.is_none() {
                break;
            }
            upload
                .push(&incoming.chunks, false)
                .await
                .map_err(|e| unreachable(&e))?;
        }
        upload
            .end(&incoming.chunks)
            .await
            .map_err(|e| unreachable(&e))?;
        let (exchange, head) = upload
            .answer(&incoming.chunks)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Sent::Answered(exchange, head))
    }
}
