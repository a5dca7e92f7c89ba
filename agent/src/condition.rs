//! Waiting for a condition whose changes a [`Notify`] announces (a
//! client's backlog clearing, a stream's client taking its answers).
//!
//! The waiter registers with the `Notify` before it reads the condition,
//! so a change (and its `notify_waiters`) between the read and the wait
//! still wakes it; that ordering is easy to get wrong at each call site,
//! so it is written once here.

use tokio::sync::Notify;

/// Returns once `ready()` holds, checking it again each time `changed` is
/// notified.
pub async fn until(changed: &Notify, ready: impl Fn() -> bool) {
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if ready() {
            return;
        }
        notified.await;
    }
}
