//! The leased form of a call (issue 27): the caller builds its inputs in
//! place, in a region of the client's shared-memory pool, and reads the
//! outputs where the worker wrote them.
//!
//! ```no_run
//! # async fn demo(client: infermesh_client::Client) -> Result<(), infermesh_client::ClientError> {
//! use infermesh_client::{OutputSpec, TensorSpec};
//! let mut req = client.lease(
//!     "identity",
//!     &[TensorSpec::of::<f32>("INPUT0", &[4096, 1024])],
//!     &[OutputSpec::new("OUTPUT0")],
//! )?;
//! req.input_as::<f32>(0)?.fill(0.5); // written in the region, no copy
//! let answer = client.infer_leased(req).await?;
//! let out = &answer.response.raw_output_contents[0]; // a view of the region
//! let y: &[f32] = infermesh_transport::shm::elements(out).expect("FP32");
//! # let _ = y; Ok(()) }
//! ```
//!
//! To the local node over shared memory nothing is copied by the client:
//! the request references the input windows, the worker writes each
//! output into its window, and the response's `raw_output_contents` are
//! views of the region ([`Bytes`] whose owner holds the lease). The region
//! goes back to the pool when the last view is dropped, so it is never
//! reused while the caller can still read it. To any other node (or when
//! shared memory breaks and the ladder falls back) the inputs are sent
//! inline from the region and the outputs come back as ordinary bytes: the
//! same answer, with the copies inline sending needs.
//!
//! The plain form (`Client::infer` with the tensors in the request) stays:
//! over shared memory it copies the inputs into a region, and its outputs
//! are views of the region too.

use bytes::Bytes;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{InferParameter, ModelInferRequest};
use infermesh_proto::tensor::{DataType, echo, element_count};
use infermesh_transport::shm::{Element, Layout, MIN_OUTPUT_WINDOW, ShmLease, elements_mut};

use crate::client::{Answered, Client, ClientError};
use crate::paths::Placed;

/// An input of a leased request: its name, datatype and shape, which fix
/// its size in the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Input name.
    pub name: String,
    /// OIP datatype (fixed-size: `BYTES` has no size to lay out).
    pub datatype: DataType,
    /// Shape (no wildcards).
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// An input `name` of `datatype` and `shape`.
    pub fn new(name: impl Into<String>, datatype: DataType, shape: &[i64]) -> Self {
        Self {
            name: name.into(),
            datatype,
            shape: shape.to_vec(),
        }
    }

    /// An input of `T`'s datatype (`f32` → `FP32`).
    pub fn of<T: Element>(name: impl Into<String>, shape: &[i64]) -> Self {
        Self::new(name, T::DATATYPE, shape)
    }

    /// Bytes the tensor takes.
    fn byte_size(&self) -> Result<u64, ClientError> {
        let bad =
            |why: &str| ClientError::BadRequest(format!("input '{}': {why}", echo(&self.name)));
        let elem = self
            .datatype
            .element_size()
            .ok_or_else(|| bad("BYTES inputs cannot be leased (their size is not fixed)"))?;
        element_count(&self.shape)
            .and_then(|n| n.checked_mul(elem))
            .map(|n| n as u64)
            .ok_or_else(|| bad(&format!("bad shape {:?}", self.shape)))
    }
}

/// A requested output of a leased request, and the window it may fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// Output name.
    pub name: String,
    /// Bytes reserved for it; by default the inputs' total size and at
    /// least 64 KiB. An output larger than its window is an error from the
    /// node.
    pub max_bytes: Option<u64>,
}

impl OutputSpec {
    /// Output `name` with the default window.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            max_bytes: None,
        }
    }

    /// Reserves `bytes` for the output.
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
}

/// A request whose tensors live in a leased region: write the inputs in
/// place ([`LeasedRequest::input`]), then send it with
/// [`Client::infer_leased`]. Dropped unsent, its region goes back to the
/// pool.
#[derive(Debug)]
pub struct LeasedRequest {
    /// Model, input heads and requested outputs; no inline contents.
    request: ModelInferRequest,
    lease: ShmLease,
    layout: Layout,
}

impl LeasedRequest {
    /// Input `index`'s bytes in the region, to write in place.
    pub fn input(&mut self, index: usize) -> Result<&mut [u8], ClientError> {
        let w = *self.layout.inputs.get(index).ok_or_else(|| {
            ClientError::BadRequest(format!("input {index} of {}", self.layout.inputs.len()))
        })?;
        self.lease
            .bytes_mut(w.offset, w.len)
            .map_err(ClientError::Lease)
    }

    /// Input `index` as elements of `T`, which must be its datatype's type.
    pub fn input_as<T: Element>(&mut self, index: usize) -> Result<&mut [T], ClientError> {
        let datatype = self.request.inputs.get(index).map(|i| i.datatype.clone());
        if datatype.as_deref() != Some(T::DATATYPE.as_str()) {
            return Err(ClientError::BadRequest(format!(
                "input {index} is {}, not {}",
                datatype.as_deref().unwrap_or("missing"),
                T::DATATYPE.as_str()
            )));
        }
        let bytes = self.input(index)?;
        elements_mut::<T>(bytes)
            .ok_or_else(|| ClientError::BadRequest(format!("input {index} is not aligned")))
    }

    /// The index of the input named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.request.inputs.iter().position(|i| i.name == name)
    }

    /// The request's parameters (sent as they are).
    pub fn parameters_mut(&mut self) -> &mut std::collections::HashMap<String, InferParameter> {
        &mut self.request.parameters
    }

    /// The request id (echoed in the response).
    pub fn set_id(&mut self, id: impl Into<String>) {
        self.request.id = id.into();
    }

    /// Shares the region before the call: for a foreign caller (Python)
    /// that writes the inputs through their addresses
    /// ([`SharedRequest::input_window`]) rather than through `&mut`.
    pub fn share(self) -> Result<SharedRequest, ClientError> {
        let (request, placed) = self.into_parts()?;
        Ok(SharedRequest {
            request,
            placed,
            sent: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The request with its inputs as views of the region (sent inline
    /// from there on a path that does not reach it), and where they lie.
    fn into_parts(self) -> Result<(ModelInferRequest, Placed), ClientError> {
        let Self {
            mut request,
            lease,
            layout,
        } = self;
        let lease = lease.share();
        request.raw_input_contents = layout
            .inputs
            .iter()
            .map(|w| lease.view(w.offset, w.len))
            .collect::<Result<Vec<Bytes>, _>>()
            .map_err(ClientError::Lease)?;
        Ok((request, Placed { lease, layout }))
    }
}

/// A leased request whose region is already shared: its inputs are
/// written through their addresses by a caller outside Rust (the Python
/// package's numpy arrays over the region), which keeps a clone of the
/// lease ([`SharedRequest::lease`]) for as long as it can write. Sent once
/// ([`Client::infer_shared`]): a second call could overwrite outputs the
/// caller still reads.
#[derive(Debug)]
pub struct SharedRequest {
    request: ModelInferRequest,
    placed: Placed,
    sent: std::sync::atomic::AtomicBool,
}

impl SharedRequest {
    /// The region.
    pub fn lease(&self) -> &infermesh_transport::shm::SharedLease {
        &self.placed.lease
    }

    /// Input `index`'s address in this process and its length in bytes.
    pub fn input_window(&self, index: usize) -> Result<(usize, u64), ClientError> {
        let w = self.placed.layout.inputs.get(index).ok_or_else(|| {
            ClientError::BadRequest(format!(
                "input {index} of {}",
                self.placed.layout.inputs.len()
            ))
        })?;
        let address = self
            .placed
            .lease
            .address(w.offset, w.len)
            .map_err(ClientError::Lease)?;
        Ok((address, w.len))
    }

    /// The request's input heads (name, datatype, shape).
    pub fn inputs(&self) -> &[InferInputTensor] {
        &self.request.inputs
    }
}

impl Client {
    /// Leases a region of the client's shared-memory pool for a call to
    /// `model` with `inputs` and `outputs`, to build the inputs in place
    /// (see the [module docs](crate::leased)).
    pub fn lease(
        &self,
        model: &str,
        inputs: &[TensorSpec],
        outputs: &[OutputSpec],
    ) -> Result<LeasedRequest, ClientError> {
        if model.is_empty() || inputs.is_empty() {
            return Err(ClientError::BadRequest(
                "a leased request names a model and at least one input".into(),
            ));
        }
        let sizes = inputs
            .iter()
            .map(TensorSpec::byte_size)
            .collect::<Result<Vec<u64>, _>>()?;
        let total: u64 = sizes.iter().fold(0, |a, &b| a.saturating_add(b));
        let default_window = total.max(MIN_OUTPUT_WINDOW);
        let layout = Layout::new(
            sizes,
            outputs
                .iter()
                .map(|o| o.max_bytes.unwrap_or(default_window)),
        );
        let lease = self
            .shm_pool()
            .lease(layout.len)
            .map_err(ClientError::Lease)?;
        let request = ModelInferRequest {
            model_name: model.to_string(),
            inputs: inputs
                .iter()
                .map(|t| InferInputTensor {
                    name: t.name.clone(),
                    datatype: t.datatype.as_str().to_string(),
                    shape: t.shape.clone(),
                    ..Default::default()
                })
                .collect(),
            outputs: outputs
                .iter()
                .map(|o| InferRequestedOutputTensor {
                    name: o.name.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        Ok(LeasedRequest {
            request,
            lease,
            layout,
        })
    }

    /// Sends a leased request, as [`Client::infer_answered`] sends a plain
    /// one (the same retries, balancing and ladder). Over shared memory the
    /// response's `raw_output_contents` are views of the region.
    pub async fn infer_leased(&self, req: LeasedRequest) -> Result<Answered, ClientError> {
        let (request, placed) = req.into_parts()?;
        let span = tracing::info_span!(
            "infermesh.infer",
            otel.kind = "client",
            model = %request.model_name,
        );
        tracing::Instrument::instrument(self.infer_traced(request, Some(&placed)), span).await
    }
}

impl Client {
    /// Sends a shared leased request (see [`SharedRequest`]); a request
    /// already sent is refused.
    pub async fn infer_shared(&self, req: &SharedRequest) -> Result<Answered, ClientError> {
        if req.sent.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Err(ClientError::BadRequest(
                "a leased request is sent once; lease another".into(),
            ));
        }
        let span = tracing::info_span!(
            "infermesh.infer",
            otel.kind = "client",
            model = %req.request.model_name,
        );
        let call = self.infer_traced(req.request.clone(), Some(&req.placed));
        tracing::Instrument::instrument(call, span).await
    }
}
