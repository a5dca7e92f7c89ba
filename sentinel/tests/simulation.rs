//! A scripted crash loop in virtual time: a worker that hits a fatal CUDA error
//! a few seconds after every start. Run with `--nocapture` to see the timeline.

mod support;

use std::time::Duration;

use infermesh_sentinel::{
    Action, Event, FaultPatterns, FaultReason, Notice, SentinelConfig, State,
};

use support::Sim;

const SEC: Duration = Duration::from_secs(1);
const STARTUP: Duration = Duration::from_secs(2);
const UPTIME: Duration = Duration::from_secs(5);
/// How long the process takes to die after SIGTERM.
const SHUTDOWN: Duration = Duration::from_secs(3);

fn restart_delay(actions: &[Action]) -> Duration {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Emit(Notice::Restart { delay, .. }) => Some(*delay),
            _ => None,
        })
        .expect("a restart is scheduled")
}

/// Brings a freshly spawned process up.
fn boot(sim: &mut Sim) {
    assert_eq!(sim.sentinel.state(), State::Starting);
    sim.send(Event::Spawned);
    sim.advance(STARTUP);
    sim.send(Event::BecameReady);
    assert!(sim.sentinel.routable());
}

/// The process prints a fatal CUDA error; the driver kills it. Returns the
/// restart delay and waits it out.
fn crash(sim: &mut Sim, patterns: &FaultPatterns) -> Duration {
    let line = "RuntimeError: CUDA error: an illegal memory access was encountered";
    let pattern = patterns.find(line).expect("a fatal line matches");
    let actions = sim.send(Event::FaultLine {
        pattern: pattern.to_string(),
        line: line.to_string(),
    });
    assert!(!sim.sentinel.routable());
    assert!(actions.contains(&Action::Kill {
        grace: infermesh_sentinel::DEFAULT_KILL_GRACE
    }));
    assert!(!actions.contains(&Action::Spawn), "spawned before the exit");

    sim.advance(SHUTDOWN);
    let actions = sim.send(Event::Exited {
        code: None,
        signal: Some(15),
    });
    let delay = restart_delay(&actions);
    if !delay.is_zero() {
        assert_eq!(sim.sentinel.state(), State::Backoff);
        let spawn = sim.fire().expect("backoff timer");
        assert_eq!(spawn, [Action::SetState(State::Starting), Action::Spawn]);
    }
    delay
}

#[test]
fn crash_loop_backs_off_then_caps_then_resets_when_stable() {
    let config = SentinelConfig {
        backoff_base: SEC,
        backoff_cap: 4 * SEC,
        ..SentinelConfig::default()
    };
    let patterns = FaultPatterns::defaults();
    let mut sim = Sim::start(config, 42, true);

    let mut delays = Vec::new();
    for n in 1..=5 {
        boot(&mut sim);
        sim.advance(UPTIME);
        let at = sim.elapsed();
        let delay = crash(&mut sim, &patterns);
        println!(
            "t={:>6.2}s crash #{n}: restart {:.3}s after the exit",
            at.as_secs_f64(),
            delay.as_secs_f64()
        );
        delays.push(delay);
    }

    // Nominal delays 0, 1, 2, 4, 4 (capped); equal jitter keeps each actual
    // delay in [nominal/2, nominal], so the growing part is monotonic.
    assert_eq!(delays[0], Duration::ZERO);
    for (delay, nominal) in delays.iter().zip([0, 1, 2, 4, 4]) {
        let nominal = nominal * SEC;
        assert!(*delay >= nominal / 2 && *delay <= nominal, "{delays:?}");
    }
    assert!(delays[..4].windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
    assert_eq!(sim.sentinel.restarts(), 5);
    assert_eq!(
        sim.sentinel.last_fault().map(|f| f.0),
        Some(FaultReason::FaultPattern)
    );

    // This time the worker stays up for the stable period.
    boot(&mut sim);
    assert_eq!(sim.fire(), Some(vec![Action::Emit(Notice::Stable)]));
    println!(
        "t={:>6.2}s stable: crash-loop counter reset",
        sim.elapsed().as_secs_f64()
    );
    let at = sim.elapsed();
    let delay = crash(&mut sim, &patterns);
    println!(
        "t={:>6.2}s crash #6: restart {:.3}s after the exit",
        at.as_secs_f64(),
        delay.as_secs_f64()
    );
    assert_eq!(delay, Duration::ZERO);
    boot(&mut sim);

    println!("notices:");
    for (at, notice) in &sim.notices {
        println!("  {:>7.2}s {notice:?}", at.as_secs_f64());
    }
    let recovered = sim
        .notices
        .iter()
        .filter(|(_, n)| *n == Notice::Recovered)
        .count();
    assert_eq!(recovered, 6);
}
