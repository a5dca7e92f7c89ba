//! Why a check could not be built from its configuration.
//!
//! Only [`build`](crate::build) returns errors: once built, a check reports
//! every problem — a worker that does not answer, a wrong output, a script
//! that cannot start — as a failed [`Verdict`](crate::Verdict).

use std::io;
use std::path::PathBuf;

use crate::npy::NpyError;

/// A configuration problem found while building a check. Messages name the
/// check or file and say what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// A probe request file could not be read.
    #[error("cannot read '{}': {source}", path.display())]
    Read {
        /// The file, as resolved against the config directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A `.json` probe request is not valid JSON in the KServe v2 shape.
    #[error("'{}' is not a KServe v2 JSON request: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A `.npy` probe input cannot be used.
    #[error("'{}' is not a usable .npy array: {source}", path.display())]
    Npy {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: NpyError,
    },
    /// A probe request parses but does not describe valid tensors (unknown
    /// datatype, element count not matching the shape, value out of range).
    #[error("'{}': {problem}", path.display())]
    InvalidRequest {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the tensor.
        problem: String,
    },
    /// An option of the check is missing, out of range or inconsistent.
    #[error("{check} check: {problem}")]
    InvalidSpec {
        /// The check's label (its `name`, or its kind).
        check: String,
        /// What is wrong, naming the option.
        problem: String,
    },
}
