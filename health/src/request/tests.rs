//! Loading probe request files.

use super::*;
use crate::npy;
use crate::scratch::Scratch;

fn load(dir: &Scratch, name: &str, contents: &str) -> Result<ProbeRequest, HealthError> {
    ProbeRequest::load(&dir.write(name, contents), None)
}

#[test]
fn loads_nested_data_expected_outputs_and_parameters() {
    let dir = Scratch::new();
    let r = load(
        &dir,
        "r.json",
        r#"{
            "id": "probe-1",
            "parameters": {"priority": 2, "tag": "health", "flag": true, "scale": 0.5},
            "inputs": [
                {"name": "X", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2.5], [3, 4]]},
                {"name": "MASK", "datatype": "BOOL", "shape": [2], "data": [true, false], "parameters": {}}
            ],
            "outputs": [{"name": "Y", "datatype": "FP64", "shape": [1], "data": [0.25]}]
        }"#,
    )
    .unwrap();
    assert_eq!(r.inputs[0].data, [1.0, 2.5, 3.0, 4.0]);
    assert_eq!(r.inputs[1].data, [1.0, 0.0]);
    assert_eq!(r.expected[0].name, "Y");
    let req = r.infer_request("m");
    assert_eq!((req.model_name.as_str(), req.id.as_str()), ("m", "probe-1"));
    assert_eq!(req.inputs[0].shape, [2, 2]);
    assert_eq!(req.raw_input_contents[0].len(), 16);
    assert_eq!(&req.raw_input_contents[1][..], [1, 0]);
    assert_eq!(
        req.parameters["priority"].parameter_choice,
        Some(ParameterChoice::Int64Param(2))
    );
    assert_eq!(
        req.parameters["scale"].parameter_choice,
        Some(ParameterChoice::DoubleParam(0.5))
    );
    assert_eq!(r.to_json()["inputs"][1]["data"], json!([1, 0]));
}

#[test]
fn errors_name_the_file_and_the_tensor() {
    let dir = Scratch::new();
    let err = load(&dir, "bad.json", r#"{"inputs": [}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad.json") && err.contains("not a KServe v2 JSON request"),
        "{err}"
    );

    let err = load(
        &dir,
        "typo.json",
        r#"{"inputs": [{"name": "X", "dtype": "FP32", "shape": [1], "data": [1]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("typo.json") && err.contains("unknown field `dtype`"),
        "{err}"
    );

    let err = load(
        &dir,
        "dt.json",
        r#"{"inputs": [{"name": "X", "datatype": "FP8", "shape": [1], "data": [1]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("dt.json") && err.contains("unknown datatype 'FP8'"),
        "{err}"
    );

    let err = load(
        &dir,
        "int.json",
        r#"{"inputs": [{"name": "IDS", "datatype": "INT32", "shape": [2], "data": [1, 2.5]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("input 'IDS': element 1 (2.5)"), "{err}");

    let err = load(
        &dir,
        "str.json",
        r#"{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": ["a"]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tensor 'X': data must hold numbers"), "{err}");

    let err = load(&dir, "none.json", r#"{"inputs": []}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no inputs"), "{err}");

    let err = load(
        &dir,
        "dup.json",
        r#"{"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1], "data": [1]},
        {"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("more than once"), "{err}");

    let err = ProbeRequest::load(&dir.path().join("absent.json"), None).unwrap_err();
    assert!(matches!(err, HealthError::Read { .. }));
}

#[test]
fn loads_npy_inputs_named_by_the_input_option() {
    let dir = Scratch::new();
    let data: Vec<u8> = [0.5f32, 1.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = dir.write("x.npy", npy::write_v1("<f4", &[1, 2], &data));
    let r = ProbeRequest::load(&path, Some("INPUT0")).unwrap();
    assert_eq!(r.inputs[0].name, "INPUT0");
    assert_eq!(r.inputs[0].shape, [1, 2]);
    assert_eq!(r.inputs[0].data, [0.5, 1.5]);
    assert_eq!(&r.infer_request("m").raw_input_contents[0][..], &data[..]);

    let err = ProbeRequest::load(&path, None).unwrap_err().to_string();
    assert!(
        err.contains("x.npy") && err.contains("`input` option"),
        "{err}"
    );
    let bad = dir.write("bad.npy", b"not numpy");
    let err = ProbeRequest::load(&bad, Some("X")).unwrap_err().to_string();
    assert!(
        err.contains("bad.npy") && err.contains("NUMPY magic"),
        "{err}"
    );
    let json = dir.write("r.json", "{}");
    let err = ProbeRequest::load(&json, Some("X"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("only applies to .npy"), "{err}");
}

/// `configs/health/dense-golden.json` must hold exactly what the test
/// worker's `dense` model computes, so it can serve as a golden example.
#[test]
fn shipped_dense_golden_matches_the_dense_model() {
    use infermesh_testworker::dense;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/health/dense-golden.json");
    let r = ProbeRequest::load(&path, None).unwrap();
    assert_eq!(r.inputs.len(), 1);
    assert_eq!(
        (r.inputs[0].name.as_str(), &r.inputs[0].shape[..]),
        (dense::INPUT, &[2, 16][..])
    );
    let input: Vec<f32> = r.inputs[0].data.iter().map(|&v| v as f32).collect();
    let want = dense::forward(&input);
    assert_eq!(r.expected.len(), 1);
    let expected = &r.expected[0];
    assert_eq!(
        (expected.name.as_str(), &expected.shape[..]),
        (dense::OUTPUT, &[2, 4][..])
    );
    let got: Vec<f32> = expected.data.iter().map(|&v| v as f32).collect();
    assert_eq!(got, want, "regenerate the file from dense::forward");
}
