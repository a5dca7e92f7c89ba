//! The one place in this crate that touches raw memory: a `MAP_SHARED`
//! mapping of a shared-memory file, with bounds-checked copies in and out.
//!
//! Why `unsafe` is confined here, and why it is sound enough to accept:
//!
//! - The mapping is created by `memmap2::MmapOptions::map_raw`, which hands
//!   back a raw pointer and a length and keeps the mapping alive until drop.
//!   Nothing here ever returns a reference into it that outlives a call.
//! - Every access checks `start + len <= mapping length` with checked
//!   arithmetic and panics otherwise; callers ([`ShmRegion`]) check first
//!   and return errors, so the panic only guards against bugs here.
//! - Within this process, a `RwLock` keeps our own writers away from the
//!   short-lived slices handed to closures, so Rust's aliasing rules hold.
//! - Another process (the client) may write the same pages at any time; no
//!   lock can exclude it. We treat the memory as untrusted bytes: we only
//!   copy them in and out (or show them to a closure for the duration of a
//!   call), never build typed values or long-lived references from them. A
//!   concurrent writer can therefore only make us copy torn bytes — which is
//!   exactly the contract of shared-memory tensors: the client must not
//!   touch a tensor while a request using it is in flight.
//! - A client that truncates its file while we copy makes the kernel raise
//!   `SIGBUS` in this process. [`ShmRegion`] checks the file length before
//!   each access, which closes all but a race the client can win only on
//!   purpose; the residual risk is documented in the crate root.
//!
//! [`ShmRegion`]: super::ShmRegion
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::ptr;
use std::sync::{PoisonError, RwLock};

use memmap2::{MmapOptions, MmapRaw};

/// A shared, read-write mapping of `len` bytes of a file from `offset`.
pub(crate) struct Mapping {
    raw: MmapRaw,
    /// Readers (copies out, `with_slice`) share; writers (copies in,
    /// `with_mut_slice`) exclude them. Only this process is covered.
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

    /// Copies `src` into the mapping at `start`.
    pub(crate) fn copy_in(&self, start: usize, src: &[u8]) {
        self.check(start, src.len());
        let _exclusive = self.lock.write().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: in bounds as above; `src` is Rust memory distinct from the
        // mapping. The write lock guarantees no slice handed out by
        // `with_slice` exists in this process while we write. Other
        // processes may read or write concurrently; they see bytes only.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), self.raw.as_mut_ptr().add(start), src.len());
        }
    }

    /// Shows `start..start + len` to `f`. `f` must not call back into this
    /// mapping's writers (it would deadlock).
    pub(crate) fn with_slice<R>(&self, start: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.check(start, len);
        let _shared = self.lock.read().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: in bounds; the slice lives only for the call to `f` and
        // the read lock keeps this process's writers out meanwhile. Another
        // process may still change these bytes under `f`: callers get bytes
        // only, and are told the contents may change (torn reads).
        let slice = unsafe { std::slice::from_raw_parts(self.raw.as_ptr().add(start), len) };
        f(slice)
    }

    /// Lends `start..start + len` mutably to `f`. `f` must not call back
    /// into this mapping (it would deadlock).
    pub(crate) fn with_mut_slice<R>(
        &self,
        start: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        self.check(start, len);
        let _exclusive = self.lock.write().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: in bounds; the write lock makes this the only reference
        // into the mapping in this process for the duration of `f`. Other
        // processes see plain bytes.
        let slice =
            unsafe { std::slice::from_raw_parts_mut(self.raw.as_mut_ptr().add(start), len) };
        f(slice)
    }
}
