//! The requests an attack sends, by kind of server: gRPC `ModelInfer` calls
//! for an agent (its test worker serving `dense` and `identity`), GETs for
//! a web server (nghttpd serving a docroot with `index.html` and
//! `big.bin`).

use infermesh_proto::inference::ModelInferRequest;
use infermesh_proto::inference::model_infer_request::InferInputTensor;
use prost::Message;

use crate::h2spec::conn::{Field, field};

/// What kind of server is attacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// An infermesh agent: gRPC.
    Agent,
    /// A web server (nghttpd): GETs of its docroot.
    Web,
}

/// One request: its header fields and body (none: END_STREAM on HEADERS).
#[derive(Clone, Debug)]
pub struct Call {
    pub fields: Vec<Field>,
    pub body: Vec<u8>,
}

const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

impl Server {
    /// By name: `agent` or `web`.
    pub fn parse(name: &str) -> Option<Server> {
        match name {
            "agent" => Some(Server::Agent),
            "web" => Some(Server::Web),
            _ => None,
        }
    }

    /// A request the server answers after its handler ran: a one-row
    /// `dense` inference, or `GET /`.
    pub fn request(self, authority: &str) -> Call {
        match self {
            Server::Agent => infer(authority, "dense", 1, Vec::new()),
            Server::Web => get(authority, "/", Vec::new()),
        }
    }

    /// A request the server answers itself, at once: an unknown model, or
    /// a missing file.
    pub fn answered_at_once(self, authority: &str) -> Call {
        match self {
            Server::Agent => infer(authority, "no-such-model", 1, Vec::new()),
            Server::Web => get(authority, "/no-such-file", Vec::new()),
        }
    }

    /// A request whose headers exceed a 16 KiB header list (the agent's
    /// limit): answered with an error, not run.
    pub fn oversized(self, authority: &str) -> Call {
        let extra = vec![field("x-oversized", &"x".repeat(20 << 10))];
        match self {
            Server::Agent => infer(authority, "dense", 1, extra),
            Server::Web => get(authority, "/", extra),
        }
    }

    /// A request answered with at least `bytes` of DATA: an `identity`
    /// inference of that size, or `GET /big.bin`.
    pub fn large_answer(self, authority: &str, bytes: usize) -> Call {
        match self {
            Server::Agent => infer(authority, "identity", bytes.div_ceil(64), Vec::new()),
            Server::Web => get(authority, "/big.bin", Vec::new()),
        }
    }

    /// A request with a body of about `bytes`: a `dense` inference of
    /// that size, or a POST of `/`.
    pub fn large_request(self, authority: &str, bytes: usize) -> Call {
        match self {
            Server::Agent => infer(authority, "dense", bytes.div_ceil(64), Vec::new()),
            Server::Web => {
                let mut call = get(authority, "/", Vec::new());
                call.fields[0] = field(":method", "POST");
                call.body = vec![0; bytes];
                call
            }
        }
    }
}

fn get(authority: &str, path: &str, extra: Vec<Field>) -> Call {
    let mut fields = vec![
        field(":method", "GET"),
        field(":scheme", "http"),
        field(":path", path),
        field(":authority", authority),
    ];
    fields.extend(extra);
    Call {
        fields,
        body: Vec::new(),
    }
}

/// A `ModelInfer` of `rows` rows of 16 FP32 values (raw) for `model`.
fn infer(authority: &str, model: &str, rows: usize, extra: Vec<Field>) -> Call {
    let mut fields = vec![
        field(":method", "POST"),
        field(":scheme", "http"),
        field(":path", MODEL_INFER),
        field(":authority", authority),
        field("content-type", "application/grpc"),
        field("te", "trailers"),
    ];
    fields.extend(extra);
    let req = ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0u8; rows * 64].into()],
        ..Default::default()
    };
    let message = req.encode_to_vec();
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    Call { fields, body }
}
