//! Header blocks built from representations (RFC 7541 6): indexed fields,
//! literals of the three kinds with indexed or new names, Huffman-coded or
//! not, and dynamic table size updates; with index values past the tables
//! and sizes past the allowed one now and then, so both decoders also see
//! blocks they must reject.

use proptest::collection::vec;
use proptest::prelude::*;

use super::huffman_code;

/// A string literal: its bytes, and whether it goes Huffman-coded.
#[derive(Debug, Clone)]
pub struct Str {
    pub bytes: Vec<u8>,
    pub huffman: bool,
}

#[derive(Debug, Clone)]
pub enum Name {
    Indexed(usize),
    New(Str),
}

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Incremental,
    Without,
    Never,
}

#[derive(Debug, Clone)]
pub enum Rep {
    Indexed(usize),
    Literal(Kind, Name, Str),
    SizeUpdate(usize),
}

/// The block of `reps`.
pub fn encode(reps: &[Rep]) -> Vec<u8> {
    let mut out = Vec::new();
    for rep in reps {
        match rep {
            Rep::Indexed(i) => integer(&mut out, 7, 0x80, *i),
            Rep::SizeUpdate(size) => integer(&mut out, 5, 0x20, *size),
            Rep::Literal(kind, name, value) => {
                let (prefix, flags) = match kind {
                    Kind::Incremental => (6, 0x40),
                    Kind::Without => (4, 0x00),
                    Kind::Never => (4, 0x10),
                };
                match name {
                    Name::Indexed(i) => integer(&mut out, prefix, flags, *i),
                    Name::New(s) => {
                        integer(&mut out, prefix, flags, 0);
                        string(&mut out, s);
                    }
                }
                string(&mut out, value);
            }
        }
    }
    out
}

fn string(out: &mut Vec<u8>, s: &Str) {
    if s.huffman {
        let coded = huffman_code::encode(&s.bytes);
        integer(out, 7, 0x80, coded.len());
        out.extend_from_slice(&coded);
    } else {
        integer(out, 7, 0x00, s.bytes.len());
        out.extend_from_slice(&s.bytes);
    }
}

/// An integer with a `prefix`-bit prefix after `flags` (RFC 7541 5.1).
fn integer(out: &mut Vec<u8>, prefix: u8, flags: u8, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn text() -> impl Strategy<Value = Str> {
    let bytes = prop_oneof![
        3 => vec(prop::sample::select(b"abcdefghijklmnopqrstuvwxyz-:0123456789/ ".to_vec()), 0..24),
        1 => vec(any::<u8>(), 0..24),
        1 => vec(any::<u8>(), 100..300),
    ];
    (bytes, any::<bool>()).prop_map(|(bytes, huffman)| Str { bytes, huffman })
}

/// Mostly within the static table and the first entries of the dynamic
/// one; 0 and indexes past both now and then.
fn index() -> impl Strategy<Value = usize> {
    prop_oneof![60 => 1usize..=61, 8 => 62usize..=66, 1 => Just(0usize), 1 => 67usize..=5000]
}

fn rep() -> impl Strategy<Value = Rep> {
    let kind = prop_oneof![
        Just(Kind::Incremental),
        Just(Kind::Without),
        Just(Kind::Never)
    ];
    let name = prop_oneof![index().prop_map(Name::Indexed), text().prop_map(Name::New)];
    prop_oneof![
        20 => index().prop_map(Rep::Indexed),
        40 => (kind, name, text()).prop_map(|(k, n, v)| Rep::Literal(k, n, v)),
        // Misplaced: RFC 7541 4.2 wants size updates first.
        1 => size().prop_map(Rep::SizeUpdate),
    ]
}

/// Table sizes: mostly allowed (up to 4,096), some over.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![20 => 0usize..=4096, 1 => 4097usize..=1 << 20]
}

/// A block: up to two size updates first, then up to 12 representations.
pub fn block() -> impl Strategy<Value = Vec<Rep>> {
    let updates = prop_oneof![6 => Just(Vec::new()), 2 => vec(size(), 1..=2)];
    (updates, vec(rep(), 0..12)).prop_map(|(updates, reps)| {
        updates
            .into_iter()
            .map(Rep::SizeUpdate)
            .chain(reps)
            .collect()
    })
}
