//! The outcome of one health check.

use std::fmt;
use std::time::Duration;

/// What one run of a [`HealthCheck`](crate::HealthCheck) found (made by
/// the check: `Verdict::pass`, `Verdict::fail`, `Verdict::from_result`).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The check's label: its kind (`"golden"`, `"exec"`, ...) or the
    /// `name` given in the configuration.
    pub check: String,
    /// The model probed; empty for server-wide checks (`live`).
    pub model: String,
    /// Whether the worker passed.
    pub pass: bool,
    /// Why it failed, or a short note on what passed
    /// (e.g. `"4 values in 1 output within atol 1e-5, rtol 1e-4"`).
    pub reason: String,
    /// How long the probe request took (the whole check when it timed out).
    pub latency: Duration,
}

impl fmt::Display for Verdict {
    /// `golden(dense) fail in 1.2ms: OUTPUT0[0,1]: got NaN, ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outcome = if self.pass { "pass" } else { "fail" };
        f.write_str(&self.check)?;
        if !self.model.is_empty() {
            write!(f, "({})", self.model)?;
        }
        write!(f, " {outcome} in {:?}: {}", self.latency, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(model: &str, pass: bool) -> Verdict {
        Verdict {
            check: "golden".into(),
            model: model.into(),
            pass,
            reason: "why".into(),
            latency: Duration::from_micros(1500),
        }
    }

    #[test]
    fn displays_check_model_outcome_latency_and_reason() {
        assert_eq!(
            verdict("dense", true).to_string(),
            "golden(dense) pass in 1.5ms: why"
        );
        assert_eq!(verdict("", false).to_string(), "golden fail in 1.5ms: why");
    }
}
