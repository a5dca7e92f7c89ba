//! Moving a request's tensors between registered shared memory and the
//! inline form: [`ShmRegistry::take_inputs`] before inference,
//! [`ShmRegistry::place_outputs`] after.
//!
//! Triton's convention, which both follow:
//!
//! - `raw_input_contents` holds one entry per input *not* in shared memory,
//!   in input order; inputs in shared memory consume no entry. Typed
//!   `contents` cannot be mixed with shared-memory inputs here (Triton
//!   allows it; converting typed contents is not worth it for a path no
//!   client uses), and an input in shared memory must not carry `contents`.
//! - The response keeps one `raw_output_contents` entry per output, in
//!   output order, as Triton's gRPC front does; an output placed in shared
//!   memory has an *empty* entry, so positions still line up for clients
//!   that index raw contents by output position. Its name, datatype and
//!   shape stay in `outputs`; Triton does not echo the shared-memory
//!   parameters on the output, and neither do we.
//!
//! Both functions validate everything before changing anything: on error
//! the request or response is exactly as it was.

use bytes::Bytes;
use infermesh_proto::inference::{ModelInferRequest, ModelInferResponse};
use infermesh_proto::tensor::echo;

use super::params::ShmRef;
use super::registry::{Owner, ShmRegistry};
use crate::error::ShmError;

impl ShmRegistry {
    /// Replaces every input that references shared memory with a copy of
    /// its bytes, so `req` becomes a plain inline request: the bytes go into
    /// `raw_input_contents` at the input's position and the shared-memory
    /// parameters are removed. A request without shared-memory inputs is
    /// left untouched.
    pub fn take_inputs(&self, owner: Owner, req: &mut ModelInferRequest) -> Result<(), ShmError> {
        let refs = req
            .inputs
            .iter()
            .map(|i| ShmRef::from_params(&i.name, &i.parameters))
            .collect::<Result<Vec<_>, _>>()?;
        if refs.iter().all(Option::is_none) {
            return Ok(());
        }
        let mut inline = 0;
        for (input, r) in req.inputs.iter().zip(&refs) {
            match r {
                Some(_) if input.contents.is_some() => {
                    return Err(ShmError::ContentsWithShm(input.name.clone()));
                }
                Some(_) => {}
                None if req.raw_input_contents.is_empty() => {
                    return Err(ShmError::TypedContentsMixed(input.name.clone()));
                }
                None => inline += 1,
            }
        }
        if req.raw_input_contents.len() != inline {
            return Err(ShmError::RawCount {
                got: req.raw_input_contents.len(),
                expected: inline,
            });
        }
        let mut copied = Vec::with_capacity(refs.len() - inline);
        for (input, r) in req.inputs.iter().zip(&refs) {
            if let Some(r) = r {
                let region = self.lookup(owner, &input.name, &r.region)?;
                let what = || {
                    format!(
                        "input '{}' in region '{}'",
                        echo(&input.name),
                        echo(&r.region)
                    )
                };
                if r.byte_size == 0 {
                    return Err(ShmError::EmptyWindow { what: what() });
                }
                region.check(&what(), r.offset, r.byte_size)?;
                copied.push(region.read(r.offset, r.byte_size)?);
            }
        }
        // Everything is resolved and copied: now rewrite the request.
        let mut from_shm = copied.into_iter();
        let mut inline_raw = std::mem::take(&mut req.raw_input_contents).into_iter();
        req.raw_input_contents = refs
            .iter()
            .map(|r| {
                let next = if r.is_some() {
                    from_shm.next()
                } else {
                    inline_raw.next()
                };
                next.unwrap_or_default()
            })
            .collect();
        for (input, r) in req.inputs.iter_mut().zip(&refs) {
            if r.is_some() {
                ShmRef::clear_params(&mut input.parameters);
            }
        }
        Ok(())
    }

    /// Copies input `input`'s shared-memory window into the window of the
    /// requested output `output`, without a buffer in this process
    /// ([`ShmRegion::copy_to`](super::ShmRegion::copy_to)): the one copy a
    /// server computing the identity on shared memory makes (Triton's
    /// identity backend on system shared memory makes one), where
    /// [`take_inputs`](Self::take_inputs) and
    /// [`place_outputs`](Self::place_outputs) make two. Returns the bytes
    /// copied, or `None` (nothing done) when the input or the output is not
    /// in shared memory. The request is not changed.
    pub fn copy_input_to_output(
        &self,
        owner: Owner,
        req: &ModelInferRequest,
        input: usize,
        output: &str,
    ) -> Result<Option<u64>, ShmError> {
        let Some(tensor) = req.inputs.get(input) else {
            return Ok(None);
        };
        let Some(from) = ShmRef::from_params(&tensor.name, &tensor.parameters)? else {
            return Ok(None);
        };
        let Some(out) = req.outputs.iter().find(|o| o.name == output) else {
            return Ok(None);
        };
        let Some(to) = ShmRef::from_params(&out.name, &out.parameters)? else {
            return Ok(None);
        };
        if tensor.contents.is_some() {
            return Err(ShmError::ContentsWithShm(tensor.name.clone()));
        }
        let src = self.lookup(owner, &tensor.name, &from.region)?;
        let dst = self.lookup(owner, &out.name, &to.region)?;
        let what =
            |name: &str, r: &ShmRef| format!("'{}' in region '{}'", echo(name), echo(&r.region));
        for (name, r, region) in [(&tensor.name, &from, &src), (&out.name, &to, &dst)] {
            if r.byte_size == 0 {
                return Err(ShmError::EmptyWindow {
                    what: what(name, r),
                });
            }
            region.check(&what(name, r), r.offset, r.byte_size)?;
        }
        if from.byte_size > to.byte_size {
            return Err(ShmError::OutputTooLarge {
                tensor: out.name.clone(),
                needed: from.byte_size,
                window: to.byte_size,
            });
        }
        src.copy_to(from.offset, &dst, to.offset, from.byte_size)?;
        Ok(Some(from.byte_size))
    }

    /// Writes every output that `req` asked for in shared memory into its
    /// window and empties its `raw_output_contents` entry. Outputs not
    /// requested in shared memory are left inline.
    ///
    /// If the client truncates its object while the copies run, some
    /// windows may have been written when the error returns; the response
    /// is still unchanged.
    pub fn place_outputs(
        &self,
        owner: Owner,
        req: &ModelInferRequest,
        resp: &mut ModelInferResponse,
    ) -> Result<(), ShmError> {
        let mut plan = Vec::new();
        for out in &req.outputs {
            let Some(r) = ShmRef::from_params(&out.name, &out.parameters)? else {
                continue;
            };
            let index = resp
                .outputs
                .iter()
                .position(|o| o.name == out.name)
                .ok_or_else(|| ShmError::OutputMissing(out.name.clone()))?;
            if resp.raw_output_contents.len() != resp.outputs.len() {
                return Err(ShmError::OutputNotRaw(out.name.clone()));
            }
            let region = self.lookup(owner, &out.name, &r.region)?;
            let what = || {
                format!(
                    "output '{}' in region '{}'",
                    echo(&out.name),
                    echo(&r.region)
                )
            };
            if r.byte_size == 0 {
                return Err(ShmError::EmptyWindow { what: what() });
            }
            region.check(&what(), r.offset, r.byte_size)?;
            let needed = resp.raw_output_contents[index].len() as u64;
            if needed > r.byte_size {
                return Err(ShmError::OutputTooLarge {
                    tensor: out.name.clone(),
                    needed,
                    window: r.byte_size,
                });
            }
            plan.push((index, region, r.offset));
        }
        for (index, region, offset) in &plan {
            region.write(*offset, &resp.raw_output_contents[*index])?;
        }
        for (index, _, _) in plan {
            resp.raw_output_contents[index] = Bytes::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use infermesh_proto::inference::InferTensorContents;
    use infermesh_proto::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };
    use infermesh_proto::inference::model_infer_response::InferOutputTensor;

    use super::*;
    use crate::shm::region::ShmRegion;
    use crate::shm::registry::RegistryConfig;
    use crate::shm::test_dir::TestDir;

    fn input(name: &str, shm: Option<ShmRef>) -> InferInputTensor {
        let mut parameters = HashMap::new();
        if let Some(r) = shm {
            r.to_params(&mut parameters);
        }
        InferInputTensor {
            name: name.into(),
            datatype: "UINT8".into(),
            shape: vec![4],
            parameters,
            contents: None,
        }
    }

    fn shm(region: &str, offset: u64, byte_size: u64) -> Option<ShmRef> {
        Some(ShmRef {
            region: region.into(),
            offset,
            byte_size,
        })
    }

    struct Fixture {
        _dir: TestDir,
        client: ShmRegion,
        reg: ShmRegistry,
    }

    /// A 4 KiB object filled with 0..=255 repeating, registered for owner 1
    /// as "r" (all of it) and "tail" (its last 1 KiB).
    fn fixture(name: &str) -> Fixture {
        let dir = TestDir::new(name);
        let client = ShmRegion::create_in(dir.shm(), "obj", 4096).unwrap();
        let pattern: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        client.write(0, &pattern).unwrap();
        let reg = ShmRegistry::new(RegistryConfig {
            dir: dir.shm().clone(),
            max_regions_per_owner: 8,
            ..RegistryConfig::default()
        });
        reg.register(1, "r", "/obj", 0, 4096).unwrap();
        reg.register(1, "tail", "/obj", 3072, 1024).unwrap();
        Fixture {
            _dir: dir,
            client,
            reg,
        }
    }

    #[test]
    fn shm_inputs_become_inline_at_their_position() {
        let f = fixture("exchange-inputs");
        let mut req = ModelInferRequest {
            inputs: vec![
                input("A", None),
                input("B", shm("r", 10, 4)),
                input("C", None),
                input("D", shm("tail", 0, 4)),
            ],
            raw_input_contents: vec![Bytes::from_static(b"aaaa"), Bytes::from_static(b"cccc")],
            ..Default::default()
        };
        f.reg.take_inputs(1, &mut req).unwrap();
        assert_eq!(
            req.raw_input_contents,
            vec![
                Bytes::from_static(b"aaaa"),
                Bytes::from(vec![10, 11, 12, 13]),
                Bytes::from_static(b"cccc"),
                Bytes::from(vec![0, 1, 2, 3]), // 3072 % 256 == 0
            ]
        );
        assert!(req.inputs.iter().all(|i| i.parameters.is_empty()));
    }

    #[test]
    fn requests_without_shm_are_untouched() {
        let f = fixture("exchange-none");
        let mut req = ModelInferRequest {
            inputs: vec![input("A", None)],
            ..Default::default()
        };
        req.inputs[0].contents = Some(InferTensorContents::default());
        let before = req.clone();
        f.reg.take_inputs(1, &mut req).unwrap();
        assert_eq!(req, before);
    }

    #[test]
    fn failed_take_inputs_changes_nothing() {
        let f = fixture("exchange-inputs-fail");
        let base = || ModelInferRequest {
            inputs: vec![input("A", None), input("B", shm("r", 0, 4))],
            raw_input_contents: vec![Bytes::from_static(b"aaaa")],
            ..Default::default()
        };
        let cases: Vec<(ModelInferRequest, u64, tonic::Code)> = vec![
            {
                let mut r = base();
                r.inputs[1] = input("B", shm("nope", 0, 4));
                (r, 1, tonic::Code::InvalidArgument)
            },
            (base(), 2, tonic::Code::InvalidArgument), // another owner
            {
                let mut r = base();
                r.inputs[1] = input("B", shm("tail", 1021, 4));
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                let mut r = base();
                r.inputs[1] = input("B", shm("r", u64::MAX, 4));
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                let mut r = base();
                r.inputs[1] = input("B", shm("r", 0, 0));
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                let mut r = base();
                r.raw_input_contents.push(Bytes::from_static(b"extra"));
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                let mut r = base();
                r.raw_input_contents.clear();
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                let mut r = base();
                r.inputs[1].contents = Some(InferTensorContents::default());
                (r, 1, tonic::Code::InvalidArgument)
            },
            {
                // The second shm input is bad: the first must not be applied.
                let mut r = base();
                r.inputs.push(input("C", shm("r", 4095, 2)));
                (r, 1, tonic::Code::InvalidArgument)
            },
        ];
        for (mut req, owner, code) in cases {
            let before = req.clone();
            let err = f.reg.take_inputs(owner, &mut req).unwrap_err();
            assert_eq!(err.to_status().code(), code, "{err}");
            assert_eq!(req, before, "{err}");
        }
        assert_eq!(f.reg.region_count(), 2);
    }

    fn output_request(outputs: Vec<(&str, Option<ShmRef>)>) -> ModelInferRequest {
        ModelInferRequest {
            outputs: outputs
                .into_iter()
                .map(|(name, r)| {
                    let mut parameters = HashMap::new();
                    if let Some(r) = r {
                        r.to_params(&mut parameters);
                    }
                    InferRequestedOutputTensor {
                        name: name.into(),
                        parameters,
                    }
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_input_window_is_copied_to_an_output_window() {
        let f = fixture("exchange-copy");
        let mut req = output_request(vec![("Y", shm("r", 2000, 16))]);
        req.inputs = vec![input("X", shm("r", 100, 16))];
        assert_eq!(
            f.reg.copy_input_to_output(1, &req, 0, "Y").unwrap(),
            Some(16)
        );
        let mut got = [0u8; 16];
        f.client.read_into(2000, &mut got).unwrap();
        let want: Vec<u8> = (100..116).map(|i| i as u8).collect();
        assert_eq!(&got[..], &want[..]);
        // Not both in shared memory: nothing done.
        assert_eq!(f.reg.copy_input_to_output(1, &req, 0, "Z").unwrap(), None);
        let inline = output_request(vec![("Y", shm("r", 2000, 16))]);
        assert_eq!(
            f.reg.copy_input_to_output(1, &inline, 0, "Y").unwrap(),
            None
        );
        // A window too small, another owner, a window past the region.
        let mut small = req.clone();
        small.outputs = output_request(vec![("Y", shm("r", 2000, 8))]).outputs;
        let err = f.reg.copy_input_to_output(1, &small, 0, "Y").unwrap_err();
        assert!(matches!(err, ShmError::OutputTooLarge { .. }), "{err}");
        assert!(f.reg.copy_input_to_output(2, &req, 0, "Y").is_err());
        let mut past = req.clone();
        past.inputs = vec![input("X", shm("tail", 1020, 16))];
        assert!(f.reg.copy_input_to_output(1, &past, 0, "Y").is_err());
    }

    fn response() -> ModelInferResponse {
        let out = |name: &str| InferOutputTensor {
            name: name.into(),
            datatype: "UINT8".into(),
            shape: vec![3],
            ..Default::default()
        };
        ModelInferResponse {
            outputs: vec![out("X"), out("Y"), out("Z")],
            raw_output_contents: vec![
                Bytes::from_static(b"xxx"),
                Bytes::from_static(b"yyy"),
                Bytes::from_static(b"zzz"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn shm_outputs_are_written_and_emptied_in_place() {
        let f = fixture("exchange-outputs");
        let req = output_request(vec![("Y", shm("tail", 8, 16)), ("Z", None)]);
        let mut resp = response();
        f.reg.place_outputs(1, &req, &mut resp).unwrap();
        assert_eq!(
            resp.raw_output_contents,
            vec![
                Bytes::from_static(b"xxx"),
                Bytes::new(),
                Bytes::from_static(b"zzz"),
            ]
        );
        assert_eq!(&f.client.read(3072 + 8, 3).unwrap()[..], b"yyy");
        assert!(resp.outputs[1].parameters.is_empty());
    }

    #[test]
    fn failed_place_outputs_changes_nothing() {
        let f = fixture("exchange-outputs-fail");
        let cases = vec![
            output_request(vec![("X", shm("r", 0, 16)), ("Y", shm("nope", 0, 16))]),
            output_request(vec![("X", shm("r", 0, 16)), ("Y", shm("r", 4090, 16))]),
            output_request(vec![("X", shm("r", 0, 16)), ("Y", shm("r", 100, 2))]),
            output_request(vec![("X", shm("r", 0, 16)), ("Y", shm("r", u64::MAX, 3))]),
            output_request(vec![("X", shm("r", 0, 16)), ("W", shm("r", 100, 16))]),
        ];
        for req in cases {
            let mut resp = response();
            let before = f.client.read(0, 4096).unwrap();
            let err = f.reg.place_outputs(1, &req, &mut resp).unwrap_err();
            assert_eq!(resp, response(), "{err}");
            assert_eq!(f.client.read(0, 4096).unwrap(), before, "{err}");
        }
        let too_small = output_request(vec![("Y", shm("r", 100, 2))]);
        let err = f
            .reg
            .place_outputs(1, &too_small, &mut response())
            .unwrap_err();
        assert!(matches!(
            err,
            ShmError::OutputTooLarge {
                needed: 3,
                window: 2,
                ..
            }
        ));
        assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
        let other_owner = output_request(vec![("Y", shm("r", 100, 16))]);
        let err = f
            .reg
            .place_outputs(2, &other_owner, &mut response())
            .unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
    }
}
