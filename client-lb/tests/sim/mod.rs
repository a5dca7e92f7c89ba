//! A simulated heterogeneous cluster in virtual time, driven by closed-loop
//! callers through a [`Policy`]. Deterministic for a seed: no clock, no
//! sockets, no sleeping.
//!
//! A node of capacity `c` serves `c` requests at once, each for the base
//! service time ±25% (uniform), and queues the rest in arrival order. A
//! remote node is one network hop away each way; the local node none. One
//! node turns slow partway through, another is down for a while (it refuses
//! connections: a fast failure). Each caller sends a request, waits for the
//! reply and sends the next one at once; a failed attempt is retried once on
//! another node, as the driver will.

pub mod policy;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

pub use policy::Policy;

/// Attempts per request, the first included.
const MAX_ATTEMPTS: usize = 2;
/// How long a refused connection takes to fail, besides the network.
const REFUSE: Duration = Duration::from_millis(1);

/// The cluster and the load on it.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Concurrent requests each node serves; its advertised weight too.
    pub capacities: Vec<u32>,
    pub local: usize,
    pub service: Duration,
    /// One-way network delay to a remote node.
    pub hop: Duration,
    /// This node's service time is multiplied by `slowdown` from `slow_from`.
    pub slow_node: usize,
    pub slow_from: Duration,
    pub slowdown: u32,
    /// This node refuses connections during `down`.
    pub down_node: usize,
    pub down: Range<Duration>,
    pub callers: usize,
    pub length: Duration,
    pub seed: u64,
}

#[derive(Debug, Default)]
struct Node {
    capacity: u32,
    busy: u32,
    queue: VecDeque<usize>,
}

/// The nodes' true state.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Node>,
    down_node: usize,
    down: Range<Duration>,
}

impl Cluster {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn capacity(&self, node: usize) -> u32 {
        self.nodes[node].capacity
    }

    /// Requests at the node, served or queued.
    pub fn load(&self, node: usize) -> u64 {
        let n = &self.nodes[node];
        u64::from(n.busy) + n.queue.len() as u64
    }

    pub fn queued(&self, node: usize) -> u64 {
        self.nodes[node].queue.len() as u64
    }

    pub fn is_down(&self, node: usize, now: Duration) -> bool {
        node == self.down_node && self.down.contains(&now)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The caller starts a new request.
    Issue { caller: usize },
    /// The attempt reaches the node.
    Arrive { caller: usize, node: usize },
    /// The node finishes serving it.
    Done { caller: usize, node: usize },
    /// The reply (or the refusal) reaches the caller.
    Reply {
        caller: usize,
        node: usize,
        ok: bool,
    },
}

#[derive(Debug, Default, Clone)]
struct Caller {
    started: Duration,
    sent: Duration,
    tried: Vec<usize>,
}

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    pub policy: &'static str,
    pub length: Duration,
    /// Requests answered successfully within the run.
    pub ok: u64,
    /// Requests that failed on every attempt.
    pub errors: u64,
    /// Latencies of successful requests, retries included, sorted.
    pub latencies: Vec<Duration>,
    /// Attempts sent to each node before and after the slowdown.
    pub before: Vec<u64>,
    pub after: Vec<u64>,
}

impl Report {
    pub fn throughput(&self) -> f64 {
        self.ok as f64 / self.length.as_secs_f64()
    }

    pub fn mean(&self) -> Duration {
        let total: Duration = self.latencies.iter().sum();
        total / self.latencies.len().max(1) as u32
    }

    pub fn p99(&self) -> Duration {
        let i = (self.latencies.len() * 99 / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(i).copied().unwrap_or_default()
    }

    /// The node's share of attempts before the slowdown.
    pub fn share_before(&self, node: usize) -> f64 {
        self.before[node] as f64 / self.before.iter().sum::<u64>().max(1) as f64
    }

    /// The node's share of attempts after the slowdown.
    pub fn share_after(&self, node: usize) -> f64 {
        self.after[node] as f64 / self.after.iter().sum::<u64>().max(1) as f64
    }

    /// The node's share of all attempts.
    pub fn share(&self, node: usize) -> f64 {
        let all: u64 = self.before.iter().chain(&self.after).sum();
        (self.before[node] + self.after[node]) as f64 / all.max(1) as f64
    }
}

/// Runs `scenario` with `policy` choosing the nodes.
pub fn run(scenario: &Scenario, policy: &mut dyn Policy) -> Report {
    Run::new(scenario).go(policy)
}

struct Run<'a> {
    s: &'a Scenario,
    cluster: Cluster,
    callers: Vec<Caller>,
    events: BinaryHeap<Reverse<(Duration, u64, Event)>>,
    seq: u64,
    rng: SmallRng,
    report: Report,
}

impl<'a> Run<'a> {
    fn new(s: &'a Scenario) -> Self {
        let nodes = s
            .capacities
            .iter()
            .map(|&capacity| Node {
                capacity,
                ..Node::default()
            })
            .collect();
        let n = s.capacities.len();
        Self {
            s,
            cluster: Cluster {
                nodes,
                down_node: s.down_node,
                down: s.down.clone(),
            },
            callers: vec![Caller::default(); s.callers],
            events: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(s.seed),
            report: Report {
                policy: "",
                length: s.length,
                ok: 0,
                errors: 0,
                latencies: Vec::new(),
                before: vec![0; n],
                after: vec![0; n],
            },
        }
    }

    fn at(&mut self, time: Duration, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    fn go(mut self, policy: &mut dyn Policy) -> Report {
        self.report.policy = policy.name();
        for caller in 0..self.s.callers {
            self.at(Duration::ZERO, Event::Issue { caller });
        }
        while let Some(Reverse((now, _, event))) = self.events.pop() {
            if now >= self.s.length {
                break;
            }
            match event {
                Event::Issue { caller } => {
                    let c = &mut self.callers[caller];
                    c.started = now;
                    c.tried.clear();
                    self.attempt(now, caller, policy);
                }
                Event::Arrive { caller, node } => {
                    let n = &mut self.cluster.nodes[node];
                    if n.busy < n.capacity {
                        self.serve(now, caller, node);
                    } else {
                        n.queue.push_back(caller);
                    }
                }
                Event::Done { caller, node } => {
                    self.cluster.nodes[node].busy -= 1;
                    let back = now + self.hop(node);
                    self.at(
                        back,
                        Event::Reply {
                            caller,
                            node,
                            ok: true,
                        },
                    );
                    if let Some(next) = self.cluster.nodes[node].queue.pop_front() {
                        self.serve(now, next, node);
                    }
                }
                Event::Reply { caller, node, ok } => {
                    let c = &self.callers[caller];
                    let latency = now - c.sent;
                    policy.on_reply(now, node, latency, ok, &self.cluster);
                    if ok {
                        self.report.ok += 1;
                        self.report.latencies.push(now - c.started);
                        self.at(now, Event::Issue { caller });
                    } else if c.tried.len() < MAX_ATTEMPTS {
                        self.attempt(now, caller, policy);
                    } else {
                        self.report.errors += 1;
                        self.at(now, Event::Issue { caller });
                    }
                }
            }
        }
        self.report.latencies.sort_unstable();
        self.report
    }

    fn hop(&self, node: usize) -> Duration {
        if node == self.s.local {
            Duration::ZERO
        } else {
            self.s.hop
        }
    }

    fn attempt(&mut self, now: Duration, caller: usize, policy: &mut dyn Policy) {
        let Some(node) = policy.pick(now, &self.cluster, &self.callers[caller].tried) else {
            self.report.errors += 1;
            self.at(now + REFUSE, Event::Issue { caller });
            return;
        };
        let phase = if now < self.s.slow_from {
            &mut self.report.before
        } else {
            &mut self.report.after
        };
        phase[node] += 1;
        policy.on_send(now, node);
        let c = &mut self.callers[caller];
        c.sent = now;
        c.tried.push(node);
        let hop = self.hop(node);
        if self.cluster.is_down(node, now) {
            self.at(
                now + 2 * hop + REFUSE,
                Event::Reply {
                    caller,
                    node,
                    ok: false,
                },
            );
        } else {
            self.at(now + hop, Event::Arrive { caller, node });
        }
    }

    fn serve(&mut self, now: Duration, caller: usize, node: usize) {
        self.cluster.nodes[node].busy += 1;
        let mut service = self.s.service.mul_f64(self.rng.random_range(0.75..1.25));
        if node == self.s.slow_node && now >= self.s.slow_from {
            service *= self.s.slowdown;
        }
        self.at(now + service, Event::Done { caller, node });
    }
}
