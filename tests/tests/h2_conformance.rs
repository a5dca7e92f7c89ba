//! h2spec's server cases (147, `tests/src/h2spec`) against a real agent
//! (with a test worker) and against nghttpd, the reference that keeps the
//! port honest. Prints the table of both; fails when the agent fails a case
//! not in [`AGENT_KNOWN_FAILURES`] or passes one that is (the list only
//! shrinks), or when nghttpd fails a case not in [`NGHTTPD_KNOWN_FAILURES`].

use std::time::Duration;

use infermesh_tests::h2spec::{self, DataRequest, Outcome, Target};
use infermesh_tests::nghttpd::Nghttpd;
use infermesh_tests::{Agent, testworker};

/// Cases the agent fails today, each with what it does instead (issue 24).
/// Remove a line when its fix lands; the test fails while a listed case
/// passes.
const AGENT_KNOWN_FAILURES: &[(&str, &str)] = &[];

/// Cases nghttpd 1.52 (Debian 12) fails: its deliberate choices, not
/// faults of the port.
const NGHTTPD_KNOWN_FAILURES: &[(&str, &str)] = &[(
    "http2/5.1.1/2",
    "HEADERS on a stream id lower than the last is ignored, not a connection error",
)];

/// One wait for the next frame (h2spec's `--timeout`, 2 s by default):
/// only a failing case waits this long, and cases run in parallel.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Cases at once per server.
const PARALLEL: usize = 16;
/// A unary call the agent answers with a message (the flow-control cases
/// need response DATA; a GET gets a trailers-only answer).
const SERVER_LIVE: &str = "/inference.GRPCInferenceService/ServerLive";

fn unexpected<'a>(
    cases: &'a [h2spec::Case],
    outcomes: &'a [Outcome],
    known: &[(&str, &str)],
) -> (Vec<&'a str>, Vec<&'a str>) {
    let listed = |id: &str| known.iter().any(|(k, _)| *k == id);
    let mut failed = Vec::new();
    let mut stale = Vec::new();
    for (case, o) in cases.iter().zip(outcomes) {
        match (o.passed(), listed(&case.id)) {
            (false, false) => failed.push(case.id.as_str()),
            (true, true) => stale.push(case.id.as_str()),
            _ => {}
        }
    }
    (failed, stale)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_server_cases_against_the_agent_and_nghttpd() {
    let agent = Agent::builder().worker(testworker("")).start().await;
    let nghttpd = Nghttpd::start();
    let cases = h2spec::cases();
    assert_eq!(cases.len(), 147, "h2spec's server cases, --strict included");
    for (id, _) in AGENT_KNOWN_FAILURES.iter().chain(NGHTTPD_KNOWN_FAILURES) {
        assert!(cases.iter().any(|c| c.id == *id), "no case {id}");
    }

    let agent_target = Target {
        name: "agent",
        addr: agent.oip,
        path: "/".into(),
        data_request: DataRequest::Grpc(SERVER_LIVE),
        timeout: TIMEOUT,
    };
    let reference = Target {
        name: "nghttpd",
        addr: nghttpd.addr,
        path: "/".into(),
        data_request: DataRequest::Get,
        timeout: TIMEOUT,
    };
    let (agent_outcomes, reference_outcomes) = tokio::task::spawn_blocking(move || {
        let cases = h2spec::cases();
        std::thread::scope(|s| {
            let a = s.spawn(|| h2spec::run(&cases, &agent_target, PARALLEL));
            let r = s.spawn(|| h2spec::run(&cases, &reference, PARALLEL));
            (a.join().unwrap(), r.join().unwrap())
        })
    })
    .await
    .unwrap();

    println!(
        "{}",
        h2spec::table(
            &cases,
            &[("agent", &agent_outcomes), ("nghttpd", &reference_outcomes)]
        )
    );

    let (ref_failed, ref_stale) = unexpected(&cases, &reference_outcomes, NGHTTPD_KNOWN_FAILURES);
    if !ref_stale.is_empty() {
        println!("nghttpd now passes listed cases (another version?): {ref_stale:?}");
    }
    let (failed, stale) = unexpected(&cases, &agent_outcomes, AGENT_KNOWN_FAILURES);
    assert!(
        ref_failed.is_empty(),
        "nghttpd, the reference, fails cases it should pass (a fault of the port?): {ref_failed:?}"
    );
    assert!(
        failed.is_empty(),
        "the agent fails cases not in AGENT_KNOWN_FAILURES: {failed:?}"
    );
    assert!(
        stale.is_empty(),
        "the agent passes cases listed in AGENT_KNOWN_FAILURES; remove them: {stale:?}"
    );
}
