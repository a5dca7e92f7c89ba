//! Discovery: which agents serve a service, as [`NodeRecord`]s — the
//! client's view of `infermesh-registry`'s
//! [`discovery`](infermesh_registry::discovery), re-exported so that
//! `infermesh_client::discovery::{Discovery, Membership, Source, ZkDiscovery,
//! open}` stay where callers find them.
//!
//! [`NodeRecord`]: infermesh_proto::registry::NodeRecord

pub use infermesh_registry::discovery::*;
