use std::time::{Duration, Instant};

use super::*;

const SEC: Duration = Duration::from_secs(1);

/// A sentinel plus a virtual clock.
struct Harness {
    s: Sentinel,
    now: Instant,
}

impl Harness {
    fn new(config: SentinelConfig) -> Self {
        let mut h = Self {
            s: Sentinel::new(config, 7),
            now: Instant::now(),
        };
        let actions = h.s.start(h.now);
        assert_eq!(actions, [Action::SetState(State::Starting), Action::Spawn]);
        h
    }

    /// Started, spawned and ready.
    fn ready(config: SentinelConfig) -> Self {
        let mut h = Self::new(config);
        h.bring_up();
        h
    }

    fn bring_up(&mut self) -> Vec<Action> {
        assert_eq!(self.send(Event::Spawned), []);
        self.send(Event::BecameReady)
    }

    fn send(&mut self, event: Event) -> Vec<Action> {
        self.s.handle(self.now, event)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Jumps to the next timer and ticks.
    fn fire(&mut self) -> Vec<Action> {
        let deadline = self.s.poll_timeout().expect("a timer is armed");
        assert!(deadline >= self.now, "timer in the past");
        self.now = deadline;
        self.send(Event::Tick)
    }

    /// Crashes the ready worker, returns the scheduled restart delay and
    /// brings the new process up again.
    fn crash_and_recover(&mut self) -> Duration {
        let actions = self.send(exited(1));
        let delay = restart_delay(&actions).expect("restart scheduled");
        if !delay.is_zero() {
            assert_eq!(self.s.state(), State::Backoff);
            assert_eq!(self.s.poll_timeout(), Some(self.now + delay));
            assert_eq!(
                self.fire(),
                [Action::SetState(State::Starting), Action::Spawn]
            );
        }
        let ready = self.bring_up();
        assert!(
            ready.contains(&Action::Emit(Notice::Recovered)),
            "{ready:?}"
        );
        delay
    }
}

fn exited(code: i32) -> Event {
    Event::Exited {
        code: Some(code),
        signal: None,
    }
}

fn fault_line() -> Event {
    Event::FaultLine {
        pattern: "CUDA error".into(),
        line: "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
    }
}

fn health(pass: bool) -> Event {
    Event::Health {
        pass,
        reason: if pass { "ok" } else { "generate returned 500" }.into(),
    }
}

fn restart_delay(actions: &[Action]) -> Option<Duration> {
    actions.iter().find_map(|a| match a {
        Action::Emit(Notice::Restart { delay, .. }) => Some(*delay),
        _ => None,
    })
}

fn fault_reason(actions: &[Action]) -> Option<FaultReason> {
    actions.iter().find_map(|a| match a {
        Action::Emit(Notice::Fault { reason, .. }) => Some(*reason),
        _ => None,
    })
}

fn kill() -> Action {
    Action::Kill {
        grace: crate::DEFAULT_KILL_GRACE,
    }
}

#[test]
fn start_spawns_once_and_arms_the_startup_timeout() {
    let mut h = Harness::new(SentinelConfig::default());
    assert_eq!(h.s.state(), State::Starting);
    assert!(!h.s.routable());
    assert_eq!(h.s.start(h.now), []);
    assert_eq!(h.s.poll_timeout(), Some(h.now + 120 * SEC));
    assert_eq!(h.s.restarts(), 0);
    assert_eq!(h.s.last_fault(), None);
}

#[test]
fn first_ready_routes_without_recovered_notice() {
    let mut h = Harness::new(SentinelConfig::default());
    assert_eq!(
        h.bring_up(),
        [Action::ResumeRouting, Action::SetState(State::Ready)]
    );
    assert!(h.s.routable());
    // The stable period is the only timer while ready.
    assert_eq!(h.s.poll_timeout(), Some(h.now + 60 * SEC));
}

#[test]
fn exit_while_ready_restarts_immediately_without_kill() {
    let mut h = Harness::ready(SentinelConfig::default());
    let actions = h.send(exited(1));
    assert_eq!(
        actions,
        [
            Action::StopRouting,
            Action::SetState(State::Failed),
            Action::Emit(Notice::Fault {
                reason: FaultReason::Exit,
                detail: "process exited with code 1".into(),
            }),
            Action::Emit(Notice::Restart {
                reason: FaultReason::Exit,
                delay: Duration::ZERO,
            }),
            Action::SetState(State::Starting),
            Action::Spawn,
        ]
    );
    assert!(!h.s.routable());
    assert_eq!(h.s.restarts(), 1);
    assert_eq!(
        h.s.last_fault(),
        Some((FaultReason::Exit, "process exited with code 1"))
    );
    assert_eq!(h.s.crash_loop(), 1);
}

#[test]
fn signal_exit_detail_names_the_signal() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.send(Event::Exited {
        code: None,
        signal: Some(9),
    });
    assert_eq!(
        h.s.last_fault(),
        Some((FaultReason::Exit, "process killed by signal 9"))
    );
}

#[test]
fn fault_line_kills_and_waits_for_exit_before_respawning() {
    let mut h = Harness::ready(SentinelConfig::default());
    let actions = h.send(fault_line());
    assert_eq!(actions.len(), 4, "{actions:?}");
    assert_eq!(actions[0], Action::StopRouting);
    assert_eq!(actions[1], Action::SetState(State::Failed));
    assert_eq!(fault_reason(&actions), Some(FaultReason::FaultPattern));
    assert_eq!(actions[3], kill());
    let (_, detail) = h.s.last_fault().unwrap();
    assert!(detail.contains("CUDA error") && detail.contains("illegal memory access"));

    // Nothing may respawn while the old process can still hold the GPU.
    h.advance(30 * SEC);
    for event in [
        Event::Tick,
        Event::BecameReady,
        Event::Spawned,
        Event::ProbeOk,
    ] {
        assert_eq!(h.send(event), []);
    }
    assert_eq!(h.s.poll_timeout(), None);
    assert!(!h.s.routable());

    assert_eq!(
        h.send(Event::Exited {
            code: None,
            signal: Some(15)
        }),
        [
            Action::Emit(Notice::Restart {
                reason: FaultReason::FaultPattern,
                delay: Duration::ZERO,
            }),
            Action::SetState(State::Starting),
            Action::Spawn,
        ]
    );
    assert_eq!(
        h.bring_up(),
        [
            Action::ResumeRouting,
            Action::SetState(State::Ready),
            Action::Emit(Notice::Recovered),
        ]
    );
}

#[test]
fn gpu_restart_fault_is_an_xid_fault() {
    let mut h = Harness::ready(SentinelConfig::default());
    let actions = h.send(Event::GpuFault {
        xid: 13,
        severity: GpuFaultSeverity::Restart,
        pid: None,
    });
    assert_eq!(fault_reason(&actions), Some(FaultReason::Xid));
    assert_eq!(actions.last(), Some(&kill()));
    assert!(h.s.last_fault().unwrap().1.contains("13"));
}

#[test]
fn faults_while_starting_kill_the_process() {
    let mut h = Harness::new(SentinelConfig::default());
    h.send(Event::Spawned);
    let actions = h.send(Event::GpuFault {
        xid: 31,
        severity: GpuFaultSeverity::Restart,
        pid: None,
    });
    // Not routable yet, so no StopRouting.
    assert_eq!(actions[0], Action::SetState(State::Failed));
    assert_eq!(actions.last(), Some(&kill()));

    let mut h = Harness::new(SentinelConfig::default());
    let actions = h.send(fault_line());
    assert_eq!(fault_reason(&actions), Some(FaultReason::FaultPattern));
    assert_eq!(actions.last(), Some(&kill()));
}

#[test]
fn crash_loop_backoff_grows_and_caps() {
    let config = SentinelConfig {
        backoff_base: SEC,
        backoff_cap: 8 * SEC,
        ..SentinelConfig::default()
    };
    let mut h = Harness::ready(config);
    let delays: Vec<_> = (0..8).map(|_| h.crash_and_recover()).collect();
    let nominal = [0, 1, 2, 4, 8, 8, 8, 8];
    for (delay, nominal) in delays.iter().zip(nominal) {
        let nominal = nominal * SEC;
        assert!(
            *delay >= nominal / 2 && *delay <= nominal,
            "{delays:?} vs nominal {nominal:?}"
        );
    }
    assert_eq!(h.s.restarts(), 8);
}

#[test]
fn backoff_tick_before_deadline_does_nothing() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    let actions = h.send(exited(1));
    let delay = restart_delay(&actions).unwrap();
    assert!(delay >= SEC / 2);
    assert_eq!(actions.last(), Some(&Action::SetState(State::Backoff)));
    h.advance(delay / 4);
    assert_eq!(h.send(Event::Tick), []);
    assert_eq!(h.s.state(), State::Backoff);
    assert_eq!(h.fire(), [Action::SetState(State::Starting), Action::Spawn]);
}

#[test]
fn stable_period_resets_the_crash_loop() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    h.crash_and_recover();
    assert_eq!(h.s.crash_loop(), 2);

    h.advance(59 * SEC);
    assert_eq!(h.send(Event::Tick), []);
    assert_eq!(h.fire(), [Action::Emit(Notice::Stable)]);
    assert_eq!(h.s.crash_loop(), 0);
    // Reported once per ready period.
    assert_eq!(h.s.poll_timeout(), None);
    h.advance(600 * SEC);
    assert_eq!(h.send(Event::Tick), []);

    assert_eq!(h.crash_and_recover(), Duration::ZERO);
}

#[test]
fn stable_period_counts_while_degraded_or_draining() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    h.send(Event::Drain);
    assert_eq!(h.fire(), [Action::Emit(Notice::Stable)]);
    assert_eq!(h.s.crash_loop(), 0);
}

#[test]
fn crash_before_stable_period_keeps_counting() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    h.advance(30 * SEC);
    assert_eq!(h.send(Event::Tick), []);
    assert!(h.crash_and_recover() > Duration::ZERO);
}

#[test]
fn operator_restart_is_immediate_and_not_counted() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    h.crash_and_recover();
    assert_eq!(h.s.crash_loop(), 2);

    let actions = h.send(Event::Restart);
    assert_eq!(
        actions,
        [
            Action::StopRouting,
            Action::SetState(State::Failed),
            Action::Emit(Notice::Fault {
                reason: FaultReason::Operator,
                detail: "operator requested a restart".into(),
            }),
            kill(),
        ]
    );
    assert_eq!(
        h.send(exited(0)),
        [
            Action::Emit(Notice::Restart {
                reason: FaultReason::Operator,
                delay: Duration::ZERO,
            }),
            Action::SetState(State::Starting),
            Action::Spawn,
        ]
    );
    assert_eq!(h.s.crash_loop(), 2);
    assert_eq!(h.s.restarts(), 3);
    h.bring_up();
    // The crash loop resumes where it was: nominal 2s.
    let delay = h.crash_and_recover();
    assert!(delay >= SEC && delay <= 2 * SEC, "{delay:?}");
}

#[test]
fn operator_restart_while_starting_kills_the_stuck_process() {
    let mut h = Harness::new(SentinelConfig::default());
    h.send(Event::Spawned);
    let actions = h.send(Event::Restart);
    assert_eq!(fault_reason(&actions), Some(FaultReason::Operator));
    assert_eq!(actions.last(), Some(&kill()));
}

#[test]
fn startup_timeout_runs_from_spawned() {
    let mut h = Harness::new(SentinelConfig::default());
    h.advance(5 * SEC);
    h.send(Event::Spawned);
    h.advance(115 * SEC);
    assert_eq!(h.send(Event::Tick), []);
    assert_eq!(h.s.poll_timeout(), Some(h.now + 5 * SEC));
    let actions = h.fire();
    assert_eq!(
        actions,
        [
            Action::SetState(State::Failed),
            Action::Emit(Notice::Fault {
                reason: FaultReason::StartupTimeout,
                detail: "not ready 120s after spawn".into(),
            }),
            kill(),
        ]
    );
    assert_eq!(h.s.poll_timeout(), None);
    let actions = h.send(exited(137));
    assert_eq!(restart_delay(&actions), Some(Duration::ZERO));
    assert_eq!(actions.last(), Some(&Action::Spawn));
}

#[test]
fn spawn_failure_goes_straight_to_restart_scheduling() {
    let mut h = Harness::new(SentinelConfig::default());
    let error = Event::SpawnFailed {
        error: "No such file or directory".into(),
    };
    assert_eq!(
        h.send(error.clone()),
        [
            Action::SetState(State::Failed),
            Action::Emit(Notice::Fault {
                reason: FaultReason::SpawnFailed,
                detail: "No such file or directory".into(),
            }),
            Action::Emit(Notice::Restart {
                reason: FaultReason::SpawnFailed,
                delay: Duration::ZERO,
            }),
            Action::SetState(State::Starting),
            Action::Spawn,
        ]
    );
    let actions = h.send(error.clone());
    assert!(!actions.contains(&kill()));
    assert!(restart_delay(&actions).unwrap() > Duration::ZERO);
    assert_eq!(actions.last(), Some(&Action::SetState(State::Backoff)));
    // A late duplicate report changes nothing.
    assert_eq!(h.send(error), []);
}

#[test]
fn exit_while_starting_needs_no_kill() {
    let mut h = Harness::new(SentinelConfig::default());
    h.send(Event::Spawned);
    let actions = h.send(exited(2));
    assert_eq!(fault_reason(&actions), Some(FaultReason::Exit));
    assert!(!actions.contains(&kill()));
    assert_eq!(actions.last(), Some(&Action::Spawn));
}

#[test]
fn error_burst_uses_a_sliding_window() {
    let config = SentinelConfig {
        error_burst: 3,
        error_window: 10 * SEC,
        ..SentinelConfig::default()
    };
    let mut h = Harness::ready(config);
    let t0 = h.now;
    let at = |h: &mut Harness, secs: u64| {
        h.now = t0 + Duration::from_secs(secs);
        h.send(Event::RequestError)
    };
    assert_eq!(at(&mut h, 0), []);
    assert_eq!(at(&mut h, 6), []);
    // The error at 0 has left the window.
    assert_eq!(at(&mut h, 11), []);
    assert!(h.s.routable());
    let actions = at(&mut h, 12);
    assert_eq!(fault_reason(&actions), Some(FaultReason::ErrorBurst));
    assert_eq!(actions[0], Action::StopRouting);
    assert_eq!(actions.last(), Some(&kill()));
}

#[test]
fn errors_do_not_carry_over_into_a_new_process() {
    let config = SentinelConfig {
        error_burst: 2,
        ..SentinelConfig::default()
    };
    let mut h = Harness::ready(config);
    h.send(Event::RequestError);
    h.crash_and_recover();
    assert_eq!(h.send(Event::RequestError), []);
}

#[test]
fn request_errors_outside_up_states_are_ignored() {
    let mut h = Harness::new(SentinelConfig {
        error_burst: 1,
        ..SentinelConfig::default()
    });
    for _ in 0..10 {
        assert_eq!(h.send(Event::RequestError), []);
    }
    assert_eq!(h.s.state(), State::Starting);
}

#[test]
fn soft_failures_degrade_and_recover() {
    let config = SentinelConfig {
        probe_failure_threshold: 3,
        health_failure_threshold: 3,
        ..SentinelConfig::default()
    };
    let mut h = Harness::ready(config);
    assert_eq!(
        h.send(Event::ProbeTimeout),
        [Action::SetState(State::Degraded)]
    );
    assert!(h.s.routable());
    assert_eq!(h.send(health(false)), []);
    assert_eq!(h.send(Event::ProbeOk), []);
    assert_eq!(h.s.state(), State::Degraded);
    assert_eq!(h.send(health(true)), [Action::SetState(State::Ready)]);
    assert_eq!(h.send(health(true)), []);
    assert_eq!(h.send(health(false)), [Action::SetState(State::Degraded)]);
    assert_eq!(h.send(health(true)), [Action::SetState(State::Ready)]);
}

#[test]
fn consecutive_probe_timeouts_are_a_hang() {
    let config = SentinelConfig {
        probe_failure_threshold: 2,
        ..SentinelConfig::default()
    };
    let mut h = Harness::ready(config);
    h.send(Event::ProbeTimeout);
    h.send(Event::ProbeOk);
    assert_eq!(
        h.send(Event::ProbeTimeout),
        [Action::SetState(State::Degraded)]
    );
    let actions = h.send(Event::ProbeTimeout);
    assert_eq!(actions[0], Action::StopRouting);
    assert_eq!(fault_reason(&actions), Some(FaultReason::Hang));
    assert_eq!(actions.last(), Some(&kill()));
}

#[test]
fn default_probe_threshold_faults_on_the_first_timeout() {
    let mut h = Harness::ready(SentinelConfig::default());
    let actions = h.send(Event::ProbeTimeout);
    assert_eq!(fault_reason(&actions), Some(FaultReason::Hang));
}

#[test]
fn consecutive_health_failures_are_a_fault() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.send(health(false));
    h.send(health(false));
    assert_eq!(h.s.state(), State::Degraded);
    let actions = h.send(health(false));
    assert_eq!(fault_reason(&actions), Some(FaultReason::Health));
    let (_, detail) = h.s.last_fault().unwrap();
    assert_eq!(
        detail,
        "3 consecutive health-check failures: generate returned 500"
    );
}

#[test]
fn drain_and_undrain() {
    let mut h = Harness::ready(SentinelConfig::default());
    assert_eq!(
        h.send(Event::Drain),
        [Action::StopRouting, Action::SetState(State::Draining)]
    );
    assert!(!h.s.routable());
    assert_eq!(h.send(Event::Drain), []);
    assert_eq!(
        h.send(Event::Undrain),
        [Action::ResumeRouting, Action::SetState(State::Ready)]
    );
    assert_eq!(h.send(Event::Undrain), []);
    assert!(h.s.routable());
}

#[test]
fn undrain_returns_to_degraded_when_signals_are_bad() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.send(health(false));
    assert_eq!(
        h.send(Event::Drain),
        [Action::StopRouting, Action::SetState(State::Draining)]
    );
    // Health failures still count while draining, without a state change.
    assert_eq!(h.send(health(false)), []);
    assert_eq!(
        h.send(Event::Undrain),
        [Action::ResumeRouting, Action::SetState(State::Degraded)]
    );
}

#[test]
fn faults_while_draining_restart_and_stay_drained() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.send(Event::Drain);
    let actions = h.send(fault_line());
    // Routing was already stopped by the drain.
    assert_eq!(actions[0], Action::SetState(State::Failed));
    assert_eq!(actions.last(), Some(&kill()));
    h.send(exited(0));
    assert_eq!(
        h.bring_up(),
        [
            Action::SetState(State::Draining),
            Action::Emit(Notice::Recovered)
        ]
    );
    assert!(!h.s.routable());
    assert_eq!(
        h.send(Event::Undrain),
        [Action::ResumeRouting, Action::SetState(State::Ready)]
    );
}

#[test]
fn drain_requested_while_down_applies_when_ready() {
    let mut h = Harness::new(SentinelConfig::default());
    assert_eq!(h.send(Event::Drain), []);
    assert_eq!(h.bring_up(), [Action::SetState(State::Draining)]);

    let mut h = Harness::new(SentinelConfig::default());
    h.send(Event::Drain);
    assert_eq!(h.send(Event::Undrain), []);
    assert_eq!(
        h.bring_up(),
        [Action::ResumeRouting, Action::SetState(State::Ready)]
    );
}

#[test]
fn quarantine_is_terminal() {
    let mut h = Harness::ready(SentinelConfig::default());
    let actions = h.send(Event::GpuFault {
        xid: 79,
        severity: GpuFaultSeverity::Quarantine,
        pid: None,
    });
    assert_eq!(actions.len(), 4, "{actions:?}");
    assert_eq!(actions[0], Action::StopRouting);
    assert_eq!(actions[1], Action::SetState(State::Quarantined));
    assert!(matches!(
        &actions[2],
        Action::Emit(Notice::Quarantine { xid: 79, .. })
    ));
    assert_eq!(actions[3], kill());
    assert_eq!(h.s.last_fault().map(|f| f.0), Some(FaultReason::Xid));

    h.advance(3600 * SEC);
    let everything = [
        exited(0),
        Event::Spawned,
        Event::BecameReady,
        Event::Tick,
        Event::Undrain,
        Event::Restart,
        fault_line(),
        Event::GpuFault {
            xid: 79,
            severity: GpuFaultSeverity::Quarantine,
            pid: None,
        },
    ];
    for event in everything {
        assert_eq!(h.send(event), []);
    }
    assert_eq!(h.s.state(), State::Quarantined);
    assert_eq!(h.s.poll_timeout(), None);
    assert_eq!(h.s.start(h.now), []);
    assert_eq!(h.s.restarts(), 0);
}

#[test]
fn quarantine_without_a_process_needs_no_kill() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.crash_and_recover();
    h.send(exited(1));
    assert_eq!(h.s.state(), State::Backoff);
    let actions = h.send(Event::GpuFault {
        xid: 48,
        severity: GpuFaultSeverity::Quarantine,
        pid: None,
    });
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert_eq!(actions[0], Action::SetState(State::Quarantined));
    h.advance(3600 * SEC);
    assert_eq!(h.send(Event::Tick), []);
}

#[test]
fn quarantine_during_a_kill_does_not_kill_twice() {
    let mut h = Harness::ready(SentinelConfig::default());
    h.send(fault_line());
    let actions = h.send(Event::GpuFault {
        xid: 79,
        severity: GpuFaultSeverity::Quarantine,
        pid: None,
    });
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert_eq!(actions[0], Action::SetState(State::Quarantined));
    assert_eq!(h.send(exited(0)), []);
}

#[test]
fn stale_events_are_ignored() {
    let mut h = Harness::new(SentinelConfig::default());
    for event in [
        Event::ProbeTimeout,
        Event::ProbeOk,
        health(false),
        Event::Tick,
        Event::Undrain,
    ] {
        assert_eq!(h.send(event), []);
    }
    assert_eq!(h.s.state(), State::Starting);

    h.bring_up();
    assert_eq!(h.send(Event::Spawned), []);
    assert_eq!(h.send(Event::BecameReady), []);
    assert_eq!(
        h.send(Event::SpawnFailed {
            error: "late".into()
        }),
        []
    );

    h.crash_and_recover();
    h.send(exited(1));
    assert_eq!(h.s.state(), State::Backoff);
    for event in [
        exited(1),
        Event::BecameReady,
        Event::Spawned,
        Event::ProbeTimeout,
        Event::RequestError,
        Event::Restart,
        fault_line(),
    ] {
        assert_eq!(h.send(event), []);
    }
    assert_eq!(h.s.state(), State::Backoff);
}

#[test]
fn events_before_start_are_ignored() {
    let mut s = Sentinel::new(SentinelConfig::default(), 1);
    let now = Instant::now();
    for event in [exited(1), Event::BecameReady, Event::Spawned, fault_line()] {
        assert_eq!(s.handle(now, event), []);
    }
    assert_eq!(s.state(), State::Starting);
    assert_eq!(s.poll_timeout(), None);
    assert!(!s.routable());
}

#[test]
fn long_fault_lines_are_truncated_in_the_detail() {
    let mut h = Harness::ready(SentinelConfig::default());
    let line = format!("CUDA error: {}", "é".repeat(10_000));
    h.send(Event::FaultLine {
        pattern: "CUDA error".into(),
        line,
    });
    let (_, detail) = h.s.last_fault().unwrap();
    assert!(detail.len() < 400, "{}", detail.len());
}
