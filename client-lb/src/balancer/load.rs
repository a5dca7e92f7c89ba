//! Load reports: what an agent says about its own load in each response's
//! trailers, and how much of it the balancer believes.
//!
//! The client's own in-flight count only covers its own requests; the agent's
//! report adds everyone else's. The report is a snapshot, so it is used only
//! while fresh (`load_report_ttl`), after which the node's load falls back to
//! what the client sees itself and its weight to the advertised one.

use std::time::{Duration, Instant};

/// One agent's load report, as carried in trailers
/// (`infermesh_proto::load::LoadReport` on the wire).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadReport {
    /// Requests the agent has accepted and not yet answered, from all clients.
    /// The agent counts a request from admission, so queued requests are
    /// included.
    pub in_flight: u64,
    /// Requests waiting for a worker slot, from all clients.
    pub queued: u64,
    /// Share of the agent's recent past with work in flight. Not used by the
    /// cost, which has the counts.
    pub busy_ratio: f64,
    /// The node's current weight (capacity × share of workers ready); zero
    /// while no worker is ready.
    pub weight: f64,
}

/// The latest report from a node, reduced to what the cost uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LatestReport {
    at: Instant,
    /// Requests at the node that are not this client's.
    others: u64,
    weight: f64,
}

impl LatestReport {
    /// Reduces `report`, received at `at` while this client had `own` requests
    /// in flight to the node. The driver should pass the report after the
    /// `on_response` of the response that carried it, so that `own` no longer
    /// counts that finished request, as the agent no longer does.
    pub(crate) fn new(at: Instant, report: LoadReport, own: u64) -> Self {
        // Queued requests are part of the agent's in-flight count; take the
        // larger in case an agent counts only those being served.
        let total = report.in_flight.max(report.queued);
        Self {
            at,
            others: total.saturating_sub(own),
            weight: report.weight,
        }
    }

    fn is_fresh(&self, now: Instant, ttl: Duration) -> bool {
        now.saturating_duration_since(self.at) <= ttl
    }

    /// Other clients' requests at the node, if the report is fresh.
    pub(crate) fn others(&self, now: Instant, ttl: Duration) -> Option<u64> {
        self.is_fresh(now, ttl).then_some(self.others)
    }

    /// The reported weight, if the report is fresh.
    pub(crate) fn weight(&self, now: Instant, ttl: Duration) -> Option<f64> {
        self.is_fresh(now, ttl).then_some(self.weight)
    }

    /// The reported weight, fresh or not.
    pub(crate) fn weight_at_any_age(&self) -> f64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(5);

    fn report(in_flight: u64, queued: u64, weight: f64) -> LoadReport {
        LoadReport {
            in_flight,
            queued,
            busy_ratio: 0.5,
            weight,
        }
    }

    #[test]
    fn others_exclude_this_clients_requests() {
        let t0 = Instant::now();
        let r = LatestReport::new(t0, report(10, 4, 2.0), 3);
        assert_eq!(r.others(t0, TTL), Some(7));
        let r = LatestReport::new(t0, report(2, 0, 2.0), 3);
        assert_eq!(r.others(t0, TTL), Some(0));
    }

    #[test]
    fn stale_reports_are_ignored() {
        let t0 = Instant::now();
        let r = LatestReport::new(t0, report(10, 0, 3.0), 0);
        assert_eq!(r.weight(t0 + TTL, TTL), Some(3.0));
        assert_eq!(r.weight(t0 + TTL + Duration::from_nanos(1), TTL), None);
        assert_eq!(r.others(t0 + 2 * TTL, TTL), None);
    }
}
