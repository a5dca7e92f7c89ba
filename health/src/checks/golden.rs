//! `golden`: send a stored request and compare every output value with the
//! stored expected values, with NumPy `allclose` semantics (see
//! `allclose.rs`). Catches a worker that answers quickly and confidently but
//! wrongly: corrupted weights, a bad kernel, a wrong model version.

use std::time::Duration;

use crate::allclose::Tolerance;
use crate::request::ProbeRequest;
use crate::tensor::Tensor;

use super::probed::Judge;
use super::{count, names};

/// Judges a model's outputs against the expected values of its request.
#[derive(Debug)]
pub(crate) struct Golden {
    expected: Vec<Tensor>,
    tolerance: Tolerance,
}

impl Golden {
    /// A judge of answers to `request`, whose `expected` outputs must be
    /// given; tolerances must be finite and non-negative.
    pub fn new(request: &ProbeRequest, tolerance: Tolerance) -> Result<Self, String> {
        for (option, v) in [("atol", tolerance.atol), ("rtol", tolerance.rtol)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{option} must be a finite number >= 0, not {v}"));
            }
        }
        if request.expected.is_empty() {
            return Err("the request file has no expected `outputs` to compare with".to_string());
        }
        Ok(Self {
            expected: request.expected.clone(),
            tolerance,
        })
    }
}

impl Judge for Golden {
    fn judge(&self, outputs: &[Tensor], _latency: Duration) -> Result<String, String> {
        judge(&self.expected, outputs, self.tolerance)
    }
}

/// Compares `got` with `expected`: the note on pass, the first mismatch and
/// the number of mismatched values on failure.
pub(crate) fn judge(expected: &[Tensor], got: &[Tensor], tol: Tolerance) -> Result<String, String> {
    let within = format!("atol {}, rtol {}", tol.atol, tol.rtol);
    let mut total = 0;
    let mut differ = 0;
    let mut first = None;
    for exp in expected {
        let out = got.iter().find(|t| t.name == exp.name).ok_or_else(|| {
            format!(
                "response has no output '{}' (it has [{}])",
                exp.name,
                names(got)
            )
        })?;
        if out.datatype != exp.datatype {
            return Err(format!(
                "{}: datatype {}, expected {}",
                exp.name, out.datatype, exp.datatype
            ));
        }
        if out.shape != exp.shape {
            return Err(format!(
                "{}: shape {:?}, expected {:?}",
                exp.name, out.shape, exp.shape
            ));
        }
        total += exp.data.len();
        if let Some(m) = tol.compare(&out.data, &exp.data) {
            differ += m.count;
            first.get_or_insert_with(|| {
                format!(
                    "{}: got {}, expected {}",
                    exp.position(m.index),
                    m.got,
                    m.expected
                )
            });
        }
    }
    match first {
        None => Ok(format!(
            "{} in {} within {within}",
            count(total, "value"),
            count(expected.len(), "output")
        )),
        Some(first) => Err(format!(
            "{first}; {differ} of {total} values differ beyond {within}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-4,
    };

    fn t(name: &str, shape: Vec<i64>, data: Vec<f64>) -> Tensor {
        Tensor::new(name, "FP32", shape, data).unwrap()
    }

    #[test]
    fn passes_within_tolerance() {
        let exp = [t("Y", vec![1, 2], vec![0.5, -0.25])];
        let got = [t("Y", vec![1, 2], vec![0.500001, -0.25])];
        assert_eq!(
            judge(&exp, &got, TOL).unwrap(),
            "2 values in 1 output within atol 0.00001, rtol 0.0001"
        );
    }

    #[test]
    fn names_the_first_mismatch_and_counts_them() {
        let exp = [t("Y", vec![2, 2], vec![0.5, 0.5, 0.5, 0.5])];
        let got = [t("Y", vec![2, 2], vec![0.5, 0.6, f64::NAN, 0.5])];
        let err = judge(&exp, &got, TOL).unwrap_err();
        assert_eq!(
            err,
            "Y[0,1]: got 0.6, expected 0.5; 2 of 4 values differ beyond atol 0.00001, rtol 0.0001"
        );
    }

    #[test]
    fn fails_on_missing_output_or_different_shape_or_datatype() {
        let exp = [t("Y", vec![1, 2], vec![0.5, 0.5])];
        let err = judge(&exp, &[t("Z", vec![1], vec![0.0])], TOL).unwrap_err();
        assert_eq!(err, "response has no output 'Y' (it has [Z])");
        let err = judge(&exp, &[t("Y", vec![2, 1], vec![0.5, 0.5])], TOL).unwrap_err();
        assert_eq!(err, "Y: shape [2, 1], expected [1, 2]");
        let fp64 = Tensor::new("Y", "FP64", vec![1, 2], vec![0.5, 0.5]).unwrap();
        assert_eq!(
            judge(&exp, &[fp64], TOL).unwrap_err(),
            "Y: datatype FP64, expected FP32"
        );
    }

    #[test]
    fn new_requires_expected_outputs_and_sane_tolerances() {
        let input = t("X", vec![1], vec![1.0]);
        let bare = ProbeRequest::new(vec![input.clone()], Default::default(), vec![]).unwrap();
        assert!(Golden::new(&bare, TOL).is_err());
        let with = ProbeRequest::new(
            vec![input],
            Default::default(),
            vec![t("Y", vec![1], vec![0.0])],
        )
        .unwrap();
        let negative = Tolerance {
            atol: -1.0,
            rtol: 0.0,
        };
        assert!(Golden::new(&with, negative).unwrap_err().contains("atol"));
        let nan = Tolerance {
            atol: 0.0,
            rtol: f64::NAN,
        };
        assert!(Golden::new(&with, nan).unwrap_err().contains("rtol"));
        assert!(Golden::new(&with, TOL).is_ok());
    }
}
