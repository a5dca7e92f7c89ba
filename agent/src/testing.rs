//! In-process workers for the agent's own tests: a [`Launcher`] whose
//! "processes" are the real test worker served on a loopback port inside the
//! test's runtime, so supervisors, the pool and the front can be driven
//! under tokio's paused clock. A fake process can crash (its connections are
//! reset, like a process that died), ignore SIGTERM, or be started as a
//! worker that never becomes ready.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use infermesh_proto::GrpcInferenceServiceServer;
use infermesh_testworker::{TestWorker, WorkerOptions};
use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::WorkerSpec;
use crate::supervision::launch::{Exit, Launched, Launcher, OutputSink};
use crate::supervision::prober::Prober;

/// Starts in-process test workers.
#[derive(Default)]
pub struct FakeLauncher {
    /// Options of every worker started.
    pub options: WorkerOptions,
    /// Processes ignore SIGTERM (only SIGKILL ends them).
    pub ignore_sigterm: bool,
    next_pid: AtomicU32,
    launched: Mutex<Vec<FakeHandle>>,
}

/// A test's handle on one fake process.
#[derive(Clone)]
pub struct FakeHandle {
    /// Its pid.
    pub pid: u32,
    /// Its address.
    pub address: SocketAddr,
    /// Its output, as the supervisor would read it.
    pub output: OutputSink,
    exit: watch::Sender<Option<Exit>>,
    dead: CancellationToken,
    /// Bytes read on its connections, in all.
    received: watch::Sender<u64>,
}

impl FakeHandle {
    /// Waits until its connections have read at least `n` bytes in all
    /// (since it started).
    pub async fn received_at_least(&self, n: u64) {
        let mut rx = self.received.subscribe();
        let _ = rx.wait_for(|&got| got >= n).await;
    }

    /// Bytes its connections have read so far.
    pub fn received(&self) -> u64 {
        *self.received.borrow()
    }

    /// The process dies with `exit`: its connections are reset.
    pub fn die(&self, exit: Exit) {
        self.dead.cancel();
        self.exit.send_if_modified(|e| {
            let first = e.is_none();
            if first {
                *e = Some(exit);
            }
            first
        });
    }

    /// Whether it has ended.
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }
}

impl FakeLauncher {
    /// A launcher of workers with `options`.
    pub fn new(options: WorkerOptions) -> Arc<Self> {
        Arc::new(Self {
            options,
            next_pid: AtomicU32::new(100),
            ..Default::default()
        })
    }

    /// The same, with processes that ignore SIGTERM.
    pub fn ignoring_sigterm(options: WorkerOptions) -> Arc<Self> {
        Arc::new(Self {
            options,
            ignore_sigterm: true,
            next_pid: AtomicU32::new(100),
            ..Default::default()
        })
    }

    /// Every process started so far, oldest first.
    pub fn launched(&self) -> Vec<FakeHandle> {
        self.launched.lock().unwrap().clone()
    }
}

impl Launcher for FakeLauncher {
    fn launch(&self, _spec: &WorkerSpec, output: OutputSink) -> io::Result<Box<dyn Launched>> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let address = listener.local_addr()?;
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        let dead = CancellationToken::new();
        let (exit, exit_rx) = watch::channel(None);
        let received = watch::Sender::new(0);
        let incoming = {
            let dead = dead.clone();
            let received = received.clone();
            tokio_stream::wrappers::TcpListenerStream::new(listener)
                .map(move |s| s.map(|s| Killable::new(s, dead.clone(), received.clone())))
        };
        let server = tonic::transport::Server::builder()
            .add_service(GrpcInferenceServiceServer::new(TestWorker::new(
                self.options.clone(),
            )))
            .serve_with_incoming_shutdown(incoming, dead.clone().cancelled_owned());
        tokio::spawn(server);
        let handle = FakeHandle {
            pid,
            address,
            output,
            exit,
            dead,
            received,
        };
        self.launched.lock().unwrap().push(handle.clone());
        Ok(Box::new(FakeProcess {
            handle,
            exit_rx,
            ignore_sigterm: self.ignore_sigterm,
        }))
    }

    /// Its workers are served on the test's runtime, under its paused
    /// clock: probed from that runtime too.
    fn prober(&self) -> Arc<Prober> {
        Prober::inline()
    }
}

struct FakeProcess {
    handle: FakeHandle,
    exit_rx: watch::Receiver<Option<Exit>>,
    ignore_sigterm: bool,
}

impl Launched for FakeProcess {
    fn pid(&self) -> u32 {
        self.handle.pid
    }

    fn address(&self) -> SocketAddr {
        self.handle.address
    }

    fn signal(&mut self, signal: Signal) {
        if signal == Signal::SIGTERM && self.ignore_sigterm {
            return;
        }
        self.handle.die(Exit {
            code: None,
            signal: Some(signal as i32),
        });
    }

    fn has_exited(&mut self) -> bool {
        self.exit_rx.borrow().is_some()
    }

    fn wait(&mut self) -> Pin<Box<dyn std::future::Future<Output = Exit> + Send + '_>> {
        Box::pin(async move {
            let exit = self
                .exit_rx
                .wait_for(Option::is_some)
                .await
                .expect("the handle lives as long as the process");
            exit.expect("waited for it")
        })
    }
}

pin_project_lite::pin_project! {
    /// A connection that fails every read and write once its process died,
    /// and counts the bytes it reads.
    struct Killable<T> {
        #[pin]
        io: T,
        dead: Pin<Box<WaitForCancellationFutureOwned>>,
        received: watch::Sender<u64>,
    }
}

impl<T> Killable<T> {
    fn new(io: T, dead: CancellationToken, received: watch::Sender<u64>) -> Self {
        Self {
            io,
            dead: Box::pin(dead.cancelled_owned()),
            received,
        }
    }
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "the worker process died")
}

impl<T: AsyncRead> AsyncRead for Killable<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if this.dead.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(reset()));
        }
        let before = buf.filled().len();
        let read = this.io.poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            this.received.send_modify(|r| *r += n);
        }
        read
    }
}

impl<T: AsyncWrite> AsyncWrite for Killable<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.project();
        if this.dead.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(reset()));
        }
        this.io.poll_write(cx, b)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

impl<T> tonic::transport::server::Connected for Killable<T>
where
    T: tonic::transport::server::Connected,
{
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A worker spec `id` running `x`, no GPU, one request at once.
pub fn spec(id: &str) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        command: "x".into(),
        argv: vec!["x".into()],
        env: Default::default(),
        gpu: None,
        models: vec![],
        max_inflight: 1,
        startup_timeout: std::time::Duration::from_secs(1),
        stop_grace: std::time::Duration::from_secs(1),
        stall: Default::default(),
    }
}

/// A pool over one worker `w0` with no process (never started): for tests
/// of what reads the pool (metrics, health) without supervising anything.
pub fn idle_pool() -> Arc<crate::dispatch::pool::Pool> {
    let (worker, _driver) = crate::worker::state::Worker::new(spec("w0"), 0);
    crate::dispatch::pool::Pool::new(vec![worker], 1.0, 1)
}

/// Publishes worker `index` of `pool` routable (with a process at a port
/// nothing answers on) or not, as its supervisor would, through its
/// `driver`: for tests of dispatch that never send a request.
pub fn publish_routable(
    pool: &Arc<crate::dispatch::pool::Pool>,
    driver: &crate::worker::state::WorkerDriver,
    index: usize,
    routable: bool,
) {
    let address = "127.0.0.1:9".parse().unwrap();
    let process = Arc::new(crate::worker::state::Process {
        pid: 1000 + index as u32,
        address,
        client: infermesh_proto::oip_client(
            "127.0.0.1:9",
            std::time::Duration::from_secs(1),
            1 << 20,
        )
        .unwrap(),
        upstream: crate::worker::upstream::Upstream::new(
            address,
            tokio_util::task::TaskTracker::new(),
            1,
        ),
        abort: Default::default(),
        open_uploads: Default::default(),
    });
    driver.publisher.send_modify(|s| {
        let mut next = crate::worker::state::WorkerSnapshot::clone(s);
        next.routable = routable;
        next.state = if routable {
            infermesh_sentinel::State::Ready
        } else {
            infermesh_sentinel::State::Failed
        };
        next.process = routable.then_some(process);
        *s = Arc::new(next);
    });
    pool.worker_changed(index);
}
