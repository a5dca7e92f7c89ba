//! The RDMA protocol end to end over the emulation: two engines in one
//! process, the control-path exchange through encode/decode, one-sided READ
//! and WRITE, the responder's checks, the registration cache and injected
//! link failures.

use std::future::Future;
use std::time::Duration;

use infermesh_rdma::{
    Access, Connection, EndpointInfo, RdmaConfig, RdmaEngine, RdmaError, RemoteBuffer,
};

/// An agent and a client engine, connected as the agent and client crates
/// will do it (the closure stands in for the gRPC round trip).
struct Pair {
    agent: RdmaEngine,
    client: RdmaEngine,
    /// The agent's end: the one that reads and writes.
    agent_conn: Connection,
}

impl Pair {
    async fn start() -> Pair {
        Self::with_client_config(RdmaConfig::default()).await
    }

    async fn with_client_config(config: RdmaConfig) -> Pair {
        let agent = RdmaEngine::emulated().await.unwrap();
        let client = RdmaEngine::emulated_with(&config).await.unwrap();
        let agent_conn = handshake(&client, &agent, "agent-1").await.unwrap();
        Pair {
            agent,
            client,
            agent_conn,
        }
    }

    /// A fresh connection after the agent's end failed: the agent reports
    /// the failure on the control path, the client drops its cached end.
    async fn reconnect(&mut self) {
        self.client.disconnect("agent-1");
        self.agent_conn = handshake(&self.client, &self.agent, "agent-1")
            .await
            .unwrap();
    }
}

/// The client connects to the agent; returns the agent's end, found by the
/// QPN the client would quote in its requests.
async fn handshake(
    client: &RdmaEngine,
    agent: &RdmaEngine,
    key: &str,
) -> Result<Connection, RdmaError> {
    let agent2 = agent.clone();
    let client_conn = client
        .connect(key, |mine| async move {
            let request = mine.encode();
            let theirs = EndpointInfo::decode(&request)?;
            let conn = agent2.accept(&theirs).await?;
            EndpointInfo::decode(&conn.local_info().encode())
        })
        .await?;
    let qpn = client_conn.peer_info().qpn();
    Ok(agent
        .connection(qpn)
        .expect("the agent registered the accepted connection"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed)
        .collect()
}

async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("operation hung")
}

#[tokio::test]
async fn read_pulls_remote_bytes_exactly() {
    let pair = Pair::start().await;
    for (i, len) in [1usize, 4096, 1 << 20, 16 << 20].into_iter().enumerate() {
        let mut input = pair.client.register(len, Access::RemoteRead).await.unwrap();
        let data = pattern(len, i as u8);
        input.as_mut_slice().copy_from_slice(&data);
        let param = input.remote().to_param_string();
        let remote = RemoteBuffer::parse(&param).unwrap();
        let got = within(pair.agent_conn.read(remote)).await.unwrap();
        assert_eq!(got.len(), len);
        assert!(got[..] == data[..], "READ of {len} bytes differs");
    }
}

#[tokio::test]
async fn zero_length_transfers_complete_without_posting() {
    let pair = Pair::start().await;
    let input = pair.client.register(0, Access::RemoteRead).await.unwrap();
    assert!(input.remote().is_empty());
    let before = pair.agent.mr_stats();
    assert!(
        pair.agent_conn
            .read(input.remote())
            .await
            .unwrap()
            .is_empty()
    );
    pair.agent_conn.write(input.remote(), &[]).await.unwrap();
    // Nothing was staged, so nothing was posted.
    assert_eq!(pair.agent.mr_stats(), before);
}

#[tokio::test]
async fn write_pushes_bytes() {
    let pair = Pair::start().await;
    for (i, len) in [1usize, 4096, 1 << 20, 16 << 20].into_iter().enumerate() {
        let output = pair
            .client
            .register(len, Access::RemoteWrite)
            .await
            .unwrap();
        let data = pattern(len, 100 + i as u8);
        within(pair.agent_conn.write(output.remote(), &data))
            .await
            .unwrap();
        assert!(
            output.as_slice()[..] == data[..],
            "WRITE of {len} bytes differs"
        );
    }
    // Shorter data lands at the start; the rest is untouched.
    let mut output = pair.client.register(8, Access::RemoteWrite).await.unwrap();
    output.as_mut_slice().fill(0xee);
    pair.agent_conn
        .write(output.remote(), b"abc")
        .await
        .unwrap();
    assert_eq!(&output.as_slice()[..], b"abc\xee\xee\xee\xee\xee");
    // Longer data is refused before anything is posted.
    let err = pair
        .agent_conn
        .write(output.remote(), &[0; 9])
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::OutOfBounds { .. }), "{err}");
    assert!(!pair.agent_conn.is_broken());
}

#[tokio::test]
async fn wrong_rkey_is_a_remote_access_error_and_breaks_the_connection() {
    let mut pair = Pair::start().await;
    let mut input = pair.client.register(64, Access::RemoteRead).await.unwrap();
    input.as_mut_slice().fill(7);
    let good = input.remote();
    let forged = RemoteBuffer::new(good.addr(), good.len(), good.rkey() ^ 1).unwrap();
    let err = within(pair.agent_conn.read(forged)).await.unwrap_err();
    assert!(
        matches!(err, RdmaError::RemoteAccess { rkey, .. } if rkey == forged.rkey()),
        "{err}"
    );
    // As on an RC queue pair: the error state flushes later work.
    assert!(pair.agent_conn.is_broken());
    let err = within(pair.agent_conn.read(good)).await.unwrap_err();
    assert!(matches!(err, RdmaError::Closed(_)), "{err}");
    // The broken connection is not handed out again; a new one works.
    assert!(pair.agent.connection(pair.agent_conn.qpn()).is_none());
    pair.reconnect().await;
    assert_eq!(
        &within(pair.agent_conn.read(good)).await.unwrap()[..],
        &[7; 64]
    );
}

#[tokio::test]
async fn ranges_outside_the_region_are_refused() {
    let mut pair = Pair::start().await;
    // 4 KiB is exactly one size class, so the registered region is
    // [addr, addr + 4096).
    let input = pair
        .client
        .register(4096, Access::RemoteRead)
        .await
        .unwrap();
    let r = input.remote();
    let cases = [
        RemoteBuffer::new(r.addr() + 1, 4096, r.rkey()).unwrap(), // one past the end
        RemoteBuffer::new(r.addr() - 1, 2, r.rkey()).unwrap(),    // starts before
        RemoteBuffer::new(r.addr() + 4096, 1, r.rkey()).unwrap(), // entirely after
    ];
    for bad in cases {
        let err = within(pair.agent_conn.read(bad)).await.unwrap_err();
        assert!(
            matches!(err, RdmaError::RemoteAccess { .. }),
            "{bad}: {err}"
        );
        pair.reconnect().await;
    }
    // The end of the region itself is fine.
    let last = RemoteBuffer::new(r.addr() + 4095, 1, r.rkey()).unwrap();
    assert_eq!(within(pair.agent_conn.read(last)).await.unwrap().len(), 1);
    // addr + len overflowing u64 cannot even be described (the responder's
    // own overflow check is unit-tested in the emulation's wire module).
    assert!(matches!(
        RemoteBuffer::new(u64::MAX - 1, 2, r.rkey()),
        Err(RdmaError::OutOfBounds { .. })
    ));
    assert!(RemoteBuffer::parse("ffffffffffffffff:2:1").is_err());
    assert!(matches!(
        r.slice(1, u64::MAX),
        Err(RdmaError::OutOfBounds { .. })
    ));
}

#[tokio::test]
async fn access_flags_are_enforced() {
    let mut pair = Pair::start().await;
    let mut input = pair.client.register(16, Access::RemoteRead).await.unwrap();
    input.as_mut_slice().fill(1);
    let err = within(pair.agent_conn.write(input.remote(), &[9; 16]))
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::RemoteAccess { .. }), "{err}");
    assert_eq!(
        &input.as_slice()[..],
        &[1; 16],
        "a refused WRITE changed memory"
    );
    pair.reconnect().await;
    let output = pair.client.register(16, Access::RemoteWrite).await.unwrap();
    let err = within(pair.agent_conn.read(output.remote()))
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::RemoteAccess { .. }), "{err}");
    pair.reconnect().await;
    let local = pair.client.register(16, Access::Local).await.unwrap();
    let err = within(pair.agent_conn.read(local.remote()))
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::RemoteAccess { .. }), "{err}");
}

#[tokio::test]
async fn deregistered_region_is_refused() {
    let pair = Pair::start().await;
    let input = pair.client.register(100, Access::RemoteRead).await.unwrap();
    let remote = input.remote();
    input.deregister();
    let err = within(pair.agent_conn.read(remote)).await.unwrap_err();
    assert!(matches!(err, RdmaError::RemoteAccess { .. }), "{err}");
}

#[tokio::test]
async fn mr_cache_reuses_and_evicts_with_deregistration() {
    // Budget for one 4 KiB and one 8 KiB region... minus one byte.
    let config = RdmaConfig {
        mr_cache_bytes: 12 * 1024 - 1,
        ..RdmaConfig::default()
    };
    let mut pair = Pair::with_client_config(config).await;
    let mut a = pair
        .client
        .register(4096, Access::RemoteRead)
        .await
        .unwrap();
    a.as_mut_slice().fill(3);
    let a_remote = a.remote();
    drop(a); // idle in the cache, still registered
    assert_eq!(
        &within(pair.agent_conn.read(a_remote)).await.unwrap()[..],
        &[3; 4096]
    );

    // Same class and access: a hit on the same registration.
    let a = pair
        .client
        .register(4000, Access::RemoteRead)
        .await
        .unwrap();
    assert_eq!(a.remote().rkey(), a_remote.rkey());
    drop(a);
    let s = pair.client.mr_stats();
    assert_eq!((s.hits, s.misses, s.evictions), (1, 1, 0));
    assert_eq!(
        (s.registered_bytes, s.idle_bytes, s.regions),
        (4096, 4096, 1)
    );

    // An 8 KiB region does not fit next to it: the idle one is evicted.
    let b = pair
        .client
        .register(8192, Access::RemoteWrite)
        .await
        .unwrap();
    let s = pair.client.mr_stats();
    assert_eq!((s.hits, s.misses, s.evictions), (1, 2, 1));
    assert_eq!((s.registered_bytes, s.idle_bytes, s.regions), (8192, 0, 1));
    // ...and deregistered: its rkey no longer works.
    let err = within(pair.agent_conn.read(a_remote)).await.unwrap_err();
    assert!(matches!(err, RdmaError::RemoteAccess { .. }), "{err}");
    pair.reconnect().await;

    // With `b` in use, another 8 KiB region exceeds the budget.
    let err = pair
        .client
        .register(8192, Access::RemoteWrite)
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::RegistrationBudget { .. }), "{err}");
    drop(b);
    assert!(
        pair.client
            .register(8192, Access::RemoteWrite)
            .await
            .is_ok()
    );

    // The agent's staging buffers are pooled too: repeated READs hit.
    let input = pair
        .client
        .register(4096, Access::RemoteRead)
        .await
        .unwrap();
    let before = pair.agent.mr_stats();
    for _ in 0..3 {
        within(pair.agent_conn.read(input.remote())).await.unwrap();
    }
    let after = pair.agent.mr_stats();
    assert_eq!(after.misses, before.misses);
    assert_eq!(after.hits, before.hits + 3);
}

#[tokio::test]
async fn connections_are_cached_per_peer() {
    let pair = Pair::start().await;
    let again = handshake(&pair.client, &pair.agent, "agent-1")
        .await
        .unwrap();
    assert_eq!(again.qpn(), pair.agent_conn.qpn());
    let other = handshake(&pair.client, &pair.agent, "agent-2")
        .await
        .unwrap();
    assert_ne!(other.qpn(), pair.agent_conn.qpn());
}

#[tokio::test]
async fn fail_after_n_operations_then_closed_then_reconnect() {
    let mut pair = Pair::start().await;
    let mut input = pair
        .client
        .register(1024, Access::RemoteRead)
        .await
        .unwrap();
    input.as_mut_slice().fill(5);
    let faults = pair.agent.faults().expect("emulated engines have faults");
    faults.fail_after(2);
    for _ in 0..2 {
        within(pair.agent_conn.read(input.remote())).await.unwrap();
    }
    let err = within(pair.agent_conn.read(input.remote()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RdmaError::LinkBroken(ref m) if m.contains("injected")),
        "{err}"
    );
    let err = within(pair.agent_conn.read(input.remote()))
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::Closed(_)), "{err}");
    // While the link is down no new connection can be made.
    pair.client.disconnect("agent-1");
    let err = handshake(&pair.client, &pair.agent, "agent-1")
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::Connect(_)), "{err}");
    faults.restore();
    pair.reconnect().await;
    assert_eq!(
        &within(pair.agent_conn.read(input.remote())).await.unwrap()[..],
        &[5; 1024]
    );
}

#[tokio::test]
async fn breaking_the_link_fails_in_flight_operations() {
    let pair = Pair::start().await;
    let input = pair
        .client
        .register(1 << 20, Access::RemoteRead)
        .await
        .unwrap();
    // The client's responder goes silent, so the READ stays in flight.
    pair.client.faults().unwrap().stall();
    let conn = pair.agent_conn.clone();
    let remote = input.remote();
    let in_flight = tokio::spawn(async move { conn.read(remote).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!in_flight.is_finished());
    pair.agent.faults().unwrap().break_link();
    let err = within(in_flight).await.unwrap().unwrap_err();
    assert!(
        matches!(err, RdmaError::LinkBroken(ref m) if m.contains("injected")),
        "{err}"
    );
    let err = within(pair.agent_conn.write(input.remote(), b"x"))
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::Closed(_)), "{err}");
}

#[tokio::test]
async fn a_peer_whose_link_breaks_fails_operations_against_it() {
    let pair = Pair::start().await;
    let input = pair
        .client
        .register(4096, Access::RemoteRead)
        .await
        .unwrap();
    pair.client.faults().unwrap().stall();
    let conn = pair.agent_conn.clone();
    let remote = input.remote();
    let in_flight = tokio::spawn(async move { conn.read(remote).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The responder's side goes down: it drops the connection.
    pair.client.faults().unwrap().break_link();
    let err = within(in_flight).await.unwrap().unwrap_err();
    assert!(matches!(err, RdmaError::LinkBroken(_)), "{err}");
    assert!(pair.agent_conn.is_broken());
}

#[tokio::test]
async fn kinds_must_match() {
    let agent = RdmaEngine::emulated().await.unwrap();
    let verbs = EndpointInfo::decode(
        r#"{"kind":"verbs","gid":"fe80::1","lid":0,"qpn":17,"psn":1,"mtu":1024}"#,
    )
    .unwrap();
    let err = agent.accept(&verbs).await.unwrap_err();
    assert!(matches!(err, RdmaError::KindMismatch { .. }), "{err}");
    assert_eq!(agent.kind(), "emulated");
}
