//! Failure injection for the emulation, so the layers above can test the
//! fallback ("a forced RDMA failure mid-stream re-sends on gRPC").

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The state of an emulated endpoint's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Working.
    Up,
    /// The responder stops answering; operations against it hang.
    Stalled,
    /// Down: in-flight operations fail, queue pairs go to the error state,
    /// new connections are refused.
    Broken,
}

/// The fault switches of one emulated engine (cheap to clone; all clones
/// act on the same endpoint).
///
/// A broken link behaves as on hardware after the transport gives up:
/// operations in flight complete with "transport retry exceeded"
/// ([`RdmaError::LinkBroken`](crate::RdmaError::LinkBroken)), the queue
/// pairs are in the error state so later operations on them are flushed
/// ([`RdmaError::Closed`](crate::RdmaError::Closed)), the endpoint's
/// responder drops its peers (whose operations fail the same way), and new
/// connections are refused until [`restore`](Self::restore).
#[derive(Clone)]
pub struct EmulatedFaults {
    inner: Arc<FaultState>,
}

struct FaultState {
    link: watch::Sender<LinkState>,
    /// Operations left before the link breaks by itself.
    ops_left: Mutex<Option<u64>>,
}

impl Default for EmulatedFaults {
    fn default() -> Self {
        EmulatedFaults {
            inner: Arc::new(FaultState {
                link: watch::Sender::new(LinkState::Up),
                ops_left: Mutex::new(None),
            }),
        }
    }
}

impl EmulatedFaults {
    /// Breaks the link now.
    pub fn break_link(&self) {
        self.inner.link.send_replace(LinkState::Broken);
    }

    /// Lets the next `ops` posted operations through, then breaks the link
    /// as the following one is posted (that operation fails).
    pub fn fail_after(&self, ops: u64) {
        *self.lock_ops() = Some(ops);
    }

    /// The responder stops answering (a silent link): operations against
    /// this endpoint hang until [`restore`](Self::restore) or
    /// [`break_link`](Self::break_link).
    pub fn stall(&self) {
        self.inner.link.send_replace(LinkState::Stalled);
    }

    /// Link up again and any `fail_after` disarmed. Queue pairs that went to
    /// the error state stay there (as on hardware); new connections work.
    pub fn restore(&self) {
        *self.lock_ops() = None;
        self.inner.link.send_replace(LinkState::Up);
    }

    /// Whether the link is broken.
    pub fn is_broken(&self) -> bool {
        *self.inner.link.borrow() == LinkState::Broken
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.inner.link.subscribe()
    }

    /// Counts one posted operation; true when it is the one that breaks the
    /// link (the caller fails it and calls [`break_link`](Self::break_link)).
    pub(crate) fn on_post(&self) -> bool {
        let mut ops = self.lock_ops();
        match ops.as_mut() {
            None => false,
            Some(0) => {
                *ops = None;
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
        }
    }

    fn lock_ops(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.inner
            .ops_left
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// Resolves when the link is broken (or the fault state is gone).
pub(crate) async fn broken(link: &mut watch::Receiver<LinkState>) {
    let _ = link.wait_for(|s| *s == LinkState::Broken).await;
}

/// Resolves when the link is not stalled; false if it broke instead.
pub(crate) async fn unstalled(link: &mut watch::Receiver<LinkState>) -> bool {
    match link.wait_for(|s| *s != LinkState::Stalled).await {
        Ok(state) => *state == LinkState::Up,
        Err(_) => false,
    }
}
