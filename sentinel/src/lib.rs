//! The sentinel: a sans-IO state machine per worker process that turns fault
//! signals into actions.
//!
//! The agent runs one [`Sentinel`] per inference worker. It feeds in what it
//! observes as [`Event`]s — the process exiting, an output line matching one of
//! the [`FaultPatterns`] (`CUDA error`, `illegal memory access`, ...), a GPU Xid
//! classified by the GPU monitor (or a suspicion, when the Xid names no
//! process), health verdicts, liveness-probe timeouts, internal request
//! errors, the progress of its requests ([`Progress`], for the stall
//! watchdog), operator requests and timer ticks — each stamped
//! with an explicit `now`. It gets back [`Action`]s to carry out in order:
//! stop or resume routing, kill or spawn the process, advertise a new
//! [`State`], and [`Notice`]s for logs and metrics. The sentinel reads no
//! clock, does no I/O and takes its jitter from a seeded RNG, so the driver is a
//! short loop and tests replay scripted faults in virtual time.
//!
//! ```text
//!            Spawn                BecameReady
//!  start() ───────▶ Starting ─────────────────▶ Ready ⇄ Degraded   (soft faults / recovery)
//!                      ▲                         │ ▲
//!                      │                   Drain │ │ Undrain
//!                      │                         ▼ │
//!                      │                       Draining
//!                      │                         │
//!                      │      hard fault in Starting, Ready, Degraded or Draining
//!                      │                         ▼
//!                      └──── Backoff ◀──────── Failed ── Kill, wait for Exited
//!                        (skipped when the delay is zero)
//!
//!  any state ── GpuFault { severity: Quarantine } ──▶ Quarantined (terminal)
//! ```
//!
//! Policy in brief:
//!
//! - Only `Ready` and `Degraded` are routable; routing stops the moment a
//!   fault is handled and resumes only after the next `BecameReady`.
//! - A fault kills the process and waits for it to exit before respawning, so
//!   two copies never hold the same GPU.
//! - The first restart of a crash loop is immediate; later ones back off
//!   exponentially with jitter (see `backoff.rs`) until the worker stays up for
//!   the stable period. Operator restarts are immediate and not counted.
//! - A probe timeout or health failure below its threshold only degrades the
//!   worker; reaching the threshold is a fault.
//! - A drain requested while the worker is down applies when it is next ready.
//! - A worker with requests in flight that answers none for its stall window
//!   ([`StallWindow`]) is faulted (`stall`): its requests are aborted
//!   ([`Action::AbortInFlight`]) and it is restarted. A hang (probe timeouts)
//!   aborts them too.
//! - An application Xid blamed on no process makes the GPU's workers suspect
//!   for a short window: only one that then fails a request, probe or health
//!   check is restarted.
#![forbid(unsafe_code)]

mod backoff;
mod config;
mod error_window;
mod event;
mod machine;
mod patterns;
pub mod progress;
mod reason;
pub mod stall;
mod state;

pub use config::{DEFAULT_KILL_GRACE, SentinelConfig};
pub use event::{Action, Event, GpuFaultSeverity, Notice};
pub use machine::Sentinel;
pub use patterns::{FaultPatterns, PatternError};
pub use progress::{Progress, ProgressMeter};
pub use reason::FaultReason;
pub use stall::StallWindow;
pub use state::State;
