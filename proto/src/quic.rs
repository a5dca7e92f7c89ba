//! The QUIC rung's wire format (issue 13): one bidirectional QUIC stream per
//! `ModelInfer`, TLS 1.3 with the agent's certificate, ALPN [`ALPN`].
//!
//! Request (client → agent, then the client finishes its side):
//! `version: u8 = 1 | timeout_ms: u32 | len: u32 | ModelInferRequest (protobuf, len bytes)`.
//!
//! Response (agent → client, then the agent finishes):
//! `kind: u8` — `0`: `len: u32 | ModelInferResponse`; `1`: `code: u32 | len: u32 | message (UTF-8)` —
//! then the load report: `count: u8 | count × (name_len: u8 | name | value_len: u16 | value)`,
//! the same `infermesh-*` / ORCA entries as the gRPC trailers. Integers are big-endian.
//!
//! Every length is checked against a bound before anything is allocated.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::inference::{ModelInferRequest, ModelInferResponse};

/// ALPN of the QUIC rung.
pub const ALPN: &[u8] = b"infermesh-oip/1";
/// Wire version of the request header.
pub const VERSION: u8 = 1;
/// Most load-report entries in a response.
pub const MAX_REPORT_ENTRIES: usize = 16;
/// Longest load-report value.
pub const MAX_REPORT_VALUE: usize = 1024;
/// Longest error message.
pub const MAX_MESSAGE: usize = 4096;

/// A malformed frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("QUIC frame: {0}")]
pub struct FrameError(pub String);

fn err<T>(why: impl Into<String>) -> Result<T, FrameError> {
    Err(FrameError(why.into()))
}

/// Encodes a request frame.
pub fn encode_request(req: &ModelInferRequest, timeout_ms: u32) -> Bytes {
    let len = req.encoded_len();
    let mut out = BytesMut::with_capacity(9 + len);
    out.put_u8(VERSION);
    out.put_u32(timeout_ms);
    out.put_u32(len as u32);
    req.encode(&mut out).expect("capacity reserved");
    out.freeze()
}

/// Encodes a request frame as chunks, without copying the tensors: the
/// header and the message's other fields in one buffer, then each
/// `raw_input_contents` entry's key and length, and its bytes as they are.
/// The bytes are those of [`encode_request`] (prost writes fields in field
/// order, and `raw_input_contents`, field 7, is the last), so a QUIC
/// stream can send a 16 MiB tensor from the caller's own buffer.
pub fn encode_request_chunks(req: &ModelInferRequest, timeout_ms: u32) -> Vec<Bytes> {
    let raw = &req.raw_input_contents;
    let mut head_req = req.clone();
    head_req.raw_input_contents.clear();
    let head_len = head_req.encoded_len();
    let raw_len: usize = raw
        .iter()
        .map(|b| 1 + prost::encoding::encoded_len_varint(b.len() as u64) + b.len())
        .sum();
    let mut head = BytesMut::with_capacity(REQUEST_HEADER + head_len + 11);
    head.put_u8(VERSION);
    head.put_u32(timeout_ms);
    head.put_u32((head_len + raw_len) as u32);
    head_req.encode(&mut head).expect("capacity reserved");
    let mut chunks = Vec::with_capacity(1 + 2 * raw.len());
    for b in raw {
        // Field 7, wire type 2 (length-delimited).
        head.put_u8(RAW_INPUT_KEY);
        prost::encoding::encode_varint(b.len() as u64, &mut head);
        chunks.push(head.split().freeze());
        if !b.is_empty() {
            chunks.push(b.clone());
        }
    }
    if !head.is_empty() {
        chunks.push(head.freeze());
    }
    chunks
}

/// The key of a `raw_input_contents` entry: field 7, length-delimited.
const RAW_INPUT_KEY: u8 = (7 << 3) | 2;

/// Bytes of a request frame's header.
pub const REQUEST_HEADER: usize = 9;

/// A request frame's header: `(timeout_ms, len)` of the protobuf that
/// follows. Its last five bytes are laid out as a gRPC message frame's
/// header but for the first (the timeout's low byte, where gRPC has the
/// compressed flag).
pub fn request_header(head: &[u8; REQUEST_HEADER]) -> Result<(u32, usize), FrameError> {
    if head[0] != VERSION {
        return err("unknown version");
    }
    let timeout_ms = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
    Ok((timeout_ms, len))
}

/// Decodes a request frame of at most `max_bytes` of protobuf.
pub fn decode_request(
    mut buf: Bytes,
    max_bytes: usize,
) -> Result<(ModelInferRequest, u32), FrameError> {
    let Some(head) = buf.get(..REQUEST_HEADER) else {
        return err("request shorter than its header");
    };
    let (timeout_ms, len) = request_header(head.try_into().expect("sliced to size"))?;
    buf.advance(REQUEST_HEADER);
    if len > max_bytes {
        return err(format!("request of {len} bytes is over {max_bytes}"));
    }
    if buf.remaining() != len {
        return err("request length does not match its header");
    }
    let req = ModelInferRequest::decode(buf).map_err(|e| FrameError(e.to_string()))?;
    Ok((req, timeout_ms))
}

/// What the agent answered.
#[derive(Debug)]
pub enum Answer {
    /// The response.
    Ok(ModelInferResponse),
    /// A gRPC status (code, message).
    Status(i32, String),
}

/// Encodes a response frame with its load report (`(name, value)` pairs;
/// entries beyond the bounds are left out).
pub fn encode_response(answer: &Answer, report: &[(&str, &[u8])]) -> Bytes {
    let mut out = BytesMut::new();
    match answer {
        Answer::Ok(resp) => {
            let len = resp.encoded_len();
            out.reserve(5 + len);
            out.put_u8(0);
            out.put_u32(len as u32);
            resp.encode(&mut out).expect("capacity reserved");
        }
        Answer::Status(code, message) => {
            let message = &message.as_bytes()[..message.len().min(MAX_MESSAGE)];
            out.put_u8(1);
            out.put_u32(*code as u32);
            out.put_u32(message.len() as u32);
            out.put_slice(message);
        }
    }
    put_report(&mut out, report);
    out.freeze()
}

/// The load-report part of a response frame alone: what follows an
/// answer's `0 | len | ModelInferResponse`, which is laid out as a gRPC
/// message frame, so an agent can send a worker's gRPC response bytes as
/// they came and this after them.
pub fn encode_report(report: &[(&str, &[u8])]) -> Bytes {
    let mut out = BytesMut::new();
    put_report(&mut out, report);
    out.freeze()
}

fn put_report(out: &mut BytesMut, report: &[(&str, &[u8])]) {
    let report: Vec<_> = report
        .iter()
        .filter(|(n, v)| n.len() <= u8::MAX as usize && v.len() <= MAX_REPORT_VALUE)
        .take(MAX_REPORT_ENTRIES)
        .collect();
    out.put_u8(report.len() as u8);
    for (name, value) in report {
        out.put_u8(name.len() as u8);
        out.put_slice(name.as_bytes());
        out.put_u16(value.len() as u16);
        out.put_slice(value);
    }
}

/// A decoded response frame: the answer and the load report.
pub type Decoded = (Answer, Vec<(String, Bytes)>);

/// Decodes a response frame of at most `max_bytes` of protobuf.
pub fn decode_response(mut buf: Bytes, max_bytes: usize) -> Result<Decoded, FrameError> {
    let need = |buf: &Bytes, n: usize| {
        if buf.remaining() < n {
            err("response cut short")
        } else {
            Ok(())
        }
    };
    need(&buf, 1)?;
    let answer = match buf.get_u8() {
        0 => {
            need(&buf, 4)?;
            let len = buf.get_u32() as usize;
            if len > max_bytes {
                return err(format!("response of {len} bytes is over {max_bytes}"));
            }
            need(&buf, len)?;
            let body = buf.split_to(len);
            Answer::Ok(ModelInferResponse::decode(body).map_err(|e| FrameError(e.to_string()))?)
        }
        1 => {
            need(&buf, 8)?;
            let code = buf.get_u32() as i32;
            let len = buf.get_u32() as usize;
            if len > MAX_MESSAGE {
                return err("error message too long");
            }
            need(&buf, len)?;
            let message = String::from_utf8_lossy(&buf.split_to(len)).into_owned();
            Answer::Status(code, message)
        }
        _ => return err("unknown response kind"),
    };
    need(&buf, 1)?;
    let count = buf.get_u8() as usize;
    if count > MAX_REPORT_ENTRIES {
        return err("too many load-report entries");
    }
    let mut report = Vec::with_capacity(count);
    for _ in 0..count {
        need(&buf, 1)?;
        let n = buf.get_u8() as usize;
        need(&buf, n)?;
        let name = String::from_utf8(buf.split_to(n).to_vec())
            .map_err(|_| FrameError("load-report name is not UTF-8".into()))?;
        need(&buf, 2)?;
        let v = buf.get_u16() as usize;
        if v > MAX_REPORT_VALUE {
            return err("load-report value too long");
        }
        need(&buf, v)?;
        report.push((name, buf.split_to(v)));
    }
    if buf.has_remaining() {
        return err("bytes after the load report");
    }
    Ok((answer, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_in_chunks_is_the_request_frame() {
        use crate::inference::model_infer_request::InferInputTensor;
        let mut req = ModelInferRequest {
            model_name: "identity".into(),
            id: "r1".into(),
            inputs: vec![
                InferInputTensor {
                    name: "A".into(),
                    datatype: "FP32".into(),
                    shape: vec![2, 200],
                    ..Default::default()
                };
                3
            ],
            raw_input_contents: vec![
                vec![1u8; 1600].into(),
                Bytes::new(),
                vec![2u8; 200_000].into(),
            ],
            ..Default::default()
        };
        for _ in 0..2 {
            let chunks = encode_request_chunks(&req, 77);
            let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(joined, encode_request(&req, 77).to_vec());
            if let Some(raw) = req.raw_input_contents.get(2) {
                let tensor = chunks
                    .iter()
                    .find(|c| c.len() == 200_000)
                    .expect("sent as is");
                assert_eq!(tensor.as_ptr(), raw.as_ptr(), "not copied");
            }
            req.raw_input_contents.clear();
        }
    }

    #[test]
    fn frames_round_trip_and_are_bounded() {
        let req = ModelInferRequest {
            model_name: "dense".into(),
            raw_input_contents: vec![vec![7u8; 1000].into()],
            ..Default::default()
        };
        let frame = encode_request(&req, 1500);
        let (back, t) = decode_request(frame.clone(), 4096).unwrap();
        assert_eq!((back, t), (req, 1500));
        assert!(
            decode_request(frame.clone(), 100).is_err(),
            "over the bound"
        );
        assert!(decode_request(frame.slice(..frame.len() - 1), 4096).is_err());

        let resp = ModelInferResponse {
            model_name: "dense".into(),
            ..Default::default()
        };
        let frame = encode_response(
            &Answer::Ok(resp.clone()),
            &[("infermesh-inflight", b"3"), ("x", &[0u8; 2000])],
        );
        let (answer, report) = decode_response(frame.clone(), 4096).unwrap();
        assert!(matches!(answer, Answer::Ok(r) if r == resp));
        assert_eq!(
            report,
            vec![("infermesh-inflight".to_string(), Bytes::from_static(b"3"))]
        );
        for cut in 0..frame.len() {
            assert!(decode_response(frame.slice(..cut), 4096).is_err());
        }
        let frame = encode_response(&Answer::Status(14, "busy".into()), &[]);
        let (answer, _) = decode_response(frame, 4096).unwrap();
        assert!(matches!(answer, Answer::Status(14, m) if m == "busy"));
    }

    /// An answer is a gRPC message frame (flag 0, length, message) followed
    /// by the report; the request header's last five bytes can be read as
    /// one. The agent relies on both to pass messages through.
    #[test]
    fn answers_and_requests_hold_grpc_message_frames() {
        let resp = ModelInferResponse {
            model_name: "dense".into(),
            ..Default::default()
        };
        let message = resp.encode_to_vec();
        let mut grpc = vec![0u8];
        grpc.extend_from_slice(&(message.len() as u32).to_be_bytes());
        grpc.extend_from_slice(&message);
        let report: &[(&str, &[u8])] = &[("infermesh-queued", b"0")];
        let mut joined = grpc.clone();
        joined.extend_from_slice(&encode_report(report));
        assert_eq!(encode_response(&Answer::Ok(resp), report), joined);

        let req = ModelInferRequest {
            model_name: "dense".into(),
            ..Default::default()
        };
        let frame = encode_request(&req, 9);
        let mut expected = vec![0u8];
        expected.extend_from_slice(&(req.encoded_len() as u32).to_be_bytes());
        expected.extend_from_slice(&req.encode_to_vec());
        assert_eq!(&frame[5..9], &expected[1..5]);
        assert_eq!(&frame[9..], &expected[5..]);
    }
}
