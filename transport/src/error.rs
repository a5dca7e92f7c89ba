//! Errors of the transport crate, and their one mapping to gRPC status codes.

use std::io;

use tonic::{Code, Status};

use infermesh_proto::tensor::echo;

use crate::path::Path;

/// Why a shared-memory operation failed: registering, resolving a tensor
/// reference, copying, or leasing from the client pool.
///
/// Servers (the agent, the test worker) return [`ShmError::to_status`] to the
/// caller; every variant says which code it maps to. Client-supplied names
/// (keys, regions, tensors) are repeated through
/// [`infermesh_proto::tensor::echo`], so they are bounded.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A key that is not a single name in the shm directory
    /// (`INVALID_ARGUMENT`).
    #[error("invalid shared memory key '{}': {reason}", echo(.key))]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An empty region name, which would mean "all regions"
    /// (`INVALID_ARGUMENT`).
    #[error("shared memory region name must not be empty")]
    EmptyName,
    /// A region name longer than the server keeps (`INVALID_ARGUMENT`).
    #[error("shared memory region name '{}' is longer than {limit} bytes", echo(.name))]
    NameTooLong {
        /// The name as given.
        name: String,
        /// Longest name accepted.
        limit: usize,
    },
    /// The object behind a key cannot be opened: absent, a symlink, not
    /// permitted (`INVALID_ARGUMENT`; `INTERNAL` when the server is out of
    /// file descriptors or memory).
    #[error("cannot open shared memory key '{}': {source}", echo(.key))]
    Open {
        /// The key as given.
        key: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The key names something other than a regular file
    /// (`INVALID_ARGUMENT`).
    #[error("shared memory key '{}' is not a regular file", echo(.key))]
    NotRegularFile {
        /// The key as given.
        key: String,
    },
    /// A window of zero bytes (`INVALID_ARGUMENT`).
    #[error("{what}: byte size must be greater than zero")]
    EmptyWindow {
        /// Which region or tensor.
        what: String,
    },
    /// `offset + byte_size` overflows or lies past the end of the file or
    /// of the registered window (`INVALID_ARGUMENT`).
    #[error("{what}: offset {offset} + byte size {byte_size} exceeds the {limit} bytes available")]
    OutOfBounds {
        /// Which region or tensor.
        what: String,
        /// Requested offset.
        offset: u64,
        /// Requested size.
        byte_size: u64,
        /// Bytes available.
        limit: u64,
    },
    /// The file shrank below the registered window after registration: the
    /// client truncated it (`INVALID_ARGUMENT`).
    #[error("shared memory key '{}' was truncated to {len} bytes after registration", echo(.key))]
    Truncated {
        /// The key as registered.
        key: String,
        /// Its length now.
        len: u64,
    },
    /// A `pread`/`pwrite` on a client's object failed for a reason other
    /// than truncation (`INTERNAL`).
    #[error("cannot copy shared memory key '{}': {source}", echo(.key))]
    Copy {
        /// The key.
        key: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Mapping the file failed (`INTERNAL`).
    #[error("cannot map shared memory key '{}': {source}", echo(.key))]
    Map {
        /// The key.
        key: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Creating a region (client side) failed (`INTERNAL`).
    #[error("cannot create shared memory object '{}': {source}", echo(.key))]
    Create {
        /// The key.
        key: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A region of that name is already registered by this owner
    /// (`ALREADY_EXISTS`).
    #[error("shared memory region '{}' is already registered", echo(.0))]
    AlreadyExists(String),
    /// Status asked for a region this owner has not registered (`NOT_FOUND`).
    #[error("unable to find system shared memory region '{}'", echo(.0))]
    NotFound(String),
    /// The owner (client connection) already has the most regions allowed
    /// (`RESOURCE_EXHAUSTED`).
    #[error(
        "this connection already holds {limit} shared memory regions, the most allowed per connection (max_regions_per_connection); unregister one or send tensors inline"
    )]
    TooManyRegions {
        /// Regions allowed per owner.
        limit: usize,
    },
    /// The server already holds the most regions allowed over all
    /// connections (`RESOURCE_EXHAUSTED`).
    #[error(
        "the server already holds {limit} shared memory regions, the most allowed over all connections (max_regions); try again later or send tensors inline"
    )]
    TooManyRegionsInAll {
        /// Regions allowed in all.
        limit: usize,
    },
    /// A tensor names a region this owner has not registered
    /// (`INVALID_ARGUMENT`).
    #[error("tensor '{}': unknown shared memory region '{}'", echo(.tensor), echo(.region))]
    UnknownRegion {
        /// The tensor.
        tensor: String,
        /// The region it names.
        region: String,
    },
    /// A `shared_memory_*` parameter of the wrong type, negative, or given
    /// without its companion (`INVALID_ARGUMENT`).
    #[error("tensor '{}': parameter '{param}' {reason}", echo(.tensor))]
    BadParameter {
        /// The tensor.
        tensor: String,
        /// The parameter.
        param: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// An input in shared memory that also carries `contents`
    /// (`INVALID_ARGUMENT`).
    #[error("input '{}': contents must be empty when the input is in shared memory", echo(.0))]
    ContentsWithShm(String),
    /// Shared-memory inputs mixed with typed `contents` inputs; only
    /// `raw_input_contents` can be mixed with shared memory
    /// (`INVALID_ARGUMENT`).
    #[error(
        "input '{}': when other inputs are in shared memory, this input must use raw_input_contents",
        echo(.0)
    )]
    TypedContentsMixed(String),
    /// `raw_input_contents` does not hold one entry per input not in shared
    /// memory (`INVALID_ARGUMENT`).
    #[error("raw_input_contents has {got} entries for {expected} inputs not in shared memory")]
    RawCount {
        /// Entries given.
        got: usize,
        /// Inputs not in shared memory.
        expected: usize,
    },
    /// An output larger than the shared-memory window requested for it
    /// (`INVALID_ARGUMENT`).
    #[error(
        "output '{}': shared memory window of {window} bytes is too small for {needed} bytes",
        echo(.tensor)
    )]
    OutputTooLarge {
        /// The output.
        tensor: String,
        /// Bytes the output holds.
        needed: u64,
        /// Bytes the window holds.
        window: u64,
    },
    /// The response lacks an output requested in shared memory (`INTERNAL`).
    #[error("output '{}' was requested in shared memory but is not in the response", echo(.0))]
    OutputMissing(String),
    /// The response has no raw bytes for an output requested in shared
    /// memory (`INTERNAL`: the model answered in a form this cannot place).
    #[error("output '{}' has no raw contents to place in shared memory", echo(.0))]
    OutputNotRaw(String),
    /// The client pool cannot lease that many bytes within its budget
    /// (`RESOURCE_EXHAUSTED`); the caller sends this request inline.
    #[error(
        "shared memory pool exhausted: {requested} bytes requested, {in_use} of {limit} bytes in use"
    )]
    PoolExhausted {
        /// Bytes asked for (after rounding up).
        requested: u64,
        /// Bytes the pool holds now.
        in_use: u64,
        /// The pool's budget.
        limit: u64,
    },
}

impl ShmError {
    /// The gRPC status a server returns for this error.
    pub fn to_status(&self) -> Status {
        let code = match self {
            ShmError::AlreadyExists(_) => Code::AlreadyExists,
            ShmError::NotFound(_) => Code::NotFound,
            ShmError::TooManyRegions { .. }
            | ShmError::TooManyRegionsInAll { .. }
            | ShmError::PoolExhausted { .. } => Code::ResourceExhausted,
            ShmError::Open { source, .. } if is_server_resource_error(source) => Code::Internal,
            ShmError::Map { .. }
            | ShmError::Copy { .. }
            | ShmError::Create { .. }
            | ShmError::OutputMissing(_)
            | ShmError::OutputNotRaw(_) => Code::Internal,
            ShmError::InvalidKey { .. }
            | ShmError::EmptyName
            | ShmError::NameTooLong { .. }
            | ShmError::Open { .. }
            | ShmError::NotRegularFile { .. }
            | ShmError::EmptyWindow { .. }
            | ShmError::OutOfBounds { .. }
            | ShmError::Truncated { .. }
            | ShmError::UnknownRegion { .. }
            | ShmError::BadParameter { .. }
            | ShmError::ContentsWithShm(_)
            | ShmError::TypedContentsMixed(_)
            | ShmError::RawCount { .. }
            | ShmError::OutputTooLarge { .. } => Code::InvalidArgument,
        };
        Status::new(code, self.to_string())
    }
}

impl From<ShmError> for Status {
    fn from(e: ShmError) -> Self {
        e.to_status()
    }
}

/// Errors of the server process itself rather than of the client's request.
fn is_server_resource_error(e: &io::Error) -> bool {
    use nix::libc::{EMFILE, ENFILE, ENOMEM};
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE | ENOMEM))
}

/// Why [`ShmTransport`](crate::ShmTransport) could not stage a request or bring
/// its outputs back.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A shared-memory step failed (pool exhausted, copy, registration).
    #[error("shared memory transport: {0}")]
    Shm(#[from] ShmError),
    /// The response does not fit the request as staged: an output missing,
    /// a size that cannot be computed, raw contents that do not line up.
    #[error("{path} transport: malformed response: {reason}")]
    MalformedResponse {
        /// The path the request went on.
        path: Path,
        /// What does not fit.
        reason: String,
    },
}

impl TransportError {
    /// Whether this failure says the path to the peer is broken (open the
    /// ladder's breaker), rather than that this one request did not fit
    /// (send it inline, keep the path).
    pub fn breaks_path(&self) -> bool {
        !matches!(self, TransportError::Shm(ShmError::PoolExhausted { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_documented_mapping() {
        let bad_key = ShmError::InvalidKey {
            key: "../x".into(),
            reason: "r",
        };
        assert_eq!(bad_key.to_status().code(), Code::InvalidArgument);
        assert_eq!(
            ShmError::AlreadyExists("a".into()).to_status().code(),
            Code::AlreadyExists
        );
        assert_eq!(
            ShmError::NotFound("a".into()).to_status().code(),
            Code::NotFound
        );
        assert_eq!(
            ShmError::TooManyRegions { limit: 1 }.to_status().code(),
            Code::ResourceExhausted
        );
        let missing = ShmError::Open {
            key: "/a".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(missing.to_status().code(), Code::InvalidArgument);
        let no_fds = ShmError::Open {
            key: "/a".into(),
            source: io::Error::from_raw_os_error(nix::libc::EMFILE),
        };
        assert_eq!(no_fds.to_status().code(), Code::Internal);
    }

    #[test]
    fn pool_exhaustion_does_not_break_the_path() {
        let e = TransportError::from(ShmError::PoolExhausted {
            requested: 1,
            in_use: 0,
            limit: 0,
        });
        assert!(!e.breaks_path());
        let e = TransportError::from(ShmError::UnknownRegion {
            tensor: "t".into(),
            region: "r".into(),
        });
        assert!(e.breaks_path());
    }
}
