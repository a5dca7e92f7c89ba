//! `ready`: the server answers `ModelReady` for the model with `ready = true`.

use std::time::Instant;

use infermesh_proto::inference::ModelReadyRequest;

use crate::probe::rpc_error;
use crate::{CheckFuture, Client, HealthCheck, Verdict};

/// Checks a model is loaded and ready.
#[derive(Debug)]
pub(crate) struct Ready {
    label: String,
    model: String,
}

impl Ready {
    /// A ready check of `model`.
    pub fn new(label: String, model: &str) -> Self {
        Self {
            label,
            model: model.to_string(),
        }
    }
}

impl HealthCheck for Ready {
    fn name(&self) -> &str {
        &self.label
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn check<'a>(&'a self, mut client: Client) -> CheckFuture<'a> {
        Box::pin(async move {
            let started = Instant::now();
            let result = client
                .model_ready(ModelReadyRequest {
                    name: self.model.clone(),
                    version: String::new(),
                })
                .await;
            let latency = started.elapsed();
            let result = match result {
                Ok(r) if r.get_ref().ready => Ok(format!("model '{}' is ready", self.model)),
                Ok(_) => Err(format!(
                    "ModelReady answered ready=false for model '{}'",
                    self.model
                )),
                Err(status) => Err(rpc_error("ModelReady", &status)),
            };
            Verdict::from_result(self, result, latency)
        })
    }
}
