//! `infermesh._native`: the Rust half of the Python package `infermesh`.
//!
//! It wraps [`infermesh_client::Client`] — discovery, local-first P2C
//! balancing, retries within a deadline, the transport ladder (shared memory
//! to the local node, gRPC otherwise) — for the pure-Python front in
//! `infermesh/__init__.py`, which owns the public API (dtype mapping, numpy
//! arrays, `AsyncClient`). This module is private: its signatures may change
//! with the Python front.
//!
//! - **Inputs without a copy**: each input is a C-contiguous array read
//!   through numpy's `__array_interface__` (the buffer protocol is not in
//!   the limited API before Python 3.11, and the wheel is `abi3-py39`). Its
//!   memory becomes the request's `Bytes` through [`Bytes::from_owner`], the
//!   owner holding a reference to the array, so the array lives as long as
//!   the request does, on whichever thread drops it. The gRPC rung copies it
//!   once into the HTTP/2 frame, the shared-memory rung once into the region.
//! - **Outputs without a copy**: each output's `Bytes` is wrapped in a
//!   [`Buffer`] exposing `__array_interface__` (read-only), which numpy
//!   views in place. Over shared memory those bytes are a view of the
//!   client's region (the region stays leased while the array lives).
//! - **Inputs built in place** (`lease`, [`lease`] module): numpy arrays
//!   over a leased region of the client's shared memory, filled by the
//!   caller and sent by reference to the local node.
//! - **The GIL** is released while a call waits ([`Python::detach`]); the
//!   async variant runs the call on the process's runtime, queues the
//!   result in a [`Completions`] and wakes the event loop through a socket
//!   it watches; the loop converts results to Python objects on its own
//!   thread. Runtime threads never take the GIL (one that did could be
//!   caught mid-call by interpreter shutdown).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use infermesh_client::{Client, ClientError};
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse};
use infermesh_proto::registry::NodeState;
use infermesh_proto::tensor::{DataType, echo, element_count};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tonic::Code;

mod lease;

create_exception!(
    infermesh,
    InfermeshError,
    PyException,
    "Base of every error the client raises; `.code` is the gRPC code's name."
);
create_exception!(
    infermesh,
    RegistryError,
    InfermeshError,
    "The registry URL is malformed."
);
create_exception!(
    infermesh,
    UnavailableError,
    InfermeshError,
    "No node could take the call: none known (or the registry is unreachable), all draining or ejected, or every node tried was down."
);
create_exception!(
    infermesh,
    ResourceExhaustedError,
    UnavailableError,
    "Every node tried was full (RESOURCE_EXHAUSTED)."
);
create_exception!(
    infermesh,
    ModelNotFoundError,
    InfermeshError,
    "No node of the service serves the model."
);
create_exception!(
    infermesh,
    DeadlineExceededError,
    InfermeshError,
    "The call's deadline or timeout passed before a node answered."
);
create_exception!(
    infermesh,
    InvalidArgumentError,
    InfermeshError,
    "The request is malformed: unknown input, wrong datatype or shape, unsupported array."
);
create_exception!(
    infermesh,
    ServerError,
    InfermeshError,
    "The node or its worker failed the call (INTERNAL, UNKNOWN), or its answer could not be read."
);
create_exception!(
    infermesh,
    ClosedError,
    InfermeshError,
    "The client was closed."
);

/// Most inputs or outputs one call may name.
const MAX_TENSORS: usize = 1024;
/// Most dimensions of one tensor.
const MAX_DIMS: usize = 32;
/// Longest tensor or model name, in bytes.
const MAX_NAME_BYTES: usize = 1024;

/// The process's runtime, shared by every client: two worker threads do
/// the I/O of many concurrent calls; the calling threads drive their own
/// calls (`block_on`). A child of `fork()` has none of its parent's
/// threads, so it gets a runtime of its own (the parent's is leaked there).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    match *slot {
        Some((owner, rt)) if owner == pid => rt,
        _ => {
            let rt: &'static _ = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("infermesh")
                    .enable_all()
                    .build()
                    .expect("tokio runtime"),
            ));
            *slot = Some((pid, rt));
            rt
        }
    }
}

/// The Python exception for a client error, with `.code` set.
fn to_py_err(py: Python<'_>, e: &ClientError) -> PyErr {
    let code = e.code();
    // A node's status reads as its message; `.code` carries the code.
    let msg = match e {
        ClientError::Status(s) => s.message().to_string(),
        _ => e.to_string(),
    };
    let err = match e {
        ClientError::Registry(_) => RegistryError::new_err(msg),
        ClientError::NoNode { .. } | ClientError::RegistryUnreachable { .. } => {
            UnavailableError::new_err(msg)
        }
        ClientError::ModelNotFound { .. } => ModelNotFoundError::new_err(msg),
        ClientError::DeadlineExceeded { .. } => DeadlineExceededError::new_err(msg),
        ClientError::BadResponse(_) => ServerError::new_err(msg),
        ClientError::BadRequest(_) => InvalidArgumentError::new_err(msg),
        ClientError::Lease(_) if code == Code::ResourceExhausted => {
            ResourceExhaustedError::new_err(msg)
        }
        ClientError::Lease(_) => InfermeshError::new_err(msg),
        ClientError::Status(_) => match code {
            Code::NotFound => ModelNotFoundError::new_err(msg),
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                InvalidArgumentError::new_err(msg)
            }
            Code::Unavailable => UnavailableError::new_err(msg),
            Code::ResourceExhausted => ResourceExhaustedError::new_err(msg),
            Code::DeadlineExceeded => DeadlineExceededError::new_err(msg),
            Code::Internal | Code::Unknown | Code::DataLoss => ServerError::new_err(msg),
            _ => InfermeshError::new_err(msg),
        },
        // `ClientError` is non-exhaustive in spirit: a new variant is an
        // InfermeshError until it gets its own class.
        #[allow(unreachable_patterns)]
        _ => InfermeshError::new_err(msg),
    };
    with_code(py, err, code_name(code))
}

fn with_code(py: Python<'_>, err: PyErr, code: &str) -> PyErr {
    // Setting an attribute on a fresh exception instance cannot fail in
    // practice; if it did, the exception still carries its message.
    let _ = err.value(py).setattr("code", code);
    err
}

/// The gRPC code's canonical name (`NOT_FOUND`).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::Unauthenticated => "UNAUTHENTICATED",
        Code::DataLoss => "DATA_LOSS",
    }
}

fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    with_code(
        py,
        InvalidArgumentError::new_err(msg.into()),
        "INVALID_ARGUMENT",
    )
}

/// A positive, finite number of seconds.
fn seconds(py: Python<'_>, what: &str, s: Option<f64>) -> PyResult<Option<Duration>> {
    match s {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(invalid(
            py,
            format!("{what} must be a number of seconds in (0, 86400], got {s}"),
        )),
    }
}

/// The OIP datatype of a numpy `typestr` (`<f4` → FP32). Big-endian and
/// other kinds are refused.
fn datatype_of(typestr: &str) -> Option<DataType> {
    let native = if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    let mut chars = typestr.chars();
    let order = chars.next()?;
    let rest = chars.as_str();
    // One-byte types carry '|' (not applicable).
    if order != '|' && order != native {
        return None;
    }
    Some(match rest {
        "b1" => DataType::Bool,
        "u1" => DataType::Uint8,
        "u2" => DataType::Uint16,
        "u4" => DataType::Uint32,
        "u8" => DataType::Uint64,
        "i1" => DataType::Int8,
        "i2" => DataType::Int16,
        "i4" => DataType::Int32,
        "i8" => DataType::Int64,
        "f2" => DataType::Fp16,
        "f4" => DataType::Fp32,
        "f8" => DataType::Fp64,
        _ => return None,
    })
}

/// Keeps a numpy array alive while the request reads its memory.
struct ArrayOwner {
    /// The array (a new reference; released under the GIL, or deferred by
    /// PyO3 to the next time a thread holds it).
    _array: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer is into the array's data, which `_array` keeps alive
// and which is only read; `Py<PyAny>` is itself Send + Sync.
unsafe impl Send for ArrayOwner {}

impl AsRef<[u8]> for ArrayOwner {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is the array's C-contiguous data (checked
        // in `input_tensor`), alive while `_array` is. A caller that
        // mutates the array from another thread while the call reads it
        // gets unspecified tensor contents, as with any extension that
        // releases the GIL.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// One input: `(name, array)`, or `(name, array, datatype, shape)` for a
/// tensor the front serialized itself (`BYTES`: a one-dimensional `uint8`
/// array of 4-byte little-endian lengths and bytes, sent as `datatype` with
/// the tensor's own `shape`). `array` exposes a C-contiguous
/// `__array_interface__`.
fn input_tensor(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<(InferInputTensor, Bytes)> {
    let tuple = item.cast::<PyTuple>()?;
    let name: String = tuple.get_item(0)?.extract()?;
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(invalid(
            py,
            format!("input names must be 1..={MAX_NAME_BYTES} bytes"),
        ));
    }
    // Names are echoed in errors cut to the project's bound.
    let shown = echo(&name);
    let array = tuple.get_item(1)?;
    let serialized: Option<(String, Vec<i64>)> = if tuple.len() == 4 {
        Some((tuple.get_item(2)?.extract()?, tuple.get_item(3)?.extract()?))
    } else {
        None
    };
    let iface = array.getattr("__array_interface__")?;
    let iface = iface.cast::<PyDict>()?;
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        iface.get_item(key)?.ok_or_else(|| {
            invalid(
                py,
                format!("input '{shown}': __array_interface__ lacks '{key}'"),
            )
        })
    };
    let typestr: String = get("typestr")?.extract()?;
    let shape: Vec<i64> = get("shape")?.extract()?;
    if shape.len() > MAX_DIMS {
        return Err(invalid(
            py,
            format!("input '{shown}': at most {MAX_DIMS} dimensions"),
        ));
    }
    if let Some(strides) = iface.get_item("strides")? {
        if !strides.is_none() {
            return Err(invalid(
                py,
                format!("input '{shown}': the array must be C-contiguous"),
            ));
        }
    }
    let (ptr, _readonly): (usize, bool) = get("data")?.extract()?;
    let dtype = datatype_of(&typestr).ok_or_else(|| {
        invalid(
            py,
            format!("input '{shown}': unsupported dtype '{typestr}' (native-endian bool, int, uint or float)"),
        )
    })?;
    let elem = dtype.element_size().expect("fixed-size type");
    let len = element_count(&shape)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(|| invalid(py, format!("input '{shown}': bad shape {shape:?}")))?;
    let (datatype, shape) = match serialized {
        Some((d, tensor_shape)) => {
            let parsed = DataType::parse(&d)
                .ok_or_else(|| invalid(py, format!("input '{shown}': unknown datatype '{d}'")))?;
            if parsed != DataType::Bytes || dtype != DataType::Uint8 || shape.len() != 1 {
                return Err(invalid(
                    py,
                    format!("input '{shown}': only BYTES is sent serialized, as uint8"),
                ));
            }
            if tensor_shape.len() > MAX_DIMS || element_count(&tensor_shape).is_none() {
                return Err(invalid(
                    py,
                    format!("input '{shown}': bad shape {tensor_shape:?}"),
                ));
            }
            (parsed, tensor_shape)
        }
        None => (dtype, shape),
    };
    let raw = if len == 0 || ptr == 0 {
        Bytes::new()
    } else {
        Bytes::from_owner(ArrayOwner {
            _array: array.clone().unbind(),
            ptr: ptr as *const u8,
            len,
        })
    };
    Ok((
        InferInputTensor {
            name,
            datatype: datatype.as_str().to_string(),
            shape,
            ..Default::default()
        },
        raw,
    ))
}

/// A read-only view of an output's bytes that numpy maps without a copy
/// (`numpy.asarray(buffer)` is a `uint8` array over it).
#[pyclass(module = "infermesh._native", frozen)]
struct Buffer {
    data: Bytes,
}

#[pymethods]
impl Buffer {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.data.len(),))?;
        d.set_item("typestr", "|u1")?;
        // A zero-length array still needs a non-null address.
        let ptr = if self.data.is_empty() {
            std::ptr::NonNull::<u8>::dangling().as_ptr() as usize
        } else {
            self.data.as_ptr() as usize
        };
        d.set_item("data", (ptr, true))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }
}

/// Typed contents as raw little-endian bytes (a node that answered without
/// `raw_output_contents`).
fn typed_to_raw(dtype: DataType, c: &InferTensorContents) -> Option<Vec<u8>> {
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    Some(match dtype {
        DataType::Bool => c.bool_contents.iter().map(|&b| b as u8).collect(),
        DataType::Int8 => le(&c.int_contents, |x| (x as i8).to_le_bytes()),
        DataType::Int16 => le(&c.int_contents, |x| (x as i16).to_le_bytes()),
        DataType::Int32 => le(&c.int_contents, i32::to_le_bytes),
        DataType::Int64 => le(&c.int64_contents, i64::to_le_bytes),
        DataType::Uint8 => le(&c.uint_contents, |x| (x as u8).to_le_bytes()),
        DataType::Uint16 => le(&c.uint_contents, |x| (x as u16).to_le_bytes()),
        DataType::Uint32 => le(&c.uint_contents, u32::to_le_bytes),
        DataType::Uint64 => le(&c.uint64_contents, u64::to_le_bytes),
        DataType::Fp32 => le(&c.fp32_contents, f32::to_le_bytes),
        DataType::Fp64 => le(&c.fp64_contents, f64::to_le_bytes),
        DataType::Bytes => c
            .bytes_contents
            .iter()
            .flat_map(|b| {
                (b.len() as u32)
                    .to_le_bytes()
                    .into_iter()
                    .chain(b.iter().copied())
            })
            .collect(),
        DataType::Fp16 | DataType::Bf16 => return None,
    })
}

/// One output as the front gets it: `(name, datatype, shape, buffer)`.
type Output = (String, String, Vec<i64>, Buffer);

/// The response's outputs, checked: every fixed-size output holds exactly
/// shape × element size bytes.
fn outputs(resp: ModelInferResponse) -> Result<Vec<Output>, ClientError> {
    let bad = |m: String| ClientError::BadResponse(m);
    let mut raw = resp.raw_output_contents.into_iter();
    let use_raw = raw.len() > 0;
    if use_raw && raw.len() != resp.outputs.len() {
        return Err(bad(format!(
            "{} outputs but {} raw contents",
            resp.outputs.len(),
            raw.len()
        )));
    }
    let mut out = Vec::with_capacity(resp.outputs.len());
    for o in resp.outputs {
        let dtype = DataType::parse(&o.datatype)
            .ok_or_else(|| bad(format!("output '{}': unknown datatype", echo(&o.name))))?;
        let data = match raw.next() {
            Some(b) => b,
            None => o
                .contents
                .as_ref()
                .and_then(|c| typed_to_raw(dtype, c))
                .map(Bytes::from)
                .ok_or_else(|| bad(format!("output '{}' has no contents", echo(&o.name))))?,
        };
        if let Some(elem) = dtype.element_size() {
            let want = element_count(&o.shape).and_then(|n| n.checked_mul(elem));
            if want != Some(data.len()) {
                return Err(bad(format!(
                    "output '{}': {} bytes for shape {:?} of {}",
                    echo(&o.name),
                    data.len(),
                    o.shape,
                    o.datatype
                )));
            }
        }
        out.push((o.name, o.datatype, o.shape, Buffer { data }));
    }
    Ok(out)
}

/// Builds the request from the front's arguments.
fn request(
    py: Python<'_>,
    model: String,
    inputs: &Bound<'_, PyList>,
    requested: Option<Vec<String>>,
) -> PyResult<ModelInferRequest> {
    if model.is_empty() || model.len() > MAX_NAME_BYTES {
        return Err(invalid(
            py,
            format!("model names must be 1..={MAX_NAME_BYTES} bytes"),
        ));
    }
    if inputs.len() > MAX_TENSORS || requested.as_ref().is_some_and(|r| r.len() > MAX_TENSORS) {
        return Err(invalid(
            py,
            format!("at most {MAX_TENSORS} inputs and outputs"),
        ));
    }
    let mut tensors = Vec::with_capacity(inputs.len());
    let mut raw = Vec::with_capacity(inputs.len());
    for item in inputs.iter() {
        let (t, r) = input_tensor(py, &item)?;
        tensors.push(t);
        raw.push(r);
    }
    Ok(ModelInferRequest {
        model_name: model,
        inputs: tensors,
        raw_input_contents: raw,
        outputs: requested
            .unwrap_or_default()
            .into_iter()
            .map(|name| InferRequestedOutputTensor {
                name,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// The call: the client's infer, bounded by `timeout` when given.
async fn call(
    client: Client,
    req: ModelInferRequest,
    timeout: Option<Duration>,
) -> Result<Vec<Output>, ClientError> {
    let resp = match timeout {
        None => client.infer(req).await?,
        Some(t) => match tokio::time::timeout(t, client.infer(req)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ClientError::DeadlineExceeded {
                    deadline: t,
                    attempts: 0,
                    last: Some("the call's timeout passed".into()),
                });
            }
        },
    };
    outputs(resp)
}

/// The result of one async call, by its id.
type Done = (u64, Result<Vec<Output>, ClientError>);

/// Results of async calls waiting for their event loop.
struct Queue {
    done: Mutex<Vec<Done>>,
    /// Written (one byte) when `done` goes from empty to not: wakes the
    /// event loop, which watches `rx`.
    tx: UnixStream,
    rx: UnixStream,
}

impl Queue {
    fn push(&self, id: u64, result: Result<Vec<Output>, ClientError>) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let wake = done.is_empty();
        done.push((id, result));
        drop(done);
        if wake {
            // WouldBlock means wake-ups are already pending: enough.
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// Where async calls of one event loop complete. The loop watches
/// [`Completions::fileno`] (`loop.add_reader`) and calls
/// [`Completions::take`] when it is readable, on its own thread with the GIL:
/// runtime threads never take the GIL, so none can be caught holding or
/// waiting for it when the interpreter shuts down.
#[pyclass(module = "infermesh._native", frozen)]
struct Completions {
    queue: Arc<Queue>,
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Self> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Completions {
            queue: Arc::new(Queue {
                done: Mutex::new(Vec::new()),
                tx,
                rx,
            }),
        })
    }

    /// The descriptor that becomes readable when results are waiting.
    fn fileno(&self) -> i32 {
        self.queue.rx.as_raw_fd()
    }

    /// The results waiting: `(id, True, outputs)` or `(id, False, exception)`.
    fn take(&self, py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        // Wake-ups first, then results: a result pushed after this read
        // writes a new wake-up.
        let mut buf = [0u8; 256];
        while matches!((&self.queue.rx).read(&mut buf), Ok(n) if n > 0) {}
        let done = std::mem::take(&mut *self.queue.done.lock().unwrap_or_else(|e| e.into_inner()));
        let mut out = Vec::with_capacity(done.len());
        for (id, result) in done {
            out.push(match result {
                Ok(outs) => (id, true, outs.into_pyobject(py)?.into_any().unbind()),
                Err(e) => (id, false, to_py_err(py, &e).into_value(py).into_any()),
            });
        }
        Ok(out)
    }
}

/// A call in flight on the runtime (`NativeClient::infer_async`).
#[pyclass(module = "infermesh._native", frozen)]
struct Call {
    handle: tokio::task::AbortHandle,
}

#[pymethods]
impl Call {
    /// Stops the call (its in-flight attempt counts as cancelled, neither
    /// for nor against the node); no result is queued.
    fn cancel(&self) {
        self.handle.abort();
    }
}

/// The client. Thread-safe: any number of threads may call it at once.
#[pyclass(module = "infermesh._native", frozen)]
struct NativeClient {
    client: Mutex<Option<Client>>,
    /// The process that made it: its connections belong to that process's
    /// runtime, which a child of `fork()` does not have.
    pid: u32,
}

impl NativeClient {
    fn client(&self, py: Python<'_>) -> PyResult<Client> {
        if std::process::id() != self.pid {
            return Err(with_code(
                py,
                ClosedError::new_err(
                    "this client was made before fork(); make a new one in this process",
                ),
                "CANCELLED",
            ));
        }
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                with_code(
                    py,
                    ClosedError::new_err("the client is closed"),
                    "CANCELLED",
                )
            })
    }
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (registry, service, local_node=None, deadline=None, max_attempts=None, tls_ca=None, tls_cert=None, tls_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        registry: String,
        service: String,
        local_node: Option<String>,
        deadline: Option<f64>,
        max_attempts: Option<usize>,
        tls_ca: Option<std::path::PathBuf>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let mut builder = Client::builder().registry(registry).service(service);
        // Without files given, the environment's INFERMESH_TLS_* (as the
        // client config's `[tls]` and the CLI).
        let files = infermesh_client::config::RawTls {
            ca: tls_ca,
            cert: tls_cert,
            key: tls_key,
        }
        .files();
        if let Some(tls) = files.load().map_err(|e| invalid(py, e))? {
            builder = builder.tls(tls);
        }
        if let Some(node) = local_node {
            builder = builder.local_node(node);
        }
        if let Some(d) = seconds(py, "deadline", deadline)? {
            builder = builder.deadline(d);
        }
        if let Some(n) = max_attempts {
            if n == 0 || n > 100 {
                return Err(invalid(py, "max_attempts must be in 1..=100"));
            }
            builder = builder.max_attempts(n);
        }
        let built = py.detach(|| runtime().block_on(builder.build()));
        let client = built.map_err(|e| to_py_err(py, &e))?;
        Ok(NativeClient {
            client: Mutex::new(Some(client)),
            pid: std::process::id(),
        })
    }

    /// Sends one request and waits for it with the GIL released.
    #[pyo3(signature = (model, inputs, outputs=None, timeout=None))]
    fn infer(
        &self,
        py: Python<'_>,
        model: String,
        inputs: &Bound<'_, PyList>,
        outputs: Option<Vec<String>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Output>> {
        let client = self.client(py)?;
        let timeout = seconds(py, "timeout", timeout)?;
        let req = request(py, model, inputs, outputs)?;
        let result = py.detach(|| runtime().block_on(call(client, req, timeout)));
        result.map_err(|e| to_py_err(py, &e))
    }

    /// Starts one request on the runtime; its result goes to `completions`
    /// under `id` (no runtime thread ever touches Python objects).
    #[pyo3(signature = (model, inputs, outputs, timeout, completions, id))]
    #[allow(clippy::too_many_arguments)]
    fn infer_async(
        &self,
        py: Python<'_>,
        model: String,
        inputs: &Bound<'_, PyList>,
        outputs: Option<Vec<String>>,
        timeout: Option<f64>,
        completions: &Completions,
        id: u64,
    ) -> PyResult<Call> {
        let client = self.client(py)?;
        let timeout = seconds(py, "timeout", timeout)?;
        let req = request(py, model, inputs, outputs)?;
        let queue = Arc::clone(&completions.queue);
        let task = runtime().spawn(async move {
            let result = call(client, req, timeout).await;
            queue.push(id, result);
        });
        Ok(Call {
            handle: task.abort_handle(),
        })
    }

    /// Leases a region of the client's shared memory for one call to
    /// `model`: `inputs` as `(name, datatype, shape)`, `outputs` as
    /// `(name, max_bytes or None)`.
    fn lease(
        &self,
        py: Python<'_>,
        model: String,
        inputs: Vec<(String, String, Vec<i64>)>,
        outputs: Vec<(String, Option<u64>)>,
    ) -> PyResult<lease::Lease> {
        let client = self.client(py)?;
        lease::lease(py, &client, model, inputs, outputs)
    }

    /// Sends a leased request and waits for it with the GIL released.
    #[pyo3(signature = (lease, timeout=None))]
    fn infer_leased(
        &self,
        py: Python<'_>,
        lease: &lease::Lease,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Output>> {
        let client = self.client(py)?;
        let timeout = seconds(py, "timeout", timeout)?;
        let req = Arc::clone(&lease.request);
        let result = py.detach(|| runtime().block_on(lease::call(client, req, timeout)));
        result.map_err(|e| to_py_err(py, &e))
    }

    /// Starts a leased request on the runtime, as `infer_async` does.
    #[pyo3(signature = (lease, timeout, completions, id))]
    fn infer_leased_async(
        &self,
        py: Python<'_>,
        lease: &lease::Lease,
        timeout: Option<f64>,
        completions: &Completions,
        id: u64,
    ) -> PyResult<Call> {
        let client = self.client(py)?;
        let timeout = seconds(py, "timeout", timeout)?;
        let req = Arc::clone(&lease.request);
        let queue = Arc::clone(&completions.queue);
        let task = runtime().spawn(async move {
            let result = lease::call(client, req, timeout).await;
            queue.push(id, result);
        });
        Ok(Call {
            handle: task.abort_handle(),
        })
    }

    /// The shared-memory pool's counters: regions `created`, `leased` now
    /// (arrays over a region hold it), `reused`, `retired`, `exhausted`,
    /// `total_bytes`.
    fn shm_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        lease::counters(py, &client)
    }

    /// The nodes known now: one dict per node.
    fn nodes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let client = self.client(py)?;
        let list = PyList::empty(py);
        for r in client.nodes() {
            let d = PyDict::new(py);
            d.set_item("node_id", &r.node_id)?;
            d.set_item("grpc", &r.endpoints.grpc)?;
            d.set_item("zone", &r.zone)?;
            d.set_item("host", &r.host)?;
            d.set_item(
                "state",
                match r.state {
                    NodeState::Serving => "serving",
                    NodeState::Draining => "draining",
                    NodeState::Degraded => "degraded",
                },
            )?;
            d.set_item("weight", r.weight)?;
            let models: Vec<(String, bool)> =
                r.models.iter().map(|m| (m.name.clone(), m.ready)).collect();
            d.set_item("models", models)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// Attempts the client sent to each node, with failures, timeouts and
    /// attempts in flight.
    fn node_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        let out = PyDict::new(py);
        for (node, s) in client.node_stats() {
            let d = PyDict::new(py);
            d.set_item("attempts", s.attempts)?;
            d.set_item("failures", s.failures)?;
            d.set_item("timeouts", s.timeouts)?;
            d.set_item("inflight", s.in_flight)?;
            out.set_item(node, d)?;
        }
        Ok(out)
    }

    /// Requests per transport path (`shm`, `rdma`, `grpc`): attempts,
    /// successes, failures, fallbacks.
    fn path_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        let out = PyDict::new(py);
        for (path, c) in client.path_counters().iter() {
            let d = PyDict::new(py);
            d.set_item("attempts", c.attempts)?;
            d.set_item("successes", c.successes)?;
            d.set_item("failures", c.failures)?;
            d.set_item("fallbacks", c.fallbacks)?;
            out.set_item(path.as_str(), d)?;
        }
        Ok(out)
    }

    /// Drops the client: discovery stops, connections close. Calls in
    /// flight finish; new ones raise `ClosedError`.
    fn close(&self, py: Python<'_>) {
        let client = self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
        if std::process::id() != self.pid {
            std::mem::forget(client);
            return;
        }
        py.detach(|| {
            let _runtime = runtime().enter();
            drop(client);
        });
    }
}

impl Drop for NativeClient {
    fn drop(&mut self) {
        let client = self
            .client
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if std::process::id() != self.pid {
            // A parent's client in a child of fork(): its runtime's locks
            // may have been held by threads that do not exist here.
            std::mem::forget(client);
            return;
        }
        let _runtime = runtime().enter();
        drop(client);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativeClient>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<Call>()?;
    m.add_class::<Completions>()?;
    m.add_class::<lease::Lease>()?;
    m.add_class::<lease::RegionBuffer>()?;
    m.add("InfermeshError", py.get_type::<InfermeshError>())?;
    m.add("RegistryError", py.get_type::<RegistryError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    m.add(
        "ResourceExhaustedError",
        py.get_type::<ResourceExhaustedError>(),
    )?;
    m.add("ModelNotFoundError", py.get_type::<ModelNotFoundError>())?;
    m.add(
        "DeadlineExceededError",
        py.get_type::<DeadlineExceededError>(),
    )?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    Ok(())
}
