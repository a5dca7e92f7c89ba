//! Agent errors, and the one place they become gRPC statuses.

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
            AgentError::InvalidRequest(_) | AgentError::BadRequest(_) => {
                Status::invalid_argument(msg)
            }
        }
    }
}
