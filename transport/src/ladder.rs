//! [`Ladder`]: per peer, the best transport path that works, with a circuit
//! breaker per (peer, path).
//!
//! Sans-IO: every input carries its `now`; nothing reads a clock.
//!
//! - [`Ladder::choose`] returns the first path, in the configured preference
//!   order, that the peer advertises, that this build supports and whose
//!   breaker is closed. gRPC is always last and always available.
//! - [`Ladder::on_failure`] opens the path's breaker and returns the next
//!   path down, on which the caller re-sends the same request: no request
//!   fails because a fast path broke.
//! - An open breaker waits `reprobe_after` (30 s), then admits one request as
//!   a probe (the next one to come after the wait; others keep falling
//!   through until it reports). The probe's success closes the breaker; its
//!   failure doubles the wait, up to `max_reprobe_after` (5 min). A probe
//!   that never reports is retried after another wait.
//! - A success on a path closes its breaker; failures of requests sent
//!   before the breaker opened do not extend the wait.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use infermesh_backoff::BackoffPolicy;

use crate::path::Path;

/// How a [`Ladder`] orders and re-probes paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LadderConfig {
    /// Paths best first; gRPC is moved (or added) last.
    pub preference: Vec<Path>,
    /// Paths this build implements; gRPC is always supported.
    pub supported: Vec<Path>,
    /// First wait before a broken path is tried again.
    pub reprobe_after: Duration,
    /// Longest wait, reached by doubling on failed probes.
    pub max_reprobe_after: Duration,
}

impl Default for LadderConfig {
    fn default() -> Self {
        Self {
            preference: Path::ALL.to_vec(),
            // RDMA lives in its own crate; its driver adds it when built.
            supported: vec![Path::Shm, Path::Grpc],
            reprobe_after: Duration::from_secs(30),
            max_reprobe_after: Duration::from_secs(300),
        }
    }
}

/// What happened on one path, all peers together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// Requests sent on the path (chosen, or fallen back to).
    pub attempts: u64,
    /// Requests that succeeded on it.
    pub successes: u64,
    /// Requests that failed on it.
    pub failures: u64,
    /// Failures re-sent on a path further down.
    pub fallbacks: u64,
}

/// A snapshot of every path's counters, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LadderCounters([PathCounters; Path::ALL.len()]);

impl LadderCounters {
    /// The counters of `path`.
    pub fn get(&self, path: Path) -> PathCounters {
        self.0[path.index()]
    }

    /// Every path with its counters, best first.
    pub fn iter(&self) -> impl Iterator<Item = (Path, PathCounters)> + '_ {
        Path::ALL.into_iter().zip(self.0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Open {
    /// When the next probe may go.
    retry_at: Instant,
    cooldown: Duration,
    /// Failures of this spell: the first one and each failed probe.
    failures: u32,
    /// A probe was admitted and has not reported yet.
    probing: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Breaker {
    open: Option<Open>,
}

impl Breaker {
    /// Whether a request may use the path now; admits a probe when due.
    fn admit(&mut self, now: Instant) -> bool {
        match &mut self.open {
            None => true,
            Some(o) if now >= o.retry_at => {
                o.probing = true;
                o.retry_at = now + o.cooldown;
                true
            }
            Some(_) => false,
        }
    }

    fn fail(&mut self, now: Instant, config: &LadderConfig) {
        self.open = Some(match self.open {
            None => Open {
                retry_at: now + config.reprobe_after,
                cooldown: config.reprobe_after,
                failures: 1,
                probing: false,
            },
            Some(o) if o.probing => {
                // One client re-probing one peer: nobody to desynchronise from,
                // so no jitter.
                let policy = BackoffPolicy::new(config.reprobe_after, config.max_reprobe_after)
                    .without_jitter();
                let failures = o.failures.saturating_add(1);
                let cooldown = policy.nominal(failures);
                Open {
                    retry_at: now + cooldown,
                    cooldown,
                    failures,
                    probing: false,
                }
            }
            Some(o) => o,
        });
    }
}

#[derive(Debug, Default)]
struct Peer {
    /// Paths the peer advertised at the last `choose`.
    advertised: Vec<Path>,
    breakers: [Breaker; Path::ALL.len()],
}

/// The transport ladder: path choice and breakers for every peer.
#[derive(Debug)]
pub struct Ladder {
    config: LadderConfig,
    peers: HashMap<String, Peer>,
    counters: [PathCounters; Path::ALL.len()],
}

impl Ladder {
    /// A ladder with no peers yet.
    pub fn new(mut config: LadderConfig) -> Self {
        let mut preference = Vec::with_capacity(Path::ALL.len());
        for p in config.preference.iter().copied() {
            if p != Path::Grpc && !preference.contains(&p) {
                preference.push(p);
            }
        }
        preference.push(Path::Grpc);
        config.preference = preference;
        if !config.supported.contains(&Path::Grpc) {
            config.supported.push(Path::Grpc);
        }
        Self {
            config,
            peers: HashMap::new(),
            counters: Default::default(),
        }
    }

    /// The configuration, with gRPC last and supported.
    pub fn config(&self) -> &LadderConfig {
        &self.config
    }

    /// The path to send the next request to `peer` on, given the paths it
    /// advertises (gRPC need not be listed).
    pub fn choose(&mut self, peer: &str, advertised: &[Path], now: Instant) -> Path {
        let state = peer_mut(&mut self.peers, peer);
        if state.advertised != advertised {
            state.advertised = advertised.to_vec();
        }
        let path = pick(&self.config, state, None, now);
        self.counters[path.index()].attempts += 1;
        path
    }

    /// The request on `path` succeeded: the path works for `peer`.
    pub fn on_success(&mut self, peer: &str, path: Path, _now: Instant) {
        self.counters[path.index()].successes += 1;
        if let Some(state) = self.peers.get_mut(peer) {
            state.breakers[path.index()].open = None;
        }
    }

    /// The request on `path` failed: opens the path's breaker for `peer` and
    /// returns the path to re-send the request on. A gRPC failure is not a
    /// transport fault and returns gRPC (the retry policy decides).
    pub fn on_failure(&mut self, peer: &str, path: Path, now: Instant) -> Path {
        self.counters[path.index()].failures += 1;
        if path == Path::Grpc {
            return Path::Grpc;
        }
        let state = peer_mut(&mut self.peers, peer);
        state.breakers[path.index()].fail(now, &self.config);
        let next = pick(&self.config, state, Some(path), now);
        self.counters[path.index()].fallbacks += 1;
        self.counters[next.index()].attempts += 1;
        next
    }

    /// Whether `path` is broken for `peer` and not yet due for a probe.
    pub fn is_broken(&self, peer: &str, path: Path, now: Instant) -> bool {
        self.peers
            .get(peer)
            .and_then(|p| p.breakers[path.index()].open)
            .is_some_and(|o| now < o.retry_at)
    }

    /// Forgets `peer` (it left the membership).
    pub fn forget(&mut self, peer: &str) {
        self.peers.remove(peer);
    }

    /// Every path's counters.
    pub fn counters(&self) -> LadderCounters {
        LadderCounters(self.counters)
    }
}

/// The state of peer `id`, created on first use (without allocating after).
fn peer_mut<'a>(peers: &'a mut HashMap<String, Peer>, id: &str) -> &'a mut Peer {
    if !peers.contains_key(id) {
        peers.insert(id.to_string(), Peer::default());
    }
    peers.get_mut(id).expect("inserted above")
}

/// The first admitted path in preference order, after `below` if given.
fn pick(config: &LadderConfig, peer: &mut Peer, below: Option<Path>, now: Instant) -> Path {
    let start = below
        .and_then(|b| config.preference.iter().position(|&p| p == b))
        .map_or(0, |i| i + 1);
    for &path in &config.preference[start..] {
        if path == Path::Grpc {
            return Path::Grpc;
        }
        if Some(path) == below {
            continue;
        }
        let usable = peer.advertised.contains(&path) && config.supported.contains(&path);
        if usable && peer.breakers[path.index()].admit(now) {
            return path;
        }
    }
    Path::Grpc
}

#[cfg(test)]
mod tests;
