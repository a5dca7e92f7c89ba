//! The per-worker state machine.
//!
//! Like `quinn-proto`, it performs no I/O and reads no clock: the driver feeds
//! it [`Event`]s stamped with `now`, carries out the returned [`Action`]s in
//! order, and sends [`Event::Tick`] once [`Sentinel::poll_timeout`] has passed.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::error_window::ErrorWindow;
use crate::{Action, Event, FaultReason, GpuFaultSeverity, Notice, SentinelConfig, State};

/// Longest slice of an output line kept in a fault's detail, so that a
/// multi-megabyte line (a dumped tensor) does not end up in every log entry.
const MAX_LINE_IN_DETAIL: usize = 256;

/// What the sentinel knows about the worker's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    /// No process: never spawned, exited, or failed to spawn.
    Absent,
    /// [`Action::Spawn`] emitted; neither `Spawned` nor `SpawnFailed` yet.
    Spawning,
    /// The driver reported [`Event::Spawned`].
    Running,
}

/// Fault detection and restart policy for one worker process.
///
/// See the crate documentation for the state diagram.
#[derive(Debug, Clone)]
pub struct Sentinel {
    config: SentinelConfig,
    state: State,
    started: bool,
    process: Process,
    /// Whether a [`Action::Kill`] is outstanding for the current process, so
    /// a quarantine during a kill does not ask for a second one.
    kill_sent: bool,
    /// The fault whose restart waits for the process to exit.
    pending_restart: Option<FaultReason>,
    /// When the current process was spawned; the startup timeout runs from here.
    spawned_at: Option<Instant>,
    backoff_until: Option<Instant>,
    /// When the current process became ready; the stable period runs from here.
    ready_since: Option<Instant>,
    stable_reported: bool,
    /// An operator wants the worker drained, now or once it is next ready.
    drain_requested: bool,
    /// A fault happened since the worker was last ready.
    recovering: bool,
    probe_failures: u32,
    health_failures: u32,
    errors: ErrorWindow,
    /// An unattributed application Xid and when the suspicion lapses.
    suspect: Option<(u32, Instant)>,
    backoff: Backoff,
    restarts: u64,
    last_fault: Option<(FaultReason, String)>,
}

impl Sentinel {
    /// A sentinel in [`State::Starting`] with nothing spawned yet; call
    /// [`Sentinel::start`] next. `seed` drives the backoff jitter.
    pub fn new(config: SentinelConfig, seed: u64) -> Self {
        let errors = ErrorWindow::new(config.error_burst, config.error_window);
        let backoff = Backoff::new(config.backoff_base, config.backoff_cap, seed);
        Self {
            config,
            state: State::Starting,
            started: false,
            process: Process::Absent,
            kill_sent: false,
            pending_restart: None,
            spawned_at: None,
            backoff_until: None,
            ready_since: None,
            stable_reported: false,
            drain_requested: false,
            recovering: false,
            probe_failures: 0,
            health_failures: 0,
            errors,
            suspect: None,
            backoff,
            restarts: 0,
            last_fault: None,
        }
    }

    /// Spawns the first process: `[SetState(Starting), Spawn]`. Later calls
    /// (and a call after a quarantine) return nothing.
    pub fn start(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if !self.started && self.state != State::Quarantined {
            self.started = true;
            self.spawn(now, &mut out);
        }
        out
    }

    /// Feeds one event observed at `now`; returns what the driver must do, in
    /// order. Events that do not apply to the current state are ignored.
    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if self.state == State::Quarantined {
            // Terminal: only keep track of the process going away.
            if matches!(event, Event::Exited { .. } | Event::SpawnFailed { .. }) {
                self.process = Process::Absent;
            }
            return out;
        }
        match event {
            Event::GpuFault {
                xid,
                severity: GpuFaultSeverity::Quarantine,
                ..
            } => self.quarantine(xid, &mut out),
            Event::GpuSuspect { xid, window } => self.suspect(now, xid, window, &mut out),
            Event::Drain => self.drain(&mut out),
            Event::Undrain => self.undrain(&mut out),
            Event::Tick => self.tick(now, &mut out),
            event => match self.state {
                State::Starting => self.handle_starting(now, event, &mut out),
                State::Ready | State::Degraded | State::Draining => {
                    self.handle_up(now, event, &mut out)
                }
                State::Failed => self.handle_failed(now, event, &mut out),
                // No process to observe while waiting out the backoff.
                State::Backoff | State::Quarantined => {}
            },
        }
        out
    }

    /// The next instant at which [`Event::Tick`] must be sent: the end of the
    /// backoff, the startup deadline, or the end of the stable period. Killing
    /// needs no timer here: the driver escalates to SIGKILL after the grace.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Backoff => self.backoff_until,
            State::Starting if self.process != Process::Absent => self
                .spawned_at
                .and_then(|t| t.checked_add(self.config.startup_timeout)),
            State::Ready | State::Degraded | State::Draining if !self.stable_reported => self
                .ready_since
                .and_then(|t| t.checked_add(self.config.stable_period)),
            _ => None,
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether requests may be sent to the worker: only when
    /// [`State::Ready`] or [`State::Degraded`].
    pub fn routable(&self) -> bool {
        matches!(self.state, State::Ready | State::Degraded)
    }

    /// Total restarts scheduled since [`Sentinel::new`].
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Reason and detail of the most recent fault (or quarantine).
    pub fn last_fault(&self) -> Option<(FaultReason, &str)> {
        self.last_fault
            .as_ref()
            .map(|(reason, detail)| (*reason, detail.as_str()))
    }

    fn handle_starting(&mut self, now: Instant, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Spawned if self.process == Process::Spawning => {
                self.process = Process::Running;
                self.spawned_at = Some(now);
            }
            Event::SpawnFailed { error } if self.process == Process::Spawning => {
                self.process = Process::Absent;
                self.fail(now, FaultReason::SpawnFailed, error, out);
            }
            Event::BecameReady if self.process_alive() => {
                self.process = Process::Running;
                self.become_ready(now, out);
            }
            Event::Exited { code, signal } if self.process_alive() => {
                self.process = Process::Absent;
                self.fail(now, FaultReason::Exit, exit_detail(code, signal), out);
            }
            // A process that is still starting can already be broken or stuck.
            event if self.process_alive() => self.handle_hard_fault(now, event, out),
            _ => {}
        }
    }

    fn handle_up(&mut self, now: Instant, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Exited { code, signal } => {
                self.process = Process::Absent;
                self.fail(now, FaultReason::Exit, exit_detail(code, signal), out);
            }
            Event::Health { pass: true, .. } => {
                self.health_failures = 0;
                self.maybe_recover(out);
            }
            Event::Health { pass: false, .. } | Event::ProbeTimeout | Event::RequestError
                if self.suspected(now).is_some() =>
            {
                let xid = self.suspected(now).unwrap_or_default();
                let what = match event {
                    Event::Health { reason, .. } => format!("failed a health check ({reason})"),
                    Event::ProbeTimeout => "did not answer its liveness probe".to_string(),
                    _ => "failed a request".to_string(),
                };
                let detail = format!(
                    "GPU Xid {xid} on its GPU named no process, and the worker then {what}"
                );
                self.fail(now, FaultReason::Xid, detail, out);
            }
            Event::Health {
                pass: false,
                reason,
            } => {
                self.health_failures = self.health_failures.saturating_add(1);
                let n = self.health_failures;
                if n >= self.config.health_failure_threshold.max(1) {
                    let detail = format!("{n} consecutive health-check failures: {reason}");
                    self.fail(now, FaultReason::Health, detail, out);
                } else {
                    self.degrade(out);
                }
            }
            Event::ProbeOk => {
                self.probe_failures = 0;
                self.maybe_recover(out);
            }
            Event::ProbeTimeout => {
                self.probe_failures = self.probe_failures.saturating_add(1);
                let n = self.probe_failures;
                if n >= self.config.probe_failure_threshold.max(1) {
                    let detail = format!("{n} consecutive liveness probe timeouts");
                    self.fail(now, FaultReason::Hang, detail, out);
                } else {
                    self.degrade(out);
                }
            }
            Event::Progress(progress) => {
                if let Some(detail) = self.config.stall.verdict(&progress) {
                    self.fail(now, FaultReason::Stall, detail, out);
                }
            }
            Event::RequestError => {
                if self.errors.record(now) {
                    let detail = format!(
                        "{} internal request errors within {:?}",
                        self.config.error_burst.max(1),
                        self.config.error_window
                    );
                    self.fail(now, FaultReason::ErrorBurst, detail, out);
                }
            }
            event => self.handle_hard_fault(now, event, out),
        }
    }

    /// Faults that apply the same way whether the process is starting or up.
    fn handle_hard_fault(&mut self, now: Instant, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::FaultLine { pattern, line } => {
                let detail = format!("output matched {pattern:?}: {}", truncate(&line));
                self.fail(now, FaultReason::FaultPattern, detail, out);
            }
            Event::GpuFault {
                xid,
                severity: GpuFaultSeverity::Restart,
                pid,
            } => {
                let detail = match pid {
                    Some(pid) => format!(
                        "GPU Xid {xid} blamed on pid {pid} of this worker requires a worker restart"
                    ),
                    None => format!("GPU Xid {xid} requires a worker restart"),
                };
                self.fail(now, FaultReason::Xid, detail, out);
            }
            Event::Restart => {
                let detail = "operator requested a restart".to_string();
                self.fail(now, FaultReason::Operator, detail, out);
            }
            _ => {}
        }
    }

    fn handle_failed(&mut self, now: Instant, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Spawned if self.process == Process::Spawning => {
                // Spawned just as it was killed: the outstanding Kill covers it.
                self.process = Process::Running;
            }
            Event::SpawnFailed { .. } if self.process == Process::Spawning => {
                self.process_gone(now, out);
            }
            Event::Exited { .. } if self.process_alive() => self.process_gone(now, out),
            _ => {}
        }
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let due = self.poll_timeout().is_some_and(|deadline| now >= deadline);
        if !due {
            return;
        }
        match self.state {
            State::Backoff => {
                self.backoff_until = None;
                self.spawn(now, out);
            }
            State::Starting => {
                let detail = format!("not ready {:?} after spawn", self.config.startup_timeout);
                self.fail(now, FaultReason::StartupTimeout, detail, out);
            }
            State::Ready | State::Degraded | State::Draining => {
                self.stable_reported = true;
                self.backoff.reset();
                out.push(Action::Emit(Notice::Stable));
            }
            State::Failed | State::Quarantined => {}
        }
    }

    fn drain(&mut self, out: &mut Vec<Action>) {
        self.drain_requested = true;
        if self.routable() {
            out.push(Action::StopRouting);
            self.set_state(State::Draining, out);
        }
    }

    fn undrain(&mut self, out: &mut Vec<Action>) {
        self.drain_requested = false;
        if self.state == State::Draining {
            out.push(Action::ResumeRouting);
            let state = if self.probe_failures > 0 || self.health_failures > 0 {
                State::Degraded
            } else {
                State::Ready
            };
            self.set_state(state, out);
        }
    }

    fn degrade(&mut self, out: &mut Vec<Action>) {
        if self.state == State::Ready {
            self.set_state(State::Degraded, out);
        }
    }

    fn maybe_recover(&mut self, out: &mut Vec<Action>) {
        if self.state == State::Degraded && self.probe_failures == 0 && self.health_failures == 0 {
            self.set_state(State::Ready, out);
        }
    }

    fn become_ready(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.ready_since = Some(now);
        self.stable_reported = false;
        self.reset_signals();
        if self.drain_requested {
            self.set_state(State::Draining, out);
        } else {
            out.push(Action::ResumeRouting);
            self.set_state(State::Ready, out);
        }
        if std::mem::take(&mut self.recovering) {
            out.push(Action::Emit(Notice::Recovered));
        }
    }

    /// Enters [`State::Failed`]; restarts at once if the process is gone,
    /// otherwise kills it and waits for [`Event::Exited`].
    fn fail(&mut self, now: Instant, reason: FaultReason, detail: String, out: &mut Vec<Action>) {
        if self.routable() {
            out.push(Action::StopRouting);
        }
        // A stuck process will not answer what it holds: answer for it.
        if matches!(reason, FaultReason::Stall | FaultReason::Hang) && self.process_alive() {
            out.push(Action::AbortInFlight);
        }
        self.set_state(State::Failed, out);
        out.push(Action::Emit(Notice::Fault {
            reason,
            detail: detail.clone(),
        }));
        self.last_fault = Some((reason, detail));
        self.recovering = true;
        self.ready_since = None;
        self.reset_signals();
        self.pending_restart = Some(reason);
        if self.process_alive() {
            self.kill(out);
        } else {
            self.process_gone(now, out);
        }
    }

    /// The failed process has exited: schedule the restart.
    fn process_gone(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.process = Process::Absent;
        self.kill_sent = false;
        let reason = self.pending_restart.take().unwrap_or(FaultReason::Exit);
        let delay = self.backoff.next_delay(reason == FaultReason::Operator);
        self.restarts += 1;
        out.push(Action::Emit(Notice::Restart { reason, delay }));
        if delay.is_zero() {
            self.spawn(now, out);
        } else {
            // An unrepresentable deadline (absurd config) leaves the worker in
            // backoff for good rather than restarting it early.
            self.backoff_until = now.checked_add(delay);
            self.set_state(State::Backoff, out);
        }
    }

    /// Holds the worker suspect of an unattributed Xid until `now + window`.
    fn suspect(&mut self, now: Instant, xid: u32, window: Duration, out: &mut Vec<Action>) {
        let up = matches!(self.state, State::Ready | State::Degraded | State::Draining);
        if !up || !self.process_alive() {
            return;
        }
        let until = now.checked_add(window).unwrap_or(now);
        if self.suspect.is_none_or(|(_, t)| t < until) {
            self.suspect = Some((xid, until));
        }
        out.push(Action::Emit(Notice::Suspect { xid, window }));
    }

    /// The Xid the worker is suspect of at `now`, if any.
    fn suspected(&self, now: Instant) -> Option<u32> {
        self.suspect
            .filter(|&(_, until)| now < until)
            .map(|(xid, _)| xid)
    }

    fn quarantine(&mut self, xid: u32, out: &mut Vec<Action>) {
        if self.routable() {
            out.push(Action::StopRouting);
        }
        self.set_state(State::Quarantined, out);
        let detail = format!("GPU Xid {xid} makes the GPU unusable; worker quarantined");
        out.push(Action::Emit(Notice::Quarantine {
            xid,
            detail: detail.clone(),
        }));
        self.last_fault = Some((FaultReason::Xid, detail));
        self.pending_restart = None;
        self.backoff_until = None;
        self.ready_since = None;
        if self.process_alive() {
            self.kill(out);
        }
    }

    fn kill(&mut self, out: &mut Vec<Action>) {
        if !self.kill_sent {
            self.kill_sent = true;
            out.push(Action::Kill {
                grace: self.config.kill_grace,
            });
        }
    }

    fn spawn(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.process = Process::Spawning;
        self.spawned_at = Some(now);
        // Pushed unconditionally: the very first spawn advertises `Starting`
        // although the sentinel was created in that state.
        self.state = State::Starting;
        out.push(Action::SetState(State::Starting));
        out.push(Action::Spawn);
    }

    fn set_state(&mut self, state: State, out: &mut Vec<Action>) {
        if self.state != state {
            self.state = state;
            out.push(Action::SetState(state));
        }
    }

    fn reset_signals(&mut self) {
        self.probe_failures = 0;
        self.health_failures = 0;
        self.errors.clear();
        self.suspect = None;
    }

    fn process_alive(&self) -> bool {
        self.process != Process::Absent
    }

    /// Restarts counted in the current crash loop.
    #[cfg(test)]
    fn crash_loop(&self) -> u32 {
        self.backoff.consecutive()
    }
}

fn exit_detail(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(code), _) => format!("process exited with code {code}"),
        (None, Some(signal)) => format!("process killed by signal {signal}"),
        (None, None) => "process exited".to_string(),
    }
}

fn truncate(line: &str) -> &str {
    if line.len() <= MAX_LINE_IN_DETAIL {
        return line;
    }
    let mut end = MAX_LINE_IN_DETAIL;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

#[cfg(test)]
mod tests;
