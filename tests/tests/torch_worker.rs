//! `examples/torch-worker` — the PyTorch OIP worker `scripts/gpu-drill.sh`
//! runs on a GPU — behind a real agent, in its `--device numpy` mode (no
//! PyTorch in CI): its protocol side (metadata, raw and typed tensors, the
//! `infermesh_fault` parameter) is what runs here; its CUDA faults need a
//! GPU and are measured by the script.

use std::path::Path;

use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};
use infermesh_tests::{Agent, dense, py};
use tonic::Code;

fn worker_command() -> String {
    let python = py::ensure_venv(
        "torch-worker-venv",
        "import grpc, grpc_tools, numpy",
        &["grpcio", "grpcio-tools", "numpy"],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/torch-worker/torch_worker.py")
        .canonicalize()
        .unwrap();
    format!(
        "{} {} --listen 127.0.0.1:{{port}} --device numpy",
        python.display(),
        script.display()
    )
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{got:?} != {want:?}"
        );
    }
}

#[tokio::test]
async fn the_torch_worker_serves_dense_through_the_agent() {
    let command = tokio::task::spawn_blocking(worker_command).await.unwrap();
    let agent = Agent::builder().worker(command).start().await;
    let mut client = agent.client().await;
    for (rows, raw) in [(1, true), (5, false), (64, true)] {
        let input = dense::input(rows, rows as u32);
        let resp = client
            .model_infer(dense::request(&input, raw))
            .await
            .unwrap()
            .into_inner();
        let (output, was_raw) = dense::output(&resp);
        assert_eq!(was_raw, raw);
        assert_close(&output, &dense::forward(&input));
    }
    let status = agent.status().await;
    assert_eq!(
        status.workers[0].models,
        ["dense"],
        "learned from RepositoryIndex"
    );

    // The drill's fault parameter: a CUDA fault needs a GPU; a made-up one
    // is refused.
    for (fault, code) in [
        ("spin", Code::FailedPrecondition),
        ("meltdown", Code::InvalidArgument),
    ] {
        let mut req = dense::request(&dense::input(1, 0), true);
        req.parameters.insert(
            "infermesh_fault".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(fault.into())),
            },
        );
        let err = client.model_infer(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{fault}: {}", err.message());
    }
    // Still serving, never restarted.
    client
        .model_infer(dense::request(&dense::input(2, 1), true))
        .await
        .unwrap();
    assert_eq!(agent.status().await.workers[0].restarts, 0);
}
