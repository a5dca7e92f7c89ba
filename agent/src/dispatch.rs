//! Who serves a request: admission and per-worker permits with per-model
//! queues ([`pool`]), tenants' shares and priorities ([`tenant`]), live
//! capacity ([`capacity`], sans-IO), the interned model names ([`models`])
//! and the busy ratio ([`busy`]).

pub mod busy;
pub mod capacity;
pub mod models;
pub mod pool;
pub mod tenant;
