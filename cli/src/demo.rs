//! `infermesh demo`: the whole system on one machine, under load, through a
//! crash and a slowdown.
//!
//! Three agents run in this process ([`fleet`]), each supervising test
//! workers of a different speed; callers send requests through the client
//! library ([`load`]); a table redrawn every second ([`table`]) shows where
//! the requests go and what the agents report; at one third of the run the
//! local node's worker crashes with a CUDA error, at two thirds a remote
//! node turns slow; the end prints how the fleet coped ([`summary`]).

mod fleet;
mod live;
mod load;
mod summary;
mod table;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;

use crate::exit;
use crate::say::say;
use fleet::{Fleet, Injection, PLAN, ZkRegistry, unix_micros};
use live::{Live, event_line, role};
use load::Recorder;

/// `infermesh demo --help`.
pub const ABOUT: &str = "\
Run a small infermesh fleet on this machine and watch it handle a crash and a slowdown.

Three agents start in this process, each supervising infermesh-testworker processes (CPU
workers emulating GPU inference): node-a, the local node (1 worker, 2 ms per request), node-b
(2 workers, 4 ms) and node-c (1 worker, 8 ms). --concurrency callers send the dense model's
1x16 FP32 request through the client library, which prefers the local node and spreads the rest
over the remote nodes by power-of-two-choices. A table redrawn every second shows, per node,
requests/s, share, client-side p99, the worker states the agent reports (admin Status), restarts
and failed attempts (each retried on another node).

At 1/3 of --duration the local node's worker crashes with a CUDA error: its agent stops routing
to it and restarts it, and the client retries elsewhere. At 2/3 node-c's worker turns 10x slower
and traffic moves away from it. The summary gives each node's share before and after each event,
failover times from the client's side and from the agent's event log, and how much traffic left
the slow node. Exit 0 when no request failed, 1 otherwise.

By default the client finds the agents through the embedded static:// registry. With
--zookeeper the agents register in that ZooKeeper and the client discovers them through it;
ZooKeeper must be running already (e.g. Debian's `zookeeper` package: apt-get install
zookeeper, then /usr/share/zookeeper/bin/zkServer.sh start).

infermesh-testworker must sit next to this binary:
  cargo build --release -p infermesh -p infermesh-testworker   (scripts/demo.sh does it)";

/// Run a small infermesh fleet on this machine and watch it handle a crash and a slowdown.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long to drive load; the crash comes at 1/3, the slowdown at 2/3.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Callers, each sending one request at a time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// Register the agents in this ZooKeeper and discover them through it instead of the
    /// static:// list, e.g. zk://127.0.0.1:2181/infermesh. ZooKeeper must be running.
    #[arg(long, value_name = "URL")]
    zookeeper: Option<String>,
    /// Service name the agents register under (with --zookeeper).
    #[arg(long, default_value = "demo")]
    service: String,
    /// File the agents' and workers' logs go to (RUST_LOG sets the level, default info).
    #[arg(long, default_value = "/tmp/infermesh-demo.log")]
    log_file: PathBuf,
    /// Print the summary as one JSON object on stdout, and nothing else
    /// there (the table and the text summary go to stderr).
    #[arg(long)]
    json: bool,
}

pub fn main(args: DemoArgs) -> i32 {
    crate::say::json_on_stdout(args.json);
    if args.duration < Duration::from_secs(3) {
        eprintln!("error: --duration must be at least 3s (a crash and a slowdown happen in it)");
        return exit::USAGE;
    }
    if let Err(e) = init_logging(&args.log_file) {
        eprintln!(
            "error: cannot write the log file {}: {e}",
            args.log_file.display()
        );
        return exit::FAILURE;
    }
    let testworker = match testworker_path() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::UNAVAILABLE;
        }
    };
    // Worker threads live as long as the runtime: workers spawned from them
    // keep their parent-death signal until the demo ends.
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(run(args, testworker))
}

/// Sends every log line (the agents', the client's, the workers' output)
/// to `path`, so the terminal shows only the table.
fn init_logging(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    Ok(())
}

fn testworker_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let path = exe.with_file_name("infermesh-testworker");
    if path.is_file() {
        Ok(path)
    } else {
        let release = exe
            .parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "release");
        let profile = if release { " --release" } else { "" };
        Err(format!(
            "{} not found: the demo runs test workers from next to this binary; build them with \
             `cargo build{profile} -p infermesh-testworker` (scripts/demo.sh builds both)",
            path.display()
        ))
    }
}

async fn run(args: DemoArgs, testworker: PathBuf) -> i32 {
    let zk = args.zookeeper.clone().map(|url| ZkRegistry {
        url,
        service: args.service.clone(),
    });
    say!(
        "starting 3 agents with test workers (logs: {})",
        args.log_file.display()
    );
    let mut fleet = match Fleet::start(&testworker, zk.as_ref()).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let outcome = demo(&args, &fleet, zk.as_ref()).await;
    let pids = worker_pids(&fleet).await;
    say!("stopping the agents (they drain, then stop their workers)");
    fleet.stop().await;
    let strays = strays(&pids);
    if !strays.is_empty() {
        eprintln!("error: worker processes still running after the agents stopped: {strays:?}");
    }
    match outcome {
        Ok(ok) if ok && strays.is_empty() => exit::OK,
        Ok(_) => exit::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            exit::FAILURE
        }
    }
}

/// Runs the load and the injections; returns whether every request succeeded.
async fn demo(args: &DemoArgs, fleet: &Fleet, zk: Option<&ZkRegistry>) -> Result<bool, String> {
    fleet.wait_ready(Duration::from_secs(60)).await?;
    for (n, plan) in fleet.nodes.iter().zip(&PLAN) {
        say!(
            "  {:<7} {:<6} OIP {:<21} admin {:<21} {} worker(s), {} ms per request",
            n.name,
            role(n.name),
            n.oip,
            n.admin,
            plan.workers,
            plan.service_time_ms
        );
    }
    let (registry, ids): (String, Vec<String>) = match zk {
        Some(z) => (
            z.url.clone(),
            fleet.nodes.iter().map(|n| n.name.to_string()).collect(),
        ),
        None => {
            let ids: Vec<String> = fleet.nodes.iter().map(|n| n.oip.to_string()).collect();
            (format!("static://{}", ids.join(",")), ids)
        }
    };
    let client = infermesh_client::Client::builder()
        .registry(registry.clone())
        .service(args.service.clone())
        .local_node(ids[0].clone())
        .deadline(Duration::from_secs(5))
        .build()
        .await
        .map_err(|e| format!("client: {e}"))?;
    wait_for_membership(&client, &ids).await?;
    say!(
        "driving load through the client library ({registry}): {} callers for {:?}; \
         cuda-crash into node-a at {:.0} s, node-c slowed down at {:.0} s",
        args.concurrency,
        args.duration,
        args.duration.as_secs_f64() / 3.0,
        args.duration.as_secs_f64() * 2.0 / 3.0
    );

    let recorder = Arc::new(Recorder::new(&ids));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let start_us = unix_micros();
    let end = start + args.duration;
    let callers = load::start(&client, &recorder, args.concurrency, end, &stop);
    let mut live = Live::new(
        fleet,
        &client,
        &ids,
        start_us,
        args.duration,
        args.concurrency,
    );
    let crash_at = start + args.duration / 3;
    let slow_at = start + args.duration * 2 / 3;
    let (mut crash, mut slow): (Option<Injection>, Option<Injection>) = (None, None);
    let (mut crash_tried, mut slow_tried) = (false, false);
    let mut failed_local_at_crash = 0;
    let mut failed_local_at_slow = None;
    let mut log = Vec::new();
    let mut last_tick = start;
    let mut next_tick = start + Duration::from_secs(1);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let mut wake = next_tick.min(end);
        if !crash_tried {
            wake = wake.min(crash_at);
        }
        if !slow_tried {
            wake = wake.min(slow_at);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = &mut ctrl_c => {
                log.push(event_line(unix_micros() - start_us, "interrupted: stopping early"));
                break;
            }
        }
        let now = Instant::now();
        if !crash_tried && now >= crash_at {
            crash_tried = true;
            failed_local_at_crash = live.failed_attempts()[0];
            crash = live
                .inject(
                    0,
                    "cuda-crash",
                    "the worker aborts with a CUDA error",
                    &mut log,
                )
                .await;
        }
        if !slow_tried && now >= slow_at {
            slow_tried = true;
            failed_local_at_slow = Some(live.failed_attempts()[0]);
            let last = fleet.nodes.len() - 1;
            slow = live
                .inject(last, "slow", "its service time is now x10", &mut log)
                .await;
        }
        if now >= next_tick || now >= end {
            live.frame(&recorder, now - last_tick, &mut log).await;
            last_tick = now;
            next_tick += Duration::from_secs(1);
        }
        if now >= end {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in callers {
        let _ = c.await;
    }
    let end_us = unix_micros();
    // The last Status of each agent, for restarts and its event log.
    live.screen.finish();
    live.poll(&mut log).await;
    for line in log.drain(..) {
        say!("{line}");
    }

    let (successes, failures) = recorder.outcomes();
    let failed_attempts = live.failed_attempts();
    let names: Vec<&'static str> = fleet.nodes.iter().map(|n| n.name).collect();
    let s = summary::summarize(&summary::Inputs {
        names: &names,
        registry,
        concurrency: args.concurrency,
        start: start_us,
        end: end_us,
        successes: &successes,
        failures: &failures,
        crash: crash.as_ref(),
        slow: slow.as_ref(),
        statuses: &live.statuses,
        failed_attempts: &failed_attempts,
        failed_attempts_on_crashed: failed_local_at_slow.unwrap_or(failed_attempts[0])
            - failed_local_at_crash,
    });
    summary::print(&s);
    if args.json {
        println!("{}", serde_json::to_string(&s).expect("summary serializes"));
    }
    Ok(s.ok)
}

/// Waits until the client knows every node (through ZooKeeper this takes a
/// moment: each agent registers once a worker is ready).
async fn wait_for_membership(
    client: &infermesh_client::Client,
    ids: &[String],
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let known: BTreeSet<String> = client.nodes().into_iter().map(|r| r.node_id).collect();
        if ids.iter().all(|id| known.contains(id)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the client sees nodes {known:?} after 30 s, expected {ids:?} (is the registry reachable?)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Worker pids per the agents' last word, to check none outlives them.
async fn worker_pids(fleet: &Fleet) -> Vec<u32> {
    let mut pids = Vec::new();
    for n in &fleet.nodes {
        if let Ok(s) = n.status().await {
            pids.extend(s.workers.iter().map(|w| w.pid).filter(|&p| p != 0));
        }
    }
    pids
}

/// Those of `pids` still running as a test worker (not a zombie, not a
/// reused pid).
fn strays(pids: &[u32]) -> Vec<u32> {
    let alive: HashMap<u32, bool> = pids
        .iter()
        .map(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let running = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'));
            let ours = String::from_utf8_lossy(&cmdline).contains("infermesh-testworker");
            (pid, running && ours)
        })
        .collect();
    alive
        .into_iter()
        .filter(|&(_, a)| a)
        .map(|(p, _)| p)
        .collect()
}
