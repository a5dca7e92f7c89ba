//! Sending a probe request to a worker and reading its outputs.
//!
//! A check's probe is the request file it was configured with, or, when it
//! has none, a request built from the model's metadata: every input with its
//! variable dimensions (`-1`) set to 1, floats filled with 0.5 and integers
//! (and `BOOL`) with 1 — small, deterministic, valid for any model.

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infermesh_proto::inference::{ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse};
use infermesh_proto::tensor::{DataType, element_count};
use tonic::Status;

use crate::request::ProbeRequest;
use crate::tensor::Tensor;
use crate::{Client, codec};

/// Largest input a default probe builds, in elements (64 MiB of FP32).
const MAX_DEFAULT_ELEMENTS: usize = 16 << 20;

/// What a check sends: a fixed request, or one built from metadata per run.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    model: String,
    request: Option<Arc<ProbeRequest>>,
}

/// One probe's request and result.
#[derive(Debug)]
pub(crate) struct Exchange {
    /// The request sent; `None` when none could be built.
    pub request: Option<Arc<ProbeRequest>>,
    /// The decoded outputs, or why there are none.
    pub outputs: Result<Vec<Tensor>, String>,
    /// Time of the `ModelInfer` call (of the metadata call if that failed).
    pub latency: Duration,
}

impl Probe {
    /// A probe of `model` sending `request`, or a default request.
    pub fn new(model: &str, request: Option<ProbeRequest>) -> Self {
        Self {
            model: model.to_string(),
            request: request.map(Arc::new),
        }
    }

    /// Sends the probe through `client`.
    pub async fn run(&self, client: &mut Client) -> Exchange {
        let request = match &self.request {
            Some(r) => Arc::clone(r),
            None => {
                let started = Instant::now();
                match self.default_for_model(client).await {
                    Ok(r) => Arc::new(r),
                    Err(e) => {
                        return Exchange {
                            request: None,
                            outputs: Err(e),
                            latency: started.elapsed(),
                        };
                    }
                }
            }
        };
        let infer = request.infer_request(&self.model);
        let started = Instant::now();
        let result = client.model_infer(infer).await;
        let latency = started.elapsed();
        let outputs = match result {
            Ok(resp) => read_outputs(&resp.into_inner()),
            Err(status) => Err(rpc_error("ModelInfer", &status)),
        };
        Exchange {
            request: Some(request),
            outputs,
            latency,
        }
    }

    async fn default_for_model(&self, client: &mut Client) -> Result<ProbeRequest, String> {
        let meta = client
            .model_metadata(ModelMetadataRequest {
                name: self.model.clone(),
                version: String::new(),
            })
            .await
            .map_err(|s| rpc_error("ModelMetadata", &s))?;
        default_request(meta.get_ref())
    }
}

/// The default probe for a model: see the module docs.
pub(crate) fn default_request(meta: &ModelMetadataResponse) -> Result<ProbeRequest, String> {
    let inputs = meta
        .inputs
        .iter()
        .map(|m| {
            let dt = DataType::parse(&m.datatype).ok_or_else(|| {
                format!("input '{}' has unknown datatype '{}'", m.name, m.datatype)
            })?;
            if !codec::supported(dt) {
                return Err(format!(
                    "input '{}' is {dt}: default probes fill numeric inputs only; give the check a `request` file",
                    m.name
                ));
            }
            let shape: Vec<i64> = m.shape.iter().map(|&d| d.max(1)).collect();
            let n = element_count(&shape)
                .filter(|&n| n <= MAX_DEFAULT_ELEMENTS)
                .ok_or_else(|| {
                    format!("input '{}': shape {shape:?} is too large for a default probe", m.name)
                })?;
            let fill = if codec::is_integral(dt) { 1.0 } else { 0.5 };
            Tensor::new(&m.name, &m.datatype, shape, vec![fill; n])
        })
        .collect::<Result<Vec<_>, _>>()?;
    ProbeRequest::new(inputs, HashMap::new(), Vec::new())
        .map_err(|e| format!("model '{}': {e}", meta.name))
}

/// Decodes every output of `resp`.
pub(crate) fn read_outputs(resp: &ModelInferResponse) -> Result<Vec<Tensor>, String> {
    let raw = &resp.raw_output_contents;
    if !raw.is_empty() && raw.len() != resp.outputs.len() {
        return Err(format!(
            "response has {} raw_output_contents for {} outputs",
            raw.len(),
            resp.outputs.len()
        ));
    }
    resp.outputs
        .iter()
        .enumerate()
        .map(|(i, out)| Tensor::from_output(out, raw.get(i).map(|b| &b[..])))
        .collect()
}

/// `ModelInfer failed: Unavailable: tcp connect error: ...` — the status and
/// the causes a transport error carries.
pub(crate) fn rpc_error(rpc: &str, status: &Status) -> String {
    let mut text = format!("{rpc} failed: {:?}: {}", status.code(), status.message());
    let mut source = status.source();
    while let Some(e) = source {
        let cause = e.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use infermesh_proto::inference::model_infer_response::InferOutputTensor;
    use infermesh_proto::inference::model_metadata_response::TensorMetadata;

    fn meta(inputs: &[(&str, &str, &[i64])]) -> ModelMetadataResponse {
        ModelMetadataResponse {
            name: "m".into(),
            inputs: inputs
                .iter()
                .map(|(name, dt, shape)| TensorMetadata {
                    name: name.to_string(),
                    datatype: dt.to_string(),
                    shape: shape.to_vec(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn default_request_fills_every_input() {
        let r = default_request(&meta(&[
            ("X", "FP32", &[-1, 16]),
            ("IDS", "INT64", &[-1, -1]),
        ]))
        .unwrap();
        assert_eq!(r.inputs[0].shape, [1, 16]);
        assert_eq!(r.inputs[0].data, [0.5; 16]);
        assert_eq!(r.inputs[1].shape, [1, 1]);
        assert_eq!(r.inputs[1].data, [1.0]);
        let req = r.infer_request("m");
        assert_eq!(req.raw_input_contents[0].len(), 64);
        assert_eq!(req.raw_input_contents[1].len(), 8);
    }

    #[test]
    fn default_request_refuses_bytes_and_huge_inputs() {
        let err = default_request(&meta(&[("TEXT", "BYTES", &[1])]))
            .err()
            .unwrap();
        assert!(err.contains("TEXT") && err.contains("request"), "{err}");
        assert!(default_request(&meta(&[("X", "FP32", &[1 << 20, 1 << 20])])).is_err());
        assert!(default_request(&meta(&[])).is_err());
    }

    #[test]
    fn read_outputs_checks_raw_counts() {
        let out = InferOutputTensor {
            name: "Y".into(),
            datatype: "FP32".into(),
            shape: vec![1],
            ..Default::default()
        };
        let mut resp = ModelInferResponse {
            outputs: vec![out.clone(), out],
            raw_output_contents: vec![vec![0u8; 4].into()],
            ..Default::default()
        };
        assert!(
            read_outputs(&resp)
                .unwrap_err()
                .contains("1 raw_output_contents for 2")
        );
        resp.raw_output_contents.push(vec![0u8; 4].into());
        assert_eq!(read_outputs(&resp).unwrap().len(), 2);
    }
}
