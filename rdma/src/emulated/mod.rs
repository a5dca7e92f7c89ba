//! The software emulation of the verbs device, over loopback TCP.
//!
//! Each emulated endpoint runs a responder on `127.0.0.1:0` that executes
//! one-sided READ and WRITE requests against the endpoint's registered
//! regions, checking the rkey, the bounds and the access flags as an HCA
//! does ([`wire::check_access`]); a failed check answers "remote access
//! error" and drops the connection. A queue pair is a TCP connection to the
//! peer's responder; like an RC queue pair, it goes to the error state on
//! the first failed completion and flushes everything posted after. rkeys
//! are random 32-bit values, so a guessed key is as unlikely to work as on
//! hardware. [`EmulatedFaults`] breaks or stalls the link on demand.
//!
//! No `unsafe` here: regions are [`RegionMemory`] and the responder goes
//! through its lock.

mod faults;
mod qp;
mod server;
mod wire;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use faults::EmulatedFaults;

use crate::RdmaError;
use crate::memory::{Access, RegionMemory};
use crate::verbs::{MemoryRegistration, QueuePair, VerbsDevice};
use wire::RegionBounds;

/// An emulated verbs device: one endpoint with its responder.
pub struct EmulatedDevice {
    endpoint: Arc<Endpoint>,
    /// Dropping it stops the responder and its connections.
    _shutdown: watch::Sender<()>,
}

/// What the responder, the queue pairs and the registrations share.
pub(crate) struct Endpoint {
    addr: SocketAddr,
    regions: Mutex<HashMap<u32, Region>>,
    faults: EmulatedFaults,
    next_qpn: AtomicU32,
    next_key: AtomicU64,
    key_seed: RandomState,
}

/// A registered region as the responder sees it.
#[derive(Clone)]
pub(crate) struct Region {
    pub mem: Arc<RegionMemory>,
    pub access: Access,
}

impl Region {
    fn bounds(&self) -> RegionBounds {
        RegionBounds {
            addr: self.mem.addr(),
            len: self.mem.len() as u64,
            access: self.access,
        }
    }
}

impl EmulatedDevice {
    /// Binds the responder on loopback and starts serving.
    pub async fn start(faults: EmulatedFaults) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let endpoint = Arc::new(Endpoint {
            addr: listener.local_addr()?,
            regions: Mutex::default(),
            faults,
            next_qpn: AtomicU32::new(1),
            next_key: AtomicU64::new(0),
            key_seed: RandomState::new(),
        });
        let (shutdown, shutdown_rx) = watch::channel(());
        tokio::spawn(server::serve(
            listener,
            Arc::downgrade(&endpoint),
            shutdown_rx,
        ));
        Ok(EmulatedDevice {
            endpoint,
            _shutdown: shutdown,
        })
    }

    /// The responder's address.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.addr
    }
}

impl Endpoint {
    pub(crate) fn faults(&self) -> &EmulatedFaults {
        &self.faults
    }

    /// The region an rkey (or lkey) names.
    pub(crate) fn region(&self, key: u32) -> Option<Region> {
        self.lock().get(&key).cloned()
    }

    fn new_key(&self) -> u32 {
        loop {
            let n = self.next_key.fetch_add(1, Ordering::Relaxed);
            let key = self.key_seed.hash_one(n) as u32;
            if key != 0 && !self.lock().contains_key(&key) {
                return key;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Region>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl VerbsDevice for EmulatedDevice {
    fn kind(&self) -> &'static str {
        "emulated"
    }

    fn register(
        &self,
        mem: Arc<RegionMemory>,
        access: Access,
    ) -> Result<Box<dyn MemoryRegistration>, RdmaError> {
        let key = self.endpoint.new_key();
        self.endpoint.lock().insert(key, Region { mem, access });
        Ok(Box::new(EmulatedRegistration {
            key,
            endpoint: Arc::downgrade(&self.endpoint),
        }))
    }

    fn create_qp(&self) -> Result<Box<dyn QueuePair>, RdmaError> {
        let qpn = self.endpoint.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        Ok(Box::new(qp::EmulatedQp::new(
            qpn,
            Arc::clone(&self.endpoint),
        )))
    }

    fn max_transfer(&self) -> u64 {
        wire::MAX_PAYLOAD
    }
}

/// A key in the endpoint's region table; removed on drop.
struct EmulatedRegistration {
    key: u32,
    endpoint: Weak<Endpoint>,
}

impl MemoryRegistration for EmulatedRegistration {
    fn lkey(&self) -> u32 {
        self.key
    }

    fn rkey(&self) -> u32 {
        self.key
    }
}

impl Drop for EmulatedRegistration {
    fn drop(&mut self) {
        if let Some(endpoint) = self.endpoint.upgrade() {
            endpoint.lock().remove(&self.key);
        }
    }
}
