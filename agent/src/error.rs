//! Agent errors, and the one place they become gRPC statuses.

use std::time::Duration;

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
    #[error("queue for model '{model}' is full ({capacity} waiting); retry elsewhere")]
    QueueFull {
        /// Model name.
        model: String,
        /// Queue capacity.
        capacity: usize,
        /// About how long the queue ahead takes to drain.
        retry_after: Duration,
    },
    /// The request waited, and one that outranks it took its place in the
    /// full queue.
    #[error("request for model '{model}' was shed for a higher-priority one; retry elsewhere")]
    Evicted {
        /// Model name.
        model: String,
        /// About how long the queue ahead takes to drain.
        retry_after: Duration,
    },
    /// The model's tenant is at its configured rate.
    #[error("tenant '{tenant}' is at its rate of {rate} requests/s; retry elsewhere")]
    RateLimited {
        /// Tenant name.
        tenant: String,
        /// Its rate.
        rate: f64,
        /// Until its next token.
        retry_after: Duration,
    },
    /// A message is larger than the agent accepts.
    #[error("message of {size} bytes is larger than the limit of {limit} bytes")]
    MessageTooLarge {
        /// Its size.
        size: usize,
        /// `max_message_bytes`.
        limit: usize,
    },
    /// The node is receiving as many request bytes as its budget allows.
    #[error(
        "this node is receiving as many request bytes as it may (receive_budget_bytes); retry elsewhere"
    )]
    ReceiveBudget,
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

/// Longest part of a caller-supplied name echoed in an error, in bytes.
pub const ECHO_BYTES: usize = 128;

/// A caller-supplied name as it may appear in an error: control characters
/// escaped, at most [`ECHO_BYTES`] of it, marked when cut.
pub fn echo(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if out.len() >= ECHO_BYTES {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out
}

/// The gRPC retry pushback header (gRPC's retry design, A6): milliseconds
/// the client should wait before trying this server again. infermesh's
/// client retries RESOURCE_EXHAUSTED on another node at once; others may
/// use it to back off.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// RESOURCE_EXHAUSTED with a retry hint.
fn shed(msg: String, retry_after: Duration) -> Status {
    let mut md = tonic::metadata::MetadataMap::new();
    let ms = retry_after.as_millis().clamp(1, u64::MAX as u128) as u64;
    md.insert(RETRY_PUSHBACK, ms.into());
    Status::with_metadata(tonic::Code::ResourceExhausted, msg, md)
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        let msg = e.to_string();
        match e {
            AgentError::QueueFull { retry_after, .. }
            | AgentError::Evicted { retry_after, .. }
            | AgentError::RateLimited { retry_after, .. } => shed(msg, retry_after),
            AgentError::UnknownModel(_) => Status::not_found(msg),
            // UNAVAILABLE tells clients to retry on another node at once.
            AgentError::NoReadyWorker(_)
            | AgentError::ShuttingDown
            | AgentError::WorkerUnreachable { .. } => Status::unavailable(msg),
            AgentError::MessageTooLarge { .. } | AgentError::ReceiveBudget => {
                Status::resource_exhausted(msg)
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_names_are_capped_and_escaped() {
        assert_eq!(echo("dense"), "dense");
        assert_eq!(echo("a\nb"), "a\\nb");
        let long = "x".repeat(1 << 20);
        let e = echo(&long);
        assert!(e.len() <= ECHO_BYTES + 4, "{}", e.len());
        assert!(e.ends_with('…'));
        let status: Status = AgentError::UnknownModel(echo(&long)).into();
        assert!(status.message().len() < 200);
    }

    #[test]
    fn shed_requests_carry_a_retry_hint() {
        for e in [
            AgentError::QueueFull {
                model: "m".into(),
                capacity: 4,
                retry_after: Duration::from_millis(40),
            },
            AgentError::Evicted {
                model: "m".into(),
                retry_after: Duration::from_millis(40),
            },
            AgentError::RateLimited {
                tenant: "t".into(),
                rate: 25.0,
                retry_after: Duration::from_millis(40),
            },
        ] {
            let status: Status = e.into();
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "40");
        }
    }
}
