//! The little of gRPC-over-HTTP/2 the pass-through path speaks itself:
//! message framing, and responses built from a message or a status.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response};
use tonic::Status;

use crate::dispatch::pool::Pool;
use crate::serving::front_body::FrontBody;
use crate::serving::load_report::add_report;

pub use infermesh_proto::MODEL_INFER_PATH;
/// Bytes before each message: compressed flag and big-endian length.
pub const FRAME_HEADER: usize = 5;

const CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");

/// The compressed flag and length of a message frame, from its header.
pub fn frame_header(b: &[u8; FRAME_HEADER]) -> (bool, usize) {
    (
        b[0] != 0,
        u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize,
    )
}

/// A trailers-only response carrying `status` and the node's load report.
pub fn status_response(status: Status, pool: &Pool) -> Response<FrontBody> {
    let mut resp = status.into_http::<FrontBody>();
    add_report(pool, resp.headers_mut());
    resp
}

/// A response carrying one message (already encoded) and an OK status,
/// with the load report in the trailers.
pub fn message_response(message: &impl prost::Message, pool: &Pool) -> Response<FrontBody> {
    let len = message.encoded_len();
    let mut frame = BytesMut::with_capacity(FRAME_HEADER + len);
    frame.put_u8(0);
    frame.put_u32(len as u32);
    message
        .encode(&mut frame)
        .expect("the buffer has the message's encoded length");
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    add_report(pool, &mut trailers);
    let mut resp = Response::new(FrontBody::Message {
        data: Some(frame.freeze()),
        trailers: Some(trailers),
    });
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, CONTENT_TYPE);
    resp
}

/// Splits one complete, uncompressed message out of a unary request body.
pub fn unary_message(body: &Bytes) -> Result<Bytes, Status> {
    let header: &[u8; FRAME_HEADER] = body
        .get(..FRAME_HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| Status::internal("request body is shorter than a gRPC message header"))?;
    let (compressed, len) = frame_header(header);
    if compressed {
        return Err(Status::unimplemented(
            "compressed requests are not supported; send them uncompressed",
        ));
    }
    if body.len() != FRAME_HEADER + len {
        return Err(Status::internal(
            "a unary request must carry exactly one gRPC message",
        ));
    }
    Ok(body.slice(FRAME_HEADER..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_is_split_out_and_anything_else_is_refused() {
        let mut b = vec![0, 0, 0, 0, 3, 1, 2, 3];
        assert_eq!(
            unary_message(&Bytes::from(b.clone())).unwrap(),
            Bytes::from_static(&[1, 2, 3])
        );
        b.push(9);
        assert!(unary_message(&Bytes::from(b)).is_err());
        assert!(unary_message(&Bytes::from_static(&[0, 0])).is_err());
        let compressed = Bytes::from_static(&[1, 0, 0, 0, 0]);
        assert_eq!(
            unary_message(&compressed).unwrap_err().code(),
            tonic::Code::Unimplemented
        );
    }
}
