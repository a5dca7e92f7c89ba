//! [`ShmTransport`]: the client side of the shared-memory path.
//!
//! `stage` leases one region from the [`ShmPool`] per request, lays it out
//! with [`Layout`] (every input at a 64-byte-aligned offset, then one
//! window per requested output, sized by `output_bytes_hint`, by default
//! the total input size and at least 64 KiB) and copies the inline inputs
//! in; [`ShmTransport::stage_in_place`] takes a region whose inputs the
//! caller already built there, and copies nothing. The inputs and
//! requested outputs get Triton's `shared_memory_*` parameters and
//! `raw_input_contents` is emptied (zero-byte inputs stay inline: Triton
//! refuses empty windows). When the request lists no outputs, the server
//! returns them all inline. `complete` puts each output the server placed
//! in its window into `raw_output_contents`, in output order, sized from
//! the output's datatype and shape — as a view of the region
//! ([`SharedLease::view`]), not a copy: the region stays out of the pool
//! until the caller drops the response's bytes.

use std::collections::HashMap;

use bytes::Bytes;
use infermesh_proto::inference::model_infer_response::InferOutputTensor;
use infermesh_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use infermesh_proto::tensor::{DataType, element_count};

use super::layout::{Layout, Window};
use super::lease::SharedLease;
use super::params::{REGION_PARAM, ShmRef};
use super::pool::{MIN_REGION_BYTES, ShmPool};
use crate::error::TransportError;
use crate::path::Path;
use crate::staged::{Registration, Staged};

/// Smallest default window for one output.
pub const MIN_OUTPUT_WINDOW: u64 = MIN_REGION_BYTES;

/// The shared-memory path to one peer (the peer id names the connection
/// the registrations live on; see [`ShmRegistry`](super::ShmRegistry)).
#[derive(Clone)]
pub struct ShmTransport {
    pool: ShmPool,
    peer: String,
    output_bytes_hint: Option<u64>,
}

/// What a staged request holds until `complete`: the region, shared with
/// the views of its outputs.
struct ShmStaged {
    lease: SharedLease,
    outputs: Vec<OutputWindow>,
}

struct OutputWindow {
    name: String,
    window: Window,
}

impl ShmTransport {
    /// The shared-memory path to `peer`, leasing from `pool`.
    pub fn new(pool: ShmPool, peer: impl Into<String>) -> Self {
        Self {
            pool,
            peer: peer.into(),
            output_bytes_hint: None,
        }
    }

    /// Reserves `bytes` for each requested output instead of the default
    /// (total input bytes, at least 64 KiB).
    pub fn with_output_bytes_hint(mut self, bytes: u64) -> Self {
        self.output_bytes_hint = Some(bytes.max(1));
        self
    }

    /// The peer this transport registers with.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The pool it leases from.
    pub fn pool(&self) -> &ShmPool {
        &self.pool
    }

    /// Forgets this peer's registrations (it restarted or refused a region),
    /// so the next request registers again.
    pub fn forget_registrations(&self) {
        self.pool.forget_peer(&self.peer);
    }

    /// Stages a request whose inputs the caller built in place: its
    /// `raw_input_contents` are views of `lease` at `layout`'s input windows
    /// (what [`SharedLease::view`] gives), and `layout` has one window per
    /// requested output. Nothing is copied: the request is rewritten to
    /// reference the windows. A request that is not laid out so (a lease
    /// of another pool, inputs elsewhere) is staged by copying, as
    /// [`ShmTransport::stage`] does.
    pub fn stage_in_place(
        &self,
        req: &mut ModelInferRequest,
        lease: &SharedLease,
        layout: &Layout,
    ) -> Result<Staged, TransportError> {
        let in_place = lease.is_from(&self.pool)
            && req.inputs.len() == layout.inputs.len()
            && req.raw_input_contents.len() == layout.inputs.len()
            && req.outputs.len() == layout.outputs.len()
            && req.inputs.iter().all(|i| !in_shm(&i.parameters))
            && req.outputs.iter().all(|o| !in_shm(&o.parameters))
            && req
                .raw_input_contents
                .iter()
                .zip(&layout.inputs)
                .all(|(raw, w)| {
                    raw.len() as u64 == w.len
                        && (raw.is_empty()
                            || lease
                                .address(w.offset, w.len)
                                .is_ok_and(|a| a == raw.as_ptr() as usize))
                });
        if !in_place {
            return self.stage(req);
        }
        let original = req.clone();
        Ok(self.place(req, original, lease.clone(), layout))
    }

    /// Rewrites `req` (raw form, one input window per input and one output
    /// window per requested output in `layout`) to reference `lease`'s
    /// region, and asks for its registration if the peer does not have it.
    fn place(
        &self,
        req: &mut ModelInferRequest,
        original: ModelInferRequest,
        lease: SharedLease,
        layout: &Layout,
    ) -> Staged {
        let name = lease.name().to_string();
        let mut kept = Vec::new();
        for ((input, raw), w) in req
            .inputs
            .iter_mut()
            .zip(std::mem::take(&mut req.raw_input_contents))
            .zip(&layout.inputs)
        {
            // Zero-byte inputs stay inline: Triton refuses empty windows.
            if raw.is_empty() {
                kept.push(raw);
                continue;
            }
            let r = ShmRef {
                region: name.clone(),
                offset: w.offset,
                byte_size: w.len,
            };
            r.to_params(&mut input.parameters);
        }
        req.raw_input_contents = kept;
        let mut outputs = Vec::with_capacity(layout.outputs.len());
        for (out, w) in req.outputs.iter_mut().zip(&layout.outputs) {
            let r = ShmRef {
                region: name.clone(),
                offset: w.offset,
                byte_size: w.len,
            };
            r.to_params(&mut out.parameters);
            outputs.push(OutputWindow {
                name: out.name.clone(),
                window: *w,
            });
        }
        let pooled = lease.pooled();
        let registration = (!pooled.is_registered_with(&self.peer)).then(|| {
            let peer = self.peer.clone();
            let len = pooled.region().len();
            Registration::new(name.clone(), format!("/{name}"), 0, len, move || {
                pooled.mark_registered(&peer)
            })
        });
        let staged = Staged::rewritten(original, Box::new(ShmStaged { lease, outputs }));
        match registration {
            Some(r) => staged.with_registration(r),
            None => staged,
        }
    }
}

fn in_shm(params: &HashMap<String, InferParameter>) -> bool {
    params.contains_key(REGION_PARAM)
}

fn malformed(reason: String) -> TransportError {
    TransportError::MalformedResponse {
        path: Path::Shm,
        reason,
    }
}

impl ShmTransport {
    /// Moves the request's inline inputs into a leased region, rewriting the
    /// request to reference them (only the plain raw form; anything else is
    /// left as it is). The returned [`Staged`] keeps the lease alive until
    /// [`complete`](ShmTransport::complete).
    pub fn stage(&self, req: &mut ModelInferRequest) -> Result<Staged, TransportError> {
        // Only the plain raw form is staged; anything else goes as it is.
        let raw_form =
            !req.raw_input_contents.is_empty() && req.raw_input_contents.len() == req.inputs.len();
        let caller_shm = req.inputs.iter().any(|i| in_shm(&i.parameters))
            || req.outputs.iter().any(|o| in_shm(&o.parameters));
        let total_input: u64 = req.raw_input_contents.iter().map(|b| b.len() as u64).sum();
        if !raw_form || caller_shm || total_input == 0 {
            return Ok(Staged::untouched());
        }
        let window = self
            .output_bytes_hint
            .unwrap_or_else(|| total_input.max(MIN_OUTPUT_WINDOW));
        let layout = Layout::new(
            req.raw_input_contents.iter().map(|b| b.len() as u64),
            req.outputs.iter().map(|_| window),
        );
        let lease = self.pool.lease(layout.len)?;
        for (raw, w) in req.raw_input_contents.iter().zip(&layout.inputs) {
            lease.region().write(w.offset, raw)?;
        }
        let original = req.clone();
        Ok(self.place(req, original, lease.share(), &layout))
    }

    /// After the response: brings the outputs the peer placed in the region
    /// back (`raw_output_contents` in the order of `resp.outputs`, views of
    /// the region) and releases what nothing holds any more.
    pub fn complete(
        &self,
        staged: Staged,
        resp: &mut ModelInferResponse,
    ) -> Result<(), TransportError> {
        let Some(state) = staged.into_state::<ShmStaged>() else {
            return Ok(());
        };
        let n = resp.outputs.len();
        let mut placed = vec![false; n];
        let mut windows = Vec::with_capacity(state.outputs.len());
        for w in &state.outputs {
            let i = resp
                .outputs
                .iter()
                .position(|o| o.name == w.name)
                .ok_or_else(|| malformed(format!("output '{}' is missing", w.name)))?;
            placed[i] = true;
            windows.push((i, w));
        }
        let raw_len = resp.raw_output_contents.len();
        // Triton keeps an empty entry per shared-memory output; a server
        // that drops the entry instead is accepted too.
        let aligned = raw_len == n;
        if !aligned && raw_len + windows.len() != n {
            return Err(malformed(format!(
                "{raw_len} raw_output_contents entries for {n} outputs"
            )));
        }
        // Outputs are views of the region, not copies: it stays out of the
        // pool while the caller holds any of them.
        let lease = &state.lease;
        let mut fetched: Vec<Option<Bytes>> = vec![None; n];
        for (i, w) in windows {
            if aligned && !resp.raw_output_contents[i].is_empty() {
                continue; // the server answered this one inline
            }
            let size = output_size(&resp.outputs[i], &w.window, lease)?;
            fetched[i] = Some(lease.view(w.window.offset, size)?);
        }
        if aligned {
            for (slot, bytes) in resp.raw_output_contents.iter_mut().zip(fetched) {
                if let Some(bytes) = bytes {
                    *slot = bytes;
                }
            }
        } else {
            let mut inline = std::mem::take(&mut resp.raw_output_contents).into_iter();
            resp.raw_output_contents = fetched
                .into_iter()
                .zip(placed)
                .map(|(bytes, placed)| {
                    if placed { bytes } else { inline.next() }.unwrap_or_default()
                })
                .collect();
        }
        Ok(())
    }
}

/// Bytes an output occupies in its window: shape × element size, or for
/// `BYTES` the length-prefixed elements found in the window.
fn output_size(
    out: &InferOutputTensor,
    w: &Window,
    lease: &SharedLease,
) -> Result<u64, TransportError> {
    let bad = |what: &str| malformed(format!("output '{}': {what}", out.name));
    let dtype = DataType::parse(&out.datatype).ok_or_else(|| bad("unknown datatype"))?;
    let count = element_count(&out.shape).ok_or_else(|| bad("invalid shape"))?;
    let size = match dtype.element_size() {
        Some(es) => count.checked_mul(es).map(|s| s as u64),
        None => bytes_len(lease.slice(w.offset, w.len)?, count),
    }
    .ok_or_else(|| bad("does not fit its shared memory window"))?;
    if size > w.len {
        return Err(bad("does not fit its shared memory window"));
    }
    Ok(size)
}

/// Length of `count` `BYTES` elements (u32 LE length + data) at the start
/// of `s`, if they fit.
fn bytes_len(s: &[u8], count: usize) -> Option<u64> {
    let mut pos = 0usize;
    for _ in 0..count {
        let prefix: [u8; 4] = s.get(pos..pos.checked_add(4)?)?.try_into().ok()?;
        pos = pos
            .checked_add(4)?
            .checked_add(u32::from_le_bytes(prefix) as usize)?;
        if pos > s.len() {
            return None;
        }
    }
    Some(pos as u64)
}

#[cfg(test)]
mod tests;
