//! Which worker a pid belongs to, from `/proc`, behind a narrow trait.
//!
//! The driver blames an Xid on a pid that is often a thread (PyTorch's
//! CUDA work runs off the main thread), and NVML lists the processes that
//! hold GPU memory; neither knows about workers. A worker is the process
//! tree under the process the agent started (the `infermesh worker-shim`,
//! or the worker itself without a shim), which leads its own process
//! group. So a pid maps to a worker by:
//!
//! 1. its thread-group id (`Tgid:` in `/proc/<pid>/status`): the process;
//! 2. walking that process's ancestors (`PPid:`) to a worker's root pid;
//! 3. failing that (a descendant re-parented to init after its parent
//!    died), its process group (`/proc/<pid>/stat`) being a worker's.
//!
//! When the driver also printed the command name, it must match the
//! thread's (`/proc/<pid>/comm`), so a pid from another pid namespace (an
//! agent without `hostPID` sees its own numbers, the kernel logs the
//! host's) or a pid reused since is not blamed on the wrong worker.
//!
//! [`Procfs`] reads the real `/proc`; tests use [`FakeProcTable`].

use std::collections::HashMap;
use std::path::PathBuf;

/// Ancestors walked at most (a process tree deeper than this is not a
/// worker's).
const MAX_DEPTH: usize = 64;

/// Length of a task's command name in `/proc/<pid>/comm` (TASK_COMM_LEN
/// less the NUL): longer names are cut there.
const COMM_LEN: usize = 15;

/// What the agent needs to know about a process or thread.
pub trait ProcTable: Send + Sync + 'static {
    /// The thread group (process) of `pid`, which may be a thread.
    fn tgid(&self, pid: u32) -> Option<u32>;
    /// The parent process of process `pid`.
    fn parent(&self, pid: u32) -> Option<u32>;
    /// The process group of process `pid`.
    fn pgid(&self, pid: u32) -> Option<u32>;
    /// The command name of task `pid`.
    fn comm(&self, pid: u32) -> Option<String>;
}

/// The worker (by position in `roots`, a list of `(worker index, root
/// pid)`) whose process tree holds `pid`, if any. `name`, when the driver
/// gave one, must match the task's command name.
pub fn owner(
    table: &dyn ProcTable,
    roots: &[(usize, u32)],
    pid: u32,
    name: Option<&str>,
) -> Result<Option<usize>, Mismatch> {
    let Some(tgid) = table.tgid(pid) else {
        return Ok(None);
    };
    if let (Some(expected), Some(actual)) = (name, table.comm(pid)) {
        if !same_comm(expected, &actual) {
            return Err(Mismatch {
                pid,
                logged: expected.to_string(),
                found: actual,
            });
        }
    }
    let root_of = |p: u32| roots.iter().find(|&&(_, r)| r == p).map(|&(w, _)| w);
    let mut p = tgid;
    for _ in 0..MAX_DEPTH {
        if let Some(worker) = root_of(p) {
            return Ok(Some(worker));
        }
        match table.parent(p) {
            Some(parent) if parent > 1 && parent != p => p = parent,
            _ => break,
        }
    }
    Ok(table.pgid(tgid).and_then(root_of))
}

/// The driver named a process whose command name is not that pid's now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pid {pid} is '{found}' here but the driver logged '{logged}' (another pid namespace, or the pid was reused)"
)]
pub struct Mismatch {
    /// The pid.
    pub pid: u32,
    /// The name in the log line.
    pub logged: String,
    /// The name `/proc` gives.
    pub found: String,
}

fn same_comm(logged: &str, found: &str) -> bool {
    let cut = |s: &str| s.bytes().take(COMM_LEN).collect::<Vec<u8>>();
    cut(logged) == cut(found)
}

/// The real `/proc`.
#[derive(Debug, Clone)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Procfs {
    fn status_field(&self, pid: u32, field: &str) -> Option<u32> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl ProcTable for Procfs {
    fn tgid(&self, pid: u32) -> Option<u32> {
        self.status_field(pid, "Tgid:")
    }

    fn parent(&self, pid: u32) -> Option<u32> {
        self.status_field(pid, "PPid:")
    }

    fn pgid(&self, pid: u32) -> Option<u32> {
        let stat = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and ')'.
        let after = &stat[stat.rfind(')')? + 1..];
        after.split_whitespace().nth(2)?.parse().ok()
    }

    fn comm(&self, pid: u32) -> Option<String> {
        let comm = std::fs::read_to_string(self.root.join(pid.to_string()).join("comm")).ok()?;
        Some(comm.trim_end_matches('\n').to_string())
    }
}

/// A process table a test writes.
#[derive(Debug, Clone, Default)]
pub struct FakeProcTable {
    /// pid → (tgid, parent, pgid, comm), for threads and processes.
    tasks: HashMap<u32, (u32, u32, u32, String)>,
}

impl FakeProcTable {
    /// Adds process `pid` (its own thread group) under `parent`, in process
    /// group `pgid`, named `comm`.
    pub fn process(mut self, pid: u32, parent: u32, pgid: u32, comm: &str) -> Self {
        self.tasks.insert(pid, (pid, parent, pgid, comm.into()));
        self
    }

    /// Adds thread `tid` of process `tgid`, named `comm`.
    pub fn thread(mut self, tid: u32, tgid: u32, comm: &str) -> Self {
        let (_, parent, pgid, _) = self.tasks.get(&tgid).cloned().unwrap_or_default();
        self.tasks.insert(tid, (tgid, parent, pgid, comm.into()));
        self
    }
}

impl ProcTable for FakeProcTable {
    fn tgid(&self, pid: u32) -> Option<u32> {
        self.tasks.get(&pid).map(|t| t.0)
    }

    fn parent(&self, pid: u32) -> Option<u32> {
        self.tasks.get(&pid).map(|t| t.1)
    }

    fn pgid(&self, pid: u32) -> Option<u32> {
        self.tasks.get(&pid).map(|t| t.2)
    }

    fn comm(&self, pid: u32) -> Option<String> {
        self.tasks.get(&pid).map(|t| t.3.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two workers under the agent (pid 10): w0's shim 100 runs python 101
    /// with thread 105 and a child 102; w1's shim 200 runs python 201. Pid
    /// 300 is someone else's, 150 left w0's tree but kept its group.
    fn table() -> FakeProcTable {
        FakeProcTable::default()
            .process(10, 1, 10, "infermesh")
            .process(100, 10, 100, "infermesh")
            .process(101, 100, 100, "python3")
            .thread(105, 101, "python3")
            .process(102, 101, 100, "pt_data_worker")
            .process(150, 1, 100, "orphan")
            .process(200, 10, 200, "infermesh")
            .process(201, 200, 200, "python3")
            .process(300, 1, 300, "python3")
    }

    const ROOTS: &[(usize, u32)] = &[(0, 100), (1, 200)];

    #[test]
    fn threads_children_and_regrouped_orphans_belong_to_their_worker() {
        let t = table();
        assert_eq!(owner(&t, ROOTS, 105, Some("python3")), Ok(Some(0)));
        assert_eq!(owner(&t, ROOTS, 101, None), Ok(Some(0)));
        assert_eq!(owner(&t, ROOTS, 102, None), Ok(Some(0)));
        assert_eq!(owner(&t, ROOTS, 150, None), Ok(Some(0)));
        assert_eq!(owner(&t, ROOTS, 201, Some("python3")), Ok(Some(1)));
        assert_eq!(owner(&t, ROOTS, 100, None), Ok(Some(0)));
    }

    #[test]
    fn other_processes_and_gone_pids_belong_to_nobody() {
        let t = table();
        assert_eq!(owner(&t, ROOTS, 300, Some("python3")), Ok(None));
        assert_eq!(owner(&t, ROOTS, 10, None), Ok(None), "the agent itself");
        assert_eq!(owner(&t, ROOTS, 9999, Some("python3")), Ok(None));
    }

    #[test]
    fn a_name_that_does_not_match_blames_nobody() {
        let err = owner(&table(), ROOTS, 105, Some("java")).unwrap_err();
        assert_eq!(err.found, "python3");
        // The kernel cuts names at 15 bytes; so does the comparison.
        let t = FakeProcTable::default()
            .process(100, 1, 100, "infermesh")
            .process(101, 100, 100, "tritonserver_lo");
        assert_eq!(
            owner(&t, ROOTS, 101, Some("tritonserver_long")),
            Ok(Some(0))
        );
    }

    #[test]
    fn a_loop_in_the_table_ends() {
        let t = FakeProcTable::default()
            .process(5, 6, 5, "a")
            .process(6, 5, 6, "b");
        assert_eq!(owner(&t, ROOTS, 5, None), Ok(None));
    }

    #[test]
    fn the_real_proc_knows_this_process_and_its_threads() {
        let procfs = Procfs::default();
        let me = std::process::id();
        assert_eq!(procfs.tgid(me), Some(me));
        let parent = procfs.parent(me).unwrap();
        assert!(parent >= 1);
        assert!(procfs.pgid(me).is_some());
        let comm = procfs.comm(me).unwrap();
        assert!(!comm.is_empty() && comm.len() <= COMM_LEN, "{comm}");
        // A thread of this process maps to it, while it lives.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok());
            tid_tx.send(tid).unwrap();
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().unwrap().unwrap();
        assert_ne!(tid, me);
        assert_eq!(procfs.tgid(tid), Some(me));
        assert_eq!(owner(&procfs, &[(7, me)], tid, None), Ok(Some(7)));
        done_tx.send(()).unwrap();
        thread.join().unwrap();
        assert_eq!(procfs.tgid(u32::MAX), None);
    }
}
