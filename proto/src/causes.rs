//! An error and its causes as one line, each cause said once.
//!
//! Error types that wrap another often repeat it in their own message
//! (hyper's "tcp connect error" wraps an error that reads "tcp connect
//! error"); joining a source chain naively then says a cause twice:
//! "tcp connect error: tcp connect error: Connection refused". [`causes`]
//! skips a message already said.

use std::error::Error;

/// Most causes followed: chains are short, and a cycle must not hang.
const MAX_CAUSES: usize = 16;

/// `error`'s message followed by each cause's (`": "`-separated), leaving
/// out a message already contained in what was said.
pub fn causes(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    for _ in 0..MAX_CAUSES {
        let Some(e) = cause else { break };
        append(&mut line, &e.to_string());
        cause = e.source();
    }
    line
}

/// Appends `cause` to `line` unless `line` already says it.
pub fn append(line: &mut String, cause: &str) {
    if cause.is_empty() || line.contains(cause) {
        return;
    }
    if line.is_empty() {
        line.push_str(cause);
    } else {
        line.push_str(": ");
        line.push_str(cause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(&'static str, Option<Box<Wrap>>);

    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// Finding (issue 27): `status 127.0.0.1:9999` printed "tcp connect
    /// error: tcp connect error: Connection refused".
    #[test]
    fn each_cause_is_said_once() {
        let e = Wrap(
            "transport error",
            Some(Box::new(Wrap(
                "tcp connect error",
                Some(Box::new(Wrap(
                    "tcp connect error",
                    Some(Box::new(Wrap("Connection refused (os error 111)", None))),
                ))),
            ))),
        );
        assert_eq!(
            causes(&e),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
    }
}
