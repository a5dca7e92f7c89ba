//! Health-check plugins that verify a worker's outputs, not just its port.
//!
//! Planned (health issue): a `HealthCheck` trait (an async check against a
//! worker and model returning pass/fail, a reason and the latency) and
//! built-in plugins — `live`, `ready`, `golden` (stored request, expected
//! outputs within atol/rtol), `finite` (no NaN/Inf), `range`, `latency`, and
//! `exec` (the business owner's own command). Verdicts feed the sentinel.
#![forbid(unsafe_code)]
