//! Issue 26, GPU slices: a worker pinned to a MIG instance (by UUID) with
//! a CUDA MPS share gets them in its environment — a real agent starting
//! real worker processes (a shell that prints its CUDA variables, then
//! execs the test worker) over the fake GPU backend, which lists MIG
//! instances `MIG-fake-<gpu>-<i>` and says whether MPS runs. And
//! `--check-config` rejects a MIG UUID the host does not have and an MPS
//! share on a GPU without MPS. (No GPU here: the fake stands for NVML.)

use std::process::{Command, Output};

use infermesh_tests::{Agent, bin, eventually};

/// A worker `id` pinned by `gpu_lines` (TOML lines) that prints its CUDA
/// environment as one line before it serves.
fn worker(id: &str, gpu_lines: &str) -> String {
    format!(
        "[[workers]]\nid = \"{id}\"\n{gpu_lines}\ncommand = '''/bin/sh -c 'echo \
         \"cuda-env-of-$INFERMESH_WORKER_ID: $(env | grep ^CUDA_ | sort | tr \"\\n\" \" \")\"; \
         exec {} --listen 127.0.0.1:{{port}}' '''\n",
        bin("infermesh-testworker").display()
    )
}

fn fake_gpus(mps: bool) -> String {
    format!("[gpu]\nbackend = \"fake\"\nfake_devices = 2\nfake_mig_devices = 2\nfake_mps = {mps}\n")
}

fn check_config(toml: &str) -> Output {
    let dir = std::env::temp_dir().join(format!("infermesh-slices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("check-{:x}.toml", fxhash(toml)));
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(bin("infermesh"))
        .args(["agent", "--check-config", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env_remove("INFERMESH_REGISTRY")
        .env_remove("CUDA_MPS_PIPE_DIRECTORY")
        .output()
        .expect("run infermesh");
    let _ = std::fs::remove_file(&path);
    out
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[tokio::test]
async fn a_mig_uuid_and_an_mps_share_reach_the_workers_environment() {
    let config = format!(
        "{}{}{}",
        fake_gpus(true),
        worker(
            "sliced",
            "gpu = \"MIG-fake-1-0\"\nmps_thread_percentage = 30\nmps_memory_limit = \"2GiB\""
        ),
        worker("whole", "gpu = 0"),
    );
    // The same file passes the check: the instance exists and MPS runs.
    let ok = check_config(&config);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");

    let agent = Agent::builder().config(config).start().await;
    // The CUDA_* variables on the line worker `id` printed (the agent's log
    // adds the worker's id and stream after it).
    let line = |id: &str| {
        let log = agent.log_text();
        log.lines().find_map(|l| {
            let (_, printed) = l.split_once(&format!("cuda-env-of-{id}: "))?;
            let vars: Vec<String> = printed
                .split_whitespace()
                .filter(|v| v.starts_with("CUDA_"))
                .map(str::to_string)
                .collect();
            Some(vars)
        })
    };
    let sliced = eventually("the sliced worker's environment", || async {
        line("sliced")
    })
    .await;
    assert_eq!(
        sliced,
        [
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048MB",
            "CUDA_VISIBLE_DEVICES=MIG-fake-1-0",
        ],
    );
    let whole = eventually("the whole-GPU worker's environment", || async {
        line("whole")
    })
    .await;
    assert_eq!(whole, ["CUDA_VISIBLE_DEVICES=0"]);

    // The admin API says where each runs: the MIG instance's parent GPU.
    let status = agent.status().await;
    let by_id = |id: &str| status.workers.iter().find(|w| w.id == id).unwrap().clone();
    let s = by_id("sliced");
    assert_eq!(
        (
            s.gpu,
            s.gpu_device.as_str(),
            s.mps_thread_percentage,
            s.mps_memory_limit_mib
        ),
        (Some(1), "MIG-fake-1-0", 30, 2048)
    );
    let w = by_id("whole");
    assert_eq!(
        (w.gpu, w.gpu_device.as_str(), w.mps_thread_percentage),
        (Some(0), "0", 0)
    );
    // MIG memory is exported per instance.
    let metrics = agent.metrics().await;
    assert!(
        metrics.contains(r#"infermesh_gpu_mig_memory_total_bytes{gpu="1",uuid="MIG-fake-1-0"}"#),
        "{metrics}"
    );
}

#[test]
fn check_config_rejects_a_missing_mig_instance_and_a_share_without_mps() {
    let missing = check_config(&format!(
        "{}{}",
        fake_gpus(true),
        worker("lost", "gpu = \"MIG-fake-1-9\"")
    ));
    assert_eq!(missing.status.code(), Some(78), "{missing:?}");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("worker lost: no MIG instance MIG-fake-1-9 on this host")
            && err.contains("MIG-fake-1-0"),
        "{err}"
    );

    let no_mps = check_config(&format!(
        "{}{}",
        fake_gpus(false),
        worker("shared", "gpu = \"GPU-fake-1\"\nmps_thread_percentage = 50")
    ));
    assert_eq!(no_mps.status.code(), Some(78), "{no_mps:?}");
    let err = String::from_utf8_lossy(&no_mps.stderr);
    assert!(
        err.contains("worker shared: has an MPS share")
            && err.contains("MPS does not serve GPU GPU-fake-1"),
        "{err}"
    );

    // Without GPU telemetry the MPS daemon's pipe decides (none here), and
    // the MIG instance cannot be checked: a warning, not an error.
    let off = check_config(&format!(
        "[gpu]\nbackend = \"off\"\n{}{}",
        worker("blind", "gpu = \"MIG-abc\""),
        worker("hopeful", "gpu = 0\nmps_thread_percentage = 50"),
    ));
    assert_eq!(off.status.code(), Some(78), "{off:?}");
    let err = String::from_utf8_lossy(&off.stderr);
    assert!(
        err.contains("warning: worker blind: GPU telemetry is off")
            && err.contains("error: worker hopeful: has an MPS share")
            && err.contains("/tmp/nvidia-mps/control"),
        "{err}"
    );
    assert!(!err.contains("error: worker blind"), "{err}");
}
