//! Property tests of `validate_request` (tracker issue 11): arbitrary
//! requests against arbitrary models never panic, and a request that passes
//! always adds up — every model input given once, every shape non-negative
//! and matching the model's, and the contents holding exactly shape ×
//! datatype. Runs in CI with `cargo test`; the longer `cargo fuzz` target
//! (fuzz/) drives the same checks from raw bytes.

use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::model_metadata_response::TensorMetadata;
use infermesh_proto::inference::{InferTensorContents, ModelInferRequest, ModelMetadataResponse};
use infermesh_proto::tensor::{DataType, MAX_ECHO_BYTES, element_count, validate_request};
use proptest::prelude::*;

const NAMES: [&str; 3] = ["INPUT0", "INPUT1", "OUTPUT0"];
const DTYPES: [&str; 6] = ["FP32", "INT64", "UINT8", "BYTES", "FP16", "NOPE"];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(&NAMES[..]).prop_map(str::to_string),
        1 => ".{0,300}",
    ]
}

fn dtype() -> impl Strategy<Value = String> {
    prop::sample::select(&DTYPES[..]).prop_map(str::to_string)
}

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![8 => 0i64..5, 1 => Just(-1i64), 1 => any::<i64>()]
}

fn shape() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(dim(), 0..4)
}

fn tensor() -> impl Strategy<Value = TensorMetadata> {
    (name(), dtype(), shape()).prop_map(|(name, datatype, shape)| TensorMetadata {
        name,
        datatype,
        shape,
    })
}

fn meta() -> impl Strategy<Value = ModelMetadataResponse> {
    (
        prop::collection::vec(tensor(), 0..3),
        prop::collection::vec(tensor(), 0..2),
    )
        .prop_map(|(inputs, outputs)| ModelMetadataResponse {
            name: "m".into(),
            inputs,
            outputs,
            ..Default::default()
        })
}

fn contents() -> impl Strategy<Value = Option<InferTensorContents>> {
    prop::option::of(
        (
            prop::collection::vec(any::<f32>(), 0..20),
            prop::collection::vec(any::<i64>(), 0..20),
            prop::collection::vec(any::<u32>(), 0..20),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..4), 0..5),
        )
            .prop_map(|(fp32, int64, uint, bytes)| InferTensorContents {
                fp32_contents: fp32,
                int64_contents: int64,
                uint_contents: uint,
                bytes_contents: bytes,
                ..Default::default()
            }),
    )
}

fn raw_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..80),
        // Well-formed BYTES elements, sometimes.
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..4), 0..6).prop_map(|els| {
            els.iter()
                .flat_map(|e| (e.len() as u32).to_le_bytes().into_iter().chain(e.clone()))
                .collect()
        }),
        // Exactly sized for small FP32 shapes, sometimes.
        (0usize..20).prop_map(|n| vec![0u8; n * 4]),
    ]
}

fn request() -> impl Strategy<Value = ModelInferRequest> {
    let input = (name(), dtype(), shape(), contents()).prop_map(|(name, datatype, shape, c)| {
        InferInputTensor {
            name,
            datatype,
            shape,
            contents: c,
            ..Default::default()
        }
    });
    (
        prop::collection::vec(input, 0..3),
        prop::collection::vec(raw_bytes(), 0..3),
        prop::collection::vec(name(), 0..2),
    )
        .prop_map(|(inputs, raw, outputs)| ModelInferRequest {
            model_name: "m".into(),
            inputs,
            raw_input_contents: raw.into_iter().map(Into::into).collect(),
            outputs: outputs
                .into_iter()
                .map(|name| InferRequestedOutputTensor {
                    name,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
}

/// Elements in a raw BYTES tensor, if its prefixes add up.
fn bytes_elements(mut b: &[u8]) -> Option<usize> {
    let mut n = 0;
    while !b.is_empty() {
        let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        b = b.get(4..)?.get(len..)?;
        n += 1;
    }
    Some(n)
}

/// A request for the `dense`-like model [`fixed_meta`], near validity:
/// dimensions around the model's, raw sizes around the right one.
fn near_valid() -> impl Strategy<Value = ModelInferRequest> {
    (
        prop_oneof![Just(-1i64), 0i64..4],
        prop_oneof![4 => Just(16i64), 1 => 14i64..18],
        prop_oneof![4 => Just(0i64), 1 => -4i64..4],
        any::<bool>(),
        prop_oneof![4 => Just("FP32"), 1 => Just("FP16")],
    )
        .prop_map(|(rows, cols, delta, raw, dtype)| {
            let elements = (rows.max(0) * cols.max(0)) as usize;
            let mut input = InferInputTensor {
                name: "INPUT0".into(),
                datatype: dtype.into(),
                shape: vec![rows, cols],
                ..Default::default()
            };
            let mut req = ModelInferRequest {
                model_name: "m".into(),
                ..Default::default()
            };
            if raw {
                let len = (elements as i64 * 4 + delta).max(0) as usize;
                req.raw_input_contents = vec![vec![0u8; len].into()];
            } else {
                input.contents = Some(InferTensorContents {
                    fp32_contents: vec![0.0; (elements as i64 + delta).max(0) as usize],
                    ..Default::default()
                });
            }
            req.inputs = vec![input];
            req
        })
}

fn fixed_meta() -> ModelMetadataResponse {
    ModelMetadataResponse {
        name: "m".into(),
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
        ..Default::default()
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 4096,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "tests/validate_props.proptest-regressions",
            ),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_requests_are_checked_without_panics(req in request(), meta in meta()) {
        check(&req, &meta)?;
    }

    #[test]
    fn near_valid_requests_are_accepted_only_when_they_add_up(req in near_valid()) {
        check(&req, &fixed_meta())?;
        let input = &req.inputs[0];
        let elements = (input.shape[0] * input.shape[1]).max(0) as usize;
        let adds_up = input.shape[0] >= 0
            && input.shape[1] == 16
            && input.datatype == "FP32"
            && match req.raw_input_contents.first() {
                Some(b) => b.len() == elements * 4,
                None => input.contents.as_ref().unwrap().fp32_contents.len() == elements,
            };
        prop_assert_eq!(validate_request(&req, &fixed_meta()).is_ok(), adds_up);
    }
}

/// `validate_request` on `req`: bounded messages when refused; when
/// accepted, everything adds up.
fn check(req: &ModelInferRequest, meta: &ModelMetadataResponse) -> Result<(), TestCaseError> {
    {
        let result = validate_request(req, meta);
        if let Err(e) = &result {
            // Messages stay bounded whatever the request holds.
            prop_assert!(e.to_string().len() < 8 * MAX_ECHO_BYTES + 1024, "{}", e);
            return Ok(());
        }
        let raw = !req.raw_input_contents.is_empty();
        if raw {
            prop_assert_eq!(req.raw_input_contents.len(), req.inputs.len());
        }
        for m in &meta.inputs {
            prop_assert_eq!(req.inputs.iter().filter(|i| i.name == m.name).count(), 1);
        }
        for (i, input) in req.inputs.iter().enumerate() {
            let spec = meta.inputs.iter().find(|m| m.name == input.name).unwrap();
            prop_assert_eq!(&input.datatype, &spec.datatype);
            prop_assert_eq!(input.shape.len(), spec.shape.len());
            for (&got, &want) in input.shape.iter().zip(&spec.shape) {
                prop_assert!(got >= 0);
                prop_assert!(want < 0 || got == want);
            }
            let elements = element_count(&input.shape).unwrap();
            let dtype = DataType::parse(&input.datatype).unwrap();
            if raw {
                prop_assert!(input.contents.is_none());
                let bytes = &req.raw_input_contents[i];
                match dtype.element_size() {
                    Some(size) => prop_assert_eq!(Some(bytes.len()), elements.checked_mul(size)),
                    None => prop_assert_eq!(bytes_elements(bytes), Some(elements)),
                }
            } else {
                let empty = InferTensorContents::default();
                let c = input.contents.as_ref().unwrap_or(&empty);
                prop_assert_eq!(dtype.typed_len(c), Some(elements));
            }
        }
        for out in &req.outputs {
            prop_assert!(meta.outputs.iter().any(|m| m.name == out.name));
        }
    }
    Ok(())
}
