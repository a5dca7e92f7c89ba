use proptest::prelude::*;

use super::*;

const S: Duration = Duration::from_secs(1);

fn all_supported() -> LadderConfig {
    LadderConfig {
        supported: Path::ALL.to_vec(),
        ..LadderConfig::default()
    }
}

#[test]
fn chooses_the_best_path_both_ends_have() {
    let t0 = Instant::now();
    let mut l = Ladder::new(LadderConfig::default());
    assert_eq!(l.choose("a", &[Path::Rdma, Path::Shm], t0), Path::Shm);
    assert_eq!(
        l.choose("a", &[Path::Rdma], t0),
        Path::Grpc,
        "rdma unsupported"
    );
    assert_eq!(l.choose("a", &[], t0), Path::Grpc);
    let mut l = Ladder::new(all_supported());
    assert_eq!(l.choose("a", &[Path::Rdma, Path::Grpc], t0), Path::Rdma);
}

#[test]
fn preference_is_normalized_with_grpc_last() {
    let l = Ladder::new(LadderConfig {
        preference: vec![Path::Grpc, Path::Rdma, Path::Shm, Path::Rdma],
        supported: vec![],
        ..LadderConfig::default()
    });
    assert_eq!(
        l.config().preference,
        vec![Path::Rdma, Path::Shm, Path::Grpc]
    );
    assert_eq!(l.config().supported, vec![Path::Grpc]);
    let mut only_grpc = Ladder::new(LadderConfig {
        preference: vec![],
        ..all_supported()
    });
    assert_eq!(
        only_grpc.choose("a", &Path::ALL, Instant::now()),
        Path::Grpc
    );
}

#[test]
fn a_failure_falls_back_one_step_at_a_time() {
    let t0 = Instant::now();
    let mut l = Ladder::new(all_supported());
    let all = Path::ALL;
    assert_eq!(l.choose("a", &all, t0), Path::Shm);
    assert_eq!(l.on_failure("a", Path::Shm, t0), Path::Rdma);
    assert_eq!(l.on_failure("a", Path::Rdma, t0), Path::Quic);
    assert_eq!(l.on_failure("a", Path::Quic, t0), Path::Grpc);
    assert_eq!(l.on_failure("a", Path::Grpc, t0), Path::Grpc);
    assert_eq!(l.choose("a", &all, t0 + S), Path::Grpc);
    assert!(l.is_broken("a", Path::Shm, t0 + S));
    // Breakers are per peer.
    assert_eq!(l.choose("b", &all, t0 + S), Path::Shm);
}

#[test]
fn broken_paths_are_reprobed_once_with_doubling_waits() {
    let t0 = Instant::now();
    let mut l = Ladder::new(LadderConfig::default());
    let adv = [Path::Shm];
    assert_eq!(l.choose("a", &adv, t0), Path::Shm);
    assert_eq!(l.on_failure("a", Path::Shm, t0), Path::Grpc);
    let mut now = t0;
    for wait in [30, 60, 120, 240, 300, 300] {
        assert_eq!(l.choose("a", &adv, now + (wait - 1) * S), Path::Grpc);
        now += wait * S;
        assert_eq!(l.choose("a", &adv, now), Path::Shm, "probe after {wait} s");
        assert_eq!(l.choose("a", &adv, now), Path::Grpc, "one probe at a time");
        assert_eq!(l.on_failure("a", Path::Shm, now), Path::Grpc);
    }
    now += 300 * S;
    assert_eq!(l.choose("a", &adv, now), Path::Shm);
    l.on_success("a", Path::Shm, now);
    assert!(!l.is_broken("a", Path::Shm, now));
    assert_eq!(l.choose("a", &adv, now), Path::Shm);
    // Closed again: the next failure starts from 30 s.
    l.on_failure("a", Path::Shm, now);
    assert_eq!(l.choose("a", &adv, now + 29 * S), Path::Grpc);
    assert_eq!(l.choose("a", &adv, now + 30 * S), Path::Shm);
}

#[test]
fn stale_failures_do_not_extend_the_wait_and_silent_probes_retry() {
    let t0 = Instant::now();
    let mut l = Ladder::new(LadderConfig::default());
    let adv = [Path::Shm];
    // Three requests in flight on shm all fail at once.
    for _ in 0..3 {
        l.choose("a", &adv, t0);
    }
    for _ in 0..3 {
        l.on_failure("a", Path::Shm, t0);
    }
    assert_eq!(l.choose("a", &adv, t0 + 30 * S), Path::Shm);
    // That probe never reports; another goes after another 30 s.
    assert_eq!(l.choose("a", &adv, t0 + 59 * S), Path::Grpc);
    assert_eq!(l.choose("a", &adv, t0 + 60 * S), Path::Shm);
}

#[test]
fn counters_track_attempts_outcomes_and_fallbacks() {
    let t0 = Instant::now();
    let mut l = Ladder::new(LadderConfig::default());
    let adv = [Path::Shm];
    let p = l.choose("a", &adv, t0);
    l.on_success("a", p, t0);
    let p = l.choose("a", &adv, t0);
    let next = l.on_failure("a", p, t0);
    l.on_success("a", next, t0);
    let c = l.counters();
    assert_eq!(
        c.get(Path::Shm),
        PathCounters {
            attempts: 2,
            successes: 1,
            failures: 1,
            fallbacks: 1,
        }
    );
    assert_eq!(
        c.get(Path::Grpc),
        PathCounters {
            attempts: 1,
            successes: 1,
            ..Default::default()
        }
    );
    assert_eq!(c.iter().count(), Path::ALL.len());
    l.forget("a");
    assert_eq!(
        l.choose("a", &adv, t0),
        Path::Shm,
        "a forgotten peer starts fresh"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Choose { peer: usize, advertised: u8 },
    Success { peer: usize, path: usize },
    Failure { peer: usize, path: usize },
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..8u8).prop_map(|(peer, advertised)| Op::Choose { peer, advertised }),
        (0..3usize, 0..3usize).prop_map(|(peer, path)| Op::Success { peer, path }),
        (0..3usize, 0..3usize).prop_map(|(peer, path)| Op::Failure { peer, path }),
        (0..400u64).prop_map(Op::Wait),
    ]
}

fn subset(mask: u8) -> Vec<Path> {
    Path::ALL
        .into_iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, p)| p)
        .collect()
}

proptest! {
    /// Whatever happens, the ladder returns a path, never one the peer does
    /// not advertise or this build does not support, and gRPC is always
    /// available; a fallback never goes up the ladder.
    #[test]
    fn never_an_unadvertised_path_and_grpc_always_available(
        ops in proptest::collection::vec(op(), 1..200),
        supported in 0..8u8,
    ) {
        let peers = ["a", "b", "c"];
        let supported = subset(supported);
        let mut l = Ladder::new(LadderConfig {
            supported: supported.clone(),
            ..LadderConfig::default()
        });
        let mut now = Instant::now();
        let mut advertised: [Vec<Path>; Path::ALL.len()] = Default::default();
        for op in ops {
            match op {
                Op::Choose { peer, advertised: mask } => {
                    advertised[peer] = subset(mask);
                    let broken = Path::ALL.map(|p| l.is_broken(peers[peer], p, now));
                    let p = l.choose(peers[peer], &advertised[peer], now);
                    prop_assert!(p == Path::Grpc
                        || (advertised[peer].contains(&p) && supported.contains(&p)));
                    prop_assert!(!broken[p.index()], "a broken path before its probe time");
                }
                Op::Success { peer, path } => {
                    l.on_success(peers[peer], Path::ALL[path], now);
                }
                Op::Failure { peer, path } => {
                    let failed = Path::ALL[path];
                    let next = l.on_failure(peers[peer], failed, now);
                    prop_assert!(next == Path::Grpc
                        || (advertised[peer].contains(&next) && supported.contains(&next)));
                    prop_assert!(next > failed || next == Path::Grpc);
                    prop_assert!(!l.is_broken(peers[peer], Path::Grpc, now));
                }
                Op::Wait(secs) => now += Duration::from_secs(secs),
            }
        }
        // With nothing advertised, every peer still gets gRPC.
        for peer in peers {
            prop_assert_eq!(l.choose(peer, &[], now), Path::Grpc);
        }
    }
}
