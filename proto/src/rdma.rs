//! The RDMA rung's wire contract: the `infermesh.v1.Rdma` control-path
//! service (generated into the `infermesh.v1` package with [`crate::admin`],
//! re-exported here) and the `ModelInfer` parameters that carry RDMA buffer
//! descriptors (see `proto/infermesh/v1/rdma.proto` for the protocol).

pub use crate::admin::rdma_client::RdmaClient;
pub use crate::admin::rdma_server::{Rdma, RdmaServer};
pub use crate::admin::{ConnectRequest, ConnectResponse};

/// Request parameter (int64): the agent's queue pair number from `ConnectQueuePair`.
pub const QPN_PARAM: &str = "infermesh_rdma_qpn";
/// Input parameter (string): the client buffer holding the input,
/// `addr:len:rkey` in lowercase hex; the agent RDMA-READs it.
pub const INPUT_PARAM: &str = "infermesh_rdma_input";
/// Requested-output parameter (string): the client buffer the agent
/// RDMA-WRITEs the output into, same form as [`INPUT_PARAM`].
pub const OUTPUT_PARAM: &str = "infermesh_rdma_output";
/// Response output parameter (int64): bytes the agent wrote into the
/// output's buffer; that output's `raw_output_contents` entry is empty.
pub const BYTES_PARAM: &str = "infermesh_rdma_bytes";
/// Prefix of every error message of the RDMA path, so a client can tell a
/// failed path (UNAVAILABLE, or INVALID_ARGUMENT for an unknown queue pair)
/// from the model's own errors.
pub const ERROR_PREFIX: &str = "rdma:";
/// Message prefix of the error for a queue pair the agent does not know on
/// the caller's connection (closed, broken, agent restarted): connect again.
pub const UNKNOWN_QP_PREFIX: &str = "rdma: unknown queue pair";
/// Message prefix of the error (INVALID_ARGUMENT) for an output larger
/// than the client's buffer; nothing was written. The metadata
/// [`TOO_LARGE_OUTPUT_METADATA`] and [`NEEDED_BYTES_METADATA`] say which
/// output and how large it is.
pub const OUTPUT_TOO_LARGE_PREFIX: &str = "rdma: output too large";
/// Metadata on an [`OUTPUT_TOO_LARGE_PREFIX`] error: the output's name
/// (absent when the name is not visible ASCII).
pub const TOO_LARGE_OUTPUT_METADATA: &str = "infermesh-rdma-output";
/// Metadata on an [`OUTPUT_TOO_LARGE_PREFIX`] error: the output's size in
/// bytes (ASCII decimal).
pub const NEEDED_BYTES_METADATA: &str = "infermesh-rdma-needed-bytes";
