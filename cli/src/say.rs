//! Where a command's text for people goes. With `--json`, stdout carries
//! the JSON document and nothing else (scripts parse it), so everything a
//! command says to a person goes to stderr; without `--json`, to stdout.
//! Errors go to stderr either way.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// Declares that this command prints JSON on stdout (its `--json`).
pub fn json_on_stdout(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// Whether stdout is reserved for JSON.
pub fn stdout_is_json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// The stream text for people goes to.
pub fn human() -> Box<dyn Write> {
    if stdout_is_json() {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

/// `println!` for text meant for people: stderr under `--json`.
macro_rules! say {
    ($($arg:tt)*) => {
        if $crate::say::stdout_is_json() {
            eprintln!($($arg)*)
        } else {
            println!($($arg)*)
        }
    };
}
pub(crate) use say;
