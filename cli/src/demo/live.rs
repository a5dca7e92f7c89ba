//! The demo's live view, driven once a second: polls each agent's admin
//! Status (worker states, restarts, new sentinel events), injects the
//! faults, and draws a [`table`](super::table) frame from the load's window.

use std::time::Duration;

use infermesh_client::Client;
use infermesh_proto::admin::StatusResponse;

use super::fleet::{self, Fleet, Injection, PLAN, unix_micros};
use super::load::Recorder;
use super::table::{Row, Screen};

/// `local` for this host's node, else `remote`.
pub fn role(name: &str) -> &'static str {
    if name == PLAN[0].name {
        "local"
    } else {
        "remote"
    }
}

/// What the live view needs between frames.
pub struct Live<'a> {
    fleet: &'a Fleet,
    client: &'a Client,
    ids: &'a [String],
    /// Where frames go.
    pub screen: Screen,
    /// Per node: the newest agent event already shown (Unix µs).
    seen: Vec<u64>,
    start_us: u64,
    duration: Duration,
    concurrency: u32,
    failed: u64,
    faults: Vec<String>,
    /// Each agent's last Status.
    pub statuses: Vec<Option<StatusResponse>>,
}

pub fn event_line(since_start_us: u64, text: &str) -> String {
    let line = format!("{:>8.3}s  {text}", since_start_us as f64 / 1e6);
    if line.chars().count() > 100 {
        let mut t: String = line.chars().take(99).collect();
        t.push('…');
        t
    } else {
        line
    }
}

impl<'a> Live<'a> {
    /// A view of `fleet` whose client-library node ids are `ids`; events
    /// before `start_us` (load start) are not shown.
    pub fn new(
        fleet: &'a Fleet,
        client: &'a Client,
        ids: &'a [String],
        start_us: u64,
        duration: Duration,
        concurrency: u32,
    ) -> Self {
        let n = fleet.nodes.len();
        Live {
            fleet,
            client,
            ids,
            screen: Screen::new(),
            seen: vec![start_us; n],
            start_us,
            duration,
            concurrency,
            failed: 0,
            faults: vec![String::new(); n],
            statuses: vec![None; n],
        }
    }

    /// Failed attempts per node so far, from the client library's counters.
    pub fn failed_attempts(&self) -> Vec<u64> {
        let stats = self.client.node_stats();
        self.ids
            .iter()
            .map(|id| stats.get(id).map_or(0, |s| s.failures))
            .collect()
    }

    /// Injects fault `kind` into `node` and logs it.
    pub async fn inject(
        &mut self,
        node: usize,
        kind: &str,
        what: &str,
        log: &mut Vec<String>,
    ) -> Option<Injection> {
        let at = unix_micros() - self.start_us;
        match fleet::inject(&self.fleet.nodes[node], kind).await {
            Ok(i) => {
                self.faults[node] = kind.to_string();
                log.push(event_line(
                    at,
                    &format!(
                        ">> injected {kind} into {}/{} ({}): {what}",
                        i.node, i.worker, i.address
                    ),
                ));
                Some(i)
            }
            Err(e) => {
                log.push(event_line(at, &format!(">> could not inject {kind}: {e}")));
                None
            }
        }
    }

    /// Reads every agent's Status; their new events go to `log`.
    pub async fn poll(&mut self, log: &mut Vec<String>) {
        let mut events = Vec::new();
        for (k, node) in self.fleet.nodes.iter().enumerate() {
            // On a failed poll the last Status seen stays.
            let Ok(s) = node.status().await else { continue };
            for w in &s.workers {
                // A worker that never restarted becoming stable is start-up noise.
                let shown = |kind: &str| kind != "stable" || w.restarts > 0;
                for e in w
                    .events
                    .iter()
                    .filter(|e| e.unix_micros > self.seen[k] && shown(&e.kind))
                {
                    let detail = if e.detail.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", e.detail)
                    };
                    events.push((
                        e.unix_micros,
                        format!("   {}/{} {}{detail}", node.name, w.id, e.kind),
                    ));
                }
            }
            if let Some(newest) = s
                .workers
                .iter()
                .flat_map(|w| w.events.iter().map(|e| e.unix_micros))
                .max()
            {
                self.seen[k] = self.seen[k].max(newest);
            }
            self.statuses[k] = Some(s);
        }
        events.sort_by_key(|(t, _)| *t);
        log.extend(
            events
                .into_iter()
                .map(|(t, text)| event_line(t.saturating_sub(self.start_us), &text)),
        );
    }

    /// Polls the agents and draws one frame from the window just ended
    /// (`span` long), `log` lines above it.
    pub async fn frame(&mut self, recorder: &Recorder, span: Duration, log: &mut Vec<String>) {
        self.poll(log).await;
        let window = recorder.take_window();
        self.failed += window.failed;
        let secs = span.as_secs_f64().max(1e-3);
        let total: u64 = window.ok.iter().sum();
        let failed_attempts = self.failed_attempts();
        let rows: Vec<Row> = self
            .fleet
            .nodes
            .iter()
            .enumerate()
            .map(|(k, n)| Row {
                name: n.name,
                role: role(n.name),
                rps: window.ok[k] as f64 / secs,
                share: if total == 0 {
                    0.0
                } else {
                    window.ok[k] as f64 / total as f64
                },
                p99_ms: (!window.latency[k].is_empty())
                    .then(|| window.latency[k].value_at_quantile(0.99) as f64 / 1000.0),
                workers: self.statuses[k]
                    .as_ref()
                    .map_or("unreachable".into(), worker_states),
                restarts: self.statuses[k]
                    .as_ref()
                    .map_or(0, |s| s.workers.iter().map(|w| w.restarts).sum()),
                errors: failed_attempts[k],
                fault: self.faults[k].clone(),
            })
            .collect();
        let elapsed = (unix_micros() - self.start_us) as f64 / 1e6;
        let header = format!(
            "t {:>5.1} s / {:.0} s   {} callers   {:>6.0} req/s   failed requests {}",
            elapsed.min(self.duration.as_secs_f64()),
            self.duration.as_secs_f64(),
            self.concurrency,
            total as f64 / secs,
            self.failed
        );
        // Injections are logged when made, the agents' events at the next
        // poll: order them by their (fixed-width, right-aligned) time.
        log.sort_by(|a, b| a.get(..9).cmp(&b.get(..9)));
        self.screen.frame(log, &header, &rows);
        log.clear();
    }
}

/// The node's state (when not serving) and each worker's, e.g. `ready ready`.
fn worker_states(s: &StatusResponse) -> String {
    let workers: Vec<&str> = s.workers.iter().map(|w| w.state.as_str()).collect();
    let workers = workers.join(" ");
    if s.state == "serving" {
        workers
    } else {
        format!("{}: {workers}", s.state)
    }
}
