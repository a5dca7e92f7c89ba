//! Comparing values with NumPy's `allclose` semantics: `got` matches
//! `expected` iff `|got - expected| <= atol + rtol * |expected|`. NaN never
//! matches (not even NaN); an infinity matches only the same infinity.
//! Note the test is asymmetric, as in NumPy: `rtol` scales the expected value.

/// Absolute and relative tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance, times `|expected|`.
    pub rtol: f64,
}

/// The first value that does not match, and how many do not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Mismatch {
    /// Index of the first mismatch.
    pub index: usize,
    /// The value found there.
    pub got: f64,
    /// The value expected there.
    pub expected: f64,
    /// How many values do not match.
    pub count: usize,
}

impl Tolerance {
    /// Whether `got` matches `expected`.
    pub fn close(&self, got: f64, expected: f64) -> bool {
        if got.is_infinite() || expected.is_infinite() {
            return got == expected;
        }
        // False for NaN on either side.
        (got - expected).abs() <= self.atol + self.rtol * expected.abs()
    }

    /// Compares equal-length slices; `None` when every value matches.
    pub fn compare(&self, got: &[f64], expected: &[f64]) -> Option<Mismatch> {
        let mut first = None;
        let mut count = 0;
        for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
            if !self.close(g, e) {
                count += 1;
                first.get_or_insert((i, g, e));
            }
        }
        first.map(|(index, got, expected)| Mismatch {
            index,
            got,
            expected,
            count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-4,
    };

    #[test]
    fn tolerance_is_absolute_plus_relative_to_expected() {
        assert!(TOL.close(1.0, 1.0));
        assert!(TOL.close(1.0 + 1.09e-4, 1.0));
        assert!(!TOL.close(1.0 + 1.2e-4, 1.0));
        assert!(TOL.close(1e-5, 0.0), "atol alone near zero");
        assert!(!TOL.close(2e-5, 0.0));
        // Asymmetric, like numpy: rtol scales the expected value.
        let loose = Tolerance {
            atol: 0.0,
            rtol: 0.5,
        };
        assert!(loose.close(1.0, 2.0));
        assert!(!loose.close(2.0, 1.0));
        let exact = Tolerance {
            atol: 0.0,
            rtol: 0.0,
        };
        assert!(exact.close(0.25, 0.25) && !exact.close(0.25, 0.2500001));
    }

    #[test]
    fn nan_never_matches_and_infinities_match_only_themselves() {
        assert!(!TOL.close(f64::NAN, f64::NAN));
        assert!(!TOL.close(f64::NAN, 0.0));
        assert!(!TOL.close(0.0, f64::NAN));
        assert!(TOL.close(f64::INFINITY, f64::INFINITY));
        assert!(!TOL.close(f64::INFINITY, f64::NEG_INFINITY));
        assert!(!TOL.close(f64::INFINITY, 1e300));
        let huge = Tolerance {
            atol: f64::INFINITY,
            rtol: 0.0,
        };
        assert!(!huge.close(f64::INFINITY, 0.0));
    }

    #[test]
    fn compare_reports_the_first_mismatch_and_the_count() {
        assert_eq!(TOL.compare(&[1.0, 2.0], &[1.0, 2.0]), None);
        let m = TOL
            .compare(&[1.0, 9.0, f64::NAN], &[1.0, 2.0, 3.0])
            .unwrap();
        assert_eq!((m.index, m.got, m.expected, m.count), (1, 9.0, 2.0, 2));
    }
}
