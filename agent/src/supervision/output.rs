//! Reading a worker's stdout or stderr as lines, whatever it writes.
//!
//! A worker's output pipe must be drained for the worker's whole life: if
//! the agent stopped reading, the worker would block once the pipe fills, and
//! if the agent closed it, the worker's next write would raise `SIGPIPE` —
//! fatal to Triton. So the reader never gives up on content:
//!
//! - it reads bytes, not UTF-8: invalid sequences become U+FFFD
//!   (`from_utf8_lossy`) and the next line reads normally;
//! - a line longer than [`MAX_LINE_BYTES`] is cut there and handed on at
//!   once with [`TRUNCATED_MARK`] appended (so a fault pattern in its first
//!   bytes is seen without waiting for the end); the rest of it, up to the
//!   next newline, is read and dropped, so memory stays bounded;
//! - a trailing `\r` is removed (CRLF output);
//! - it stops only at end of file (the worker closed the pipe or exited) or
//!   on a read error, which pipes do not produce in practice.
//!
//! Fault patterns are matched on the (possibly cut) line by the caller,
//! which logs each line at the level the worker gave it ([`level_of`]).

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Bytes of one line kept; the rest of a longer line is dropped.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Appended to a line cut at [`MAX_LINE_BYTES`].
pub const TRUNCATED_MARK: &str = " …[line truncated]";

/// Reads `reader` to its end, calling `on_line` with each line (without its
/// newline), cut to `max` bytes as the module docs describe. Returns the
/// read error that ended it, if any.
pub async fn read_lines(
    mut reader: impl AsyncBufRead + Unpin,
    max: usize,
    mut on_line: impl FnMut(&str),
) -> std::io::Result<()> {
    let mut line: Vec<u8> = Vec::new();
    // In the middle of a line that was already cut and handed on.
    let mut skipping = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            if !skipping && !line.is_empty() {
                emit(&line, false, &mut on_line);
            }
            return Ok(());
        }
        let (taken, end_of_line) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !skipping {
            let room = max - line.len();
            line.extend_from_slice(&chunk[..taken.min(room)]);
            if taken > room {
                emit(&line, true, &mut on_line);
                line.clear();
                skipping = true;
            } else if end_of_line {
                emit(&line, false, &mut on_line);
                line.clear();
            }
        }
        if end_of_line {
            skipping = false;
        }
        reader.consume(taken + usize::from(end_of_line));
    }
}

/// The level a worker gave `line`, when its format says so:
///
/// - glog, as Triton, TensorFlow and many C++ servers write:
///   `E1123 14:02:11.123456 1 server.cc:42] …` — `I`, `W`, `E` or `F`
///   (fatal, logged as error) then the month and day;
/// - a leading level word, bare, bracketed or followed by `:`, as Python's
///   `logging` (`ERROR:root:…`), vLLM (`ERROR 11-23 14:02:11 …`), Go and
///   most others write: `ERROR`, `ERR`, `FATAL`, `CRITICAL`, `WARNING`, `WARN`,
///   `INFO`, `DEBUG`, `TRACE`, in any case.
///
/// `None` for anything else (the caller logs it at info). Only the start of
/// the line is looked at: a level word later in a message says nothing.
pub fn level_of(line: &str) -> Option<tracing::Level> {
    use tracing::Level;
    let b = line.as_bytes();
    if b.len() > 6 && b[1..5].iter().all(u8::is_ascii_digit) && b[5] == b' ' {
        match b[0] {
            b'I' => return Some(Level::INFO),
            b'W' => return Some(Level::WARN),
            b'E' | b'F' => return Some(Level::ERROR),
            _ => {}
        }
    }
    let word: String = line
        .trim_start_matches('[')
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .take(9)
        .collect::<String>()
        .to_ascii_uppercase();
    let rest = line.trim_start_matches('[').get(word.len()..).unwrap_or("");
    if !(rest.is_empty() || rest.starts_with([' ', ':', ']', '\t', '|', '-'])) {
        return None;
    }
    match word.as_str() {
        "ERROR" | "ERR" | "FATAL" | "CRITICAL" => Some(Level::ERROR),
        "WARNING" | "WARN" => Some(Level::WARN),
        "INFO" => Some(Level::INFO),
        "DEBUG" => Some(Level::DEBUG),
        "TRACE" => Some(Level::TRACE),
        _ => None,
    }
}

fn emit(line: &[u8], truncated: bool, on_line: &mut impl FnMut(&str)) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if truncated {
        on_line(&format!("{text}{TRUNCATED_MARK}"));
    } else {
        on_line(&text);
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncWriteExt, BufReader};

    use super::*;

    async fn lines_of(input: &[u8], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        read_lines(BufReader::with_capacity(7, input), max, |l| {
            out.push(l.to_string())
        })
        .await
        .unwrap();
        out
    }

    #[test]
    fn levels_of_common_formats() {
        use tracing::Level;
        for (line, level) in [
            (
                "E1123 14:02:11.123456 1 server.cc:42] failed to load model",
                Some(Level::ERROR),
            ),
            ("W1123 14:02:11.1 1 x.cc:1] slow", Some(Level::WARN)),
            ("I1123 14:02:11.1 1 x.cc:1] started", Some(Level::INFO)),
            (
                "F0101 00:00:00.0 1 x.cc:1] check failed",
                Some(Level::ERROR),
            ),
            ("ERROR:root:out of memory", Some(Level::ERROR)),
            ("ERROR 11-23 14:02:11 engine.py:1] dead", Some(Level::ERROR)),
            ("[WARNING] low memory", Some(Level::WARN)),
            ("warn: deprecated flag", Some(Level::WARN)),
            ("INFO: Uvicorn running", Some(Level::INFO)),
            ("DEBUG batch=4", Some(Level::DEBUG)),
            ("CRITICAL - gone", Some(Level::ERROR)),
            ("Error", Some(Level::ERROR)),
            // Not a level at the start: info by default.
            ("Errors so far: 0", None),
            ("Information about the model", None),
            ("E11 short", None),
            ("Everything fine", None),
            ("loading model; ERROR later in the line", None),
            ("", None),
            ("É1123 14:02:11 x", None),
        ] {
            assert_eq!(level_of(line), level, "{line:?}");
        }
    }

    #[tokio::test]
    async fn plain_crlf_and_unterminated_lines() {
        assert_eq!(
            lines_of(b"one\ntwo\r\n\nlast", 64).await,
            ["one", "two", "", "last"]
        );
        assert!(lines_of(b"", 64).await.is_empty());
    }

    #[tokio::test]
    async fn invalid_utf8_is_replaced_and_reading_goes_on() {
        let lines = lines_of(b"bad \xff\xfe bytes\nCUDA error: after\n", 64).await;
        assert_eq!(lines, ["bad \u{fffd}\u{fffd} bytes", "CUDA error: after"]);
    }

    #[tokio::test]
    async fn long_lines_are_cut_marked_and_the_rest_dropped() {
        let mut input = vec![b'a'; 1 << 20];
        input.extend_from_slice(b"\nnext\n");
        input.extend_from_slice(&[b'b'; 20]);
        input.extend_from_slice(b"\n");
        let lines = lines_of(&input, 16).await;
        assert_eq!(
            lines,
            [
                format!("{}{TRUNCATED_MARK}", "a".repeat(16)),
                "next".to_string(),
                format!("{}{TRUNCATED_MARK}", "b".repeat(16)),
            ]
        );
        // Exactly `max` bytes is not cut.
        assert_eq!(lines_of(b"abcd\n", 4).await, ["abcd"]);
    }

    #[tokio::test]
    async fn a_writer_is_drained_while_it_writes() {
        // The writer's side of a small pipe: it only completes if the
        // reader keeps draining through the long line and the bad bytes.
        let (mut tx, rx) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            tx.write_all(&vec![b'x'; 1 << 20]).await.unwrap();
            tx.write_all(b"\n\xff\n").await.unwrap();
            for i in 0..1000 {
                tx.write_all(format!("line {i}\n").as_bytes())
                    .await
                    .unwrap();
            }
            tx.write_all(b"CUDA error: done\n").await.unwrap();
        });
        let mut seen = Vec::new();
        read_lines(BufReader::new(rx), MAX_LINE_BYTES, |l| {
            seen.push(l.to_string())
        })
        .await
        .unwrap();
        writer.await.unwrap();
        assert_eq!(seen.len(), 1003);
        assert!(seen[0].ends_with(TRUNCATED_MARK));
        assert_eq!(seen[0].len(), MAX_LINE_BYTES + TRUNCATED_MARK.len());
        assert_eq!(seen[1], "\u{fffd}");
        assert_eq!(seen[1002], "CUDA error: done");
    }
}
