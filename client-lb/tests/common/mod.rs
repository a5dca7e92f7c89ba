//! An in-process transport for the client's tests: each node answers after
//! its own service time (changeable while the test runs), and answers are
//! counted per node. Time is tokio's, so tests run it under the paused clock.

// Each test crate that includes this module uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use infermesh_client::paths::BoxFuture;
use infermesh_client::{PathError, Peer, Transport};
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::Path;

pub struct InProcess {
    service: Mutex<HashMap<String, Duration>>,
    answered: Mutex<HashMap<String, u64>>,
}

impl InProcess {
    /// Nodes and their service times.
    pub fn new(nodes: &[(&str, Duration)]) -> Self {
        InProcess {
            service: Mutex::new(nodes.iter().map(|(n, t)| (n.to_string(), *t)).collect()),
            answered: Mutex::new(HashMap::new()),
        }
    }

    /// Every node now takes `time` per request.
    pub fn set_all(&self, time: Duration) {
        for t in self.service.lock().unwrap().values_mut() {
            *t = time;
        }
    }

    /// Requests `node` has answered.
    pub fn answered(&self, node: &str) -> u64 {
        self.answered
            .lock()
            .unwrap()
            .get(node)
            .copied()
            .unwrap_or(0)
    }
}

impl Transport for InProcess {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        _req: &'a ModelInferRequest,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<tonic::Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            let time = self.service.lock().unwrap()[&peer.node];
            tokio::time::sleep(time).await;
            *self
                .answered
                .lock()
                .unwrap()
                .entry(peer.node.clone())
                .or_default() += 1;
            Ok(tonic::Response::new(ModelInferResponse::default()))
        })
    }
}

pub fn request() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "dense".into(),
        ..Default::default()
    }
}
