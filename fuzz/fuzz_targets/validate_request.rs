//! `validate_request` on a request and a model decoded from arbitrary bytes
//! (the first byte splits the input between the two): it must not panic,
//! its messages stay bounded, and what it accepts adds up.
#![no_main]

use infermesh_proto::inference::{InferTensorContents, ModelInferRequest, ModelMetadataResponse};
use infermesh_proto::tensor::{DataType, MAX_ECHO_BYTES, element_count, validate_request};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = (split as usize * rest.len()) / 256;
    let (Ok(meta), Ok(req)) = (
        ModelMetadataResponse::decode(&rest[..at]),
        ModelInferRequest::decode(&rest[at..]),
    ) else {
        return;
    };
    match validate_request(&req, &meta) {
        Err(e) => assert!(e.to_string().len() < 8 * MAX_ECHO_BYTES + 1024),
        Ok(()) => check_accepted(&req, &meta),
    }
});

fn check_accepted(req: &ModelInferRequest, meta: &ModelMetadataResponse) {
    let raw = !req.raw_input_contents.is_empty();
    for m in &meta.inputs {
        assert_eq!(req.inputs.iter().filter(|i| i.name == m.name).count(), 1);
    }
    for (i, input) in req.inputs.iter().enumerate() {
        let spec = meta.inputs.iter().find(|m| m.name == input.name).unwrap();
        assert_eq!(input.datatype, spec.datatype);
        assert_eq!(input.shape.len(), spec.shape.len());
        for (&got, &want) in input.shape.iter().zip(&spec.shape) {
            assert!(got >= 0 && (want < 0 || got == want));
        }
        let elements = element_count(&input.shape).unwrap();
        let dtype = DataType::parse(&input.datatype).unwrap();
        if raw {
            let bytes = &req.raw_input_contents[i];
            if let Some(size) = dtype.element_size() {
                assert_eq!(Some(bytes.len()), elements.checked_mul(size));
            }
        } else {
            let empty = InferTensorContents::default();
            let c = input.contents.as_ref().unwrap_or(&empty);
            assert_eq!(dtype.typed_len(c), Some(elements));
        }
    }
}
