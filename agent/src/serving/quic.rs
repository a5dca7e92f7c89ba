//! The QUIC rung (`[transport] quic = "on"`, issue 13): `ModelInfer` on one
//! bidirectional QUIC stream per request, framed as
//! [`infermesh_proto::quic`] describes, over TLS 1.3 with the agent's
//! certificate (reloaded with it) and its client-certificate rules.
//!
//! Bounded like the OIP port: connections (`limits.max_connections`;
//! beyond it new ones are refused), streams per connection
//! (`limits.max_concurrent_streams`), request size (`max_message_bytes`),
//! idle connections (`limits.idle_timeout`), and the time to receive a
//! request (`limits.read_timeout`). Requests are served by the OIP port's
//! pass-through path ([`InferPath`]), so admission, queues, metrics and the
//! load report are the same as on gRPC, and so are the bytes: the request
//! frame's header ends in the layout of a gRPC message frame (flag 0, then
//! the length), so the request goes to the worker as a five-byte gRPC
//! header and the chunks quinn received it in, uncopied (issue 27; before,
//! they were gathered into one buffer first), and the worker's gRPC
//! response message goes back
//! as it came, chunk by chunk as the worker sends it (within QUIC's flow
//! control; nothing waits for the whole answer), followed by the load
//! report. Nothing is decoded and encoded again (before, a QUIC request
//! took the decoding path and a 1 MiB tensor was copied four more times
//! than on gRPC). An answer that breaks off after part of it was sent
//! resets the stream, so the client re-sends the request on its next path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use infermesh_proto::quic::{
    Answer, FrameError, REQUEST_HEADER, encode_report, encode_response, request_header,
};
use infermesh_transport::quic;
use quinn::crypto::rustls::QuicServerConfig;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::dispatch::pool::Pool;
use crate::serving::forward::InferPath;
use crate::serving::grpc::{FRAME_HEADER, MODEL_INFER_PATH, frame_header};
use crate::serving::load_report::add_report;
use crate::serving::server::Shutdown;
use crate::tls::ServerTls;

/// Limits of the QUIC endpoint.
#[derive(Debug, Clone, Copy)]
pub struct QuicLimits {
    /// Connections at once.
    pub max_connections: usize,
    /// Streams (requests) at once per connection.
    pub max_streams: u32,
    /// Largest request or response message.
    pub max_message_bytes: usize,
    /// A connection idle this long is closed.
    pub idle_timeout: Duration,
    /// Longest time to receive one request.
    pub read_timeout: Duration,
}

/// Binds the UDP endpoint at `addr` with `tls`'s QUIC configuration.
pub fn bind(
    addr: SocketAddr,
    tls: &ServerTls,
    limits: &QuicLimits,
) -> std::io::Result<quinn::Endpoint> {
    let crypto = QuicServerConfig::try_from(Arc::clone(&tls.quic))
        .map_err(|e| std::io::Error::other(format!("QUIC TLS configuration: {e}")))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quic::transport_config();
    transport
        .max_concurrent_bidi_streams(limits.max_streams.into())
        .max_concurrent_uni_streams(0u32.into())
        .max_idle_timeout(limits.idle_timeout.try_into().ok());
    server.transport_config(Arc::new(transport));
    quic::endpoint(addr, Some(server))
}

/// Serves `endpoint` until `shutdown.graceful` (no new connections or
/// streams; open streams finish) or `shutdown.hard`.
pub async fn serve(
    endpoint: quinn::Endpoint,
    infer: InferPath,
    pool: Arc<Pool>,
    limits: QuicLimits,
    shutdown: Shutdown,
    tasks: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => return,
            },
            _ = shutdown.graceful.cancelled() => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::debug!(remote = %incoming.remote_address(), "QUIC connection limit reached: refused");
            incoming.refuse();
            continue;
        };
        let (infer, pool, shutdown, spawner) = (
            infer.clone(),
            Arc::clone(&pool),
            shutdown.clone(),
            tasks.clone(),
        );
        tasks.spawn(async move {
            let _permit = permit;
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC handshake failed");
                    return;
                }
            };
            connection(conn, infer, pool, limits, shutdown, spawner).await;
        });
    }
    endpoint.set_server_config(None);
    tokio::select! {
        _ = endpoint.wait_idle() => {}
        _ = shutdown.hard.cancelled() => endpoint.close(0u32.into(), b"agent stopping"),
    }
}

async fn connection(
    conn: quinn::Connection,
    infer: InferPath,
    pool: Arc<Pool>,
    limits: QuicLimits,
    shutdown: Shutdown,
    tasks: TaskTracker,
) {
    // This connection's streams, to let them finish before it closes.
    let streams = TaskTracker::new();
    loop {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC connection ended");
                    return;
                }
            },
            _ = shutdown.graceful.cancelled() => break,
        };
        let (infer, pool, hard, mine) = (
            infer.clone(),
            Arc::clone(&pool),
            shutdown.hard.clone(),
            streams.token(),
        );
        tasks.spawn(async move {
            tokio::select! {
                _ = stream(infer, pool, limits, send, recv) => {}
                _ = hard.cancelled() => {}
            }
            drop(mine);
        });
    }
    // Stopping: no new streams; the open ones finish (or the hard stop
    // comes), then the connection closes.
    streams.close();
    tokio::select! {
        _ = streams.wait() => {}
        _ = shutdown.hard.cancelled() => {}
    }
    conn.close(0u32.into(), b"agent stopping");
}

async fn stream(
    infer: InferPath,
    pool: Arc<Pool>,
    limits: QuicLimits,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let read = tokio::time::timeout(
        limits.read_timeout,
        read_request(&mut recv, limits.max_message_bytes),
    )
    .await;
    let refused = |code: tonic::Code, message: String| {
        let mut report = HeaderMap::new();
        add_report(&pool, &mut report);
        (Answer::Status(code as i32, message), report)
    };
    let (status, trailers) = match read {
        Ok(Ok((frame, timeout_ms))) => match relay(&infer, frame, timeout_ms, &mut send).await {
            Relayed::Sent => {
                let _ = send.finish();
                let _ = send.stopped().await;
                return;
            }
            Relayed::Unsent(status, trailers) => (status, *trailers),
            Relayed::Broken(why) => {
                // Part of an answer is out and the rest cannot follow: the
                // client sees the stream reset and sends the request again
                // on its next path.
                tracing::debug!(%why, "QUIC answer cut off: stream reset");
                let _ = send.reset(RESET_BROKEN_ANSWER.into());
                return;
            }
            Relayed::Gone => return,
        },
        Ok(Err(ReadError::TooLong(len))) => refused(
            tonic::Code::ResourceExhausted,
            format!(
                "request of {len} bytes is over max_message_bytes ({})",
                limits.max_message_bytes
            ),
        ),
        Ok(Err(ReadError::Malformed(why))) => {
            refused(tonic::Code::InvalidArgument, format!("QUIC frame: {why}"))
        }
        Ok(Err(ReadError::Stream(e))) => {
            tracing::debug!(error = %e, "QUIC request not received");
            return;
        }
        Err(_) => refused(
            tonic::Code::DeadlineExceeded,
            "the request did not arrive within read_timeout".into(),
        ),
    };
    let frame = encode_response(&status, &report_of(&trailers));
    if send.write_chunk(frame).await.is_ok() {
        let _ = send.finish();
        // Wait until the peer has the bytes (or the stream is gone), so
        // that a closing connection does not cut the response short.
        let _ = send.stopped().await;
    }
}

/// The QUIC error code of a stream reset because the worker's answer broke
/// off after part of it was sent.
const RESET_BROKEN_ANSWER: u32 = 1;

/// The load report: an answer's trailers but the gRPC status, which the
/// frame carries itself.
fn report_of(trailers: &HeaderMap) -> Vec<(&str, &[u8])> {
    trailers
        .iter()
        .filter(|(n, _)| !n.as_str().starts_with("grpc-"))
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect()
}

/// Why a request frame could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("request of {0} bytes is over the limit")]
    TooLong(usize),
    #[error("{0}")]
    Malformed(String),
    #[error(transparent)]
    Stream(#[from] quinn::ReadError),
}

/// Reads a request frame as the chunks it arrives in (quinn's own buffers:
/// nothing is copied into one frame); returns the gRPC message frame — a
/// five-byte header (flag 0, then the length the request header states)
/// followed by those chunks — and the timeout. The pass-through reads a
/// message in several chunks where it lies and sends the chunks on to the
/// worker as they are ([`crate::request_view`]).
async fn read_request(
    recv: &mut quinn::RecvStream,
    max_bytes: usize,
) -> Result<(Vec<Bytes>, u32), ReadError> {
    let mut head = [0u8; REQUEST_HEADER];
    recv.read_exact(&mut head).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(_) => {
            ReadError::Malformed("request shorter than its header".into())
        }
        quinn::ReadExactError::ReadError(e) => ReadError::Stream(e),
    })?;
    let (timeout_ms, len) =
        request_header(&head).map_err(|FrameError(why)| ReadError::Malformed(why))?;
    if len > max_bytes {
        return Err(ReadError::TooLong(len));
    }
    let mut header = BytesMut::with_capacity(FRAME_HEADER);
    header.put_u8(0);
    header.put_slice(&head[5..9]);
    let mut chunks = vec![header.freeze()];
    let mut received = 0;
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
        received += chunk.bytes.len();
        if received > len {
            return Err(ReadError::Malformed(
                "request longer than its header says".into(),
            ));
        }
        chunks.push(chunk.bytes);
    }
    if received != len {
        return Err(ReadError::Malformed(
            "request shorter than its header says".into(),
        ));
    }
    Ok((chunks, timeout_ms))
}

/// A request body already received, as its chunks.
struct Received(std::collections::VecDeque<Bytes>);

impl http_body::Body for Received {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// How a relayed answer ended.
enum Relayed {
    /// The worker's message and the load report were written.
    Sent,
    /// Nothing was written: the answer is this status (and report).
    Unsent(Answer, Box<HeaderMap>),
    /// Part of the message was written and the rest cannot follow.
    Broken(String),
    /// The client is gone.
    Gone,
}

/// Serves one request frame on the pass-through path and writes the
/// worker's gRPC response message to `send` as its chunks arrive (no
/// whole-message buffering: the first bytes go out while the worker is
/// still sending the rest, within QUIC's flow control), then the load
/// report from the trailers. The message is checked as it passes: one
/// uncompressed gRPC frame, exactly as long as its header says.
async fn relay(
    infer: &InferPath,
    frame: Vec<Bytes>,
    timeout_ms: u32,
    send: &mut quinn::SendStream,
) -> Relayed {
    let mut req = http::Request::post(MODEL_INFER_PATH)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Received(frame.into()))
        .expect("a path and static headers make a request");
    if timeout_ms > 0 {
        let value = http::HeaderValue::from_str(&format!("{timeout_ms}m")).expect("digits");
        req.headers_mut().insert("grpc-timeout", value);
    }
    let (head, mut body) = infer
        .call_via(req, crate::metrics::TransportPath::Quic, None)
        .await
        .into_parts();
    let internal = |why: String| Answer::Status(tonic::Code::Internal as i32, why);
    let mut message = MessageCheck::default();
    // The first bytes wait until the frame header is whole and checked.
    let mut held: Vec<Bytes> = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    continue;
                }
            },
            Err(status) => {
                let mut report = HeaderMap::new();
                let _ = status.add_header(&mut report);
                return match message.sent {
                    0 => Relayed::Unsent(internal(status.message().to_string()), Box::new(report)),
                    _ => Relayed::Broken(status.message().to_string()),
                };
            }
        };
        if let Err(why) = message.pass(&data) {
            return match message.sent {
                0 => Relayed::Unsent(internal(why.into()), Box::default()),
                _ => Relayed::Broken(why.into()),
            };
        }
        held.push(data);
        if message.checked() {
            if message.sent == 0 {
                // Smaller answers first (`quic::stream_priority`).
                let len = message.len.unwrap_or(0);
                let _ = send.set_priority(quic::stream_priority(len));
            }
            if send.write_all_chunks(&mut held).await.is_err() {
                return Relayed::Gone;
            }
            message.sent += held.iter().map(Bytes::len).sum::<usize>();
            held.clear();
        }
    }
    // A trailers-only answer carries its status in the headers.
    let trailers = trailers.unwrap_or(head.headers);
    let status = tonic::Status::from_header_map(&trailers);
    let ok = status.as_ref().is_some_and(|s| s.code() == tonic::Code::Ok);
    match (ok, message.complete(), message.sent) {
        (true, Ok(()), _) => {
            held.push(encode_report(&report_of(&trailers)));
            match send.write_all_chunks(&mut held).await {
                Ok(()) => Relayed::Sent,
                Err(_) => Relayed::Gone,
            }
        }
        (true, Err(why), 0) => Relayed::Unsent(internal(why.into()), Box::new(trailers)),
        (true, Err(why), _) => Relayed::Broken(why.into()),
        (false, _, 0) => {
            let answer = match status {
                Some(s) => Answer::Status(s.code() as i32, s.message().to_string()),
                None => internal("the response ended without a gRPC status".into()),
            };
            Relayed::Unsent(answer, Box::new(trailers))
        }
        (false, _, _) => Relayed::Broken("the worker failed after part of its answer".into()),
    }
}

/// Checks, as its chunks pass, that a worker's answer is one uncompressed
/// gRPC message frame.
#[derive(Default)]
struct MessageCheck {
    /// The frame header, as far as it has arrived.
    header: [u8; FRAME_HEADER],
    seen: usize,
    /// The message's length, once the header is whole.
    len: Option<usize>,
    /// Bytes written to the client.
    sent: usize,
}

const NOT_ONE_MESSAGE: &str = "the worker's response is not one uncompressed gRPC message";

impl MessageCheck {
    fn pass(&mut self, data: &[u8]) -> Result<(), &'static str> {
        if self.len.is_none() {
            let n = (FRAME_HEADER - self.seen).min(data.len());
            self.header[self.seen..self.seen + n].copy_from_slice(&data[..n]);
            self.seen += n;
            if self.seen == FRAME_HEADER {
                let (compressed, len) = frame_header(&self.header);
                if compressed {
                    return Err(NOT_ONE_MESSAGE);
                }
                self.len = Some(len);
                self.seen = FRAME_HEADER;
                return self.pass_body(data.len() - n);
            }
            return Ok(());
        }
        self.pass_body(data.len())
    }

    fn pass_body(&mut self, n: usize) -> Result<(), &'static str> {
        self.seen += n;
        match self.len {
            Some(len) if self.seen > FRAME_HEADER + len => {
                Err("the worker's response is not one gRPC message")
            }
            _ => Ok(()),
        }
    }

    /// The header is whole and good: what was held may go out.
    fn checked(&self) -> bool {
        self.len.is_some()
    }

    fn complete(&self) -> Result<(), &'static str> {
        match self.len {
            Some(len) if self.seen == FRAME_HEADER + len => Ok(()),
            Some(_) => Err("the worker's response is not one gRPC message"),
            None => Err(NOT_ONE_MESSAGE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(message: &[u8]) -> Bytes {
        let mut f = vec![0u8];
        f.extend_from_slice(&(message.len() as u32).to_be_bytes());
        f.extend_from_slice(message);
        f.into()
    }

    fn check_message(chunks: &[Bytes]) -> Result<(), &'static str> {
        let mut check = MessageCheck::default();
        for c in chunks {
            check.pass(c)?;
        }
        check.complete()
    }

    #[test]
    fn a_worker_message_passes_only_as_one_uncompressed_frame() {
        let whole = grpc(b"hello");
        assert_eq!(check_message(std::slice::from_ref(&whole)), Ok(()));
        // Split anywhere, even inside the header, it is the same frame.
        for at in 0..whole.len() {
            let parts = [whole.slice(..at), whole.slice(at..)];
            assert_eq!(check_message(&parts), Ok(()), "split at {at}");
        }
        assert!(check_message(&[]).is_err(), "no message");
        assert!(check_message(&[whole.slice(..4)]).is_err(), "cut header");
        assert!(check_message(&[whole.slice(..7)]).is_err(), "cut message");
        let mut two = whole.to_vec();
        two.extend_from_slice(&whole);
        assert!(check_message(&[two.into()]).is_err(), "two messages");
        let mut compressed = whole.to_vec();
        compressed[0] = 1;
        assert!(check_message(&[compressed.into()]).is_err(), "compressed");
    }
}
