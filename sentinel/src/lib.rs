//! The sentinel: a sans-IO state machine per worker that turns fault signals
//! into actions.
//!
//! Planned (sentinel issue): states `Starting → Ready ⇄ Degraded → Failed →
//! Backoff → Starting`, plus `Draining` and `Quarantined`. Inputs are events
//! with an explicit `now` (process exit, a fault-pattern line such as
//! `CUDA error`, a GPU Xid, a health verdict, a probe timeout, an error burst,
//! ticks); outputs are actions (stop/resume routing, kill, spawn, update the
//! advertised state). No clock reads, no I/O: the agent drives it, and tests
//! drive it over scripted faults in virtual time.
#![forbid(unsafe_code)]
