//! The rung that always works: tensors inline in the gRPC message.

use std::time::Duration;

use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_transport::Path;
use tonic::Response;

use super::peer::Peer;
use super::transport::{BoxFuture, PathError, Transport};

/// Tensors inline in gRPC messages.
#[derive(Debug, Default)]
pub struct GrpcRung;

impl Transport for GrpcRung {
    fn path(&self) -> Path {
        Path::Grpc
    }

    fn reaches(&self, _peer: &Peer) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            let mut request = tonic::Request::new(req.clone());
            request.set_timeout(timeout);
            crate::trace::inject(request.metadata_mut());
            peer.grpc()
                .model_infer(request)
                .await
                .map_err(PathError::Status)
        })
    }
}
