//! Sending a request to its worker while its body may still be arriving
//! (cut-through forwarding, docs/DECISIONS.md): the request waits for a
//! worker reading on, then goes with what has arrived and each later frame
//! follows as it comes.
//!
//! A worker slot held for a body that does not come is a slot other
//! requests wait for: a client that sends a large request's head and then
//! trickles would hold it until `read_timeout` (30 s), and an idle worker
//! with a request held and none answered looks stuck to the stall
//! watchdog. So a request may be cut through only while its body keeps
//! coming (its [`Window`]: `limits.cut_through_grace`, 1 s, from its head's
//! arrival, extended as bytes arrive at [`MIN_RATE`] or faster, at most
//! [`MAX_WINDOW_GRACES`] graces); one whose body has not all come when its
//! window closes is **demoted**: if it has a
//! worker ([`Sent::Demoted`]) the worker's stream is reset (it never saw
//! the message end, so it never ran the request) and the slot goes back;
//! if it is still queued ([`Queued::Late`]) it leaves the queue. Either way
//! the caller reads the rest of the body whole — holding receive budget,
//! not a worker — and queues again with the frames kept, as a stream the
//! worker refused is sent again. The window starts at the head, not at the
//! slot: a burst of tricklers larger than the worker's slots costs the
//! others one grace, not one per wave of slots.
//!
//! Within their windows, unfinished uploads may hold all of a worker's
//! slots but one ([`upload_slots`]); one more is **deferred**
//! ([`Sent::Deferred`]): its slot goes back and it is read whole before it
//! queues again. So tricklers opened at a steady rate, each demoted after
//! its window, cannot hold every slot between them: a request that is all
//! here always finds one.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use tokio::time::{Instant, Sleep};
use tonic::Status;

use super::{Incoming, InferPath};
use crate::dispatch::models::ModelId;
use crate::dispatch::pool::Lease;
use crate::worker::upstream::{Exchange, Metadata, ResponseHead};

/// Bytes per second a body must keep arriving at to stay cut through past
/// the grace: each byte received extends the window by 1 / `MIN_RATE` s
/// (Apache's `mod_reqtimeout` `MinRate` for request bodies). A body on a
/// loaded host's loopback arrives at tens of MiB/s (16 × 16 MiB shared
/// one connection at ~250 MiB/s here: over a second each); a trickler at
/// bytes per second gets the grace alone.
pub(super) const MIN_RATE: f64 = (1 << 20) as f64;

/// The most graces a window lasts, however fast the body comes: a slot is
/// held at most 4 s by default, under the stall watchdog's 5 s floor (a
/// worker holding a request it cannot answer, because the body is still
/// coming, must not look stuck).
pub(super) const MAX_WINDOW_GRACES: u32 = 4;

/// How long a request may be forwarded as it arrives: from its head's
/// arrival, the cut-through grace plus the time its received bytes earn at
/// [`MIN_RATE`], at most [`MAX_WINDOW_GRACES`] graces.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    head: Instant,
    grace: Duration,
    /// Bytes received when the head was here.
    at_head: usize,
}

impl Window {
    /// The window of a request whose head is here now, with `received`
    /// bytes of its body.
    pub(super) fn new(grace: Duration, received: usize) -> Self {
        Self {
            head: Instant::now(),
            grace,
            at_head: received,
        }
    }

    /// When the window closes once `received` bytes of the body are here.
    fn until(&self, received: usize) -> Instant {
        let earned = received.saturating_sub(self.at_head) as f64 / MIN_RATE;
        let open =
            (self.grace + Duration::from_secs_f64(earned)).min(self.grace * MAX_WINDOW_GRACES);
        self.head + open
    }

    /// Whether the window is closed now; if not, `timer` is set to when it
    /// would close at the present count.
    fn closed(&self, incoming: &Incoming, timer: Pin<&mut Sleep>) -> bool {
        let until = self.until(incoming.received());
        if until <= Instant::now() {
            return true;
        }
        timer.reset(until);
        false
    }
}

/// Slots of a worker with `limit` permits that unfinished uploads may hold
/// at once: all but one, and at least one (a worker with one slot is cut
/// through to as before; the grace alone bounds what a trickler holds).
pub(super) fn upload_slots(limit: usize) -> usize {
    limit.saturating_sub(1).max(1)
}

/// One of a worker's unfinished uploads, counted while it lives.
struct OpenUpload<'a>(&'a AtomicUsize);

impl<'a> OpenUpload<'a> {
    /// Counts one more upload in `open`, unless `cap` are open already.
    fn take(open: &'a AtomicUsize, cap: usize) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .ok()
        .map(|_| Self(open))
    }
}

impl Drop for OpenUpload<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
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
    /// Its body was still arriving and the worker's slots were all but one
    /// held by unfinished uploads ([`upload_slots`]): nothing was sent, the
    /// body is to be read whole and the request to queue again.
    Deferred,
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
        let late = tokio::time::sleep_until(window.until(incoming.received()));
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
                () = &mut late => {
                    // Returning drops `acquire`: the request leaves the
                    // queue (a permit handed over meanwhile goes back).
                    if window.closed(incoming, late.as_mut()) {
                        return Ok(Queued::Late);
                    }
                }
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
        let process = lease.process();
        let upstream = &process.upstream;
        let unreachable = |e: &dyn std::fmt::Display| super::worker_unreachable(lease, e);
        if incoming.ended {
            let (exchange, head) = upstream
                .call_chunks(meta, &incoming.chunks)
                .await
                .map_err(|e| unreachable(&e))?;
            return Ok(Sent::Answered(exchange, head));
        }
        let Some(open) = OpenUpload::take(&process.open_uploads, upload_slots(lease.limit()))
        else {
            return Ok(Sent::Deferred);
        };
        let grace = tokio::time::sleep_until(window.until(incoming.received()));
        tokio::pin!(grace);
        let mut upload = upstream
            .upload(meta, &incoming.chunks)
            .await
            .map_err(|e| unreachable(&e))?;
        loop {
            let more = tokio::select! {
                biased;
                more = self.read_frame(body, incoming) => more?,
                () = &mut grace => {
                    if window.closed(incoming, grace.as_mut()) {
                        // Dropping the upload resets the worker's stream.
                        return Ok(Sent::Demoted);
                    }
                    continue;
                }
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
        // The body is all the worker's: the slot is an ordinary one now.
        drop(open);
        let (exchange, head) = upload
            .answer(&incoming.chunks)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Sent::Answered(exchange, head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_may_hold_all_slots_but_one_and_give_them_back() {
        assert_eq!(
            [1, 2, 3, 8].map(upload_slots),
            [1, 1, 2, 7],
            "a one-slot worker still takes one upload"
        );
        let open = AtomicUsize::new(0);
        let first = OpenUpload::take(&open, 2).expect("room");
        let second = OpenUpload::take(&open, 2).expect("room");
        assert!(OpenUpload::take(&open, 2).is_none(), "at the cap");
        drop(first);
        let third = OpenUpload::take(&open, 2).expect("a slot given back is room again");
        drop((second, third));
        assert_eq!(open.load(Ordering::Acquire), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_is_the_grace_extended_by_what_arrives_at_the_least_rate_up_to_its_cap() {
        let grace = Duration::from_secs(1);
        let w = Window::new(grace, 1000);
        let head = w.head;
        // A trickler: a few bytes earn nothing to speak of.
        assert!(w.until(1010) - head < grace + Duration::from_millis(1));
        // 2 MiB since the head: two more seconds.
        assert_eq!(w.until(1000 + (2 << 20)) - head, Duration::from_secs(3));
        // However fast the body comes, at most four graces.
        assert_eq!(w.until(1000 + (64 << 20)) - head, grace * MAX_WINDOW_GRACES);
    }
}
