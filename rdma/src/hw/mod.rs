//! The real verbs device through sideway (rdma-core's modern API:
//! `ibv_wr_*` posting, extended CQ polling).
//!
//! sideway sits on rdma-mummy-sys, which `dlopen`s `libibverbs.so.1` when the
//! process starts; without it every verbs call fails with `EOPNOTSUPP`, which
//! [`SidewayDevice::open`] reports as [`RdmaError::LibraryMissing`]. So this
//! module is always compiled and the binary runs on hosts without rdma-core.
//!
//! One device context, protection domain and completion queue per engine;
//! a poller thread drains the CQ and hands each completion to the task
//! waiting for it, so no verbs call blocks the tokio runtime.

mod poller;
mod qp;
#[allow(unsafe_code)]
mod raw;

use std::net::Ipv6Addr;
use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::completion::ExtendedCompletionQueue;
use sideway::ibverbs::device::{DeviceInfo, DeviceList, GetDeviceListErrorKind};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use crate::memory::{Access, RegionMemory};
use crate::verbs::{MemoryRegistration, QueuePair, VerbsDevice};
use crate::{RdmaConfig, RdmaError};
use poller::Poller;

/// The largest transfer of one work request (devices allow 2 GiB).
const MAX_TRANSFER: u64 = 1 << 30;

/// An open verbs device: context, PD, one CQ, the chosen port and GID.
pub struct SidewayDevice {
    shared: Arc<DeviceShared>,
    description: String,
}

/// What queue pairs share with the device.
struct DeviceShared {
    // Field order is drop order: the poller (which holds the CQ) stops
    // first, the context closes last.
    poller: Poller,
    cq: Arc<ExtendedCompletionQueue>,
    pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
    port: u8,
    gid_index: u8,
    gid: Gid,
    lid: u16,
    mtu: Mtu,
    link_layer: LinkLayer,
    max_send_wr: u32,
    /// Outstanding RDMA READs as initiator / responder (`max_rd_atomic`,
    /// `max_dest_rd_atomic`).
    rd_atomic: u8,
    dest_rd_atomic: u8,
}

impl SidewayDevice {
    /// Opens the configured (or first) device with an active port. Blocks
    /// (device queries); call it from a blocking context.
    pub fn open(config: &RdmaConfig) -> Result<Self, RdmaError> {
        let list = DeviceList::new().map_err(|e| match &e.0 {
            GetDeviceListErrorKind::Ibverbs(io) if io.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                RdmaError::LibraryMissing
            }
            other => RdmaError::NoDevice(format!("listing verbs devices failed: {other}")),
        })?;
        if list.is_empty() {
            return Err(RdmaError::NoDevice("no verbs device found".into()));
        }
        let mut tried = Vec::new();
        for device in list.iter() {
            let name = device.name();
            if config.device.as_ref().is_some_and(|want| *want != name) {
                continue;
            }
            let ctx = match device.open() {
                Ok(ctx) => ctx,
                Err(e) => {
                    tried.push(format!("{name}: open failed: {e}"));
                    continue;
                }
            };
            let port = match ctx.query_port(config.port) {
                Ok(port) => port,
                Err(e) => {
                    tried.push(format!("{name} port {}: {e}", config.port));
                    continue;
                }
            };
            if port.port_state() != PortState::Active {
                tried.push(format!(
                    "{name} port {} {:?}",
                    config.port,
                    port.port_state()
                ));
                continue;
            }
            return Self::with_context(
                name,
                ctx,
                config,
                port.lid(),
                port.active_mtu(),
                port.link_layer(),
            );
        }
        Err(RdmaError::NoDevice(
            match (&config.device, tried.is_empty()) {
                (Some(want), true) => format!("verbs device {want} not found"),
                _ => format!("no usable port: {}", tried.join("; ")),
            },
        ))
    }

    fn with_context(
        name: String,
        ctx: Arc<DeviceContext>,
        config: &RdmaConfig,
        lid: u16,
        mtu: Mtu,
        link_layer: LinkLayer,
    ) -> Result<Self, RdmaError> {
        let attr = ctx
            .query_device()
            .map_err(|e| RdmaError::verbs("query_device", e))?;
        let gid_index = match config.gid_index {
            Some(index) => index,
            None => pick_gid_index(&ctx, config.port),
        };
        let gid = ctx
            .query_gid(config.port, gid_index)
            .map_err(|e| RdmaError::verbs("query_gid", e))?;
        let gid_index = u8::try_from(gid_index)
            .map_err(|_| RdmaError::verbs("query_gid", "gid index above 255"))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| RdmaError::verbs("alloc_pd", e))?;
        let max_outstanding = u32::try_from(config.max_outstanding).unwrap_or(u32::MAX);
        let max_send_wr = max_outstanding.min(attr.max_qp_wr().max(1) as u32);
        let cqe = (2 * max_outstanding).min(attr.max_cqe().max(1) as u32);
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cqe)
            .build_ex()
            .map_err(|e| RdmaError::verbs("create_cq_ex", e))?;
        let clamp = |n: i32| n.clamp(1, 16) as u8;
        let description = format!(
            "{name} port {} ({link_layer:?}, gid[{gid_index}] {}, lid {lid}, mtu {})",
            config.port,
            Ipv6Addr::from(gid),
            mtu_bytes(mtu)
        );
        let shared = Arc::new(DeviceShared {
            poller: Poller::start(Arc::clone(&cq), &name)?,
            cq,
            pd,
            _ctx: ctx,
            port: config.port,
            gid_index,
            gid,
            lid,
            mtu,
            link_layer,
            max_send_wr,
            rd_atomic: clamp(attr.max_qp_init_rd_atom()),
            dest_rd_atomic: clamp(attr.max_qp_rd_atom()),
        });
        Ok(SidewayDevice {
            shared,
            description,
        })
    }

    /// Device, port, GID and MTU, for the log line.
    pub fn description(&self) -> &str {
        &self.description
    }
}

/// On RoCE prefer a RoCE v2 GID of an IPv4 address (routable, what RDMA-CM
/// picks), then any RoCE v2 GID; otherwise index 0 (InfiniBand).
fn pick_gid_index(ctx: &DeviceContext, port: u8) -> u32 {
    let Ok(table) = ctx.query_gid_table() else {
        return 0;
    };
    let score = |gid: Gid, ty: GidType| match (ty, Ipv6Addr::from(gid).to_ipv4_mapped()) {
        (GidType::RoceV2, Some(_)) => 3,
        (GidType::RoceV2, None) if !gid.is_unicast_link_local() => 2,
        (GidType::RoceV2, None) => 1,
        _ => 0,
    };
    table
        .iter()
        .filter(|e| e.port_num() == u32::from(port) && !e.gid().is_zero())
        .max_by_key(|e| {
            (
                score(e.gid(), e.gid_type()),
                std::cmp::Reverse(e.gid_index()),
            )
        })
        .map_or(0, |e| e.gid_index())
}

pub(crate) fn mtu_bytes(mtu: Mtu) -> u32 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

pub(crate) fn mtu_from_bytes(bytes: u32) -> Option<Mtu> {
    Some(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// A registered region; deregistered on drop, before the memory goes.
struct HwRegistration {
    mr: Arc<MemoryRegion>,
    _mem: Arc<RegionMemory>,
}

impl MemoryRegistration for HwRegistration {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

impl VerbsDevice for SidewayDevice {
    fn kind(&self) -> &'static str {
        "verbs"
    }

    fn register(
        &self,
        mem: Arc<RegionMemory>,
        access: Access,
    ) -> Result<Box<dyn MemoryRegistration>, RdmaError> {
        let flags = match access {
            Access::Local => AccessFlags::LocalWrite,
            Access::RemoteRead => AccessFlags::LocalWrite | AccessFlags::RemoteRead,
            Access::RemoteWrite => AccessFlags::LocalWrite | AccessFlags::RemoteWrite,
            Access::RemoteReadWrite => {
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite
            }
        };
        let mr = raw::register(&self.shared.pd, &mem, flags)
            .map_err(|e| RdmaError::verbs("reg_mr", e))?;
        Ok(Box::new(HwRegistration { mr, _mem: mem }))
    }

    fn create_qp(&self) -> Result<Box<dyn QueuePair>, RdmaError> {
        Ok(Box::new(qp::SidewayQp::create(Arc::clone(&self.shared))?))
    }

    fn max_transfer(&self) -> u64 {
        MAX_TRANSFER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_bytes_round_trip() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_from_bytes(bytes).unwrap()), bytes);
        }
        assert!(mtu_from_bytes(1500).is_none());
    }

    #[test]
    fn open_without_rdma_core_says_so() {
        if std::fs::read_dir("/sys/class/infiniband").is_ok() {
            return;
        }
        let err = SidewayDevice::open(&RdmaConfig::default()).err().unwrap();
        assert!(
            matches!(err, RdmaError::LibraryMissing | RdmaError::NoDevice(_)),
            "{err}"
        );
    }
}
