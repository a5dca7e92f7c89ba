//! The one place outside `gpu/` and `rdma/` with `unsafe`: asking the kernel
//! to kill a worker when the agent dies.
//!
//! `Command::pre_exec` is `unsafe` because the closure runs between `fork`
//! and `exec`, where only async-signal-safe calls are allowed. `prctl` is a
//! plain system call, so this closure is sound.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked exits. The agent
//! spawns workers from tokio's worker threads, which live as long as the
//! runtime, i.e. as long as the agent.
#![allow(unsafe_code)]

use tokio::process::Command;

/// Makes the child receive SIGKILL when this process dies.
pub fn kill_child_when_parent_dies(cmd: &mut Command) {
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe, and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}
