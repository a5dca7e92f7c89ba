//! Triton's system shared memory on the agent's front.
//!
//! A client registers a region (`SystemSharedMemoryRegister`: a name for a
//! window of a POSIX shared-memory object under /dev/shm) and then sends
//! tensors by reference (`shared_memory_region` / `_offset` / `_byte_size`
//! parameters) instead of inline bytes. Regions belong to the client's
//! connection ([`crate::transports::conn`]): another connection can neither use nor
//! unregister them, and they are forgotten when the connection closes.
//! Keys are validated so they cannot name anything outside /dev/shm, and
//! every reference is bounds-checked against the registered window (see the
//! `infermesh-transport` crate).
//!
//! Two ways to serve a shared-memory request:
//!
//! - **pass-through** — when the worker speaks the same protocol (Triton, the
//!   test worker), the agent registers the client's window with the worker
//!   under a name private to that client (`c<conn>.<name>`) once, rewrites
//!   the references to that name and forwards the request: the tensor bytes
//!   never cross a socket. The worker checks the bounds again.
//! - **inline** — when the worker does not (its register call answers
//!   UNIMPLEMENTED), the agent copies the inputs out of shared memory into
//!   the request, forwards it inline, and writes the outputs the client
//!   asked for into its windows. Also, for one request, when the worker's
//!   region table is full (its register call answers RESOURCE_EXHAUSTED):
//!   one client's many regions must not fail every other client's requests.
//!   The agent's copies are `pread`/`pwrite` on the client's object, so a
//!   client truncating it gets an error, not the agent a `SIGBUS`.
//!
//! "Connection" is the TCP connection: gRPC libraries that share one
//! connection between several client objects of a process (gRPC's global
//! subchannel pool) share their regions too.
//!
//! Trust model: any process that can reach the agent's port can register a
//! key it can name under /dev/shm that the agent's user can open — the same
//! as Triton. Run the agent as a user whose /dev/shm access is what local
//! clients may share, and keep the OIP port on loopback or a trusted network.

use std::collections::{BTreeSet, HashSet};

use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::model_infer_request::InferRequestedOutputTensor;
use infermesh_proto::inference::{
    ModelInferRequest, ModelInferResponse, SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryUnregisterRequest,
};
use infermesh_transport::shm::{ShmRef, ShmRegistry};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::dispatch::pool::Pool;
use std::sync::{Arc, Mutex, PoisonError};

use crate::worker::state::{Process, Worker};

/// What the agent knows about one worker process's shared-memory support.
#[derive(Debug, Default)]
pub struct WorkerShm {
    /// The process this is about; reset when it changes.
    pid: u32,
    /// `Some(false)` once it answered UNIMPLEMENTED.
    capable: Option<bool>,
    /// Names the agent registered with it.
    names: HashSet<String>,
}

impl WorkerShm {
    fn for_pid(&mut self, pid: u32) -> &mut Self {
        if self.pid != pid {
            *self = WorkerShm {
                pid,
                ..Default::default()
            };
        }
        self
    }
}

/// The front's shared-memory state: the clients' regions, and what each
/// worker process has registered (owned by the front, one entry per worker).
#[derive(Clone)]
pub struct ShmState {
    registry: ShmRegistry,
    workers: Arc<Vec<Mutex<WorkerShm>>>,
}

impl ShmState {
    /// Regions in `registry`, for a pool of `workers`.
    pub fn new(registry: ShmRegistry, workers: usize) -> Self {
        Self {
            registry,
            workers: Arc::new((0..workers).map(|_| Mutex::default()).collect()),
        }
    }

    /// The clients' regions.
    pub fn registry(&self) -> &ShmRegistry {
        &self.registry
    }

    /// Runs `f` on what is known of `worker`'s process `pid`.
    fn worker<R>(&self, worker: &Worker, pid: u32, f: impl FnOnce(&mut WorkerShm) -> R) -> R {
        let mut w = self.workers[worker.index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(w.for_pid(pid))
    }
}

/// Whether any tensor of `req` references shared memory.
pub fn uses_shm(req: &ModelInferRequest) -> bool {
    let key = infermesh_transport::shm::REGION_PARAM;
    req.inputs.iter().any(|i| i.parameters.contains_key(key))
        || req.outputs.iter().any(|o| o.parameters.contains_key(key))
}

/// How a shared-memory request was prepared; hand it to [`finish`].
#[derive(Debug)]
pub enum Prepared {
    /// Forwarded with references to regions registered with the worker.
    PassThrough,
    /// Forwarded inline; these requested outputs go back into shared memory.
    Inline(Vec<InferRequestedOutputTensor>),
}

fn private_name(owner: u64, name: &str) -> String {
    format!("c{owner}.{name}")
}

/// Prepares `req` (from connection `owner`) for `worker`: pass-through if
/// the worker supports shared memory, otherwise inline. On error nothing was
/// forwarded.
pub async fn prepare(
    state: &ShmState,
    owner: u64,
    worker: &Worker,
    process: &Process,
    req: &mut ModelInferRequest,
) -> Result<Prepared, Status> {
    let capable = state.worker(worker, process.pid, |s| s.capable);
    if capable != Some(false) {
        match pass_through(state, owner, worker, process, req).await {
            Ok(()) => return Ok(Prepared::PassThrough),
            Err(Fallback::Unsupported) => {
                tracing::info!(worker = %worker.id(), "worker does not support shared memory; the agent copies tensors inline");
                state.worker(worker, process.pid, |s| s.capable = Some(false));
            }
            Err(Fallback::TableFull) => {
                tracing::debug!(worker = %worker.id(), "worker's shared memory table is full; the agent copies this request's tensors inline");
            }
            Err(Fallback::Error(s)) => return Err(s),
        }
    }
    let outputs = req.outputs.clone();
    state.registry.take_inputs(owner, req)?;
    for o in &mut req.outputs {
        ShmRef::clear_params(&mut o.parameters);
    }
    Ok(Prepared::Inline(outputs))
}

enum Fallback {
    /// The worker has no shared-memory support: inline from now on.
    Unsupported,
    /// The worker's region table is full: inline for this request.
    TableFull,
    Error(Status),
}

async fn pass_through(
    state: &ShmState,
    owner: u64,
    worker: &Worker,
    process: &Process,
    req: &mut ModelInferRequest,
) -> Result<(), Fallback> {
    let mut names = BTreeSet::new();
    let params = req
        .inputs
        .iter()
        .map(|i| (&i.name, &i.parameters))
        .chain(req.outputs.iter().map(|o| (&o.name, &o.parameters)));
    for (tensor, p) in params {
        if let Some(r) = ShmRef::from_params(tensor, p).map_err(|e| Fallback::Error(e.into()))? {
            names.insert(r.region);
        }
    }
    for name in &names {
        let private = private_name(owner, name);
        if state.worker(worker, process.pid, |s| s.names.contains(&private)) {
            continue;
        }
        let status = state
            .registry
            .status(owner, Some(name))
            .map_err(|_| {
                Fallback::Error(Status::invalid_argument(format!(
                    "shared memory region '{name}' is not registered on this connection"
                )))
            })?
            .pop()
            .ok_or_else(|| {
                Fallback::Error(Status::invalid_argument(format!(
                    "shared memory region '{name}' is not registered"
                )))
            })?;
        let mut client = process.client.clone();
        let result = client
            .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
                name: private.clone(),
                key: status.key,
                offset: status.offset,
                byte_size: status.byte_size,
            })
            .await;
        match result {
            Ok(_) => {}
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) if s.code() == Code::Unimplemented => return Err(Fallback::Unsupported),
            Err(s) if s.code() == Code::ResourceExhausted => return Err(Fallback::TableFull),
            Err(s) => {
                return Err(Fallback::Error(Status::new(
                    s.code(),
                    format!(
                        "registering region '{name}' with worker {}: {}",
                        worker.id(),
                        s.message()
                    ),
                )));
            }
        }
        state.worker(worker, process.pid, |s| {
            s.capable = Some(true);
            s.names.insert(private);
        });
    }
    let rename = |p: &mut std::collections::HashMap<_, _>| {
        use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};
        if let Some(InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam(n)),
        }) = p.get_mut(infermesh_transport::shm::REGION_PARAM)
        {
            *n = private_name(owner, n);
        }
    };
    for i in &mut req.inputs {
        rename(&mut i.parameters);
    }
    for o in &mut req.outputs {
        rename(&mut o.parameters);
    }
    Ok(())
}

/// Completes a response: inline requests get their shared-memory outputs
/// written into the client's windows.
pub fn finish(
    state: &ShmState,
    owner: u64,
    prepared: Prepared,
    resp: &mut ModelInferResponse,
) -> Result<(), Status> {
    if let Prepared::Inline(outputs) = prepared {
        let asked = ModelInferRequest {
            outputs,
            ..Default::default()
        };
        state.registry.place_outputs(owner, &asked, resp)?;
    }
    Ok(())
}

/// Unregisters from every worker what connection `owner` registered there
/// (one `name`, or all of them). Best effort: a worker that does not answer
/// loses the registration when it restarts anyway.
pub async fn forget_on_workers(pool: &Pool, state: &ShmState, owner: u64, name: Option<&str>) {
    let prefix = private_name(owner, "");
    for w in pool.workers() {
        let Some(process) = w.snapshot().process.clone() else {
            continue;
        };
        let names: Vec<String> = state.worker(w, process.pid, |s| {
            let gone: Vec<String> = s
                .names
                .iter()
                .filter(|n| match name {
                    Some(one) => **n == private_name(owner, one),
                    None => n.starts_with(&prefix),
                })
                .cloned()
                .collect();
            for n in &gone {
                s.names.remove(n);
            }
            gone
        });
        for n in names {
            unregister(process.client.clone(), n).await;
        }
    }
}

async fn unregister(mut client: GrpcInferenceServiceClient<Channel>, name: String) {
    if let Err(s) = client
        .system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest { name: name.clone() })
        .await
    {
        tracing::debug!(%name, error = %s, "could not unregister a region from a worker");
    }
}
