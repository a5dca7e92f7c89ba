//! The waker a connection's task gives its timers and shutdown signals:
//! it notes that it was used, so the task polls them only when one of them
//! may have fired (or was just reset), not on each of its passes.
//!
//! At concurrency 1 a request costs the client connection's driver three
//! or four passes (the request arrives, the worker answers, reads that find
//! nothing) and the worker connection's task two, and polling the
//! cancellation futures, sleeps and notifications on each of them was
//! about 3k instructions per request (callgrind; BENCHMARKS.md). A future
//! once polled stays registered with the waker it was given until it
//! fires; this one records the firing and passes it on to the task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};

/// See the module docs.
pub struct Alarm {
    shared: Arc<Bell>,
    /// `shared` as a waker, handed to the timers and signals.
    waker: Waker,
    /// The task's waker as last given to `shared` (compared without a
    /// lock on each pass).
    task: Option<Waker>,
}

struct Bell {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Bell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(w) = task {
            w.wake();
        }
    }
}

impl Default for Alarm {
    fn default() -> Self {
        Self::new()
    }
}

impl Alarm {
    /// An alarm that has fired: the first pass polls everything.
    pub fn new() -> Self {
        let shared = Arc::new(Bell {
            fired: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Self {
            waker: Waker::from(Arc::clone(&shared)),
            shared,
            task: None,
        }
    }

    /// Called at the start of each of the task's passes with its
    /// context: whether a timer or signal may have fired since the last
    /// pass that said so (then they must be polled, with [`Alarm::context`]).
    pub fn take(&mut self, cx: &Context<'_>) -> bool {
        let same = self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if !same {
            let w = cx.waker().clone();
            *self
                .shared
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(w.clone());
            self.task = Some(w);
        }
        self.shared.fired.swap(false, Ordering::AcqRel)
    }

    /// The context to poll the timers and signals with.
    pub fn context(&self) -> Context<'_> {
        Context::from_waker(&self.waker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The alarm fires once at first, then only when its waker was used,
    /// and each use wakes the task.
    #[test]
    fn it_says_when_its_waker_was_used_and_wakes_the_driver() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&task);
        let mut alarm = Alarm::new();
        assert!(alarm.take(&cx), "the first pass polls everything");
        assert!(!alarm.take(&cx));
        alarm.context().waker().wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task is woken");
        assert!(alarm.take(&cx));
        assert!(!alarm.take(&cx));
        // A task polled with another waker is woken through that one.
        let other = Arc::new(Count(AtomicUsize::new(0)));
        let task2 = Waker::from(Arc::clone(&other));
        assert!(!alarm.take(&Context::from_waker(&task2)));
        alarm.context().waker().wake_by_ref();
        assert_eq!(other.0.load(Ordering::SeqCst), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
