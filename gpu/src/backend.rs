//! Choosing and opening a backend from configuration.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserialize;

use crate::{FakeSetup, FakeTelemetry, GpuError, GpuTelemetry, NoTelemetry, NvmlTelemetry};

/// Which telemetry backend to run, as configured (`gpu.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// NVML when the driver is present, otherwise no telemetry.
    Auto,
    /// NVML, or fail.
    Nvml,
    /// Scripted fake devices, for tests and drills.
    Fake,
    /// No GPU telemetry.
    Off,
}

impl Backend {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Nvml => "nvml",
            Backend::Fake => "fake",
            Backend::Off => "off",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Backend`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU backend `{0}` (expected auto, nvml, fake or off)")]
pub struct ParseBackendError(String);

impl FromStr for Backend {
    type Err = ParseBackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Backend::Auto),
            "nvml" => Ok(Backend::Nvml),
            "fake" => Ok(Backend::Fake),
            "off" => Ok(Backend::Off),
            other => Err(ParseBackendError(other.to_owned())),
        }
    }
}

/// Opens `backend`; `fake` is what [`Backend::Fake`] pretends the host has.
///
/// [`Backend::Auto`] never fails: without NVML it logs one line saying GPU
/// telemetry is off and why, and returns [`NoTelemetry`]. [`Backend::Nvml`]
/// returns NVML's error instead.
pub fn open(backend: Backend, fake: FakeSetup) -> Result<Arc<dyn GpuTelemetry>, GpuError> {
    match backend {
        Backend::Nvml => Ok(Arc::new(NvmlTelemetry::open()?)),
        Backend::Fake => Ok(Arc::new(FakeTelemetry::from_setup(fake))),
        Backend::Off => Ok(Arc::new(NoTelemetry)),
        Backend::Auto => match NvmlTelemetry::open() {
            Ok(nvml) => Ok(Arc::new(nvml)),
            // Normal on a machine without NVIDIA GPUs.
            Err(GpuError::Unavailable(reason)) => {
                tracing::info!(
                    "GPU telemetry off: NVML not available ({reason}); running without GPU fault events"
                );
                Ok(Arc::new(NoTelemetry))
            }
            // The driver is there but NVML does not work: keep serving, loudly.
            Err(error) => {
                tracing::warn!(
                    "GPU telemetry off: {error}; running without GPU fault events (set the backend to nvml to make this fatal)"
                );
                Ok(Arc::new(NoTelemetry))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use serde::de::IntoDeserializer;
    use serde::de::value::{Error, StrDeserializer};

    use super::*;

    #[test]
    fn parses_every_backend() {
        for backend in [Backend::Auto, Backend::Nvml, Backend::Fake, Backend::Off] {
            assert_eq!(backend.as_str().parse::<Backend>(), Ok(backend));
            let de: StrDeserializer<'_, Error> = backend.as_str().into_deserializer();
            assert_eq!(Backend::deserialize(de).unwrap(), backend);
        }
        let err = "cuda".parse::<Backend>().unwrap_err();
        assert!(err.to_string().contains("`cuda`"), "{err}");
        assert!("NVML".parse::<Backend>().is_err());
    }

    #[test]
    fn auto_falls_back_to_off_without_a_driver() {
        // On a GPU host this opens NVML instead.
        let expected = match NvmlTelemetry::open() {
            Ok(_) => "nvml",
            Err(_) => "off",
        };
        assert_eq!(
            open(Backend::Auto, FakeSetup::default()).unwrap().backend(),
            expected
        );
    }

    #[test]
    fn nvml_reports_why_it_is_unavailable() {
        match open(Backend::Nvml, FakeSetup::default()) {
            Ok(gpu) => assert_eq!(gpu.backend(), "nvml"),
            Err(error) => assert!(
                matches!(error, GpuError::Unavailable(_) | GpuError::Nvml(_)),
                "{error:?}"
            ),
        }
    }

    #[test]
    fn fake_and_off() {
        let four = FakeSetup {
            devices: 4,
            ..FakeSetup::default()
        };
        let fake = open(Backend::Fake, four).unwrap();
        assert_eq!(fake.backend(), "fake");
        assert_eq!(fake.devices().len(), 4);
        let off = open(Backend::Off, four).unwrap();
        assert_eq!(off.backend(), "off");
        assert!(off.devices().is_empty());
    }
}
