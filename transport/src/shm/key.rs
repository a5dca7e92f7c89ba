//! Shared-memory keys and the directory they live in.
//!
//! A Triton client creates its region with `shm_open("/input_data")`, which
//! on Linux is the file `/dev/shm/input_data`, and registers the key
//! `"/input_data"`. The server opens the same file. A key is therefore a
//! path component chosen by a remote party: [`ShmKey::parse`] accepts only
//! one optional leading `/` and then a single plain file name, so no key can
//! name anything outside the shm directory (`..`, `a/b` and empty names are
//! refused; a symlink planted in the directory is refused at open time by
//! `O_NOFOLLOW`).

use std::fmt;
use std::path::PathBuf;

use crate::error::ShmError;

/// Longest file name accepted, as `NAME_MAX` on Linux.
pub const MAX_KEY_NAME_BYTES: usize = 255;

/// A validated shared-memory key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShmKey {
    /// The key as the client gave it (`"/input_data"`), reported back in
    /// status replies.
    key: String,
    /// Byte offset of the file name within `key` (1 with a leading `/`).
    name_at: usize,
}

impl ShmKey {
    /// Checks `key`: one optional leading `/`, then 1 to 255 bytes of
    /// `[A-Za-z0-9._-]`, and not `.` or `..`.
    pub fn parse(key: &str) -> Result<Self, ShmError> {
        let invalid = |reason| ShmError::InvalidKey {
            key: key.to_string(),
            reason,
        };
        let name = key.strip_prefix('/').unwrap_or(key);
        if name.is_empty() {
            return Err(invalid("the name after '/' is empty"));
        }
        if name.len() > MAX_KEY_NAME_BYTES {
            return Err(invalid("the name is longer than 255 bytes"));
        }
        if name == "." || name == ".." {
            return Err(invalid("'.' and '..' are not names"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid(
                "only one leading '/' and the characters A-Z a-z 0-9 . _ - are allowed",
            ));
        }
        Ok(Self {
            key: key.to_string(),
            name_at: key.len() - name.len(),
        })
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The file name in the shm directory (the key without its `/`).
    pub fn file_name(&self) -> &str {
        &self.key[self.name_at..]
    }
}

impl fmt::Display for ShmKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

/// The directory shared-memory objects live in: `/dev/shm` in production,
/// any directory in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmDir {
    path: PathBuf,
}

impl ShmDir {
    /// Where `shm_open` puts its objects on Linux.
    pub const SYSTEM: &'static str = "/dev/shm";

    /// `/dev/shm`.
    pub fn system() -> Self {
        Self::new(Self::SYSTEM)
    }

    /// Another directory (tests). It is trusted: only the last path
    /// component, the key, is guarded against symlinks.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The file behind `key`.
    pub fn path_of(&self, key: &ShmKey) -> PathBuf {
        self.path.join(key.file_name())
    }
}

impl Default for ShmDir {
    fn default() -> Self {
        Self::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_triton_style_keys() {
        let k = ShmKey::parse("/input_data").unwrap();
        assert_eq!(k.as_str(), "/input_data");
        assert_eq!(k.file_name(), "input_data");
        assert_eq!(
            ShmKey::parse("output-0.v2").unwrap().file_name(),
            "output-0.v2"
        );
        assert_eq!(
            ShmDir::system().path_of(&k),
            PathBuf::from("/dev/shm/input_data")
        );
        let longest = "a".repeat(255);
        assert!(ShmKey::parse(&longest).is_ok());
        assert!(ShmKey::parse(&format!("/{longest}")).is_ok());
    }

    #[test]
    fn refuses_keys_that_could_leave_the_directory() {
        for bad in [
            "",
            "/",
            "//a",
            ".",
            "/.",
            "..",
            "/..",
            "../etc/passwd",
            "/../etc/passwd",
            "/a/b",
            "a/b",
            "a\0b",
            "a b",
            "ä",
            "a\\b",
        ] {
            let err = ShmKey::parse(bad).unwrap_err();
            assert!(
                matches!(err, ShmError::InvalidKey { .. }),
                "{bad:?}: {err:?}"
            );
            assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
        }
        assert!(ShmKey::parse(&"a".repeat(256)).is_err());
        assert!(ShmKey::parse(&format!("/{}", "a".repeat(256))).is_err());
    }
}
