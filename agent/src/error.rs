//! Agent errors, and the one place they become gRPC statuses.

use infermesh_proto::rdma::{NEEDED_BYTES_METADATA, TOO_LARGE_OUTPUT_METADATA};
use infermesh_proto::tensor::TensorError;
use tonic::Status;

/// Why the agent could not serve a request.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No worker on this node hosts the model.
    #[error("model '{0}' is not served on this node")]
    UnknownModel(String),
    /// Workers host the model but none is ready (starting, exited).
    #[error("no ready worker for model '{0}' on this node")]
    NoReadyWorker(String),
    /// The model's queue is full.
    #[error("queue for model '{model}' is full ({capacity} waiting)")]
    QueueFull {
        /// Model name.
        model: String,
        /// Queue capacity.
        capacity: usize,
    },
    /// The caller's deadline passed while the request waited for a slot.
    #[error("deadline exceeded while queued for model '{0}'")]
    DeadlineInQueue(String),
    /// The agent is shutting down.
    #[error("agent is shutting down")]
    ShuttingDown,
    /// The request does not fit the model.
    #[error(transparent)]
    InvalidRequest(#[from] TensorError),
    /// The request itself is malformed (e.g. no model name).
    #[error("{0}")]
    BadRequest(String),
    /// The worker could not be reached (died, restarting).
    #[error("worker '{worker}' unreachable: {reason}")]
    WorkerUnreachable {
        /// Worker id.
        worker: String,
        /// Transport error.
        reason: String,
    },
    /// The request's RDMA parameters are malformed or name a queue pair
    /// this connection does not have.
    #[error("rdma: {0}")]
    RdmaRequest(String),
    /// An RDMA operation failed or the agent has no RDMA path: the client
    /// should reconnect and meanwhile send tensors inline.
    #[error("rdma: {0}")]
    RdmaPath(String),
    /// An output does not fit the buffer the client gave for it; nothing
    /// was written.
    #[error(
        "rdma: output too large: '{output}' is {needed} bytes, the client's buffer holds {capacity}"
    )]
    RdmaOutputTooLarge {
        /// Output name.
        output: String,
        /// Its size in bytes.
        needed: u64,
        /// The buffer's size in bytes.
        capacity: u64,
    },
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        let msg = e.to_string();
        match e {
            AgentError::UnknownModel(_) => Status::not_found(msg),
            // UNAVAILABLE tells clients to retry on another node at once.
            AgentError::NoReadyWorker(_)
            | AgentError::ShuttingDown
            | AgentError::WorkerUnreachable { .. } => Status::unavailable(msg),
            AgentError::QueueFull { .. } => Status::resource_exhausted(msg),
            AgentError::DeadlineInQueue(_) => Status::deadline_exceeded(msg),
            AgentError::InvalidRequest(_)
            | AgentError::BadRequest(_)
            | AgentError::RdmaRequest(_) => Status::invalid_argument(msg),
            AgentError::RdmaPath(_) => Status::unavailable(msg),
            AgentError::RdmaOutputTooLarge { output, needed, .. } => {
                // Machine-readable, so the client sizes the next buffer right.
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(NEEDED_BYTES_METADATA, needed.into());
                if let Ok(name) = output.parse() {
                    md.insert(TOO_LARGE_OUTPUT_METADATA, name);
                }
                Status::with_metadata(tonic::Code::InvalidArgument, msg, md)
            }
        }
    }
}
