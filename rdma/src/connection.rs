//! A connected queue pair with the two operations the tensor path needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::memory::Access;
use crate::mr_cache::MrCache;
use crate::verbs::{Opcode, QueuePair, VerbsDevice, WcStatus, WorkRequest, completion_error};
use crate::{EndpointInfo, RdmaError, Registered, RemoteBuffer};

/// What an engine and its connections share.
pub(crate) struct EngineShared {
    pub device: Arc<dyn VerbsDevice>,
    pub cache: Arc<MrCache>,
    /// Bounds outstanding work requests (so the CQ cannot overflow).
    pub outstanding: Arc<Semaphore>,
    pub next_wr_id: AtomicU64,
}

impl EngineShared {
    /// A buffer from the cache, registering on a miss off the runtime.
    pub(crate) async fn register(
        &self,
        len: usize,
        access: Access,
    ) -> Result<Registered, RdmaError> {
        if let Some(hit) = self.cache.take(len, access) {
            return Ok(hit);
        }
        let cache = Arc::clone(&self.cache);
        tokio::task::spawn_blocking(move || cache.register(len, access))
            .await
            .map_err(|e| RdmaError::Io(std::io::Error::other(e)))?
    }
}

/// A reliable connection to one peer (cheap to clone).
///
/// Operations on it are one-sided: [`read`](Self::read) and
/// [`write`](Self::write) access the peer's registered memory without its
/// CPU. After any failed operation the connection is in the error state
/// ([`is_broken`](Self::is_broken)) and every later operation fails with
/// [`RdmaError::Closed`]; reconnect.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<ConnectionInner>,
}

struct ConnectionInner {
    qp: Box<dyn QueuePair>,
    local: EndpointInfo,
    peer: EndpointInfo,
    shared: Arc<EngineShared>,
}

impl Connection {
    pub(crate) fn new(
        qp: Box<dyn QueuePair>,
        peer: EndpointInfo,
        shared: Arc<EngineShared>,
    ) -> Self {
        Connection {
            inner: Arc::new(ConnectionInner {
                local: qp.local_info(),
                qp,
                peer,
                shared,
            }),
        }
    }

    /// This end's queue pair, as sent to the peer.
    pub fn local_info(&self) -> &EndpointInfo {
        &self.inner.local
    }

    /// The peer's queue pair.
    pub fn peer_info(&self) -> &EndpointInfo {
        &self.inner.peer
    }

    /// This end's queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.local.qpn()
    }

    /// Whether the connection is in the error state.
    pub fn is_broken(&self) -> bool {
        self.inner.qp.is_broken()
    }

    /// RDMA READ of `remote` into a local registered buffer; returns a copy
    /// of the bytes. A zero-length `remote` returns empty bytes without
    /// posting anything (see the crate docs).
    pub async fn read(&self, remote: RemoteBuffer) -> Result<Bytes, RdmaError> {
        if remote.is_empty() {
            return Ok(Bytes::new());
        }
        let len = self.transfer_len(remote.len())?;
        let local = self.inner.shared.register(len, Access::Local).await?;
        let local = self.execute(Opcode::Read, local, remote).await?;
        let bytes = Bytes::copy_from_slice(&local.as_slice());
        Ok(bytes)
    }

    /// RDMA WRITE of `data` to the start of `remote`; `data` may be shorter
    /// than `remote`, not longer. Empty `data` completes without posting.
    pub async fn write(&self, remote: RemoteBuffer, data: &[u8]) -> Result<(), RdmaError> {
        if data.len() as u64 > remote.len() {
            return Err(RdmaError::OutOfBounds {
                addr: remote.addr(),
                len: data.len() as u64,
                reason: "data is longer than the remote buffer",
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        let target = remote.slice(0, data.len() as u64)?;
        let len = self.transfer_len(target.len())?;
        let mut local = self.inner.shared.register(len, Access::Local).await?;
        local.as_mut_slice().copy_from_slice(data);
        self.execute(Opcode::Write, local, target).await?;
        Ok(())
    }

    fn transfer_len(&self, len: u64) -> Result<usize, RdmaError> {
        let max = self.inner.shared.device.max_transfer();
        if len > max {
            return Err(RdmaError::TooLarge { len, max });
        }
        usize::try_from(len).map_err(|_| RdmaError::TooLarge { len, max })
    }

    /// Posts one work request and waits for its completion. If this future
    /// is dropped the request still completes; its buffer returns to the
    /// pool only then.
    async fn execute(
        &self,
        opcode: Opcode,
        local: Registered,
        remote: RemoteBuffer,
    ) -> Result<Registered, RdmaError> {
        let shared = &self.inner.shared;
        let permit = Arc::clone(&shared.outstanding)
            .acquire_owned()
            .await
            .map_err(|_| RdmaError::Closed("engine shut down".into()))?;
        let wr = WorkRequest {
            wr_id: shared.next_wr_id.fetch_add(1, Ordering::Relaxed),
            opcode,
            local,
            remote,
            _permit: Some(permit),
        };
        let completion = self
            .inner
            .qp
            .post(wr)
            .await
            .map_err(|_| RdmaError::Closed("the device shut down".into()))?;
        match completion.status {
            WcStatus::Success => Ok(completion.wr.local),
            status => Err(completion_error(status, completion.detail, remote)),
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.inner.local)
            .field("peer", &self.inner.peer)
            .field("broken", &self.is_broken())
            .finish()
    }
}
