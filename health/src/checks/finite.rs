//! `finite`: no output value of a probe is NaN or infinite — the classic
//! symptom of a GPU producing garbage (a bad kernel, overflowing FP16
//! activations, corrupted memory) while the server stays up.

use std::time::Duration;

use crate::tensor::Tensor;

use super::count;
use super::probed::Judge;

/// Judges every output value finite.
#[derive(Debug)]
pub(crate) struct Finite;

impl Judge for Finite {
    fn judge(&self, outputs: &[Tensor], _latency: Duration) -> Result<String, String> {
        judge(outputs)
    }
}

/// Passes iff there are outputs and all their values are finite.
pub(crate) fn judge(outputs: &[Tensor]) -> Result<String, String> {
    if outputs.is_empty() {
        return Err("the response has no outputs".to_string());
    }
    let mut total = 0;
    let mut bad = 0;
    let mut first = None;
    for t in outputs {
        total += t.data.len();
        for (i, v) in t.data.iter().enumerate() {
            if !v.is_finite() {
                bad += 1;
                first.get_or_insert_with(|| format!("{} is {v}", t.position(i)));
            }
        }
    }
    match first {
        None => Ok(format!(
            "{} in {} are finite",
            count(total, "value"),
            count(outputs.len(), "output")
        )),
        Some(first) => Err(format!("{first}; {bad} of {total} values are not finite")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nan_and_infinity() {
        let ok = Tensor::new("Y", "FP32", vec![2], vec![0.5, -1e30]).unwrap();
        assert_eq!(
            judge(std::slice::from_ref(&ok)).unwrap(),
            "2 values in 1 output are finite"
        );
        let bad = Tensor::new("Z", "FP32", vec![1, 3], vec![1.0, f64::NAN, f64::INFINITY]).unwrap();
        assert_eq!(
            judge(&[ok, bad]).unwrap_err(),
            "Z[0,1] is NaN; 2 of 5 values are not finite"
        );
        assert!(judge(&[]).is_err());
    }
}
