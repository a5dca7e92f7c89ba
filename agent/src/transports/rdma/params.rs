//! The RDMA parameters of a `ModelInfer` request, read and checked before
//! anything moves.
//!
//! Strict on purpose: a request either brings every input by RDMA or none,
//! names its queue pair exactly when some tensor names a buffer, never mixes
//! RDMA with shared memory or with inline contents for the same inputs, and
//! every descriptor is the canonical `addr:len:rkey` form
//! ([`RemoteBuffer::parse`]).

use std::collections::{HashMap, HashSet};

use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::{InferParameter, ModelInferRequest};
use infermesh_proto::rdma::{INPUT_PARAM, OUTPUT_PARAM, QPN_PARAM};
use infermesh_rdma::RemoteBuffer;
use infermesh_transport::shm::REGION_PARAM;

use crate::error::AgentError;

/// Largest queue pair number (QPNs are 24 bits).
const MAX_QPN: i64 = 0xff_ffff;

/// What an RDMA request asks the agent to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The agent's queue pair (from `ConnectQueuePair`).
    pub qpn: u32,
    /// One buffer per input, in input order; empty when inputs are inline.
    pub inputs: Vec<RemoteBuffer>,
    /// Requested outputs to write into the client's buffers.
    pub outputs: Vec<(String, RemoteBuffer)>,
}

/// Whether `req` carries any RDMA parameter.
pub fn uses_rdma(req: &ModelInferRequest) -> bool {
    req.parameters.contains_key(QPN_PARAM)
        || req
            .inputs
            .iter()
            .any(|i| i.parameters.contains_key(INPUT_PARAM))
        || req
            .outputs
            .iter()
            .any(|o| o.parameters.contains_key(OUTPUT_PARAM))
}

/// Reads the plan of `req`: `None` when it has no RDMA parameter. Inputs may
/// total at most `max_input_bytes` (what the agent could forward inline).
pub fn plan(req: &ModelInferRequest, max_input_bytes: usize) -> Result<Option<Plan>, AgentError> {
    let bad = |msg: String| AgentError::RdmaRequest(msg);
    let qpn = match req.parameters.get(QPN_PARAM).map(choice) {
        None => None,
        Some(Some(ParameterChoice::Int64Param(v))) if (1..=MAX_QPN).contains(v) => Some(*v as u32),
        Some(_) => {
            return Err(bad(format!(
                "'{QPN_PARAM}' must be an int64_param between 1 and {MAX_QPN}"
            )));
        }
    };
    let inputs = req
        .inputs
        .iter()
        .map(|i| descriptor("input", &i.name, &i.parameters, INPUT_PARAM))
        .collect::<Result<Vec<_>, _>>()?;
    let mut outputs = Vec::new();
    let mut seen = HashSet::new();
    for o in &req.outputs {
        if let Some(d) = descriptor("output", &o.name, &o.parameters, OUTPUT_PARAM)? {
            if !seen.insert(o.name.as_str()) {
                return Err(bad(format!("output '{}' is requested twice", o.name)));
            }
            outputs.push((o.name.clone(), d));
        }
    }
    let any_input = inputs.iter().any(Option::is_some);
    if !any_input && outputs.is_empty() {
        return match qpn {
            None => Ok(None),
            Some(_) => Err(bad(format!(
                "'{QPN_PARAM}' is given but no tensor names an RDMA buffer"
            ))),
        };
    }
    let Some(qpn) = qpn else {
        return Err(bad(format!(
            "tensors name RDMA buffers but '{QPN_PARAM}' is missing"
        )));
    };
    let shm = req
        .inputs
        .iter()
        .map(|i| &i.parameters)
        .chain(req.outputs.iter().map(|o| &o.parameters))
        .any(|p| p.contains_key(REGION_PARAM));
    if shm {
        return Err(bad(
            "RDMA and shared-memory parameters cannot be mixed in one request".into(),
        ));
    }
    let inputs = if any_input {
        let mut all = Vec::with_capacity(inputs.len());
        for (input, d) in req.inputs.iter().zip(inputs) {
            let Some(d) = d else {
                return Err(bad(format!(
                    "either every input comes by RDMA or none does; input '{}' has no '{INPUT_PARAM}'",
                    input.name
                )));
            };
            if input.contents.is_some() {
                return Err(bad(format!(
                    "input '{}' has both an RDMA buffer and contents",
                    input.name
                )));
            }
            all.push(d);
        }
        if !req.raw_input_contents.is_empty() {
            return Err(bad(
                "raw_input_contents must be empty when the inputs come by RDMA".into(),
            ));
        }
        let total = all
            .iter()
            .try_fold(0u64, |sum, d| sum.checked_add(d.len()))
            .unwrap_or(u64::MAX);
        if total > max_input_bytes as u64 {
            return Err(bad(format!(
                "the inputs total {total} bytes, above this agent's limit of {max_input_bytes}"
            )));
        }
        all
    } else {
        Vec::new()
    };
    Ok(Some(Plan {
        qpn,
        inputs,
        outputs,
    }))
}

fn choice(p: &InferParameter) -> Option<&ParameterChoice> {
    p.parameter_choice.as_ref()
}

/// The descriptor a tensor's `param` names, if any.
fn descriptor(
    what: &str,
    tensor: &str,
    params: &HashMap<String, InferParameter>,
    param: &str,
) -> Result<Option<RemoteBuffer>, AgentError> {
    match params.get(param).map(choice) {
        None => Ok(None),
        Some(Some(ParameterChoice::StringParam(s))) => RemoteBuffer::parse(s)
            .map(Some)
            .map_err(|e| AgentError::RdmaRequest(format!("{what} '{tensor}': {e}"))),
        Some(_) => Err(AgentError::RdmaRequest(format!(
            "{what} '{tensor}': '{param}' must be a string_param"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use infermesh_proto::inference::InferTensorContents;
    use infermesh_proto::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };
    use tonic::{Code, Status};

    use super::*;

    fn string(s: &str) -> InferParameter {
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam(s.into())),
        }
    }

    fn int(v: i64) -> InferParameter {
        InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(v)),
        }
    }

    fn input(name: &str, desc: Option<&str>) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            parameters: desc
                .map(|d| HashMap::from([(INPUT_PARAM.to_string(), string(d))]))
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn output(name: &str, desc: &str) -> InferRequestedOutputTensor {
        InferRequestedOutputTensor {
            name: name.into(),
            parameters: HashMap::from([(OUTPUT_PARAM.to_string(), string(desc))]),
        }
    }

    fn request(qpn: Option<InferParameter>) -> ModelInferRequest {
        ModelInferRequest {
            model_name: "dense".into(),
            inputs: vec![input("A", Some("1000:40:7")), input("B", Some("2000:40:7"))],
            outputs: vec![output("Y", "3000:10:9")],
            parameters: qpn
                .map(|q| HashMap::from([(QPN_PARAM.to_string(), q)]))
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn rejected(req: &ModelInferRequest, needle: &str) {
        let err = plan(req, 1 << 20).expect_err("must be rejected");
        let status = Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with("rdma: "), "{status:?}");
        assert!(
            status.message().contains(needle),
            "{needle:?} not in {status:?}"
        );
    }

    #[test]
    fn a_complete_request_gives_its_plan() {
        let plan = plan(&request(Some(int(42))), 1 << 20).unwrap().unwrap();
        assert_eq!(plan.qpn, 42);
        assert_eq!(plan.inputs.len(), 2);
        assert_eq!(plan.inputs[1], RemoteBuffer::new(0x2000, 0x40, 7).unwrap());
        assert_eq!(plan.outputs[0].0, "Y");
        assert_eq!(plan.outputs[0].1.len(), 0x10);
    }

    #[test]
    fn a_request_without_rdma_parameters_has_no_plan() {
        let mut req = request(None);
        req.inputs = vec![input("A", None)];
        req.outputs.clear();
        assert!(!uses_rdma(&req));
        assert_eq!(plan(&req, 1 << 20).unwrap(), None);
    }

    #[test]
    fn outputs_alone_may_come_by_rdma() {
        let mut req = request(Some(int(5)));
        req.inputs = vec![input("A", None)];
        req.raw_input_contents = vec![vec![0u8; 64].into()];
        let plan = plan(&req, 1 << 20).unwrap().unwrap();
        assert!(plan.inputs.is_empty());
        assert_eq!(plan.outputs.len(), 1);
    }

    #[test]
    fn malformed_descriptors_are_invalid_arguments() {
        for bad in [
            "",
            "0x1000:40:7",
            "1000:40",
            "1000:040:7",
            "ffffffffffffffff:2:1",
            "A0:1:1",
        ] {
            let mut req = request(Some(int(42)));
            req.inputs[0] = input("A", Some(bad));
            rejected(&req, "input 'A'");
            let mut req = request(Some(int(42)));
            req.outputs[0] = output("Y", bad);
            rejected(&req, "output 'Y'");
        }
        let mut req = request(Some(int(42)));
        req.inputs[1]
            .parameters
            .insert(INPUT_PARAM.into(), int(4096));
        rejected(&req, "must be a string_param");
    }

    #[test]
    fn the_queue_pair_must_be_a_24_bit_int64() {
        for qpn in [int(0), int(-1), int(1 << 24), string("42")] {
            rejected(&request(Some(qpn)), QPN_PARAM);
        }
        rejected(&request(None), "is missing");
        let mut req = request(Some(int(42)));
        req.inputs = vec![input("A", None)];
        req.outputs.clear();
        rejected(&req, "no tensor names an RDMA buffer");
    }

    #[test]
    fn inputs_come_all_by_rdma_or_none() {
        let mut req = request(Some(int(42)));
        req.inputs[1] = input("B", None);
        rejected(&req, "input 'B' has no");
        let mut req = request(Some(int(42)));
        req.raw_input_contents = vec![vec![0u8; 64].into()];
        rejected(&req, "raw_input_contents must be empty");
        let mut req = request(Some(int(42)));
        req.inputs[0].contents = Some(InferTensorContents::default());
        rejected(&req, "both an RDMA buffer and contents");
    }

    #[test]
    fn shared_memory_does_not_mix_with_rdma() {
        let mut req = request(Some(int(42)));
        req.outputs.push(InferRequestedOutputTensor {
            name: "Z".into(),
            parameters: HashMap::from([(REGION_PARAM.to_string(), string("r"))]),
        });
        rejected(&req, "shared-memory");
    }

    #[test]
    fn limits_and_duplicates() {
        let mut req = request(Some(int(42)));
        req.inputs[0] = input("A", Some("1000:100001:7"));
        rejected(&req, "above this agent's limit");
        let mut req = request(Some(int(42)));
        req.outputs.push(output("Y", "4000:10:9"));
        rejected(&req, "requested twice");
    }
}
