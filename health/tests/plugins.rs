//! Every built-in check against a real test worker served in-process: each
//! passes on a healthy worker and fails on the fault it exists to catch.

mod fixture;

use std::time::{Duration, Instant};

use infermesh_health::{CheckFuture, Client, HealthCheck, Verdict, run_check};
use infermesh_testworker::dense;
use infermesh_testworker::fault::FaultKind;

use fixture::{Dir, Worker, build_check, closed_port_client, golden_json};

const DEADLINE: Duration = Duration::from_secs(30);

async fn verdict(check: &dyn HealthCheck, client: Client) -> Verdict {
    run_check(check, client, DEADLINE).await
}

async fn run(toml: &str, dir: &Dir, worker: &Worker) -> Verdict {
    let check = build_check(toml, dir);
    verdict(check.as_ref(), worker.client()).await
}

#[tokio::test]
async fn live_passes_on_a_worker_and_fails_when_nothing_listens() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let check = build_check(r#"kind = "live""#, &dir);
    let v = verdict(check.as_ref(), worker.client()).await;
    assert!(v.pass, "{v}");
    assert_eq!((v.check.as_str(), v.model.as_str()), ("live", ""));

    let v = verdict(check.as_ref(), closed_port_client()).await;
    assert!(!v.pass, "{v}");
    assert!(
        v.reason.starts_with("ServerLive failed: Unavailable"),
        "{v}"
    );
}

#[tokio::test]
async fn ready_passes_for_a_served_model_and_fails_for_an_unknown_one() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let v = run("kind = \"ready\"\nmodel = \"dense\"", &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.model, "dense");
    let v = run("kind = \"ready\"\nmodel = \"sparse\"", &dir, &worker).await;
    assert!(!v.pass, "{v}");
    assert_eq!(
        v.reason,
        "ModelReady answered ready=false for model 'sparse'"
    );
}

#[tokio::test]
async fn golden_passes_with_the_model_outputs_and_fails_when_they_differ() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let input: Vec<f32> = (0..32).map(|i| (i % 7) as f32 / 4.0 - 0.75).collect();
    let expected = dense::forward(&input);
    dir.write("good.json", golden_json(&input, &expected));
    let spec = "kind = \"golden\"\nmodel = \"dense\"\nrequest = \"good.json\"";
    let v = run(spec, &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(
        v.reason,
        "8 values in 1 output within atol 0.00001, rtol 0.0001"
    );

    let mut altered = expected.clone();
    altered[5] += 0.01;
    altered[6] -= 0.5;
    dir.write("altered.json", golden_json(&input, &altered));
    let v = run(
        "kind = \"golden\"\nmodel = \"dense\"\nrequest = \"altered.json\"",
        &dir,
        &worker,
    )
    .await;
    assert!(!v.pass, "{v}");
    assert!(v.reason.starts_with("OUTPUT0[1,1]: got "), "{v}");
    assert!(v.reason.contains("2 of 8 values differ"), "{v}");

    let sick = Worker::with_fault(FaultKind::Nan).await;
    let v = run(spec, &dir, &sick).await;
    assert!(!v.pass, "{v}");
    assert!(v.reason.starts_with("OUTPUT0[0,0]: got NaN"), "{v}");
    assert!(v.reason.contains("8 of 8 values differ"), "{v}");
}

#[tokio::test]
async fn shipped_golden_request_passes_on_the_test_worker() {
    let worker = Worker::healthy().await;
    let configs = Dir::at(fixture::configs_dir());
    let v = run(
        "kind = \"golden\"\nmodel = \"dense\"\nrequest = \"dense-golden.json\"\natol = 1e-6\nrtol = 0.0",
        &configs,
        &worker,
    )
    .await;
    assert!(v.pass, "{v}");
}

#[tokio::test]
async fn finite_fails_on_nan_outputs() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let spec = "kind = \"finite\"\nmodel = \"dense\"";
    let v = run(spec, &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.reason, "4 values in 1 output are finite");
    dir.write("probe.json", golden_json(&[0.1; 48], &[]));
    let with_file = "kind = \"finite\"\nmodel = \"dense\"\nrequest = \"probe.json\"";
    assert!(run(with_file, &dir, &worker).await.pass);

    let sick = Worker::with_fault(FaultKind::Nan).await;
    let v = run(spec, &dir, &sick).await;
    assert!(!v.pass, "{v}");
    assert_eq!(
        v.reason,
        "OUTPUT0[0,0] is NaN; 4 of 4 values are not finite"
    );
}

#[tokio::test]
async fn range_fails_on_nan_and_on_values_beyond_the_bounds() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let spec = "kind = \"range\"\nmodel = \"dense\"\nmin = -1.0\nmax = 1.0";
    let v = run(spec, &dir, &worker).await;
    assert!(v.pass, "{v}");
    assert_eq!(v.reason, "4 values within [-1, 1]");

    let v = run(
        "kind = \"range\"\nmodel = \"dense\"\nmax = -0.999",
        &dir,
        &worker,
    )
    .await;
    assert!(!v.pass, "{v}");
    assert!(
        v.reason
            .contains("is outside [-inf, -0.999]; 4 of 4 values are out of range"),
        "{v}"
    );

    let sick = Worker::with_fault(FaultKind::Nan).await;
    let v = run(spec, &dir, &sick).await;
    assert!(!v.pass, "{v}");
    assert!(v.reason.starts_with("OUTPUT0[0,0] = NaN is outside"), "{v}");
}

#[tokio::test]
async fn range_checks_row_sums() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let row: Vec<f32> = (0..16).map(|i| i as f32 / 16.0).collect();
    let sum: f64 = dense::forward(&row).iter().map(|&v| f64::from(v)).sum();
    dir.write("row.json", golden_json(&row, &[]));
    let spec = |target: f64| {
        format!(
            "kind = \"range\"\nmodel = \"dense\"\nrequest = \"row.json\"\noutput = \"OUTPUT0\"\nsum_to = {target:?}\nsum_tolerance = 1e-4"
        )
    };
    let v = run(&spec(sum), &dir, &worker).await;
    assert!(v.pass, "{v}");
    let v = run(&spec(sum + 0.5), &dir, &worker).await;
    assert!(!v.pass, "{v}");
    assert!(v.reason.starts_with("OUTPUT0 row 0 sums to"), "{v}");
}

#[tokio::test]
async fn latency_compares_the_probe_with_the_limit() {
    let (worker, dir) = (Worker::healthy().await, Dir::new());
    let v = run(
        "kind = \"latency\"\nmodel = \"dense\"\nmax = \"60s\"",
        &dir,
        &worker,
    )
    .await;
    assert!(v.pass, "{v}");
    assert!(v.latency > Duration::ZERO);
    let v = run(
        "kind = \"latency\"\nmodel = \"dense\"\nmax = \"0ns\"",
        &dir,
        &worker,
    )
    .await;
    assert!(!v.pass, "{v}");
    assert!(v.reason.ends_with("over the 0ns limit"), "{v}");
    let v = run(
        "kind = \"latency\"\nmodel = \"sparse\"\nmax = \"60s\"",
        &dir,
        &worker,
    )
    .await;
    assert!(
        !v.pass && v.reason.contains("unknown model 'sparse'"),
        "{v}"
    );
}

#[tokio::test]
async fn run_check_fails_a_check_that_outlives_its_deadline() {
    let (worker, dir) = (Worker::with_fault(FaultKind::Hang).await, Dir::new());
    let check = build_check("kind = \"finite\"\nmodel = \"dense\"", &dir);
    let started = Instant::now();
    let v = run_check(check.as_ref(), worker.client(), Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!v.pass);
    assert_eq!(v.reason, "timed out after 300ms");
    assert_eq!(v.latency, Duration::from_millis(300));
}

#[derive(Debug)]
struct Panics;

impl HealthCheck for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn model(&self) -> &str {
        "dense"
    }
    fn check<'a>(&'a self, _: Client) -> CheckFuture<'a> {
        Box::pin(async { panic!("plugin bug") })
    }
}

#[tokio::test]
async fn run_check_turns_a_panicking_plugin_into_a_failure() {
    let v = run_check(&Panics, closed_port_client(), DEADLINE).await;
    assert!(!v.pass);
    assert_eq!(v.reason, "check panicked: plugin bug");
    assert_eq!((v.check.as_str(), v.model.as_str()), ("panics", "dense"));
}
