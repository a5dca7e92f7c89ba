//! The crate's error type.

use crate::verbs::WcStatus;

/// Why an RDMA operation failed.
///
/// Every variant means "this request cannot use the RDMA path"; the transport
/// ladder reacts to all of them the same way (mark the path broken for the
/// peer, re-send on the next path down). The variants exist so that logs and
/// tests can say *which* cause it was.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// `libibverbs.so.1` (rdma-core) could not be loaded, so no verbs device
    /// can exist on this host.
    #[error("libibverbs.so.1 could not be loaded (rdma-core is not installed)")]
    LibraryMissing,
    /// libibverbs is present but there is no usable verbs device (none
    /// listed, the configured one is absent, or no port is active).
    #[error("no usable RDMA device: {0}")]
    NoDevice(String),
    /// The peer's HCA (or the emulated responder) refused a one-sided
    /// operation: unknown or deregistered rkey, range outside the region, or
    /// the region was not registered for this kind of remote access. Like
    /// real hardware, the responder does not say which of these it was. The
    /// connection is in the error state afterwards.
    #[error("remote access error: rkey {rkey:#x}, addr {addr:#x}, len {len}")]
    RemoteAccess {
        /// The rkey the operation presented.
        rkey: u32,
        /// The remote start address.
        addr: u64,
        /// The length of the operation in bytes.
        len: u64,
    },
    /// A range failed a local check before anything was posted: `addr + len`
    /// overflows `u64`, or the data does not fit the remote buffer.
    #[error("out of bounds: addr {addr:#x}, len {len} ({reason})")]
    OutOfBounds {
        /// The start address.
        addr: u64,
        /// The length in bytes.
        len: u64,
        /// What does not fit.
        reason: &'static str,
    },
    /// A remote-buffer descriptor string (`addr:len:rkey`) is malformed.
    #[error("invalid RDMA buffer descriptor {input:?}: {reason}")]
    InvalidDescriptor {
        /// The string that was rejected (truncated to 64 characters).
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An endpoint description from the control path is malformed.
    #[error("invalid RDMA endpoint info: {0}")]
    InvalidEndpoint(String),
    /// The two ends are of different kinds (emulated vs verbs) and cannot
    /// talk to each other.
    #[error("RDMA kind mismatch: local {local}, peer {peer}")]
    KindMismatch {
        /// This engine's kind.
        local: &'static str,
        /// The peer's kind.
        peer: &'static str,
    },
    /// Setting up the connection failed (control-path exchange, TCP connect
    /// of the emulation, or a queue-pair state transition).
    #[error("RDMA connect failed: {0}")]
    Connect(String),
    /// The link failed while the operation was in flight (transport retries
    /// exhausted on hardware, a dropped socket or an injected fault in the
    /// emulation). The connection is in the error state afterwards.
    #[error("RDMA link broken: {0}")]
    LinkBroken(String),
    /// The connection is closed or in the error state (after an earlier
    /// failure): work is flushed without being executed. Reconnect.
    #[error("RDMA connection closed: {0}")]
    Closed(String),
    /// A work completion came back with another error status.
    #[error("RDMA work completion failed: {0:?}")]
    Completion(WcStatus),
    /// Registering the buffer would exceed the memory-registration budget
    /// even after evicting every idle cached registration.
    #[error(
        "memory registration budget exceeded: need {requested} bytes, {in_use} of {capacity} bytes in use"
    )]
    RegistrationBudget {
        /// Bytes the new registration needs (its size class).
        requested: usize,
        /// Bytes registered by buffers currently handed out.
        in_use: usize,
        /// The configured budget.
        capacity: usize,
    },
    /// The transfer is larger than one work request may carry.
    #[error("transfer of {len} bytes exceeds the {max}-byte limit of one work request")]
    TooLarge {
        /// Requested length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A verbs call failed (device open, PD, CQ, QP, memory registration,
    /// post).
    #[error("verbs {op} failed: {message}")]
    Verbs {
        /// The verbs operation.
        op: &'static str,
        /// The library's error text.
        message: String,
    },
    /// A socket or thread error of the emulation or the engine.
    #[error("RDMA I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl RdmaError {
    pub(crate) fn verbs(op: &'static str, err: impl std::fmt::Display) -> Self {
        RdmaError::Verbs {
            op,
            message: err.to_string(),
        }
    }
}
