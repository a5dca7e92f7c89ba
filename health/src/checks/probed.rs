//! The shape the probe-based checks share (`golden`, `finite`, `range`,
//! `latency`): send the check's probe, then judge the outputs that came
//! back and how long they took. Each of those checks is only its [`Judge`];
//! a probe that fails (no answer, an error status, outputs that do not
//! decode) fails the check before any judge runs.

use std::fmt;
use std::time::Duration;

use crate::probe::Probe;
use crate::tensor::Tensor;
use crate::{CheckFuture, Client, HealthCheck, Verdict};

/// What a probe-based check decides from one answer.
pub(crate) trait Judge: Send + Sync + fmt::Debug {
    /// The verdict's note (`Ok`, pass) or reason (`Err`, fail) for
    /// `outputs` that arrived in `latency`.
    fn judge(&self, outputs: &[Tensor], latency: Duration) -> Result<String, String>;
}

/// A check that sends `probe` and asks `judge` about the answer.
#[derive(Debug)]
pub(crate) struct Probed<J> {
    label: String,
    model: String,
    probe: Probe,
    judge: J,
}

impl<J: Judge> Probed<J> {
    /// A check labelled `label` of `model`.
    pub fn new(label: String, model: &str, probe: Probe, judge: J) -> Self {
        Self {
            label,
            model: model.to_string(),
            probe,
            judge,
        }
    }
}

impl<J: Judge> HealthCheck for Probed<J> {
    fn name(&self) -> &str {
        &self.label
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn check<'a>(&'a self, mut client: Client) -> CheckFuture<'a> {
        Box::pin(async move {
            let exchange = self.probe.run(&mut client).await;
            let latency = exchange.latency;
            let result = exchange
                .outputs
                .and_then(|outputs| self.judge.judge(&outputs, latency));
            Verdict::from_result(self, result, latency)
        })
    }
}
