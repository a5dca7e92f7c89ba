//! Parsing `[[health.checks]]` entries and building checks from them.

use super::*;
use crate::scratch::Scratch;

#[derive(Debug, Deserialize)]
struct Config {
    checks: Vec<CheckSpec>,
}

fn parse(toml_text: &str) -> Result<Vec<CheckSpec>, toml::de::Error> {
    toml::from_str::<Config>(toml_text).map(|c| c.checks)
}

fn one(toml_text: &str) -> CheckSpec {
    let mut checks = parse(&format!("[[checks]]\n{toml_text}")).unwrap();
    assert_eq!(checks.len(), 1);
    checks.remove(0)
}

#[test]
fn parses_every_kind_with_defaults() {
    assert_eq!(one(r#"kind = "live""#), CheckSpec::Live { name: None });
    assert_eq!(
        one("kind = \"ready\"\nmodel = \"dense\""),
        CheckSpec::Ready {
            name: None,
            model: "dense".into()
        }
    );
    assert_eq!(
        one("kind = \"golden\"\nmodel = \"dense\"\nrequest = \"g.json\""),
        CheckSpec::Golden {
            name: None,
            model: "dense".into(),
            request: "g.json".into(),
            atol: 1e-5,
            rtol: 1e-4,
        }
    );
    assert_eq!(
        one("kind = \"finite\"\nmodel = \"dense\""),
        CheckSpec::Finite {
            name: None,
            model: "dense".into(),
            request: None,
            input: None,
        }
    );
    assert_eq!(
        one(
            "kind = \"range\"\nmodel = \"dense\"\nmin = -1.0\nmax = 1.0\nsum_to = 1.0\noutput = \"P\""
        ),
        CheckSpec::Range {
            name: None,
            model: "dense".into(),
            request: None,
            input: None,
            min: Some(-1.0),
            max: Some(1.0),
            sum_to: Some(1.0),
            sum_tolerance: 1e-3,
            output: Some("P".into()),
        }
    );
    assert_eq!(
        one("kind = \"latency\"\nmodel = \"dense\"\nmax = \"200ms\""),
        CheckSpec::Latency {
            name: None,
            model: "dense".into(),
            request: None,
            input: None,
            max: Duration::from_millis(200),
        }
    );
    assert_eq!(
        one(
            "kind = \"exec\"\nname = \"owner\"\nmodel = \"dense\"\ncommand = \"./c.sh -v\"\nrequest = \"x.npy\"\ninput = \"INPUT0\""
        ),
        CheckSpec::Exec {
            name: Some("owner".into()),
            model: "dense".into(),
            command: "./c.sh -v".into(),
            request: Some("x.npy".into()),
            input: Some("INPUT0".into()),
            timeout: Duration::from_secs(5),
            max_output_bytes: 4096,
        }
    );
}

#[test]
fn accessors_give_kind_label_and_model() {
    let spec = one("kind = \"exec\"\nname = \"owner\"\nmodel = \"dense\"\ncommand = \"c\"");
    assert_eq!(
        (spec.kind(), spec.label(), spec.model()),
        ("exec", "owner", Some("dense"))
    );
    let live = one(r#"kind = "live""#);
    assert_eq!(
        (live.kind(), live.label(), live.model()),
        ("live", "live", None)
    );
}

#[test]
fn rejects_unknown_fields_kinds_and_missing_options() {
    let err = parse("[[checks]]\nkind = \"finite\"\nmodel = \"m\"\natol = 1.0").unwrap_err();
    assert!(err.to_string().contains("unknown field `atol`"), "{err}");
    let err = parse("[[checks]]\nkind = \"live\"\nmodel = \"m\"").unwrap_err();
    assert!(err.to_string().contains("unknown field `model`"), "{err}");
    let err = parse("[[checks]]\nkind = \"smoke\"").unwrap_err();
    assert!(err.to_string().contains("unknown variant `smoke`"), "{err}");
    let err = parse("[[checks]]\nkind = \"golden\"\nmodel = \"m\"").unwrap_err();
    assert!(err.to_string().contains("missing field `request`"), "{err}");
    let err = parse("[[checks]]\nkind = \"latency\"\nmodel = \"m\"\nmax = \"fast\"").unwrap_err();
    assert!(err.to_string().contains("fast"), "{err}");
    assert!(
        parse("[[checks]]\nmodel = \"m\"").is_err(),
        "kind is required"
    );
}

fn build_err(spec: &str, dir: &Path) -> String {
    match build(&one(spec), dir) {
        Ok(check) => panic!("built {check:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn build_labels_checks_and_resolves_files_against_the_base_dir() {
    let dir = Scratch::new();
    dir.write(
        "probe.json",
        r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1,2],"data":[[1,2]]}]}"#,
    );
    let check = build(
        &one("kind = \"finite\"\nmodel = \"m\"\nrequest = \"probe.json\""),
        dir.path(),
    )
    .unwrap();
    assert_eq!((check.name(), check.model()), ("finite", "m"));
    let check = build(&one("kind = \"live\"\nname = \"port\""), Path::new("")).unwrap();
    assert_eq!((check.name(), check.model()), ("port", ""));
}

#[test]
fn build_reports_file_problems_naming_the_file() {
    let dir = Scratch::new();
    let err = build_err(
        "kind = \"finite\"\nmodel = \"m\"\nrequest = \"missing.json\"",
        dir.path(),
    );
    assert!(
        err.starts_with("cannot read '") && err.contains("missing.json"),
        "{err}"
    );

    dir.write(
        "short.json",
        r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1,16],"data":[1,2]}]}"#,
    );
    let err = build_err(
        "kind = \"range\"\nmodel = \"m\"\nrequest = \"short.json\"\nmax = 1.0",
        dir.path(),
    );
    assert!(
        err.contains("short.json") && err.contains("2 values for shape [1, 16]"),
        "{err}"
    );

    dir.write(
        "probe.json",
        r#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1]}]}"#,
    );
    let err = build_err(
        "kind = \"golden\"\nmodel = \"m\"\nrequest = \"probe.json\"",
        dir.path(),
    );
    assert_eq!(
        err,
        "golden check: the request file has no expected `outputs` to compare with"
    );
}

#[test]
fn build_validates_options() {
    let dir = Path::new("/nonexistent");
    assert!(build_err("kind = \"range\"\nmodel = \"m\"", dir).contains("at least one of min"));
    let err = build_err("kind = \"golden\"\nmodel = \"m\"\nrequest = \"x.npy\"", dir);
    assert!(err.contains("not .npy"), "{err}");
    assert!(
        build_err("kind = \"range\"\nmodel = \"m\"\nmin = 2.0\nmax = 1.0", dir)
            .contains("above max")
    );
    assert!(build_err("kind = \"ready\"\nmodel = \"\"", dir).contains("model must not be empty"));
    assert!(build_err("kind = \"live\"\nname = \"\"", dir).contains("name must not be empty"));
    assert!(build_err("kind = \"finite\"\nmodel = \"m\"\ninput = \"X\"", dir).contains("`input`"));
    assert!(
        build_err("kind = \"exec\"\nmodel = \"m\"\ncommand = \"  \"", dir)
            .contains("command is empty")
    );
    let err = build_err(
        "kind = \"exec\"\nname = \"mine\"\nmodel = \"m\"\ncommand = \"c\"\ntimeout = \"0s\"",
        dir,
    );
    assert_eq!(err, "mine check: timeout must be above zero");
}
