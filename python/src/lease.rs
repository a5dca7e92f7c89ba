//! Leased regions for Python callers (issue 27): the inputs of a call are
//! numpy arrays over a region of the client's shared-memory pool, written
//! in place by the caller; the outputs come back as read-only arrays over
//! the same region (the plain `infer`'s outputs over shared memory are
//! such views too).
//!
//! Each array's base is a [`RegionBuffer`] holding a clone of the region's
//! lease, so the region stays out of the pool until the last array over it
//! (input or output) is gone: it is never reused while Python can still
//! read or write it. A lease is sent once.

use std::sync::Arc;

use infermesh_client::{Client, ClientError, OutputSpec, SharedRequest, TensorSpec};
use infermesh_proto::tensor::{DataType, echo};
use infermesh_transport::shm::SharedLease;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{MAX_DIMS, MAX_NAME_BYTES, MAX_TENSORS, invalid};

/// One input as the front gets it: `(name, datatype, shape, buffer)`.
type LeasedInput = (String, String, Vec<i64>, RegionBuffer);

/// A region leased for one call: its inputs are written through
/// [`Lease::inputs`], then it is sent with `NativeClient.infer_leased`.
#[pyclass(module = "infermesh._native", frozen)]
pub(crate) struct Lease {
    pub(crate) request: Arc<SharedRequest>,
}

#[pymethods]
impl Lease {
    /// `(name, datatype, shape, buffer)` per input; the buffer exposes a
    /// writable `__array_interface__` over the input's window.
    fn inputs(&self) -> PyResult<Vec<LeasedInput>> {
        let mut out = Vec::with_capacity(self.request.inputs().len());
        for (i, t) in self.request.inputs().iter().enumerate() {
            let (address, len) = self
                .request
                .input_window(i)
                .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
            out.push((
                t.name.clone(),
                t.datatype.clone(),
                t.shape.clone(),
                RegionBuffer {
                    _lease: self.request.lease().clone(),
                    address,
                    len: len as usize,
                    writable: true,
                },
            ));
        }
        Ok(out)
    }
}

/// Bytes of a leased region that numpy maps without a copy: an input's
/// window (writable) or an output's (read-only). Holds the lease.
#[pyclass(module = "infermesh._native", frozen)]
pub(crate) struct RegionBuffer {
    _lease: SharedLease,
    address: usize,
    len: usize,
    writable: bool,
}

#[pymethods]
impl RegionBuffer {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.address, !self.writable))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// Leases a region for `model` with `inputs` `(name, datatype, shape)` and
/// `outputs` `(name, max_bytes)`.
pub(crate) fn lease(
    py: Python<'_>,
    client: &Client,
    model: String,
    inputs: Vec<(String, String, Vec<i64>)>,
    outputs: Vec<(String, Option<u64>)>,
) -> PyResult<Lease> {
    if model.is_empty() || model.len() > MAX_NAME_BYTES {
        return Err(invalid(
            py,
            format!("model names must be 1..={MAX_NAME_BYTES} bytes"),
        ));
    }
    if inputs.len() > MAX_TENSORS || outputs.len() > MAX_TENSORS {
        return Err(invalid(
            py,
            format!("at most {MAX_TENSORS} inputs and outputs"),
        ));
    }
    let mut specs = Vec::with_capacity(inputs.len());
    for (name, datatype, shape) in inputs {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(invalid(
                py,
                format!("input names must be 1..={MAX_NAME_BYTES} bytes"),
            ));
        }
        if shape.len() > MAX_DIMS {
            return Err(invalid(
                py,
                format!("input '{}': at most {MAX_DIMS} dimensions", echo(&name)),
            ));
        }
        let dtype = DataType::parse(&datatype).ok_or_else(|| {
            invalid(
                py,
                format!(
                    "input '{}': unknown datatype '{}'",
                    echo(&name),
                    echo(&datatype)
                ),
            )
        })?;
        specs.push(TensorSpec::new(name, dtype, &shape));
    }
    let outputs: Vec<OutputSpec> = outputs
        .into_iter()
        .map(|(name, max)| match max {
            Some(m) => OutputSpec::new(name).with_max_bytes(m),
            None => OutputSpec::new(name),
        })
        .collect();
    let leased = client
        .lease(&model, &specs, &outputs)
        .and_then(|r| r.share())
        .map_err(|e| crate::to_py_err(py, &e))?;
    Ok(Lease {
        request: Arc::new(leased),
    })
}

/// The pool's counters: regions created, leased now (views included),
/// reused, bytes held.
pub(crate) fn counters<'py>(py: Python<'py>, client: &Client) -> PyResult<Bound<'py, PyDict>> {
    let c = client.shm_pool().counters();
    let d = PyDict::new(py);
    d.set_item("created", c.created)?;
    d.set_item("reused", c.reused)?;
    d.set_item("leased", c.leased)?;
    d.set_item("retired", c.retired)?;
    d.set_item("exhausted", c.exhausted)?;
    d.set_item("total_bytes", c.total_bytes)?;
    Ok(d)
}

/// The leased call, then its outputs.
pub(crate) async fn call(
    client: Client,
    req: Arc<SharedRequest>,
    timeout: Option<std::time::Duration>,
) -> Result<Vec<crate::Output>, ClientError> {
    let answered = match timeout {
        None => client.infer_shared(&req).await?,
        Some(t) => match tokio::time::timeout(t, client.infer_shared(&req)).await {
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
    crate::outputs(answered.response)
}
