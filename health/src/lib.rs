//! Health-check plugins that verify a worker's outputs, not just its port.
//!
//! A GPU inference server can stay up, answer `ServerLive`, report its
//! models ready — and return NaN, garbage or answers twenty times too slow
//! (a corrupted GPU context, a bad driver, a throttled card). This crate
//! holds the checks that catch that, by sending real inference requests
//! over the Open Inference Protocol and judging what comes back.
//!
//! # Plugin model
//!
//! A check implements [`HealthCheck`]: it has a label ([`HealthCheck::name`]),
//! the model it probes, and an async [`HealthCheck::check`] that takes an
//! OIP [`Client`] connected to one worker and returns a [`Verdict`] — pass
//! or fail, a reason, and the probe's latency. A check never returns an
//! error: an unreachable worker, a bad response or a crashing script is a
//! failed verdict. [`run_check`] runs a check with a deadline (a timeout, or
//! even a panic, is a failed verdict too).
//!
//! Checks are configured as [`CheckSpec`]s (`[[health.checks]]` in the
//! agent's TOML) and made runnable by [`build`], which reads and validates
//! their files up front. The built-in kinds:
//!
//! ```toml
//! [[health.checks]]
//! kind = "live"                                  # ServerLive answers live
//! [[health.checks]]
//! kind = "ready"                                 # ModelReady answers ready
//! model = "dense"
//! [[health.checks]]
//! kind = "golden"                                # outputs match stored values
//! model = "dense"
//! request = "health/dense-golden.json"           # KServe v2 JSON with expected "outputs"
//! atol = 1e-5                                    # |got - exp| <= atol + rtol * |exp|
//! rtol = 1e-4
//! [[health.checks]]
//! kind = "finite"                                # no NaN / Inf in any output
//! model = "dense"
//! [[health.checks]]
//! kind = "range"                                 # values in [min, max]
//! model = "dense"
//! min = -1.0
//! max = 1.0
//! # sum_to = 1.0, sum_tolerance = 1e-3, output = "PROBS"   (rows of a classifier)
//! [[health.checks]]
//! kind = "latency"                               # a probe completes in time
//! model = "dense"
//! max = "200ms"
//! [[health.checks]]
//! kind = "exec"                                  # the model owner's own judgement
//! name = "owner-check"                           # any check can be labelled
//! model = "dense"
//! command = "health/check-output.sh --strict"
//! timeout = "5s"
//! max_output_bytes = 4096
//! ```
//!
//! `finite`, `range`, `latency` and `exec` take an optional probe `request`:
//! a KServe v2 JSON file, or a `.npy` array for a single input named by
//! `input = "INPUT0"`. Without one they build a probe from the model's
//! metadata: variable dimensions set to 1, floats filled with 0.5, integers
//! with 1 (`BYTES` inputs need a file). Requests are sent in the raw form;
//! `BOOL`, integer and float datatypes (FP16, BF16 included) are supported,
//! and values are compared as `f64`.
//!
//! # When checks run
//!
//! That is the agent's business, not this crate's: it runs a worker's checks
//! when the worker starts (gating readiness), periodically, and after each
//! restart, and feeds failures to the worker's sentinel, which degrades and
//! eventually restarts it. This crate knows nothing of the agent; one built
//! check serves every worker and may run concurrently.
//!
//! # The exec protocol
//!
//! An `exec` check first sends its probe, then runs `command` (split like a
//! shell does; a relative program path containing `/` is relative to the
//! config file's directory, which is also the working directory; no shell
//! is involved) in its own process group, with one JSON document on stdin:
//!
//! ```json
//! {
//!   "model": "dense",
//!   "request": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5, ...]}]},
//!   "response": {"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.12, ...]}]},
//!   "latency_ms": 1.37
//! }
//! ```
//!
//! `data` is flat and row-major; NaN and infinities are written as `null`.
//! If the probe failed, `"error": "<why>"` replaces `"response"` (and
//! `"request"` is `null` if no request could be built), so the command can
//! still decide. Exit code 0 is a pass, anything else a failure; the first
//! non-empty line of stdout is the verdict's reason (on a failure without
//! one: the exit status and the first line of stderr). The command must
//! finish within `timeout`, or its whole process group is killed and the
//! reason is `timed out after 5s`; at most `max_output_bytes` of stdout and
//! of stderr are kept, the rest is read and discarded so the command never
//! blocks. A program that cannot be started is a failed verdict naming it.
//! `configs/health/check-output.sh` is an example.
#![forbid(unsafe_code)]

mod allclose;
mod check;
mod checks;
mod codec;
mod error;
mod npy;
mod probe;
mod request;
mod spec;
mod tensor;
mod verdict;

#[cfg(test)]
mod scratch;

pub use check::{CheckFuture, Client, HealthCheck, run_check};
pub use error::HealthError;
pub use npy::NpyError;
pub use spec::{CheckSpec, build};
pub use verdict::Verdict;
