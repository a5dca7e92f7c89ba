//! Checks as configured: one [`CheckSpec`] per `[[health.checks]]` entry of
//! the agent's TOML, and [`build`], which turns one into a runnable check,
//! loading and validating its files now so a bad file is a config error,
//! not a failing worker.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::allclose::Tolerance;
use crate::checks::{Bounds, Exec, Finite, Golden, Latency, Live, Probed, Range, Ready};
use crate::probe::Probe;
use crate::request::ProbeRequest;
use crate::{HealthCheck, HealthError};

/// One configured check, tagged by `kind`. Every kind but `live` names the
/// `model` it probes; `name` optionally labels the check in verdicts, logs
/// and metrics (default: the kind). Relative paths are relative to the
/// config file's directory. See the crate docs for examples.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum CheckSpec {
    /// `ServerLive` must answer `live = true`.
    Live {
        /// Label (default `live`).
        name: Option<String>,
    },
    /// `ModelReady` must answer `ready = true` for the model.
    Ready {
        /// Label (default `ready`).
        name: Option<String>,
        /// Model probed.
        model: String,
    },
    /// The stored request's outputs must match its expected `outputs`
    /// within `|got - expected| <= atol + rtol * |expected|`.
    Golden {
        /// Label (default `golden`).
        name: Option<String>,
        /// Model probed.
        model: String,
        /// KServe v2 JSON request with expected `outputs`.
        request: PathBuf,
        /// Absolute tolerance (default 1e-5).
        #[serde(default = "default_atol")]
        atol: f64,
        /// Relative tolerance (default 1e-4).
        #[serde(default = "default_rtol")]
        rtol: f64,
    },
    /// No output of a probe may be NaN or infinite.
    Finite {
        /// Label (default `finite`).
        name: Option<String>,
        /// Model probed.
        model: String,
        /// Probe request (JSON or `.npy`); default: built from metadata.
        request: Option<PathBuf>,
        /// Input name for a `.npy` request.
        input: Option<String>,
    },
    /// Outputs must lie in `[min, max]`; with `sum_to`, each row (last
    /// dimension) must sum to it within `sum_tolerance`.
    Range {
        /// Label (default `range`).
        name: Option<String>,
        /// Model probed.
        model: String,
        /// Probe request (JSON or `.npy`); default: built from metadata.
        request: Option<PathBuf>,
        /// Input name for a `.npy` request.
        input: Option<String>,
        /// Smallest allowed value.
        min: Option<f64>,
        /// Largest allowed value.
        max: Option<f64>,
        /// Sum each row must have (e.g. 1.0 for probabilities).
        sum_to: Option<f64>,
        /// Allowed distance of a row's sum from `sum_to` (default 1e-3).
        #[serde(default = "default_sum_tolerance")]
        sum_tolerance: f64,
        /// Check only this output (default: all).
        output: Option<String>,
    },
    /// A probe must complete within `max`.
    Latency {
        /// Label (default `latency`).
        name: Option<String>,
        /// Model probed.
        model: String,
        /// Probe request (JSON or `.npy`); default: built from metadata.
        request: Option<PathBuf>,
        /// Input name for a `.npy` request.
        input: Option<String>,
        /// Latency limit, e.g. `"200ms"`.
        #[serde(with = "humantime_serde")]
        max: Duration,
    },
    /// A command judges the probe: JSON document on stdin, exit code 0 =
    /// pass, first line of stdout = reason.
    Exec {
        /// Label (default `exec`).
        name: Option<String>,
        /// Model probed.
        model: String,
        /// Command line, split like a shell does (no shell runs it).
        command: String,
        /// Probe request (JSON or `.npy`); default: built from metadata.
        request: Option<PathBuf>,
        /// Input name for a `.npy` request.
        input: Option<String>,
        /// Deadline for the command (default 5s).
        #[serde(default = "default_exec_timeout", with = "humantime_serde")]
        timeout: Duration,
        /// Bytes of stdout and of stderr kept (default 4096).
        #[serde(default = "default_max_output_bytes")]
        max_output_bytes: usize,
    },
}

fn default_atol() -> f64 {
    1e-5
}

fn default_rtol() -> f64 {
    1e-4
}

fn default_sum_tolerance() -> f64 {
    1e-3
}

fn default_exec_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_max_output_bytes() -> usize {
    4096
}

impl CheckSpec {
    /// The kind: `live`, `ready`, `golden`, `finite`, `range`, `latency`, `exec`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Live { .. } => "live",
            Self::Ready { .. } => "ready",
            Self::Golden { .. } => "golden",
            Self::Finite { .. } => "finite",
            Self::Range { .. } => "range",
            Self::Latency { .. } => "latency",
            Self::Exec { .. } => "exec",
        }
    }

    /// The label verdicts carry: `name`, or the kind.
    pub fn label(&self) -> &str {
        let name = match self {
            Self::Live { name }
            | Self::Ready { name, .. }
            | Self::Golden { name, .. }
            | Self::Finite { name, .. }
            | Self::Range { name, .. }
            | Self::Latency { name, .. }
            | Self::Exec { name, .. } => name,
        };
        name.as_deref().unwrap_or(self.kind())
    }

    /// The model probed; `None` for `live`.
    pub fn model(&self) -> Option<&str> {
        match self {
            Self::Live { .. } => None,
            Self::Ready { model, .. }
            | Self::Golden { model, .. }
            | Self::Finite { model, .. }
            | Self::Range { model, .. }
            | Self::Latency { model, .. }
            | Self::Exec { model, .. } => Some(model),
        }
    }
}

/// Builds the check `spec` describes. Relative paths resolve against
/// `base_dir` (the config file's directory); request files are read and
/// validated now, so errors name the file and the problem.
pub fn build(spec: &CheckSpec, base_dir: &Path) -> Result<Box<dyn HealthCheck>, HealthError> {
    let label = spec.label().to_string();
    let invalid = |problem: String| HealthError::InvalidSpec {
        check: label.clone(),
        problem,
    };
    if label.is_empty() {
        return Err(invalid("name must not be empty".into()));
    }
    if spec.model() == Some("") {
        return Err(invalid("model must not be empty".into()));
    }
    let probe = |model: &str, request: &Option<PathBuf>, input: &Option<String>| {
        let request = match (request, input) {
            (Some(path), input) => {
                Some(ProbeRequest::load(&base_dir.join(path), input.as_deref())?)
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "`input` names the input of a .npy `request`; give one".into(),
                ));
            }
            (None, None) => None,
        };
        Ok(Probe::new(model, request))
    };
    let check: Box<dyn HealthCheck> = match spec {
        CheckSpec::Live { .. } => Box::new(Live::new(label.clone())),
        CheckSpec::Ready { model, .. } => Box::new(Ready::new(label.clone(), model)),
        CheckSpec::Golden {
            model,
            request,
            atol,
            rtol,
            ..
        } => {
            let is_npy = request
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("npy"));
            if is_npy {
                return Err(invalid(
                    "request must be a KServe v2 JSON file with expected `outputs`, not .npy"
                        .into(),
                ));
            }
            let request = ProbeRequest::load(&base_dir.join(request), None)?;
            let tolerance = Tolerance {
                atol: *atol,
                rtol: *rtol,
            };
            let golden = Golden::new(&request, tolerance).map_err(invalid)?;
            let probe = Probe::new(model, Some(request));
            Box::new(Probed::new(label.clone(), model, probe, golden))
        }
        CheckSpec::Finite {
            model,
            request,
            input,
            ..
        } => Box::new(Probed::new(
            label.clone(),
            model,
            probe(model, request, input)?,
            Finite,
        )),
        CheckSpec::Range {
            model,
            request,
            input,
            min,
            max,
            sum_to,
            sum_tolerance,
            output,
            ..
        } => {
            let bounds = Bounds {
                min: *min,
                max: *max,
                sum_to: *sum_to,
                sum_tolerance: *sum_tolerance,
                output: output.clone(),
            };
            let probe = probe(model, request, input)?;
            let range = Range::new(bounds).map_err(invalid)?;
            Box::new(Probed::new(label.clone(), model, probe, range))
        }
        CheckSpec::Latency {
            model,
            request,
            input,
            max,
            ..
        } => Box::new(Probed::new(
            label.clone(),
            model,
            probe(model, request, input)?,
            Latency { max: *max },
        )),
        CheckSpec::Exec {
            model,
            command,
            request,
            input,
            timeout,
            max_output_bytes,
            ..
        } => {
            let opts = crate::checks::ExecOptions {
                command,
                base_dir,
                timeout: *timeout,
                max_output: *max_output_bytes,
            };
            let probe = probe(model, request, input)?;
            Box::new(Exec::new(label.clone(), model, probe, opts).map_err(invalid)?)
        }
    };
    Ok(check)
}

#[cfg(test)]
mod tests;
