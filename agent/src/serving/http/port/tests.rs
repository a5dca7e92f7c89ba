//! The port's limits, in-process over loopback TCP under a paused clock:
//! time moves only when every task waits, so "not answered within a
//! minute" means "not answered until something else happens".

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const GET_LIVE: &[u8] = b"GET /v2/health/live HTTP/1.1\r\nhost: agent\r\n\r\n";

fn app() -> Router {
    Router::new().route("/v2/health/live", get(|| async { StatusCode::OK }))
}

/// The port on a loopback address, serving until the returned token fires.
async fn start(
    max_connections: usize,
    limits: PortLimits,
) -> (std::net::SocketAddr, CancellationToken) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = BoundedListener::new(tcp, max_connections, "KServe HTTP");
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        None,
        app(),
        limits,
        stop.clone(),
        TaskTracker::new(),
    ));
    (addr, stop)
}

fn limits() -> PortLimits {
    PortLimits {
        handshake_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(3600),
    }
}

/// `f`, or a panic naming `what` if nothing happens for a day (of the
/// paused clock: a hang fails the test instead of stalling it).
async fn within_a_day<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(24 * 3600), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: nothing happened for a day"),
    }
}

/// Reads one response head (the health route answers with no body).
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "closed mid-response: {head:?}"
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Finding (issue 24): the REST port accepted every connection. At the cap
/// the (N+1)th waits in the kernel's backlog, unanswered, until one of the
/// N closes.
#[tokio::test(start_paused = true)]
async fn the_connection_beyond_the_cap_waits_until_one_closes() {
    let (addr, _stop) = start(2, limits()).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(GET_LIVE).await.unwrap();
        assert!(read_head(&mut s).await.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(GET_LIVE).await.unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_secs(60), third.read(&mut byte)).await;
    assert!(
        waited.is_err(),
        "the third connection was served at a cap of two"
    );

    drop(held.pop());
    let head = within_a_day("the third connection's answer", read_head(&mut third)).await;
    assert!(head.starts_with("HTTP/1.1 200"));
}

/// Finding (issue 24): a keep-alive HTTP/1.1 connection that sends nothing
/// more was held forever. It is closed `idle_timeout` after its last
/// request, not before.
#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_secs(45);
    let (addr, _stop) = start(
        16,
        PortLimits {
            idle_timeout: idle,
            ..limits()
        },
    )
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(GET_LIVE).await.unwrap();
    assert!(read_head(&mut s).await.starts_with("HTTP/1.1 200"));
    let answered = Instant::now();

    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(idle - Duration::from_secs(1), s.read(&mut byte)).await;
    assert!(early.is_err(), "closed before the idle timeout");
    let read = within_a_day("the idle connection's close", s.read(&mut byte)).await;
    assert_eq!(read.unwrap(), 0, "closed, nothing sent");
    assert!(answered.elapsed() >= idle);
}

/// A request in flight keeps its connection past the idle timeout; the
/// connection closes an idle timeout after the request ends.
#[tokio::test(start_paused = true)]
async fn a_request_in_flight_is_not_idle() {
    let idle = Duration::from_secs(45);
    let app = Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(100)).await;
            StatusCode::OK
        }),
    );
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = BoundedListener::new(tcp, 16, "KServe HTTP");
    let addr = listener.local_addr().unwrap();
    let limits = PortLimits {
        idle_timeout: idle,
        ..limits()
    };
    tokio::spawn(serve(
        listener,
        None,
        app,
        limits,
        CancellationToken::new(),
        TaskTracker::new(),
    ));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let sent = Instant::now();
    s.write_all(b"GET /slow HTTP/1.1\r\nhost: agent\r\n\r\n")
        .await
        .unwrap();
    assert!(read_head(&mut s).await.starts_with("HTTP/1.1 200"));
    assert!(sent.elapsed() >= Duration::from_secs(100));
    let answered = Instant::now();
    let mut byte = [0u8; 1];
    let read = within_a_day("the idle connection's close", s.read(&mut byte)).await;
    assert_eq!(read.unwrap(), 0);
    assert!(answered.elapsed() >= idle);
}

/// A connection that never sends a byte is closed after the handshake
/// timeout, as on the OIP port.
#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let (addr, _stop) = start(
        16,
        PortLimits {
            handshake_timeout: Duration::from_secs(10),
            ..limits()
        },
    )
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let opened = Instant::now();
    let mut byte = [0u8; 1];
    let read = within_a_day("the silent connection's close", s.read(&mut byte)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(opened.elapsed() >= Duration::from_secs(10));
}
