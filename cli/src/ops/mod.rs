//! The ops commands: `nodes`, `status`, `health`, `drain`, `undrain`,
//! `restart`. Each talks to agents' admin API (`infermesh.v1.Admin`); a NODE
//! is resolved through the registry (node id → the admin endpoint in its
//! record), or given as an admin address (`--admin host:port`, or a NODE that
//! is itself `host:port`), or `--local` (this host's agent).
//!
//! Mutating calls send `authorization: Bearer <token>`, the token read from
//! `--admin-token-file` / `INFERMESH_ADMIN_TOKEN_FILE`. Every command has `--json` and
//! exits non-zero on failure.

pub mod drain;
pub mod health;
pub mod nodes;
pub mod restart;
pub mod scale;
pub mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use infermesh_client::discovery::{self, Source};
use infermesh_proto::admin::admin_client::AdminClient;
use infermesh_proto::registry::{NodeRecord, RegistryUrl};
use infermesh_tls::{ClientTls, TlsConnector, TlsFiles};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::exit;

/// The admin address of this host's agent when none is given.
pub const LOCAL_ADMIN: &str = "127.0.0.1:8002";

/// Where the registry is and how to reach agents; shared by the ops commands.
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Registry URL: zk://host:port[,host:port...][/chroot] or static://ip:port,...
    #[arg(long, env = "INFERMESH_REGISTRY")]
    pub registry: Option<String>,
    /// Service the nodes serve.
    #[arg(long, env = "INFERMESH_SERVICE", default_value = "default")]
    pub service: String,
    /// How long to wait for the registry and for each agent.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS to agents (issue 13): used for a node whose record says its ports
/// serve TLS, and for an address given directly when `--tls-ca` is set.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// CA certificate (PEM) that signed the agents' certificates; the agent's
    /// certificate must also name its address (IP SAN) or its host name.
    #[arg(long, value_name = "FILE", env = "INFERMESH_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for agents that require one (mTLS).
    #[arg(long, value_name = "FILE", env = "INFERMESH_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", env = "INFERMESH_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The client settings, `None` without `--tls-ca`.
    pub fn load(&self) -> Result<Option<ClientTls>, OpsError> {
        TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
        .load()
        .map_err(OpsError::config)
    }

    /// How to dial a node whose record says `tls` (with host name `host`):
    /// `None` for plaintext; an error when it serves TLS and no CA is given.
    pub fn connector(
        &self,
        name: &str,
        tls: bool,
        host: Option<&str>,
    ) -> Result<Option<TlsConnector>, OpsError> {
        if !tls {
            return Ok(None);
        }
        match self.load()? {
            Some(c) => Ok(Some(TlsConnector::new(&c, host.filter(|h| !h.is_empty())))),
            None => Err(OpsError::config(format!(
                "{name} serves TLS: give --tls-ca FILE (or INFERMESH_TLS_CA) with the CA that \
                 signed its certificate"
            ))),
        }
    }
}

/// Which node a command is about.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// The node (set from each command's NODE argument).
    #[arg(skip)]
    pub node: Option<String>,
    /// The agent on this host (admin address 127.0.0.1:8002 unless --admin).
    #[arg(long)]
    pub local: bool,
    /// The agent's admin address, host:port (skips the registry).
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: Option<String>,
    /// File holding the admin bearer token (needed by mutating commands);
    /// the agent's `--admin-token-file`. `--token-file` and
    /// `INFERMESH_TOKEN_FILE`, the earlier spellings, are still read.
    #[arg(
        long,
        alias = "token-file",
        env = "INFERMESH_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// A failed ops command: what to print and the exit code.
#[derive(Debug)]
pub struct OpsError {
    /// Exit code (sysexits).
    pub code: i32,
    /// Message for stderr.
    pub message: String,
    /// The command already printed its JSON result (with `"ok": false`).
    pub reported: bool,
}

impl OpsError {
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: exit::USAGE,
            message: message.into(),
            reported: false,
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: exit::UNAVAILABLE,
            message: message.into(),
            reported: false,
        }
    }
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            code: exit::FAILURE,
            message: message.into(),
            reported: false,
        }
    }
    /// The same error, marked as already reported in the JSON output.
    pub fn reported(mut self) -> Self {
        self.reported = true;
        self
    }

    pub fn config(message: impl Into<String>) -> Self {
        Self {
            code: exit::CONFIG,
            message: message.into(),
            reported: false,
        }
    }

    /// A gRPC error from an agent, with the exit code its kind deserves.
    pub fn from_status(what: &str, s: tonic::Status) -> Self {
        let message = format!("{what}: {} ({:?})", s.message(), s.code());
        match s.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => Self {
                code: exit::NOPERM,
                message,
                reported: false,
            },
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => Self::unavailable(message),
            tonic::Code::NotFound | tonic::Code::InvalidArgument => Self::usage(message),
            _ => Self::failed(message),
        }
    }
}

/// Runs an async ops command on a fresh runtime and turns its result into an
/// exit code, printing the error.
pub fn run_command<F>(json: bool, fut: F) -> i32
where
    F: std::future::Future<Output = Result<(), OpsError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(fut) {
        Ok(()) => exit::OK,
        Err(e) => {
            if json && !e.reported {
                println!("{}", serde_json::json!({ "ok": false, "error": e.message }));
            }
            eprintln!("error: {}", e.message);
            e.code
        }
    }
}

/// Reads the registry's current records once (ZooKeeper: waits for a live
/// read, up to the connect timeout).
pub async fn read_registry(args: &RegistryArgs) -> Result<Vec<NodeRecord>, OpsError> {
    let url_text = args.registry.as_deref().ok_or_else(|| {
        OpsError::usage("give --registry URL (or INFERMESH_REGISTRY) to look nodes up")
    })?;
    let url: RegistryUrl = url_text
        .parse()
        .map_err(|e| OpsError::usage(format!("{e}")))?;
    let source: Arc<dyn discovery::Discovery> = discovery::open(&url, &args.service);
    let mut rx = source.subscribe();
    let live = tokio::time::timeout(
        args.connect_timeout,
        rx.wait_for(|m| m.source == Source::Live),
    )
    .await
    .map_err(|_| {
        let m = source.subscribe().borrow().clone();
        match &m.unreachable {
            Some(why) => {
                OpsError::unavailable(format!("registry {url_text} is unreachable: {why}"))
            }
            None => OpsError::unavailable(format!(
                "registry {url_text} did not answer within {:?}",
                args.connect_timeout
            )),
        }
    })?
    .map_err(|_| OpsError::unavailable("registry watch ended"))?;
    Ok(live.nodes.clone())
}

/// A node resolved to its admin address.
#[derive(Debug, Clone)]
pub struct Target {
    /// Node id if known (from the registry), else the admin address.
    pub name: String,
    /// Admin address host:port.
    pub admin: String,
    /// The admin port serves TLS (the record says so, or `--tls-ca` was
    /// given with an address).
    pub tls: bool,
    /// The node's host name (from its record), a name its certificate may carry.
    pub host: Option<String>,
}

/// Refuses an admin address that names no host (`0.0.0.0:8002`, `[::]:8002`):
/// dialling it reaches this host's own agent, not the node meant.
fn dialable(target: Target) -> Result<Target, OpsError> {
    match target.admin.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => Err(OpsError::usage(format!(
            "{} has admin address {a}, which names no host: dialling it would reach this host's \
             own agent. Give --admin host:port (an agent that advertises this is older or has \
             registry.admin_advertise unset while listening on {})",
            target.name,
            a.ip()
        ))),
        _ => Ok(target),
    }
}

/// Resolves NODE / --local / --admin to an admin address that names a host.
pub async fn resolve(args: &NodeArgs) -> Result<Target, OpsError> {
    dialable(resolve_any(args).await?)
}

async fn resolve_any(args: &NodeArgs) -> Result<Target, OpsError> {
    let direct_tls = args.registry.tls.tls_ca.is_some();
    if let Some(admin) = &args.admin {
        return Ok(Target {
            name: args.node.clone().unwrap_or_else(|| admin.clone()),
            admin: admin.clone(),
            tls: direct_tls,
            host: None,
        });
    }
    if args.local {
        // The loopback address is rarely in a node's certificate; its host
        // name may be.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string());
        return Ok(Target {
            name: "local".into(),
            admin: LOCAL_ADMIN.into(),
            tls: direct_tls,
            host,
        });
    }
    let Some(node) = args.node.clone() else {
        return Err(OpsError::usage(
            "which node? give NODE (a node id with --registry, or an admin host:port), --local or --admin",
        ));
    };
    if args.registry.registry.is_none() && node.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(Target {
            name: node.clone(),
            admin: node,
            tls: direct_tls,
            host: None,
        });
    }
    let records = read_registry(&args.registry).await?;
    let Some(record) = records.iter().find(|r| r.node_id == node) else {
        let known: Vec<&str> = records.iter().map(|r| r.node_id.as_str()).collect();
        return Err(OpsError::usage(format!(
            "no node '{node}' in service '{}' (nodes: {})",
            args.registry.service,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    if record.endpoints.admin.is_empty() {
        return Err(OpsError::usage(format!(
            "node '{node}' advertises no admin address (static registries do not); give --admin host:port"
        )));
    }
    Ok(Target {
        name: node,
        admin: record.endpoints.admin.clone(),
        tls: record.endpoints.tls,
        host: Some(record.host.clone()),
    })
}

/// Adds `authorization: Bearer <token>` to every call when a token is set.
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// An admin client that sends the token, if any.
pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// Reads the bearer token from `path`.
/// The environment variable the admin token file was read from before it was
/// spelled like the agent's `admin_token_file`.
const LEGACY_TOKEN_ENV: &str = "INFERMESH_TOKEN_FILE";

pub fn read_token(path: Option<&PathBuf>) -> Result<Bearer, OpsError> {
    let legacy = std::env::var_os(LEGACY_TOKEN_ENV).map(PathBuf::from);
    let Some(path) = path.or(legacy.as_ref()) else {
        return Ok(Bearer(None));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| OpsError::config(format!("cannot read token file {}: {e}", path.display())))?;
    let value = format!("Bearer {}", text.trim())
        .parse::<MetadataValue<Ascii>>()
        .map_err(|_| {
            OpsError::config(format!(
                "token file {} holds characters not allowed in a header",
                path.display()
            ))
        })?;
    Ok(Bearer(Some(value)))
}

/// Connects to an agent's admin address, over TLS with `tls`.
pub async fn connect(
    admin: &str,
    timeout: Duration,
    token: Bearer,
    tls: Option<TlsConnector>,
) -> Result<Admin, OpsError> {
    let endpoint = Channel::from_shared(format!("http://{admin}"))
        .map_err(|e| OpsError::usage(format!("admin address '{admin}': {e}")))?
        .connect_timeout(timeout)
        .timeout(timeout.max(Duration::from_secs(30)));
    let connected = match tls {
        None => endpoint.connect().await,
        Some(c) => endpoint.connect_with_connector(c).await,
    };
    let channel = connected.map_err(|e| {
        // The TLS failure (unknown CA, wrong name) is the source's source.
        OpsError::unavailable(format!(
            "cannot reach the agent's admin address {admin}: {}",
            infermesh_proto::causes::causes(&e)
        ))
    })?;
    Ok(AdminClient::with_interceptor(channel, token))
}

/// Resolves the node and connects with the token.
pub async fn admin_for(args: &NodeArgs) -> Result<(Target, Admin), OpsError> {
    let target = resolve(args).await?;
    let token = read_token(args.admin_token_file.as_ref())?;
    let tls = args
        .registry
        .tls
        .connector(&target.name, target.tls, target.host.as_deref())?;
    let client = connect(&target.admin, args.registry.connect_timeout, token, tls).await?;
    Ok((target, client))
}
