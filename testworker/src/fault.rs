//! Fault injection: the failures a GPU inference server shows in production,
//! reproduced on demand.

use std::fmt;
use std::str::FromStr;

/// What the worker does when a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Prints a CUDA illegal-address error and a stack line to stderr, then
    /// aborts (SIGABRT; a shell reports exit code 134).
    CudaCrash,
    /// Stays alive and keeps reporting live and ready, but every later
    /// `ModelInfer` fails with INTERNAL and the CUDA message — what Triton
    /// does after a CUDA exception.
    CudaSticky,
    /// Stops answering every RPC, probes included.
    Hang,
    /// `ModelInfer` blocks (every call from now on, this one included)
    /// while `ServerLive`, `ModelReady` and the rest still answer: a stuck
    /// inference thread (a spinning GPU kernel, a deadlocked model) behind
    /// a live control plane.
    Stall,
    /// Outputs NaN.
    Nan,
    /// Service time × 10 (at least 10 ms, so it shows with `--service-time-ms 0`).
    Slow,
}

/// The message a CUDA illegal address prints, as PyTorch and Triton log it.
pub const CUDA_ERROR_MESSAGE: &str = "CUDA error: an illegal memory access was encountered";

impl FaultKind {
    /// Every kind, for help texts and tests.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::CudaCrash,
        FaultKind::CudaSticky,
        FaultKind::Hang,
        FaultKind::Stall,
        FaultKind::Nan,
        FaultKind::Slow,
    ];

    /// The name used on the command line and in the request parameter.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::CudaCrash => "cuda-crash",
            FaultKind::CudaSticky => "cuda-sticky",
            FaultKind::Hang => "hang",
            FaultKind::Stall => "stall",
            FaultKind::Nan => "nan",
            FaultKind::Slow => "slow",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown fault '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// Writes what a crashing CUDA process writes to stderr, then aborts.
pub fn crash_like_cuda() -> ! {
    eprintln!("terminate called after throwing an instance of 'c10::Error'");
    eprintln!("  what():  {CUDA_ERROR_MESSAGE}");
    eprintln!(
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect."
    );
    eprintln!(
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:44 (most recent call first):"
    );
    eprintln!(
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f3a2c1b2617 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)"
    );
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in FaultKind::ALL {
            assert_eq!(k.name().parse::<FaultKind>(), Ok(k));
        }
        assert!(
            "boom"
                .parse::<FaultKind>()
                .unwrap_err()
                .contains("cuda-crash")
        );
    }
}
