//! The accept loop the agent's TCP client ports share (the OIP gRPC port,
//! [`crate::serving::server`], and the KServe HTTP port, [`crate::serving::http::port`]): at
//! most `max_connections` connections at once, and no spinning when
//! accepting fails.
//!
//! - **Backpressure**: a connection is accepted only with a permit in hand;
//!   at the limit the loop stops accepting until a connection closes (its
//!   permit drops with it), so further clients wait in the kernel's backlog
//!   instead of costing a file descriptor and a task each. The limit is
//!   logged once each time it is reached.
//! - **Accept errors** (EMFILE, ENFILE, ENOBUFS...: the process or the host
//!   is out of something) back off, 5 ms doubling to 1 s with jitter,
//!   instead of retrying at once.
//!
//! One limit per port, from `[limits] max_connections` (see
//! [`crate::config::limits::Limits::connections_within`] for how it is
//! fitted to the file-descriptor limit).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use infermesh_backoff::{Backoff, BackoffPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// A TCP listener that holds at most a fixed number of connections at once.
pub struct BoundedListener {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    max_connections: usize,
    backoff: Backoff,
    rng: rand::rngs::SmallRng,
    at_limit_logged: bool,
    /// The port's name, for the log.
    what: &'static str,
}

/// An accepted connection and its place under the limit: the place is
/// given back when `permit` drops, so the connection's task holds it for
/// as long as the connection lives.
pub struct Admitted {
    /// The connection.
    pub tcp: TcpStream,
    /// The peer.
    pub remote: SocketAddr,
    /// One of `max_connections`.
    pub permit: OwnedSemaphorePermit,
}

impl BoundedListener {
    /// Accepts on `listener`, at most `max_connections` (at least 1) open
    /// at once; `what` names the port in the log.
    pub fn new(listener: TcpListener, max_connections: usize, what: &'static str) -> Self {
        let max_connections = max_connections.max(1);
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            backoff: Backoff::new(BackoffPolicy::new(
                Duration::from_millis(5),
                Duration::from_secs(1),
            )),
            rng: rand_seed(),
            at_limit_logged: false,
            what,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection, once one is under the limit; `None` once
    /// `stop` fires.
    pub async fn accept(&mut self, stop: &CancellationToken) -> Option<Admitted> {
        loop {
            if self.permits.available_permits() == 0 && !self.at_limit_logged {
                tracing::warn!(
                    port = self.what,
                    max_connections = self.max_connections,
                    "connection limit reached: not accepting until a connection closes"
                );
                self.at_limit_logged = true;
            }
            let permit = tokio::select! {
                p = Arc::clone(&self.permits).acquire_owned() => p.expect("never closed"),
                _ = stop.cancelled() => return None,
            };
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = stop.cancelled() => return None,
            };
            match accepted {
                Ok((tcp, remote)) => {
                    self.backoff.reset();
                    self.at_limit_logged = false;
                    return Some(Admitted {
                        tcp,
                        remote,
                        permit,
                    });
                }
                Err(e) => {
                    // Retrying at once would spin.
                    let wait = self.backoff.next_delay(&mut self.rng);
                    tracing::warn!(port = self.what, error = %e, retry_in = ?wait, "cannot accept a connection");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.cancelled() => return None,
                    }
                }
            }
        }
    }
}

/// Jitter for the accept backoff; not security-relevant.
fn rand_seed() -> rand::rngs::SmallRng {
    use rand::SeedableRng;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    rand::rngs::SmallRng::seed_from_u64(nanos)
}
