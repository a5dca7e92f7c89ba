//! The agent fronts two test workers: ModelInfer is proxied correctly in raw
//! and typed form, batches compute the documented math, traffic reaches both
//! workers, the metadata calls and the stream work, and each response
//! carries the load report.

use infermesh_proto::inference::*;
use infermesh_proto::load::LoadReport;
use infermesh_tests::{Agent, dense, testworker};

async fn two_worker_agent() -> Agent {
    Agent::builder()
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await
}

#[tokio::test]
async fn raw_batch_is_proxied_with_the_documented_math() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    let input = dense::input(3, 1);
    let resp = client
        .model_infer(dense::request(&input, true))
        .await
        .unwrap()
        .into_inner();
    let (out, raw) = dense::output(&resp);
    assert!(raw, "raw request gets a raw reply");
    assert_eq!(out, dense::forward(&input));
    assert_eq!(resp.outputs[0].shape, vec![3, 4]);
    assert_eq!(resp.outputs[0].datatype, "FP32");
    assert_eq!(resp.id, "req-1");
}

#[tokio::test]
async fn typed_batch_is_proxied_in_typed_form() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    let input = dense::input(5, 2);
    let resp = client
        .model_infer(dense::request(&input, false))
        .await
        .unwrap()
        .into_inner();
    let (out, raw) = dense::output(&resp);
    assert!(!raw, "typed request gets a typed reply");
    assert_eq!(out, dense::forward(&input));
    assert_eq!(resp.outputs[0].shape, vec![5, 4]);
}

#[tokio::test]
async fn requests_reach_both_workers() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    let input = dense::input(1, 3);
    for _ in 0..20 {
        client
            .model_infer(dense::request(&input, true))
            .await
            .unwrap();
    }
    let status = agent.status().await;
    let counts: Vec<u64> = status.workers.iter().map(|w| w.requests).collect();
    assert_eq!(counts.iter().sum::<u64>(), 20);
    assert!(
        counts.iter().all(|&n| n > 0),
        "both workers served requests: {counts:?}"
    );
}

#[tokio::test]
async fn responses_carry_a_load_report_in_trailers() {
    // A pinned weight: `auto` would advertise the measured capacity.
    let agent = Agent::builder()
        .config("weight = 1.0\n")
        .worker(testworker(""))
        .worker(testworker(""))
        .start()
        .await;
    let mut client = agent.client().await;
    let resp = client
        .model_infer(dense::request(&dense::input(1, 4), true))
        .await
        .unwrap();
    let report =
        LoadReport::from_metadata(resp.metadata()).expect("load report in trailing metadata");
    assert_eq!(
        report.in_flight, 0,
        "the report is taken after this request finished"
    );
    assert_eq!(
        report.weight, 1.0,
        "both workers ready, configured weight 1"
    );
    // Errors carry it too (trailers-only responses).
    let err = client
        .model_infer(ModelInferRequest {
            model_name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(LoadReport::from_metadata(err.metadata()).is_some());
}

#[tokio::test]
async fn metadata_calls_are_answered_from_the_workers() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    assert!(
        client
            .server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        client
            .server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = client
        .model_ready(ModelReadyRequest {
            name: "dense".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ready.ready);
    let meta = client
        .model_metadata(ModelMetadataRequest {
            name: "dense".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.inputs[0].name, "INPUT0");
    assert_eq!(meta.inputs[0].shape, vec![-1, 16]);
    assert_eq!(meta.outputs[0].shape, vec![-1, 4]);
    let config = client
        .model_config(ModelConfigRequest {
            name: "dense".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(config.input[0].data_type, DataType::TypeFp32 as i32);
    assert_eq!(config.output[0].dims, vec![-1, 4]);
    let server = client
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(server.name, "infermesh-agent");
    let index = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(index.models.len(), 1);
    assert_eq!(index.models[0].state, "READY");
}

#[tokio::test]
async fn statistics_sum_over_workers() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    for rows in [1, 2, 3, 4] {
        client
            .model_infer(dense::request(&dense::input(rows, 5), true))
            .await
            .unwrap();
    }
    let stats = client
        .model_statistics(ModelStatisticsRequest {
            name: "dense".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.model_stats.len(), 1);
    assert_eq!(
        stats.model_stats[0].inference_count, 10,
        "rows across both workers"
    );
    assert_eq!(
        stats.model_stats[0]
            .inference_stats
            .unwrap()
            .success
            .unwrap()
            .count,
        4
    );
}

#[tokio::test]
async fn stream_infer_is_proxied_both_ways() {
    let agent = two_worker_agent().await;
    let mut client = agent.client().await;
    let inputs: Vec<Vec<f32>> = (0..3).map(|i| dense::input(i + 1, i as u32)).collect();
    let requests: Vec<_> = inputs.iter().map(|x| dense::request(x, true)).collect();
    let mut responses = client
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    for x in &inputs {
        let msg = responses
            .message()
            .await
            .unwrap()
            .expect("one response per request");
        assert_eq!(msg.error_message, "");
        let (out, _) = dense::output(&msg.infer_response.unwrap());
        assert_eq!(out, dense::forward(x));
    }
    assert!(
        responses.message().await.unwrap().is_none(),
        "stream ends after the last response"
    );
}
