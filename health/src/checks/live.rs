//! `live`: the server answers `ServerLive` with `live = true`.

use std::time::Instant;

use infermesh_proto::inference::ServerLiveRequest;

use crate::probe::rpc_error;
use crate::{CheckFuture, Client, HealthCheck, Verdict};

/// Checks the server is live; probes no model.
#[derive(Debug)]
pub(crate) struct Live {
    label: String,
}

impl Live {
    /// A live check labelled `label`.
    pub fn new(label: String) -> Self {
        Self { label }
    }
}

impl HealthCheck for Live {
    fn name(&self) -> &str {
        &self.label
    }

    fn model(&self) -> &str {
        ""
    }

    fn check<'a>(&'a self, mut client: Client) -> CheckFuture<'a> {
        Box::pin(async move {
            let started = Instant::now();
            let result = client.server_live(ServerLiveRequest {}).await;
            let latency = started.elapsed();
            let result = match result {
                Ok(r) if r.get_ref().live => Ok("server is live".to_string()),
                Ok(_) => Err("ServerLive answered live=false".to_string()),
                Err(status) => Err(rpc_error("ServerLive", &status)),
            };
            Verdict::from_result(self, result, latency)
        })
    }
}
