//! A named tensor as checks see it: datatype, shape and row-major values
//! widened to `f64`, read from a probe file or a worker's response.

use infermesh_proto::inference::InferTensorContents;
use infermesh_proto::inference::model_infer_response::InferOutputTensor;
use infermesh_proto::tensor::{DataType, element_count};
use serde_json::{Value, json};

use crate::codec;

/// A tensor whose value count matches its shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tensor {
    /// Tensor name (`INPUT0`).
    pub name: String,
    /// Protocol datatype; never `BYTES`.
    pub datatype: DataType,
    /// Dimensions, each ≥ 0.
    pub shape: Vec<i64>,
    /// Values, row-major.
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor, checking the datatype is supported and `data` fills `shape`.
    pub fn new(
        name: impl Into<String>,
        datatype: &str,
        shape: Vec<i64>,
        data: Vec<f64>,
    ) -> Result<Self, String> {
        let name = name.into();
        let dt = DataType::parse(datatype)
            .ok_or_else(|| format!("tensor '{name}': unknown datatype '{datatype}'"))?;
        if !codec::supported(dt) {
            return Err(format!(
                "tensor '{name}': {dt} tensors are not supported by health checks"
            ));
        }
        let expected = element_count(&shape)
            .ok_or_else(|| format!("tensor '{name}': invalid shape {shape:?}"))?;
        if data.len() != expected {
            return Err(format!(
                "tensor '{name}': {} values for shape {shape:?}, which needs {expected}",
                data.len()
            ));
        }
        Ok(Self {
            name,
            datatype: dt,
            shape,
            data,
        })
    }

    /// Reads an output of a response, from its raw bytes when the response
    /// uses the raw form, else from its typed contents.
    pub fn from_output(out: &InferOutputTensor, raw: Option<&[u8]>) -> Result<Self, String> {
        let dt = DataType::parse(&out.datatype)
            .ok_or_else(|| format!("output '{}': unknown datatype '{}'", out.name, out.datatype))?;
        let data = match (raw, &out.contents) {
            (Some(bytes), _) => codec::decode(dt, bytes),
            (None, Some(contents)) => codec::decode_typed(dt, contents),
            (None, None) => codec::decode_typed(dt, &InferTensorContents::default()),
        }
        .map_err(|e| format!("output '{}': {e}", out.name))?;
        Self::new(&out.name, &out.datatype, out.shape.clone(), data)
    }

    /// The KServe v2 JSON form; non-finite values become `null` (JSON has
    /// no NaN), integer datatypes are written as integers.
    pub fn to_json(&self) -> Value {
        let integral = codec::is_integral(self.datatype);
        let data: Vec<Value> = self
            .data
            .iter()
            .map(|&v| match v {
                v if integral && v < 0.0 => Value::from(v as i64),
                v if integral => Value::from(v as u64),
                v => serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
            })
            .collect();
        json!({
            "name": self.name,
            "datatype": self.datatype.as_str(),
            "shape": self.shape,
            "data": data,
        })
    }

    /// `NAME[i,j,..]`: where element `flat` sits, for failure reasons.
    pub fn position(&self, flat: usize) -> String {
        let mut index = vec![0usize; self.shape.len()];
        let mut rest = flat;
        for (slot, &dim) in index.iter_mut().zip(&self.shape).rev() {
            let dim = dim.max(1) as usize;
            *slot = rest % dim;
            rest /= dim;
        }
        let index: Vec<String> = index.iter().map(ToString::to_string).collect();
        format!("{}[{}]", self.name, index.join(","))
    }

    /// The rows along the last dimension (the whole tensor for a scalar).
    pub fn rows(&self) -> impl Iterator<Item = &[f64]> {
        let width = match self.shape.last() {
            Some(&d) => d.max(1) as usize,
            None => self.data.len().max(1),
        };
        self.data.chunks(width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_count_and_datatype() {
        assert!(Tensor::new("X", "FP32", vec![2, 2], vec![0.0; 4]).is_ok());
        let err = Tensor::new("X", "FP32", vec![1, 16], vec![0.0; 15]).unwrap_err();
        assert_eq!(
            err,
            "tensor 'X': 15 values for shape [1, 16], which needs 16"
        );
        assert!(
            Tensor::new("X", "FP33", vec![1], vec![0.0])
                .unwrap_err()
                .contains("FP33")
        );
        assert!(Tensor::new("X", "BYTES", vec![1], vec![0.0]).is_err());
        assert!(Tensor::new("X", "FP32", vec![-1], vec![]).is_err());
    }

    #[test]
    fn positions_and_rows_follow_the_shape() {
        let t = Tensor::new("Y", "FP32", vec![2, 3], (0..6).map(f64::from).collect()).unwrap();
        assert_eq!(t.position(0), "Y[0,0]");
        assert_eq!(t.position(5), "Y[1,2]");
        assert_eq!(
            t.rows().map(<[f64]>::to_vec).collect::<Vec<_>>(),
            [vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]]
        );
        let scalar = Tensor::new("S", "FP64", vec![], vec![7.0]).unwrap();
        assert_eq!(scalar.position(0), "S[]");
        assert_eq!(scalar.rows().count(), 1);
    }

    #[test]
    fn json_writes_null_for_nan_and_integers_as_integers() {
        let f = Tensor::new("F", "FP32", vec![2], vec![0.5, f64::NAN]).unwrap();
        assert_eq!(f.to_json()["data"], json!([0.5, null]));
        let i = Tensor::new("I", "INT64", vec![2], vec![-3.0, 4.0]).unwrap();
        assert_eq!(
            i.to_json(),
            json!({"name": "I", "datatype": "INT64", "shape": [2], "data": [-3, 4]})
        );
        assert!(i.to_json()["data"][0].is_i64());
    }

    #[test]
    fn reads_raw_and_typed_outputs() {
        let out = InferOutputTensor {
            name: "O".into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            contents: Some(InferTensorContents {
                fp32_contents: vec![1.0, 2.0],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(Tensor::from_output(&out, None).unwrap().data, [1.0, 2.0]);
        let raw = codec::encode(DataType::Fp32, &[3.0, 4.0]).unwrap();
        assert_eq!(
            Tensor::from_output(&out, Some(&raw)).unwrap().data,
            [3.0, 4.0]
        );
        assert!(Tensor::from_output(&out, Some(&raw[..4])).is_err());
    }
}
