//! Probe requests: the inputs a check sends, read from a file in the KServe
//! v2 JSON (REST) format or a `.npy` array, plus — for `golden` — the
//! expected outputs.
//!
//! ```json
//! {
//!   "parameters": {"priority": 1},
//!   "inputs":  [{"name": "INPUT0",  "datatype": "FP32", "shape": [1, 16], "data": [[0.5, ...]]}],
//!   "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4],  "data": [0.1, ...]}]
//! }
//! ```
//!
//! `data` is flat or nested, row-major; numbers (`true`/`false` for `BOOL`).
//! `outputs` carries expected values; only `golden` reads it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use bytes::Bytes;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::inference::{InferParameter, ModelInferRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{HealthError, codec, npy, tensor::Tensor};

/// A request ready to send: inputs (encoded once), request parameters, and
/// the expected outputs when the file gives them.
#[derive(Debug, Clone)]
pub(crate) struct ProbeRequest {
    /// The inputs, as values.
    pub inputs: Vec<Tensor>,
    /// The inputs' raw little-endian encoding, in the order of `inputs`.
    raw: Vec<Bytes>,
    /// Request id sent with the probe (may be empty).
    pub id: String,
    /// Request-level parameters.
    pub parameters: HashMap<String, InferParameter>,
    /// Expected outputs (golden values); may be empty.
    pub expected: Vec<Tensor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestFile {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: BTreeMap<String, Value>,
    inputs: Vec<TensorFile>,
    #[serde(default)]
    outputs: Vec<TensorFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorFile {
    name: String,
    datatype: String,
    shape: Vec<i64>,
    data: Value,
    /// Accepted for compatibility with KServe files; not sent.
    #[serde(default, rename = "parameters")]
    _parameters: Option<Value>,
}

impl ProbeRequest {
    /// A request of `inputs`, checking they can be encoded and are named
    /// once each.
    pub fn new(
        inputs: Vec<Tensor>,
        parameters: HashMap<String, InferParameter>,
        expected: Vec<Tensor>,
    ) -> Result<Self, String> {
        if inputs.is_empty() {
            return Err("the request has no inputs".to_string());
        }
        if inputs.iter().chain(&expected).any(|t| t.name.is_empty()) {
            return Err("a tensor has an empty name".to_string());
        }
        let mut names = HashSet::new();
        if let Some(dup) = inputs.iter().find(|t| !names.insert(t.name.as_str())) {
            return Err(format!("input '{}' is given more than once", dup.name));
        }
        let raw = inputs
            .iter()
            .map(|t| {
                codec::encode(t.datatype, &t.data)
                    .map(Bytes::from)
                    .map_err(|e| format!("input '{}': {e}", t.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            inputs,
            raw,
            id: String::new(),
            parameters,
            expected,
        })
    }

    /// Loads a request file: a `.npy` array becomes the single input named
    /// `npy_input`; anything else is read as KServe v2 JSON.
    pub fn load(path: &Path, npy_input: Option<&str>) -> Result<Self, HealthError> {
        let bytes = std::fs::read(path).map_err(|source| HealthError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |problem: String| HealthError::InvalidRequest {
            path: path.to_path_buf(),
            problem,
        };
        let is_npy = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("npy"));
        if is_npy {
            let name = npy_input.ok_or_else(|| {
                invalid("a .npy request needs the `input` option naming the model input".into())
            })?;
            let array = npy::parse(&bytes).map_err(|source| HealthError::Npy {
                path: path.to_path_buf(),
                source,
            })?;
            let input = Tensor::new(name, array.datatype.as_str(), array.shape, array.data)
                .map_err(invalid)?;
            return Self::new(vec![input], HashMap::new(), Vec::new()).map_err(invalid);
        }
        if npy_input.is_some() {
            return Err(invalid(
                "the `input` option only applies to .npy requests; JSON names its inputs".into(),
            ));
        }
        let file: RequestFile =
            serde_json::from_slice(&bytes).map_err(|source| HealthError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        let inputs = tensors(file.inputs).map_err(invalid)?;
        let expected = tensors(file.outputs).map_err(invalid)?;
        let parameters = file
            .parameters
            .into_iter()
            .map(|(k, v)| parameter(&k, &v).map(|p| (k, p)))
            .collect::<Result<_, _>>()
            .map_err(invalid)?;
        let mut request = Self::new(inputs, parameters, expected).map_err(invalid)?;
        request.id = file.id.unwrap_or_default();
        Ok(request)
    }

    /// The `ModelInfer` request for `model`, in the raw form.
    pub fn infer_request(&self, model: &str) -> ModelInferRequest {
        ModelInferRequest {
            model_name: model.to_string(),
            id: self.id.clone(),
            parameters: self.parameters.clone(),
            inputs: self
                .inputs
                .iter()
                .map(|t| InferInputTensor {
                    name: t.name.clone(),
                    datatype: t.datatype.as_str().to_string(),
                    shape: t.shape.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: self.raw.clone(),
            ..Default::default()
        }
    }

    /// The inputs in the KServe v2 JSON form: `{"inputs": [...]}`.
    pub fn to_json(&self) -> Value {
        let inputs: Vec<Value> = self.inputs.iter().map(Tensor::to_json).collect();
        json!({ "inputs": inputs })
    }
}

fn tensors(files: Vec<TensorFile>) -> Result<Vec<Tensor>, String> {
    files
        .into_iter()
        .map(|t| {
            let mut data = Vec::new();
            flatten(&t.data, &mut data).map_err(|e| format!("tensor '{}': {e}", t.name))?;
            Tensor::new(t.name, &t.datatype, t.shape, data)
        })
        .collect()
}

/// Appends the numbers of a flat or nested JSON array, row-major.
fn flatten(v: &Value, out: &mut Vec<f64>) -> Result<(), String> {
    match v {
        Value::Array(items) => items.iter().try_for_each(|item| flatten(item, out)),
        Value::Number(n) => {
            out.push(n.as_f64().ok_or("a number out of range")?);
            Ok(())
        }
        Value::Bool(b) => {
            out.push(f64::from(u8::from(*b)));
            Ok(())
        }
        other => Err(format!(
            "data must hold numbers (or booleans), found {other}"
        )),
    }
}

fn parameter(name: &str, v: &Value) -> Result<InferParameter, String> {
    let choice = match v {
        Value::Bool(b) => ParameterChoice::BoolParam(*b),
        Value::String(s) => ParameterChoice::StringParam(s.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => ParameterChoice::Int64Param(i),
            (None, Some(u), _) => ParameterChoice::Uint64Param(u),
            (_, _, Some(f)) => ParameterChoice::DoubleParam(f),
            _ => return Err(format!("parameter '{name}': number out of range")),
        },
        _ => {
            return Err(format!(
                "parameter '{name}' must be a string, number or boolean"
            ));
        }
    };
    Ok(InferParameter {
        parameter_choice: Some(choice),
    })
}

#[cfg(test)]
mod tests;
