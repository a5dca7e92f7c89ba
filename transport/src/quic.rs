//! The UDP endpoint and transport settings both ends of the QUIC rung use
//! (the agent's `serving::quic`, the client's `paths::quic`), in one place
//! so that the two ends cannot drift apart: several settings only work when
//! both ends have them (a peer's `max_udp_payload_size` caps what the other
//! sends). Why each value: BENCHMARKS.md and docs/DECISIONS.md (issue 27).
//!
//! Packets as large as the path carries: on loopback (64 KiB MTU) a 1 MiB
//! tensor is 16 datagrams rather than ~870 of quinn's starting 1,200 bytes,
//! and each packet costs quinn a seal or open, a header protection, frame
//! assembly and acknowledgement work in user space. Path-MTU discovery
//! probes up to [`MAX_UDP_PAYLOAD`]; on a 1,500-byte Ethernet path its
//! probes are lost and it settles at ~1,450.
//!
//! The socket is wrapped ([`GsoBounded`]) because quinn does not know the
//! kernel's limit on one GSO send: it batches up to ten datagrams of the
//! current MTU into one `sendmsg`, and a batch over 64 KiB in all — four
//! 16 KiB datagrams — is refused with `EMSGSIZE`, which `quinn-udp` drops
//! without a word (it expects that error only of MTU probes). Every large
//! batch was lost, quinn's black-hole detection took the losses for an MTU
//! problem and fell back to 1,200 bytes for a minute at a time, and the
//! larger packets never held under load.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, UdpPoller};

/// Largest UDP payload either end accepts and the upper bound of path-MTU
/// discovery: the most an IPv4 datagram carries (65,535 bytes less the IP
/// and UDP headers), so loopback's 64 KiB MTU is used whole.
pub const MAX_UDP_PAYLOAD: u16 = 65_507;

/// Most bytes one `sendmsg` may carry: the kernel refuses a UDP send whose
/// payload, with its headers, would not fit one IPv4 datagram, GSO or not.
pub const MAX_SEND_BYTES: usize = MAX_UDP_PAYLOAD as usize;

/// The receive and send buffer both ends ask for on their UDP socket. The
/// kernel's default (`net.core.rmem_default`, 208 KiB on most hosts) holds
/// few large datagrams: sixteen 1 MiB answers at once overflowed it on
/// loopback (0.85% of datagrams dropped, `UdpRcvbufErrors`), and each drop
/// is a loss to quinn's congestion control. The kernel caps the request at
/// `net.core.rmem_max` / `wmem_max` (README: raise them for QUIC).
pub const UDP_SOCKET_BUFFER: usize = 4 << 20;

/// Flow-control windows: a 16 MiB tensor in one stream's window, several
/// at once per connection.
pub const STREAM_WINDOW: u32 = 16 << 20;
/// The connection's receive and send window.
pub const CONNECTION_WINDOW: u32 = 64 << 20;

/// How long path-MTU discovery waits after a suspected black hole before
/// it probes again (quinn's default: a minute). Losses of large packets
/// that are not an MTU problem — a receive buffer overrun on a busy host —
/// can look like one (seen on loopback under load, `black_holes_detected`
/// 1 in three of eight runs), and every second of the wait is spent at
/// 1,200-byte packets; a search costs a few probe packets.
pub const BLACK_HOLE_COOLDOWN: Duration = Duration::from_secs(2);

/// The transport settings both ends start from (the agent adds its stream
/// and idle limits, the client its keep-alive).
///
/// Streams are sent in the order they were written, not round-robin
/// (`send_fairness` off): each stream carries one whole request or answer,
/// and with sixteen 1 MiB requests interleaved they all finished together,
/// so the answers only began when every upload was done and the two
/// directions took turns instead of overlapping (on the scripted 200 Mbit/s
/// link: 13 req/s against 20–22 in order; BENCHMARKS.md, issue 27). Short
/// messages are not held behind long ones: each end gives a stream its
/// [`stream_priority`].
pub fn transport_config() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD)
        .black_hole_cooldown(BLACK_HOLE_COOLDOWN);
    transport
        .mtu_discovery_config(Some(mtu))
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(CONNECTION_WINDOW.into())
        .send_fairness(false);
    transport
}

/// The send priority of a stream that carries `len` bytes: higher for
/// shorter messages, one step per power of two (quinn sends a higher
/// priority's data first; within one, streams go in the order written, see
/// [`transport_config`]). Without it a 1 KiB request written after sixteen
/// 1 MiB ones would wait for all of them.
pub fn stream_priority(len: usize) -> i32 {
    -((usize::BITS - len.leading_zeros()) as i32)
}

/// A quinn endpoint on a UDP socket bound at `addr` (buffers of
/// [`UDP_SOCKET_BUFFER`] asked for each way), accepting datagrams of
/// [`MAX_UDP_PAYLOAD`]; a server when `server` is given.
pub fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> io::Result<quinn::Endpoint> {
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .map_err(|e| io::Error::other(format!("QUIC endpoint configuration: {e}")))?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let socket = GsoBounded(runtime.wrap_udp_socket(udp_socket(addr)?)?);
    quinn::Endpoint::new_with_abstract_socket(config, server, Arc::new(socket), runtime)
}

/// A UDP socket bound at `addr` with [`UDP_SOCKET_BUFFER`] asked for each
/// way (the kernel may give less: `net.core.rmem_max`, `wmem_max`).
fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_recv_buffer_size(UDP_SOCKET_BUFFER)?;
    socket.set_send_buffer_size(UDP_SOCKET_BUFFER)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// quinn's UDP socket with its GSO batches cut to what one `sendmsg` may
/// carry ([`MAX_SEND_BYTES`]); everything else as quinn's own.
#[derive(Debug)]
pub struct GsoBounded(Arc<dyn AsyncUdpSocket>);

impl AsyncUdpSocket for GsoBounded {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.0).create_io_poller()
    }

    /// Sends the batch in parts of whole datagrams, each at most
    /// [`MAX_SEND_BYTES`]. Should a part after the first find the socket
    /// full, the whole batch is reported blocked and quinn sends it again
    /// once the socket has room: the receiver drops the datagrams it
    /// already has as duplicates, where a part left unsent would be lost.
    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        for part in parts(transmit) {
            self.0.try_send(&part)?;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.0.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.0.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.0.may_fragment()
    }
}

/// `transmit` cut into sends of whole datagrams of at most
/// [`MAX_SEND_BYTES`] each (itself when it fits).
fn parts<'a>(transmit: &Transmit<'a>) -> impl Iterator<Item = Transmit<'a>> {
    let segment = transmit.segment_size.unwrap_or(transmit.contents.len());
    let per_send = match transmit.contents.len() <= MAX_SEND_BYTES {
        true => transmit.contents.len(),
        false => (MAX_SEND_BYTES / segment.max(1)).max(1) * segment,
    };
    let (destination, ecn, src_ip) = (transmit.destination, transmit.ecn, transmit.src_ip);
    transmit
        .contents
        .chunks(per_send.max(1))
        .map(move |contents| Transmit {
            destination,
            ecn,
            contents,
            segment_size: (contents.len() > segment).then_some(segment),
            src_ip,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transmit(contents: &[u8], segment_size: Option<usize>) -> Transmit<'_> {
        Transmit {
            destination: SocketAddr::from(([127, 0, 0, 1], 1)),
            ecn: None,
            contents,
            segment_size,
            src_ip: None,
        }
    }

    /// Ten 16 KiB datagrams (160 KiB, which the kernel refuses in one
    /// send) go as sends of whole datagrams within the limit, in order.
    #[test]
    fn a_batch_over_the_send_limit_is_cut_at_datagram_boundaries() {
        let data: Vec<u8> = (0..10 * 16384).map(|i| (i / 16384) as u8).collect();
        let sends: Vec<_> = parts(&transmit(&data, Some(16384))).collect();
        let lens: Vec<_> = sends.iter().map(|t| t.contents.len()).collect();
        assert_eq!(lens, [3 * 16384, 3 * 16384, 3 * 16384, 16384]);
        assert_eq!(
            sends.iter().map(|t| t.segment_size).collect::<Vec<_>>(),
            [Some(16384), Some(16384), Some(16384), None]
        );
        assert_eq!(sends.concat_contents(), data);
        // A short last datagram stays whole at the end.
        let data = vec![7u8; 2 * 40_000 + 5];
        let sends: Vec<_> = parts(&transmit(&data, Some(40_000))).collect();
        let lens: Vec<_> = sends.iter().map(|t| t.contents.len()).collect();
        assert_eq!(lens, [40_000, 40_000, 5]);
        assert!(sends.iter().all(|t| t.segment_size.is_none()));
    }

    #[test]
    fn shorter_messages_have_higher_priority() {
        assert!(stream_priority(1024) > stream_priority(1 << 20));
        assert!(stream_priority(1 << 20) > stream_priority(16 << 20));
        assert_eq!(stream_priority(1 << 20), stream_priority((1 << 20) + 1000));
        assert_eq!(stream_priority(0), 0);
    }

    /// A batch within the limit, and a single datagram, are sent as they
    /// are.
    #[test]
    fn a_batch_within_the_limit_is_one_send() {
        let data = vec![1u8; 10 * 1452];
        let sends: Vec<_> = parts(&transmit(&data, Some(1452))).collect();
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].contents.len(), data.len());
        assert_eq!(sends[0].segment_size, Some(1452));
        let data = vec![1u8; MAX_SEND_BYTES];
        let sends: Vec<_> = parts(&transmit(&data, None)).collect();
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].segment_size, None);
    }

    trait Concat {
        fn concat_contents(&self) -> Vec<u8>;
    }

    impl Concat for Vec<Transmit<'_>> {
        fn concat_contents(&self) -> Vec<u8> {
            self.iter()
                .flat_map(|t| t.contents.iter().copied())
                .collect()
        }
    }
}
