//! The endpoint and transport settings both ends of the QUIC rung share
//! ([`quic::endpoint`], [`quic::transport_config`]), over loopback.
//!
//! Finding (issue 27): the rung's larger packets did not hold under load.
//! quinn batches up to ten datagrams of the path MTU into one GSO send;
//! past 64 KiB in all the kernel refuses it (`EMSGSIZE`) and `quinn-udp`
//! drops it without a word, so every large batch was lost and quinn's
//! black-hole detection fell back to 1,200-byte packets.
//!
//! Streams go in the order written (not round-robin), so a short message
//! must not wait behind long ones: [`quic::stream_priority`].

use std::net::SocketAddr;
use std::sync::Arc;

use infermesh_transport::quic;

/// A server endpoint on loopback that echoes every stream (and tells
/// `received` the length of each request as it has it whole), and its
/// certificate.
fn echo_server(
    received: tokio::sync::mpsc::UnboundedSender<usize>,
) -> (
    quinn::Endpoint,
    quinn::rustls::pki_types::CertificateDer<'static>,
) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = cert.der().clone();
    let key = quinn::rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    let mut server = quinn::ServerConfig::with_single_cert(vec![der.clone()], key.into()).unwrap();
    server.transport_config(Arc::new(quic::transport_config()));
    let endpoint = quic::endpoint(SocketAddr::from(([127, 0, 0, 1], 0)), Some(server)).unwrap();
    let accepting = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let received = received.clone();
            tokio::spawn(async move {
                let conn = incoming.await.unwrap();
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let received = received.clone();
                    tokio::spawn(async move {
                        let data = recv.read_to_end(usize::MAX).await.unwrap();
                        let _ = received.send(data.len());
                        send.write_all(&data).await.unwrap();
                        send.finish().unwrap();
                        let _ = send.stopped().await;
                    });
                }
            });
        }
    });
    (endpoint, der)
}

/// Sends `streams` streams of `bytes` at once and checks each comes back.
async fn echo_all(conn: &quinn::Connection, streams: usize, bytes: usize) {
    let mut tasks = Vec::new();
    for i in 0..streams {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let data = vec![i as u8; bytes];
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(&data).await.unwrap();
            send.finish().unwrap();
            let back = recv.read_to_end(usize::MAX).await.unwrap();
            assert!(back == data, "stream {i} came back changed");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A client connection to a fresh echo server, and the server's record of
/// the requests it received.
async fn connect() -> (
    quinn::Endpoint,
    quinn::Connection,
    tokio::sync::mpsc::UnboundedReceiver<usize>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (server, cert) = echo_server(tx);
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    client.transport_config(Arc::new(quic::transport_config()));
    let endpoint = quic::endpoint(SocketAddr::from(([127, 0, 0, 1], 0)), None).unwrap();
    let conn = endpoint
        .connect_with(client, server.local_addr().unwrap(), "localhost")
        .unwrap()
        .await
        .unwrap();
    (endpoint, conn, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_transfers_keep_large_packets_on_loopback() {
    let (endpoint, conn, _received) = connect().await;
    // Path-MTU discovery probes while data flows: small exchanges until it
    // has found more than an Ethernet MTU (loopback's is 64 KiB).
    let mut rounds = 0;
    while conn.stats().path.current_mtu <= 1500 {
        rounds += 1;
        assert!(
            rounds < 1000,
            "path-MTU discovery never rose above 1,500 bytes"
        );
        echo_all(&conn, 1, 1024).await;
    }
    // Bulk: large GSO batches in both directions.
    for _ in 0..4 {
        echo_all(&conn, 8, 1 << 20).await;
    }
    let path = conn.stats().path;
    assert_eq!(path.black_holes_detected, 0, "{path:?}");
    assert!(path.current_mtu > 1500, "{path:?}");
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
}

/// A 1 KiB request written just after a 16 MiB one (both queued before
/// the connection sends anything: one thread, no await between them)
/// arrives first. In write order alone (`send_fairness` off, no
/// priorities) the 16 MiB one went first.
#[tokio::test]
async fn a_short_request_is_not_held_behind_a_long_one() {
    let (endpoint, conn, mut received) = connect().await;
    let mut streams = Vec::new();
    for len in [16 << 20, 1024] {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        send.set_priority(quic::stream_priority(len)).unwrap();
        send.write_all(&vec![1u8; len]).await.unwrap();
        send.finish().unwrap();
        streams.push(recv);
    }
    assert_eq!(received.recv().await, Some(1024));
    assert_eq!(received.recv().await, Some(16 << 20));
    for mut recv in streams {
        recv.read_to_end(usize::MAX).await.unwrap();
    }
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
}
