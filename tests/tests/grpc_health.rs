//! `grpc.health.v1.Health` on the OIP port with tonic-health's client: the
//! node and its models, and a `Watch` that follows a drain and an undrain.

use infermesh_proto::admin::{DrainRequest, UndrainRequest};
use infermesh_tests::{Agent, testworker};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn ask(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.into(),
    }
}

#[tokio::test]
async fn health_follows_readiness_and_drain() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", agent.oip))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "inference.GRPCInferenceService", "dense"] {
        let status = health
            .check(ask(service))
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let long = "m".repeat(1 << 16);
    let err = health.check(ask(&long)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().len() < 1024, "the name is echoed capped");

    let mut watch = health.watch(ask("")).await.unwrap().into_inner();
    let mut next = async || {
        watch
            .message()
            .await
            .unwrap()
            .expect("the watch stays open")
            .status
    };
    assert_eq!(next().await, ServingStatus::Serving as i32);
    let mut admin = agent.admin().await;
    admin.drain(DrainRequest::default()).await.unwrap();
    assert_eq!(next().await, ServingStatus::NotServing as i32, "drained");
    admin.undrain(UndrainRequest::default()).await.unwrap();
    assert_eq!(next().await, ServingStatus::Serving as i32, "undrained");

    let mut unknown = health.watch(ask("later")).await.unwrap().into_inner();
    let first = unknown.message().await.unwrap().unwrap().status;
    assert_eq!(first, ServingStatus::ServiceUnknown as i32);
}
