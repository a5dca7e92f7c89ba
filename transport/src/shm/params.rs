//! The tensor parameters of Triton's shared-memory extension.
//!
//! An input or requested output is in shared memory when its parameters
//! carry `shared_memory_region` (string: a registered region name) and
//! `shared_memory_byte_size` (int64), and optionally `shared_memory_offset`
//! (int64, default 0, relative to the registered window). Parsing is as
//! strict as Triton's: wrong types, a size or offset without a region, a
//! region without a size, and negative values are refused.

use std::collections::HashMap;

use infermesh_proto::inference::InferParameter;
use infermesh_proto::inference::infer_parameter::ParameterChoice;

use crate::error::ShmError;

/// Parameter naming the registered region.
pub const REGION_PARAM: &str = "shared_memory_region";
/// Parameter giving the offset in the region (optional, default 0).
pub const OFFSET_PARAM: &str = "shared_memory_offset";
/// Parameter giving the tensor's size in bytes.
pub const BYTE_SIZE_PARAM: &str = "shared_memory_byte_size";

/// Where a tensor lies in a registered shared-memory region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// The registered region name.
    pub region: String,
    /// Offset within the registered window.
    pub offset: u64,
    /// Bytes of the tensor (inputs) or of the window for it (outputs).
    pub byte_size: u64,
}

impl ShmRef {
    /// Reads the reference from a tensor's parameters: `None` when the
    /// tensor is not in shared memory. `tensor` names it in errors.
    pub fn from_params(
        tensor: &str,
        params: &HashMap<String, InferParameter>,
    ) -> Result<Option<ShmRef>, ShmError> {
        let bad = |param, reason| ShmError::BadParameter {
            tensor: tensor.to_string(),
            param,
            reason,
        };
        let choice = |name: &str| params.get(name).map(|p| p.parameter_choice.as_ref());
        let region = match choice(REGION_PARAM) {
            None => None,
            Some(Some(ParameterChoice::StringParam(s))) => Some(s.clone()),
            Some(_) => return Err(bad(REGION_PARAM, "must be a string_param")),
        };
        let int = |name: &'static str| -> Result<Option<u64>, ShmError> {
            match choice(name) {
                None => Ok(None),
                Some(_) if region.is_none() => {
                    Err(bad(name, "is given without 'shared_memory_region'"))
                }
                Some(Some(ParameterChoice::Int64Param(v))) => u64::try_from(*v)
                    .map(Some)
                    .map_err(|_| bad(name, "must not be negative")),
                Some(_) => Err(bad(name, "must be an int64_param")),
            }
        };
        let offset = int(OFFSET_PARAM)?;
        let byte_size = int(BYTE_SIZE_PARAM)?;
        let Some(region) = region else {
            return Ok(None);
        };
        let byte_size = byte_size.ok_or_else(|| {
            bad(
                BYTE_SIZE_PARAM,
                "must be given along with 'shared_memory_region'",
            )
        })?;
        Ok(Some(ShmRef {
            region,
            offset: offset.unwrap_or(0),
            byte_size,
        }))
    }

    /// Writes the reference into a tensor's parameters. Values above
    /// `i64::MAX` cannot be expressed and are clamped (no region is that
    /// large, so the server refuses them as out of bounds).
    pub fn to_params(&self, params: &mut HashMap<String, InferParameter>) {
        let int = |v: u64| InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(
                i64::try_from(v).unwrap_or(i64::MAX),
            )),
        };
        params.insert(
            REGION_PARAM.to_string(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(self.region.clone())),
            },
        );
        params.insert(OFFSET_PARAM.to_string(), int(self.offset));
        params.insert(BYTE_SIZE_PARAM.to_string(), int(self.byte_size));
    }

    /// Removes the shared-memory parameters from a tensor's parameters.
    pub fn clear_params(params: &mut HashMap<String, InferParameter>) {
        for name in [REGION_PARAM, OFFSET_PARAM, BYTE_SIZE_PARAM] {
            params.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: ParameterChoice) -> InferParameter {
        InferParameter {
            parameter_choice: Some(c),
        }
    }

    fn params(entries: &[(&str, ParameterChoice)]) -> HashMap<String, InferParameter> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), p(v.clone())))
            .collect()
    }

    use ParameterChoice::{BoolParam, Int64Param, StringParam, Uint64Param};

    #[test]
    fn round_trips_and_defaults_the_offset() {
        let r = ShmRef {
            region: "in".into(),
            offset: 64,
            byte_size: 128,
        };
        let mut m = HashMap::new();
        r.to_params(&mut m);
        assert_eq!(ShmRef::from_params("t", &m).unwrap(), Some(r));
        m.remove(OFFSET_PARAM);
        assert_eq!(ShmRef::from_params("t", &m).unwrap().unwrap().offset, 0);
        ShmRef::clear_params(&mut m);
        assert!(m.is_empty());
        assert_eq!(ShmRef::from_params("t", &m).unwrap(), None);
    }

    #[test]
    fn strict_about_types_signs_and_companions() {
        let cases = [
            params(&[
                (REGION_PARAM, Int64Param(1)),
                (BYTE_SIZE_PARAM, Int64Param(4)),
            ]),
            params(&[(REGION_PARAM, StringParam("r".into()))]),
            params(&[
                (REGION_PARAM, StringParam("r".into())),
                (BYTE_SIZE_PARAM, Int64Param(-4)),
            ]),
            params(&[
                (REGION_PARAM, StringParam("r".into())),
                (BYTE_SIZE_PARAM, Uint64Param(4)),
            ]),
            params(&[
                (REGION_PARAM, StringParam("r".into())),
                (BYTE_SIZE_PARAM, Int64Param(4)),
                (OFFSET_PARAM, Int64Param(-1)),
            ]),
            params(&[
                (REGION_PARAM, StringParam("r".into())),
                (BYTE_SIZE_PARAM, Int64Param(4)),
                (OFFSET_PARAM, BoolParam(true)),
            ]),
            params(&[(BYTE_SIZE_PARAM, Int64Param(4))]),
            params(&[(OFFSET_PARAM, Int64Param(0))]),
        ];
        for m in cases {
            let err = ShmRef::from_params("INPUT0", &m).unwrap_err();
            assert!(matches!(err, ShmError::BadParameter { .. }), "{m:?}");
            assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
            assert!(err.to_string().contains("INPUT0"));
        }
    }

    fn choice() -> impl proptest::strategy::Strategy<Value = Option<ParameterChoice>> {
        use proptest::prelude::*;
        prop::option::of(prop_oneof![
            any::<i64>().prop_map(Int64Param),
            prop_oneof![Just(0i64), Just(-1), Just(i64::MAX), 0i64..4096].prop_map(Int64Param),
            ".{0,8}".prop_map(StringParam),
            any::<bool>().prop_map(BoolParam),
            any::<u64>().prop_map(Uint64Param),
        ])
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(4096))]

        /// Arbitrary parameters never panic the parser, and what it accepts
        /// is exactly what was given: a string region, a non-negative int64
        /// size, a non-negative int64 offset or none (0).
        #[test]
        fn accepts_only_well_formed_references(
            present in proptest::collection::vec(proptest::option::of(choice()), 3),
            other in proptest::option::of(choice()),
        ) {
            let mut m = HashMap::new();
            for (name, c) in [REGION_PARAM, OFFSET_PARAM, BYTE_SIZE_PARAM].into_iter().zip(present) {
                if let Some(c) = c {
                    m.insert(name.to_string(), InferParameter { parameter_choice: c });
                }
            }
            if let Some(c) = other {
                m.insert("unrelated".to_string(), InferParameter { parameter_choice: c });
            }
            let get = |k: &str| m.get(k).map(|p| p.parameter_choice.clone());
            match ShmRef::from_params("t", &m) {
                Ok(Some(r)) => {
                    proptest::prop_assert_eq!(get(REGION_PARAM), Some(Some(StringParam(r.region.clone()))));
                    proptest::prop_assert_eq!(get(BYTE_SIZE_PARAM), Some(Some(Int64Param(r.byte_size as i64))));
                    proptest::prop_assert!(r.byte_size <= i64::MAX as u64);
                    match get(OFFSET_PARAM) {
                        None => proptest::prop_assert_eq!(r.offset, 0),
                        Some(c) => proptest::prop_assert_eq!(c, Some(Int64Param(r.offset as i64))),
                    }
                    proptest::prop_assert!(r.offset <= i64::MAX as u64);
                }
                Ok(None) => {
                    for k in [REGION_PARAM, OFFSET_PARAM, BYTE_SIZE_PARAM] {
                        proptest::prop_assert!(get(k).is_none(), "{} ignored", k);
                    }
                }
                Err(e) => {
                    let bad = matches!(e, ShmError::BadParameter { .. });
                    proptest::prop_assert!(bad, "{}", e);
                }
            }
        }
    }
}
