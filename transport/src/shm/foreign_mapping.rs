//! [`ForeignMapping`]: a mapping of a shared-memory object *another
//! process owns* (a client's registered region, opened by a server), which
//! code in this process never touches: only the kernel writes it, as the
//! destination buffer of a `pread(2)`.
//!
//! # Why a server may map a client's object this way
//!
//! The client can truncate its object at any moment. A load or store by
//! this process's code to a mapped page past the new end of file raises
//! `SIGBUS` and kills the server, and no length check before the access can
//! close that race — which is why the server otherwise copies with
//! `pread`/`pwrite` on the descriptor ([`ShmRegion`](super::ShmRegion)).
//! But when the *kernel* touches user memory on a system call's behalf
//! (`copy_to_user`), a page that cannot be faulted in — a mapped page past
//! the end of file included — makes the call fail with `EFAULT` (or return
//! the bytes copied before it), never a signal. So a `pread` from one
//! region's descriptor into another region's mapping is one copy at memory
//! speed, where `copy_file_range(2)` between two tmpfs files walks the
//! page cache page by page through a pipe (measured: 2–3× slower than a
//! `memcpy` per 16 MiB; BENCHMARKS.md, issue 27), and a truncated
//! destination is an error, as a truncated source (a short read) is.
//!
//! The mapping is made once, the first time the region is a copy's
//! destination, and kept until the region is dropped (its registration
//! ends): Triton too maps a region once, when it is registered.
//!
//! Why the `unsafe` here is sound: the mapping lives as long as `self`;
//! every range passed to the kernel is checked to lie inside it; no Rust
//! reference into it is ever made (nothing here reads or writes it), so
//! neither another process writing the same pages nor a truncation can
//! break an aliasing or validity rule of this process.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use memmap2::{MmapOptions, MmapRaw};

/// A shared, read-write mapping of `len` bytes of another process's object
/// from `offset`, written only by `pread` (see the module docs).
pub(crate) struct ForeignMapping {
    raw: MmapRaw,
}

/// Why a [`ForeignMapping::read_from`] stopped short.
#[derive(Debug)]
pub(crate) enum Shortfall {
    /// The source file ended first: it was truncated.
    SourceEnded,
    /// A page of the mapping could not be faulted in: the mapped object was
    /// truncated (the kernel's `EFAULT`).
    DestinationGone,
    /// Another error from `pread`.
    Os(io::Error),
}

impl ForeignMapping {
    /// Maps `len` bytes (> 0) of `file` from `offset`; `file` must be open
    /// read and write. The object may be shorter than the range: pages past
    /// its end are simply never written.
    pub(crate) fn new(file: &File, offset: u64, len: usize) -> io::Result<Self> {
        let raw = MmapOptions::new().offset(offset).len(len).map_raw(file)?;
        Ok(Self { raw })
    }

    /// Reads `len` bytes of `src` from `src_at` into the mapping at `start`,
    /// with `pread(2)` straight into the mapped pages. Panics unless the
    /// range lies within the mapping.
    pub(crate) fn read_from(
        &self,
        start: usize,
        src: &File,
        src_at: u64,
        len: usize,
    ) -> Result<(), Shortfall> {
        let end = start
            .checked_add(len)
            .expect("mapping range overflows usize");
        assert!(end <= self.raw.len(), "mapping range out of bounds");
        let mut done = 0usize;
        while done < len {
            let at = src_at
                .checked_add(done as u64)
                .and_then(|o| nix::libc::off_t::try_from(o).ok())
                .ok_or_else(|| Shortfall::Os(io::ErrorKind::InvalidInput.into()))?;
            // SAFETY: `start + done .. start + len` lies within the mapping
            // (checked above), which lives as long as `self`; the kernel
            // writes at most `len - done` bytes there. No reference to the
            // memory exists in this process. A page the kernel cannot fault
            // in makes `pread` fail with `EFAULT` (or return short): no
            // signal, see the module docs.
            let n = unsafe {
                nix::libc::pread(
                    src.as_raw_fd(),
                    self.raw.as_mut_ptr().add(start + done).cast(),
                    len - done,
                    at,
                )
            };
            match n {
                0 => return Err(Shortfall::SourceEnded),
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(nix::libc::EINTR) => {}
                        Some(nix::libc::EFAULT) => return Err(Shortfall::DestinationGone),
                        _ => return Err(Shortfall::Os(e)),
                    }
                }
            }
        }
        Ok(())
    }
}
