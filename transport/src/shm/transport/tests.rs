//! Round trips through [`ShmTransport`] and a server-side [`ShmRegistry`]:
//! the staged path must give exactly the tensors the inline path gives.

use std::collections::HashMap;

use bytes::Bytes;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::model_infer_response::InferOutputTensor;
use infermesh_proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse};
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};

use super::*;
use crate::error::ShmError;
use crate::shm::pool::PoolConfig;
use crate::shm::registry::{RegistryConfig, ShmRegistry};
use crate::shm::test_dir::TestDir;

const OWNER: u64 = 9;

fn tensor(name: &str, datatype: &str, shape: Vec<i64>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        parameters: HashMap::new(),
        contents: None,
    }
}

/// An inline request: X FP32 [2, 3], TAG UINT8 [5], EMPTY FP32 [0].
fn request(outputs: &[&str]) -> ModelInferRequest {
    let x: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![
            tensor("X", "FP32", vec![2, 3]),
            tensor("TAG", "UINT8", vec![5]),
            tensor("EMPTY", "FP32", vec![0]),
        ],
        outputs: outputs
            .iter()
            .map(|n| InferRequestedOutputTensor {
                name: n.to_string(),
                parameters: HashMap::new(),
            })
            .collect(),
        raw_input_contents: vec![
            f32_to_raw(&x).into(),
            Bytes::from_static(b"hello"),
            Bytes::new(),
        ],
        ..Default::default()
    }
}

/// A model over inline requests: DOUBLE = 2·X (FP32), TEXT = BYTES ["hello",
/// "!"], COPY = TAG (UINT8). Answers all outputs when none is requested.
fn model(req: &ModelInferRequest) -> ModelInferResponse {
    assert!(req.inputs.iter().all(|i| i.parameters.is_empty()));
    let x = raw_to_f32(&req.raw_input_contents[0]).unwrap();
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let mut text = Vec::new();
    for s in [&req.raw_input_contents[1][..], b"!"] {
        text.extend_from_slice(&(s.len() as u32).to_le_bytes());
        text.extend_from_slice(s);
    }
    let all = [
        (
            "DOUBLE",
            "FP32",
            vec![2, 3],
            Bytes::from(f32_to_raw(&doubled)),
        ),
        ("TEXT", "BYTES", vec![2], Bytes::from(text)),
        ("COPY", "UINT8", vec![5], req.raw_input_contents[1].clone()),
    ];
    let wanted: Vec<&str> = req.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut resp = ModelInferResponse {
        model_name: req.model_name.clone(),
        ..Default::default()
    };
    for (name, datatype, shape, bytes) in all {
        if wanted.is_empty() || wanted.contains(&name) {
            resp.outputs.push(InferOutputTensor {
                name: name.into(),
                datatype: datatype.into(),
                shape,
                ..Default::default()
            });
            resp.raw_output_contents.push(bytes);
        }
    }
    resp
}

struct Fixture {
    _dir: TestDir,
    transport: ShmTransport,
    server: ShmRegistry,
}

fn fixture(name: &str, max_total_bytes: u64) -> Fixture {
    let dir = TestDir::new(name);
    let pool = ShmPool::new(PoolConfig {
        dir: dir.shm().clone(),
        max_total_bytes,
        ..PoolConfig::default()
    });
    let server = ShmRegistry::new(RegistryConfig {
        dir: dir.shm().clone(),
        ..RegistryConfig::default()
    });
    Fixture {
        _dir: dir,
        transport: ShmTransport::new(pool, "agent-1"),
        server,
    }
}

impl Fixture {
    /// Client stage → (register) → server take_inputs → model →
    /// place_outputs → client complete.
    fn round_trip(&self, mut req: ModelInferRequest) -> (ModelInferResponse, bool) {
        let mut staged = self.transport.stage(&mut req).unwrap();
        let registered = match staged.needs_register() {
            Some(r) => {
                self.server.handle_register(OWNER, &r.to_request()).unwrap();
                staged.mark_registered();
                true
            }
            None => false,
        };
        self.server.take_inputs(OWNER, &mut req).unwrap();
        let mut resp = model(&req);
        self.server.place_outputs(OWNER, &req, &mut resp).unwrap();
        self.transport.complete(staged, &mut resp).unwrap();
        (resp, registered)
    }
}

#[test]
fn staged_round_trip_equals_inline_and_registers_once() {
    let f = fixture("transport-roundtrip", 1 << 30);
    let outputs = ["DOUBLE", "TEXT", "COPY"];
    let inline = model(&request(&outputs));

    let mut staged_req = request(&outputs);
    let staged = f.transport.stage(&mut staged_req).unwrap();
    assert!(staged.is_rewritten());
    // Empty inputs stay inline; the others reference 64-byte-aligned offsets.
    assert_eq!(staged_req.raw_input_contents, vec![Bytes::new()]);
    let offsets: Vec<u64> = staged_req.inputs[..2]
        .iter()
        .map(|i| {
            ShmRef::from_params(&i.name, &i.parameters)
                .unwrap()
                .unwrap()
                .offset
        })
        .collect();
    assert_eq!(offsets, vec![0, 64]);
    assert!(staged_req.outputs.iter().all(|o| in_shm(&o.parameters)));
    drop(staged);

    let (resp, registered) = f.round_trip(request(&outputs));
    assert!(registered, "first use of a region registers it");
    assert_eq!(resp, inline);
    // The outputs are views of the region: dropped, it goes back.
    drop(resp);
    let (resp, registered) = f.round_trip(request(&outputs));
    assert!(!registered, "the region is reused, registered once");
    assert_eq!(resp, inline);
    drop(resp);
    let c = f.transport.pool().counters();
    assert_eq!((c.created, c.reused, c.leased), (1, 2, 0));
    assert_eq!(f.server.region_count(), 1);

    // The peer restarted: registrations are forgotten and redone.
    f.transport.forget_registrations();
    f.server.drop_owner(OWNER);
    let (resp, registered) = f.round_trip(request(&outputs));
    assert!(registered);
    assert_eq!(resp, inline);
}

#[test]
fn some_outputs_or_none_listed() {
    let f = fixture("transport-outputs", 1 << 30);
    let (resp, _) = f.round_trip(request(&["TEXT"]));
    assert_eq!(resp, model(&request(&["TEXT"])));
    // No outputs listed: the server answers all of them inline.
    let (resp, _) = f.round_trip(request(&[]));
    assert_eq!(resp, model(&request(&[])));
}

#[test]
fn a_server_that_drops_shm_entries_is_understood_too() {
    let f = fixture("transport-dropped", 1 << 30);
    let outputs = ["DOUBLE", "COPY"];
    let mut req = request(&outputs);
    let mut staged = f.transport.stage(&mut req).unwrap();
    let r = staged.needs_register().unwrap().to_request();
    f.server.handle_register(OWNER, &r).unwrap();
    staged.mark_registered();
    f.server.take_inputs(OWNER, &mut req).unwrap();
    let mut resp = model(&req);
    f.server.place_outputs(OWNER, &req, &mut resp).unwrap();
    resp.raw_output_contents.retain(|b| !b.is_empty());
    assert!(resp.raw_output_contents.is_empty());
    f.transport.complete(staged, &mut resp).unwrap();
    assert_eq!(resp, model(&request(&outputs)));
}

#[test]
fn requests_not_in_plain_raw_form_go_untouched() {
    let f = fixture("transport-untouched", 1 << 30);
    let mut typed = request(&[]);
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(InferTensorContents {
        fp32_contents: vec![1.0; 6],
        ..Default::default()
    });
    let mut already = request(&[]);
    ShmRef {
        region: "theirs".into(),
        offset: 0,
        byte_size: 24,
    }
    .to_params(&mut already.inputs[0].parameters);
    for mut req in [typed, already] {
        let before = req.clone();
        let staged = f.transport.stage(&mut req).unwrap();
        assert!(!staged.is_rewritten());
        assert!(staged.needs_register().is_none());
        assert_eq!(req, before);
        let mut resp = model(&request(&[]));
        let expected = resp.clone();
        f.transport.complete(staged, &mut resp).unwrap();
        assert_eq!(resp, expected);
    }
    assert_eq!(f.transport.pool().counters().created, 0);
}

#[test]
fn unstage_restores_the_inline_request_for_a_fallback() {
    let f = fixture("transport-unstage", 1 << 30);
    let mut req = request(&["DOUBLE"]);
    let before = req.clone();
    let staged = f.transport.stage(&mut req).unwrap();
    assert_ne!(req, before);
    staged.unstage(&mut req);
    assert_eq!(req, before);
    assert_eq!(f.transport.pool().counters().leased, 0, "lease released");
}

#[test]
fn an_exhausted_pool_fails_the_request_without_breaking_the_path() {
    // The request needs 128 KiB (inputs + a 64 KiB output window).
    let f = fixture("transport-exhausted", 128 * 1024);
    let mut req = request(&["DOUBLE"]);
    let before = req.clone();
    let hold = f.transport.pool().lease(1).unwrap();
    let err = f.transport.stage(&mut req).unwrap_err();
    assert!(matches!(
        err,
        TransportError::Shm(ShmError::PoolExhausted { .. })
    ));
    assert!(!err.breaks_path());
    assert_eq!(req, before);
    drop(hold);
    assert!(f.transport.stage(&mut req).is_ok());
}

#[test]
fn an_output_larger_than_the_hint_is_refused_by_the_server() {
    let f = fixture("transport-hint", 1 << 30);
    let transport = f.transport.clone().with_output_bytes_hint(8);
    let mut req = request(&["DOUBLE"]);
    let mut staged = transport.stage(&mut req).unwrap();
    let r = staged.needs_register().unwrap().to_request();
    f.server.handle_register(OWNER, &r).unwrap();
    staged.mark_registered();
    f.server.take_inputs(OWNER, &mut req).unwrap();
    let mut resp = model(&req);
    let err = f.server.place_outputs(OWNER, &req, &mut resp).unwrap_err();
    assert!(matches!(
        err,
        ShmError::OutputTooLarge {
            needed: 24,
            window: 8,
            ..
        }
    ));
}

#[test]
fn bytes_len_walks_length_prefixes() {
    let mut s = Vec::new();
    for e in [&b"ab"[..], b"", b"xyz"] {
        s.extend_from_slice(&(e.len() as u32).to_le_bytes());
        s.extend_from_slice(e);
    }
    s.extend_from_slice(&[0xff; 7]);
    assert_eq!(bytes_len(&s, 3), Some(4 + 2 + 4 + 4 + 3));
    assert_eq!(bytes_len(&s, 0), Some(0));
    assert_eq!(
        bytes_len(&s, 4),
        None,
        "the garbage prefix runs past the end"
    );
    assert_eq!(bytes_len(&[1, 0], 1), None);
}

#[test]
fn complete_rejects_a_response_missing_an_output() {
    let f = fixture("transport-missing", 1 << 30);
    let mut req = request(&["DOUBLE"]);
    let staged = f.transport.stage(&mut req).unwrap();
    let mut resp = ModelInferResponse::default();
    let err = f.transport.complete(staged, &mut resp).unwrap_err();
    assert!(
        matches!(err, TransportError::MalformedResponse { .. }),
        "{err}"
    );
    assert!(err.breaks_path());
    assert_eq!(f.transport.pool().counters().leased, 0);
}

/// Issue 27: outputs come back as views of the region, not copies; a view
/// that outlives its call keeps the region from being lent again, and
/// dropping it gives the region back.
#[test]
fn an_output_view_keeps_its_region_from_reuse_until_dropped() {
    let f = fixture("transport-views", 1 << 30);
    let pool = f.transport.pool().clone();
    let (first, _) = f.round_trip(request(&["DOUBLE"]));
    assert_eq!(
        pool.counters().leased,
        1,
        "the output outlives its call: its region stays leased"
    );
    let (second, _) = f.round_trip(request(&["DOUBLE"]));
    assert_eq!(
        pool.counters().created,
        2,
        "a call while the view lives gets another region"
    );
    assert_eq!(first.raw_output_contents, second.raw_output_contents);
    let kept = first.raw_output_contents[0].clone();
    drop((first, second));
    assert_eq!(
        pool.counters().leased,
        1,
        "a clone of the view holds it too"
    );
    drop(kept);
    assert_eq!(pool.counters().leased, 0, "dropped: released");
    let (third, _) = f.round_trip(request(&["DOUBLE"]));
    assert_eq!(third, model(&request(&["DOUBLE"])));
    let c = pool.counters();
    assert_eq!(
        (c.created, c.reused),
        (2, 1),
        "a released region is lent again"
    );
}

/// A request whose inputs the caller built in the region is staged without
/// a copy: the references point at the windows it wrote.
#[test]
fn inputs_built_in_place_are_referenced_not_copied() {
    let f = fixture("transport-in-place", 1 << 30);
    let inline = request(&["DOUBLE", "COPY"]);
    let layout = Layout::new(
        inline.raw_input_contents.iter().map(|b| b.len() as u64),
        [64u64 << 10, 64 << 10],
    );
    let mut lease = f.transport.pool().lease(layout.len).unwrap();
    for (raw, w) in inline.raw_input_contents.iter().zip(&layout.inputs) {
        lease
            .bytes_mut(w.offset, w.len)
            .unwrap()
            .copy_from_slice(raw);
    }
    let lease = lease.share();
    let mut req = inline.clone();
    req.raw_input_contents = layout
        .inputs
        .iter()
        .map(|w| lease.view(w.offset, w.len).unwrap())
        .collect();
    let mut staged = f
        .transport
        .stage_in_place(&mut req, &lease, &layout)
        .unwrap();
    let placed: Vec<u64> = req.inputs[..2]
        .iter()
        .map(|i| {
            ShmRef::from_params(&i.name, &i.parameters)
                .unwrap()
                .unwrap()
                .offset
        })
        .collect();
    assert_eq!(placed, [layout.inputs[0].offset, layout.inputs[1].offset]);
    assert_eq!(f.transport.pool().counters().created, 1, "no second region");
    let r = staged.needs_register().unwrap();
    f.server.handle_register(OWNER, &r.to_request()).unwrap();
    staged.mark_registered();
    f.server.take_inputs(OWNER, &mut req).unwrap();
    let mut resp = model(&req);
    f.server.place_outputs(OWNER, &req, &mut resp).unwrap();
    f.transport.complete(staged, &mut resp).unwrap();
    assert_eq!(resp, model(&inline));

    // Inputs that are not views of the region are copied, as `stage` does.
    let mut elsewhere = inline.clone();
    let staged = f
        .transport
        .stage_in_place(&mut elsewhere, &lease, &layout)
        .unwrap();
    assert!(staged.is_rewritten());
    assert_eq!(
        f.transport.pool().counters().created,
        2,
        "copied into a region of its own"
    );
}
