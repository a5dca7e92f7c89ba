//! A server process's CPU time and resident memory, from `/proc`, for the
//! attack table (CPU seconds after an attack's first second, RSS before
//! and after).

use std::time::Duration;

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// User plus system CPU time `pid` has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) / TICKS_PER_SECOND))
}

/// Resident set size of `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_time(me).is_some_and(|t| t > Duration::ZERO));
        assert!(rss_bytes(me).is_some_and(|b| b > 1 << 20));
        assert_eq!(cpu_time(u32::MAX), None);
    }
}
