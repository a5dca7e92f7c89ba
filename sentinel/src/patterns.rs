//! Recognising fatal GPU errors in a worker's output.
//!
//! Inference servers rarely exit when CUDA breaks: the context is poisoned,
//! every later kernel fails, but the process keeps answering health checks
//! with errors. The only early sign is a line on stdout/stderr. Each line is
//! scanned once for all patterns with an Aho-Corasick automaton, so the cost
//! per line does not grow with the number of patterns.

use aho_corasick::{AhoCorasick, MatchKind};
use thiserror::Error;

/// Why a set of fault patterns was rejected.
#[derive(Debug, Error)]
pub enum PatternError {
    /// The list was empty, which would silently disable fault detection.
    #[error("fault pattern list is empty")]
    Empty,
    /// A pattern was the empty string, which would match every line.
    #[error("fault pattern #{index} is empty")]
    EmptyPattern {
        /// Zero-based position of the empty pattern in the list.
        index: usize,
    },
    /// The automaton could not be built (e.g. the patterns are too large).
    #[error("cannot build fault pattern matcher")]
    Build(#[source] aho_corasick::BuildError),
}

/// Messages after which a CUDA context (or the GPU) cannot be trusted.
///
/// `CUDA out of memory` is deliberately absent: an allocation failure fails one
/// request, the caching allocator frees memory, and the next request works, so
/// restarting would only turn a per-request error into a full outage. Note that
/// `CUDA error` also matches the rarer `CUDA error: out of memory`, raised when
/// a raw CUDA allocation (not the caching allocator) fails; that usually means
/// the context is in a bad state anyway.
const DEFAULT_PATTERNS: &[&str] = &[
    "CUDA error",
    "illegal memory access",
    "device-side assert triggered",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUBLAS_STATUS_INTERNAL_ERROR",
    "CUDNN_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR",
    "unspecified launch failure",
    "NCCL error",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "uncorrectable ECC error",
    "an illegal instruction was encountered",
    "misaligned address",
];

/// A multi-substring matcher over output lines.
///
/// Matching is case-sensitive: the patterns are fixed strings printed by CUDA
/// libraries, and exact case keeps user text echoed into logs from matching.
#[derive(Debug, Clone)]
pub struct FaultPatterns {
    patterns: Vec<String>,
    matcher: AhoCorasick,
}

impl FaultPatterns {
    /// Builds a matcher for `patterns`, rejecting an empty list or an empty
    /// pattern.
    pub fn new(patterns: Vec<String>) -> Result<Self, PatternError> {
        if patterns.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(index) = patterns.iter().position(String::is_empty) {
            return Err(PatternError::EmptyPattern { index });
        }
        // Standard semantics are needed for overlapping search, which `find`
        // uses to honour the configured order rather than position in the line.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .map_err(PatternError::Build)?;
        Ok(Self { patterns, matcher })
    }

    /// The matcher for [`FaultPatterns::default_patterns`].
    pub fn defaults() -> Self {
        Self::new(DEFAULT_PATTERNS.iter().map(|p| p.to_string()).collect())
            .expect("default fault patterns are valid")
    }

    /// The built-in list of fatal GPU error messages.
    pub fn default_patterns() -> &'static [&'static str] {
        DEFAULT_PATTERNS
    }

    /// The first pattern, in configured order, that occurs in `line`.
    ///
    /// Configured order lets a specific pattern listed first (say
    /// `illegal memory access`) win over a generic one (`CUDA error`) that the
    /// same line also contains, so the notice names the most precise cause.
    pub fn find(&self, line: &str) -> Option<&str> {
        self.matcher
            .find_overlapping_iter(line)
            .map(|m| m.pattern().as_usize())
            .min()
            .map(|index| self.patterns[index].as_str())
    }

    /// The patterns, in configured order.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

impl Default for FaultPatterns {
    fn default() -> Self {
        Self::defaults()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(list: &[&str]) -> FaultPatterns {
        FaultPatterns::new(list.iter().map(|p| p.to_string()).collect()).unwrap()
    }

    #[test]
    fn defaults_cover_the_required_messages() {
        let required = [
            "CUDA error",
            "illegal memory access",
            "device-side assert triggered",
            "CUBLAS_STATUS_EXECUTION_FAILED",
            "CUBLAS_STATUS_INTERNAL_ERROR",
            "CUDNN_STATUS_EXECUTION_FAILED",
            "CUDNN_STATUS_INTERNAL_ERROR",
            "unspecified launch failure",
            "NCCL error",
            "ncclUnhandledCudaError",
            "ncclSystemError",
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "CUDA_ERROR_LAUNCH_FAILED",
            "uncorrectable ECC error",
            "an illegal instruction was encountered",
            "misaligned address",
        ];
        let defaults = FaultPatterns::default();
        for pattern in required {
            assert!(
                FaultPatterns::default_patterns().contains(&pattern),
                "{pattern}"
            );
            let line = format!("worker[3]: {pattern} at step 17");
            assert!(defaults.find(&line).is_some(), "{line}");
        }
        assert_eq!(
            defaults.patterns().len(),
            FaultPatterns::default_patterns().len()
        );
    }

    #[test]
    fn out_of_memory_is_not_fatal() {
        let defaults = FaultPatterns::defaults();
        assert!(
            !defaults
                .patterns()
                .iter()
                .any(|p| p.contains("out of memory"))
        );
        let line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(defaults.find(line), None);
    }

    #[test]
    fn real_world_lines_match() {
        let defaults = FaultPatterns::defaults();
        let cases = [
            (
                "RuntimeError: CUDA error: an illegal memory access was encountered",
                "CUDA error",
            ),
            (
                "../aten/src/ATen/native/cuda/Indexing.cu:1289: block: [0,0,0] Assertion failed. \
                 device-side assert triggered",
                "device-side assert triggered",
            ),
            (
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, \
                 unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1\n\
                 ncclUnhandledCudaError: Call to CUDA function failed.",
                "NCCL error",
            ),
        ];
        for (line, want) in cases {
            assert_eq!(defaults.find(line), Some(want), "{line}");
        }
        assert_eq!(defaults.find("INFO: 200 OK POST /v1/completions"), None);
        assert_eq!(defaults.find(""), None);
    }

    #[test]
    fn configured_order_wins_over_position_in_line() {
        let p = patterns(&["illegal memory access", "CUDA error"]);
        let line = "CUDA error: an illegal memory access was encountered";
        assert_eq!(p.find(line), Some("illegal memory access"));

        let p = patterns(&["CUDA error", "illegal memory access"]);
        assert_eq!(p.find(line), Some("CUDA error"));
    }

    #[test]
    fn overlapping_patterns_are_all_seen() {
        // "abcd" contains both; the second is found inside the first.
        let p = patterns(&["bc", "abcd"]);
        assert_eq!(p.find("xabcdx"), Some("bc"));
        let p = patterns(&["abcd", "bc"]);
        assert_eq!(p.find("xabcdx"), Some("abcd"));
        assert_eq!(p.find("xbcx"), Some("bc"));
    }

    #[test]
    fn matching_is_case_sensitive() {
        let p = patterns(&["CUDA error"]);
        assert_eq!(p.find("cuda error"), None);
    }

    #[test]
    fn rejects_empty_list_and_empty_pattern() {
        assert!(matches!(
            FaultPatterns::new(Vec::new()),
            Err(PatternError::Empty)
        ));
        let err = FaultPatterns::new(vec!["CUDA error".into(), String::new()]).unwrap_err();
        assert!(matches!(err, PatternError::EmptyPattern { index: 1 }));
        assert_eq!(err.to_string(), "fault pattern #1 is empty");
    }
}
