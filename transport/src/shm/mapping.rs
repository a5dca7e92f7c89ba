//! Raw memory: a `MAP_SHARED` mapping of a shared-memory file *this process
//! created* (the client side, [`ShmRegion::create`]), with bounds-checked
//! copies in and out, and [`pread_new`], a read of another process's
//! object into a vector that is not zeroed first. Objects another process
//! owns are never mapped (see [`ShmRegion`]).
//!
//! Why `unsafe` is confined here, and why it is sound enough to accept:
//!
//! - The mapping is created by `memmap2::MmapOptions::map_raw`, which hands
//!   back a raw pointer and a length and keeps the mapping alive until drop.
//!   Nothing here ever creates a Rust reference into it: every access is a
//!   raw-pointer copy to or from a distinct Rust buffer.
//! - Every access checks `start + len <= mapping length` with checked
//!   arithmetic and panics otherwise; callers ([`ShmRegion`]) check first
//!   and return errors, so the panic only guards against bugs here.
//! - Within this process, a `RwLock` keeps our own copies in apart from our
//!   own copies out, so this process never races with itself.
//! - Another process (the client) may write the same pages at any time; no
//!   lock can exclude it. We treat the memory as untrusted bytes: we only
//!   copy them in and out, never build references or typed values from
//!   them. A
//!   concurrent writer can therefore only make us copy torn bytes — which is
//!   exactly the contract of shared-memory tensors: the client must not
//!   touch a tensor while a request using it is in flight.
//! - Truncating a mapped file under a copy raises `SIGBUS`. The object is
//!   ours (created `0600`, unlinked on drop), so only a process running as
//!   our user can do that — which can kill us anyway. Servers, whose
//!   objects belong to their clients, use `pread`/`pwrite` instead.
//!
//! - The leased API ([`super::lease`]) also lends slices of a region this
//!   process created, to the one holder of its lease: a mutable slice while
//!   the holder has it alone (building inputs in place), read-only slices
//!   once it is shared (outputs viewed in place). [`Mapping::slice`] and
//!   [`Mapping::slice_mut`] are `unsafe fn`s whose contract is exactly
//!   that; `lease.rs` is the only caller.
//!
//! [`ShmRegion`]: super::ShmRegion
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{PoisonError, RwLock};

use memmap2::{MmapOptions, MmapRaw};

/// A shared, read-write mapping of `len` bytes of a file from `offset`.
pub(crate) struct Mapping {
    raw: MmapRaw,
    /// Copies out share; copies in exclude them. Only this process is
    /// covered.
    lock: RwLock<()>,
}

impl Mapping {
    /// Maps `len` bytes of `file` from `offset`; `file` must be open read and
    /// write, `len` must be greater than zero and the range within the file.
    pub(crate) fn new(file: &File, offset: u64, len: usize) -> io::Result<Self> {
        let raw = MmapOptions::new().offset(offset).len(len).map_raw(file)?;
        Ok(Self {
            raw,
            lock: RwLock::new(()),
        })
    }

    /// Panics unless `start..start + len` lies within the mapping.
    fn check(&self, start: usize, len: usize) {
        let end = start
            .checked_add(len)
            .expect("mapping range overflows usize");
        assert!(end <= self.raw.len(), "mapping range out of bounds");
    }

    /// Copies `dst.len()` bytes from `start` into `dst`.
    pub(crate) fn copy_out(&self, start: usize, dst: &mut [u8]) {
        self.check(start, dst.len());
        let _shared = self.lock.read().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `start..start + dst.len()` is within the live mapping
        // (checked above; the mapping lives as long as `self`); `dst` is a
        // distinct Rust buffer, so the ranges do not overlap. The read lock
        // excludes our own writers. Another process may write these bytes
        // concurrently; we copy them as plain bytes and never interpret
        // them, so the worst outcome is torn data in `dst`.
        unsafe {
            ptr::copy_nonoverlapping(self.raw.as_ptr().add(start), dst.as_mut_ptr(), dst.len());
        }
    }

    /// Copies `len` bytes from `start` into a new vector, without zeroing it
    /// first (a 16 MiB tensor would otherwise be written twice).
    pub(crate) fn to_vec(&self, start: usize, len: usize) -> Vec<u8> {
        self.check(start, len);
        let mut out = Vec::with_capacity(len);
        let _shared = self.lock.read().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the source range is in bounds (checked above) and, as in
        // `copy_out`, only copied as bytes. The destination is `out`'s own
        // allocation of at least `len` bytes; after the copy all `len` bytes
        // are initialized, so `set_len(len)` exposes no uninitialized byte.
        unsafe {
            ptr::copy_nonoverlapping(self.raw.as_ptr().add(start), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        out
    }

    /// The mapped bytes `start..start + len`, lent as a slice (the leased
    /// API, [`super::lease`]). Panics unless the range is in the mapping.
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing in this process writes these bytes:
    /// the caller holds the region's lease and has shared it read-only
    /// (see [`super::lease`] for why the pool guarantees it).
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &[u8] {
        self.check(start, len);
        // SAFETY: in bounds (checked above) of a mapping that lives as long
        // as `self`; the caller guarantees no writer in this process (see
        // the function's contract). Another process writing these bytes
        // can only change what the slice reads, as the module docs accept
        // for the regions this process owns.
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr().add(start), len) }
    }

    /// The mapped bytes `start..start + len`, lent as a mutable slice (a
    /// caller building a request's inputs in place). Panics unless the
    /// range is in the mapping.
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing else in this process reads or writes
    /// these bytes: the caller holds the region's lease exclusively (`&mut`).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, start: usize, len: usize) -> &mut [u8] {
        self.check(start, len);
        // SAFETY: in bounds (checked above) of a live mapping; exclusive
        // in this process by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.raw.as_mut_ptr().add(start), len) }
    }

    /// The address of byte `start` of `len` in bounds, for a foreign
    /// caller (Python's array interface) that reads and writes it itself.
    /// Panics unless the range is in the mapping.
    pub(crate) fn address(&self, start: usize, len: usize) -> usize {
        self.check(start, len);
        self.raw.as_ptr() as usize + start
    }

    /// Copies `src` into the mapping at `start`.
    pub(crate) fn copy_in(&self, start: usize, src: &[u8]) {
        self.check(start, src.len());
        let _exclusive = self.lock.write().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: in bounds as above; `src` is Rust memory distinct from the
        // mapping. The write lock keeps this process's other copies
        // out while we write. Other
        // processes may read or write concurrently; they see bytes only.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), self.raw.as_mut_ptr().add(start), src.len());
        }
    }
}

/// Reads `len` bytes of `file` at `at` into a new vector without zeroing
/// it first: a server reading a 16 MiB tensor would otherwise write it
/// twice (measured: the `memset` was a tenth of the test worker's time per
/// 16 MiB request). `pread` is bounded by the file's length, so a file
/// truncated meanwhile gives [`io::ErrorKind::UnexpectedEof`], never a
/// fault.
pub(crate) fn pread_new(file: &File, at: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::<u8>::with_capacity(len);
    let mut done = 0usize;
    while done < len {
        let offset = at
            .checked_add(done as u64)
            .and_then(|o| nix::libc::off_t::try_from(o).ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the destination is `out`'s spare capacity from `done`,
        // valid for writes of `len - done` bytes, and `pread` writes at most
        // that many; the descriptor is open for as long as `file` lives.
        let n = unsafe {
            nix::libc::pread(
                file.as_raw_fd(),
                out.as_mut_ptr().add(done).cast(),
                len - done,
                offset,
            )
        };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: `pread` initialized all `len` bytes (the loop ends only when
    // `done == len`).
    unsafe { out.set_len(len) };
    Ok(out)
}
