//! Triton's request `priority` parameter, read as Triton's own server reads
//! it: an `int64_param` or `uint64_param` named `priority`; 1 is the most
//! urgent, 0 (or none) the tenant's default. Anything else is refused with
//! INVALID_ARGUMENT, as Triton refuses it.

use std::collections::HashMap;

use infermesh_proto::inference::InferParameter;
use infermesh_proto::inference::infer_parameter::ParameterChoice;

use crate::error::AgentError;

/// The request parameter's name.
pub const PRIORITY: &str = "priority";

/// The `priority` of a request with `parameters`, if it gives one.
pub fn request_priority(
    parameters: &HashMap<String, InferParameter>,
) -> Result<Option<u64>, AgentError> {
    let Some(p) = parameters.get(PRIORITY) else {
        return Ok(None);
    };
    match p.parameter_choice {
        Some(ParameterChoice::Uint64Param(v)) => Ok(Some(v)),
        Some(ParameterChoice::Int64Param(v)) if v >= 0 => Ok(Some(v as u64)),
        _ => Err(AgentError::BadRequest(
            "the 'priority' parameter must be a non-negative int64_param or uint64_param".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(choice: Option<ParameterChoice>) -> HashMap<String, InferParameter> {
        HashMap::from([(
            PRIORITY.to_string(),
            InferParameter {
                parameter_choice: choice,
            },
        )])
    }

    #[test]
    fn priority_is_an_unsigned_or_non_negative_integer() {
        assert_eq!(request_priority(&HashMap::new()).unwrap(), None);
        let ok = [
            (ParameterChoice::Uint64Param(3), 3),
            (ParameterChoice::Int64Param(1), 1),
            (ParameterChoice::Int64Param(0), 0),
        ];
        for (choice, want) in ok {
            assert_eq!(request_priority(&with(Some(choice))).unwrap(), Some(want));
        }
        for bad in [
            Some(ParameterChoice::Int64Param(-1)),
            Some(ParameterChoice::StringParam("1".into())),
            Some(ParameterChoice::BoolParam(true)),
            Some(ParameterChoice::DoubleParam(1.0)),
            None,
        ] {
            let err = request_priority(&with(bad)).unwrap_err();
            assert!(err.to_string().contains("'priority'"), "{err}");
        }
    }
}
