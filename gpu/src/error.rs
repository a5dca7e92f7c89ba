//! The crate's error type.

/// Why a GPU telemetry operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The NVIDIA driver or `libnvidia-ml` is missing or not loaded: the host
    /// has no usable NVIDIA GPU, which is normal on a development machine.
    #[error("NVML not available: {0}")]
    Unavailable(String),
    /// NVML is present but a call into it failed (permissions, a
    /// driver/library version mismatch, a lost GPU, ...).
    #[error("NVML error: {0}")]
    Nvml(String),
    /// The backend cannot do this, e.g. injecting an event into real hardware.
    #[error("not supported by this GPU backend: {0}")]
    NotSupported(&'static str),
    /// No device has this index.
    #[error("no GPU with index {0}")]
    UnknownDevice(u32),
}
