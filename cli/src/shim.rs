//! `infermesh worker-shim` (hidden): what the agent starts each worker
//! through, so a worker dies with the agent even when it was launched by a
//! wrapper (`/bin/sh -c '…; echo'`, the usual shape of launch scripts).
//!
//! Why a shim: `PR_SET_PDEATHSIG` set on the process the agent forks only
//! reaches *that* process. When it is a shell that forks the real server, the
//! server is re-parented to PID 1 when the agent is SIGKILLed and keeps its
//! port and GPU. The shim instead
//!
//! 1. makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every
//!    descendant orphaned below it is re-parented to it, not to PID 1;
//! 2. asks for `SIGUSR1` when the agent dies (`PR_SET_PDEATHSIG`; a signal
//!    it can catch, unlike `SIGKILL`), and checks the agent is still its
//!    parent after asking, which closes the race with an agent dying first;
//! 3. runs the worker command as its child, in the shim's own process group
//!    (the agent made the shim a group leader), so the agent's stop signals
//!    (`killpg`) reach the worker and its descendants directly, and the
//!    agent can `killpg` whatever is left if the shim itself dies;
//! 4. forwards stop signals (`SIGTERM`, `SIGINT`, `SIGQUIT`, `SIGHUP`) to the
//!    worker's group when the worker moved to a group of its own (`setsid`
//!    in a launch script), which the agent's `killpg` would miss;
//! 5. on `SIGUSR1` — the agent died, or the agent asks for a kill instead of
//!    a `SIGKILL` that would only kill the shim — sends `SIGKILL` to every
//!    process below it, repeating until no child is left (each killed
//!    process's children come back to it);
//! 6. when the worker ends, deals with what it left behind — after a stop,
//!    it waits for them (the agent escalates to `SIGUSR1` after its grace);
//!    after an exit of the worker's own, it sends them `SIGTERM` and
//!    `SIGKILL` after [`LEFTOVER_GRACE_SECS`] — then exits the way the worker
//!    did: the same exit code, or the same signal re-raised (core dumps off,
//!    so the shim does not dump its own core), so the sentinel reads the
//!    worker's exit faithfully.
//!
//! If the shim itself is SIGKILLed (say by the OOM killer), the agent sees
//! it exit and sends `SIGKILL` to its process group, which still holds the
//! worker and its in-group descendants; only processes that left the group
//! escape then. Cgroups would close that gap too, but need a delegated
//! hierarchy the agent cannot count on (docs/DECISIONS.md).
//!
//! No `unsafe`: every call is a safe `nix` wrapper, and the shim blocks the
//! signals it handles and takes them synchronously with `sigwait`, so there
//! are no signal handlers. It blocks them only after the worker has started:
//! a signal mask survives `exec` (`std::process::Command` does not reset
//! it), and a worker started with SIGTERM blocked could not be stopped
//! gracefully.

use std::ffi::OsString;
use std::process::Command;

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpgrp, getpid, getppid};

/// Arguments of `infermesh worker-shim`.
#[derive(Debug, Args)]
pub struct ShimArgs {
    /// Pid of the agent that started the shim; the shim kills the worker
    /// if it is not (or no longer) its parent.
    #[arg(long)]
    parent: i32,
    /// The worker command line: program and arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// Signals the shim passes on to the worker's process group.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGHUP,
];
/// The agent died, or asks for the worker to be killed now.
const KILL_ALL: Signal = Signal::SIGUSR1;

/// How long leftovers of a worker that exited on its own get between
/// `SIGTERM` and `SIGKILL`.
pub const LEFTOVER_GRACE_SECS: u32 = 5;

/// Exit code when the worker cannot be started (sysexits `EX_OSERR`).
const CANNOT_START: i32 = 71;

pub fn main(args: ShimArgs) -> i32 {
    let mut handled = SigSet::empty();
    for s in FORWARDED
        .iter()
        .chain(&[KILL_ALL, Signal::SIGCHLD, Signal::SIGALRM])
    {
        handled.add(*s);
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("infermesh worker-shim: cannot become a child subreaper: {e}");
        return CANNOT_START;
    }
    // The worker is started before the shim blocks the signals it takes
    // with `sigwait`: a child inherits the signal mask across exec, and a
    // worker with SIGTERM blocked could only be stopped by SIGKILL.
    let (program, rest) = args.command.split_first().expect("clap requires one");
    let child = match Command::new(program).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "infermesh worker-shim: cannot start {}: {e}",
                program.to_string_lossy()
            );
            return CANNOT_START;
        }
    };
    let worker = Pid::from_raw(child.id() as i32);
    // A stop signal arriving before this line ends the shim by its default
    // action; the agent's `killpg` has then reached the worker too.
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled), None) {
        eprintln!("infermesh worker-shim: cannot block signals: {e}");
        let _ = kill(worker, Signal::SIGKILL);
        return CANNOT_START;
    }
    // Armed after blocking, so the parent-death signal is always taken by
    // `sigwait`; an agent that died before it was armed is caught by the
    // parent check.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(KILL_ALL) {
        eprintln!("infermesh worker-shim: cannot set the parent-death signal: {e}");
        let _ = kill(worker, Signal::SIGKILL);
        return CANNOT_START;
    }
    if getppid() != Pid::from_raw(args.parent) {
        // The agent died before the parent-death signal was armed.
        let _ = kill(worker, Signal::SIGKILL);
        return CANNOT_START;
    }
    // The child is reaped with waitpid below, not through `child`.
    drop(child);
    let mut shim = Shim {
        worker,
        handled,
        stopping: false,
        killing: false,
    };
    let status = shim.wait_worker();
    shim.wait_leftovers();
    exit_like(status)
}

struct Shim {
    worker: Pid,
    handled: SigSet,
    /// A stop signal arrived: leftovers are being stopped by the agent.
    stopping: bool,
    /// Everything below the shim is being killed.
    killing: bool,
}

impl Shim {
    /// Waits for the worker to end, handling signals; returns how it ended.
    fn wait_worker(&mut self) -> WaitStatus {
        loop {
            // Reap whatever ended: the worker, or orphans re-parented to us.
            loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(s @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                        if pid == self.worker =>
                    {
                        return s;
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
            self.next_signal();
        }
    }

    /// Waits until no process is left below the shim.
    fn wait_leftovers(&mut self) {
        if !self.killing && !children_of(getpid()).is_empty() {
            if self.stopping {
                // The agent stopped the worker: its grace applies, then it
                // sends KILL_ALL.
            } else {
                for pid in children_of(getpid()) {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                nix::unistd::alarm::set(LEFTOVER_GRACE_SECS);
            }
        }
        loop {
            loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Err(Errno::ECHILD) => return,
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
            if self.killing {
                kill_children();
            }
            self.next_signal();
        }
    }

    /// Takes one signal and acts on it.
    fn next_signal(&mut self) {
        let Ok(signal) = self.handled.wait() else {
            return;
        };
        if signal == KILL_ALL || signal == Signal::SIGALRM {
            self.killing = true;
            kill_children();
        } else if FORWARDED.contains(&signal) {
            self.stopping = true;
            // The agent's killpg reached our group; pass the signal on to a
            // worker that left it.
            if let Ok(group) = getpgid(Some(self.worker)) {
                if group != getpgrp() {
                    let _ = killpg(group, signal);
                }
            }
        }
    }
}

/// Sends `SIGKILL` to every child of the shim (their children come back to
/// it as they die, and get the same on the next round).
fn kill_children() {
    for pid in children_of(getpid()) {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// Processes whose parent is `parent`, from /proc.
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command (which may contain spaces): state, ppid.
        let ppid: i32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent.as_raw()).then_some(Pid::from_raw(pid))
    })
    .collect()
}

/// Ends the shim the way the worker ended.
fn exit_like(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, signal, _) => {
            use nix::sys::resource::{Resource, setrlimit};
            let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
            // The shim installs no handlers and exec reset the agent's, so
            // every disposition is the default: unblock and raise, and the
            // shim dies of the worker's signal.
            let mut one = SigSet::empty();
            one.add(signal);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&one), None);
            let _ = kill(getpid(), signal);
            // A signal whose default is to ignore (none a worker dies of).
            128 + signal as i32
        }
        _ => CANNOT_START,
    }
}
