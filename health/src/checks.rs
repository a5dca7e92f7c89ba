//! The built-in checks, one per file. Each turns a probe's result into a
//! verdict with a pure `judge` function, so the verdict logic is tested
//! without a worker. The probe-based ones (`golden`, `finite`, `range`,
//! `latency`) are one [`HealthCheck`](crate::HealthCheck) implementation,
//! [`Probed`], over their [`Judge`](probed::Judge); `live` and `ready` ask
//! one RPC, and `exec` hands the exchange to a program.

mod exec;
mod finite;
mod golden;
mod latency;
mod live;
mod probed;
mod range;
mod ready;

pub(crate) use exec::{Exec, ExecOptions};
pub(crate) use finite::Finite;
pub(crate) use golden::Golden;
pub(crate) use latency::Latency;
pub(crate) use live::Live;
pub(crate) use probed::Probed;
pub(crate) use range::{Bounds, Range};
pub(crate) use ready::Ready;

use crate::tensor::Tensor;

/// `1 value`, `8 values`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The names of `outputs`, for "no output 'X' (it has [...])" reasons.
fn names(outputs: &[Tensor]) -> String {
    let names: Vec<&str> = outputs.iter().map(|t| t.name.as_str()).collect();
    names.join(", ")
}
