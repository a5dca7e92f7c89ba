//! `range`: output values lie within `[min, max]` (NaN never does), and
//! optionally each row — the last dimension — sums to a target, as a
//! classifier's probabilities sum to 1. Checks plausibility when exact
//! expected values are unknown.

use std::time::Duration;

use crate::tensor::Tensor;

use super::probed::Judge;
use super::{count, names};

/// What a range check accepts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bounds {
    /// Smallest allowed value; none below.
    pub min: Option<f64>,
    /// Largest allowed value; none above.
    pub max: Option<f64>,
    /// The sum every row must have.
    pub sum_to: Option<f64>,
    /// How far a row's sum may be from `sum_to`.
    pub sum_tolerance: f64,
    /// The one output to check; all when `None`.
    pub output: Option<String>,
}

/// Judges output values against [`Bounds`].
#[derive(Debug)]
pub(crate) struct Range {
    bounds: Bounds,
}

impl Range {
    /// A range check; `bounds` needs at least one of min, max and sum_to,
    /// with `min <= max` and finite numbers.
    pub fn new(bounds: Bounds) -> Result<Self, String> {
        if bounds.min.is_none() && bounds.max.is_none() && bounds.sum_to.is_none() {
            return Err("give at least one of min, max and sum_to".to_string());
        }
        let numbers = [
            ("min", bounds.min),
            ("max", bounds.max),
            ("sum_to", bounds.sum_to),
            ("sum_tolerance", Some(bounds.sum_tolerance)),
        ];
        for (option, v) in numbers {
            if v.is_some_and(|v| !v.is_finite()) {
                return Err(format!("{option} must be a finite number"));
            }
        }
        if bounds.sum_tolerance < 0.0 {
            return Err("sum_tolerance must be >= 0".to_string());
        }
        if let (Some(min), Some(max)) = (bounds.min, bounds.max) {
            if min > max {
                return Err(format!("min ({min}) is above max ({max})"));
            }
        }
        if bounds.output.as_deref() == Some("") {
            return Err("output must not be empty".to_string());
        }
        Ok(Self { bounds })
    }
}

impl Judge for Range {
    fn judge(&self, outputs: &[Tensor], _latency: Duration) -> Result<String, String> {
        judge(&self.bounds, outputs)
    }
}

/// Passes iff every selected value is within bounds and every row sums right.
pub(crate) fn judge(bounds: &Bounds, outputs: &[Tensor]) -> Result<String, String> {
    let selected: Vec<&Tensor> = match &bounds.output {
        Some(name) => vec![outputs.iter().find(|t| &t.name == name).ok_or_else(|| {
            format!(
                "response has no output '{name}' (it has [{}])",
                names(outputs)
            )
        })?],
        None => outputs.iter().collect(),
    };
    if selected.is_empty() {
        return Err("the response has no outputs".to_string());
    }
    let lo = bounds.min.unwrap_or(f64::NEG_INFINITY);
    let hi = bounds.max.unwrap_or(f64::INFINITY);
    let interval = format!("[{lo}, {hi}]");

    let mut total = 0;
    let mut outside = 0;
    let mut first = None;
    for t in &selected {
        total += t.data.len();
        for (i, v) in t.data.iter().enumerate() {
            if !(lo..=hi).contains(v) {
                outside += 1;
                first.get_or_insert_with(|| format!("{} = {v}", t.position(i)));
            }
        }
    }
    if let Some(first) = first {
        return Err(format!(
            "{first} is outside {interval}; {outside} of {total} values are out of range"
        ));
    }
    let mut note = format!("{} within {interval}", count(total, "value"));

    if let Some(target) = bounds.sum_to {
        let tol = bounds.sum_tolerance;
        let mut rows = 0;
        for t in &selected {
            for (r, row) in t.rows().enumerate() {
                rows += 1;
                let sum: f64 = row.iter().sum();
                // A NaN sum is never within tolerance.
                let within = (sum - target).abs() <= tol;
                if !within {
                    return Err(format!(
                        "{} row {r} sums to {sum}, expected {target} ± {tol}",
                        t.name
                    ));
                }
            }
        }
        note.push_str(&format!("; {} sum to {target} ± {tol}", count(rows, "row")));
    }
    Ok(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(min: Option<f64>, max: Option<f64>, sum_to: Option<f64>) -> Bounds {
        Bounds {
            min,
            max,
            sum_to,
            sum_tolerance: 1e-3,
            output: None,
        }
    }

    fn probs() -> Tensor {
        Tensor::new("P", "FP32", vec![2, 2], vec![0.25, 0.75, 0.5, 0.5]).unwrap()
    }

    #[test]
    fn passes_within_bounds_and_sums() {
        let b = bounds(Some(0.0), Some(1.0), Some(1.0));
        assert_eq!(
            judge(&b, &[probs()]).unwrap(),
            "4 values within [0, 1]; 2 rows sum to 1 ± 0.001"
        );
        assert!(judge(&bounds(None, Some(0.75), None), &[probs()]).is_ok());
    }

    #[test]
    fn fails_outside_bounds_on_nan_and_on_bad_sums() {
        let b = bounds(Some(0.0), Some(0.6), None);
        assert_eq!(
            judge(&b, &[probs()]).unwrap_err(),
            "P[0,1] = 0.75 is outside [0, 0.6]; 1 of 4 values are out of range"
        );
        let nan = Tensor::new("P", "FP32", vec![1], vec![f64::NAN]).unwrap();
        assert!(
            judge(&bounds(None, None, Some(1.0)), &[nan])
                .unwrap_err()
                .contains("NaN")
        );
        let skewed = Tensor::new("P", "FP32", vec![2, 2], vec![0.5, 0.5, 0.5, 0.4]).unwrap();
        assert_eq!(
            judge(&bounds(None, None, Some(1.0)), &[skewed]).unwrap_err(),
            "P row 1 sums to 0.9, expected 1 ± 0.001"
        );
    }

    #[test]
    fn checks_only_the_named_output() {
        let wild = Tensor::new("LOGITS", "FP32", vec![2], vec![-9.0, 9.0]).unwrap();
        let mut b = bounds(Some(0.0), Some(1.0), None);
        assert!(judge(&b, &[wild.clone(), probs()]).is_err());
        b.output = Some("P".into());
        assert!(judge(&b, &[wild.clone(), probs()]).is_ok());
        b.output = Some("Q".into());
        assert_eq!(
            judge(&b, &[wild, probs()]).unwrap_err(),
            "response has no output 'Q' (it has [LOGITS, P])"
        );
    }

    #[test]
    fn new_validates_the_bounds() {
        let new = Range::new;
        assert!(new(bounds(None, None, None)).is_err());
        assert!(
            new(bounds(Some(1.0), Some(0.0), None))
                .unwrap_err()
                .contains("above")
        );
        assert!(new(bounds(Some(f64::NAN), None, None)).is_err());
        assert!(new(bounds(Some(-1.0), Some(1.0), None)).is_ok());
    }
}
