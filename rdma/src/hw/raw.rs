//! The crate's only `unsafe` code: the two verbs calls whose safety sideway
//! leaves to the caller (registering memory, pointing a work request at
//! local memory).

use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::memory_region::{MemoryRegion, RegisterMemoryRegionError};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendError, PostSendGuard, QueuePair, SetScatterGatherEntry,
    WorkRequestFlags,
};

use crate::memory::RegionMemory;
use crate::verbs::Opcode;

/// Registers all of `mem` with `pd`.
///
/// The caller keeps `mem` alive at least as long as the returned
/// registration (`HwRegistration` holds both, registration first).
pub(super) fn register(
    pd: &Arc<ProtectionDomain>,
    mem: &Arc<RegionMemory>,
    access: AccessFlags,
) -> Result<Arc<MemoryRegion>, RegisterMemoryRegionError> {
    // SAFETY: `mem.addr()..mem.addr() + mem.len()` is one live heap
    // allocation (`RegionMemory` owns a `Box<[u8]>` that never moves or
    // reallocates). It outlives the registration: the only holder of the
    // returned `MemoryRegion` is `HwRegistration`, which also holds an
    // `Arc<RegionMemory>` and drops the region (deregistering) first.
    unsafe { pd.reg_mr(mem.addr() as usize, mem.len(), access) }
}

/// A one-sided work request, as the device sees it.
pub(super) struct RawWorkRequest {
    pub wr_id: u64,
    pub opcode: Opcode,
    pub lkey: u32,
    pub local_addr: u64,
    pub len: u32,
    pub rkey: u32,
    pub remote_addr: u64,
}

/// Posts one signaled READ or WRITE.
///
/// The caller guarantees that `[local_addr, local_addr + len)` lies inside
/// the registration `lkey` names, and keeps that memory and registration
/// alive until the completion for `wr_id` is polled (or the queue pair is
/// destroyed): `SidewayQp::post` moves the owning `Registered` into the
/// pending table, which the poller empties only on completion.
pub(super) fn post(qp: &mut ExtendedQueuePair, wr: &RawWorkRequest) -> Result<(), PostSendError> {
    let mut guard = qp.start_post_send();
    let handle = guard.construct_wr(wr.wr_id, WorkRequestFlags::Signaled);
    let handle = match wr.opcode {
        Opcode::Read => handle.setup_read(wr.rkey, wr.remote_addr),
        Opcode::Write => handle.setup_write(wr.rkey, wr.remote_addr),
    };
    // SAFETY: per this function's contract the SGE names registered memory
    // that stays valid until the device is done with it. The remote range is
    // checked by the peer's HCA, not trusted here.
    unsafe { handle.setup_sge(wr.lkey, wr.local_addr, wr.len) };
    guard.post()
}
