//! The emulated RC queue pair: a TCP connection to the peer's responder,
//! with a writer task sending requests and a reader task turning responses
//! into work completions. Reading and writing run independently, so a large
//! READ response and a large WRITE request can cross without deadlock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};

use super::Endpoint;
use super::faults::{LinkState, broken};
use super::wire::{MAX_PAYLOAD, RESPONSE_LEN, Request, Response, WireStatus};
use crate::memory::RegionMemory;
use crate::verbs::{BoxFuture, Completion, Opcode, QueuePair, WcStatus, WorkRequest};
use crate::{EmulatedQpInfo, EndpointInfo, RdmaError};

const LINK_BROKEN: &str = "link broken (injected fault)";

pub(super) struct EmulatedQp {
    qpn: u32,
    endpoint: Arc<Endpoint>,
    state: Arc<Mutex<QpState>>,
    /// Set by `connect`.
    outgoing: OnceLock<mpsc::UnboundedSender<Outgoing>>,
}

#[derive(Default)]
struct QpState {
    /// `Some(reason)` once in the error state.
    error: Option<String>,
    pending: HashMap<u64, Pending>,
}

struct Pending {
    wr: WorkRequest,
    reply: oneshot::Sender<Completion>,
}

/// What the writer task needs to send one request.
struct Outgoing {
    request: Request,
    /// The local buffer, for a WRITE's payload.
    source: Option<(Arc<RegionMemory>, usize)>,
}

impl EmulatedQp {
    pub(super) fn new(qpn: u32, endpoint: Arc<Endpoint>) -> Self {
        EmulatedQp {
            qpn,
            endpoint,
            state: Arc::default(),
            outgoing: OnceLock::new(),
        }
    }

    /// Checks the local SGE as an HCA checks its lkey and length.
    fn local_sge_ok(&self, wr: &WorkRequest) -> bool {
        self.endpoint
            .region(wr.local.lkey())
            .is_some_and(|r| Arc::ptr_eq(&r.mem, wr.local.memory()))
            && wr.remote.len() == wr.local.len() as u64
    }
}

impl QueuePair for EmulatedQp {
    fn local_info(&self) -> EndpointInfo {
        EndpointInfo::Emulated(EmulatedQpInfo {
            addr: self.endpoint.addr,
            qpn: self.qpn,
        })
    }

    fn connect(&self, peer: EndpointInfo) -> BoxFuture<'_, Result<(), RdmaError>> {
        Box::pin(async move {
            let EndpointInfo::Emulated(peer) = peer else {
                return Err(RdmaError::KindMismatch {
                    local: "emulated",
                    peer: peer.kind(),
                });
            };
            if self.endpoint.faults().is_broken() {
                return Err(RdmaError::Connect(LINK_BROKEN.into()));
            }
            let stream = TcpStream::connect(peer.addr)
                .await
                .map_err(|e| RdmaError::Connect(format!("emulated peer {}: {e}", peer.addr)))?;
            let _ = stream.set_nodelay(true);
            let (reader, writer) = stream.into_split();
            let (tx, rx) = mpsc::unbounded_channel();
            if self.outgoing.set(tx).is_err() {
                return Err(RdmaError::Connect("queue pair already connected".into()));
            }
            let link = self.endpoint.faults().subscribe();
            tokio::spawn(write_requests(
                writer,
                rx,
                Arc::clone(&self.state),
                link.clone(),
            ));
            tokio::spawn(read_responses(reader, Arc::clone(&self.state), link));
            Ok(())
        })
    }

    fn post(&self, wr: WorkRequest) -> oneshot::Receiver<Completion> {
        let (reply, rx) = oneshot::channel();
        let mut state = lock(&self.state);
        if let Some(reason) = &state.error {
            let detail = format!("work request flushed: queue pair in error state ({reason})");
            let _ = reply.send(Completion::new(wr, WcStatus::Flushed, Some(detail)));
            return rx;
        }
        let Some(outgoing) = self.outgoing.get() else {
            let detail = "queue pair is not connected".to_string();
            let _ = reply.send(Completion::new(wr, WcStatus::Flushed, Some(detail)));
            return rx;
        };
        if !self.local_sge_ok(&wr) {
            state.error = Some("local protection error".into());
            let _ = reply.send(Completion::new(wr, WcStatus::LocalProtection, None));
            return rx;
        }
        if self.endpoint.faults().on_post() {
            let _ = reply.send(Completion::new(
                wr,
                WcStatus::RetryExceeded,
                Some(LINK_BROKEN.into()),
            ));
            fail_all(&mut state, LINK_BROKEN);
            drop(state);
            self.endpoint.faults().break_link();
            return rx;
        }
        let request = Request {
            opcode: wr.opcode,
            wr_id: wr.wr_id,
            rkey: wr.remote.rkey(),
            addr: wr.remote.addr(),
            len: wr.remote.len(),
        };
        let source =
            (wr.opcode == Opcode::Write).then(|| (Arc::clone(wr.local.memory()), wr.local.len()));
        state.pending.insert(wr.wr_id, Pending { wr, reply });
        if outgoing.send(Outgoing { request, source }).is_err() {
            fail_all(&mut state, "connection to the peer is gone");
        }
        rx
    }

    fn is_broken(&self) -> bool {
        lock(&self.state).error.is_some()
    }
}

fn lock(state: &Mutex<QpState>) -> std::sync::MutexGuard<'_, QpState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Enters the error state: everything in flight completes with "retry
/// exceeded" (the transport gave up), as on hardware.
fn fail_all(state: &mut QpState, reason: &str) {
    if state.error.is_none() {
        state.error = Some(reason.to_string());
    }
    for (_, p) in state.pending.drain() {
        let _ = p.reply.send(Completion::new(
            p.wr,
            WcStatus::RetryExceeded,
            Some(reason.to_string()),
        ));
    }
}

async fn write_requests(
    mut writer: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    state: Arc<Mutex<QpState>>,
    mut link: watch::Receiver<LinkState>,
) {
    loop {
        let next = tokio::select! {
            biased;
            _ = broken(&mut link) => {
                fail_all(&mut lock(&state), LINK_BROKEN);
                return;
            }
            next = rx.recv() => next,
        };
        // `None`: the queue pair was dropped; closing our half ends the
        // responder's loop.
        let Some(out) = next else { return };
        let mut frame = out.request.encode().to_vec();
        if let Some((mem, len)) = out.source {
            frame.extend_from_slice(&mem.read(len));
        }
        let sent = tokio::select! {
            biased;
            _ = broken(&mut link) => Err(LINK_BROKEN.to_string()),
            sent = writer.write_all(&frame) => sent.map_err(|e| format!("connection to the peer lost: {e}")),
        };
        if let Err(reason) = sent {
            fail_all(&mut lock(&state), &reason);
            return;
        }
    }
}

async fn read_responses(
    mut reader: OwnedReadHalf,
    state: Arc<Mutex<QpState>>,
    mut link: watch::Receiver<LinkState>,
) {
    let reason = tokio::select! {
        biased;
        _ = broken(&mut link) => LINK_BROKEN.to_string(),
        reason = read_loop(&mut reader, &state) => reason,
    };
    fail_all(&mut lock(&state), &reason);
}

/// Completes work requests from responses until the connection fails;
/// returns why.
async fn read_loop(reader: &mut OwnedReadHalf, state: &Mutex<QpState>) -> String {
    let mut header = [0u8; RESPONSE_LEN];
    loop {
        if let Err(e) = reader.read_exact(&mut header).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "the peer closed the connection".to_string()
            } else {
                format!("connection to the peer lost: {e}")
            };
        }
        let Some(resp) = Response::decode(&header) else {
            return "malformed response from the peer".to_string();
        };
        if resp.payload_len > MAX_PAYLOAD {
            return "oversized response from the peer".to_string();
        }
        let mut payload = vec![0u8; resp.payload_len as usize];
        if let Err(e) = reader.read_exact(&mut payload).await {
            return format!("connection to the peer lost: {e}");
        }
        let mut st = lock(state);
        let Some(p) = st.pending.remove(&resp.wr_id) else {
            continue; // already failed or flushed
        };
        let mut status = resp.status.to_wc();
        if resp.status == WireStatus::Success && p.wr.opcode == Opcode::Read {
            if payload.len() == p.wr.local.len() {
                p.wr.local
                    .memory()
                    .write(payload.len())
                    .copy_from_slice(&payload);
            } else {
                status = WcStatus::LocalLength;
            }
        }
        let failed = status != WcStatus::Success;
        let _ = p.reply.send(Completion::new(p.wr, status, None));
        if failed {
            // The first error moves the QP to the error state; whatever was
            // posted after it is flushed.
            st.error = Some(format!("{status:?} on work request {}", resp.wr_id));
            for (_, p) in st.pending.drain() {
                let _ = p.reply.send(Completion::new(p.wr, WcStatus::Flushed, None));
            }
        }
    }
}
