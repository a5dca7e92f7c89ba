//! Issue 12: the shared-memory rung tells a refused request from a broken
//! path by type, not by message text. A request the agent refuses as
//! invalid is re-sent once over a fresh registration, then inline; the
//! caller gets INVALID_ARGUMENT and shared memory stays in use for the next
//! requests (the path is marked broken only when inline then succeeds).

use infermesh_client::{Client, ClientError, PathsConfig};
use infermesh_proto::inference::model_infer_request::InferRequestedOutputTensor;
use infermesh_tests::{Agent, dense, testworker};
use infermesh_transport::Path;
use tonic::Code;

fn request(seed: u32) -> (Vec<f32>, infermesh_proto::inference::ModelInferRequest) {
    let input = dense::input(2, seed);
    let mut req = dense::request(&input, true);
    req.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        ..Default::default()
    }];
    (input, req)
}

#[tokio::test]
async fn an_invalid_request_on_shm_fails_alone_and_keeps_the_path() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let client = Client::builder()
        .registry(format!("static://{}", agent.oip))
        .local_node(agent.oip.to_string())
        .transports(PathsConfig {
            shm_min_bytes: 0,
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    for i in 0..5 {
        let (input, req) = request(i);
        let resp = client.infer(req).await.unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }

    // 32 values declared as [2, 15]: the model wants 16 per row.
    let (_, mut bad) = request(9);
    bad.inputs[0].shape = vec![2, 15];
    match client.infer(bad).await {
        Err(ClientError::Status(s)) => assert_eq!(s.code(), Code::InvalidArgument, "{s}"),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }

    for i in 0..5 {
        let (input, req) = request(10 + i);
        let resp = client.infer(req).await.unwrap();
        assert_eq!(dense::output(&resp).0, dense::forward(&input));
    }
    let shm = client.path_counters().get(Path::Shm);
    assert_eq!(
        shm.successes, 10,
        "shared memory still carries the good requests"
    );
    assert_eq!(shm.fallbacks, 0, "the path was not marked broken: {shm:?}");
    assert_eq!(client.node_stats()[&agent.oip.to_string()].failures, 0);
}
