//! Each worker's adaptive concurrency limit and what it learned
//! ([`crate::worker::concurrency`]), refreshed from the pool at scrape time:
//!
//! - `infermesh_worker_concurrency_limit{worker}`: permits it has now (1
//!   while a probe measures its unloaded latency);
//! - `infermesh_worker_concurrency{worker}`: requests it serves at once;
//! - `infermesh_worker_unloaded_latency_seconds{worker}`: its latency with
//!   nothing else in flight;
//! - `infermesh_worker_capacity{worker}`: the quotient, requests per second
//!   (what `weight = "auto"` sums).
//!
//! The last three have no series until measured.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;
use crate::dispatch::pool::{Pool, WorkerLimit};

type F64Gauge = Gauge<f64, AtomicU64>;

/// The families of this file.
pub(super) struct WorkerLimitMetrics {
    limit: Family<Labels, Gauge>,
    concurrency: Family<Labels, F64Gauge>,
    unloaded: Family<Labels, F64Gauge>,
    capacity: Family<Labels, F64Gauge>,
}

impl WorkerLimitMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            limit: Family::default(),
            concurrency: Family::default(),
            unloaded: Family::default(),
            capacity: Family::default(),
        };
        registry.register(
            "worker_concurrency_limit",
            "Requests the agent sends each worker at once now: its adaptive limit (1 while a probe measures its unloaded latency), at most max_inflight",
            m.limit.clone(),
        );
        registry.register(
            "worker_concurrency",
            "Requests each worker serves at once, as learned from its latencies (or its ModelConfig until measured)",
            m.concurrency.clone(),
        );
        registry.register(
            "worker_unloaded_latency_seconds",
            "Each worker's latency with no other request in flight",
            m.unloaded.clone(),
        );
        registry.register(
            "worker_capacity",
            "Requests per second each worker can serve: concurrency / unloaded latency",
            m.capacity.clone(),
        );
        m
    }

    pub(super) fn refresh(&self, pool: &Pool) {
        for (w, l) in pool.workers().iter().zip(pool.worker_limits()) {
            self.record(w.id(), &l);
        }
    }

    pub(super) fn record(&self, worker: &str, l: &WorkerLimit) {
        let labels = vec![("worker", worker.to_string())];
        self.limit.get_or_create(&labels).set(l.limit as i64);
        if let Some(c) = l.concurrency {
            self.concurrency.get_or_create(&labels).set(c);
        }
        if let Some(u) = l.unloaded {
            self.unloaded.get_or_create(&labels).set(u.as_secs_f64());
        }
        if let Some(c) = l.capacity {
            self.capacity.get_or_create(&labels).set(c);
        }
    }
}
