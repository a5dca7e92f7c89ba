//! Reading NumPy `.npy` files (format versions 1.0–3.0), so a probe input
//! can be saved with `numpy.save` instead of written out as JSON.
//!
//! The format: the magic `\x93NUMPY`, a major and minor version byte, the
//! header length (u16 LE in 1.x, u32 LE in 2.x and 3.x), a Python dict
//! literal such as `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16), }`,
//! then the raw data. Little-endian C-order data already is the protocol's
//! raw tensor layout. See numpy's `numpy.lib.format` documentation.

use infermesh_proto::tensor::{DataType, element_count};

use crate::codec;

/// Why a `.npy` file cannot be used as a probe input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NpyError {
    /// The file does not start with `\x93NUMPY`.
    #[error("missing the \\x93NUMPY magic; save the array with numpy.save")]
    NotNpy,
    /// A format version other than 1.x, 2.x or 3.x.
    #[error("format version {0}.{1} is not supported (1.0, 2.0 and 3.0 are)")]
    Version(u8, u8),
    /// The file ends inside the header.
    #[error("the file ends inside the header")]
    Truncated,
    /// The header dict lacks a key or holds an unreadable value.
    #[error("header: {0}")]
    Header(String),
    /// A dtype other than little-endian bool, integers and floats.
    #[error("dtype '{0}' is not supported (little-endian b1, i1-i8, u1-u8, f2, f4 or f8)")]
    Dtype(String),
    /// A Fortran-ordered array of two or more dimensions.
    #[error("Fortran-ordered arrays are not supported; save a C-ordered array")]
    FortranOrder,
    /// The data does not hold exactly shape × dtype size bytes.
    #[error("data holds {got} bytes, shape and dtype need {expected}")]
    Size {
        /// Bytes after the header.
        got: usize,
        /// Bytes the header describes.
        expected: usize,
    },
}

/// An array read from a `.npy` file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NpyArray {
    /// The protocol datatype of the array's dtype.
    pub datatype: DataType,
    /// The array's shape (`[]` for a scalar).
    pub shape: Vec<i64>,
    /// Values, row-major.
    pub data: Vec<f64>,
}

/// Parses the contents of a `.npy` file.
pub(crate) fn parse(bytes: &[u8]) -> Result<NpyArray, NpyError> {
    let rest = bytes.strip_prefix(b"\x93NUMPY").ok_or(NpyError::NotNpy)?;
    let (&major, &minor) = match rest {
        [major, minor, ..] => (major, minor),
        _ => return Err(NpyError::Truncated),
    };
    let (len, rest) = match major {
        1 => {
            let len = rest.get(2..4).ok_or(NpyError::Truncated)?;
            (
                usize::from(u16::from_le_bytes([len[0], len[1]])),
                &rest[4..],
            )
        }
        2 | 3 => {
            let len = rest.get(2..6).ok_or(NpyError::Truncated)?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
            (len as usize, &rest[6..])
        }
        _ => return Err(NpyError::Version(major, minor)),
    };
    let header = rest.get(..len).ok_or(NpyError::Truncated)?;
    let data = &rest[len..];
    let header = std::str::from_utf8(header)
        .map_err(|_| NpyError::Header("not ASCII or UTF-8".to_string()))?;

    let descr = quoted(value_of(header, "descr")?)?;
    let datatype = dtype(descr)?;
    let fortran = value_of(header, "fortran_order")?;
    let fortran = if fortran.starts_with("True") {
        true
    } else if fortran.starts_with("False") {
        false
    } else {
        return Err(NpyError::Header(
            "fortran_order is not True or False".into(),
        ));
    };
    let shape = tuple(value_of(header, "shape")?)?;
    if fortran && shape.len() > 1 {
        return Err(NpyError::FortranOrder);
    }

    let size = datatype.element_size().unwrap_or(1);
    let expected = element_count(&shape)
        .and_then(|n| n.checked_mul(size))
        .ok_or_else(|| NpyError::Header(format!("shape {shape:?} is too large")))?;
    if data.len() != expected {
        return Err(NpyError::Size {
            got: data.len(),
            expected,
        });
    }
    let data = codec::decode(datatype, data).map_err(NpyError::Header)?;
    Ok(NpyArray {
        datatype,
        shape,
        data,
    })
}

/// The text after `'key':` in the header dict.
fn value_of<'h>(header: &'h str, key: &str) -> Result<&'h str, NpyError> {
    let missing = || NpyError::Header(format!("no '{key}' key"));
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))
        .ok_or_else(missing)?;
    let after = header[at + key.len() + 2..].trim_start();
    Ok(after.strip_prefix(':').ok_or_else(missing)?.trim_start())
}

/// A Python string literal at the start of `s`.
fn quoted(s: &str) -> Result<&str, NpyError> {
    let bad = || NpyError::Header("descr is not a string".to_string());
    let quote = s
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or_else(bad)?;
    let body = &s[1..];
    body.find(quote).map(|end| &body[..end]).ok_or_else(bad)
}

/// A Python tuple of non-negative integers at the start of `s`: `()`, `(3,)`, `(2, 16)`.
fn tuple(s: &str) -> Result<Vec<i64>, NpyError> {
    let bad = || NpyError::Header("shape is not a tuple of non-negative integers".to_string());
    let body = s.strip_prefix('(').ok_or_else(bad)?;
    let body = &body[..body.find(')').ok_or_else(bad)?];
    body.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(bad))
        .collect()
}

fn dtype(descr: &str) -> Result<DataType, NpyError> {
    let unsupported = || NpyError::Dtype(descr.to_string());
    let kind = descr
        .strip_prefix('<')
        .or_else(|| descr.strip_prefix('|'))
        .ok_or_else(unsupported)?;
    Ok(match kind {
        "b1" => DataType::Bool,
        "i1" => DataType::Int8,
        "i2" => DataType::Int16,
        "i4" => DataType::Int32,
        "i8" => DataType::Int64,
        "u1" => DataType::Uint8,
        "u2" => DataType::Uint16,
        "u4" => DataType::Uint32,
        "u8" => DataType::Uint64,
        "f2" => DataType::Fp16,
        "f4" => DataType::Fp32,
        "f8" => DataType::Fp64,
        _ => return Err(unsupported()),
    })
}

/// Writes a version 1.0 `.npy` file, as `numpy.save` does (tests only).
#[cfg(test)]
pub(crate) fn write_v1(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let dims = match dims.len() {
        1 => format!("{},", dims[0]),
        _ => dims.join(", "),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}");
    // numpy pads with spaces so the data starts on a 64-byte boundary.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_float_and_integer_arrays() {
        let file = write_v1("<f4", &[2, 2], &f32_bytes(&[0.5, -1.0, 2.0, 3.0]));
        let a = parse(&file).unwrap();
        assert_eq!(a.datatype, DataType::Fp32);
        assert_eq!(a.shape, [2, 2]);
        assert_eq!(a.data, [0.5, -1.0, 2.0, 3.0]);

        let ints: Vec<u8> = [-1i64, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse(&write_v1("<i8", &[2], &ints)).unwrap();
        assert_eq!(
            (a.datatype, a.shape, a.data),
            (DataType::Int64, vec![2], vec![-1.0, 7.0])
        );

        let a = parse(&write_v1("<f8", &[], &1.5f64.to_le_bytes())).unwrap();
        assert_eq!((a.shape, a.data), (vec![], vec![1.5]));
        assert_eq!(
            parse(&write_v1("<i4", &[1], &9i32.to_le_bytes()))
                .unwrap()
                .data,
            [9.0]
        );
    }

    #[test]
    fn reads_version_2_headers() {
        let v1 = write_v1("<f4", &[1], &f32_bytes(&[4.0]));
        let header_len = usize::from(u16::from_le_bytes([v1[8], v1[9]]));
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        v2.extend((header_len as u32).to_le_bytes());
        v2.extend(&v1[10..]);
        assert_eq!(parse(&v2).unwrap().data, [4.0]);
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        assert_eq!(parse(b"PK\x03\x04"), Err(NpyError::NotNpy));
        assert_eq!(parse(b"\x93NUMPY\x01"), Err(NpyError::Truncated));
        assert_eq!(
            parse(b"\x93NUMPY\x04\x00\x00\x00"),
            Err(NpyError::Version(4, 0))
        );
        let big_endian = write_v1(">f4", &[1], &[0; 4]);
        assert_eq!(parse(&big_endian), Err(NpyError::Dtype(">f4".into())));
        assert_eq!(
            parse(&write_v1("<c8", &[1], &[0; 8])),
            Err(NpyError::Dtype("<c8".into()))
        );
        let short = write_v1("<f4", &[2, 16], &[0; 100]);
        assert_eq!(
            parse(&short),
            Err(NpyError::Size {
                got: 100,
                expected: 128
            })
        );
        let mut truncated = write_v1("<f4", &[1], &[0; 4]);
        truncated.truncate(20);
        assert_eq!(parse(&truncated), Err(NpyError::Truncated));
    }

    /// `file` with the first `from` replaced by `to` (same length, so the
    /// header length stays right).
    fn replaced(file: &[u8], from: &str, to: &str) -> Vec<u8> {
        let at = file
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap();
        [&file[..at], to.as_bytes(), &file[at + from.len()..]].concat()
    }

    #[test]
    fn rejects_fortran_order_and_bad_headers() {
        let file = write_v1("<f4", &[2, 2], &[0; 16]);
        let fortran = replaced(&file, "False", "True ");
        assert_eq!(parse(&fortran), Err(NpyError::FortranOrder));
        let no_shape = replaced(&file, "'shape'", "'shapo'");
        assert!(matches!(parse(&no_shape), Err(NpyError::Header(m)) if m.contains("shape")));
    }
}
