//! Xid attribution across processes (issue 25): two real test workers on
//! one (fake) GPU. An application Xid whose kernel log line names a
//! *thread* of one worker's process — as the driver named a thread of a
//! PyTorch worker on a real H100 — restarts that worker alone, through the
//! real `/proc`; one that names no process restarts nobody and holds both
//! suspect.

use infermesh_proto::admin::{InjectGpuEventRequest, WorkerStatus, inject_gpu_event_request};
use infermesh_tests::{Agent, eventually, testworker};

fn config() -> String {
    format!(
        r#"
[gpu]
backend = "fake"
fake_devices = 1
[[workers]]
id = "w0"
command = "{w}"
gpu = 0
[[workers]]
id = "w1"
command = "{w}"
gpu = 0
"#,
        w = testworker("")
    )
}

async fn worker(agent: &Agent, id: &str) -> WorkerStatus {
    agent
        .status()
        .await
        .workers
        .into_iter()
        .find(|w| w.id == id)
        .unwrap()
}

fn status_field(pid: u32, field: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .parse()
        .ok()
}

/// A thread (not the main one) of a child process of `root` (the worker
/// shim the agent started: its child is the test worker).
fn thread_under(root: u32) -> u32 {
    let child = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| status_field(pid, "PPid:") == Some(root))
        .expect("the worker shim has a child");
    std::fs::read_dir(format!("/proc/{child}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&tid| tid != child)
        .expect("the test worker runs threads")
}

async fn inject(agent: &Agent, xid: u32, pid: Option<u32>) {
    agent
        .admin()
        .await
        .inject_gpu_event(InjectGpuEventRequest {
            gpu: 0,
            kind: Some(inject_gpu_event_request::Kind::Xid(xid)),
            pid,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn an_xid_restarts_only_the_worker_whose_thread_it_names() {
    let agent = Agent::builder().config(config()).start().await;
    assert_eq!(agent.status().await.kernel_log, "fake");
    let (w0, w1) = (worker(&agent, "w0").await, worker(&agent, "w1").await);
    let tid = thread_under(w0.pid);
    assert_ne!(
        status_field(tid, "Tgid:"),
        Some(tid),
        "a thread, not a process"
    );

    inject(&agent, 43, Some(tid)).await;
    let after = eventually("w0 restarted for the Xid", || async {
        let w = worker(&agent, "w0").await;
        (w.restarts == w0.restarts + 1 && w.routable).then_some(w)
    })
    .await;
    assert!(
        after
            .last_fault
            .starts_with(&format!("xid: GPU Xid 43 blamed on pid {tid}")),
        "{}",
        after.last_fault
    );
    let w1_now = worker(&agent, "w1").await;
    assert_eq!(
        (w1_now.restarts, w1_now.pid),
        (0, w1.pid),
        "the neighbour was left alone"
    );
    assert!(w1_now.events.iter().all(|e| e.kind != "stop_routing"));
    let metrics = agent.metrics().await;
    for line in [
        r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="43",attribution="worker"} 1"#,
        r#"infermesh_gpu_xids_total{gpu="0",xid="43",verdict="restart_worker"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
}

#[tokio::test]
async fn an_xid_that_names_no_process_holds_the_workers_suspect_and_restarts_nobody() {
    let agent = Agent::builder().config(config()).start().await;
    let before = agent.status().await.workers;
    inject(&agent, 31, None).await;
    eventually("both workers held suspect", || async {
        let s = agent.status().await;
        s.workers
            .iter()
            .all(|w| w.events.iter().any(|e| e.kind == "suspect"))
            .then_some(())
    })
    .await;
    let now = agent.status().await.workers;
    for (b, n) in before.iter().zip(&now) {
        assert_eq!(
            (n.restarts, n.pid, n.routable),
            (b.restarts, b.pid, true),
            "{}",
            n.id
        );
    }
    let metrics = agent.metrics().await;
    assert!(
        metrics.contains(
            r#"infermesh_gpu_xid_attributions_total{gpu="0",xid="31",attribution="unattributed"} 1"#
        ),
        "{metrics}"
    );
}
