//! `infermesh-client`: the library calling services link to reach a fleet of
//! infermesh agents.
//!
//! Planned (ZooKeeper/client issue): discovery behind a trait (ZooKeeper with
//! a cache that survives an outage; `static://host:port,...` as the embedded
//! default), a sans-IO balancer (cost = peak-EWMA latency × (in-flight + 1) /
//! weight; local node first while healthy and not overloaded, otherwise
//! power-of-two-choices among remote nodes; outlier ejection; slow start),
//! retries to a different node within a budget and the caller's deadline, and
//! the transport ladder. Load reports arrive in each response's trailers
//! (`infermesh_proto::load::LoadReport`).
#![forbid(unsafe_code)]
