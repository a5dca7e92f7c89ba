//! Each tenant's share of the dispatch ([`crate::dispatch::tenant`]): counts kept by
//! the pool's book and copied at scrape time, and the latency of its
//! served requests, recorded as they are answered.
//!
//! - `infermesh_tenant_admitted_total{tenant}`: requests given a worker slot;
//! - `infermesh_tenant_shed_total{tenant,reason}`: requests refused
//!   RESOURCE_EXHAUSTED — `queue_full` (its model's queue was full),
//!   `evicted` (it waited, and a request of a higher `priority` took its
//!   place), `rate` (beyond the tenant's `rate`);
//! - `infermesh_tenant_queued{tenant}`, `infermesh_tenant_inflight{tenant}`:
//!   now;
//! - `infermesh_tenant_request_duration_seconds{tenant}`: arrival to response
//!   of its requests answered OK (its p99:
//!   `histogram_quantile(0.99, rate(infermesh_tenant_request_duration_seconds_bucket[1m]))`).
//!   Buckets grow by 1.5× (100 µs .. ~60 s), finer than the per-model
//!   histogram's 2×, so the p99 that PromQL interpolates is within a
//!   bucket's width of the truth.
//!
//! Every tenant's series exist from the first scrape, at zero.

use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Labels;
use crate::dispatch::pool::Pool;
use crate::dispatch::tenant::{ShedReason, Tenants};

/// The families of this file.
pub(super) struct TenantMetrics {
    tenants: Tenants,
    admitted: Family<Labels, Counter>,
    shed: Family<Labels, Counter>,
    queued: Family<Labels, Gauge>,
    in_flight: Family<Labels, Gauge>,
    latency: Family<Labels, Histogram>,
    /// One refresh at a time: counters advance by what the book counted
    /// since the last one.
    refreshing: Mutex<()>,
}

fn labels(tenant: &str) -> Labels {
    vec![("tenant", tenant.to_string())]
}

impl TenantMetrics {
    pub(super) fn register(registry: &mut Registry, tenants: Tenants) -> Self {
        let m = Self {
            tenants,
            admitted: Family::default(),
            shed: Family::default(),
            queued: Family::default(),
            in_flight: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_1, 1.5, 34))
            }),
            refreshing: Mutex::new(()),
        };
        registry.register(
            "tenant_admitted",
            "Requests given a worker slot, by tenant",
            m.admitted.clone(),
        );
        registry.register(
            "tenant_shed",
            "Requests refused RESOURCE_EXHAUSTED, by tenant and reason: queue_full (its model's queue was full), evicted (a request of higher priority took its place in the queue), rate (beyond the tenant's rate)",
            m.shed.clone(),
        );
        registry.register(
            "tenant_queued",
            "Requests waiting for a worker slot, by tenant",
            m.queued.clone(),
        );
        registry.register(
            "tenant_inflight",
            "Worker slots held, by tenant",
            m.in_flight.clone(),
        );
        registry.register(
            "tenant_request_duration_seconds",
            "Time from arrival to response of requests answered OK, by tenant",
            m.latency.clone(),
        );
        m
    }

    /// The latency histogram of the tenant owning `model`.
    pub(super) fn latency_of(&self, model: &str) -> Histogram {
        let name = &self.tenants.spec(self.tenants.of(model)).name;
        self.latency.get_or_create(&labels(name)).clone()
    }

    /// Copies the pool's counts.
    pub(super) fn refresh(&self, pool: &Pool) {
        let _one = self
            .refreshing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, stats) in pool.tenant_stats() {
            let l = labels(&name);
            let admitted = self.admitted.get_or_create(&l);
            admitted.inc_by(stats.admitted.saturating_sub(admitted.get()));
            for (reason, n) in ShedReason::ALL.iter().zip(stats.shed) {
                let mut l = l.clone();
                l.push(("reason", reason.as_str().to_string()));
                let shed = self.shed.get_or_create(&l);
                shed.inc_by(n.saturating_sub(shed.get()));
            }
            self.queued.get_or_create(&l).set(stats.queued as i64);
            self.in_flight.get_or_create(&l).set(stats.in_flight as i64);
            drop(self.latency.get_or_create(&l));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Metrics;
    use crate::config::TenantSpec;
    use crate::dispatch::pool::Pool;
    use crate::dispatch::tenant::Tenants;
    use crate::worker::state::Worker;

    fn tenant(name: &str, model: &str, priority: u32, rate: Option<f64>) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            models: vec![model.into()],
            priority,
            share: 0.5,
            rate,
            default_request_priority: crate::dispatch::tenant::DEFAULT_REQUEST_PRIORITY,
        }
    }

    /// Admitted, shed (by reason), in flight and the latency of served
    /// requests, per tenant; a second scrape counts nothing twice.
    #[tokio::test(start_paused = true)]
    async fn each_tenants_counts_and_latency_are_exported() {
        let mut spec = crate::testing::spec("w0");
        spec.models = vec!["hi".into(), "lo".into()];
        let (w, driver) = Worker::new(spec, 0);
        let tenants = Tenants::new(vec![
            tenant("high", "hi", 1, None),
            tenant("low", "lo", 20, Some(1.0)),
        ]);
        let pool = Pool::with_tenants(vec![w], 1.0, 1, tenants.clone());
        crate::testing::publish_routable(&pool, &driver, 0, true);
        let metrics = Metrics::with_tenants(tenants);
        let (hi, lo) = (
            pool.models().id("hi").unwrap(),
            pool.models().id("lo").unwrap(),
        );
        let held = pool.acquire(lo, None, None).await.unwrap();
        let refused = pool.acquire(lo, None, None).await.unwrap_err();
        assert!(matches!(
            refused,
            crate::error::AgentError::RateLimited { .. }
        ));
        metrics
            .model(Some(hi), pool.models())
            .request(tonic::Code::Ok, Duration::from_millis(3));
        metrics
            .model(Some(lo), pool.models())
            .request(tonic::Code::ResourceExhausted, Duration::ZERO);
        for _ in 0..2 {
            let text = metrics.render(&pool);
            for line in [
                "infermesh_tenant_admitted_total{tenant=\"low\"} 1",
                "infermesh_tenant_admitted_total{tenant=\"high\"} 0",
                "infermesh_tenant_shed_total{tenant=\"low\",reason=\"rate\"} 1",
                "infermesh_tenant_shed_total{tenant=\"low\",reason=\"queue_full\"} 0",
                "infermesh_tenant_inflight{tenant=\"low\"} 1",
                "infermesh_tenant_queued{tenant=\"default\"} 0",
                "infermesh_tenant_request_duration_seconds_count{tenant=\"high\"} 1",
                "infermesh_tenant_request_duration_seconds_count{tenant=\"low\"} 0",
            ] {
                assert!(text.lines().any(|l| l == line), "no '{line}' in\n{text}");
            }
        }
        drop(held);
    }
}
