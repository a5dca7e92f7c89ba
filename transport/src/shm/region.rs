//! [`ShmRegion`]: a window of a POSIX shared-memory object, mapped into this
//! process, with a safe, bounds-checked, copy-in/copy-out API.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use bytes::Bytes;

use super::key::{ShmDir, ShmKey};
use super::mapping::Mapping;
use crate::error::ShmError;

/// A mapped window `[offset, offset + len)` of a shared-memory file.
///
/// Servers [`open`](ShmRegion::open) the object a client registered;
/// clients [`create`](ShmRegion::create) their own, which is unlinked when
/// the region is dropped. Offsets in the accessors are relative to the
/// window. Every access is bounds-checked with checked arithmetic and, on a
/// server, also checks the file was not truncated since it was opened.
pub struct ShmRegion {
    key: ShmKey,
    path: PathBuf,
    file: File,
    /// Start of the window in the file.
    offset: u64,
    /// Bytes in the window (> 0).
    len: u64,
    map: Mapping,
    /// Created here: unlink the file on drop.
    owned: bool,
}

impl ShmRegion {
    /// Opens `key` in `/dev/shm` and maps `byte_size` bytes from `offset`.
    pub fn open(key: &str, offset: u64, byte_size: u64) -> Result<Self, ShmError> {
        Self::open_in(&ShmDir::system(), key, offset, byte_size)
    }

    /// Opens `key` in `dir` and maps `byte_size` bytes from `offset`.
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
        let len = window_len(what, offset, byte_size, meta.len())?;
        let map = Mapping::new(&file, offset, len).map_err(|source| ShmError::Map {
            key: key.to_string(),
            source,
        })?;
        Ok(Self {
            key,
            path,
            file,
            offset,
            len: byte_size,
            map,
            owned: false,
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
            .map_err(created)
            .and_then(|()| Mapping::new(&file, 0, len).map_err(created));
        match mapped {
            Ok(map) => Ok(Self {
                key,
                path,
                file,
                offset: 0,
                len: size,
                map,
                owned: true,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
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
    fn check_with(
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
        let (start, len) = self.range(offset, len)?;
        Ok(Bytes::from(self.map.to_vec(start, len)))
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        let (start, _) = self.range(offset, dst.len() as u64)?;
        self.map.copy_out(start, dst);
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ShmError> {
        let (start, _) = self.range(offset, data.len() as u64)?;
        self.map.copy_in(start, data);
        Ok(())
    }

    /// Shows `len` bytes from `offset` to `f` without copying. Another
    /// process may change them while `f` runs: treat them as untrusted
    /// bytes. `f` must not call back into this region.
    pub fn with_slice<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ShmError> {
        let (start, len) = self.range(offset, len)?;
        Ok(self.map.with_slice(start, len, f))
    }

    /// Lends `len` bytes from `offset` mutably to `f` (to fill a tensor in
    /// place). `f` must not call back into this region.
    pub fn with_mut_slice<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, ShmError> {
        let (start, len) = self.range(offset, len)?;
        Ok(self.map.with_mut_slice(start, len, f))
    }

    /// Bounds-checks an access and converts it to mapping coordinates; on
    /// an opened (not created) region, also checks the file still covers
    /// it, so a client that truncated its file gets an error rather than
    /// the server a `SIGBUS`.
    fn range(&self, offset: u64, len: u64) -> Result<(usize, usize), ShmError> {
        self.check_with(|| format!("region '{}'", self.key), offset, len)?;
        if !self.owned {
            let file_len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
            // offset + len <= self.len and self.offset + self.len <= file
            // length at open time; neither sum can overflow.
            if self.offset + offset + len > file_len {
                return Err(ShmError::Truncated {
                    key: self.key.to_string(),
                    len: file_len,
                });
            }
        }
        // Both fit in usize: they are within a mapping of `self.len` bytes.
        Ok((offset as usize, len as usize))
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
        if self.owned {
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
            .field("owned", &self.owned)
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
        let sum = client
            .with_slice(100, 5, |s| s.iter().map(|&b| b as u32).sum::<u32>())
            .unwrap();
        assert_eq!(sum, b"hello".iter().map(|&b| b as u32).sum::<u32>());
        client
            .with_mut_slice(0, 2, |s| s.copy_from_slice(b"ab"))
            .unwrap();
        assert_eq!(&client.read(0, 2).unwrap()[..], b"ab");
        let path = dir.shm().path_of(&ShmKey::parse("/rt").unwrap());
        assert!(path.exists());
        drop(client);
        assert!(!path.exists(), "the creator unlinks on drop");
        // The opener's mapping outlives the name.
        assert_eq!(&server.read(0, 3).unwrap()[..], b"out");
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
        assert!(r.with_slice(u64::MAX, 2, |_| ()).is_err());
        assert!(r.with_mut_slice(127, 2, |_| ()).is_err());
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
}
