//! The plugin trait and the one way to run a plugin: with a deadline, and
//! with every failure — timeout, transport error, even a panic — turned into
//! a failed [`Verdict`].

use std::any::Any;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::Verdict;

/// The OIP client a check probes a worker with. Cheap to clone; checks take
/// their own copy.
pub type Client = infermesh_proto::GrpcInferenceServiceClient<tonic::transport::Channel>;

/// The future a [`HealthCheck`] returns.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;

/// A health-check plugin: probes one worker (through `client`) and says
/// whether its outputs can be trusted.
///
/// A check reports every problem as a failed [`Verdict`] rather than an
/// error, and holds no per-worker state, so one instance serves every worker
/// and may run concurrently. Run checks with [`run_check`], which bounds
/// them in time.
pub trait HealthCheck: Send + Sync + std::fmt::Debug {
    /// The check's label: its kind (`live`, `ready`, `golden`, `finite`,
    /// `range`, `latency`, `exec`) or a user-given name.
    fn name(&self) -> &str;

    /// The model the check probes; empty for server-wide checks.
    fn model(&self) -> &str;

    /// Probes the worker behind `client`.
    fn check<'a>(&'a self, client: Client) -> CheckFuture<'a>;
}

/// A check's verdicts: labelled with its name and model.
impl Verdict {
    /// A passing verdict for `check`.
    pub fn pass<C>(check: &C, reason: impl Into<String>, latency: Duration) -> Self
    where
        C: HealthCheck + ?Sized,
    {
        Self::new(check, true, reason.into(), latency)
    }

    /// A failing verdict for `check`.
    pub fn fail<C>(check: &C, reason: impl Into<String>, latency: Duration) -> Self
    where
        C: HealthCheck + ?Sized,
    {
        Self::new(check, false, reason.into(), latency)
    }

    /// A verdict that passes iff `result` is `Ok`, with its note or reason.
    pub fn from_result<C>(check: &C, result: Result<String, String>, latency: Duration) -> Self
    where
        C: HealthCheck + ?Sized,
    {
        match result {
            Ok(note) => Self::pass(check, note, latency),
            Err(reason) => Self::fail(check, reason, latency),
        }
    }

    fn new<C>(check: &C, pass: bool, reason: String, latency: Duration) -> Self
    where
        C: HealthCheck + ?Sized,
    {
        Self {
            check: check.name().to_string(),
            model: check.model().to_string(),
            pass,
            reason,
            latency,
        }
    }
}

/// Runs `check` against `client` with a deadline. A timeout, a transport
/// error or a panicking plugin is a failed verdict: this never panics and
/// returns within `timeout` (plus the time to drop the check's future).
pub async fn run_check(check: &dyn HealthCheck, client: Client, timeout: Duration) -> Verdict {
    let started = Instant::now();
    match tokio::time::timeout(timeout, CatchPanic(check.check(client))).await {
        Ok(Ok(verdict)) => verdict,
        Ok(Err(message)) => Verdict::fail(
            check,
            format!("check panicked: {message}"),
            started.elapsed(),
        ),
        Err(_) => Verdict::fail(check, format!("timed out after {timeout:?}"), timeout),
    }
}

/// Polls a future, turning a panic inside it into `Err(message)`.
struct CatchPanic<F>(F);

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        // The future is never polled again after a panic (we return Ready),
        // so observing it half-updated is not a concern.
        match panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(payload.as_ref()))),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
