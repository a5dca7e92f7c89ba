//! Invariants of the sentinel over random event sequences.

mod support;

use std::time::Duration;

use infermesh_sentinel::{
    Action, Event, GpuFaultSeverity, Notice, Progress, SentinelConfig, StallWindow, State,
};
use proptest::prelude::*;

use support::Sim;

/// Small thresholds so that random sequences reach every transition.
fn config() -> SentinelConfig {
    SentinelConfig {
        backoff_base: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(30),
        stable_period: Duration::from_secs(60),
        startup_timeout: Duration::from_secs(120),
        kill_grace: Duration::from_secs(10),
        error_burst: 3,
        error_window: Duration::from_secs(10),
        health_failure_threshold: 2,
        probe_failure_threshold: 2,
        stall: StallWindow::Fixed(Duration::from_secs(5)),
    }
}

fn event() -> impl Strategy<Value = Event> {
    // Weights out of ~330: a quarantine is rare, or most sequences would end
    // quarantined before exercising anything else.
    prop_oneof![
        30 => Just(Event::Spawned),
        10 => Just(Event::SpawnFailed { error: "ENOENT".into() }),
        40 => Just(Event::BecameReady),
        20 => (prop::option::of(0..3i32), prop::option::of(prop_oneof![Just(9), Just(15)]))
            .prop_map(|(code, signal)| Event::Exited { code, signal }),
        10 => Just(Event::FaultLine {
            pattern: "CUDA error".into(),
            line: "CUDA error: unspecified launch failure".into(),
        }),
        10 => (0..100u32).prop_map(|xid| Event::GpuFault { xid, severity: GpuFaultSeverity::Restart, pid: None, }),
        1 => Just(Event::GpuFault { xid: 79, severity: GpuFaultSeverity::Quarantine, pid: None, }),
        30 => any::<bool>().prop_map(|pass| Event::Health { pass, reason: "probe".into() }),
        30 => Just(Event::ProbeOk),
        20 => Just(Event::ProbeTimeout),
        40 => Just(Event::RequestError),
        10 => Just(Event::Drain),
        10 => Just(Event::Undrain),
        10 => Just(Event::Restart),
        40 => Just(Event::Tick),
        10 => (0..10u64).prop_map(|s| Event::GpuSuspect { xid: 31, window: Duration::from_secs(s) }),
        20 => (0..3usize, 0..8u64).prop_map(|(in_flight, s)| Event::Progress(Progress {
            in_flight,
            waiting: Duration::from_secs(s),
            service_p99: None,
        })),
    ]
}

/// Time between events: mostly short, sometimes long enough for the startup
/// timeout, backoff and stable period to elapse.
fn gap() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (0..2_000u64).prop_map(Duration::from_millis),
        1 => (0..200_000u64).prop_map(Duration::from_millis),
    ]
}

fn script() -> impl Strategy<Value = Vec<(Duration, Event)>> {
    prop::collection::vec((gap(), event()), 0..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// After the worker is seen to die (an exit, or any fault or quarantine),
    /// it is not routable until a process spawned after the death becomes
    /// ready; after a StopRouting it is not routable until a ResumeRouting.
    #[test]
    fn never_routes_to_a_worker_after_seeing_it_die(seed: u64, script in script()) {
        let mut sim = Sim::start(config(), seed, false);
        let mut dead = false;
        let mut respawned = false;
        let mut stopped = false;
        for (gap, event) in script {
            sim.advance(gap);
            match event {
                Event::BecameReady if respawned => dead = false,
                Event::Exited { .. } => (dead, respawned) = (true, false),
                _ => {}
            }
            let actions = sim.send(event);
            for action in &actions {
                match action {
                    Action::Emit(Notice::Fault { .. } | Notice::Quarantine { .. }) => {
                        (dead, respawned) = (true, false);
                    }
                    Action::Spawn => respawned = true,
                    Action::StopRouting => stopped = true,
                    Action::ResumeRouting => stopped = false,
                    _ => {}
                }
            }
            let routable = sim.sentinel.routable();
            prop_assert!(!(dead && routable), "routable after death: {actions:?}");
            prop_assert!(!(stopped && routable), "routable after StopRouting: {actions:?}");
        }
    }

    /// Whatever happened before, a well-behaved process brings the worker
    /// back to Ready, unless it was quarantined.
    #[test]
    fn every_fault_ends_ready_again_or_quarantined(seed: u64, script in script()) {
        let mut sim = Sim::start(config(), seed, false);
        for (gap, event) in script {
            sim.advance(gap);
            sim.send(event);
        }
        let end = sim.settle(20);
        prop_assert!(matches!(end, State::Ready | State::Quarantined), "ended {end:?}");
        prop_assert_eq!(end == State::Ready, sim.sentinel.routable());
    }

    /// With events that could really happen to the process, no Spawn is
    /// emitted while the previous process may be alive, and no Kill without a
    /// process (both checked by the strict harness on every step).
    #[test]
    fn spawns_only_when_no_process_is_alive(seed: u64, script in script()) {
        let mut sim = Sim::start(config(), seed, true);
        for (gap, event) in script {
            sim.advance(gap);
            let event = sim.realistic(event);
            sim.send(event);
        }
        let end = sim.settle(20);
        prop_assert!(matches!(end, State::Ready | State::Quarantined), "ended {end:?}");
    }
}
