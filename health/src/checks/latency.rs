//! `latency`: a probe request completes within a limit. Catches a worker
//! that still answers correctly but far too slowly (thermal throttling, a
//! GPU fallen back to CPU, a noisy neighbour).

use std::time::Duration;

use crate::probe::Probe;
use crate::{CheckFuture, Client, HealthCheck, Verdict};

/// Checks the probe's latency is at most `max`.
#[derive(Debug)]
pub(crate) struct Latency {
    label: String,
    model: String,
    probe: Probe,
    max: Duration,
}

impl Latency {
    /// A latency check sending `probe`, passing up to `max`.
    pub fn new(label: String, model: &str, probe: Probe, max: Duration) -> Self {
        Self {
            label,
            model: model.to_string(),
            probe,
            max,
        }
    }
}

impl HealthCheck for Latency {
    fn name(&self) -> &str {
        &self.label
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn check<'a>(&'a self, mut client: Client) -> CheckFuture<'a> {
        Box::pin(async move {
            let exchange = self.probe.run(&mut client).await;
            let result = exchange
                .outputs
                .and_then(|_| judge(exchange.latency, self.max));
            Verdict::from_result(self, result, exchange.latency)
        })
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
