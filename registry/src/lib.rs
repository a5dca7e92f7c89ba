//! `infermesh-registry`: all of infermesh's ZooKeeper code, both sides of it.
//!
//! - [`publish`]: an agent keeps its ephemeral [`NodeRecord`] in the registry
//!   (created once it has something to serve, rewritten when it changes,
//!   re-created after a session expiry, `draining` then deleted on shutdown);
//! - [`discovery`]: a client follows a service's records and publishes
//!   [`discovery::Membership`] snapshots — one persistent recursive watch,
//!   re-established on every new session and after every reconnect, an
//!   incremental cache (a change to one node reads that node only), the last
//!   good membership kept through an outage.
//!
//! Both reconnect through [`Reconnect`]: `infermesh-backoff`'s
//! [`BackoffPolicy`] with equal jitter, so agents and clients that lost the
//! same ZooKeeper do not come back in lockstep.
//!
//! The record itself ([`NodeRecord`], its JSON, validation and compatibility
//! rule) lives in `infermesh-proto` so that tools can read it without
//! ZooKeeper.
//!
//! [`NodeRecord`]: infermesh_proto::registry::NodeRecord
#![forbid(unsafe_code)]

pub mod discovery;
pub mod publish;
mod reconnect;

pub use infermesh_backoff::BackoffPolicy;
pub use reconnect::{RECONNECT, Reconnect};
