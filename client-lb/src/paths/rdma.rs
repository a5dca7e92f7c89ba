//! The RDMA rung of the transport ladder, client side: [`RdmaRung`] over
//! [`RdmaPath`].
//!
//! [`RdmaPath::infer`] sends one `ModelInfer` to an agent with its tensors
//! in this process's registered memory instead of the message:
//!
//! 1. once per agent, a reliable-connected queue pair is set up through the
//!    agent's `infermesh.v1.Rdma/ConnectQueuePair` on the same gRPC channel,
//!    and cached ([`RdmaEngine::connect`]);
//! 2. each raw input is copied into a buffer registered for remote READ, and
//!    one buffer registered for remote WRITE is lent per requested output,
//!    sized by the largest this output has been, at least the inputs' total
//!    and 64 KiB;
//! 3. the request carries the agent's QPN and the buffer descriptors as
//!    parameters (names in [`infermesh_proto::rdma`]); the agent READs the
//!    inputs, runs the model, WRITEs the outputs and answers;
//! 4. each output marked `infermesh_rdma_bytes` is copied out of its buffer
//!    into `raw_output_contents`, so the caller sees an ordinary response.
//!
//! Buffers go back to the engine's pool once the agent has answered. When
//! the answer may not be final — a deadline, a cancelled or broken call —
//! the agent could still be reading or writing them, so they are
//! deregistered instead, which revokes the agent's access at once.
//!
//! Errors tell the caller what to do next ([`RdmaPathError`]): the path is
//! broken (send inline, try RDMA again later; the cached queue pair is
//! dropped), the request does not suit the path (send inline), or the agent
//! answered an ordinary gRPC status (handle as on any path).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use infermesh_proto::rdma::{
    BYTES_PARAM, ConnectRequest, ERROR_PREFIX, INPUT_PARAM, NEEDED_BYTES_METADATA, OUTPUT_PARAM,
    OUTPUT_TOO_LARGE_PREFIX, QPN_PARAM, RdmaClient, TOO_LARGE_OUTPUT_METADATA, UNKNOWN_QP_PREFIX,
};
use infermesh_proto::{DEFAULT_MAX_MESSAGE_BYTES, GrpcInferenceServiceClient};
use infermesh_rdma::{Access, EndpointInfo, RdmaEngine, RdmaError, Registered};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use infermesh_transport::Path;

use super::peer::Peer;
use super::transport::{BoxFuture, PathError, Transport};

/// Smallest output buffer lent for an output of unknown size.
const MIN_OUTPUT_BYTES: usize = 64 << 10;

/// Why [`RdmaPath::infer`] gave no response.
#[derive(Debug, thiserror::Error)]
pub enum RdmaPathError {
    /// The RDMA path to this agent failed (connecting, registering memory,
    /// an RDMA operation at either end, or the agent has no RDMA path). The
    /// cached queue pair was dropped: send this request inline and try RDMA
    /// again later.
    #[error("RDMA path broken: {0}")]
    PathBroken(String),
    /// This request cannot take the RDMA path (typed contents, no outputs
    /// listed, an output larger than its buffer, ...); the path itself is
    /// fine. Send it inline.
    #[error("request not suited to the RDMA path: {0}")]
    NotApplicable(String),
    /// The agent answered with an ordinary gRPC status (the model's or the
    /// agent's own, a deadline): handle it as on the inline path.
    #[error(transparent)]
    Status(Status),
}

/// The client's end of the RDMA path, over one [`RdmaEngine`]; share one
/// per process.
#[derive(Debug)]
pub struct RdmaPath {
    engine: RdmaEngine,
    /// Largest size seen per (model, output): the next buffer's size.
    sizes: Mutex<HashMap<(String, String), usize>>,
}

impl RdmaPath {
    /// The path over `engine` (from [`RdmaEngine::probe`], or
    /// [`RdmaEngine::emulated`] against an agent running the emulation).
    pub fn new(engine: RdmaEngine) -> Self {
        Self {
            engine,
            sizes: Mutex::default(),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &RdmaEngine {
        &self.engine
    }

    /// Sends `req` to the agent `peer` (the key its queue pair is cached
    /// under, e.g. the node id) reached by `channel`, with its tensors moved
    /// by RDMA, within `timeout`. The request must list its outputs and have
    /// raw inputs; the response is what the inline path would return, load
    /// report metadata included.
    pub async fn infer(
        &self,
        peer: &str,
        channel: Channel,
        req: ModelInferRequest,
        timeout: Duration,
    ) -> Result<tonic::Response<ModelInferResponse>, RdmaPathError> {
        let deadline = Instant::now() + timeout;
        applicable(&req)?;
        let exchange = |local| exchange(channel.clone(), local, deadline);
        let conn =
            match tokio::time::timeout_at(deadline, self.engine.connect(peer, exchange)).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(self.broken(peer, format!("connecting: {e}"))),
                Err(_) => return Err(self.broken(peer, "connecting: deadline exceeded".into())),
            };

        let mut lent = Lent::default();
        let total_in: usize = req.raw_input_contents.iter().map(|b| b.len()).sum();
        for raw in &req.raw_input_contents {
            let mut buf = self.register(raw.len(), Access::RemoteRead).await?;
            buf.as_mut_slice().copy_from_slice(raw);
            lent.inputs.push(buf);
        }
        let floor = total_in.max(MIN_OUTPUT_BYTES);
        for o in &req.outputs {
            let len = self.size_hint(&req.model_name, &o.name).max(floor);
            lent.outputs
                .push(self.register(len, Access::RemoteWrite).await?);
        }

        let model = req.model_name.clone();
        let names: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
        let mut wire = req;
        wire.raw_input_contents.clear();
        wire.parameters.insert(
            QPN_PARAM.into(),
            int_param(i64::from(conn.peer_info().qpn())),
        );
        for (input, buf) in wire.inputs.iter_mut().zip(&lent.inputs) {
            let desc = buf.remote().to_param_string();
            input
                .parameters
                .insert(INPUT_PARAM.into(), string_param(desc));
        }
        for (output, buf) in wire.outputs.iter_mut().zip(&lent.outputs) {
            let desc = buf.remote().to_param_string();
            output
                .parameters
                .insert(OUTPUT_PARAM.into(), string_param(desc));
        }

        let mut client = GrpcInferenceServiceClient::new(channel)
            .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES);
        let mut request = tonic::Request::new(wire);
        request.set_timeout(time_left(deadline));
        crate::trace::inject(request.metadata_mut());
        // Until the agent answers, it may access the buffers: if this future
        // is dropped or times out, `lent` revokes them instead of pooling them.
        lent.revoke = true;
        let resp = match tokio::time::timeout_at(deadline, client.model_infer(request)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(status)) => {
                // A status the agent sent ends its handler; a deadline, a
                // cancellation or a transport error may have cut it short.
                let cut_short = matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled)
                    || std::error::Error::source(&status).is_some();
                lent.revoke = cut_short;
                return Err(self.classify(peer, &model, status));
            }
            Err(_) => {
                return Err(RdmaPathError::Status(Status::deadline_exceeded(
                    "deadline exceeded waiting for the agent (RDMA path)",
                )));
            }
        };
        lent.revoke = false;

        let (metadata, mut body, extensions) = resp.into_parts();
        for (i, out) in body.outputs.iter_mut().enumerate() {
            let Some(written) = out.parameters.remove(BYTES_PARAM) else {
                continue;
            };
            let buf = names
                .iter()
                .position(|n| *n == out.name)
                .map(|k| &lent.outputs[k]);
            let slot = body.raw_output_contents.get_mut(i);
            let (Some(buf), Some(slot), Some(ParameterChoice::Int64Param(n))) =
                (buf, slot, written.parameter_choice)
            else {
                return Err(self.broken(
                    peer,
                    format!("the agent marked output '{}' as written wrongly", out.name),
                ));
            };
            let Some(n) = usize::try_from(n).ok().filter(|n| *n <= buf.len()) else {
                return Err(self.broken(
                    peer,
                    format!(
                        "the agent wrote {n} bytes of output '{}' into a {}-byte buffer",
                        out.name,
                        buf.len()
                    ),
                ));
            };
            *slot = buf.as_slice()[..n].to_vec().into();
            self.learn(&model, &out.name, n);
        }
        Ok(tonic::Response::from_parts(metadata, body, extensions))
    }

    /// What an error status of the agent means for the caller.
    fn classify(&self, peer: &str, model: &str, status: Status) -> RdmaPathError {
        let msg = status.message();
        if !msg.starts_with(ERROR_PREFIX) {
            return RdmaPathError::Status(status);
        }
        if status.code() == Code::Unavailable || msg.starts_with(UNKNOWN_QP_PREFIX) {
            return self.broken(peer, msg.to_string());
        }
        if status.code() == Code::InvalidArgument && msg.starts_with(OUTPUT_TOO_LARGE_PREFIX) {
            let md = status.metadata();
            let text = |key| md.get(key).and_then(|v| v.to_str().ok());
            let needed = text(NEEDED_BYTES_METADATA).and_then(|v| v.parse::<usize>().ok());
            if let (Some(output), Some(needed)) = (text(TOO_LARGE_OUTPUT_METADATA), needed) {
                self.learn(model, output, needed);
            }
            return RdmaPathError::NotApplicable(msg.to_string());
        }
        RdmaPathError::Status(status)
    }

    /// Forgets `peer` (it left the membership): drops its queue pair.
    pub fn forget(&self, peer: &str) {
        self.engine.disconnect(peer);
    }

    /// Drops the cached queue pair to `peer`, so the next call sets up a new one.
    fn broken(&self, peer: &str, why: String) -> RdmaPathError {
        tracing::debug!(%peer, %why, "RDMA path broken; the next call reconnects");
        self.engine.disconnect(peer);
        RdmaPathError::PathBroken(why)
    }

    async fn register(&self, len: usize, access: Access) -> Result<Registered, RdmaPathError> {
        // Memory trouble is not a broken link: the queue pair stays.
        self.engine
            .register(len, access)
            .await
            .map_err(|e| match e {
                RdmaError::TooLarge { .. } => RdmaPathError::NotApplicable(e.to_string()),
                e => RdmaPathError::PathBroken(format!("registering memory: {e}")),
            })
    }

    fn size_hint(&self, model: &str, output: &str) -> usize {
        let sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        sizes
            .get(&(model.to_string(), output.to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn learn(&self, model: &str, output: &str, len: usize) {
        let mut sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        let size = sizes
            .entry((model.to_string(), output.to_string()))
            .or_default();
        *size = (*size).max(len);
    }
}

/// Whether `req` can take the RDMA path.
fn applicable(req: &ModelInferRequest) -> Result<(), RdmaPathError> {
    let no = |why: &str| Err(RdmaPathError::NotApplicable(why.to_string()));
    if req.outputs.is_empty() {
        return no("the request lists no outputs, so there is no buffer to write them into");
    }
    if req.inputs.iter().any(|i| i.contents.is_some())
        || req.raw_input_contents.len() != req.inputs.len()
    {
        return no("the inputs are not all raw (raw_input_contents, one per input)");
    }
    let referenced = |p: &HashMap<String, InferParameter>| {
        p.keys()
            .any(|k| k.starts_with("infermesh_rdma_") || k.starts_with("shared_memory_"))
    };
    if referenced(&req.parameters)
        || req.inputs.iter().any(|i| referenced(&i.parameters))
        || req.outputs.iter().any(|o| referenced(&o.parameters))
    {
        return no("the request already references shared memory or RDMA buffers");
    }
    Ok(())
}

/// The `ConnectQueuePair` exchange: sends this end's endpoint, returns the agent's.
async fn exchange(
    channel: Channel,
    local: EndpointInfo,
    deadline: Instant,
) -> Result<EndpointInfo, RdmaError> {
    let mut req = tonic::Request::new(ConnectRequest {
        endpoint: local.encode(),
    });
    req.set_timeout(time_left(deadline));
    let resp = RdmaClient::new(channel)
        .connect_queue_pair(req)
        .await
        .map_err(|s| RdmaError::Connect(format!("{:?}: {}", s.code(), s.message())))?;
    EndpointInfo::decode(&resp.into_inner().endpoint)
}

fn time_left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn int_param(v: i64) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    }
}

fn string_param(s: String) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(s)),
    }
}

/// The buffers lent to the agent for one request. Dropped normally they go
/// back to the pool; with `revoke` set (while the agent may access them)
/// they are deregistered, so a late access by the agent fails instead of
/// landing in a buffer that serves another request.
#[derive(Default)]
struct Lent {
    inputs: Vec<Registered>,
    outputs: Vec<Registered>,
    revoke: bool,
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.revoke {
            for buf in self.inputs.drain(..).chain(self.outputs.drain(..)) {
                buf.deregister();
            }
        }
    }
}

/// RDMA between hosts that both have a verbs device.
pub struct RdmaRung(RdmaPath);

impl RdmaRung {
    /// The rung over `engine`.
    pub fn new(engine: RdmaEngine) -> Self {
        RdmaRung(RdmaPath::new(engine))
    }
}

impl Transport for RdmaRung {
    fn path(&self) -> Path {
        Path::Rdma
    }

    fn reaches(&self, peer: &Peer) -> bool {
        peer.rdma
    }

    fn call<'a>(
        &'a self,
        peer: &'a Peer,
        req: &'a ModelInferRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Response<ModelInferResponse>, PathError>> {
        Box::pin(async move {
            self.0
                .infer(&peer.node, peer.channel.clone(), req.clone(), timeout)
                .await
                .map_err(|e| match e {
                    RdmaPathError::Status(s) => PathError::Status(s),
                    RdmaPathError::NotApplicable(why) => PathError::NotApplicable(why),
                    RdmaPathError::PathBroken(why) => PathError::Broken(why),
                })
        })
    }

    fn forget(&self, node: &str) {
        self.0.forget(node);
    }
}

#[cfg(test)]
mod tests {
    use infermesh_proto::inference::InferTensorContents;
    use infermesh_proto::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };

    use super::*;

    fn request() -> ModelInferRequest {
        ModelInferRequest {
            model_name: "dense".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                ..Default::default()
            }],
            outputs: vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                ..Default::default()
            }],
            raw_input_contents: vec![vec![0u8; 64].into()],
            ..Default::default()
        }
    }

    fn not_applicable(req: &ModelInferRequest) -> bool {
        matches!(applicable(req), Err(RdmaPathError::NotApplicable(_)))
    }

    #[test]
    fn only_raw_requests_with_listed_outputs_take_the_path() {
        assert!(applicable(&request()).is_ok());
        let mut req = request();
        req.outputs.clear();
        assert!(not_applicable(&req), "no outputs listed");
        let mut req = request();
        req.raw_input_contents.clear();
        req.inputs[0].contents = Some(InferTensorContents::default());
        assert!(not_applicable(&req), "typed inputs");
        let mut req = request();
        req.outputs[0]
            .parameters
            .insert("shared_memory_region".into(), string_param("r".into()));
        assert!(not_applicable(&req), "shared memory");
    }

    #[tokio::test]
    async fn agent_statuses_are_told_apart() {
        let path = RdmaPath::new(RdmaEngine::emulated().await.unwrap());
        let kind = |s: Status| match path.classify("a", "dense", s) {
            RdmaPathError::PathBroken(_) => "broken",
            RdmaPathError::NotApplicable(_) => "not applicable",
            RdmaPathError::Status(_) => "status",
        };
        assert_eq!(
            kind(Status::unavailable("rdma: reading input 'x': link broken")),
            "broken"
        );
        assert_eq!(
            kind(Status::invalid_argument(
                "rdma: unknown queue pair 7 on this connection"
            )),
            "broken"
        );
        assert_eq!(
            kind(Status::unavailable("no ready worker for model 'dense'")),
            "status"
        );
        assert_eq!(
            kind(Status::invalid_argument(
                "rdma: input 'x': invalid descriptor"
            )),
            "status"
        );
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(NEEDED_BYTES_METADATA, 300_000u64.into());
        md.insert(TOO_LARGE_OUTPUT_METADATA, "OUTPUT0".parse().unwrap());
        let too_large = Status::with_metadata(
            Code::InvalidArgument,
            "rdma: output too large: 'OUTPUT0' is 300000 bytes, the client's buffer holds 65536",
            md,
        );
        assert_eq!(kind(too_large), "not applicable");
        assert_eq!(
            path.size_hint("dense", "OUTPUT0"),
            300_000,
            "learned for the next call"
        );
    }
}
