//! The client's side of a server run: the frames it sends, drawn from the
//! input — anything at all (`chaos`), or what a well-behaved client sends
//! given what the server has written so far (`polite`) — each staged with
//! the [`Mark`] that the model applies once the server has processed it.

use super::super::hpack_block::BlockBuilder;
use super::super::input::Input;
use super::super::wire::{self, Grant};
use super::{Handler, PATH, Run};

/// What the model learns when the server has processed a staged frame.
#[derive(Debug, Clone)]
pub enum Mark {
    Nothing,
    Grants(Vec<Grant>),
    /// A whole header block on `id` (a new stream when above the last).
    Headers {
        id: u32,
        end_stream: bool,
    },
    /// DATA on `id`: its bytes less padding.
    Data {
        id: u32,
        len: u64,
        end_stream: bool,
    },
    Reset {
        id: u32,
    },
}

/// The fields of a request, good or not.
fn request_fields(input: &mut Input, polite: bool) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut f: Vec<(&[u8], Vec<u8>)> = vec![
        (b":method", b"POST".to_vec()),
        (b":scheme", b"http".to_vec()),
        (b":path", PATH.as_bytes().to_vec()),
        (b":authority", b"agent".to_vec()),
        (b"content-type", b"application/grpc".to_vec()),
        (b"te", b"trailers".to_vec()),
    ];
    if !polite {
        match input.below(16) {
            0 => {
                f.remove(input.below(4));
            }
            1 => f.push((b":path", b"/x".to_vec())),
            2 => f.push((b"Upper-Case", b"1".to_vec())),
            3 => f.push((b"connection", b"close".to_vec())),
            4 => f.push((b"content-length", input.below(40).to_string().into_bytes())),
            5 => f.push((b"content-length", b"-1".to_vec())),
            6 => f.push((b"x-big", vec![b'x'; input.below(40_000)])),
            7 => f[2].1 = b"http://absolute/uri".to_vec(),
            8 => f.push((b"te", b"gzip".to_vec())),
            9 => f.insert(0, (b"x-first", b"1".to_vec())),
            _ => {}
        }
    }
    if input.below(4) == 0 {
        f.push((
            b"x-extra",
            input.bytes(20).iter().map(|b| b'a' + b % 26).collect(),
        ));
    }
    f.into_iter().map(|(n, v)| (n.to_vec(), v)).collect()
}

impl Run {
    /// Stages `payload` as one frame; `mark` applies once processed.
    pub(super) fn stage(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8], mark: Mark) {
        if std::env::var_os("HARNESS_TRACE").is_some() {
            eprintln!(
                "  stage kind {kind} flags {flags:#x} stream {stream} len {} {mark:?}",
                payload.len()
            );
        }
        // A header block left open is completed by a CONTINUATION with
        // END_HEADERS on its stream, and broken by any other frame.
        let mut mark = mark;
        match (kind, self.open_block) {
            (wire::HEADERS, _) if flags & wire::END_HEADERS == 0 => {
                self.open_block = Some((stream, flags & wire::END_STREAM != 0));
            }
            (wire::CONTINUATION, Some((id, end_stream))) if id == stream => {
                if flags & wire::END_HEADERS != 0 {
                    mark = Mark::Headers { id, end_stream };
                    self.open_block = None;
                }
            }
            _ => self.open_block = None,
        }
        wire::put(&mut self.staged, kind, flags, stream, payload);
        self.staged_total += 9 + payload.len() as u64;
        self.marks.push_back((self.staged_total, mark));
    }

    /// Stages raw bytes (no frame the model can follow).
    pub(super) fn stage_raw(&mut self, bytes: &[u8]) {
        self.open_block = None;
        if self.staged_total > 0 {
            // Past the preface, raw bytes may hold frames (or shift the
            // frames after them): the model no longer knows which streams
            // the client opened.
            self.lost = true;
            self.out.peer_max_id = wire::MAX_WINDOW as u32;
        }
        self.staged.extend_from_slice(bytes);
        self.staged_total += bytes.len() as u64;
        self.marks.push_back((self.staged_total, Mark::Nothing));
    }

    /// A stream id: a new one, one opened already, or any.
    fn stream_id(&mut self, input: &mut Input) -> u32 {
        match input.below(8) {
            0..=3 => self.next_id,
            4 | 5 if !self.streams.is_empty() => {
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                ids[input.below(ids.len())]
            }
            6 => u32::from(input.u8() % 16),
            _ => input.u32() & 0x7fff_ffff,
        }
    }

    /// Stages a header block on `id` as HEADERS and CONTINUATIONs.
    fn stage_block(
        &mut self,
        input: &mut Input,
        id: u32,
        block: &[u8],
        end_stream: bool,
        polite: bool,
    ) {
        let pieces = match input.below(8) {
            0..=4 => 1,
            5 | 6 => 2 + input.below(3),
            // Many, mostly empty: the CONTINUATION limit.
            _ if !polite => 10 + input.below(40),
            _ => 2,
        };
        let cut = (block.len() / pieces).max(1);
        let mut parts: Vec<&[u8]> = block.chunks(cut).collect();
        while parts.len() < pieces {
            parts.push(&[]);
        }
        if parts.is_empty() {
            parts.push(&[]);
        }
        let mut flags = if end_stream { wire::END_STREAM } else { 0 };
        let mut first = Vec::new();
        if input.below(6) == 0 {
            let pad = input.u8();
            flags |= wire::PADDED;
            first.push(pad);
        }
        if input.below(6) == 0 {
            flags |= wire::PRIORITY_FLAG;
            let dep = if !polite && input.below(3) == 0 {
                id
            } else {
                id.saturating_sub(2)
            };
            first.extend_from_slice(&dep.to_be_bytes());
            first.push(input.u8());
        }
        first.extend_from_slice(parts[0]);
        if flags & wire::PADDED != 0 {
            let pad = usize::from(first[0]);
            let pad = if polite || input.below(4) != 0 {
                pad.min(40)
            } else {
                pad
            };
            first[0] = pad as u8;
            first.extend(std::iter::repeat_n(0, pad.min(255)));
            if !polite && input.below(8) == 0 {
                // Padding longer than the frame.
                first.truncate(1 + first.len() / 4);
            }
        }
        // The last frame may leave the block open (chaos only).
        let open_end = !polite && input.below(12) == 0;
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let last = i + 1 == n;
            let end_headers = if last && !open_end {
                wire::END_HEADERS
            } else {
                0
            };
            let mark = if last && !open_end {
                Mark::Headers { id, end_stream }
            } else {
                Mark::Nothing
            };
            if i == 0 {
                let payload = std::mem::take(&mut first);
                self.stage(wire::HEADERS, flags | end_headers, id, &payload, mark);
            } else {
                self.stage(wire::CONTINUATION, end_headers, id, part, mark);
            }
        }
    }

    /// A request's header block, by the client's encoder.
    fn request_block(&mut self, input: &mut Input, polite: bool) -> Vec<u8> {
        let fields = request_fields(input, polite);
        self.encoder
            .encode(fields.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    /// One frame (or a few bytes) of a client that follows no rule.
    pub(super) fn chaos_frame(&mut self, input: &mut Input) {
        match input.weighted(&[14, 12, 2, 5, 6, 4, 3, 3, 1, 2, 1, 1, 3]) {
            0 => {
                let id = self.stream_id(input);
                let block = match input.below(8) {
                    0..=4 => self.request_block(input, false),
                    5 => BlockBuilder::default().block(input).0,
                    6 => input.bytes(40),
                    // Trailers.
                    _ => self.encoder.encode([(&b"x-trailer"[..], &b"1"[..])]),
                };
                if id >= self.next_id {
                    self.next_id = (id | 1) + 2;
                }
                let end_stream = input.bool();
                self.stage_block(input, id, &block, end_stream, false);
            }
            1 => {
                let id = self.stream_id(input);
                let len = match input.below(8) {
                    0 => 0,
                    1 => 16_385 + input.below(100),
                    _ => input.below(3000),
                };
                let end_stream = input.below(3) == 0;
                let mut flags = if end_stream { wire::END_STREAM } else { 0 };
                let mut payload = Vec::new();
                // The pad length and the padding agree, or (now and then)
                // the padding is short: bad padding, a connection error.
                let mut pad = 0;
                if input.below(5) == 0 {
                    flags |= wire::PADDED;
                    pad = input.below(256);
                    payload.push(pad as u8);
                }
                // Bodies continue where the stream's last DATA ended, so
                // that what a handler reads can be checked byte by byte.
                let s = self.streams.entry(id).or_default();
                let offset = s.body_sent;
                s.body_sent += len as u64;
                payload.extend((offset..offset + len as u64).map(|k| body_byte(id, k)));
                let zeros = if input.below(8) == 0 {
                    input.below(pad + 1)
                } else {
                    pad
                };
                payload.extend(std::iter::repeat_n(0, zeros));
                let data = len as u64;
                self.stage(
                    wire::DATA,
                    flags,
                    id,
                    &payload,
                    Mark::Data {
                        id,
                        len: data,
                        end_stream,
                    },
                );
            }
            2 => {
                let id = self.stream_id(input);
                let payload = input.bytes(30);
                let flags = input.u8() & wire::END_HEADERS;
                self.stage(wire::CONTINUATION, flags, id, &payload, Mark::Nothing);
            }
            3 => {
                let id = self.stream_id(input);
                let code = u32::from(input.u8() % 16);
                let mut payload = code.to_be_bytes().to_vec();
                let mut mark = Mark::Reset { id };
                if input.below(10) == 0 {
                    payload.pop();
                    mark = Mark::Nothing;
                }
                self.stage(wire::RST_STREAM, 0, id, &payload, mark);
            }
            4 => {
                let id = if input.bool() {
                    0
                } else {
                    self.stream_id(input)
                };
                let inc = match input.below(6) {
                    0 => 0,
                    1 => 0x7fff_ffff,
                    2 => input.u32(),
                    _ => u32::from(input.u16()) + 1,
                };
                let mut payload = inc.to_be_bytes().to_vec();
                if input.below(12) == 0 {
                    payload.push(0);
                }
                let grants = wire::window_grants(id, &payload);
                self.stage(wire::WINDOW_UPDATE, 0, id, &payload, Mark::Grants(grants));
            }
            5 => self.chaos_settings(input),
            6 => {
                let ack = input.below(4) == 0;
                let mut payload = input.u32().to_be_bytes().repeat(2);
                if input.below(12) == 0 {
                    payload.pop();
                }
                let stream = if input.below(12) == 0 { 1 } else { 0 };
                self.stage(
                    wire::PING,
                    if ack { wire::ACK } else { 0 },
                    stream,
                    &payload,
                    Mark::Nothing,
                );
            }
            7 => {
                let id = self.stream_id(input);
                let dep = if input.below(3) == 0 { id } else { input.u32() };
                let mut payload = dep.to_be_bytes().to_vec();
                payload.push(input.u8());
                if input.below(4) == 0 {
                    payload.truncate(input.below(5));
                }
                self.stage(wire::PRIORITY, 0, id, &payload, Mark::Nothing);
            }
            8 => {
                let mut payload = input.u32().to_be_bytes().to_vec();
                payload.extend_from_slice(&u32::from(input.u8() % 14).to_be_bytes());
                payload.extend(input.bytes(8));
                let stream = if input.below(12) == 0 { 1 } else { 0 };
                self.stage(wire::GOAWAY, 0, stream, &payload, Mark::Nothing);
            }
            9 => {
                let kind = 10 + input.u8() % 246;
                let id = self.stream_id(input);
                let payload = input.bytes(20);
                self.stage(kind, input.u8(), id, &payload, Mark::Nothing);
            }
            10 => {
                let id = self.stream_id(input);
                self.stage(
                    wire::PUSH_PROMISE,
                    wire::END_HEADERS,
                    id,
                    &[0, 0, 0, 2],
                    Mark::Nothing,
                );
            }
            11 => {
                let raw = input.bytes(30);
                self.stage_raw(&raw);
            }
            _ => {
                // A frame header that announces more than follows, or a
                // frame over the maximum size.
                let len = if input.bool() {
                    16_385 + input.below(1 << 20)
                } else {
                    input.below(100)
                };
                let mut raw = Vec::new();
                wire::put_head(&mut raw, len, input.u8() % 12, input.u8(), input.u32());
                self.stage_raw(&raw);
            }
        }
    }

    fn chaos_settings(&mut self, input: &mut Input) {
        let mut values = Vec::new();
        for _ in 0..input.below(5) {
            let id = input.below(9) as u16;
            let v = match (id, input.below(4)) {
                (wire::INITIAL_WINDOW_SIZE, 0) => 0,
                (wire::INITIAL_WINDOW_SIZE, 1) => 0x7fff_ffff + input.below(2) as u32,
                (wire::INITIAL_WINDOW_SIZE, _) => input.below(1 << 20) as u32,
                (wire::MAX_FRAME_SIZE, 0) => 16_383,
                (wire::MAX_FRAME_SIZE, 1) => (1 << 24) - 1 + input.below(2) as u32,
                (wire::MAX_FRAME_SIZE, _) => 16_384 + input.below(1 << 16) as u32,
                (wire::HEADER_TABLE_SIZE, _) => input.below(8192) as u32,
                (wire::ENABLE_PUSH, _) => input.below(3) as u32,
                _ => input.u32(),
            };
            values.push((id, v));
        }
        let mut payload = wire::settings_payload(&values);
        let ack = input.below(8) == 0;
        if ack && input.bool() {
            payload.clear();
        }
        if input.below(16) == 0 {
            payload.pop();
        }
        let stream = if input.below(16) == 0 { 1 } else { 0 };
        let grants = if ack || stream != 0 {
            None
        } else {
            wire::settings_grants(&payload)
        };
        let flags = if ack { wire::ACK } else { 0 };
        self.stage(
            wire::SETTINGS,
            flags,
            stream,
            &payload,
            Mark::Grants(grants.unwrap_or_default()),
        );
    }

    /// Streams that are open from a well-behaved client's view.
    fn client_open(&self) -> Vec<u32> {
        self.streams
            .iter()
            .filter(|(id, s)| {
                let closed = s.client_ended && self.out.is_done(**id);
                !(s.client_reset || self.out.is_reset(**id) || closed)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// One frame a well-behaved client may send now.
    pub(super) fn polite_frame(&mut self, input: &mut Input) {
        let open = self.client_open();
        let pick = |input: &mut Input, ids: &[u32]| ids.get(input.below(ids.len())).copied();
        match input.weighted(&[10, 12, 3, 3, 5, 3, 2, 2, 1]) {
            0 => {
                let going = self
                    .goaway_seen
                    .is_some_and(|last| last < wire::MAX_WINDOW as u32);
                if open.len() >= self.server_max_streams as usize || going {
                    return;
                }
                let id = self.next_id;
                self.next_id += 2;
                let block = self.request_block(input, true);
                let end_stream = input.below(4) == 0;
                self.stage_block(input, id, &block, end_stream, true);
                let s = self.streams.entry(id).or_default();
                s.handler = Handler::Unopened;
                s.client_ended = end_stream;
            }
            1 => {
                let ids: Vec<u32> = open
                    .iter()
                    .copied()
                    .filter(|id| !self.streams[id].client_ended)
                    .collect();
                let Some(id) = pick(input, &ids) else { return };
                let (sw, cw) = self.client_view_windows(id);
                let room = sw.min(cw).min(wire::DEFAULT_MAX_FRAME as i64).max(0) as usize;
                let padded = input.below(5) == 0 && room > 0;
                let pad = if padded {
                    input.below(room.min(256))
                } else {
                    0
                };
                let len = input.below(room.saturating_sub(pad + usize::from(padded)) + 1);
                let end_stream = input.below(4) == 0;
                if len == 0 && !end_stream && input.below(4) != 0 {
                    return;
                }
                let s = self.streams.get_mut(&id).unwrap();
                let mut payload = Vec::new();
                if padded {
                    payload.push(pad as u8);
                }
                payload.extend((0..len as u64).map(|k| body_byte(id, s.body_sent + k)));
                payload.extend(std::iter::repeat_n(0, pad));
                s.body_sent += len as u64;
                s.client_ended = end_stream;
                self.client_sent_flow.insert(
                    id,
                    self.client_sent_flow.get(&id).unwrap_or(&0) + payload.len() as i64,
                );
                self.client_sent_conn += payload.len() as i64;
                let flags = if end_stream { wire::END_STREAM } else { 0 }
                    | if padded { wire::PADDED } else { 0 };
                self.stage(
                    wire::DATA,
                    flags,
                    id,
                    &payload,
                    Mark::Data {
                        id,
                        len: len as u64,
                        end_stream,
                    },
                );
            }
            2 => {
                let ids: Vec<u32> = open
                    .iter()
                    .copied()
                    .filter(|id| !self.streams[id].client_ended)
                    .collect();
                let Some(id) = pick(input, &ids) else { return };
                let block = self.encoder.encode([(&b"x-trailer"[..], &b"t"[..])]);
                self.stage_block(input, id, &block, true, true);
                self.streams.get_mut(&id).unwrap().client_ended = true;
            }
            3 => {
                let Some(id) = pick(input, &open) else { return };
                let code = [wire::CANCEL, wire::NO_ERROR, 2][input.below(3)];
                self.streams.get_mut(&id).unwrap().client_reset = true;
                self.stage(
                    wire::RST_STREAM,
                    0,
                    id,
                    &code.to_be_bytes(),
                    Mark::Reset { id },
                );
            }
            4 => {
                let id = if input.bool() {
                    0
                } else {
                    pick(input, &open).unwrap_or(0)
                };
                let granted = self.granted.entry(id).or_insert(0);
                let inc = 1 + input.below(1 << 20) as i64;
                if *granted + inc > 1 << 30 {
                    return;
                }
                *granted += inc;
                let payload = (inc as u32).to_be_bytes();
                let grants = wire::window_grants(id, &payload);
                self.stage(wire::WINDOW_UPDATE, 0, id, &payload, Mark::Grants(grants));
            }
            5 => {
                let mut values = Vec::new();
                for _ in 0..input.below(4) {
                    values.push(match input.below(6) {
                        0 => (wire::INITIAL_WINDOW_SIZE, input.below(1 << 20) as u32),
                        1 => (wire::MAX_FRAME_SIZE, 16_384 + input.below(1 << 16) as u32),
                        2 => (wire::HEADER_TABLE_SIZE, input.below(8192) as u32),
                        3 => (wire::ENABLE_PUSH, input.below(2) as u32),
                        4 => (wire::MAX_CONCURRENT_STREAMS, input.u32()),
                        _ => (0x20 + input.u8() as u16, input.u32()),
                    });
                }
                let payload = wire::settings_payload(&values);
                let grants = wire::settings_grants(&payload).expect("valid settings");
                self.stage(wire::SETTINGS, 0, 0, &payload, Mark::Grants(grants));
            }
            6 => {
                let payload = input.u32().to_be_bytes().repeat(2);
                self.stage(wire::PING, 0, 0, &payload, Mark::Nothing);
            }
            7 => {
                let id = self.next_id + 2 * input.below(4) as u32;
                let dep = id.saturating_sub(2 * (1 + input.below(3) as u32));
                let mut payload = dep.to_be_bytes().to_vec();
                payload.push(input.u8());
                self.stage(wire::PRIORITY, 0, id, &payload, Mark::Nothing);
            }
            _ => {
                let payload = input.bytes(20);
                self.stage(0x20 + input.u8() % 200, 0, 0, &payload, Mark::Nothing);
            }
        }
    }

    /// What a well-behaved client may send on stream `id` and on the
    /// connection, from the server's SETTINGS and WINDOW_UPDATEs so far.
    fn client_view_windows(&self, id: u32) -> (i64, i64) {
        let sent = self.client_sent_flow.get(&id).copied().unwrap_or(0);
        let stream =
            self.server_initial + self.server_granted.get(&id).copied().unwrap_or(0) - sent;
        let conn = wire::DEFAULT_WINDOW + self.server_granted.get(&0).copied().unwrap_or(0)
            - self.client_sent_conn;
        (stream, conn)
    }
}

/// A request body's byte at `offset` on stream `id`.
pub fn body_byte(id: u32, offset: u64) -> u8 {
    (u64::from(id) * 31 + offset * 7) as u8
}
