//! [`ShmRegion`]: a window of a POSIX shared-memory object with a safe,
//! bounds-checked, copy-in/copy-out API.
//!
//! # Why a server never touches a client's object through a mapping
//!
//! A region comes in two kinds, and they move bytes differently:
//!
//! - **created** here ([`ShmRegion::create`], our own client): the object is
//!   ours, so it is mapped and copies go through the mapping (`memcpy`).
//! - **opened** here ([`ShmRegion::open`], a server resolving a region a
//!   client registered): the object belongs to another process, which can
//!   truncate it at any moment. Touching a mapped page past the new end of
//!   file raises `SIGBUS`, which kills the whole server; no length check
//!   before the copy can close that race. So this process's code never
//!   reads or writes an opened region's memory: copies are
//!   `pread(2)`/`pwrite(2)` on its file descriptor, which the kernel bounds
//!   by the file's length at the time of the call — a truncated file gives
//!   a short read (reported as [`ShmError::Truncated`]), never a fault. No
//!   slice of another process's memory is ever lent out either: every
//!   access is a copy.
//! - A copy from one opened region to another ([`ShmRegion::copy_to`], a
//!   server computing on shared memory) is a `pread` from the source's
//!   descriptor *into a mapping of the destination*, made once and kept
//!   while the region is registered ([`ForeignMapping`]): the kernel, not
//!   this process, writes the mapped pages, and a page past a truncated end
//!   fails the call with `EFAULT` instead of raising a signal. One copy at
//!   memory speed, still never a fault.
//!
//! Sealing (`memfd` + `F_SEAL_SHRINK`) would also rule out the fault, but
//! only for objects the client created that way; Triton's convention (and
//! tritonclient) uses plain POSIX shm, which cannot be sealed, so the server
//! cannot require it. On tmpfs a `pread` costs about what the `memcpy` from a
//! mapping does (one copy either way, plus one system call per tensor); see
//! `benches/shm_copy.rs`.
//!
//! [`ForeignMapping`]: super::foreign_mapping::ForeignMapping

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::OnceLock;

use bytes::Bytes;

use super::foreign_mapping::{ForeignMapping, Shortfall};
use super::key::{ShmDir, ShmKey};
use super::mapping::Mapping;
use crate::error::ShmError;

/// A window `[offset, offset + len)` of a shared-memory file.
///
/// Servers [`open`](ShmRegion::open) the object a client registered and
/// copy with `pread`/`pwrite`; clients [`create`](ShmRegion::create) their
/// own, mapped, which is unlinked when the region is dropped (see the module
/// docs for why). Offsets in the accessors are relative to the window. Every
/// access is bounds-checked with checked arithmetic; on an opened region a
/// file truncated since registration is an error, never a fault.
pub struct ShmRegion {
    key: ShmKey,
    path: PathBuf,
    file: File,
    /// Start of the window in the file.
    offset: u64,
    /// Bytes in the window (> 0).
    len: u64,
    /// The file's device and inode: two windows of one file may overlap.
    file_id: (u64, u64),
    access: Access,
}

/// How bytes move in and out of the window.
enum Access {
    /// Created here: ours, mapped; the file is unlinked on drop.
    Owned(Mapping),
    /// Opened here: another process's object; `pread`/`pwrite` only, and
    /// the window's mapping, made the first time it is a
    /// [`copy_to`](ShmRegion::copy_to) destination, written only by the
    /// kernel.
    Opened(OnceLock<ForeignMapping>),
}

impl ShmRegion {
    /// Opens `key` in `/dev/shm` for copies of `byte_size` bytes from
    /// `offset`.
    pub fn open(key: &str, offset: u64, byte_size: u64) -> Result<Self, ShmError> {
        Self::open_in(&ShmDir::system(), key, offset, byte_size)
    }

    /// Opens `key` in `dir` for copies of `byte_size` bytes from `offset`
    /// (not mapped: see the module docs).
    ///
    /// The file is opened read-write with `O_NOFOLLOW` (a symlink planted in
    /// the directory is refused) and `O_NONBLOCK` (a FIFO cannot stall us);
    /// it must be a regular file, and `offset + byte_size` must not overflow
    /// and must lie within its length.
    pub fn open_in(dir: &ShmDir, key: &str, offset: u64, byte_size: u64) -> Result<Self, ShmError> {
        let key = ShmKey::parse(key)?;
        let path = dir.path_of(&key);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| ShmError::Open {
                key: key.to_string(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| ShmError::Open {
            key: key.to_string(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(ShmError::NotRegularFile {
                key: key.to_string(),
            });
        }
        let what = || format!("shared memory key '{key}'");
        window_len(what, offset, byte_size, meta.len())?;
        Ok(Self {
            key,
            path,
            file,
            offset,
            len: byte_size,
            file_id: (meta.dev(), meta.ino()),
            access: Access::Opened(OnceLock::new()),
        })
    }

    /// Creates a new object `key` of `size` bytes in `/dev/shm`, mode 0600,
    /// and maps all of it. The file is unlinked when the region is dropped.
    pub fn create(key: &str, size: u64) -> Result<Self, ShmError> {
        Self::create_in(&ShmDir::system(), key, size)
    }

    /// As [`create`](ShmRegion::create), in `dir`. Fails if the name exists.
    pub fn create_in(dir: &ShmDir, key: &str, size: u64) -> Result<Self, ShmError> {
        let key = ShmKey::parse(key)?;
        let path = dir.path_of(&key);
        let what = || format!("new shared memory object '{key}'");
        let len = window_len(what, 0, size, size)?;
        let created = |source| ShmError::Create {
            key: key.to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(created)?;
        let mapped = file
            .set_len(size)
            .and_then(|()| file.metadata())
            .map_err(created)
            .and_then(|meta| {
                let map = Mapping::new(&file, 0, len).map_err(created)?;
                Ok((map, (meta.dev(), meta.ino())))
            });
        match mapped {
            Ok((map, file_id)) => Ok(Self {
                key,
                path,
                file,
                offset: 0,
                len: size,
                file_id,
                access: Access::Owned(map),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// The mapping of a region created here (`None` for an opened one,
    /// which is never mapped).
    pub(crate) fn mapping(&self) -> Option<&Mapping> {
        match &self.access {
            Access::Owned(map) => Some(map),
            Access::Opened(_) => None,
        }
    }

    /// The key this region was opened or created with.
    pub fn key(&self) -> &ShmKey {
        &self.key
    }

    /// Start of the window in the file.
    pub fn file_offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the window.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a region holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `[offset, offset + len)` lies within the window, with
    /// checked arithmetic; `what` names the region or tensor in the error.
    pub fn check(&self, what: &str, offset: u64, len: u64) -> Result<(), ShmError> {
        self.check_with(|| what.to_string(), offset, len)
    }

    /// As [`check`](ShmRegion::check), naming the region only on error (no
    /// allocation on the hot path).
    pub(crate) fn check_with(
        &self,
        what: impl FnOnce() -> String,
        offset: u64,
        len: u64,
    ) -> Result<(), ShmError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ShmError::OutOfBounds {
                what: what(),
                offset,
                byte_size: len,
                limit: self.len,
            }),
        }
    }

    /// Copies `len` bytes from `offset` out of the region.
    pub fn read(&self, offset: u64, len: u64) -> Result<Bytes, ShmError> {
        let len = self.range(offset, len)?;
        match &self.access {
            Access::Owned(map) => Ok(Bytes::from(map.to_vec(offset as usize, len))),
            Access::Opened(_) => {
                match super::mapping::pread_new(&self.file, self.offset + offset, len) {
                    Ok(out) => Ok(Bytes::from(out)),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        Err(self.truncated(self.file_len()))
                    }
                    Err(source) => Err(self.copy_error(source)),
                }
            }
        }
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        self.range(offset, dst.len() as u64)?;
        match &self.access {
            Access::Owned(map) => {
                map.copy_out(offset as usize, dst);
                Ok(())
            }
            Access::Opened(_) => self.pread(offset, dst),
        }
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// On an opened region the file must still cover the range: a write is
    /// refused rather than growing a file its owner truncated. (If the owner
    /// truncates between that check and the write, the write re-extends the
    /// file by at most the registered window — the owner's own doing, and
    /// no fault either way.)
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ShmError> {
        self.range(offset, data.len() as u64)?;
        match &self.access {
            Access::Owned(map) => {
                map.copy_in(offset as usize, data);
                Ok(())
            }
            Access::Opened(_) => {
                let at = self.offset + offset;
                let file_len = self.file_len();
                if at + data.len() as u64 > file_len {
                    return Err(self.truncated(file_len));
                }
                self.file
                    .write_all_at(data, at)
                    .map_err(|source| self.copy_error(source))
            }
        }
    }

    /// Copies `len` bytes from `offset` of this window to `dst_offset` of
    /// `dst`'s window without a buffer here: when `dst` was opened here, a
    /// `pread(2)` from this region's descriptor into `dst`'s mapping (made
    /// on the first copy, kept while `dst` lives; the module docs say why
    /// that cannot fault). Into a region created here, or between
    /// overlapping ranges of one file, it reads and writes instead. Both
    /// windows are bounds-checked; as with [`write`](ShmRegion::write), a
    /// destination file its owner shrank is refused, and a source shrunk
    /// meanwhile is [`ShmError::Truncated`] — never a fault.
    pub fn copy_to(
        &self,
        offset: u64,
        dst: &ShmRegion,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), ShmError> {
        let n = self.range(offset, len)?;
        dst.range(dst_offset, len)?;
        let (from, to) = (self.offset + offset, dst.offset + dst_offset);
        let overlapping = self.file_id == dst.file_id && from < to + len && to < from + len;
        let mapping = match &dst.access {
            Access::Opened(mapping) if !overlapping => mapping,
            _ => {
                let bytes = self.read(offset, len)?;
                return dst.write(dst_offset, &bytes);
            }
        };
        let mapping = match mapping.get() {
            Some(m) => m,
            None => {
                let m = ForeignMapping::new(&dst.file, dst.offset, dst.len as usize)
                    .map_err(|source| dst.copy_error(source))?;
                // Two first copies at once: one mapping is kept.
                let _ = mapping.set(m);
                mapping.get().expect("set above")
            }
        };
        match mapping.read_from(dst_offset as usize, &self.file, from, n) {
            Ok(()) => Ok(()),
            Err(Shortfall::SourceEnded) => Err(self.truncated(self.file_len())),
            Err(Shortfall::DestinationGone) => Err(dst.truncated(dst.file_len())),
            Err(Shortfall::Os(source)) => Err(self.copy_error(source)),
        }
    }

    /// `pread` of `dst.len()` bytes at window offset `offset` (in bounds).
    fn pread(&self, offset: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        match self.file.read_exact_at(dst, self.offset + offset) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.truncated(self.file_len()))
            }
            Err(source) => Err(self.copy_error(source)),
        }
    }

    fn file_len(&self) -> u64 {
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    fn truncated(&self, len: u64) -> ShmError {
        ShmError::Truncated {
            key: self.key.to_string(),
            len,
        }
    }

    fn copy_error(&self, source: io::Error) -> ShmError {
        ShmError::Copy {
            key: self.key.to_string(),
            source,
        }
    }

    /// Bounds-checks an access against the window and returns its length as
    /// `usize` (it fits: the window was checked to fit at open/create).
    fn range(&self, offset: u64, len: u64) -> Result<usize, ShmError> {
        self.check_with(|| format!("region '{}'", self.key), offset, len)?;
        Ok(len as usize)
    }
}

/// Checks a window `[offset, offset + byte_size)` of a file of `file_len`
/// bytes and returns its length as `usize`.
fn window_len(
    what: impl Fn() -> String,
    offset: u64,
    byte_size: u64,
    file_len: u64,
) -> Result<usize, ShmError> {
    if byte_size == 0 {
        return Err(ShmError::EmptyWindow { what: what() });
    }
    let out_of_bounds = || ShmError::OutOfBounds {
        what: what(),
        offset,
        byte_size,
        limit: file_len,
    };
    match offset.checked_add(byte_size) {
        Some(end) if end <= file_len => usize::try_from(byte_size).map_err(|_| out_of_bounds()),
        _ => Err(out_of_bounds()),
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        if matches!(self.access, Access::Owned(_)) {
            // The server's own mapping keeps the memory alive until it
            // unregisters; unlinking only removes the name.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl fmt::Debug for ShmRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmRegion")
            .field("key", &self.key.as_str())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("owned", &matches!(self.access, Access::Owned(_)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_dir::TestDir;

    #[test]
    fn created_region_is_visible_to_an_opener_and_unlinked_on_drop() {
        let dir = TestDir::new("region-roundtrip");
        let client = ShmRegion::create_in(dir.shm(), "/rt", 4096).unwrap();
        client.write(100, b"hello").unwrap();
        let server = ShmRegion::open_in(dir.shm(), "/rt", 64, 1024).unwrap();
        assert_eq!(&server.read(36, 5).unwrap()[..], b"hello");
        server.write(0, b"out").unwrap();
        let mut buf = [0u8; 3];
        client.read_into(64, &mut buf).unwrap();
        assert_eq!(&buf, b"out");
        let path = dir.shm().path_of(&ShmKey::parse("/rt").unwrap());
        assert!(path.exists());
        drop(client);
        assert!(!path.exists(), "the creator unlinks on drop");
        // The opener's mapping outlives the name.
        assert_eq!(&server.read(0, 3).unwrap()[..], b"out");
    }

    #[test]
    fn copy_to_copies_between_windows_through_a_mapping_or_a_buffer() {
        let dir = TestDir::new("region-copy");
        let client = ShmRegion::create_in(dir.shm(), "cp", 1 << 20).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        client.write(4096, &data).unwrap();
        let a = ShmRegion::open_in(dir.shm(), "cp", 4096, 300_000).unwrap();
        let b = ShmRegion::open_in(dir.shm(), "cp", 512 << 10, 300_000).unwrap();
        a.copy_to(0, &b, 0, 300_000).unwrap();
        assert_eq!(&b.read(0, 300_000).unwrap()[..], &data[..]);
        // Overlapping ranges of one file: the copy is made through a
        // buffer, as `memmove` would.
        let whole = ShmRegion::open_in(dir.shm(), "cp", 0, 1 << 20).unwrap();
        whole.copy_to(4096, &whole, 4096 + 100, 1000).unwrap();
        assert_eq!(&whole.read(4196, 1000).unwrap()[..], &data[..1000]);
        assert!(matches!(
            a.copy_to(1, &b, 0, 300_000),
            Err(ShmError::OutOfBounds { .. })
        ));
        assert!(matches!(
            a.copy_to(0, &b, 1, 300_000),
            Err(ShmError::OutOfBounds { .. })
        ));
        // A file shrunk under the windows: an error, no fault, no growth.
        let file = OpenOptions::new()
            .write(true)
            .open(dir.shm().path().join("cp"))
            .unwrap();
        file.set_len(8192).unwrap();
        assert!(matches!(
            a.copy_to(0, &b, 0, 300_000),
            Err(ShmError::Truncated { .. })
        ));
        assert_eq!(file.metadata().unwrap().len(), 8192);
    }

    /// Mappings of `path` in this process, from `/proc/self/maps`.
    fn mappings_of(path: &std::path::Path) -> usize {
        let path = path.to_str().unwrap();
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.ends_with(path))
            .count()
    }

    #[test]
    fn a_copy_destination_is_mapped_once_and_unmapped_with_its_region() {
        let dir = TestDir::new("region-map-once");
        let client = ShmRegion::create_in(dir.shm(), "m", 1 << 20).unwrap();
        let path = dir.shm().path().join("m");
        assert_eq!(mappings_of(&path), 1, "the client's own mapping");
        let a = ShmRegion::open_in(dir.shm(), "m", 0, 256 << 10).unwrap();
        let b = ShmRegion::open_in(dir.shm(), "m", 512 << 10, 256 << 10).unwrap();
        for i in 0..10u8 {
            client.write(0, &[i; 4096]).unwrap();
            a.copy_to(0, &b, 4096, 4096).unwrap();
            let mut out = [0u8; 4096];
            client.read_into((512 << 10) + 4096, &mut out).unwrap();
            assert_eq!(out, [i; 4096]);
        }
        assert_eq!(
            mappings_of(&path),
            2,
            "the destination is mapped once for all its copies; the source never"
        );
        drop(b);
        assert_eq!(mappings_of(&path), 1, "unmapped when the region goes");
    }

    /// Runs `attempt` 2000 times while another thread shrinks the file at
    /// `path` to nothing and grows it back to `size`, over and over.
    fn while_truncated(path: &std::path::Path, size: u64, mut attempt: impl FnMut()) {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = OpenOptions::new().write(true).open(path).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    file.set_len(0).unwrap();
                    file.set_len(size).unwrap();
                }
            });
            for _ in 0..2000 {
                attempt();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }

    #[test]
    fn copies_survive_a_destination_truncated_and_re_extended_meanwhile() {
        // The destination's mapping is written by the kernel (`pread`), so
        // a page past the end is `EFAULT`, not a `SIGBUS` killing the test.
        let dir = TestDir::new("region-copy-race");
        let size = 1 << 20;
        let _c = ShmRegion::create_in(dir.shm(), "src", size).unwrap();
        let _d = ShmRegion::create_in(dir.shm(), "dst", size).unwrap();
        let src = ShmRegion::open_in(dir.shm(), "src", 0, size).unwrap();
        let dst = ShmRegion::open_in(dir.shm(), "dst", 0, size).unwrap();
        let path = dir.shm().path().join("dst");
        let (mut ok, mut truncated) = (0, 0);
        while_truncated(&path, size, || match src.copy_to(0, &dst, 0, size) {
            Ok(()) => ok += 1,
            Err(ShmError::Truncated { .. }) => truncated += 1,
            Err(e) => panic!("unexpected {e}"),
        });
        assert_eq!(ok + truncated, 2000);
    }

    #[test]
    fn create_refuses_an_existing_name_and_zero_size() {
        let dir = TestDir::new("region-create");
        let _a = ShmRegion::create_in(dir.shm(), "a", 64).unwrap();
        assert!(matches!(
            ShmRegion::create_in(dir.shm(), "a", 64),
            Err(ShmError::Create { .. })
        ));
        assert!(matches!(
            ShmRegion::create_in(dir.shm(), "b", 0),
            Err(ShmError::EmptyWindow { .. })
        ));
    }

    #[test]
    fn every_access_is_bounds_checked_without_overflow() {
        let dir = TestDir::new("region-bounds");
        let r = ShmRegion::create_in(dir.shm(), "b", 128).unwrap();
        assert!(r.read(0, 128).is_ok());
        assert!(r.read(128, 0).is_ok());
        for (offset, len) in [(0, 129), (1, 128), (128, 1), (u64::MAX, 1), (1, u64::MAX)] {
            assert!(
                matches!(r.read(offset, len), Err(ShmError::OutOfBounds { .. })),
                "{offset} {len}"
            );
        }
        assert!(r.write(u64::MAX, b"x").is_err());
        let mut two = [0u8; 2];
        assert!(r.read_into(u64::MAX, &mut two).is_err());
        assert!(r.read_into(127, &mut two).is_err());
    }

    #[test]
    fn open_checks_the_window_against_the_file() {
        let dir = TestDir::new("region-open");
        let _c = ShmRegion::create_in(dir.shm(), "w", 1000).unwrap();
        assert!(ShmRegion::open_in(dir.shm(), "w", 0, 1000).is_ok());
        assert!(ShmRegion::open_in(dir.shm(), "w", 999, 1).is_ok());
        for (offset, size) in [(0, 1001), (1, 1000), (u64::MAX, 1), (1, u64::MAX)] {
            let err = ShmRegion::open_in(dir.shm(), "w", offset, size).unwrap_err();
            assert!(matches!(err, ShmError::OutOfBounds { .. }), "{err:?}");
            assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
        }
        assert!(matches!(
            ShmRegion::open_in(dir.shm(), "w", 0, 0),
            Err(ShmError::EmptyWindow { .. })
        ));
        let missing = ShmRegion::open_in(dir.shm(), "nope", 0, 1).unwrap_err();
        assert!(matches!(missing, ShmError::Open { .. }));
        assert_eq!(missing.to_status().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn symlinks_and_non_files_are_refused() {
        let dir = TestDir::new("region-symlink");
        let outside = dir.outside_file("secret", b"top secret contents");
        std::os::unix::fs::symlink(&outside, dir.shm().path().join("link")).unwrap();
        let err = ShmRegion::open_in(dir.shm(), "/link", 0, 4).unwrap_err();
        assert!(matches!(err, ShmError::Open { .. }), "{err:?}");
        assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
        std::fs::create_dir(dir.shm().path().join("sub")).unwrap();
        assert!(ShmRegion::open_in(dir.shm(), "sub", 0, 1).is_err());
    }

    #[test]
    fn truncation_after_open_is_an_error_not_a_crash() {
        let dir = TestDir::new("region-truncate");
        let _c = ShmRegion::create_in(dir.shm(), "t", 8192).unwrap();
        let server = ShmRegion::open_in(dir.shm(), "t", 0, 8192).unwrap();
        let file = OpenOptions::new()
            .write(true)
            .open(dir.shm().path().join("t"))
            .unwrap();
        file.set_len(100).unwrap();
        assert!(server.read(0, 100).is_ok());
        assert!(matches!(
            server.read(0, 8192),
            Err(ShmError::Truncated { len: 100, .. })
        ));
        assert!(server.write(4096, b"x").is_err());
    }

    #[test]
    fn reads_and_writes_survive_a_file_truncated_and_re_extended_meanwhile() {
        // With a mapping, a copy racing a truncation raises SIGBUS and kills
        // this test process; with pread/pwrite it is an error or a copy.
        let dir = TestDir::new("region-race");
        let size = 1 << 20;
        let _c = ShmRegion::create_in(dir.shm(), "race", size).unwrap();
        let server = ShmRegion::open_in(dir.shm(), "race", 0, size).unwrap();
        let path = dir.shm().path().join("race");
        let (mut ok, mut truncated) = (0, 0);
        while_truncated(&path, size, || {
            match server.read(0, size) {
                Ok(b) => {
                    assert_eq!(b.len() as u64, size);
                    ok += 1;
                }
                Err(ShmError::Truncated { .. }) => truncated += 1,
                Err(e) => panic!("unexpected {e}"),
            }
            match server.write(size - 4096, &[7u8; 4096]) {
                Ok(()) | Err(ShmError::Truncated { .. }) => {}
                Err(e) => panic!("unexpected {e}"),
            }
        });
        assert_eq!(ok + truncated, 2000);
    }

    #[test]
    fn an_opened_region_reads_what_is_there_after_re_extension() {
        let dir = TestDir::new("region-reextend");
        let client = ShmRegion::create_in(dir.shm(), "re", 4096).unwrap();
        client.write(0, b"abcd").unwrap();
        let server = ShmRegion::open_in(dir.shm(), "re", 0, 4096).unwrap();
        let file = OpenOptions::new()
            .write(true)
            .open(dir.shm().path().join("re"))
            .unwrap();
        file.set_len(0).unwrap();
        assert!(matches!(
            server.read(0, 4),
            Err(ShmError::Truncated { len: 0, .. })
        ));
        assert!(matches!(
            server.write(0, b"zz"),
            Err(ShmError::Truncated { .. })
        ));
        assert_eq!(
            file.metadata().unwrap().len(),
            0,
            "a refused write must not grow the file"
        );
        file.set_len(4096).unwrap();
        assert_eq!(&server.read(0, 4).unwrap()[..], &[0, 0, 0, 0]);
        server.write(0, b"ok").unwrap();
        assert_eq!(&server.read(0, 2).unwrap()[..], b"ok");
    }
}
