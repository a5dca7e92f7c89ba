//! The models a test worker serves, chosen by name.
//!
//! - `identity`: `INPUT0` FP32 of any shape → `OUTPUT0`, the same bytes and
//!   shape. No compute at all, so it measures what the transports cost
//!   (inline gRPC, shared memory) and nothing else. Its metadata declares
//!   `[-1, -1]` (rows × values, as `dense`); the worker itself accepts any
//!   rank, but a front that validates against metadata (the agent) sees the
//!   two-dimensional form. Served only when listed (`--model identity`).
//! - every other name: the [`dense`] model.

use bytes::Bytes;
use infermesh_proto::inference::model_metadata_response::TensorMetadata;
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};

use crate::dense;

/// Name of the identity model.
pub const IDENTITY_MODEL: &str = "identity";

/// What a served model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// [`dense`]: FP32 `[batch, 16]` → FP32 `[batch, 4]`.
    Dense,
    /// FP32 of any shape → the same tensor.
    Identity,
}

/// One input tensor, as the request carried it.
pub enum Input<'a> {
    /// Raw little-endian bytes (`raw_input_contents`).
    Raw(&'a Bytes),
    /// Typed contents (`fp32_contents`).
    Typed(&'a [f32]),
}

/// A computed output: its shape, its values, and rows for the statistics.
pub struct Output {
    /// Output shape.
    pub shape: Vec<i64>,
    /// Raw bytes, when they could be passed through without conversion.
    pub raw: Option<Bytes>,
    /// Values, when computed.
    pub values: Vec<f32>,
    /// Rows (first dimension) processed.
    pub rows: u64,
}

impl Output {
    /// The output as raw bytes.
    pub fn into_raw(self) -> Bytes {
        self.raw.unwrap_or_else(|| f32_to_raw(&self.values).into())
    }

    /// The output as values.
    pub fn into_values(self) -> Vec<f32> {
        match self.raw {
            Some(raw) => raw_to_f32(&raw).unwrap_or_default(),
            None => self.values,
        }
    }
}

impl Model {
    /// The model served under `name`.
    pub fn of(name: &str) -> Self {
        if name == IDENTITY_MODEL {
            Model::Identity
        } else {
            Model::Dense
        }
    }

    /// Input and output tensors, as the model metadata declares them.
    pub fn tensors(self) -> (TensorMetadata, TensorMetadata) {
        let fp32 = |name: &str, shape: Vec<i64>| TensorMetadata {
            name: name.into(),
            datatype: "FP32".into(),
            shape,
        };
        match self {
            Model::Dense => (
                fp32(dense::INPUT, vec![-1, dense::IN_FEATURES as i64]),
                fp32(dense::OUTPUT, vec![-1, dense::OUT_FEATURES as i64]),
            ),
            Model::Identity => (
                fp32(dense::INPUT, vec![-1, -1]),
                fp32(dense::OUTPUT, vec![-1, -1]),
            ),
        }
    }

    /// The input shape to validate a request against: the declared one, or
    /// for `identity` any size in the rank the request uses.
    pub fn input_shape_for(self, request_shape: &[i64]) -> Vec<i64> {
        match self {
            Model::Dense => self.tensors().0.shape,
            Model::Identity => vec![-1; request_shape.len()],
        }
    }

    /// Computes the output for a validated input of `shape`; `nan` fills it
    /// with NaN (the injected fault).
    pub fn compute(self, input: Input<'_>, shape: &[i64], nan: bool) -> Output {
        let values = |input: Input<'_>| match input {
            Input::Raw(raw) => raw_to_f32(raw).unwrap_or_default(),
            Input::Typed(v) => v.to_vec(),
        };
        match self {
            Model::Dense => {
                let x = values(input);
                let mut y = dense::forward(&x);
                if nan {
                    y.fill(f32::NAN);
                }
                let rows = (x.len() / dense::IN_FEATURES) as i64;
                Output {
                    shape: vec![rows, dense::OUT_FEATURES as i64],
                    raw: None,
                    values: y,
                    rows: rows as u64,
                }
            }
            Model::Identity => {
                let rows = shape.first().map_or(1, |&d| d.max(0) as u64);
                match input {
                    // The same bytes: no copy, no conversion.
                    Input::Raw(raw) if !nan => Output {
                        shape: shape.to_vec(),
                        raw: Some(raw.clone()),
                        values: Vec::new(),
                        rows,
                    },
                    input => {
                        let mut y = values(input);
                        if nan {
                            y.fill(f32::NAN);
                        }
                        Output {
                            shape: shape.to_vec(),
                            raw: None,
                            values: y,
                            rows,
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_passes_bytes_through_and_dense_computes() {
        let raw = Bytes::from(f32_to_raw(&[1.0, -2.0, 3.5]));
        let out = Model::Identity.compute(Input::Raw(&raw), &[3], false);
        assert_eq!(out.shape, vec![3]);
        assert_eq!(out.into_raw(), raw);
        let out = Model::Identity.compute(Input::Typed(&[1.0, 2.0]), &[1, 2], true);
        assert!(out.into_values().iter().all(|v| v.is_nan()));
        let out = Model::Dense.compute(Input::Typed(&[0.0; 32]), &[2, 16], false);
        assert_eq!(out.shape, vec![2, 4]);
        assert_eq!(out.rows, 2);
        assert_eq!(out.into_values(), dense::forward(&[0.0; 32]));
        assert_eq!(Model::of("identity"), Model::Identity);
        assert_eq!(Model::of("anything"), Model::Dense);
        assert_eq!(
            Model::Identity.input_shape_for(&[2, 3, 4]),
            vec![-1, -1, -1]
        );
    }
}
