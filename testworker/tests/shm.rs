//! The test worker as a Triton-style shared-memory server: register POSIX
//! shm regions, infer with inputs and outputs in them, get the same tensors
//! as inline; bad references fail with INVALID_ARGUMENT and change nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::*;
use infermesh_proto::tensor::f32_to_raw;
use infermesh_proto::{
    GrpcInferenceService, GrpcInferenceServiceClient, GrpcInferenceServiceServer,
};
use infermesh_testworker::{TestWorker, WorkerOptions};
use infermesh_transport::ShmRegion;
use infermesh_transport::shm::ShmRef;
use tonic::{Code, Request};

/// A fresh region in /dev/shm, unlinked when dropped.
fn region(size: u64) -> ShmRegion {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let key = format!(
        "/infermesh-twtest-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    ShmRegion::create(&key, size).expect("create a region in /dev/shm")
}

fn worker() -> TestWorker {
    TestWorker::new(WorkerOptions {
        models: vec!["dense".into(), "identity".into()],
        ..Default::default()
    })
}

fn shm_ref(region: &str, offset: u64, byte_size: u64) -> HashMap<String, InferParameter> {
    let mut params = HashMap::new();
    ShmRef {
        region: region.into(),
        offset,
        byte_size,
    }
    .to_params(&mut params);
    params
}

fn inline_request(model: &str, shape: Vec<i64>, values: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape,
            ..Default::default()
        }],
        outputs: vec![InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            parameters: HashMap::new(),
        }],
        raw_input_contents: vec![f32_to_raw(values).into()],
        ..Default::default()
    }
}

/// `inline` with its input read from `name` at 0 and its output written to
/// `name` at `out_at` (window `out_size`).
fn shm_request(
    inline: &ModelInferRequest,
    name: &str,
    out_at: u64,
    out_size: u64,
) -> ModelInferRequest {
    let mut req = inline.clone();
    let len = req.raw_input_contents[0].len() as u64;
    req.raw_input_contents.clear();
    req.inputs[0].parameters = shm_ref(name, 0, len);
    req.outputs[0].parameters = shm_ref(name, out_at, out_size);
    req
}

async fn register(
    w: &TestWorker,
    name: &str,
    key: &str,
    offset: u64,
    size: u64,
) -> Result<(), tonic::Status> {
    w.system_shared_memory_register(Request::new(SystemSharedMemoryRegisterRequest {
        name: name.into(),
        key: key.into(),
        offset,
        byte_size: size,
    }))
    .await
    .map(|_| ())
}

async fn status(
    w: &TestWorker,
    name: &str,
) -> Result<SystemSharedMemoryStatusResponse, tonic::Status> {
    w.system_shared_memory_status(Request::new(SystemSharedMemoryStatusRequest {
        name: name.into(),
    }))
    .await
    .map(|r| r.into_inner())
}

#[tokio::test]
async fn shm_inputs_and_outputs_give_the_inline_results() {
    let w = worker();
    let shm = region(64 * 1024);
    register(&w, "io", shm.key().as_str(), 0, 64 * 1024)
        .await
        .unwrap();
    let dense_in: Vec<f32> = (0..48).map(|i| (i as f32 * 0.37).sin()).collect();
    let cases = [
        inline_request("dense", vec![3, 16], &dense_in),
        inline_request("identity", vec![2, 24], &dense_in),
        inline_request("identity", vec![2, 3, 8], &dense_in),
    ];
    for inline in cases {
        let expected = w.infer(inline.clone()).await.unwrap();
        shm.write(0, &inline.raw_input_contents[0]).unwrap();
        let resp = w
            .infer(shm_request(&inline, "io", 8192, 4096))
            .await
            .unwrap();
        // Metadata as inline, bytes in shared memory, an empty raw entry.
        assert_eq!(resp.outputs, expected.outputs, "{}", inline.model_name);
        assert_eq!(resp.raw_output_contents, vec![Bytes::new()]);
        let out_len = expected.raw_output_contents[0].len() as u64;
        assert_eq!(
            shm.read(8192, out_len).unwrap(),
            expected.raw_output_contents[0]
        );
        // Shared-memory input, inline output.
        let mut req = shm_request(&inline, "io", 0, 1);
        req.outputs[0].parameters.clear();
        assert_eq!(w.infer(req).await.unwrap(), expected);
    }
}

#[tokio::test]
async fn identity_accepts_any_shape_inline_and_typed() {
    let w = worker();
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let req = inline_request("identity", vec![2, 3, 4], &values);
    let resp = w.infer(req.clone()).await.unwrap();
    assert_eq!(resp.outputs[0].shape, vec![2, 3, 4]);
    assert_eq!(resp.raw_output_contents, req.raw_input_contents);
    let mut typed = req;
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(InferTensorContents {
        fp32_contents: values.clone(),
        ..Default::default()
    });
    let resp = w.infer(typed).await.unwrap();
    assert_eq!(
        resp.outputs[0].contents.as_ref().unwrap().fp32_contents,
        values
    );
    let bad = inline_request("identity", vec![2, 5], &values);
    assert_eq!(
        w.infer(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn bad_references_are_invalid_argument_and_change_nothing() {
    let w = worker();
    let shm = region(64 * 1024);
    register(&w, "io", shm.key().as_str(), 0, 4096)
        .await
        .unwrap();
    let values = [0.5f32; 16];
    let inline = inline_request("dense", vec![1, 16], &values);
    shm.write(0, &inline.raw_input_contents[0]).unwrap();
    shm.write(1024, &[0xAB; 64]).unwrap();
    let mut unknown = shm_request(&inline, "io", 1024, 64);
    unknown.inputs[0].parameters = shm_ref("nope", 0, 64);
    let mut past_end = shm_request(&inline, "io", 1024, 64);
    past_end.inputs[0].parameters = shm_ref("io", 4090, 64);
    let mut overflow = shm_request(&inline, "io", 1024, 64);
    overflow.inputs[0].parameters = shm_ref("io", u64::MAX, 64);
    let mut wrong_size = shm_request(&inline, "io", 1024, 64);
    wrong_size.inputs[0].parameters = shm_ref("io", 0, 60);
    let small_output = shm_request(&inline, "io", 1024, 8);
    let output_past_end = shm_request(&inline, "io", 4090, 16);
    let unknown_output = {
        let mut r = shm_request(&inline, "io", 1024, 64);
        r.outputs[0].parameters = shm_ref("nope", 0, 64);
        r
    };
    for req in [
        unknown,
        past_end,
        overflow,
        wrong_size,
        small_output,
        output_past_end,
        unknown_output,
    ] {
        let err = w.infer(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    }
    assert_eq!(
        shm.read(1024, 64).unwrap(),
        vec![0xAB; 64],
        "output window untouched"
    );
    let all = status(&w, "").await.unwrap();
    assert_eq!(all.regions.len(), 1);
    assert_eq!(all.regions["io"].byte_size, 4096);
}

#[tokio::test]
async fn register_status_unregister_like_triton() {
    let w = worker();
    let shm = region(8192);
    let key = shm.key().as_str();
    register(&w, "a", key, 0, 4096).await.unwrap();
    register(&w, "b", key, 4096, 4096).await.unwrap();
    let dup = register(&w, "a", key, 0, 64).await.unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);
    for (name, key, offset, size) in [
        ("c", "../etc/passwd", 0, 64),
        ("c", "/a/b", 0, 64),
        ("c", "/infermesh-twtest-missing", 0, 64),
        ("c", key, 8000, 200),
        ("c", key, u64::MAX, 1),
    ] {
        let err = register(&w, name, key, offset, size).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{key}: {}",
            err.message()
        );
    }
    let all = status(&w, "").await.unwrap();
    assert_eq!(all.regions.len(), 2);
    let b = &status(&w, "b").await.unwrap().regions["b"];
    assert_eq!((b.key.as_str(), b.offset, b.byte_size), (key, 4096, 4096));
    assert_eq!(status(&w, "c").await.unwrap_err().code(), Code::NotFound);

    w.system_shared_memory_unregister(Request::new(SystemSharedMemoryUnregisterRequest {
        name: "a".into(),
    }))
    .await
    .unwrap();
    assert_eq!(status(&w, "").await.unwrap().regions.len(), 1);
    let inline = inline_request("dense", vec![1, 16], &[0.0; 16]);
    let err = w
        .infer(shm_request(&inline, "a", 1024, 64))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    w.system_shared_memory_unregister(Request::new(SystemSharedMemoryUnregisterRequest::default()))
        .await
        .unwrap();
    assert!(status(&w, "").await.unwrap().regions.is_empty());

    let meta = w
        .server_metadata(Request::new(ServerMetadataRequest {}))
        .await
        .unwrap();
    assert!(
        meta.get_ref()
            .extensions
            .contains(&"system_shared_memory".to_string())
    );
}

/// Over real connections: regions belong to the connection that registered
/// them.
#[tokio::test]
async fn connections_cannot_see_each_others_regions() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GrpcInferenceServiceServer::new(worker()))
            .serve_with_incoming(incoming),
    );
    let url = format!("http://{addr}");
    let mut first = GrpcInferenceServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut second = GrpcInferenceServiceClient::connect(url).await.unwrap();

    let shm = region(64 * 1024);
    first
        .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
            name: "mine".into(),
            key: shm.key().to_string(),
            offset: 0,
            byte_size: 64 * 1024,
        })
        .await
        .unwrap();
    let values: Vec<f32> = (0..32).map(|i| i as f32 / 7.0).collect();
    let inline = inline_request("identity", vec![2, 16], &values);
    shm.write(0, &inline.raw_input_contents[0]).unwrap();
    let req = shm_request(&inline, "mine", 4096, 4096);

    let resp = first.model_infer(req.clone()).await.unwrap().into_inner();
    assert_eq!(resp.raw_output_contents, vec![Bytes::new()]);
    assert_eq!(shm.read(4096, 128).unwrap(), inline.raw_input_contents[0]);

    let err = second.model_infer(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let theirs = second
        .system_shared_memory_status(SystemSharedMemoryStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(theirs.regions.is_empty());
    second
        .system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest::default())
        .await
        .unwrap();
    let mine = first
        .system_shared_memory_status(SystemSharedMemoryStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        mine.regions.len(),
        1,
        "another connection cannot unregister it"
    );
    server.abort();
}
