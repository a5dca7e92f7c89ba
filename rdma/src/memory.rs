//! Host memory that can be registered with a device, and the access a
//! registration grants.

use std::ops::{Deref, DerefMut};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What a peer may do with a registered region. Local write access is
/// always granted (the owner fills its buffers, and RDMA READ lands in
/// local memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// No remote access: staging buffers for this end's own READ/WRITE.
    Local,
    /// Peers may RDMA READ it (a client's input tensors).
    RemoteRead,
    /// Peers may RDMA WRITE it (a client's output buffer).
    RemoteWrite,
    /// Peers may READ and WRITE it.
    RemoteReadWrite,
}

impl Access {
    /// Whether a peer may READ the region.
    pub fn remote_read(self) -> bool {
        matches!(self, Access::RemoteRead | Access::RemoteReadWrite)
    }

    /// Whether a peer may WRITE the region.
    pub fn remote_write(self) -> bool {
        matches!(self, Access::RemoteWrite | Access::RemoteReadWrite)
    }
}

/// A heap allocation that never moves while it lives, so its address can be
/// handed to a device.
///
/// CPU access goes through a lock (the owner's [`Registered`] views, the
/// emulated responder). A real NIC accesses the memory by DMA without the
/// lock; the protocol keeps the CPU away from a buffer while a peer may
/// access it (see the crate docs).
///
/// [`Registered`]: crate::Registered
#[derive(Debug)]
pub struct RegionMemory {
    data: RwLock<Box<[u8]>>,
    addr: u64,
    len: usize,
}

impl RegionMemory {
    /// A zeroed allocation of `len` bytes.
    pub fn new(len: usize) -> Self {
        let data = vec![0u8; len].into_boxed_slice();
        let addr = data.as_ptr() as u64;
        RegionMemory {
            data: RwLock::new(data),
            addr,
            len,
        }
    }

    /// The address of the first byte (what descriptors and SGEs carry).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The size of the allocation.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shared CPU access to the first `len` bytes.
    pub fn read(&self, len: usize) -> RegionRef<'_> {
        RegionRef {
            guard: self.data.read().unwrap_or_else(|p| p.into_inner()),
            len,
        }
    }

    /// Exclusive CPU access to the first `len` bytes.
    pub fn write(&self, len: usize) -> RegionMut<'_> {
        RegionMut {
            guard: self.data.write().unwrap_or_else(|p| p.into_inner()),
            len,
        }
    }
}

/// Shared view of registered memory; derefs to `[u8]`.
pub struct RegionRef<'a> {
    guard: RwLockReadGuard<'a, Box<[u8]>>,
    len: usize,
}

impl Deref for RegionRef<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.guard[..self.len]
    }
}

/// Exclusive view of registered memory; derefs to `[u8]`.
pub struct RegionMut<'a> {
    guard: RwLockWriteGuard<'a, Box<[u8]>>,
    len: usize,
}

impl Deref for RegionMut<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.guard[..self.len]
    }
}

impl DerefMut for RegionMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.guard[..self.len]
    }
}
