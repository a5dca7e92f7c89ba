//! The live view: a per-node table redrawn every second, with a log of
//! events above it. In a terminal the table is redrawn in place (cursor up,
//! clear) and log lines scroll above it; otherwise each second appends one
//! block, so CI logs and tests read it line by line.

use std::io::{IsTerminal, Write};

/// One node's line of the table.
pub struct Row {
    /// Node name.
    pub name: &'static str,
    /// `local` or `remote`.
    pub role: &'static str,
    /// Requests it answered in the last second.
    pub rps: f64,
    /// Its share of the last second's requests.
    pub share: f64,
    /// p99 latency of its answers in the last second (client side).
    pub p99_ms: Option<f64>,
    /// Worker states from the agent's admin Status.
    pub workers: String,
    /// Worker restarts since the agent started.
    pub restarts: u64,
    /// Attempts on this node that failed (the client retried them elsewhere).
    pub errors: u64,
    /// Fault injected into the node, if any.
    pub fault: String,
}

/// Where the view goes.
pub struct Screen {
    tty: bool,
    /// Lines of the table last drawn (to move up over it).
    drawn: usize,
}

impl Screen {
    /// Redraws in place when its stream (stdout, stderr under `--json`)
    /// is a terminal.
    pub fn new() -> Self {
        Screen {
            tty: if crate::say::stdout_is_json() {
                std::io::stderr().is_terminal()
            } else {
                std::io::stdout().is_terminal()
            },
            drawn: 0,
        }
    }

    /// Prints `log` lines, then the table.
    pub fn frame(&mut self, log: &[String], header: &str, rows: &[Row]) {
        let mut out = String::new();
        if self.tty && self.drawn > 0 {
            // Up to the first line of the old table, clear to the end of the screen.
            out.push_str(&format!("\x1b[{}F\x1b[J", self.drawn));
        }
        for line in log {
            out.push_str(line);
            out.push('\n');
        }
        let table = render(header, rows);
        self.drawn = table.lines().count();
        out.push_str(&table);
        if !self.tty {
            out.push('\n');
        }
        let mut human = crate::say::human();
        let _ = human.write_all(out.as_bytes());
        let _ = human.flush();
    }

    /// Prints lines below the table (the table is no longer redrawn over them).
    pub fn finish(&mut self) {
        self.drawn = 0;
    }
}

/// The table as text, one line per node under a header, under 100 columns.
pub fn render(header: &str, rows: &[Row]) -> String {
    let mut s = format!("{header}\n");
    s.push_str(&format!(
        "  {:<7} {:<6} {:>7} {:>6} {:>7}  {:<20} {:>8} {:>6}  {}\n",
        "node",
        "role",
        "req/s",
        "share",
        "p99 ms",
        "workers (agent)",
        "restarts",
        "errors",
        "fault"
    ));
    for r in rows {
        let p99 = r.p99_ms.map_or("-".to_string(), |p| format!("{p:.2}"));
        s.push_str(&format!(
            "  {:<7} {:<6} {:>7.0} {:>5.1}% {:>7}  {:<20} {:>8} {:>6}  {}\n",
            r.name,
            r.role,
            r.rps,
            r.share * 100.0,
            p99,
            truncate(&r.workers, 20),
            r.restarts,
            r.errors,
            r.fault
        ));
    }
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_fits_in_100_columns() {
        let row = Row {
            name: "node-a",
            role: "remote",
            rps: 123_456.0,
            share: 1.0,
            p99_ms: Some(12_345.678),
            workers: "starting backoff failed ready".into(),
            restarts: 12_345,
            errors: 123_456,
            fault: "cuda-crash".into(),
        };
        let text = render("header", &[row]);
        for line in text.lines() {
            assert!(
                line.chars().count() <= 100,
                "{} columns: {line}",
                line.len()
            );
        }
        assert_eq!(text.lines().count(), 3);
    }
}
