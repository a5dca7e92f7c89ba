//! `latency`: a probe request completes within a limit. Catches a worker
//! that still answers correctly but far too slowly (thermal throttling, a
//! GPU fallen back to CPU, a noisy neighbour).

use std::time::Duration;

use crate::tensor::Tensor;

use super::probed::Judge;

/// Judges the probe's latency: at most `max`.
#[derive(Debug)]
pub(crate) struct Latency {
    /// The limit, inclusive.
    pub max: Duration,
}

impl Judge for Latency {
    fn judge(&self, _outputs: &[Tensor], latency: Duration) -> Result<String, String> {
        judge(latency, self.max)
    }
}

/// Passes iff `latency <= max`.
pub(crate) fn judge(latency: Duration, max: Duration) -> Result<String, String> {
    if latency <= max {
        Ok(format!("took {latency:?}, within {max:?}"))
    } else {
        Err(format!("took {latency:?}, over the {max:?} limit"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_with_the_limit_inclusively() {
        let ms = Duration::from_millis;
        assert_eq!(judge(ms(3), ms(200)).unwrap(), "took 3ms, within 200ms");
        assert!(judge(ms(200), ms(200)).is_ok());
        assert_eq!(
            judge(Duration::from_nanos(1500), Duration::ZERO).unwrap_err(),
            "took 1.5µs, over the 0ns limit"
        );
    }
}
