//! Tensor datatypes and validation of `ModelInfer` requests against a model's
//! metadata. Both the agent front and the test worker call [`validate_request`]
//! so a bad request gets the same clear `INVALID_ARGUMENT` wherever it lands.

use std::collections::HashSet;
use std::fmt;

use crate::inference::model_infer_request::InferInputTensor;
use crate::inference::model_metadata_response::TensorMetadata;
use crate::inference::{InferTensorContents, ModelInferRequest, ModelMetadataResponse};

/// An OIP tensor datatype (the protocol's strings: `FP32`, `INT64`, `BYTES`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`, one byte per element.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP16`; raw form only.
    Fp16,
    /// `BF16`; raw form only.
    Bf16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BYTES`: each element is a 4-byte little-endian length and the bytes.
    Bytes,
}

impl DataType {
    /// Parses the protocol's datatype string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "BOOL" => Self::Bool,
            "UINT8" => Self::Uint8,
            "UINT16" => Self::Uint16,
            "UINT32" => Self::Uint32,
            "UINT64" => Self::Uint64,
            "INT8" => Self::Int8,
            "INT16" => Self::Int16,
            "INT32" => Self::Int32,
            "INT64" => Self::Int64,
            "FP16" => Self::Fp16,
            "BF16" => Self::Bf16,
            "FP32" => Self::Fp32,
            "FP64" => Self::Fp64,
            "BYTES" => Self::Bytes,
            _ => return None,
        })
    }

    /// The protocol's string for this datatype.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bool => "BOOL",
            Self::Uint8 => "UINT8",
            Self::Uint16 => "UINT16",
            Self::Uint32 => "UINT32",
            Self::Uint64 => "UINT64",
            Self::Int8 => "INT8",
            Self::Int16 => "INT16",
            Self::Int32 => "INT32",
            Self::Int64 => "INT64",
            Self::Fp16 => "FP16",
            Self::Bf16 => "BF16",
            Self::Fp32 => "FP32",
            Self::Fp64 => "FP64",
            Self::Bytes => "BYTES",
        }
    }

    /// Bytes per element in the raw form; `None` for variable-size `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        match self {
            Self::Bool | Self::Uint8 | Self::Int8 => Some(1),
            Self::Uint16 | Self::Int16 | Self::Fp16 | Self::Bf16 => Some(2),
            Self::Uint32 | Self::Int32 | Self::Fp32 => Some(4),
            Self::Uint64 | Self::Int64 | Self::Fp64 => Some(8),
            Self::Bytes => None,
        }
    }

    /// Number of elements in the typed-contents field this datatype uses;
    /// `None` for types that only have a raw form (FP16, BF16).
    pub fn typed_len(self, c: &InferTensorContents) -> Option<usize> {
        Some(match self {
            Self::Bool => c.bool_contents.len(),
            Self::Int8 | Self::Int16 | Self::Int32 => c.int_contents.len(),
            Self::Int64 => c.int64_contents.len(),
            Self::Uint8 | Self::Uint16 | Self::Uint32 => c.uint_contents.len(),
            Self::Uint64 => c.uint64_contents.len(),
            Self::Fp32 => c.fp32_contents.len(),
            Self::Fp64 => c.fp64_contents.len(),
            Self::Bytes => c.bytes_contents.len(),
            Self::Fp16 | Self::Bf16 => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bytes of a client-supplied name (tensor, datatype, region, key) that an
/// error message repeats; longer names are cut at a character boundary and
/// end with "…", so a request cannot make its own error large.
pub const MAX_ECHO_BYTES: usize = 128;
/// Dimensions of a client-supplied shape an error message repeats.
pub const MAX_ECHO_DIMS: usize = 16;

/// `s` as an error message may repeat it: at most [`MAX_ECHO_BYTES`] bytes,
/// then "…".
pub fn echo(s: &str) -> String {
    if s.len() <= MAX_ECHO_BYTES {
        return s.to_string();
    }
    let mut end = MAX_ECHO_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A shape as `[2, 16]`, at most [`MAX_ECHO_DIMS`] dimensions, then "…".
pub fn shape_text(shape: &[i64]) -> String {
    let shown: Vec<String> = shape
        .iter()
        .take(MAX_ECHO_DIMS)
        .map(i64::to_string)
        .collect();
    let more = if shape.len() > MAX_ECHO_DIMS {
        format!(", … ({} dimensions)", shape.len())
    } else {
        String::new()
    };
    format!("[{}{more}]", shown.join(", "))
}

/// Why a `ModelInfer` request does not fit the model. Every variant maps to
/// `INVALID_ARGUMENT`; the message names the tensor and what was expected.
/// Names and shapes from the request are repeated through [`echo`] and
/// [`shape_text`], so they are bounded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// An input the model does not have.
    #[error("unexpected input '{}': model '{}' has inputs [{expected}]", echo(.name), echo(.model))]
    UnknownInput {
        /// Model name.
        model: String,
        /// The input named in the request.
        name: String,
        /// The model's input names.
        expected: String,
    },
    /// The same input given twice.
    #[error("input '{}' is given more than once", echo(.0))]
    DuplicateInput(String),
    /// An input the model needs is absent.
    #[error("missing input '{}'", echo(.0))]
    MissingInput(String),
    /// An output the model does not produce.
    #[error("unknown requested output '{}'", echo(.0))]
    UnknownOutput(String),
    /// Datatype differs from the model's.
    #[error("input '{}': datatype {} does not match the model's {}", echo(.name), echo(.got), echo(.expected))]
    WrongDatatype {
        /// Tensor name.
        name: String,
        /// Datatype in the request.
        got: String,
        /// Datatype the model declares.
        expected: String,
    },
    /// A negative dimension in the request's shape. The model's metadata
    /// uses -1 for "any size"; a request must give the actual size.
    #[error(
        "input '{}': shape {} has a negative dimension ({} at position {index}); a request gives each dimension's actual size (-1 in the model's shape {} means any size)",
        echo(.name), shape_text(.got), .got[*.index], shape_text(.expected)
    )]
    NegativeDimension {
        /// Tensor name.
        name: String,
        /// Shape in the request.
        got: Vec<i64>,
        /// Position of the first negative dimension.
        index: usize,
        /// Shape the model declares.
        expected: Vec<i64>,
    },
    /// The request's shape has a different number of dimensions.
    #[error(
        "input '{}': shape {} has {} dimensions, the model's {} has {}",
        echo(.name), shape_text(.got), .got.len(), shape_text(.expected), .expected.len()
    )]
    WrongRank {
        /// Tensor name.
        name: String,
        /// Shape in the request.
        got: Vec<i64>,
        /// Shape the model declares (-1 = any size).
        expected: Vec<i64>,
    },
    /// A dimension differs from a fixed one of the model's.
    #[error(
        "input '{}': shape {} does not match the model's {}: dimension {index} is {}, the model needs {}",
        echo(.name), shape_text(.got), shape_text(.expected), .got[*.index], .expected[*.index]
    )]
    WrongDimension {
        /// Tensor name.
        name: String,
        /// Shape in the request.
        got: Vec<i64>,
        /// Position of the first differing dimension.
        index: usize,
        /// Shape the model declares (-1 = any size).
        expected: Vec<i64>,
    },
    /// The element count overflows.
    #[error("input '{}': shape {} is too large: it holds more elements than can be addressed", echo(.name), shape_text(.shape))]
    ShapeOverflow {
        /// Tensor name.
        name: String,
        /// Shape in the request.
        shape: Vec<i64>,
    },
    /// Raw bytes do not match shape × datatype size.
    #[error("input '{}': raw contents hold {got} bytes, shape and datatype need {expected}", echo(.name))]
    WrongByteSize {
        /// Tensor name.
        name: String,
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// Typed contents hold the wrong number of elements.
    #[error("input '{}': contents hold {got} elements, shape needs {expected}", echo(.name))]
    WrongElementCount {
        /// Tensor name.
        name: String,
        /// Elements given.
        got: usize,
        /// Elements expected.
        expected: usize,
    },
    /// `raw_input_contents` count differs from the inputs count.
    #[error("raw_input_contents has {got} entries for {expected} inputs")]
    RawCountMismatch {
        /// Entries given.
        got: usize,
        /// Inputs in the request.
        expected: usize,
    },
    /// Both raw and typed contents, or typed contents for a raw-only type.
    #[error("input '{}': {}", echo(.0), .1)]
    BadContents(String, &'static str),
    /// A `BYTES` raw tensor whose length prefixes do not add up.
    #[error("input '{}': malformed BYTES raw contents (each element is a 4-byte little-endian length and that many bytes)", echo(.0))]
    MalformedBytes(String),
}

/// Number of elements of `shape`, checking every dimension is non-negative.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).ok()?;
        acc.checked_mul(d)
    })
}

/// Checks `req` against the model's metadata: input names, datatypes, shapes,
/// and that the contents (raw or typed) hold exactly shape × datatype.
pub fn validate_request(
    req: &ModelInferRequest,
    meta: &ModelMetadataResponse,
) -> Result<(), TensorError> {
    let raw = &req.raw_input_contents;
    validate(req, raw.len(), |i| Raw::Bytes(&raw[i]), meta)
}

/// [`validate_request`] for a request whose `raw_input_contents` are known
/// by their lengths only (`raw_lens`, one per input, or none for typed
/// contents; the request's own `raw_input_contents` are not looked at): a
/// relay that leaves the tensors where they arrived checks their sizes
/// without gathering them. A `BYTES` input's size is in its contents, so
/// one checked this way is [`TensorError::MalformedBytes`]: check such
/// requests whole.
pub fn validate_request_sizes(
    req: &ModelInferRequest,
    raw_lens: &[usize],
    meta: &ModelMetadataResponse,
) -> Result<(), TensorError> {
    validate(req, raw_lens.len(), |i| Raw::Len(raw_lens[i]), meta)
}

/// A raw input as the validator sees it.
#[derive(Clone, Copy)]
enum Raw<'a> {
    Bytes(&'a [u8]),
    Len(usize),
}

/// Checks `req` with its `raw_count` raw inputs given by `raw_at`.
fn validate<'a>(
    req: &ModelInferRequest,
    raw_count: usize,
    raw_at: impl Fn(usize) -> Raw<'a>,
    meta: &ModelMetadataResponse,
) -> Result<(), TensorError> {
    let raw = raw_count > 0;
    if raw && raw_count != req.inputs.len() {
        return Err(TensorError::RawCountMismatch {
            got: raw_count,
            expected: req.inputs.len(),
        });
    }
    let mut seen = HashSet::new();
    for (i, input) in req.inputs.iter().enumerate() {
        let spec = meta
            .inputs
            .iter()
            .find(|m| m.name == input.name)
            .ok_or_else(|| TensorError::UnknownInput {
                model: meta.name.clone(),
                name: input.name.clone(),
                expected: names(&meta.inputs),
            })?;
        if !seen.insert(input.name.as_str()) {
            return Err(TensorError::DuplicateInput(input.name.clone()));
        }
        let raw_bytes = if raw { Some(raw_at(i)) } else { None };
        validate_input(input, spec, raw_bytes)?;
    }
    if let Some(missing) = meta.inputs.iter().find(|m| !seen.contains(m.name.as_str())) {
        return Err(TensorError::MissingInput(missing.name.clone()));
    }
    for out in &req.outputs {
        if !meta.outputs.iter().any(|m| m.name == out.name) {
            return Err(TensorError::UnknownOutput(out.name.clone()));
        }
    }
    Ok(())
}

fn names(tensors: &[TensorMetadata]) -> String {
    tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn validate_input(
    input: &InferInputTensor,
    spec: &TensorMetadata,
    raw: Option<Raw<'_>>,
) -> Result<(), TensorError> {
    let name = || input.name.clone();
    if input.datatype != spec.datatype {
        return Err(TensorError::WrongDatatype {
            name: name(),
            got: input.datatype.clone(),
            expected: spec.datatype.clone(),
        });
    }
    let dtype = DataType::parse(&input.datatype).ok_or_else(|| TensorError::WrongDatatype {
        name: name(),
        got: input.datatype.clone(),
        expected: spec.datatype.clone(),
    })?;
    if let Some(index) = input.shape.iter().position(|&d| d < 0) {
        return Err(TensorError::NegativeDimension {
            name: name(),
            got: input.shape.clone(),
            index,
            expected: spec.shape.clone(),
        });
    }
    if input.shape.len() != spec.shape.len() {
        return Err(TensorError::WrongRank {
            name: name(),
            got: input.shape.clone(),
            expected: spec.shape.clone(),
        });
    }
    let differs = input
        .shape
        .iter()
        .zip(&spec.shape)
        .position(|(&got, &want)| want >= 0 && got != want);
    if let Some(index) = differs {
        return Err(TensorError::WrongDimension {
            name: name(),
            got: input.shape.clone(),
            index,
            expected: spec.shape.clone(),
        });
    }
    let overflow = || TensorError::ShapeOverflow {
        name: name(),
        shape: input.shape.clone(),
    };
    let elements = element_count(&input.shape).ok_or_else(overflow)?;
    match (raw, &input.contents) {
        (Some(_), Some(_)) => Err(TensorError::BadContents(
            name(),
            "contents must be empty when raw_input_contents is used",
        )),
        (Some(raw), None) => match dtype.element_size() {
            Some(size) => {
                let expected = elements.checked_mul(size).ok_or_else(overflow)?;
                let got = match raw {
                    Raw::Bytes(b) => b.len(),
                    Raw::Len(n) => n,
                };
                if got == expected {
                    Ok(())
                } else {
                    Err(TensorError::WrongByteSize {
                        name: name(),
                        got,
                        expected,
                    })
                }
            }
            None => {
                let Raw::Bytes(bytes) = raw else {
                    return Err(TensorError::MalformedBytes(name()));
                };
                let got = count_bytes_elements(bytes)
                    .ok_or_else(|| TensorError::MalformedBytes(name()))?;
                if got == elements {
                    Ok(())
                } else {
                    Err(TensorError::WrongElementCount {
                        name: name(),
                        got,
                        expected: elements,
                    })
                }
            }
        },
        (None, contents) => {
            let empty = InferTensorContents::default();
            let contents = contents.as_ref().unwrap_or(&empty);
            let got = dtype.typed_len(contents).ok_or(TensorError::BadContents(
                name(),
                "FP16 and BF16 tensors must use raw_input_contents",
            ))?;
            if got == elements {
                Ok(())
            } else {
                Err(TensorError::WrongElementCount {
                    name: name(),
                    got,
                    expected: elements,
                })
            }
        }
    }
}

/// Counts the elements of a raw `BYTES` tensor (each a u32 LE length and data).
fn count_bytes_elements(mut bytes: &[u8]) -> Option<usize> {
    let mut n = 0usize;
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        bytes = bytes.get(4..)?.get(len..)?;
        n += 1;
    }
    Some(n)
}

/// Encodes `f32` values as little-endian raw tensor bytes.
pub fn f32_to_raw(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Decodes little-endian raw tensor bytes to `f32`; `None` if the length is
/// not a multiple of 4.
pub fn raw_to_f32(bytes: &[u8]) -> Option<Vec<f32>> {
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ModelMetadataResponse {
        ModelMetadataResponse {
            name: "dense".into(),
            versions: vec!["1".into()],
            platform: "test".into(),
            inputs: vec![TensorMetadata {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![-1, 16],
            }],
            outputs: vec![TensorMetadata {
                name: "OUTPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![-1, 4],
            }],
        }
    }

    /// Sizes alone check what the bytes would (issue 27: a relay that
    /// leaves the tensors where they arrived).
    #[test]
    fn sizes_alone_are_checked_as_the_bytes_are() {
        let m = meta();
        for (bytes, ok) in [(2 * 64, true), (2 * 64 - 1, false), (0, false)] {
            let mut req = raw_request(vec![2, 16], "FP32", bytes);
            let whole = validate_request(&req, &m).is_ok();
            req.raw_input_contents.clear();
            assert_eq!(validate_request_sizes(&req, &[bytes], &m).is_ok(), ok);
            assert_eq!(whole, ok);
        }
        let req = raw_request(vec![2, 16], "FP32", 128);
        let err = validate_request_sizes(&req, &[128, 1], &m).unwrap_err();
        assert!(matches!(err, TensorError::RawCountMismatch { .. }), "{err}");
        let mut bytes_meta = m.clone();
        bytes_meta.inputs[0].datatype = "BYTES".into();
        let req = raw_request(vec![2, 16], "BYTES", 8);
        assert!(matches!(
            validate_request_sizes(&req, &[8], &bytes_meta),
            Err(TensorError::MalformedBytes(_))
        ));
    }

    fn raw_request(shape: Vec<i64>, dtype: &str, bytes: usize) -> ModelInferRequest {
        ModelInferRequest {
            model_name: "dense".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: dtype.into(),
                shape,
                ..Default::default()
            }],
            raw_input_contents: vec![vec![0u8; bytes].into()],
            ..Default::default()
        }
    }

    #[test]
    fn accepts_matching_raw_and_typed_requests() {
        assert_eq!(
            validate_request(&raw_request(vec![3, 16], "FP32", 192), &meta()),
            Ok(())
        );
        let mut typed = raw_request(vec![2, 16], "FP32", 0);
        typed.raw_input_contents.clear();
        typed.inputs[0].contents = Some(InferTensorContents {
            fp32_contents: vec![0.5; 32],
            ..Default::default()
        });
        assert_eq!(validate_request(&typed, &meta()), Ok(()));
    }

    #[test]
    fn rejects_each_kind_of_mismatch() {
        let m = meta();
        assert!(matches!(
            validate_request(&raw_request(vec![1, 15], "FP32", 60), &m),
            Err(TensorError::WrongDimension { index: 1, .. })
        ));
        assert!(matches!(
            validate_request(&raw_request(vec![1, 16, 1], "FP32", 64), &m),
            Err(TensorError::WrongRank { .. })
        ));
        assert!(matches!(
            validate_request(&raw_request(vec![1, 16], "FP32", 63), &m),
            Err(TensorError::WrongByteSize {
                got: 63,
                expected: 64,
                ..
            })
        ));
        assert!(matches!(
            validate_request(&raw_request(vec![1, 16], "INT32", 64), &m),
            Err(TensorError::WrongDatatype { .. })
        ));
        assert!(matches!(
            validate_request(&raw_request(vec![-2, 16], "FP32", 64), &m),
            Err(TensorError::NegativeDimension { index: 0, .. })
        ));
        assert!(matches!(
            validate_request(&raw_request(vec![i64::MAX, 16], "FP32", 64), &m),
            Err(TensorError::ShapeOverflow { .. })
        ));
        let mut missing = raw_request(vec![1, 16], "FP32", 64);
        missing.inputs.clear();
        missing.raw_input_contents.clear();
        assert_eq!(
            validate_request(&missing, &m),
            Err(TensorError::MissingInput("INPUT0".into()))
        );
        let mut unknown = raw_request(vec![1, 16], "FP32", 64);
        unknown.inputs[0].name = "X".into();
        assert!(matches!(
            validate_request(&unknown, &m),
            Err(TensorError::UnknownInput { .. })
        ));
    }

    #[test]
    fn a_negative_dimension_is_named_as_such() {
        let err = validate_request(&raw_request(vec![-1, 16], "FP32", 64), &meta()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("negative dimension (-1 at position 0)"),
            "{text}"
        );
        assert!(!text.contains("does not match"), "{text}");
        let err = validate_request(&raw_request(vec![2, -16], "FP32", 64), &meta()).unwrap_err();
        assert!(err.to_string().contains("(-16 at position 1)"), "{err}");
        // A wrong fixed dimension says which one.
        let err = validate_request(&raw_request(vec![2, 15], "FP32", 120), &meta()).unwrap_err();
        assert!(
            err.to_string()
                .contains("dimension 1 is 15, the model needs 16"),
            "{err}"
        );
    }

    #[test]
    fn client_supplied_names_and_shapes_are_echoed_bounded() {
        let mut req = raw_request(vec![1, 16], "FP32", 64);
        req.inputs[0].name = "é".repeat(10_000);
        let text = validate_request(&req, &meta()).unwrap_err().to_string();
        assert!(text.len() < 400, "{} bytes", text.len());
        assert!(text.contains('…'));
        let mut req = raw_request(vec![1; 100_000], "FP32", 4);
        req.inputs[0].datatype = "X".repeat(100_000);
        let text = validate_request(&req, &meta()).unwrap_err().to_string();
        assert!(text.len() < 400, "{} bytes", text.len());
        let text = validate_request(&raw_request(vec![1; 100_000], "FP32", 4), &meta())
            .unwrap_err()
            .to_string();
        assert!(text.contains("(100000 dimensions)"), "{text}");
        assert!(text.len() < 400, "{} bytes", text.len());
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"a".repeat(MAX_ECHO_BYTES)).len(), MAX_ECHO_BYTES);
    }

    #[test]
    fn counts_bytes_elements() {
        let mut raw = Vec::new();
        for s in ["ab", "", "xyz"] {
            raw.extend_from_slice(&(s.len() as u32).to_le_bytes());
            raw.extend_from_slice(s.as_bytes());
        }
        assert_eq!(count_bytes_elements(&raw), Some(3));
        assert_eq!(count_bytes_elements(&raw[..raw.len() - 1]), None);
    }

    #[test]
    fn f32_raw_round_trip() {
        let v = [1.0f32, -2.5, f32::MAX];
        assert_eq!(raw_to_f32(&f32_to_raw(&v)).unwrap(), v);
        assert_eq!(raw_to_f32(&[0, 1, 2]), None);
    }
}
