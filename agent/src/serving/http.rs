//! KServe v2 HTTP/REST (`[http] listen`, flag `--http-listen`; Triton's
//! port is 8000), for `tritonclient.http`, `perf_analyzer`'s default and
//! `curl`. Each call is translated to its gRPC counterpart and served by
//! the same [`Front`] as the OIP port — validation, dispatch, metrics and
//! error codes are the gRPC path's.
//!
//! Tensors come as JSON arrays (nested or flat) or, with Triton's binary
//! tensor extension, as raw bytes after a JSON header whose length is in
//! `Inference-Header-Content-Length`; outputs go back the same way when the
//! request asks for `binary_data` (per output) or `binary_data_output`.
//! FP16/BF16 travel only as binary, as in Triton. Errors are KServe JSON
//! (`{"error": "..."}`) with the HTTP status mapped from the gRPC code.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use infermesh_proto::GrpcInferenceService;
use infermesh_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use infermesh_proto::inference::{
    InferParameter, ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelReadyRequest,
    ServerMetadataRequest, ServerReadyRequest, infer_parameter,
};
use infermesh_proto::tensor::{DataType, echo};
use serde_json::{Map, Value, json};
use tonic::Code;

use crate::serving::front::Front;

pub mod port;

/// The binary tensor extension's header: length of the JSON part.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// HTTP requests handled at once; more wait for a slot.
const MAX_REQUESTS: usize = 1024;

/// Most tensors one request may name (inputs or outputs).
const MAX_TENSORS: usize = 1024;

#[derive(Clone)]
struct Http {
    front: Front,
    call_timeout: Duration,
}

/// The REST routes; bodies over `max_body_bytes` are refused with 413.
pub fn router(front: Front, max_body_bytes: usize, call_timeout: Duration) -> Router {
    let state = Http {
        front,
        call_timeout,
    };
    Router::new()
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{model}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(model_metadata_v),
        )
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready_v),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer_v))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such KServe v2 path") })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        // A request, body upload included, gets twice the call timeout: a
        // client that stalls mid-body cannot hold the handler forever.
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                match tokio::time::timeout(call_timeout * 2, next.run(req)).await {
                    Ok(r) => r,
                    Err(_) => error(
                        StatusCode::REQUEST_TIMEOUT,
                        "the request did not complete within twice limits.call_timeout",
                    ),
                }
            },
        ))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_REQUESTS))
        .with_state(state)
}

/// A KServe error response.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, &json!({ "error": message.into() }))
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        serde_json::to_vec(v).expect("JSON values serialize"),
    )
        .into_response()
}

fn from_status(s: &tonic::Status) -> Response {
    let status = match s.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, s.message())
}

/// A request that cannot be translated: 400 with this message.
struct Bad(String);

fn bad(message: impl Into<String>) -> Bad {
    Bad(message.into())
}

async fn server_ready(State(h): State<Http>) -> StatusCode {
    match h
        .front
        .server_ready(tonic::Request::new(ServerReadyRequest {}))
        .await
    {
        Ok(r) if r.get_ref().ready => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn server_metadata(State(h): State<Http>) -> Response {
    match h
        .front
        .server_metadata(tonic::Request::new(ServerMetadataRequest {}))
        .await
    {
        Ok(r) => {
            let m = r.into_inner();
            json_response(
                StatusCode::OK,
                &json!({ "name": m.name, "version": m.version, "extensions": m.extensions }),
            )
        }
        Err(s) => from_status(&s),
    }
}

async fn model_metadata_v(
    state: State<Http>,
    Path((model, _version)): Path<(String, String)>,
) -> Response {
    model_metadata(state, Path(model)).await
}

async fn model_metadata(State(h): State<Http>, Path(model): Path<String>) -> Response {
    let req = ModelMetadataRequest {
        name: model,
        version: String::new(),
    };
    match h.front.model_metadata(tonic::Request::new(req)).await {
        Ok(r) => {
            let m = r.into_inner();
            let tensors =
                |ts: &[infermesh_proto::inference::model_metadata_response::TensorMetadata]| {
                    ts.iter()
                        .map(
                            |t| json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape }),
                        )
                        .collect::<Vec<_>>()
                };
            json_response(
                StatusCode::OK,
                &json!({
                    "name": m.name,
                    "versions": m.versions,
                    "platform": m.platform,
                    "inputs": tensors(&m.inputs),
                    "outputs": tensors(&m.outputs),
                }),
            )
        }
        Err(s) => from_status(&s),
    }
}

async fn model_ready_v(
    state: State<Http>,
    Path((model, _version)): Path<(String, String)>,
) -> StatusCode {
    model_ready(state, Path(model)).await
}

async fn model_ready(State(h): State<Http>, Path(model): Path<String>) -> StatusCode {
    let req = ModelReadyRequest {
        name: model,
        version: String::new(),
    };
    match h.front.model_ready(tonic::Request::new(req)).await {
        Ok(r) if r.get_ref().ready => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn infer_v(
    state: State<Http>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run_infer(state.0, model, version, headers, body).await
}

async fn infer(
    state: State<Http>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run_infer(state.0, model, String::new(), headers, body).await
}

async fn run_infer(
    h: Http,
    model: String,
    version: String,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = match parse_request(model, version, &headers, body) {
        Ok(p) => p,
        Err(Bad(message)) => return error(StatusCode::BAD_REQUEST, message),
    };
    let mut req = tonic::Request::new(parsed.request);
    let timeout =
        tonic::metadata::MetadataValue::try_from(format!("{}m", h.call_timeout.as_millis().max(1)))
            .expect("digits and a unit");
    req.metadata_mut().insert("grpc-timeout", timeout);
    match h.front.model_infer(req).await {
        Ok(resp) => render_response(resp.into_inner(), &parsed.binary_outputs, parsed.all_binary),
        Err(s) => from_status(&s),
    }
}

/// A request translated to gRPC, with how each output is to be returned.
struct Parsed {
    request: ModelInferRequest,
    /// Outputs asked for by name, and whether each goes back as binary.
    binary_outputs: Vec<(String, bool)>,
    /// `binary_data_output`: outputs not named go back as binary.
    all_binary: bool,
}

fn parse_request(
    model: String,
    version: String,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Parsed, Bad> {
    let json_len = match headers.get(HEADER_LENGTH) {
        None => body.len(),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|n| *n <= body.len())
            .ok_or_else(|| {
                bad(format!(
                    "{HEADER_LENGTH} must be a number of bytes no larger than the body ({})",
                    body.len()
                ))
            })?,
    };
    let mut binary = body.slice(json_len..);
    let doc: Value =
        serde_json::from_slice(&body[..json_len]).map_err(|e| bad(format!("request JSON: {e}")))?;
    let doc = doc
        .as_object()
        .ok_or_else(|| bad("request JSON: an object is expected"))?;
    let mut request = ModelInferRequest {
        model_name: model,
        model_version: version,
        id: doc
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        ..Default::default()
    };
    let params = doc.get("parameters").and_then(Value::as_object);
    // Triton's request priority (a number; checked where it is read).
    if let Some(p) = params.and_then(|p| p.get(crate::dispatch::tenant::priority::PRIORITY)) {
        let choice = match (p.as_u64(), p.as_i64()) {
            (Some(v), _) => infer_parameter::ParameterChoice::Uint64Param(v),
            (None, Some(v)) => infer_parameter::ParameterChoice::Int64Param(v),
            _ => return Err(bad("parameters.priority must be a non-negative integer")),
        };
        request.parameters.insert(
            crate::dispatch::tenant::priority::PRIORITY.to_string(),
            InferParameter {
                parameter_choice: Some(choice),
            },
        );
    }
    let all_binary = params
        .and_then(|p| p.get("binary_data_output"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let inputs = doc
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("request JSON: 'inputs' (an array) is required"))?;
    if inputs.len() > MAX_TENSORS {
        return Err(bad(format!("more than {MAX_TENSORS} inputs")));
    }
    for (i, input) in inputs.iter().enumerate() {
        let (tensor, raw) = parse_input(i, input, &mut binary)?;
        request.inputs.push(tensor);
        request.raw_input_contents.push(raw);
    }
    if !binary.is_empty() {
        return Err(bad(format!(
            "{} bytes after the last binary input: binary_data_size of the inputs does not add up",
            binary.len()
        )));
    }
    let mut binary_outputs = Vec::new();
    if let Some(outputs) = doc.get("outputs").and_then(Value::as_array) {
        if outputs.len() > MAX_TENSORS {
            return Err(bad(format!("more than {MAX_TENSORS} outputs")));
        }
        for o in outputs {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("every output needs a 'name'"))?;
            let binary = o
                .pointer("/parameters/binary_data")
                .and_then(Value::as_bool)
                .unwrap_or(all_binary);
            request.outputs.push(InferRequestedOutputTensor {
                name: name.to_string(),
                ..Default::default()
            });
            binary_outputs.push((name.to_string(), binary));
        }
    }
    Ok(Parsed {
        request,
        binary_outputs,
        all_binary,
    })
}

fn parse_input(
    index: usize,
    input: &Value,
    binary: &mut Bytes,
) -> Result<(InferInputTensor, Bytes), Bad> {
    let name = input
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("input {index}: 'name' is required")))?;
    let datatype = input
        .get("datatype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("input '{}': 'datatype' is required", echo(name))))?;
    let shape = input
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("input '{}': 'shape' is required", echo(name))))?
        .iter()
        .map(|d| d.as_i64())
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| bad(format!("input '{}': shape must be integers", echo(name))))?;
    let binary_size = input
        .pointer("/parameters/binary_data_size")
        .map(|v| {
            v.as_u64()
                .ok_or_else(|| bad("binary_data_size must be a number"))
        })
        .transpose()?;
    let raw = match binary_size {
        Some(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > binary.len() {
                return Err(bad(format!(
                    "input '{}': binary_data_size {n} but only {} bytes left in the body",
                    echo(name),
                    binary.len()
                )));
            }
            // A view of the body: no copy.
            binary.split_to(n)
        }
        None => {
            let data = input.get("data").ok_or_else(|| {
                bad(format!(
                    "input '{}': 'data' or parameters.binary_data_size is required",
                    echo(name)
                ))
            })?;
            json_to_raw(datatype, data)
                .map(Bytes::from)
                .map_err(|e| bad(format!("input '{}': {e}", echo(name))))?
        }
    };
    Ok((
        InferInputTensor {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape,
            ..Default::default()
        },
        raw,
    ))
}

/// JSON `data` (nested or flat) as little-endian raw bytes of `datatype`.
fn json_to_raw(datatype: &str, data: &Value) -> Result<Vec<u8>, String> {
    let dt = DataType::parse(datatype)
        .ok_or_else(|| format!("unknown datatype '{}'", echo(datatype)))?;
    if matches!(dt, DataType::Fp16 | DataType::Bf16) {
        return Err(format!(
            "{datatype} travels only as binary data, as in Triton"
        ));
    }
    let mut flat = Vec::new();
    flatten(data, &mut flat, 0)?;
    let mut out = Vec::new();
    for v in flat {
        let bad = || format!("{v} is not a {datatype} value");
        let width = dt.element_size().unwrap_or(0);
        match dt {
            DataType::Bool => out.push(u8::from(v.as_bool().ok_or_else(bad)?)),
            DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
                let x = v.as_u64().ok_or_else(bad)?;
                if width < 8 && x >> (width * 8) != 0 {
                    return Err(bad());
                }
                out.extend_from_slice(&x.to_le_bytes()[..width]);
            }
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                let x = v.as_i64().ok_or_else(bad)?;
                let bits = width * 8;
                if bits < 64 && (x < -(1i64 << (bits - 1)) || x >= 1i64 << (bits - 1)) {
                    return Err(bad());
                }
                out.extend_from_slice(&x.to_le_bytes()[..width]);
            }
            DataType::Fp32 => {
                out.extend_from_slice(&(v.as_f64().ok_or_else(bad)? as f32).to_le_bytes())
            }
            DataType::Fp64 => out.extend_from_slice(&v.as_f64().ok_or_else(bad)?.to_le_bytes()),
            DataType::Bytes => {
                let s = v.as_str().ok_or_else(bad)?;
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            DataType::Fp16 | DataType::Bf16 => unreachable!("refused above"),
        }
    }
    Ok(out)
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>, depth: usize) -> Result<(), String> {
    if depth > 32 {
        return Err("data nested deeper than 32 levels".into());
    }
    match v {
        Value::Array(items) => {
            for item in items {
                flatten(item, out, depth + 1)?;
            }
            Ok(())
        }
        other => {
            out.push(other);
            Ok(())
        }
    }
}

/// Raw little-endian bytes of `datatype` as JSON values.
fn raw_to_json(datatype: &str, raw: &[u8]) -> Result<Vec<Value>, String> {
    let dt = DataType::parse(datatype)
        .ok_or_else(|| format!("unknown datatype '{}'", echo(datatype)))?;
    let Some(w) = dt.element_size() else {
        // BYTES: each element a 4-byte little-endian length and the bytes.
        let mut out = Vec::new();
        let mut rest = raw;
        while !rest.is_empty() {
            let (len, tail) = rest
                .split_first_chunk::<4>()
                .ok_or("a BYTES element is cut short")?;
            let len = u32::from_le_bytes(*len) as usize;
            if len > tail.len() {
                return Err("a BYTES element is cut short".into());
            }
            out.push(Value::String(
                String::from_utf8_lossy(&tail[..len]).into_owned(),
            ));
            rest = &tail[len..];
        }
        return Ok(out);
    };
    if raw.len() % w != 0 {
        return Err(format!(
            "{} bytes is not a whole number of {datatype}",
            raw.len()
        ));
    }
    raw.chunks_exact(w)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..w].copy_from_slice(c);
            Ok(match dt {
                DataType::Bool => Value::Bool(c[0] != 0),
                DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
                    json!(u64::from_le_bytes(b))
                }
                DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                    let shift = 64 - 8 * w as u32;
                    json!((i64::from_le_bytes(b) << shift) >> shift)
                }
                DataType::Fp32 => json!(f32::from_le_bytes(b[..4].try_into().expect("4 bytes"))),
                DataType::Fp64 => json!(f64::from_le_bytes(b)),
                DataType::Fp16 | DataType::Bf16 | DataType::Bytes => {
                    return Err(format!("{datatype} outputs go back only as binary data"));
                }
            })
        })
        .collect()
}

fn render_response(
    resp: ModelInferResponse,
    requested: &[(String, bool)],
    all_binary: bool,
) -> Response {
    let mut outputs = Vec::new();
    let mut binary = Vec::new();
    for (i, out) in resp.outputs.iter().enumerate() {
        let raw = resp
            .raw_output_contents
            .get(i)
            .map(|b| &b[..])
            .unwrap_or(&[]);
        let as_binary = requested
            .iter()
            .find(|(n, _)| *n == out.name)
            .map_or(all_binary, |(_, b)| *b)
            || matches!(
                DataType::parse(&out.datatype),
                Some(DataType::Fp16 | DataType::Bf16)
            );
        let mut o = Map::new();
        o.insert("name".into(), json!(out.name));
        o.insert("datatype".into(), json!(out.datatype));
        o.insert("shape".into(), json!(out.shape));
        if as_binary {
            o.insert(
                "parameters".into(),
                json!({ "binary_data_size": raw.len() }),
            );
            binary.extend_from_slice(raw);
        } else {
            match raw_to_json(&out.datatype, raw) {
                Ok(data) => {
                    o.insert("data".into(), Value::Array(data));
                }
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
            }
        }
        outputs.push(Value::Object(o));
    }
    let mut doc = Map::new();
    doc.insert("model_name".into(), json!(resp.model_name));
    doc.insert("model_version".into(), json!(resp.model_version));
    if !resp.id.is_empty() {
        doc.insert("id".into(), json!(resp.id));
    }
    if !resp.parameters.is_empty() {
        let params: Map<String, Value> = resp
            .parameters
            .iter()
            .filter_map(|(k, p)| Some((k.clone(), parameter_json(p)?)))
            .collect();
        doc.insert("parameters".into(), Value::Object(params));
    }
    doc.insert("outputs".into(), Value::Array(outputs));
    let head = serde_json::to_vec(&Value::Object(doc)).expect("JSON values serialize");
    if binary.is_empty() {
        return (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            head,
        )
            .into_response();
    }
    let len = head.len();
    let mut body = head;
    body.extend_from_slice(&binary);
    let mut r = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        body,
    )
        .into_response();
    r.headers_mut()
        .insert(HEADER_LENGTH, HeaderValue::from(len));
    r
}

fn parameter_json(p: &InferParameter) -> Option<Value> {
    Some(match p.parameter_choice.as_ref()? {
        infer_parameter::ParameterChoice::BoolParam(b) => json!(b),
        infer_parameter::ParameterChoice::Int64Param(i) => json!(i),
        infer_parameter::ParameterChoice::StringParam(s) => json!(s),
        infer_parameter::ParameterChoice::DoubleParam(d) => json!(d),
        infer_parameter::ParameterChoice::Uint64Param(u) => json!(u),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_tensors_round_trip_through_raw_bytes() {
        for (dt, data) in [
            ("FP32", json!([[1.5, -2.0], [0.25, 8.0]])),
            ("INT8", json!([-128, 127, 0])),
            ("INT64", json!([-5, 1_i64 << 40])),
            ("UINT16", json!([0, 65535])),
            ("BOOL", json!([true, false])),
            ("FP64", json!([1e-300, 3.5])),
            ("BYTES", json!(["a", "", "héllo"])),
        ] {
            let raw = json_to_raw(dt, &data).unwrap();
            let mut flat = Vec::new();
            flatten(&data, &mut flat, 0).unwrap();
            let back = raw_to_json(dt, &raw).unwrap();
            assert_eq!(back.len(), flat.len(), "{dt}");
            for (a, b) in back.iter().zip(flat) {
                assert_eq!(
                    a.as_f64().or(a.as_bool().map(f64::from)),
                    b.as_f64().or(b.as_bool().map(f64::from)),
                    "{dt}"
                );
                assert_eq!(a.as_str(), b.as_str(), "{dt}");
            }
        }
    }

    #[test]
    fn out_of_range_and_unknown_values_are_refused() {
        assert!(json_to_raw("INT8", &json!([128])).is_err());
        assert!(json_to_raw("UINT8", &json!([-1])).is_err());
        assert!(json_to_raw("UINT16", &json!([65536])).is_err());
        assert!(json_to_raw("FP32", &json!(["x"])).is_err());
        assert!(
            json_to_raw("FP16", &json!([1.0]))
                .unwrap_err()
                .contains("binary")
        );
        let deep = (0..40).fold(json!(1.0), |v, _| json!([v]));
        assert!(json_to_raw("FP32", &deep).unwrap_err().contains("deeper"));
        let e = json_to_raw(&"Q".repeat(10_000), &json!([1])).unwrap_err();
        assert!(e.len() < 300, "the name is echoed capped");
    }

    #[test]
    fn binary_sizes_must_add_up() {
        let head = br#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]}"#;
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_LENGTH, HeaderValue::from(head.len()));
        let mut body = head.to_vec();
        body.extend_from_slice(&1.0f32.to_le_bytes());
        let ok = parse_request(
            "m".into(),
            String::new(),
            &headers,
            Bytes::from(body.clone()),
        )
        .ok()
        .unwrap();
        assert_eq!(
            ok.request.raw_input_contents,
            vec![1.0f32.to_le_bytes().to_vec()]
        );
        body.push(0);
        assert!(
            parse_request(
                "m".into(),
                String::new(),
                &headers,
                Bytes::from(body.clone())
            )
            .is_err()
        );
        headers.insert(HEADER_LENGTH, HeaderValue::from(body.len() + 1));
        assert!(
            parse_request(
                "m".into(),
                String::new(),
                &headers,
                Bytes::from(body.clone())
            )
            .is_err()
        );
    }
}
