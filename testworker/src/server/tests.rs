use super::*;
use infermesh_proto::inference::model_infer_request::InferInputTensor;
use infermesh_proto::tensor::{f32_to_raw, raw_to_f32};

fn request(fault: Option<&str>) -> ModelInferRequest {
    let mut req = ModelInferRequest {
        model_name: "dense".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![f32_to_raw(&[0.25; 16]).into()],
        ..Default::default()
    };
    if let Some(kind) = fault {
        req.parameters.insert(
            FAULT_PARAMETER.into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(kind.into())),
            },
        );
    }
    req
}

fn outputs(resp: &ModelInferResponse) -> Vec<f32> {
    raw_to_f32(&resp.raw_output_contents[0]).unwrap()
}

#[tokio::test]
async fn sticky_cuda_error_fails_every_later_inference_but_stays_live() {
    let w = TestWorker::new(WorkerOptions::default());
    assert!(w.infer(request(None)).await.is_ok());
    let err = w.infer(request(Some("cuda-sticky"))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert!(err.message().contains("illegal memory access"));
    let again = w.infer(request(None)).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::Internal);
    use infermesh_proto::GrpcInferenceService;
    let live = w
        .server_live(Request::new(ServerLiveRequest {}))
        .await
        .unwrap();
    assert!(live.get_ref().live, "like Triton, it still reports live");
}

#[tokio::test]
async fn nan_fault_outputs_nan_after_the_configured_count() {
    let w = TestWorker::new(WorkerOptions {
        fault: Some(FaultKind::Nan),
        fault_after: 2,
        ..Default::default()
    });
    for _ in 0..2 {
        assert!(
            outputs(&w.infer(request(None)).await.unwrap())
                .iter()
                .all(|v| v.is_finite())
        );
    }
    assert!(
        outputs(&w.infer(request(None)).await.unwrap())
            .iter()
            .all(|v| v.is_nan())
    );
}

#[tokio::test(start_paused = true)]
async fn slow_fault_multiplies_service_time() {
    let w = TestWorker::new(WorkerOptions {
        service_time: Duration::from_millis(20),
        ..Default::default()
    });
    let t0 = tokio::time::Instant::now();
    w.infer(request(Some("slow"))).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn hang_fault_stops_answering_everything() {
    use infermesh_proto::GrpcInferenceService;
    let w = TestWorker::new(WorkerOptions::default());
    let hung = tokio::time::timeout(Duration::from_secs(30), w.infer(request(Some("hang")))).await;
    assert!(hung.is_err(), "the faulting request never answers");
    let live = tokio::time::timeout(
        Duration::from_secs(30),
        w.server_live(Request::new(ServerLiveRequest {})),
    )
    .await;
    assert!(live.is_err(), "liveness probes time out too");
}

#[tokio::test]
async fn unknown_fault_kind_is_invalid_argument() {
    let w = TestWorker::new(WorkerOptions::default());
    let err = w.infer(request(Some("meltdown"))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(w.infer(request(None)).await.is_ok());
}

#[tokio::test]
async fn model_config_says_the_slots_unless_turned_off() {
    use infermesh_proto::GrpcInferenceService;
    use infermesh_proto::inference::ModelConfigRequest;
    let req = || {
        Request::new(ModelConfigRequest {
            name: "dense".into(),
            version: String::new(),
        })
    };
    let w = TestWorker::new(WorkerOptions {
        concurrency: 4,
        ..Default::default()
    });
    let config = w
        .model_config(req())
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(config.instance_group[0].count, 4);
    let w = TestWorker::new(WorkerOptions {
        model_config: false,
        ..Default::default()
    });
    let err = w.model_config(req()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}
