//! Shared memory between the client library (or any OIP client) and an agent
//! on the same host: the client library uses it for the local node and falls
//! back to inline gRPC when a region cannot be created; references out of a
//! region's bounds, to unknown regions, or to another connection's regions
//! are refused with INVALID_ARGUMENT and change nothing.

use std::collections::HashMap;

use infermesh_client::{Client, PathsConfig};
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_request::InferRequestedOutputTensor;
use infermesh_proto::inference::{
    InferParameter, SystemSharedMemoryRegisterRequest, SystemSharedMemoryStatusRequest,
};
use infermesh_tests::{Agent, dense, testworker};
use infermesh_transport::{Path, ShmRegion};

fn int(v: i64) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    }
}

fn string(v: &str) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(v.into())),
    }
}

/// A client with `agent` as its local node; every request may take shared
/// memory, however small (the tests use small tensors).
async fn local_client(agent: &Agent, paths: PathsConfig) -> Client {
    let paths = PathsConfig {
        shm_min_bytes: 0,
        ..paths
    };
    Client::builder()
        .registry(format!("static://{}", agent.oip))
        .local_node(agent.oip.to_string())
        .transports(paths)
        .build()
        .await
        .unwrap()
}

fn dense_request(
    rows: usize,
    seed: u32,
) -> (Vec<f32>, infermesh_proto::inference::ModelInferRequest) {
    let input = dense::input(rows, seed);
    let mut req = dense::request(&input, true);
    req.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        ..Default::default()
    }];
    (input, req)
}

#[tokio::test]
async fn the_client_library_uses_shared_memory_for_the_local_node() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let client = local_client(&agent, PathsConfig::default()).await;
    for i in 0..20 {
        let (input, req) = dense_request(1 + i % 5, i as u32);
        let resp = client.infer(req).await.unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let shm = client.path_counters().get(Path::Shm);
    assert_eq!((shm.attempts, shm.successes, shm.fallbacks), (20, 20, 0));
    assert_eq!(client.path_counters().get(Path::Grpc).attempts, 0);
}

/// With the library's defaults, requests whose tensors are under
/// `shm_min_bytes` (32 KiB) go inline even to the local node — a region
/// costs more than it saves there — and larger ones take shared memory.
#[tokio::test]
async fn small_requests_go_inline_and_large_ones_through_shared_memory() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let client = Client::builder()
        .registry(format!("static://{}", agent.oip))
        .local_node(agent.oip.to_string())
        .build()
        .await
        .unwrap();
    // 1 row = 64 bytes; 1,024 rows = 64 KiB.
    for rows in [1, 1024] {
        let (input, req) = dense_request(rows, rows as u32);
        let resp = client.infer(req).await.unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let c = client.path_counters();
    let (shm, grpc) = (c.get(Path::Shm), c.get(Path::Grpc));
    assert_eq!((shm.attempts, shm.successes), (1, 1), "{c:?}");
    assert_eq!((grpc.attempts, grpc.successes), (1, 1), "{c:?}");
    assert_eq!(shm.fallbacks, 0, "{c:?}");
}

/// Outputs not listed in the request come back inline, in the one response
/// message the agent builds after the worker answers: larger than h2's send
/// buffer (400 KiB), that message must still leave (it used to wait for a
/// window h2 never grants, and the call hung).
#[tokio::test]
async fn a_large_inline_answer_to_a_shared_memory_request_is_delivered() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let client = local_client(&agent, PathsConfig::default()).await;
    for rows in [8 << 10, 32 << 10] {
        // 512 KiB and 2 MiB of FP32 each way.
        let input = dense::input(rows, 3);
        let req = dense::request(&input, true);
        assert!(
            req.outputs.is_empty(),
            "no outputs listed: they come back inline"
        );
        let resp = tokio::time::timeout(std::time::Duration::from_secs(120), client.infer(req))
            .await
            .expect("the call finishes instead of hanging")
            .unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let shm = client.path_counters().get(Path::Shm);
    assert_eq!((shm.attempts, shm.successes), (2, 2));
}

#[tokio::test]
async fn the_client_falls_back_to_inline_grpc_when_no_region_can_be_created() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let paths = PathsConfig {
        shm_dir: Some("/nonexistent/infermesh-shm".into()),
        ..Default::default()
    };
    let client = local_client(&agent, paths).await;
    for i in 0..5 {
        let (input, req) = dense_request(2, i);
        let resp = client.infer(req).await.expect("no request fails");
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let shm = client.path_counters().get(Path::Shm);
    let grpc = client.path_counters().get(Path::Grpc);
    // The first request tried shm, failed, and was re-sent inline; the path
    // is then broken until its re-probe time, so the rest go inline at once.
    assert_eq!((shm.attempts, shm.failures), (1, 1), "{shm:?}");
    assert_eq!(grpc.successes, 5, "{grpc:?}");
}

#[tokio::test]
async fn bad_references_are_refused_and_change_nothing() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let key = format!("infermesh-test-{}", std::process::id());
    let region = ShmRegion::create(&key, 4096).unwrap();
    let input = dense::input(2, 5);
    region
        .write(0, &infermesh_proto::tensor::f32_to_raw(&input))
        .unwrap();
    let mut client = agent.client().await;
    client
        .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
            name: "in".into(),
            key: format!("/{key}"),
            offset: 0,
            byte_size: 4096,
        })
        .await
        .unwrap();
    let shm_req = |name: &str, offset: i64, size: i64| {
        let mut req = dense::request(&input, true);
        req.raw_input_contents.clear();
        req.inputs[0].parameters = HashMap::from([
            ("shared_memory_region".to_string(), string(name)),
            ("shared_memory_offset".to_string(), int(offset)),
            ("shared_memory_byte_size".to_string(), int(size)),
        ]);
        req
    };
    // A good reference works.
    let resp = client.model_infer(shm_req("in", 0, 128)).await.unwrap();
    assert_eq!(dense::output(resp.get_ref()).0, dense::forward(&input));
    // Out of bounds, overflowing, unknown, malformed: INVALID_ARGUMENT.
    for (what, req) in [
        ("past the end", shm_req("in", 4096 - 64, 128)),
        ("overflow", shm_req("in", i64::MAX, 128)),
        ("negative", shm_req("in", -64, 128)),
        ("unknown region", shm_req("nope", 0, 128)),
    ] {
        let err = client.model_infer(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err:?}");
    }
    // Escaping /dev/shm is refused at registration.
    for key in ["/../etc/passwd", "/a/b", ""] {
        let err = client
            .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
                name: "evil".into(),
                key: key.into(),
                offset: 0,
                byte_size: 16,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "key {key:?}");
    }
    // Nothing changed: the one region is still there and still works.
    let status = client
        .system_shared_memory_status(SystemSharedMemoryStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.regions.keys().collect::<Vec<_>>(), ["in"]);
    client.model_infer(shm_req("in", 0, 128)).await.unwrap();
    // Another connection cannot use it.
    let mut other = agent.client().await;
    let err = other.model_infer(shm_req("in", 0, 128)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    drop(region);
}
