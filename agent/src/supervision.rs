//! Keeping workers alive and trustworthy: one supervisor per worker
//! driving its sentinel ([`supervisor`]) and probing it from a thread of
//! its own ([`prober`]), starting processes ([`launch`]'s
//! seam, [`spawn`], [`pdeathsig`], [`output`]), health checks
//! ([`health`]), GPU fault events and slices ([`gpu`]), and the capacity
//! task ([`capacity_task`]).

pub mod capacity_task;
pub mod gpu;
pub mod health;
pub mod launch;
pub mod output;
pub mod pdeathsig;
pub mod prober;
pub mod spawn;
pub mod supervisor;
