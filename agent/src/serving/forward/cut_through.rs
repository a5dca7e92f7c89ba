//! Sending a request to its worker while its body may still be arriving
//! (cut-through forwarding, docs/DECISIONS.md): the request waits for a
//! worker reading on, then goes with what has arrived and each later frame
//! follows as it comes.
//!
//! A worker slot held for a body that does not come is a slot other
//! requests wait for: a client that sends a large request's head and then
//! trickles would hold it until `read_timeout` (30 s), and an idle worker
//! with a request held and none answered looks stuck to the stall
//! watchdog. So an upload whose body has not all come within
//! `limits.cut_through_grace` (1 s) of taking its worker is **demoted**
//! ([`Sent::Demoted`]): the worker's stream is reset (it never saw the
//! message end, so it never ran the request), the slot goes back, and the
//! caller reads the rest of the body whole — holding receive budget, not a
//! worker — and queues again with the frames kept, as a stream the worker
//! refused is sent again.

use bytes::Bytes;
use http_body::Body;
use tonic::Status;

use super::{Incoming, InferPath};
use crate::dispatch::models::ModelId;
use crate::dispatch::pool::Lease;
use crate::error::AgentError;
use crate::worker::upstream::{Exchange, Metadata, ResponseHead};

/// What became of a request sent to its worker.
pub(super) enum Sent {
    /// The worker's answer has begun.
    Answered(Exchange, ResponseHead),
    /// Its body had not all come within the grace: the worker's stream was
    /// reset; the body is to be read on and the request to queue again.
    Demoted,
}

impl InferPath {
    /// A permit on a worker for model `id`, queueing until `deadline`. The
    /// body goes on being read while the request waits: the connection's
    /// window is given back as bodies are read, so queued requests holding
    /// their unread frames would starve the one that has a worker (16 × 16
    /// MiB stalled until the deadline).
    pub(super) async fn take_worker<B>(
        &self,
        id: ModelId,
        deadline: Option<std::time::Instant>,
        priority: Option<u64>,
        body: &mut B,
        incoming: &mut Incoming,
    ) -> Result<Lease, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let acquire = self.pool.acquire_prioritized(id, None, deadline, priority);
        tokio::pin!(acquire);
        loop {
            if incoming.ended {
                return Ok(acquire.await?);
            }
            tokio::select! {
                biased;
                lease = &mut acquire => return Ok(lease?),
                more = self.read_frame(body, incoming) => {
                    more?;
                }
            }
        }
    }

    /// Sends the request to `lease`'s worker with `meta`: whole if its body
    /// has ended, otherwise what has arrived now and the rest as it comes —
    /// unless the body has not ended within the cut-through grace
    /// ([`Sent::Demoted`]).
    pub(super) async fn send<B>(
        &self,
        lease: &Lease,
        meta: Metadata<'_>,
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
        let grace = tokio::time::sleep(self.limits.cut_through_grace);
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
