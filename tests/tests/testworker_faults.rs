//! The test worker's `cuda-crash` fault looks like a real CUDA crash from
//! outside: the CUDA message and a stack line on stderr, then SIGABRT.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::ServerReadyRequest;
use infermesh_tests::{bin, dense, eventually, free_port};

#[tokio::test]
async fn cuda_crash_prints_the_cuda_error_and_aborts() {
    let port = free_port();
    let child = Command::new(bin("infermesh-testworker"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--fault",
            "cuda-crash",
            "--fault-after",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = eventually("worker serving", || async {
        let mut c = GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .ok()?;
        c.server_ready(ServerReadyRequest {}).await.ok()?;
        Some(c)
    })
    .await;
    let input = dense::input(1, 0);
    client
        .model_infer(dense::request(&input, true))
        .await
        .expect("first request is served");
    assert!(
        client
            .model_infer(dense::request(&input, true))
            .await
            .is_err(),
        "second request crashes it"
    );
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGABRT),
        "{:?}",
        out.status
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("CUDA error: an illegal memory access was encountered"),
        "{stderr}"
    );
    assert!(stderr.contains("c10_cuda_check_implementation"), "{stderr}");
}

#[test]
fn bad_flags_are_usage_errors() {
    let out = Command::new(bin("infermesh-testworker"))
        .args(["--fault", "meltdown"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cuda-crash"),
        "lists the valid kinds"
    );
    let out = Command::new(bin("infermesh-testworker"))
        .args(["--service-time-ms=-5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
