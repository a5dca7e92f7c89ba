//! The emulated responder: executes peers' READ and WRITE requests against
//! the endpoint's registered regions.

use std::sync::{Arc, Weak};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::Endpoint;
use super::faults::{LinkState, broken, unstalled};
use super::wire::{REQUEST_LEN, Request, Response, WireStatus, check_access};
use crate::verbs::Opcode;

/// Accepts connections until the device is dropped.
pub(super) async fn serve(
    listener: TcpListener,
    endpoint: Weak<Endpoint>,
    mut shutdown: watch::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let Some(ep) = endpoint.upgrade() else { return };
        match accepted {
            Ok((stream, _)) => {
                let link = ep.faults().subscribe();
                if *link.borrow() == LinkState::Broken {
                    continue; // link down: the connection is dropped at once
                }
                let _ = stream.set_nodelay(true);
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let mut link = link;
                    let mut shutdown = shutdown;
                    tokio::select! {
                        result = serve_connection(stream, &ep, link.clone()) => {
                            if let Err(e) = result {
                                tracing::debug!(error = %e, "emulated RDMA responder connection ended");
                            }
                        }
                        _ = broken(&mut link) => {}
                        _ = shutdown.changed() => {}
                    }
                });
            }
            Err(e) => {
                tracing::debug!(error = %e, "emulated RDMA responder accept failed");
            }
        }
    }
}

/// Serves one queue pair's requests in order. Returns after a failed check
/// (the responder's side of the connection goes to the error state).
async fn serve_connection(
    mut stream: TcpStream,
    endpoint: &Arc<Endpoint>,
    mut link: watch::Receiver<LinkState>,
) -> std::io::Result<()> {
    let mut header = [0u8; REQUEST_LEN];
    loop {
        match stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        if !unstalled(&mut link).await {
            return Ok(());
        }
        let Some(req) = Request::decode(&header) else {
            let resp = Response {
                wr_id: 0,
                status: WireStatus::RemoteInvalidRequest,
                payload_len: 0,
            };
            return stream.write_all(&resp.encode()).await;
        };
        let region = endpoint.region(req.rkey);
        let checked = check_access(
            region.as_ref().map(|r| r.bounds()),
            req.opcode,
            req.addr,
            req.len,
        );
        let (region, range) = match (region, checked) {
            (Some(region), Ok(range)) => (region, range),
            (_, checked) => {
                tracing::debug!(?req, "emulated RDMA responder: remote access error");
                let resp = Response {
                    wr_id: req.wr_id,
                    status: checked.err().unwrap_or(WireStatus::RemoteAccess),
                    payload_len: 0,
                };
                return stream.write_all(&resp.encode()).await;
            }
        };
        match req.opcode {
            Opcode::Read => {
                let data = region.mem.read(region.mem.len())[range].to_vec();
                let resp = Response {
                    wr_id: req.wr_id,
                    status: WireStatus::Success,
                    payload_len: data.len() as u64,
                };
                stream.write_all(&resp.encode()).await?;
                stream.write_all(&data).await?;
            }
            Opcode::Write => {
                let mut data = vec![0u8; range.len()];
                stream.read_exact(&mut data).await?;
                region.mem.write(region.mem.len())[range].copy_from_slice(&data);
                let resp = Response {
                    wr_id: req.wr_id,
                    status: WireStatus::Success,
                    payload_len: 0,
                };
                stream.write_all(&resp.encode()).await?;
            }
        }
    }
}
