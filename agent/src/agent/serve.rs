//! Step 5 of the assembly: serving. The OIP port (pass-through and the
//! tonic service), the QUIC rung and KServe HTTP share one [`Front`] and the
//! connection limits; the admin port (and the plaintext probe port beside a
//! TLS one) serves operators.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use infermesh_proto::GrpcInferenceServiceServer;
use infermesh_proto::rdma::RdmaServer;
use infermesh_transport::shm::ShmRegistry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;

use super::Tasks;
use super::node::Node;
use super::ports::{AdminPorts, ClientPorts};
use crate::admin::registry::Phase;
use crate::admin::{self, AdminState};
use crate::config::{AgentConfig, limits};
use crate::serving::accept::BoundedListener;
use crate::serving::forward::{BodyLimits, InferPath};
use crate::serving::front::Front;
use crate::serving::grpc_health::GrpcHealth;
use crate::serving::server::{self, Oip, ServerLimits};
use crate::serving::{http, quic};
use crate::tls::{ServerTls, TlsListener};
use crate::transports::conn::OnClose;
use crate::transports::rdma::RdmaService;
use crate::transports::shm::{self, ShmState};

/// The client ports: OIP gRPC, QUIC and KServe HTTP, served on the
/// `requests` tracker (OIP, QUIC) and the `background` one (KServe HTTP,
/// the certificate reload).
pub(super) fn data_plane(
    cfg: &AgentConfig,
    node: &Node,
    ports: ClientPorts,
    tls: Option<&Arc<ServerTls>>,
    tasks: &Tasks,
) {
    let front = front(cfg, node, tasks);
    let oip = oip(cfg, node, &front);
    let server_limits = server_limits(cfg, ports.http.is_some());
    let l = &cfg.limits;
    if let (Some(t), Some(s)) = (tls, &cfg.tls) {
        let (t, every, stop) = (
            Arc::clone(t),
            s.reload_interval,
            tasks.stop_background.clone(),
        );
        tasks
            .background
            .spawn(async move { t.watch(every, stop).await });
    }
    if let Some(endpoint) = ports.quic {
        tasks.requests.spawn(quic::serve(
            endpoint,
            oip.infer.clone(),
            Arc::clone(&node.pool),
            ports.quic_limits,
            tasks.port.clone(),
            tasks.requests.clone(),
        ));
    }
    tasks.requests.spawn(server::serve(
        ports.oip,
        tls.map(|t| t.oip.clone()),
        oip,
        server_limits,
        on_close(node, &front, tasks),
        tasks.port.clone(),
        tasks.requests.clone(),
    ));
    if let Some(listener) = ports.http {
        let app = http::router(front, cfg.max_message_bytes, l.call_timeout);
        // Bounded as the OIP port is, with the same `[limits]`.
        tasks.background.spawn(http::port::serve(
            BoundedListener::new(listener, server_limits.max_connections, "KServe HTTP"),
            tls.map(|t| t.http.clone()),
            app,
            http::port::PortLimits {
                handshake_timeout: l.handshake_timeout,
                idle_timeout: l.idle_timeout,
            },
            tasks.stop_background.clone(),
            tasks.background.clone(),
        ));
    }
}

/// The tonic OIP service every client port shares.
fn front(cfg: &AgentConfig, node: &Node, tasks: &Tasks) -> Front {
    let shm = ShmState::new(
        ShmRegistry::new(cfg.shm.registry_config()),
        node.pool.workers().len(),
    );
    Front::new(
        Arc::clone(&node.pool),
        Arc::clone(&node.metrics),
        Arc::clone(&node.patterns),
        shm,
        tasks.requests.clone(),
    )
    .with_rdma(node.rdma.clone())
}

/// What a closed client connection leaves: its shared-memory regions and
/// queue pairs, here and on the workers they were passed through to.
fn on_close(node: &Node, front: &Front, tasks: &Tasks) -> OnClose {
    let (shm, pool, rdma, background) = (
        front.shm.clone(),
        Arc::clone(&node.pool),
        node.rdma.clone(),
        tasks.background.clone(),
    );
    Arc::new(move |owner| {
        shm.registry().drop_owner(owner);
        if let Some(rdma) = &rdma {
            rdma.drop_owner(owner);
        }
        // Regions passed through to workers go too.
        let (pool, shm) = (Arc::clone(&pool), shm.clone());
        background.spawn(async move { shm::forget_on_workers(&pool, &shm, owner, None).await });
    })
}

/// The OIP port's routes: the pass-through for `ModelInfer`, the tonic
/// service for streams and every other call.
fn oip(cfg: &AgentConfig, node: &Node, front: &Front) -> Oip {
    let service = |limit| {
        GrpcInferenceServiceServer::new(front.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(cfg.max_message_bytes)
    };
    let mut calls = Routes::new(service(limits::SMALL_MESSAGE_BYTES))
        .add_service(GrpcHealth::server(Arc::clone(&node.pool)));
    if let Some(r) = &node.rdma {
        calls = calls.add_service(RdmaServer::new(RdmaService::new(Arc::clone(r))));
    }
    let l = &cfg.limits;
    Oip {
        infer: InferPath::new(
            Arc::clone(&node.pool),
            Arc::clone(&node.metrics),
            Arc::clone(&node.patterns),
            front.clone(),
            BodyLimits {
                max_message_bytes: cfg.max_message_bytes,
                receive_budget_bytes: l.receive_budget_bytes,
                read_timeout: l.read_timeout,
                cut_through_grace: l.cut_through_grace,
            },
        ),
        streams: Routes::new(service(cfg.max_message_bytes)).prepare(),
        calls: calls.prepare(),
        pool: Arc::clone(&node.pool),
        call_timeout: l.call_timeout,
    }
}

/// The client ports' connection limits, the connection cap fitted under the
/// open-file limit (raised to its hard limit first).
fn server_limits(cfg: &AgentConfig, kserve_http: bool) -> ServerLimits {
    let fd_limit = raise_fd_limit();
    // Client connections come in on the OIP port and KServe HTTP.
    let tcp_ports = 1 + usize::from(kserve_http);
    let l = &cfg.limits;
    let limits = ServerLimits {
        max_connections: l.connections_within(fd_limit, tcp_ports),
        // Windows, header lists and the limits against hostile clients
        // are the HTTP/2 crate's documented defaults (http2/README.md).
        http2: infermesh_http2::Limits {
            max_concurrent_streams: l.max_concurrent_streams,
            ..infermesh_http2::Limits::default()
        },
        handshake_timeout: l.handshake_timeout,
        idle_timeout: l.idle_timeout,
        keepalive_interval: l.keepalive_interval,
        keepalive_timeout: l.keepalive_timeout,
    };
    if limits.max_connections < l.max_connections {
        tracing::warn!(
            fd_limit,
            max_connections = limits.max_connections,
            "open-file limit lowers the connection limit (raise `ulimit -n` for more)"
        );
    }
    limits
}

/// The admin port (TLS when the agent has it) and, beside a TLS one, the
/// plaintext probe port.
pub(super) fn admin(
    cfg: &AgentConfig,
    node: &Node,
    ports: AdminPorts,
    tls: Option<&Arc<ServerTls>>,
    started: Instant,
    phase: &Arc<watch::Sender<Phase>>,
    tasks: &Tasks,
) {
    let state = AdminState {
        node_id: cfg.node_id.clone(),
        pool: Arc::clone(&node.pool),
        metrics: Arc::clone(&node.metrics),
        started,
        gpus: Arc::clone(&node.gpus),
        kernel_log: Arc::clone(&node.kernel_log),
        procs: Arc::clone(&node.procs),
        token: cfg.admin_token.clone(),
        phase: Arc::clone(phase),
        stable_period: cfg.sentinel.stable_period,
    };
    let (stop, background) = (&tasks.stop_background, &tasks.background);
    if let Some(listener) = ports.probe {
        let app = admin::probe_router(state.clone());
        serve_http(listener, app, "probe", stop, background);
    }
    let app = admin::router(state);
    match tls {
        None => serve_http(ports.admin, app, "admin", stop, background),
        Some(t) => serve_http(
            TlsListener::new(
                ports.admin,
                t.admin.clone(),
                cfg.limits.handshake_timeout,
                stop.clone(),
                background.clone(),
            ),
            app,
            "admin",
            stop,
            background,
        ),
    }
}

/// Serves `app` on `listener` (plain TCP or [`TlsListener`]) on `tasks`
/// until `stop`.
fn serve_http<L>(
    listener: L,
    app: axum::Router,
    what: &'static str,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let stop = stop.clone();
    tasks.spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "{what} server failed");
        }
    });
}

/// Raises the soft limit on open files to the hard limit (client
/// connections are file descriptors) and returns it.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit; assuming 1024");
            1024
        }
    }
}
