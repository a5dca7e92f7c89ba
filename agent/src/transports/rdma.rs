//! The RDMA rung of the tensor transport ladder on the agent's front.
//!
//! A client first calls `infermesh.v1.Rdma/ConnectQueuePair`
//! ([`RdmaService`]) on the OIP address: the agent accepts its queue pair
//! and answers with its own. The queue pair belongs to the client's HTTP/2
//! connection ([`crate::transports::conn`]) and is closed with it. Then, for each `ModelInfer` whose parameters name
//! RDMA buffers ([`params`], names in [`infermesh_proto::rdma`]):
//!
//! 1. [`prepare`] checks the parameters, RDMA-READs every input from the
//!    client's memory into `raw_input_contents` and strips the parameters;
//!    the request then goes to a worker inline, like any other;
//! 2. [`Prepared::finish`] checks that every requested output fits the
//!    client's buffer (before writing any), RDMA-WRITEs them, empties their
//!    `raw_output_contents` entries and marks each with
//!    `infermesh_rdma_bytes`. Only then does the response leave, which tells
//!    the client its outputs are in place.
//!
//! Errors of this path start with `rdma:`: INVALID_ARGUMENT for a malformed
//! request or an unknown queue pair, UNAVAILABLE when an RDMA operation
//! failed (the queue pair is then in the error state and dropped; the client
//! reconnects and meanwhile sends tensors inline).

mod params;
mod service;

use std::collections::HashMap;
use std::sync::Mutex;

use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use infermesh_proto::rdma::{BYTES_PARAM, INPUT_PARAM, OUTPUT_PARAM, QPN_PARAM};
use infermesh_rdma::{Connection, EndpointInfo, RdmaEngine, RdmaError, RemoteBuffer};

use crate::config::RdmaMode;
use crate::error::AgentError;

pub use params::{Plan, plan, uses_rdma};
pub use service::RdmaService;

/// Queue pairs one client connection may hold; connecting again beyond
/// this closes its oldest.
const MAX_QPS_PER_CONNECTION: usize = 4;

/// Opens the engine `mode` asks for: `None` when off or when no device is
/// found (`auto`, which logs why).
pub async fn open(mode: RdmaMode) -> std::io::Result<Option<RdmaEngine>> {
    match mode {
        RdmaMode::Off => Ok(None),
        RdmaMode::Auto => Ok(RdmaEngine::probe()),
        RdmaMode::Emulated => {
            let engine = RdmaEngine::emulated().await?;
            tracing::info!("RDMA path enabled: software emulation on loopback (tests and demos)");
            Ok(Some(engine))
        }
    }
}

/// The agent's RDMA engine and the queue pairs it accepted, each bound to
/// the client connection that asked for it.
pub struct RdmaPeers {
    engine: RdmaEngine,
    max_input_bytes: usize,
    /// QPN → (client connection, order of acceptance).
    owners: Mutex<Owners>,
}

#[derive(Default)]
struct Owners {
    by_qpn: HashMap<u32, (u64, u64)>,
    accepted: u64,
}

impl RdmaPeers {
    /// Peers of `engine`; RDMA inputs of one request may total at most
    /// `max_input_bytes` (what the agent can forward inline).
    pub fn new(engine: RdmaEngine, max_input_bytes: usize) -> Self {
        Self {
            engine,
            max_input_bytes,
            owners: Mutex::default(),
        }
    }

    /// `verbs` or `emulated`: what the node advertises.
    pub fn kind(&self) -> &'static str {
        self.engine.kind()
    }

    /// Accepts the queue pair `peer` of client connection `owner`.
    pub async fn accept(&self, owner: u64, peer: &EndpointInfo) -> Result<Connection, RdmaError> {
        let conn = self.engine.accept(peer).await?;
        let mut owners = self.lock();
        owners.accepted += 1;
        let seq = owners.accepted;
        owners.by_qpn.insert(conn.qpn(), (owner, seq));
        let mut mine: Vec<(u64, u32)> = owners
            .by_qpn
            .iter()
            .filter(|(_, (o, _))| *o == owner)
            .map(|(qpn, (_, seq))| (*seq, *qpn))
            .collect();
        if mine.len() > MAX_QPS_PER_CONNECTION {
            mine.sort_unstable();
            for (_, qpn) in &mine[..mine.len() - MAX_QPS_PER_CONNECTION] {
                owners.by_qpn.remove(qpn);
                self.engine.close(*qpn);
            }
        }
        Ok(conn)
    }

    /// The working queue pair `qpn` of client connection `owner`: an
    /// invalid argument when the connection has no such queue pair, the
    /// path unavailable when it has gone to the error state.
    pub fn connection(&self, owner: u64, qpn: u32) -> Result<Connection, AgentError> {
        let mut owners = self.lock();
        if owners.by_qpn.get(&qpn).is_none_or(|(o, _)| *o != owner) {
            return Err(AgentError::RdmaRequest(format!(
                "unknown queue pair {qpn} on this connection; connect again"
            )));
        }
        self.engine.connection(qpn).ok_or_else(|| {
            owners.by_qpn.remove(&qpn);
            AgentError::RdmaPath(format!("queue pair {qpn} is broken; connect again"))
        })
    }

    /// Closes the queue pairs of a client connection that went away.
    pub fn drop_owner(&self, owner: u64) {
        self.lock().by_qpn.retain(|qpn, (o, _)| {
            if *o == owner {
                self.engine.close(*qpn);
            }
            *o != owner
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An RDMA request whose inputs are in place; [`Prepared::finish`] writes
/// its outputs back.
#[derive(Debug)]
pub struct Prepared {
    conn: Connection,
    outputs: Vec<(String, RemoteBuffer)>,
}

/// Reads the inputs of RDMA request `req` (from client connection `owner`)
/// into `raw_input_contents` and strips its RDMA parameters, so it can be
/// forwarded inline. `rdma` is `None` when the agent has no RDMA path.
pub async fn prepare(
    rdma: Option<&RdmaPeers>,
    owner: u64,
    req: &mut ModelInferRequest,
) -> Result<Prepared, AgentError> {
    let Some(rdma) = rdma else {
        return Err(AgentError::RdmaPath(
            "this agent has no RDMA path (transport.rdma is off or no device)".into(),
        ));
    };
    let Some(plan) = plan(req, rdma.max_input_bytes)? else {
        return Err(AgentError::BadRequest("no RDMA parameters".into()));
    };
    let conn = rdma.connection(owner, plan.qpn)?;
    let mut raw = Vec::with_capacity(plan.inputs.len());
    for (input, desc) in req.inputs.iter().zip(&plan.inputs) {
        let bytes = conn
            .read(*desc)
            .await
            .map_err(|e| AgentError::RdmaPath(format!("reading input '{}': {e}", input.name)))?;
        raw.push(bytes);
    }
    if !plan.inputs.is_empty() {
        req.raw_input_contents = raw;
    }
    req.parameters.remove(QPN_PARAM);
    for i in &mut req.inputs {
        i.parameters.remove(INPUT_PARAM);
    }
    for o in &mut req.outputs {
        o.parameters.remove(OUTPUT_PARAM);
    }
    Ok(Prepared {
        conn,
        outputs: plan.outputs,
    })
}

impl Prepared {
    /// Writes the requested outputs of `resp` into the client's buffers.
    /// Outputs the worker answered in typed form, or left out, stay as they
    /// are (inline). Checks every size before writing anything.
    pub async fn finish(self, resp: &mut ModelInferResponse) -> Result<(), AgentError> {
        if resp.raw_output_contents.len() != resp.outputs.len() {
            return Ok(());
        }
        let mut plan = Vec::with_capacity(self.outputs.len());
        for (name, desc) in &self.outputs {
            let Some(index) = resp.outputs.iter().position(|o| &o.name == name) else {
                continue;
            };
            let needed = resp.raw_output_contents[index].len() as u64;
            if needed > desc.len() {
                return Err(AgentError::RdmaOutputTooLarge {
                    output: name.clone(),
                    needed,
                    capacity: desc.len(),
                });
            }
            plan.push((index, *desc));
        }
        for (index, desc) in &plan {
            let name = &resp.outputs[*index].name;
            self.conn
                .write(*desc, &resp.raw_output_contents[*index])
                .await
                .map_err(|e| AgentError::RdmaPath(format!("writing output '{name}': {e}")))?;
        }
        for (index, _) in plan {
            let written = std::mem::take(&mut resp.raw_output_contents[index]).len();
            resp.outputs[index].parameters.insert(
                BYTES_PARAM.to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::Int64Param(written as i64)),
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use infermesh_proto::inference::model_infer_request::InferInputTensor;
    use tonic::{Code, Status};

    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("off".parse(), Ok(RdmaMode::Off));
        assert_eq!("emulated".parse(), Ok(RdmaMode::Emulated));
        assert_eq!(RdmaMode::default(), RdmaMode::Auto);
        assert!("on".parse::<RdmaMode>().is_err());
    }

    fn rdma_request(qpn: i64) -> ModelInferRequest {
        let param = |c| InferParameter {
            parameter_choice: Some(c),
        };
        ModelInferRequest {
            model_name: "dense".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![1, 16],
                parameters: HashMap::from([(
                    INPUT_PARAM.to_string(),
                    param(ParameterChoice::StringParam("1000:40:7".into())),
                )]),
                ..Default::default()
            }],
            parameters: HashMap::from([(
                QPN_PARAM.to_string(),
                param(ParameterChoice::Int64Param(qpn)),
            )]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn without_an_engine_the_path_is_unavailable() {
        let err = prepare(None, 1, &mut rdma_request(42)).await.unwrap_err();
        let status = Status::from(err);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with("rdma:"), "{status:?}");
    }

    #[tokio::test]
    async fn queue_pairs_belong_to_their_connection() {
        let agent = RdmaPeers::new(RdmaEngine::emulated().await.unwrap(), 1 << 20);
        let client = RdmaEngine::emulated().await.unwrap();
        let accepted = std::sync::Arc::new(Mutex::new(None));
        let conn = client
            .connect("agent", |info| {
                let (agent, accepted) = (&agent, std::sync::Arc::clone(&accepted));
                async move {
                    let c = agent.accept(7, &info).await?;
                    *accepted.lock().unwrap() = Some(c.qpn());
                    Ok(c.local_info().clone())
                }
            })
            .await
            .unwrap();
        let qpn = accepted.lock().unwrap().unwrap();
        assert_eq!(conn.peer_info().qpn(), qpn);
        assert!(agent.connection(7, qpn).is_ok());
        assert!(agent.connection(8, qpn).is_err(), "another connection's QP");
        let err = prepare(Some(&agent), 8, &mut rdma_request(qpn as i64))
            .await
            .unwrap_err();
        let status = Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with(infermesh_proto::rdma::UNKNOWN_QP_PREFIX),
            "{status:?}"
        );
        agent.drop_owner(7);
        assert!(
            agent.connection(7, qpn).is_err(),
            "closed with its connection"
        );
    }
}
