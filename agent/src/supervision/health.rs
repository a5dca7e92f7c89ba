//! Running a worker's health checks (see the `infermesh-health` crate for
//! the plugins) and recording their verdicts.
//!
//! When: at worker start, after the worker answers live and ready, its
//! checks must pass before it is routed to (a restart goes through the same
//! gate); then every `health.interval` (+ up to `health.jitter`) while it
//! serves; and on demand through the admin `RunHealthChecks` RPC. A round's
//! verdicts go to the worker's sentinel as one `Health` event: consecutive
//! failed rounds degrade the worker, then restart it (`health.failures`).

use infermesh_health::{Client, Verdict};
use infermesh_sentinel::Event;

use crate::config::HealthConfig;
use crate::metrics::Metrics;
use crate::worker::state::WorkerSnapshot;

/// Whether `worker` has any check to run.
pub fn has_checks(cfg: &HealthConfig, worker: &WorkerSnapshot) -> bool {
    cfg.checks.iter().any(|c| applies(c.model(), worker))
}

fn applies(model: &str, worker: &WorkerSnapshot) -> bool {
    model.is_empty() || worker.hosts(model)
}

/// Runs every check that applies to worker `id` as `snapshot` describes it
/// (one after another, each within `cfg.timeout`), records the verdicts in
/// the metrics, and returns them (the supervisor keeps them in the log).
pub async fn run_round(
    cfg: &HealthConfig,
    id: &str,
    snapshot: &WorkerSnapshot,
    metrics: &Metrics,
    client: Client,
) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for check in cfg.checks.iter().filter(|c| applies(c.model(), snapshot)) {
        let v = infermesh_health::run_check(check.as_ref(), client.clone(), cfg.timeout).await;
        if !v.pass {
            tracing::warn!(
                worker = %id, check = %v.check, model = %v.model, reason = %v.reason,
                "health check failed"
            );
        }
        metrics.health_verdict(id, &v);
        verdicts.push(v);
    }
    verdicts
}

/// The sentinel event for a round: a pass if every check passed, otherwise
/// a failure naming the checks that failed. `None` for an empty round.
pub fn round_event(verdicts: &[Verdict]) -> Option<Event> {
    if verdicts.is_empty() {
        return None;
    }
    let failed: Vec<String> = verdicts
        .iter()
        .filter(|v| !v.pass)
        .map(|v| format!("{} on {}: {}", v.check, v.model, v.reason))
        .collect();
    Some(Event::Health {
        pass: failed.is_empty(),
        reason: failed.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn verdict(check: &str, pass: bool) -> Verdict {
        Verdict {
            check: check.into(),
            model: "dense".into(),
            pass,
            reason: if pass {
                "ok".into()
            } else {
                "NaN in OUTPUT0".into()
            },
            latency: Duration::from_millis(1),
        }
    }

    #[test]
    fn a_round_passes_only_if_every_check_passes() {
        assert_eq!(round_event(&[]), None);
        assert_eq!(
            round_event(&[verdict("live", true), verdict("finite", true)]),
            Some(Event::Health {
                pass: true,
                reason: String::new()
            })
        );
        assert_eq!(
            round_event(&[verdict("live", true), verdict("finite", false)]),
            Some(Event::Health {
                pass: false,
                reason: "finite on dense: NaN in OUTPUT0".into()
            })
        );
    }
}
