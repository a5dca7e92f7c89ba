//! `exec`: the model owner's own check. The probe runs first; then the
//! command gets one JSON document on stdin describing the request and what
//! came back, and its exit code is the verdict (see the crate docs for the
//! protocol).

mod process;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::probe::{Exchange, Probe};
use crate::tensor::Tensor;
use crate::{CheckFuture, Client, HealthCheck, Verdict};

use process::RunError;

/// Runs a command that judges the probe's outputs.
#[derive(Debug)]
pub(crate) struct Exec {
    label: String,
    model: String,
    probe: Probe,
    program: PathBuf,
    args: Vec<String>,
    cwd: PathBuf,
    timeout: Duration,
    max_output: usize,
}

/// How an exec check runs its command.
#[derive(Debug, Clone)]
pub(crate) struct ExecOptions<'a> {
    /// The command line, split like a shell does.
    pub command: &'a str,
    /// The config file's directory: the working directory, and what a
    /// relative program path (one with a `/`) is relative to.
    pub base_dir: &'a Path,
    /// Deadline for the command.
    pub timeout: Duration,
    /// Bytes of stdout and of stderr kept.
    pub max_output: usize,
}

impl Exec {
    /// An exec check; the command line must split into at least a program.
    pub fn new(
        label: String,
        model: &str,
        probe: Probe,
        opts: ExecOptions<'_>,
    ) -> Result<Self, String> {
        let argv = shlex::split(opts.command)
            .ok_or_else(|| format!("command `{}` has unbalanced quotes", opts.command))?;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| "command is empty".to_string())?;
        if opts.timeout.is_zero() {
            return Err("timeout must be above zero".to_string());
        }
        let cwd = absolute(opts.base_dir);
        let program = if program.contains('/') {
            // `components` drops the `.` of `./check.sh`.
            cwd.join(program).components().collect()
        } else {
            PathBuf::from(program) // looked up in PATH
        };
        Ok(Self {
            label,
            model: model.to_string(),
            probe,
            program,
            args: args.to_vec(),
            cwd,
            timeout: opts.timeout,
            max_output: opts.max_output,
        })
    }
}

/// `dir` made absolute against the current directory (without touching the
/// file system), so the program path does not depend on the child's cwd.
fn absolute(dir: &Path) -> PathBuf {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

impl HealthCheck for Exec {
    fn name(&self) -> &str {
        &self.label
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn check<'a>(&'a self, mut client: Client) -> CheckFuture<'a> {
        Box::pin(async move {
            let exchange = self.probe.run(&mut client).await;
            let mut stdin = serde_json::to_vec(&document(&self.model, &exchange))
                .unwrap_or_else(|_| b"{}".to_vec());
            stdin.push(b'\n');
            let run = process::run(
                &self.program,
                &self.args,
                &self.cwd,
                stdin,
                self.timeout,
                self.max_output,
            )
            .await;
            let result = match run {
                Err(RunError::Spawn(e)) => {
                    Err(format!("cannot run '{}': {e}", self.program.display()))
                }
                Err(RunError::TimedOut) => Err(format!("timed out after {:?}", self.timeout)),
                Err(RunError::Wait(e)) => {
                    Err(format!("waiting for '{}': {e}", self.program.display()))
                }
                Ok(done) => {
                    let said = first_line(&done.stdout);
                    if done.status.success() {
                        Ok(said.unwrap_or_else(|| "exit status 0".to_string()))
                    } else {
                        Err(said.unwrap_or_else(|| match first_line(&done.stderr) {
                            Some(err) => format!("{} ({err})", done.status),
                            None => done.status.to_string(),
                        }))
                    }
                }
            };
            Verdict::from_result(self, result, exchange.latency)
        })
    }
}

/// The document a command reads on stdin.
pub(crate) fn document(model: &str, exchange: &Exchange) -> Value {
    let mut doc = json!({
        "model": model,
        "request": exchange.request.as_ref().map(|r| r.to_json()),
        "latency_ms": exchange.latency.as_secs_f64() * 1e3,
    });
    match &exchange.outputs {
        Ok(outputs) => {
            let outputs: Vec<Value> = outputs.iter().map(Tensor::to_json).collect();
            doc["response"] = json!({ "outputs": outputs });
        }
        Err(e) => doc["error"] = Value::from(e.as_str()),
    }
    doc
}

/// The first non-empty line of `bytes`, trimmed (lossy UTF-8).
fn first_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::request::ProbeRequest;

    fn opts(command: &str) -> ExecOptions<'_> {
        ExecOptions {
            command,
            base_dir: Path::new("/etc/infermesh"),
            timeout: Duration::from_secs(5),
            max_output: 4096,
        }
    }

    fn exec(command: &str) -> Result<Exec, String> {
        Exec::new("exec".into(), "m", Probe::new("m", None), opts(command))
    }

    #[test]
    fn resolves_relative_programs_against_the_config_directory() {
        let e = exec("./health/check.sh --strict 'a b'").unwrap();
        assert_eq!(e.program, Path::new("/etc/infermesh/health/check.sh"));
        assert_eq!(e.args, ["--strict", "a b"]);
        assert_eq!(exec("/bin/check").unwrap().program, Path::new("/bin/check"));
        assert_eq!(exec("python3 -c 1").unwrap().program, Path::new("python3"));
        assert!(exec("").unwrap_err().contains("empty"));
        assert!(exec("check 'open").unwrap_err().contains("quotes"));
    }

    #[test]
    fn first_line_skips_blank_lines() {
        assert_eq!(
            first_line(b"\n  ok: 4 outputs \nmore"),
            Some("ok: 4 outputs".into())
        );
        assert_eq!(first_line(b" \n"), None);
    }

    #[test]
    fn document_carries_request_and_response_or_error() {
        let input = Tensor::new("X", "FP32", vec![1, 2], vec![0.5, 1.0]).unwrap();
        let request = ProbeRequest::new(vec![input], Default::default(), vec![]).unwrap();
        let output = Tensor::new("Y", "FP32", vec![1], vec![f64::NAN]).unwrap();
        let mut exchange = Exchange {
            request: Some(Arc::new(request)),
            outputs: Ok(vec![output]),
            latency: Duration::from_micros(1500),
        };
        let doc = document("m", &exchange);
        assert_eq!(doc["model"], "m");
        assert_eq!(doc["latency_ms"], 1.5);
        assert_eq!(doc["request"]["inputs"][0]["data"], json!([0.5, 1.0]));
        assert_eq!(
            doc["response"]["outputs"][0],
            json!({"name": "Y", "datatype": "FP32", "shape": [1], "data": [null]})
        );
        assert!(doc.get("error").is_none());

        exchange.outputs = Err("ModelInfer failed: NotFound".into());
        exchange.request = None;
        let doc = document("m", &exchange);
        assert_eq!(doc["error"], "ModelInfer failed: NotFound");
        assert!(doc["request"].is_null() && doc.get("response").is_none());
    }
}
