//! Tensor values ↔ the protocol's little-endian raw bytes and typed contents.
//!
//! Checks reason about values as `f64`: every numeric datatype widens to it
//! exactly except 64-bit integers beyond ±2^53, which no health check needs.
//! `BYTES` (strings) is not supported.

use half::{bf16, f16};
use infermesh_proto::inference::InferTensorContents;
use infermesh_proto::tensor::DataType;

/// Whether checks can encode and decode `dt`.
pub(crate) fn supported(dt: DataType) -> bool {
    dt != DataType::Bytes
}

/// Whether `dt` holds integers (including `BOOL`).
pub(crate) fn is_integral(dt: DataType) -> bool {
    !matches!(
        dt,
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 | DataType::Bytes
    )
}

/// Encodes `values` as `dt`'s raw little-endian form. Integer types need
/// whole values within the type's range; `BOOL` needs 0 or 1.
pub(crate) fn encode(dt: DataType, values: &[f64]) -> Result<Vec<u8>, String> {
    let size = dt
        .element_size()
        .ok_or_else(|| format!("{dt} tensors are not supported"))?;
    let mut out = Vec::with_capacity(values.len() * size);
    for (i, &v) in values.iter().enumerate() {
        match dt {
            DataType::Fp16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DataType::Bf16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DataType::Fp32 => out.extend((v as f32).to_le_bytes()),
            DataType::Fp64 => out.extend(v.to_le_bytes()),
            _ => {
                let (lo, hi) = integer_range(dt);
                if v.fract() != 0.0 || !(lo..=hi).contains(&v) {
                    return Err(format!(
                        "element {i} ({v}) is not a {dt} value (whole number in {lo}..={hi})"
                    ));
                }
                // Little-endian: the low `size` bytes of the two's complement.
                let bytes = if v < 0.0 {
                    (v as i64).to_le_bytes()
                } else {
                    (v as u64).to_le_bytes()
                };
                out.extend_from_slice(&bytes[..size]);
            }
        }
    }
    Ok(out)
}

fn integer_range(dt: DataType) -> (f64, f64) {
    match dt {
        DataType::Bool => (0.0, 1.0),
        DataType::Int8 => (i8::MIN as f64, i8::MAX as f64),
        DataType::Int16 => (i16::MIN as f64, i16::MAX as f64),
        DataType::Int32 => (i32::MIN as f64, i32::MAX as f64),
        DataType::Int64 => (i64::MIN as f64, i64::MAX as f64),
        DataType::Uint8 => (0.0, u8::MAX as f64),
        DataType::Uint16 => (0.0, u16::MAX as f64),
        DataType::Uint32 => (0.0, u32::MAX as f64),
        _ => (0.0, u64::MAX as f64),
    }
}

/// Decodes `dt`'s raw little-endian form.
pub(crate) fn decode(dt: DataType, raw: &[u8]) -> Result<Vec<f64>, String> {
    let size = dt
        .element_size()
        .ok_or_else(|| format!("{dt} tensors are not supported"))?;
    if raw.len() % size != 0 {
        return Err(format!(
            "{} bytes is not a whole number of {dt} elements",
            raw.len()
        ));
    }
    Ok(raw.chunks_exact(size).map(|c| element(dt, c)).collect())
}

fn element(dt: DataType, c: &[u8]) -> f64 {
    let mut b = [0u8; 8];
    b[..c.len()].copy_from_slice(c);
    let [b0, b1, b2, b3, ..] = b;
    match dt {
        DataType::Bool => f64::from(u8::from(b0 != 0)),
        DataType::Uint8 => f64::from(b0),
        DataType::Int8 => f64::from(b0 as i8),
        DataType::Uint16 => f64::from(u16::from_le_bytes([b0, b1])),
        DataType::Int16 => f64::from(i16::from_le_bytes([b0, b1])),
        DataType::Fp16 => f16::from_le_bytes([b0, b1]).to_f64(),
        DataType::Bf16 => bf16::from_le_bytes([b0, b1]).to_f64(),
        DataType::Uint32 => f64::from(u32::from_le_bytes([b0, b1, b2, b3])),
        DataType::Int32 => f64::from(i32::from_le_bytes([b0, b1, b2, b3])),
        DataType::Fp32 => f64::from(f32::from_le_bytes([b0, b1, b2, b3])),
        DataType::Uint64 => u64::from_le_bytes(b) as f64,
        DataType::Int64 => i64::from_le_bytes(b) as f64,
        DataType::Fp64 => f64::from_le_bytes(b),
        DataType::Bytes => f64::NAN, // rejected by `decode` before this
    }
}

/// Reads `dt`'s values from the typed-contents field it uses.
pub(crate) fn decode_typed(dt: DataType, c: &InferTensorContents) -> Result<Vec<f64>, String> {
    Ok(match dt {
        DataType::Bool => c
            .bool_contents
            .iter()
            .map(|&b| f64::from(u8::from(b)))
            .collect(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => {
            c.int_contents.iter().map(|&v| f64::from(v)).collect()
        }
        DataType::Int64 => c.int64_contents.iter().map(|&v| v as f64).collect(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => {
            c.uint_contents.iter().map(|&v| f64::from(v)).collect()
        }
        DataType::Uint64 => c.uint64_contents.iter().map(|&v| v as f64).collect(),
        DataType::Fp32 => c.fp32_contents.iter().map(|&v| f64::from(v)).collect(),
        DataType::Fp64 => c.fp64_contents.clone(),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(format!("{dt} outputs must use raw contents"));
        }
        DataType::Bytes => return Err(format!("{dt} tensors are not supported")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_type_round_trips() {
        let values = [0.0, 1.0, 2.0, 100.0];
        for dt in [
            DataType::Uint8,
            DataType::Uint16,
            DataType::Uint32,
            DataType::Uint64,
            DataType::Int8,
            DataType::Int16,
            DataType::Int32,
            DataType::Int64,
            DataType::Fp16,
            DataType::Bf16,
            DataType::Fp32,
            DataType::Fp64,
        ] {
            let raw = encode(dt, &values).unwrap();
            assert_eq!(raw.len(), 4 * dt.element_size().unwrap(), "{dt}");
            assert_eq!(decode(dt, &raw).unwrap(), values, "{dt}");
        }
        let signed = [-128.0, -1.0, 127.0];
        for dt in [DataType::Int8, DataType::Int32, DataType::Int64] {
            assert_eq!(decode(dt, &encode(dt, &signed).unwrap()).unwrap(), signed);
        }
    }

    #[test]
    fn encodes_little_endian_like_the_protocol() {
        assert_eq!(
            encode(DataType::Int32, &[-2.0]).unwrap(),
            [0xfe, 0xff, 0xff, 0xff]
        );
        assert_eq!(encode(DataType::Fp16, &[1.0]).unwrap(), [0x00, 0x3c]);
        assert_eq!(encode(DataType::Bf16, &[1.0]).unwrap(), [0x80, 0x3f]);
        assert_eq!(
            encode(DataType::Fp32, &[0.5]).unwrap(),
            0.5f32.to_le_bytes()
        );
        assert_eq!(encode(DataType::Bool, &[1.0, 0.0]).unwrap(), [1, 0]);
    }

    #[test]
    fn rejects_values_an_integer_type_cannot_hold() {
        assert!(
            encode(DataType::Int32, &[0.5])
                .unwrap_err()
                .contains("element 0")
        );
        assert!(
            encode(DataType::Uint8, &[1.0, 256.0])
                .unwrap_err()
                .contains("element 1")
        );
        assert!(encode(DataType::Uint32, &[-1.0]).is_err());
        assert!(encode(DataType::Bool, &[2.0]).is_err());
        assert!(encode(DataType::Int64, &[f64::NAN]).is_err());
        assert!(encode(DataType::Bytes, &[1.0]).is_err());
    }

    #[test]
    fn decode_checks_the_length_and_keeps_nan() {
        assert!(decode(DataType::Fp32, &[0; 6]).is_err());
        assert!(decode(DataType::Fp32, &f32::NAN.to_le_bytes()).unwrap()[0].is_nan());
        assert_eq!(
            decode(DataType::Uint64, &u64::MAX.to_le_bytes()).unwrap(),
            [u64::MAX as f64]
        );
    }

    #[test]
    fn typed_contents_use_the_datatype_field() {
        let c = InferTensorContents {
            int_contents: vec![-3, 4],
            fp32_contents: vec![0.25],
            ..Default::default()
        };
        assert_eq!(decode_typed(DataType::Int16, &c).unwrap(), [-3.0, 4.0]);
        assert_eq!(decode_typed(DataType::Fp32, &c).unwrap(), [0.25]);
        assert!(decode_typed(DataType::Fp16, &c).is_err());
    }
}
