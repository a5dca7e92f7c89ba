//! One spelling per concept across flags, config, metrics, trailers and
//! JSON: requests in flight are `inflight` (`max_inflight`,
//! `infermesh_inflight`, `infermesh-inflight`, JSON `"inflight"`), requests
//! waiting are `queued` (`infermesh_queued`, `infermesh-queued`, JSON
//! `"queued"`), and the admin token file is `admin_token_file` /
//! `--admin-token-file` / `INFERMESH_ADMIN_TOKEN_FILE` on the agent and the
//! CLI alike. This test reads what users read and what the code prints, and
//! fails on the other spellings. A line that names an earlier spelling as
//! one that is "still read" is allowed (see docs/DECISIONS.md).

use std::path::{Path, PathBuf};

/// Spellings that must not appear, and the one to use instead.
const BANNED: &[(&str, &str)] = &[
    ("\"in_flight", "\"inflight"),
    ("in-flight\"", "inflight\""),
    ("IN-FLIGHT", "INFLIGHT"),
    ("infermesh_in_flight", "infermesh_inflight"),
    ("infermesh-in-flight", "infermesh-inflight"),
    ("infermesh-queue`", "infermesh-queued`"),
    ("\"infermesh-queue\"", "\"infermesh-queued\""),
    ("infermesh_queue_", "infermesh_queued"),
    (" --token-file", " --admin-token-file"),
    ("- --token-file", "- --admin-token-file"),
    ("\"--token-file\"", "\"--admin-token-file\""),
    ("INFERMESH_TOKEN_FILE", "INFERMESH_ADMIN_TOKEN_FILE"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Text files users read or that print what users read.
fn files() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let dirs = [
        "docs",
        "configs",
        "scripts",
        "agent/src",
        "cli/src",
        "client-lb/src",
        "proto/src",
        "python/infermesh",
        "python/tests",
        "tests/py",
        "tests/tests",
        "python/src",
    ];
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("md" | "rs" | "toml" | "yaml" | "json" | "sh" | "py" | "pyi")
            ) {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn one_spelling_per_concept() {
    let mut found = Vec::new();
    let files = files();
    assert!(
        files.len() > 50,
        "the walk found the sources ({})",
        files.len()
    );
    for path in files {
        if path.ends_with("tests/tests/spelling.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("still read")
                || line.contains("LEGACY")
                || line.contains("earlier spelling")
            {
                continue;
            }
            for (bad, good) in BANNED {
                if line.contains(bad) {
                    found.push(format!(
                        "{}:{}: `{bad}` (write `{good}`)",
                        path.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "other spellings:\n{}", found.join("\n"));
}
