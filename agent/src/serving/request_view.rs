//! A `ModelInfer` request that arrived in several DATA frames, read where
//! it lies: the message's fields but `raw_input_contents` are gathered and
//! decoded (the head: names, shapes, parameters — well under a kilobyte),
//! and each raw tensor's length is noted while its bytes stay in the frames
//! they came in. The pass-through validates the head and the sizes, then
//! sends the frames on as they came ([`crate::serving::forward`]): a 1 MiB request
//! is no longer copied into one buffer first (issue 27; that copy was a
//! tenth of the agent's CPU per request at 1 MiB).
//!
//! The scan walks the protobuf wire format field by field (keys and lengths
//! may straddle frames); it accepts what `prost` accepts for the message's
//! fields and refuses groups and truncated fields, as decoding would.

use bytes::Bytes;
use infermesh_proto::inference::ModelInferRequest;
use prost::Message;
use tonic::Status;

use crate::serving::grpc::{FRAME_HEADER, frame_header};

/// `raw_input_contents`' field number.
const RAW_INPUT_CONTENTS: u64 = 7;

/// A request read where it lies.
#[derive(Debug)]
pub(crate) struct RequestView {
    /// Every field but `raw_input_contents`.
    pub head: ModelInferRequest,
    /// The length of each `raw_input_contents` entry, in order.
    pub raw_lens: Vec<usize>,
}

/// Reads the gRPC message framed in `chunks` (its 5-byte header first; the
/// caller checked the length it states is what arrived).
pub(crate) fn view(chunks: &[Bytes]) -> Result<RequestView, Status> {
    let mut cursor = Cursor::new(chunks);
    let mut header = [0u8; FRAME_HEADER];
    for b in &mut header {
        *b = cursor.byte().ok_or_else(short)?;
    }
    let (compressed, len) = frame_header(&header);
    if compressed {
        return Err(Status::unimplemented(
            "compressed requests are not supported; send them uncompressed",
        ));
    }
    let end = FRAME_HEADER + len;
    let mut head = Vec::new();
    let mut raw_lens = Vec::new();
    while cursor.pos < end {
        let key = cursor.varint()?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = cursor.varint()?;
                prost::encoding::encode_varint(key, &mut head);
                prost::encoding::encode_varint(v, &mut head);
            }
            1 | 5 => {
                prost::encoding::encode_varint(key, &mut head);
                cursor.copy(if wire == 1 { 8 } else { 4 }, &mut head)?;
            }
            2 => {
                let n = usize::try_from(cursor.varint()?).map_err(|_| malformed())?;
                if field == RAW_INPUT_CONTENTS {
                    cursor.skip(n)?;
                    raw_lens.push(n);
                } else {
                    prost::encoding::encode_varint(key, &mut head);
                    prost::encoding::encode_varint(n as u64, &mut head);
                    cursor.copy(n, &mut head)?;
                }
            }
            _ => return Err(malformed()),
        }
        if cursor.pos > end {
            return Err(malformed());
        }
    }
    let head = ModelInferRequest::decode(&head[..])
        .map_err(|e| Status::invalid_argument(format!("malformed ModelInferRequest: {e}")))?;
    Ok(RequestView { head, raw_lens })
}

/// A request's frames scanned as they arrive, to find the point where
/// it can be forwarded before the rest of it has come (cut-through): the
/// head is complete and what is left of the message is one raw tensor's
/// bytes (encoders write `raw_input_contents`, field 7, last). Fields are
/// read whole: one cut by the end of what has arrived is read again from
/// its key when more has.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Where the next field starts: the chunk, the offset in it, the byte
    /// in the whole body.
    chunk: usize,
    offset: usize,
    pos: usize,
    head: Vec<u8>,
    raw_lens: Vec<usize>,
}

impl Scan {
    /// Scans on through `chunks` (the body so far, its gRPC header of an
    /// uncompressed message of `len` bytes first) while fewer than the
    /// message's bytes have arrived: the cut once found (the head, and the
    /// sizes of every raw tensor, the rest of the message being the last
    /// one's bytes), `None` while not yet. The errors are those of [`view`]
    /// for the same bytes.
    pub(crate) fn step(
        &mut self,
        chunks: &[Bytes],
        len: usize,
    ) -> Result<Option<RequestView>, Status> {
        let end = FRAME_HEADER + len;
        if self.pos == 0 {
            self.pos = FRAME_HEADER;
            self.offset = FRAME_HEADER;
            // The header may straddle chunks.
            let mut c = Cursor::new(chunks);
            c.skip(FRAME_HEADER).map_err(|_| short())?;
            (self.chunk, self.offset) = (c.chunk, c.offset);
        }
        loop {
            if self.pos >= end {
                // The whole message is here: nothing to cut.
                return Ok(None);
            }
            let mut c = Cursor {
                chunks,
                chunk: self.chunk,
                offset: self.offset,
                pos: self.pos,
            };
            let mark = self.head.len();
            match self.field(&mut c, end)? {
                None => {
                    self.head.truncate(mark);
                    return Ok(None);
                }
                Some(Some(last)) => {
                    let mut raw_lens = std::mem::take(&mut self.raw_lens);
                    raw_lens.push(last);
                    let head = ModelInferRequest::decode(&self.head[..]).map_err(|e| {
                        Status::invalid_argument(format!("malformed ModelInferRequest: {e}"))
                    })?;
                    return Ok(Some(RequestView { head, raw_lens }));
                }
                Some(None) => (self.chunk, self.offset, self.pos) = (c.chunk, c.offset, c.pos),
            }
        }
    }

    /// Reads one field at `c`: `None` if it has not all arrived,
    /// `Some(Some(n))` at the length prefix of a last raw tensor of `n`
    /// bytes, `Some(None)` past any other field.
    fn field(&mut self, c: &mut Cursor<'_>, end: usize) -> Result<Option<Option<usize>>, Status> {
        let available = |c: &Cursor<'_>| c.chunks.iter().map(Bytes::len).sum::<usize>() - c.pos;
        let Some(key) = partial_varint(c)? else {
            return Ok(None);
        };
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let Some(v) = partial_varint(c)? else {
                    return Ok(None);
                };
                prost::encoding::encode_varint(key, &mut self.head);
                prost::encoding::encode_varint(v, &mut self.head);
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if available(c) < n {
                    return Ok(None);
                }
                prost::encoding::encode_varint(key, &mut self.head);
                c.copy(n, &mut self.head)?;
            }
            2 => {
                let Some(n) = partial_varint(c)? else {
                    return Ok(None);
                };
                let n = usize::try_from(n).map_err(|_| malformed())?;
                if c.pos.checked_add(n).is_none_or(|e| e > end) {
                    return Err(malformed());
                }
                if field == RAW_INPUT_CONTENTS && c.pos + n == end {
                    return Ok(Some(Some(n)));
                }
                if available(c) < n {
                    return Ok(None);
                }
                if field == RAW_INPUT_CONTENTS {
                    c.skip(n)?;
                    self.raw_lens.push(n);
                } else {
                    prost::encoding::encode_varint(key, &mut self.head);
                    prost::encoding::encode_varint(n as u64, &mut self.head);
                    c.copy(n, &mut self.head)?;
                }
            }
            _ => return Err(malformed()),
        }
        if c.pos > end {
            return Err(malformed());
        }
        Ok(Some(None))
    }
}

/// A varint at `c`; `None` if it is cut by the end of what has arrived.
fn partial_varint(c: &mut Cursor<'_>) -> Result<Option<u64>, Status> {
    let mut v = 0u64;
    for i in 0..10 {
        let Some(b) = c.byte() else {
            return Ok(None);
        };
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(Some(v));
        }
    }
    Err(malformed())
}

fn short() -> Status {
    Status::internal("request body is shorter than a gRPC message header")
}

fn malformed() -> Status {
    Status::invalid_argument(
        "malformed ModelInferRequest: a field is cut short or of an unknown wire type",
    )
}

/// A read position over chunks.
struct Cursor<'a> {
    chunks: &'a [Bytes],
    /// The chunk read, and the offset in it.
    chunk: usize,
    offset: usize,
    /// Bytes read in all.
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(chunks: &'a [Bytes]) -> Self {
        Self {
            chunks,
            chunk: 0,
            offset: 0,
            pos: 0,
        }
    }

    /// The bytes left in the current chunk (moving past finished ones).
    fn current(&mut self) -> Option<&'a [u8]> {
        while let Some(c) = self.chunks.get(self.chunk) {
            if self.offset < c.len() {
                return Some(&c[self.offset..]);
            }
            self.chunk += 1;
            self.offset = 0;
        }
        None
    }

    fn advance(&mut self, n: usize) {
        self.offset += n;
        self.pos += n;
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.current()?.first()?;
        self.advance(1);
        Some(b)
    }

    fn varint(&mut self) -> Result<u64, Status> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte().ok_or_else(malformed)?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(malformed())
    }

    fn copy(&mut self, mut n: usize, out: &mut Vec<u8>) -> Result<(), Status> {
        while n > 0 {
            let c = self.current().ok_or_else(malformed)?;
            let k = n.min(c.len());
            out.extend_from_slice(&c[..k]);
            self.advance(k);
            n -= k;
        }
        Ok(())
    }

    fn skip(&mut self, mut n: usize) -> Result<(), Status> {
        while n > 0 {
            let c = self.current().ok_or_else(malformed)?;
            let k = n.min(c.len());
            self.advance(k);
            n -= k;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use infermesh_proto::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };
    use infermesh_proto::inference::{InferParameter, infer_parameter::ParameterChoice};

    use super::*;

    fn request() -> ModelInferRequest {
        ModelInferRequest {
            model_name: "identity".into(),
            model_version: "3".into(),
            id: "req-1".into(),
            parameters: HashMap::from([(
                "priority".to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::Int64Param(300)),
                },
            )]),
            inputs: vec![
                InferInputTensor {
                    name: "INPUT0".into(),
                    datatype: "FP32".into(),
                    shape: vec![2, 1000],
                    ..Default::default()
                },
                InferInputTensor {
                    name: "INPUT1".into(),
                    datatype: "UINT8".into(),
                    shape: vec![0],
                    ..Default::default()
                },
            ],
            outputs: vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                ..Default::default()
            }],
            raw_input_contents: vec![vec![5u8; 8000].into(), Bytes::new()],
        }
    }

    fn framed(req: &ModelInferRequest) -> Vec<u8> {
        let body = req.encode_to_vec();
        let mut f = vec![0];
        f.extend_from_slice(&(body.len() as u32).to_be_bytes());
        f.extend_from_slice(&body);
        f
    }

    #[test]
    fn the_head_and_the_sizes_come_out_wherever_the_frames_split() {
        let req = request();
        let whole = framed(&req);
        let want = ModelInferRequest {
            raw_input_contents: Vec::new(),
            ..req.clone()
        };
        for size in [1, 2, 3, 7, 100, 4096, whole.len()] {
            let chunks: Vec<Bytes> = whole.chunks(size).map(Bytes::copy_from_slice).collect();
            let v = view(&chunks).unwrap();
            assert_eq!(v.head, want, "split every {size}");
            assert_eq!(v.raw_lens, vec![8000, 0], "split every {size}");
        }
    }

    /// Scans `chunks` as they arrive one by one: the cut, and how many
    /// had arrived when it was found.
    fn scan(chunks: &[Bytes], len: usize) -> Result<Option<(RequestView, usize)>, Status> {
        let mut scan = Scan::default();
        let mut received = 0;
        for n in 1..=chunks.len() {
            received += chunks[n - 1].len();
            if received < FRAME_HEADER || received >= FRAME_HEADER + len {
                continue;
            }
            if let Some(v) = scan.step(&chunks[..n], len)? {
                return Ok(Some((v, n)));
            }
        }
        Ok(None)
    }

    #[test]
    fn the_cut_is_found_at_the_last_tensors_prefix_wherever_the_frames_split() {
        let mut req = request();
        // The last tensor is the large one.
        req.raw_input_contents.swap(0, 1);
        req.inputs.swap(0, 1);
        let whole = framed(&req);
        let len = whole.len() - FRAME_HEADER;
        let want = ModelInferRequest {
            raw_input_contents: Vec::new(),
            ..req.clone()
        };
        // Where the last tensor's bytes begin.
        let cut_at = whole.len() - 8000;
        for size in [1, 2, 3, 7, 100, 4096] {
            let chunks: Vec<Bytes> = whole.chunks(size).map(Bytes::copy_from_slice).collect();
            let (v, n) = scan(&chunks, len).unwrap().expect("a cut");
            assert_eq!(v.head, want, "split every {size}");
            assert_eq!(v.raw_lens, vec![0, 8000], "split every {size}");
            let arrived: usize = chunks[..n].iter().map(Bytes::len).sum();
            assert!(
                arrived >= cut_at && arrived < cut_at + size,
                "split every {size}: {arrived}"
            );
        }
    }

    #[test]
    fn no_cut_when_a_field_follows_the_tensors() {
        let req = request();
        let mut whole = framed(&req);
        // `id` again, after the tensors (prost keeps the last).
        whole.extend_from_slice(&[(3 << 3) | 2, 1, b'x']);
        let len = whole.len() - FRAME_HEADER;
        whole[1..5].copy_from_slice(&(len as u32).to_be_bytes());
        let chunks: Vec<Bytes> = whole.chunks(100).map(Bytes::copy_from_slice).collect();
        assert!(scan(&chunks, len).unwrap().is_none());
        assert_eq!(view(&chunks).unwrap().head.id, "x");
    }

    #[test]
    fn a_tensor_longer_than_the_message_is_refused_by_the_scan() {
        let mut whole = vec![0, 0, 0, 0, 0];
        whole.push((7 << 3) | 2);
        prost::encoding::encode_varint(1000, &mut whole);
        whole.extend_from_slice(&[0; 100]);
        let len = whole.len() - FRAME_HEADER;
        whole[1..5].copy_from_slice(&(len as u32).to_be_bytes());
        let err = Scan::default().step(&[whole.into()], len).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn cut_compressed_or_garbled_messages_are_refused() {
        let whole = framed(&request());
        let cut = Bytes::copy_from_slice(&whole[..whole.len() - 10]);
        // The header says more than there is.
        assert!(view(&[cut]).is_err());
        assert!(view(&[Bytes::from_static(&[0, 0, 0])]).is_err());
        let mut compressed = whole.clone();
        compressed[0] = 1;
        let err = view(&[compressed.into()]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        // A group (wire type 3) and an endless varint.
        let mut group = vec![0, 0, 0, 0, 1];
        group.push((1 << 3) | 3);
        assert!(view(&[group.into()]).is_err());
        let mut endless = vec![0, 0, 0, 0, 11, 8];
        endless.extend([0xff; 10]);
        assert!(view(&[endless.into()]).is_err());
    }
}
