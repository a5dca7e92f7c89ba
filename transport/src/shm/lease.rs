//! [`ShmLease`]: a pooled region lent to one holder, who may write it in
//! place; [`SharedLease`]: the same region shared read-only, whose views
//! ([`SharedLease::view`], a [`Bytes`] without a copy) keep it out of the
//! pool until the last of them is dropped.
//!
//! This is what makes the client's shared-memory ends zero-copy (issue 27):
//! a caller builds its inputs in the region it will send
//! ([`ShmLease::bytes_mut`], typed with [`Element`]), and reads the outputs
//! where the worker wrote them (the response's `raw_output_contents` are
//! views of the region). A region is never reused while a view of it lives:
//! each view holds the shared lease, and the region goes back to the pool
//! when the lease's last holder drops it.
//!
//! # Why lending slices of the mapping is sound
//!
//! `unsafe` is allowed here and in `mapping.rs` only. The argument:
//!
//! - A pooled region's bytes are reached only through its current lease.
//!   The pool never reads or writes tensor bytes itself; an idle region is
//!   in the pool's free list and in no lease; the registration callbacks
//!   and the pool's list of regions touch only names and peers.
//! - A [`ShmLease`] is the region's only lease, so `&mut ShmLease` lends a
//!   `&mut [u8]` no other handle in this process can reach while it lives.
//! - [`ShmLease::share`] consumes the lease into a [`SharedLease`]; from
//!   then on only read-only slices are lent and nothing in this process
//!   writes the region (a `SharedLease` gives no access to
//!   [`ShmRegion::write`](super::ShmRegion::write)).
//! - Other processes: the worker the region is registered with writes the
//!   output windows while a call runs, and reads the inputs. After the
//!   answer it has no reason to touch them; a process of our own user that
//!   does can change what a view reads (or truncate the file and raise
//!   `SIGBUS`), which such a process could do to us anyway — the trust the
//!   client's own regions already carry (see `mapping.rs`), and the one
//!   tritonclient's `get_contents_as_numpy` asks for.

#![allow(unsafe_code)]

use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;
use infermesh_proto::tensor::DataType;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::mapping::Mapping;
use super::pool::{PooledRegion, ShmPool};
use crate::error::ShmError;

/// A region leased from a [`ShmPool`], held by one owner; returned to the
/// pool on drop.
pub struct ShmLease {
    /// Always `Some` until drop.
    region: Option<Arc<PooledRegion>>,
    pool: ShmPool,
}

impl ShmLease {
    pub(crate) fn new(region: Arc<PooledRegion>, pool: ShmPool) -> Self {
        Self {
            region: Some(region),
            pool,
        }
    }

    fn pooled(&self) -> &PooledRegion {
        self.region
            .as_deref()
            .expect("lease holds its region until drop")
    }

    /// The pooled region, to outlive the lease (registration callbacks).
    pub(crate) fn shared(&self) -> Arc<PooledRegion> {
        Arc::clone(
            self.region
                .as_ref()
                .expect("lease holds its region until drop"),
        )
    }

    /// The pool it came from.
    pub fn pool(&self) -> &ShmPool {
        &self.pool
    }

    /// Bytes in the region.
    pub fn len(&self) -> u64 {
        self.pooled().region().len()
    }

    /// Always false: a region holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The mapping and the bounds-checked range `offset..offset + len`.
    fn range(&self, offset: u64, len: u64) -> Result<(&Mapping, usize, usize), ShmError> {
        let region = self.pooled().region();
        region.check_with(|| format!("region '{}'", self.pooled().name()), offset, len)?;
        let mapping = region
            .mapping()
            .expect("the pool maps every region it creates");
        // Both fit: the window was checked against a mapping of this size.
        Ok((mapping, offset as usize, len as usize))
    }

    /// `len` bytes from `offset`, to write in place.
    pub fn bytes_mut(&mut self, offset: u64, len: u64) -> Result<&mut [u8], ShmError> {
        if len == 0 {
            return Ok(&mut []);
        }
        let (mapping, start, len) = self.range(offset, len)?;
        // SAFETY: `&mut self` is the region's only lease (module docs), so
        // nothing else in this process reaches these bytes while the slice
        // borrows it.
        Ok(unsafe { mapping.slice_mut(start, len) })
    }

    /// Shares the lease: from now on the region is read-only here, and it
    /// goes back to the pool when the last clone (and every view) is gone.
    pub fn share(self) -> SharedLease {
        SharedLease(Arc::new(self))
    }
}

impl Deref for ShmLease {
    type Target = PooledRegion;

    fn deref(&self) -> &PooledRegion {
        self.pooled()
    }
}

impl Drop for ShmLease {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.give_back(region);
        }
    }
}

impl std::fmt::Debug for ShmLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShmLease").field(&self.region).finish()
    }
}

/// A lease shared read-only: by the request that references its region and
/// by the views of its outputs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SharedLease(Arc<ShmLease>);

impl SharedLease {
    /// The region's registered name.
    pub fn name(&self) -> &str {
        self.0.pooled().name()
    }

    /// Bytes in the region.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Always false: a region holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the region came from `pool`.
    pub fn is_from(&self, pool: &ShmPool) -> bool {
        self.0.pool.same_pool(pool)
    }

    /// The pooled region (its name and registrations).
    pub(crate) fn pooled(&self) -> Arc<PooledRegion> {
        self.0.shared()
    }

    /// `len` bytes from `offset`, read in place.
    pub fn slice(&self, offset: u64, len: u64) -> Result<&[u8], ShmError> {
        if len == 0 {
            return Ok(&[]);
        }
        let (mapping, start, len) = self.0.range(offset, len)?;
        // SAFETY: the lease is shared: nothing in this process writes the
        // region while any clone lives (module docs).
        Ok(unsafe { mapping.slice(start, len) })
    }

    /// `len` bytes from `offset` as [`Bytes`] without a copy; the region
    /// stays leased (out of the pool) while the `Bytes` or any clone of it
    /// lives.
    pub fn view(&self, offset: u64, len: u64) -> Result<Bytes, ShmError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let (_, start, len) = self.0.range(offset, len)?;
        Ok(Bytes::from_owner(View {
            lease: self.clone(),
            start,
            len,
        }))
    }

    /// The address of `offset` with `len` bytes in bounds, for a foreign
    /// caller (Python's array interface) that reads or writes the region
    /// itself, keeping a clone of this lease while it does.
    pub fn address(&self, offset: u64, len: u64) -> Result<usize, ShmError> {
        let (mapping, start, len) = self.0.range(offset, len.max(1))?;
        Ok(mapping.address(start, len))
    }

    /// Holders of the lease: this one, its clones and its views.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

/// A view of a shared lease: the owner of a [`Bytes`].
struct View {
    lease: SharedLease,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        let (mapping, _, _) = self
            .lease
            .0
            .range(self.start as u64, self.len as u64)
            .expect("checked when the view was made");
        // SAFETY: as in `SharedLease::slice`: `self.lease` keeps the lease
        // shared and the mapping alive while the slice borrows `self`.
        unsafe { mapping.slice(self.start, self.len) }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type a tensor is built or read as in place: the fixed-size
/// OIP datatypes whose every bit pattern is a value (`BOOL` is not one; use
/// `u8`). `FP16` and `BF16` are read as `u16`.
pub trait Element:
    sealed::Sealed + FromBytes + IntoBytes + Immutable + KnownLayout + Copy + 'static
{
    /// The OIP datatype of a tensor of this element.
    const DATATYPE: DataType;
}

macro_rules! elements {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATATYPE: DataType = DataType::$d;
        }
    )*};
}

elements!(
    u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    f32 => Fp32, f64 => Fp64,
);

/// `bytes` as elements of `T`, without a copy: `None` unless its length is
/// a multiple of `T`'s size and it is aligned for `T` (a region's tensors
/// are: 64-byte offsets in a page-aligned mapping).
pub fn elements<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    <[T]>::ref_from_bytes(bytes).ok()
}

/// As [`elements`], mutable.
pub fn elements_mut<T: Element>(bytes: &mut [u8]) -> Option<&mut [T]> {
    <[T]>::mut_from_bytes(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::pool::{MIN_REGION_BYTES, PoolConfig};
    use crate::shm::test_dir::TestDir;

    fn pool(dir: &TestDir) -> ShmPool {
        ShmPool::new(PoolConfig {
            dir: dir.shm().clone(),
            max_total_bytes: 1 << 24,
            min_region_bytes: MIN_REGION_BYTES,
        })
    }

    #[test]
    fn bytes_written_in_place_are_what_a_view_and_the_file_hold() {
        let dir = TestDir::new("lease-in-place");
        let p = pool(&dir);
        let mut lease = p.lease(4096).unwrap();
        let floats = elements_mut::<f32>(lease.bytes_mut(64, 16).unwrap()).unwrap();
        floats.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let name = lease.name().to_string();
        let shared = lease.share();
        let view = shared.view(64, 16).unwrap();
        assert_eq!(elements::<f32>(&view).unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        // Another process sees the same bytes (the server opens the file).
        let server = crate::ShmRegion::open_in(dir.shm(), &name, 64, 16).expect("open as a server");
        assert_eq!(server.read(0, 16).unwrap(), view);
    }

    #[test]
    fn a_view_keeps_its_region_out_of_the_pool_until_dropped() {
        let dir = TestDir::new("lease-view");
        let p = pool(&dir);
        let shared = p.lease(1000).unwrap().share();
        let name = shared.name().to_string();
        let view = shared.view(0, 10).unwrap();
        drop(shared);
        assert_eq!(p.counters().leased, 1, "the view holds the region");
        let other = p.lease(1000).unwrap();
        assert_ne!(other.name(), name, "a viewed region is not lent again");
        drop(other);
        let clone = view.slice(2..4);
        drop(view);
        assert_eq!(p.counters().leased, 1, "a slice of a view holds it too");
        drop(clone);
        assert_eq!(p.counters().leased, 0);
        let names: Vec<String> = (0..2)
            .map(|_| p.lease(1000).unwrap().name().into())
            .collect();
        assert!(names.contains(&name), "released: lent again");
    }

    #[test]
    fn every_access_is_bounds_checked() {
        let dir = TestDir::new("lease-bounds");
        let p = pool(&dir);
        let mut lease = p.lease(1).unwrap();
        let len = lease.len();
        assert!(lease.bytes_mut(0, len).is_ok());
        assert!(lease.bytes_mut(1, len).is_err());
        assert!(lease.bytes_mut(u64::MAX, 1).is_err());
        assert!(lease.bytes_mut(len, 0).is_ok());
        let shared = lease.share();
        assert!(shared.view(len - 1, 2).is_err());
        assert!(shared.slice(u64::MAX, 2).is_err());
        assert!(shared.address(len, 1).is_err());
        assert_eq!(shared.view(len, 0).unwrap().len(), 0);
    }

    #[test]
    fn typed_access_needs_whole_aligned_elements() {
        let mut buf = [0u64; 4];
        let bytes = buf.as_mut_bytes();
        assert_eq!(elements::<f32>(&bytes[..16]).map(<[f32]>::len), Some(4));
        assert!(elements::<f32>(&bytes[..15]).is_none(), "not whole");
        assert!(elements::<f32>(&bytes[1..9]).is_none(), "misaligned");
        assert_eq!(elements_mut::<i64>(bytes).map(|s| s.len()), Some(4));
    }
}
