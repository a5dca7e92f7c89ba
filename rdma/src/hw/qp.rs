//! A verbs RC queue pair: created in INIT, moved to RTR and RTS from the
//! peer's [`QpInfo`], posting one-sided work with completions from the
//! device's poller.

use std::hash::{BuildHasher, RandomState};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::device_context::LinkLayer;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState, SendOperationFlags,
};
use tokio::sync::oneshot;

use super::poller::Pending;
use super::raw::{self, RawWorkRequest};
use super::{DeviceShared, mtu_bytes, mtu_from_bytes};
use crate::verbs::{BoxFuture, Completion, QueuePair, WcStatus, WorkRequest};
use crate::{EndpointInfo, QpInfo, RdmaError};

pub(super) struct SidewayQp {
    inner: Arc<QpInner>,
}

struct QpInner {
    /// `None` once destroyed.
    qp: Mutex<Option<ExtendedQueuePair>>,
    device: Arc<DeviceShared>,
    info: QpInfo,
    broken: Arc<AtomicBool>,
}

impl SidewayQp {
    /// Creates the QP and moves it to INIT with remote read and write
    /// enabled (this end is the responder for the peer's operations).
    pub(super) fn create(device: Arc<DeviceShared>) -> Result<Self, RdmaError> {
        let mut qp = device
            .pd
            .create_qp_builder()
            .setup_send_cq(Arc::clone(&device.cq))
            .setup_recv_cq(Arc::clone(&device.cq))
            .setup_max_send_wr(device.max_send_wr)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_ops_flags(SendOperationFlags::Read | SendOperationFlags::Write)
            .build_ex()
            .map_err(|e| RdmaError::verbs("create_qp_ex", e))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(device.port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
            );
        qp.modify(&attr)
            .map_err(|e| RdmaError::verbs("modify_qp(INIT)", e))?;
        let info = QpInfo {
            gid: Ipv6Addr::from(device.gid),
            lid: device.lid,
            qpn: qp.qp_number(),
            psn: (RandomState::new().hash_one(qp.qp_number()) as u32) & 0xff_ffff,
            mtu: mtu_bytes(device.mtu),
        };
        Ok(SidewayQp {
            inner: Arc::new(QpInner {
                qp: Mutex::new(Some(qp)),
                device,
                info,
                broken: Arc::default(),
            }),
        })
    }
}

impl QpInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ExtendedQueuePair>> {
        self.qp.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// INIT → RTR → RTS towards `peer` (blocking).
    fn connect(&self, peer: &QpInfo) -> Result<(), RdmaError> {
        let dev = &self.device;
        let mtu = mtu_from_bytes(peer.mtu.min(self.info.mtu))
            .ok_or_else(|| RdmaError::InvalidEndpoint(format!("mtu {}", peer.mtu)))?;
        let mut av = AddressHandleAttribute::new();
        av.setup_dest_lid(peer.lid)
            .setup_port(dev.port)
            .setup_service_level(0);
        if dev.link_layer == LinkLayer::Ethernet || !peer.gid.is_unspecified() {
            av.setup_grh_dest_gid(&Gid::from(peer.gid))
                .setup_grh_src_gid_index(dev.gid_index)
                .setup_grh_hop_limit(64);
        }
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(peer.qpn)
            .setup_rq_psn(peer.psn)
            .setup_max_dest_read_atomic(dev.dest_rd_atomic)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.info.psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(dev.rd_atomic);
        let mut guard = self.lock();
        let qp = guard
            .as_mut()
            .ok_or_else(|| RdmaError::Closed("queue pair destroyed".into()))?;
        qp.modify(&rtr)
            .map_err(|e| RdmaError::Connect(format!("modify_qp(RTR): {e}")))?;
        qp.modify(&rts)
            .map_err(|e| RdmaError::Connect(format!("modify_qp(RTS): {e}")))?;
        Ok(())
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // Destroying the QP stops the device from touching its work
        // requests' memory; only then may their buffers go back.
        drop(self.lock().take());
        for p in self.device.poller.pending.remove_qp(self.info.qpn) {
            let detail = Some("queue pair destroyed".to_string());
            let _ = p
                .reply
                .send(Completion::new(p.wr, WcStatus::Flushed, detail));
        }
    }
}

impl QueuePair for SidewayQp {
    fn local_info(&self) -> EndpointInfo {
        EndpointInfo::Verbs(self.inner.info)
    }

    fn connect(&self, peer: EndpointInfo) -> BoxFuture<'_, Result<(), RdmaError>> {
        Box::pin(async move {
            let EndpointInfo::Verbs(peer) = peer else {
                return Err(RdmaError::KindMismatch {
                    local: "verbs",
                    peer: peer.kind(),
                });
            };
            let inner = Arc::clone(&self.inner);
            tokio::task::spawn_blocking(move || inner.connect(&peer))
                .await
                .map_err(|e| RdmaError::Connect(format!("connect task failed: {e}")))?
        })
    }

    fn post(&self, wr: WorkRequest) -> oneshot::Receiver<Completion> {
        let (reply, rx) = oneshot::channel();
        let inner = &self.inner;
        if inner.broken.load(Ordering::Acquire) {
            let _ = reply.send(Completion::new(wr, WcStatus::Flushed, None));
            return rx;
        }
        let Ok(len) = u32::try_from(wr.local.len()) else {
            let _ = reply.send(Completion::new(wr, WcStatus::LocalLength, None));
            return rx;
        };
        let raw_wr = RawWorkRequest {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            lkey: wr.local.lkey(),
            local_addr: wr.local.memory().addr(),
            len,
            rkey: wr.remote.rkey(),
            remote_addr: wr.remote.addr(),
        };
        let mut guard = inner.lock();
        let Some(qp) = guard.as_mut() else {
            let _ = reply.send(Completion::new(wr, WcStatus::Flushed, None));
            return rx;
        };
        // In the table before the device can complete it.
        let pending = &inner.device.poller.pending;
        pending.insert(
            raw_wr.wr_id,
            Pending {
                wr,
                reply,
                qpn: inner.info.qpn,
                broken: Arc::clone(&inner.broken),
            },
        );
        match raw::post(qp, &raw_wr) {
            Ok(()) => inner.device.poller.wake(),
            Err(e) => {
                if let Some(p) = pending.remove(raw_wr.wr_id) {
                    let detail = Some(format!("post_send failed: {e}"));
                    let _ = p
                        .reply
                        .send(Completion::new(p.wr, WcStatus::LocalQpOperation, detail));
                }
            }
        }
        rx
    }

    fn is_broken(&self) -> bool {
        self.inner.broken.load(Ordering::Acquire)
    }
}
