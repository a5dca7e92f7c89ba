//! The narrow verbs interface both backends implement: register memory,
//! create and connect an RC queue pair, post one-sided READ/WRITE, get work
//! completions back.
//!
//! [`RdmaEngine`](crate::RdmaEngine) is written against these traits only;
//! `hw` implements them with sideway on a real device and `emulated` over
//! loopback TCP with the same checks and the same error-state behaviour.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::memory::{Access, RegionMemory};
use crate::{EndpointInfo, RdmaError, Registered, RemoteBuffer};

/// A boxed, sendable future (the traits are used as trait objects).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A verbs device with one protection domain: the factory for memory
/// registrations and queue pairs. Methods may block (they are syscalls on
/// hardware); the engine calls them from `spawn_blocking`.
pub trait VerbsDevice: Send + Sync + 'static {
    /// `"verbs"` or `"emulated"`.
    fn kind(&self) -> &'static str;

    /// Registers `mem` for local write plus the remote `access`; the
    /// registration is undone when the returned handle drops.
    fn register(
        &self,
        mem: Arc<RegionMemory>,
        access: Access,
    ) -> Result<Box<dyn MemoryRegistration>, RdmaError>;

    /// A new RC queue pair in the INIT state, remote read and write enabled.
    fn create_qp(&self) -> Result<Box<dyn QueuePair>, RdmaError>;

    /// The largest transfer one work request may carry.
    fn max_transfer(&self) -> u64;
}

/// A memory registration: keys for local SGEs and remote descriptors.
/// Dropping it deregisters the memory; remote access with its rkey then
/// fails.
pub trait MemoryRegistration: Send + Sync {
    /// Key for local scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Key peers present to access the region.
    fn rkey(&self) -> u32;
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync + 'static {
    /// What the peer needs to connect to this queue pair.
    fn local_info(&self) -> EndpointInfo;

    /// INIT → RTR → RTS towards `peer`.
    fn connect(&self, peer: EndpointInfo) -> BoxFuture<'_, Result<(), RdmaError>>;

    /// Posts one signaled work request; its completion (carrying the request
    /// back, so the local buffer stays alive until the device is done with
    /// it) arrives on the returned channel. Posting to a queue pair in the
    /// error state completes at once with [`WcStatus::Flushed`].
    fn post(&self, wr: WorkRequest) -> oneshot::Receiver<Completion>;

    /// Whether the queue pair is in the error state (every later work
    /// request is flushed; reconnect).
    fn is_broken(&self) -> bool;
}

/// The two one-sided operations this crate uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// RDMA READ: remote memory → local buffer.
    Read,
    /// RDMA WRITE: local buffer → remote memory.
    Write,
}

/// One work request: `local` (its first `local.len()` bytes) is the
/// scatter/gather entry, `remote` the peer's range of the same length.
pub struct WorkRequest {
    /// Identifies the completion.
    pub wr_id: u64,
    /// READ or WRITE.
    pub opcode: Opcode,
    /// The local registered buffer.
    pub local: Registered,
    /// The peer's range.
    pub remote: RemoteBuffer,
    /// A slot of the engine's bound on outstanding work requests, released
    /// with the completion.
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
}

/// A work completion, with the request handed back.
pub struct Completion {
    /// Outcome.
    pub status: WcStatus,
    /// What the backend knows beyond the status (the emulation says which
    /// fault; hardware knows no more than the status).
    pub detail: Option<String>,
    /// The completed request.
    pub wr: WorkRequest,
}

impl Completion {
    pub(crate) fn new(wr: WorkRequest, status: WcStatus, detail: Option<String>) -> Self {
        Completion { status, detail, wr }
    }
}

/// Work completion status, the subset of `ibv_wc_status` this path can
/// produce; anything else is kept as its raw value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The local SGE length is wrong for the operation.
    LocalLength,
    /// The local SGE's lkey or range is not a valid local registration.
    LocalProtection,
    /// Internal queue-pair error on the local side.
    LocalQpOperation,
    /// The responder refused: bad rkey, out-of-range address or missing
    /// access right.
    RemoteAccess,
    /// The responder could not parse or execute the request.
    RemoteInvalidRequest,
    /// The responder failed the operation internally.
    RemoteOperation,
    /// Transport retries were exhausted: the peer or link is gone.
    RetryExceeded,
    /// Flushed without execution: the queue pair was already in the error
    /// state.
    Flushed,
    /// Any other raw `ibv_wc_status`.
    Other(u32),
}

/// Turns a failed completion into the crate's error.
pub(crate) fn completion_error(
    status: WcStatus,
    detail: Option<String>,
    remote: RemoteBuffer,
) -> RdmaError {
    match status {
        WcStatus::RemoteAccess => RdmaError::RemoteAccess {
            rkey: remote.rkey(),
            addr: remote.addr(),
            len: remote.len(),
        },
        WcStatus::RetryExceeded => RdmaError::LinkBroken(
            detail.unwrap_or_else(|| "transport retry counter exceeded".to_string()),
        ),
        WcStatus::Flushed => RdmaError::Closed(detail.unwrap_or_else(|| {
            "work request flushed: the queue pair is in the error state; reconnect".to_string()
        })),
        other => RdmaError::Completion(other),
    }
}
