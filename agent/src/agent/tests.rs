//! The whole agent in-process under tokio's paused clock: in-process
//! workers ([`crate::testing`]) behind the real OIP port, called by a real
//! gRPC client.

use std::time::Duration;

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::inference::{ModelInferRequest, ServerReadyRequest};
use infermesh_proto::load::LoadReport;
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};
use infermesh_testworker::{WorkerOptions, dense};
use tonic::transport::Channel;

use super::*;
use crate::config::{RawConfig, RawQueue, RawWorker};
use crate::testing::FakeLauncher;

pub(super) fn config(max_inflight: usize, queue: usize) -> AgentConfig {
    let raw = RawConfig {
        node_id: Some("in-process".into()),
        listen: Some("127.0.0.1:0".into()),
        admin_listen: Some("127.0.0.1:0".into()),
        queue: RawQueue {
            capacity: Some(queue),
        },
        workers: vec![RawWorker {
            id: Some("w0".into()),
            command: "fake".into(),
            models: vec!["dense".into()],
            max_inflight: Some(max_inflight),
            ..Default::default()
        }],
        gpu: crate::config::RawGpu {
            backend: Some("off".into()),
            ..Default::default()
        },
        transport: crate::config::RawTransport {
            rdma: Some("off".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    AgentConfig::from_raw(raw).expect("valid config")
}

pub(super) async fn client(agent: &Agent) -> GrpcInferenceServiceClient<Channel> {
    let mut c = infermesh_proto::oip_client(
        &agent.listen().to_string(),
        Duration::from_secs(5),
        64 << 20,
    )
    .unwrap();
    loop {
        if let Ok(r) = c.server_ready(ServerReadyRequest {}).await {
            if r.get_ref().ready {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) fn request(model: &str, input: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: dense::INPUT.into(),
            datatype: "FP32".into(),
            shape: vec![
                (input.len() / dense::IN_FEATURES) as i64,
                dense::IN_FEATURES as i64,
            ],
            ..Default::default()
        }],
        raw_input_contents: vec![f32_to_raw(input).into()],
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn plain_requests_pass_through_with_exact_results_and_a_load_report() {
    let agent = Agent::start(config(4, 8), FakeLauncher::new(WorkerOptions::default()))
        .await
        .unwrap();
    let mut c = client(&agent).await;
    let input: Vec<f32> = (0..3 * dense::IN_FEATURES)
        .map(|i| i as f32 / 7.0)
        .collect();
    let resp = c.model_infer(request("dense", &input)).await.unwrap();
    let report = LoadReport::from_metadata(resp.metadata()).expect("load report in trailers");
    assert_eq!(report.in_flight, 0, "taken after this request ended");
    let out = raw_to_f32(&resp.get_ref().raw_output_contents[0]).unwrap();
    assert_eq!(out, dense::forward(&input));
    let stopped = agent.stop().await;
    assert_eq!(
        stopped,
        Stopped {
            requests_dropped: 0,
            tasks_left: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_models_are_not_found_with_a_capped_name_and_one_label() {
    let agent = Agent::start(config(4, 8), FakeLauncher::new(WorkerOptions::default()))
        .await
        .unwrap();
    let mut c = client(&agent).await;
    let name = "m".repeat(1 << 20);
    let err = c.model_infer(request(&name, &[0.0; 16])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().len() < 300, "{} bytes", err.message().len());
    for i in 0..50 {
        let _ = c
            .model_infer(request(&format!("made-up-{i}"), &[0.0; 16]))
            .await;
    }
    let text = agent.metrics().render(agent.pool());
    assert!(
        text.contains(r#"infermesh_requests_total{model="_unknown",code="NotFound"} 51"#),
        "{text}"
    );
    assert!(!text.contains("made-up"), "no label per made-up name");
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn stopping_with_a_thousand_queued_requests_is_bounded_and_leaves_nothing() {
    // One permit, a slow worker, a thousand callers queued behind it.
    let options = WorkerOptions {
        service_time: Duration::from_millis(100),
        concurrency: 1,
        ..WorkerOptions::default()
    };
    let mut cfg = config(1, 2000);
    cfg.drain_delay = Duration::from_secs(2);
    cfg.shutdown_grace = Duration::from_secs(5);
    let agent = Agent::start(cfg.clone(), FakeLauncher::new(options))
        .await
        .unwrap();
    // Several connections: one carries at most max_concurrent_streams.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&agent).await);
    }
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let mut c = clients[i % clients.len()].clone();
            tokio::spawn(async move { c.model_infer(request("dense", &[0.5; 16])).await })
        })
        .collect();
    while agent.pool().load().queued < 999 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let began = tokio::time::Instant::now();
    let stopped = agent.stop().await;
    let took = began.elapsed();
    assert!(
        took <= cfg.drain_delay + cfg.shutdown_grace + Duration::from_secs(11),
        "bounded: {took:?}"
    );
    assert!(stopped.requests_dropped > 0, "{stopped:?}");
    assert_eq!(stopped.tasks_left, 0);
    let (mut ok, mut failed) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
                    ),
                    "{s:?}"
                );
                failed += 1;
            }
        }
    }
    assert_eq!(ok + failed, 1000);
    // Served while draining and within the grace: ~ (2 s + 5 s) / 100 ms.
    assert!(ok >= 60, "{ok} served before the grace ran out");
}

#[tokio::test(start_paused = true)]
async fn idle_streams_hold_no_worker_permit() {
    use infermesh_proto::inference::ModelStreamInferResponse;
    use tokio_stream::StreamExt;

    let agent = Agent::start(config(4, 8), FakeLauncher::new(WorkerOptions::default()))
        .await
        .unwrap();
    let mut c = client(&agent).await;
    // 64 streams, each answered once, then left open and idle.
    let mut open = Vec::new();
    for _ in 0..64 {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request("dense", &[0.25; 16])).await.unwrap();
        let mut responses = c
            .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first: ModelStreamInferResponse = responses.next().await.unwrap().unwrap();
        assert!(first.error_message.is_empty(), "{}", first.error_message);
        open.push((tx, responses));
    }
    assert_eq!(
        agent.pool().worker_load(0).0,
        0,
        "no permit held by idle streams"
    );
    // Unary calls still get served at once.
    for _ in 0..10 {
        tokio::time::timeout(
            Duration::from_secs(1),
            c.model_infer(request("dense", &[0.5; 16])),
        )
        .await
        .expect("not starved")
        .unwrap();
    }
    // A stream request for a model its worker does not serve is answered in
    // the stream, and the stream goes on.
    let (tx, responses) = &mut open[0];
    tx.send(request("nope", &[0.0; 16])).await.unwrap();
    let err = responses.next().await.unwrap().unwrap();
    assert!(err.error_message.contains("nope"), "{}", err.error_message);
    tx.send(request("dense", &[0.25; 16])).await.unwrap();
    let ok = responses.next().await.unwrap().unwrap();
    assert!(ok.error_message.is_empty());
    drop(open);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_inference_stalls_is_restarted_and_its_callers_answered_at_once() {
    use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    // Two workers with the default stall watchdog.
    let mut cfg = config(4, 8);
    let mut second = cfg.workers[0].clone();
    second.id = "w1".into();
    cfg.workers.push(second);
    let agent = Agent::start(cfg, FakeLauncher::new(WorkerOptions::default()))
        .await
        .unwrap();
    let mut c = client(&agent).await;
    while !agent.pool().workers().iter().all(|w| w.snapshot().routable) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Both answer in well under a millisecond: their service times are known.
    for _ in 0..40 {
        c.model_infer(request("dense", &[0.5; 16])).await.unwrap();
    }
    // Inference on one of them blocks from now on; its probes still pass.
    let mut stuck = request("dense", &[0.5; 16]);
    stuck.parameters.insert(
        infermesh_proto::FAULT_PARAMETER.into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam("stall".into())),
        },
    );
    let blocked = {
        let mut c = c.clone();
        tokio::spawn(async move { c.model_infer(stuck).await })
    };
    let victim = loop {
        if let Some(i) = (0..2).find(|&i| agent.pool().worker_load(i).0 == 1) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let other = 1 - victim;
    // Load keeps coming meanwhile, a request every 100 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, unavailable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (c, stop, ok, unavailable) = (
            c.clone(),
            Arc::clone(&stop),
            Arc::clone(&ok),
            Arc::clone(&unavailable),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let mut c = c.clone();
                let (ok, unavailable) = (Arc::clone(&ok), Arc::clone(&unavailable));
                tokio::spawn(async move {
                    match c.model_infer(request("dense", &[0.5; 16])).await {
                        Ok(_) => ok.fetch_add(1, Ordering::SeqCst),
                        Err(s) if s.code() == tonic::Code::Unavailable => {
                            unavailable.fetch_add(1, Ordering::SeqCst)
                        }
                        Err(s) => panic!("{s:?}"),
                    };
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let started = tokio::time::Instant::now();
    let w = &agent.pool().workers()[victim];
    let mut rx = w.watch();
    let restarted = tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|s| s.restarts == 1))
        .await
        .expect("the stalled worker is restarted")
        .map(|s| s.clone())
        .unwrap();
    let took = started.elapsed();
    let fault = restarted.last_fault.as_deref().unwrap();
    assert!(fault.starts_with("stall: "), "{fault}");
    assert!(took < Duration::from_secs(10), "restarted after {took:?}");
    // The blocked caller was answered with a retryable status.
    let answer = blocked.await.unwrap().unwrap_err();
    assert_eq!(answer.code(), tonic::Code::Unavailable, "{answer:?}");
    let events: Vec<_> = w.log().events().into_iter().map(|e| e.kind).collect();
    assert!(events.contains(&"abort_in_flight"), "{events:?}");
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    // The other worker served throughout, untouched.
    let o = agent.pool().workers()[other].snapshot();
    assert_eq!((o.restarts, o.routable), (0, true));
    assert!(ok.load(Ordering::SeqCst) > 0);
    let text = agent.metrics().render(agent.pool());
    let id = w.id();
    assert!(
        text.contains(&format!(
            r#"infermesh_worker_faults_total{{worker="{id}",reason="stall"}} 1"#
        )),
        "{text}"
    );
    agent.stop().await;
}
