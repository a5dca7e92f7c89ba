//! The demo's load: closed-loop callers sending the `dense` model's request
//! through the client library, and a [`Recorder`] that keeps every outcome
//! (for the summary) and a per-node window (for the live table).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use infermesh_client::{Client, ClientError};

use super::fleet::{dense_request, unix_micros};

/// A successful request.
#[derive(Debug, Clone, Copy)]
pub struct Success {
    /// When it was sent, Unix µs.
    pub sent: u64,
    /// When its answer came, Unix µs.
    pub done: u64,
    /// Index of the node that answered.
    pub node: usize,
}

/// A request that failed after the client's retries.
#[derive(Debug, Clone)]
pub struct Failure {
    /// gRPC code or error kind.
    pub code: String,
}

/// Successes per node since the last [`Recorder::take_window`].
pub struct Window {
    /// Requests answered by each node.
    pub ok: Vec<u64>,
    /// Their latency, µs, per node.
    pub latency: Vec<Histogram<u64>>,
    /// Requests that failed.
    pub failed: u64,
}

impl Window {
    fn new(nodes: usize) -> Self {
        Window {
            ok: vec![0; nodes],
            latency: (0..nodes).map(|_| histogram()).collect(),
            failed: 0,
        }
    }
}

/// Latency histogram: µs, 1 µs .. 100 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

struct State {
    successes: Vec<Success>,
    failures: Vec<Failure>,
    window: Window,
}

/// Every outcome of the run, shared by the callers.
pub struct Recorder {
    ids: HashMap<String, usize>,
    nodes: usize,
    state: Mutex<State>,
}

impl Recorder {
    /// A recorder for nodes whose client-library ids are `ids`, in order.
    pub fn new(ids: &[String]) -> Self {
        Recorder {
            ids: ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.clone(), i))
                .collect(),
            nodes: ids.len(),
            state: Mutex::new(State {
                successes: Vec::new(),
                failures: Vec::new(),
                window: Window::new(ids.len()),
            }),
        }
    }

    fn record(&self, sent: u64, outcome: Result<&str, String>) {
        let done = unix_micros();
        let mut s = self.state.lock().expect("recorder lock");
        match outcome {
            Ok(id) => {
                let Some(&node) = self.ids.get(id) else {
                    // A node the demo did not start answered: count it as a failure
                    // so it cannot go unnoticed.
                    s.window.failed += 1;
                    s.failures.push(Failure {
                        code: format!("unknown node {id}"),
                    });
                    return;
                };
                s.window.ok[node] += 1;
                s.window.latency[node].saturating_record(done.saturating_sub(sent).max(1));
                s.successes.push(Success { sent, done, node });
            }
            Err(code) => {
                s.window.failed += 1;
                s.failures.push(Failure { code });
            }
        }
    }

    /// The window since the last call; starts a new one.
    pub fn take_window(&self) -> Window {
        let mut s = self.state.lock().expect("recorder lock");
        std::mem::replace(&mut s.window, Window::new(self.nodes))
    }

    /// Everything recorded.
    pub fn outcomes(&self) -> (Vec<Success>, Vec<Failure>) {
        let s = self.state.lock().expect("recorder lock");
        (s.successes.clone(), s.failures.clone())
    }
}

fn error_code(e: &ClientError) -> String {
    match e {
        ClientError::Status(s) => format!("{:?}", s.code()),
        ClientError::NoNode { .. } => "NoNode".into(),
        other => other.to_string(),
    }
}

/// Starts `callers` tasks that send requests one at a time until `end` or
/// until `stop` is set.
pub fn start(
    client: &Client,
    recorder: &Arc<Recorder>,
    callers: u32,
    end: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..callers)
        .map(|_| {
            let (client, recorder, stop) = (client.clone(), Arc::clone(recorder), Arc::clone(stop));
            tokio::spawn(async move {
                let req = dense_request(None);
                while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                    let sent = unix_micros();
                    match client.infer_on(req.clone()).await {
                        Ok((_, node)) => recorder.record(sent, Ok(&node)),
                        Err(e) => {
                            recorder.record(sent, Err(error_code(&e)));
                            // A caller whose request failed backs off a little
                            // rather than spinning on an empty fleet.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// Failures counted by code.
pub fn by_code(failures: &[Failure]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for f in failures {
        *m.entry(f.code.clone()).or_default() += 1;
    }
    m
}
