//! Checking a worker's stall watchdog settings (`stall_window`,
//! `stall_floor` in `[[workers]]`) and the GPU's suspect window.

use std::time::Duration;

use infermesh_sentinel::StallWindow;
use infermesh_sentinel::stall::DEFAULT_FLOOR;

/// Default time an unattributed application Xid holds its GPU's workers
/// suspect.
pub const DEFAULT_SUSPECT_WINDOW: Duration = Duration::from_secs(10);

/// Shortest window or floor accepted: below the watchdog's own period
/// (250 ms) it would only measure that.
const MIN_WINDOW: Duration = Duration::from_millis(500);
/// Longest window or floor accepted.
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The watchdog of worker `at`: `window` is `"auto"` (default), `"off"` or
/// a duration such as `"30s"`; `floor` only goes with `auto`.
pub fn stall_window(
    at: &str,
    window: Option<&str>,
    floor: Option<Duration>,
    problems: &mut Vec<String>,
) -> StallWindow {
    let in_range = |d: Duration| (MIN_WINDOW..=MAX_WINDOW).contains(&d);
    let window = match window.unwrap_or("auto") {
        "auto" => {
            let floor = floor.unwrap_or(DEFAULT_FLOOR);
            if !in_range(floor) {
                problems.push(format!(
                    "{at}: stall_floor {floor:?} must be between {MIN_WINDOW:?} and 24h"
                ));
            }
            return StallWindow::Auto { floor };
        }
        "off" => StallWindow::Off,
        text => match humantime::parse_duration(text) {
            Ok(d) if in_range(d) => StallWindow::Fixed(d),
            Ok(d) => {
                problems.push(format!(
                    "{at}: stall_window {d:?} must be between {MIN_WINDOW:?} and 24h"
                ));
                StallWindow::Off
            }
            Err(_) => {
                problems.push(format!(
                    "{at}: stall_window '{}' is not \"auto\", \"off\" or a duration like \"30s\"",
                    text.escape_debug()
                ));
                StallWindow::Off
            }
        },
    };
    if floor.is_some() {
        problems.push(format!(
            "{at}: stall_floor only applies to stall_window = \"auto\""
        ));
    }
    window
}

/// `[gpu] suspect_window`: between 1 s and 10 min.
pub fn suspect_window(value: Option<Duration>, problems: &mut Vec<String>) -> Duration {
    let window = value.unwrap_or(DEFAULT_SUSPECT_WINDOW);
    if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&window) {
        problems.push(format!(
            "gpu.suspect_window: {window:?} must be between 1s and 10m"
        ));
    }
    window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(window: Option<&str>, floor: Option<Duration>) -> (StallWindow, Vec<String>) {
        let mut problems = Vec::new();
        let w = stall_window("workers[0] (w0)", window, floor, &mut problems);
        (w, problems)
    }

    #[test]
    fn auto_by_default_with_its_floor() {
        assert_eq!(
            check(None, None),
            (
                StallWindow::Auto {
                    floor: DEFAULT_FLOOR
                },
                vec![]
            )
        );
        let floor = Duration::from_secs(30);
        assert_eq!(
            check(Some("auto"), Some(floor)),
            (StallWindow::Auto { floor }, vec![])
        );
        assert_eq!(check(Some("off"), None), (StallWindow::Off, vec![]));
        assert_eq!(
            check(Some("2m"), None),
            (StallWindow::Fixed(Duration::from_secs(120)), vec![])
        );
    }

    #[test]
    fn every_problem_is_named() {
        for (window, floor, expected) in [
            (Some("soon"), None, "is not \"auto\", \"off\" or a duration"),
            (Some("10ms"), None, "must be between"),
            (Some("1000h"), None, "must be between"),
            (
                None,
                Some(Duration::ZERO),
                "stall_floor 0ns must be between",
            ),
            (Some("off"), Some(Duration::from_secs(5)), "only applies"),
            (Some("30s"), Some(Duration::from_secs(5)), "only applies"),
        ] {
            let (_, problems) = check(window, floor);
            assert_eq!(problems.len(), 1, "{window:?} {floor:?}: {problems:?}");
            assert!(problems[0].starts_with("workers[0] (w0): "), "{problems:?}");
            assert!(problems[0].contains(expected), "{problems:?}");
        }
    }

    #[test]
    fn the_suspect_window_is_bounded() {
        let mut problems = Vec::new();
        assert_eq!(suspect_window(None, &mut problems), DEFAULT_SUSPECT_WINDOW);
        suspect_window(Some(Duration::from_millis(10)), &mut problems);
        suspect_window(Some(Duration::from_secs(3600)), &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn the_whole_config_reports_them_with_the_worker_named() {
        let raw = crate::config::RawConfig::from_toml(
            r#"
[gpu]
suspect_window = "1h"
[[workers]]
id = "fast"
command = "x"
stall_window = "soon"
[[workers]]
command = "y"
stall_window = "off"
stall_floor = "3s"
[[workers]]
command = "z"
stall_window = "90s"
"#,
        )
        .unwrap();
        let err = crate::config::AgentConfig::from_raw(raw).unwrap_err();
        let problems = err.0.join("\n");
        assert_eq!(err.0.len(), 3, "{problems}");
        assert!(problems.contains("gpu.suspect_window"), "{problems}");
        assert!(
            problems.contains("workers[0] (fast): stall_window 'soon'"),
            "{problems}"
        );
        assert!(
            problems.contains("workers[1] (w1): stall_floor only applies"),
            "{problems}"
        );
        let ok = crate::config::RawConfig::from_toml(
            "[[workers]]\ncommand = \"z\"\nstall_window = \"90s\"\n",
        )
        .unwrap();
        let cfg = crate::config::AgentConfig::from_raw(ok).unwrap();
        assert_eq!(
            cfg.workers[0].stall,
            StallWindow::Fixed(Duration::from_secs(90))
        );
        assert_eq!(cfg.suspect_window, DEFAULT_SUSPECT_WINDOW);
    }
}
