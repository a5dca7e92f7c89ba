//! The stall watchdog and unattributed Xids, scripted in virtual time
//! through the public API: a [`ProgressMeter`] fed the way the agent's pool
//! feeds it, its [`Progress`] fed to the [`Sentinel`] the way the
//! supervisor does (every 250 ms while the worker serves).

use std::time::{Duration, Instant};

use infermesh_sentinel::{
    Action, Event, FaultReason, GpuFaultSeverity, Notice, ProgressMeter, Sentinel, SentinelConfig,
    StallWindow, State,
};

const TICK: Duration = Duration::from_millis(250);

struct Worker {
    s: Sentinel,
    meter: ProgressMeter,
    now: Instant,
}

impl Worker {
    fn ready(config: SentinelConfig) -> Self {
        let now = Instant::now();
        let mut s = Sentinel::new(config, 1);
        s.start(now);
        s.handle(now, Event::Spawned);
        s.handle(now, Event::BecameReady);
        assert_eq!(s.state(), State::Ready);
        Self {
            s,
            meter: ProgressMeter::new(),
            now,
        }
    }

    /// Serves `n` requests of `service` each, one after another.
    fn serve(&mut self, n: usize, service: Duration) {
        for _ in 0..n {
            self.meter.dispatched(self.now);
            self.advance(service);
            self.meter.answered(self.now, service);
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    fn send(&mut self, event: Event) -> Vec<Action> {
        self.s.handle(self.now, event)
    }

    /// Polls progress every tick until a fault or `limit`; returns the
    /// actions of the fault and the time it took.
    fn watch(&mut self, limit: Duration) -> Option<(Vec<Action>, Duration)> {
        let start = self.now;
        while self.now - start <= limit {
            self.advance(TICK);
            let progress = self.meter.observe(self.now);
            let actions = self.send(Event::Progress(progress));
            if !actions.is_empty() {
                return Some((actions, self.now - start));
            }
        }
        None
    }
}

fn fault(actions: &[Action]) -> Option<(FaultReason, String)> {
    actions.iter().find_map(|a| match a {
        Action::Emit(Notice::Fault { reason, detail }) => Some((*reason, detail.clone())),
        _ => None,
    })
}

#[test]
fn a_fast_worker_that_stops_answering_is_a_stall_within_ten_seconds() {
    let mut w = Worker::ready(SentinelConfig::default());
    w.serve(1000, Duration::from_millis(1));
    // Inference blocks: requests go in, nothing comes out.
    for _ in 0..4 {
        w.meter.dispatched(w.now);
    }
    let (actions, after) = w.watch(Duration::from_secs(60)).expect("a stall");
    assert!(after <= Duration::from_secs(10), "caught after {after:?}");
    let (reason, detail) = fault(&actions).unwrap();
    assert_eq!(reason, FaultReason::Stall);
    assert!(detail.contains("4 request(s) in flight"), "{detail}");
    // Routing stops, the callers are answered, then the process is killed.
    let stop = actions.iter().position(|a| *a == Action::StopRouting);
    let abort = actions.iter().position(|a| *a == Action::AbortInFlight);
    let kill = actions
        .iter()
        .position(|a| matches!(a, Action::Kill { .. }));
    assert!(stop < abort && abort < kill, "{actions:?}");
    assert_eq!(w.s.state(), State::Failed);
}

#[test]
fn a_thirty_second_generation_is_not_a_stall() {
    let mut w = Worker::ready(SentinelConfig::default());
    let generation = Duration::from_secs(30);
    // Its very first generation, before any service time is known...
    w.meter.dispatched(w.now);
    assert!(w.watch(Duration::from_secs(29)).is_none());
    w.meter.answered(w.now, generation);
    // ... and once they are: one generation at a time, two in parallel.
    w.serve(20, generation);
    for _ in 0..2 {
        w.meter.dispatched(w.now);
    }
    assert!(w.watch(Duration::from_secs(40)).is_none());
    assert_eq!(w.s.state(), State::Ready);
    // A generation stuck for 4 × its service time is a stall, though.
    let (actions, _) = w.watch(Duration::from_secs(120)).expect("a stall");
    assert_eq!(fault(&actions).unwrap().0, FaultReason::Stall);
}

#[test]
fn callers_that_give_up_do_not_hide_a_stall() {
    let mut w = Worker::ready(SentinelConfig::default());
    w.serve(100, Duration::from_millis(1));
    // One caller at a time with a 1 s deadline, on a stuck worker.
    let mut caught = None;
    for i in 0..30 {
        w.meter.dispatched(w.now);
        for _ in 0..4 {
            w.advance(TICK);
            let p = w.meter.observe(w.now);
            let actions = w.send(Event::Progress(p));
            if !actions.is_empty() {
                caught = Some((i, actions));
                break;
            }
        }
        if caught.is_some() {
            break;
        }
        w.meter.abandoned(w.now);
    }
    let (calls, actions) = caught.expect("a stall");
    assert!(calls < 10, "caught after {calls} abandoned calls");
    assert_eq!(fault(&actions).unwrap().0, FaultReason::Stall);
}

#[test]
fn an_idle_worker_or_a_disabled_watchdog_never_stalls() {
    let mut w = Worker::ready(SentinelConfig::default());
    w.serve(10, Duration::from_millis(1));
    assert!(w.watch(Duration::from_secs(600)).is_none());

    let mut w = Worker::ready(SentinelConfig {
        stall: StallWindow::Off,
        ..SentinelConfig::default()
    });
    w.serve(10, Duration::from_millis(1));
    w.meter.dispatched(w.now);
    assert!(w.watch(Duration::from_secs(600)).is_none());
}

#[test]
fn a_fixed_window_is_used_as_given() {
    let mut w = Worker::ready(SentinelConfig {
        stall: StallWindow::Fixed(Duration::from_secs(2)),
        ..SentinelConfig::default()
    });
    w.meter.dispatched(w.now);
    let (_, after) = w.watch(Duration::from_secs(60)).expect("a stall");
    assert_eq!(after, Duration::from_secs(2));
}

#[test]
fn a_hang_aborts_the_requests_in_flight_too() {
    let mut w = Worker::ready(SentinelConfig::default());
    let actions = w.send(Event::ProbeTimeout);
    assert_eq!(fault(&actions).unwrap().0, FaultReason::Hang);
    assert!(actions.contains(&Action::AbortInFlight));
    // An exit has nothing left to abort.
    let mut w = Worker::ready(SentinelConfig::default());
    let actions = w.send(Event::Exited {
        code: Some(1),
        signal: None,
    });
    assert!(!actions.contains(&Action::AbortInFlight));
}

fn suspect(window: Duration) -> Event {
    Event::GpuSuspect { xid: 31, window }
}

#[test]
fn a_suspect_that_keeps_serving_is_left_alone() {
    let mut w = Worker::ready(SentinelConfig::default());
    let actions = w.send(suspect(Duration::from_secs(10)));
    assert_eq!(
        actions,
        [Action::Emit(Notice::Suspect {
            xid: 31,
            window: Duration::from_secs(10)
        })]
    );
    assert_eq!(w.s.state(), State::Ready);
    assert_eq!(w.send(Event::ProbeOk), []);
    // After the window a request error is an ordinary one (below the burst).
    w.advance(Duration::from_secs(10));
    assert_eq!(w.send(Event::RequestError), []);
    assert_eq!(w.s.restarts(), 0);
}

#[test]
fn a_suspect_that_fails_a_request_within_the_window_is_restarted_for_the_xid() {
    for failure in [
        Event::RequestError,
        Event::ProbeTimeout,
        Event::Health {
            pass: false,
            reason: "golden output differs".into(),
        },
    ] {
        let mut w = Worker::ready(SentinelConfig::default());
        w.send(suspect(Duration::from_secs(10)));
        w.advance(Duration::from_secs(9));
        let actions = w.send(failure.clone());
        let (reason, detail) = fault(&actions).expect("a fault");
        assert_eq!(reason, FaultReason::Xid, "{failure:?}");
        assert!(detail.contains("Xid 31"), "{detail}");
        assert!(actions.contains(&Action::StopRouting));
    }
}

#[test]
fn a_blamed_xid_names_the_pid_in_the_fault() {
    let mut w = Worker::ready(SentinelConfig::default());
    let actions = w.send(Event::GpuFault {
        xid: 43,
        severity: GpuFaultSeverity::Restart,
        pid: Some(3323),
    });
    let (reason, detail) = fault(&actions).unwrap();
    assert_eq!(reason, FaultReason::Xid);
    assert!(detail.contains("pid 3323"), "{detail}");
}

#[test]
fn a_worker_that_is_down_is_not_made_suspect() {
    let mut w = Worker::ready(SentinelConfig::default());
    w.send(Event::Exited {
        code: Some(1),
        signal: None,
    });
    assert_eq!(w.send(suspect(Duration::from_secs(10))), []);
}
