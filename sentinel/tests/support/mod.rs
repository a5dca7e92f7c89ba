//! Virtual-time harness shared by the integration tests: a [`Sentinel`], a
//! clock that only moves when told, and a model of the worker process that
//! checks every action the sentinel emits.

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use infermesh_sentinel::{Action, Event, Notice, Sentinel, SentinelConfig, State};

/// The simulated worker process, as the driver would see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// Nothing running.
    Absent,
    /// `Spawn` received; `Spawned`/`SpawnFailed` not yet reported.
    Pending,
    /// Running.
    Alive,
}

/// A sentinel under test, driven in virtual time.
pub struct Sim {
    pub sentinel: Sentinel,
    pub t0: Instant,
    pub now: Instant,
    pub process: Process,
    /// A `Kill` is outstanding for the current process.
    pub kill_requested: bool,
    /// Whether the process model must agree with the sentinel's actions.
    /// Off when tests feed arbitrary, possibly impossible, event sequences.
    pub strict: bool,
    /// Routing as set by the last `StopRouting`/`ResumeRouting`.
    pub routing: bool,
    /// State as set by the last `SetState`.
    pub advertised: State,
    /// Every notice emitted, with its time since `t0`.
    pub notices: Vec<(Duration, Notice)>,
}

impl Sim {
    /// Creates and starts a sentinel.
    pub fn start(config: SentinelConfig, seed: u64, strict: bool) -> Self {
        let now = Instant::now();
        let mut sim = Self {
            sentinel: Sentinel::new(config, seed),
            t0: now,
            now,
            process: Process::Absent,
            kill_requested: false,
            strict,
            routing: false,
            advertised: State::Starting,
            notices: Vec::new(),
        };
        let actions = sim.sentinel.start(now);
        assert_eq!(actions, [Action::SetState(State::Starting), Action::Spawn]);
        sim.apply(&actions);
        sim
    }

    /// Whether `event` could really happen to the modelled process.
    pub fn is_possible(&self, event: &Event) -> bool {
        match event {
            Event::Spawned | Event::SpawnFailed { .. } => self.process == Process::Pending,
            Event::BecameReady | Event::Exited { .. } => self.process == Process::Alive,
            _ => true,
        }
    }

    /// `event` if it could really happen to the modelled process, otherwise
    /// what the process would most plausibly do next.
    pub fn realistic(&self, event: Event) -> Event {
        if self.is_possible(&event) {
            return event;
        }
        match self.process {
            Process::Pending => Event::Spawned,
            Process::Alive if self.kill_requested => Event::Exited {
                code: None,
                signal: Some(15),
            },
            Process::Alive => Event::BecameReady,
            Process::Absent => Event::Tick,
        }
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Delivers `event` at the current time and checks the actions.
    pub fn send(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::Spawned if self.process == Process::Pending => self.process = Process::Alive,
            Event::SpawnFailed { .. } if self.process == Process::Pending => {
                self.process = Process::Absent
            }
            Event::Exited { .. } => {
                self.process = Process::Absent;
                self.kill_requested = false;
            }
            _ => {}
        }
        let actions = self.sentinel.handle(self.now, event);
        self.apply(&actions);
        actions
    }

    /// Jumps to the sentinel's next timer, if any, and ticks.
    pub fn fire(&mut self) -> Option<Vec<Action>> {
        let deadline = self.sentinel.poll_timeout()?;
        self.now = self.now.max(deadline);
        Some(self.send(Event::Tick))
    }

    /// Plays a well-behaved driver and process for at most `max_steps`
    /// events: spawns succeed, the process becomes ready at once, kills end in
    /// an exit, probes and health checks pass, drains are lifted and timers
    /// fire on time. Returns the state reached.
    pub fn settle(&mut self, max_steps: usize) -> State {
        for _ in 0..max_steps {
            match self.sentinel.state() {
                State::Ready | State::Quarantined => break,
                State::Starting if self.process == Process::Pending => {
                    self.send(Event::Spawned);
                }
                State::Starting => {
                    self.send(Event::BecameReady);
                }
                State::Failed => {
                    self.send(Event::Exited {
                        code: None,
                        signal: Some(15),
                    });
                }
                State::Backoff => {
                    self.fire().expect("backoff has a deadline");
                }
                State::Degraded => {
                    self.send(Event::ProbeOk);
                    self.send(Event::Health {
                        pass: true,
                        reason: "ok".into(),
                    });
                }
                State::Draining => {
                    self.send(Event::Undrain);
                }
            }
        }
        self.sentinel.state()
    }

    /// Time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.t0
    }

    fn apply(&mut self, actions: &[Action]) {
        for action in actions {
            match action {
                Action::Spawn => {
                    if self.strict {
                        assert_eq!(
                            self.process,
                            Process::Absent,
                            "Spawn while the previous process may be alive"
                        );
                    }
                    self.process = Process::Pending;
                    self.kill_requested = false;
                }
                Action::Kill { .. } => {
                    if self.strict {
                        assert_ne!(self.process, Process::Absent, "Kill without a process");
                    }
                    self.kill_requested = true;
                }
                Action::AbortInFlight => {
                    if self.strict {
                        assert_ne!(self.process, Process::Absent, "abort without a process");
                    }
                }
                Action::StopRouting => self.routing = false,
                Action::ResumeRouting => self.routing = true,
                Action::SetState(state) => self.advertised = *state,
                Action::Emit(notice) => self.notices.push((self.elapsed(), notice.clone())),
            }
        }
        assert_eq!(
            self.routing,
            self.sentinel.routable(),
            "routing actions disagree with routable() after {actions:?}"
        );
        assert_eq!(
            self.advertised,
            self.sentinel.state(),
            "SetState disagrees with state() after {actions:?}"
        );
    }
}
