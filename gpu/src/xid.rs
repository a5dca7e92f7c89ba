//! What to do about an Xid: the policy table and a sans-IO classifier.
//!
//! Xids are error reports from the NVIDIA driver. The default policy follows
//! NVIDIA's Xid catalog ("Xid Errors" in the GPU deployment and management
//! documentation): an error confined to one CUDA context costs the worker
//! its process, while an error that leaves the GPU itself unusable until a
//! reset or reboot quarantines the GPU (the sentinel stops restarting its
//! workers, drains the node and alerts).
//!
//! | Xid | meaning | default action |
//! |---|---|---|
//! | 13 | Graphics Engine Exception: a fault in a kernel, usually the application's (out-of-range access, illegal instruction) | restart worker |
//! | 31 | GPU memory page fault: the application touched an invalid address | restart worker |
//! | 43 | GPU stopped processing: the driver reset the faulting channel; other contexts are unaffected | restart worker |
//! | 45 | Preemptive cleanup, due to previous errors: the driver tore down a context, usually after the process died | restart worker |
//! | 48 | Double-bit ECC error: uncorrectable memory error | quarantine GPU |
//! | 63 | ECC page retirement or row remapping recorded: informational; takes effect after the next reset | ignore |
//! | 64 | ECC page retirement or row remapper recording failure: the bad memory could not be fenced off | quarantine GPU |
//! | 68 | NVDEC0 exception: video decoder fault in the application's stream | restart worker |
//! | 69 | Graphics Engine class error: the application issued an invalid command | restart worker |
//! | 74 | NVLink error: link fault between GPUs; collectives across it are unreliable | quarantine GPU |
//! | 79 | GPU has fallen off the bus: the device no longer answers on PCIe | quarantine GPU |
//! | 92 | High single-bit ECC error rate: corrected, but memory may be degrading | quarantine above rate |
//! | 94 | Contained ECC error: only the contexts using that memory were killed; the GPU stays usable | restart worker |
//! | 95 | Uncontained ECC error: every context on the GPU is affected | quarantine GPU |
//! | 109 | Context switch timeout: the GPU could not preempt a context; state is suspect | quarantine GPU |
//! | 119 | GSP RPC timeout: the GPU System Processor stopped answering the driver | quarantine GPU |
//! | 120 | GSP error: the GPU System Processor firmware faulted | quarantine GPU |
//!
//! "Quarantine above rate" counts events per (GPU, Xid) and quarantines once
//! `rate_count` of them fall within `rate_window` (default 3 within 60 s);
//! fewer are only logged. Codes not in the table take the policy's `unknown`
//! action (default: log) and are counted, so a new driver's Xids show up in
//! metrics instead of passing silently. A double-bit ECC event
//! ([`crate::GpuEventKind::EccDoubleBit`]) is classified as Xid 48.
//!
//! The classifier reads no clock: the agent passes `now`, so tests drive it
//! in virtual time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Xid 48, double-bit ECC error; also the code for
/// [`crate::GpuEventKind::EccDoubleBit`] events.
pub const XID_DOUBLE_BIT_ECC: u32 = 48;

/// Xid 79, GPU has fallen off the bus; also reported by the NVML backend when
/// a device stops answering.
pub const XID_FALLEN_OFF_BUS: u32 = 79;

/// What the policy says to do about one Xid code (the configurable form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidAction {
    /// The error is the worker's: restart the worker on the same GPU.
    RestartWorker,
    /// The GPU needs a reset or reboot: quarantine it.
    QuarantineGpu,
    /// Log, but quarantine once the policy's rate limit is reached.
    QuarantineAboveRate,
    /// Log and count only.
    Ignore,
}

/// What to do about one Xid event, after rate limiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidVerdict {
    /// Restart the worker running on the GPU.
    RestartWorker,
    /// Quarantine the GPU and drain what runs on it.
    QuarantineGpu,
    /// Log the event; no action.
    LogOnly,
}

use XidAction::{Ignore, QuarantineAboveRate, QuarantineGpu, RestartWorker};

const DEFAULT_TABLE: &[(u32, XidAction, &str)] = &[
    (13, RestartWorker, "Graphics Engine Exception"),
    (31, RestartWorker, "GPU memory page fault"),
    (43, RestartWorker, "GPU stopped processing"),
    (
        45,
        RestartWorker,
        "Preemptive cleanup, due to previous errors",
    ),
    (48, QuarantineGpu, "Double-bit ECC error"),
    (
        63,
        Ignore,
        "ECC page retirement or row remapping recording event",
    ),
    (
        64,
        QuarantineGpu,
        "ECC page retirement or row remapper recording failure",
    ),
    (68, RestartWorker, "NVDEC0 exception"),
    (69, RestartWorker, "Graphics Engine class error"),
    (74, QuarantineGpu, "NVLink error"),
    (79, QuarantineGpu, "GPU has fallen off the bus"),
    (92, QuarantineAboveRate, "High single-bit ECC error rate"),
    (94, RestartWorker, "Contained ECC error"),
    (95, QuarantineGpu, "Uncontained ECC error"),
    (109, QuarantineGpu, "Context switch timeout"),
    (119, QuarantineGpu, "GSP RPC timeout"),
    (120, QuarantineGpu, "GSP error"),
];

/// The Xid policy: an action per known code, one for unknown codes, and the
/// rate limit behind [`XidAction::QuarantineAboveRate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    table: BTreeMap<u32, XidAction>,
    unknown: XidAction,
    rate_count: u32,
    rate_window: Duration,
}

impl XidPolicy {
    /// The built-in table: `(code, action, short description)`, by code.
    pub fn default_table() -> &'static [(u32, XidAction, &'static str)] {
        DEFAULT_TABLE
    }

    /// The default table with `overrides` applied (they may add codes),
    /// `unknown` for codes in neither, and quarantine-above-rate triggering at
    /// `rate_count` events (at least 1) within `rate_window`.
    pub fn new(
        overrides: &[(u32, XidAction)],
        unknown: XidAction,
        rate_count: u32,
        rate_window: Duration,
    ) -> Self {
        let mut table: BTreeMap<u32, XidAction> = DEFAULT_TABLE
            .iter()
            .map(|&(code, action, _)| (code, action))
            .collect();
        table.extend(overrides.iter().copied());
        Self {
            table,
            unknown,
            rate_count: rate_count.max(1),
            rate_window,
        }
    }

    /// The action for `code`; `None` when the policy does not know it.
    pub fn action(&self, code: u32) -> Option<XidAction> {
        self.table.get(&code).copied()
    }

    /// Whether `code` restarts a worker (its own or, for unknown codes, the
    /// policy's `unknown` action): an application Xid, which the driver
    /// blames on one process.
    pub fn restarts_worker(&self, code: u32) -> bool {
        self.action(code).unwrap_or(self.unknown) == RestartWorker
    }

    /// The action taken for codes the policy does not know.
    pub fn unknown_action(&self) -> XidAction {
        self.unknown
    }

    /// The built-in short description of `code`, for logs.
    pub fn describe(code: u32) -> Option<&'static str> {
        DEFAULT_TABLE
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, _, description)| *description)
    }
}

impl Default for XidPolicy {
    /// The default table; unknown codes are logged and counted; quarantine
    /// above rate at 3 events within 60 s.
    fn default() -> Self {
        Self::new(&[], Ignore, 3, Duration::from_secs(60))
    }
}

/// Turns Xid events into verdicts under an [`XidPolicy`].
///
/// Sans-IO: remembers recent event times per (GPU, code) for the rate rule and
/// counts unknown codes; time comes from the caller.
#[derive(Debug, Clone)]
pub struct XidClassifier {
    policy: XidPolicy,
    recent: HashMap<(u32, u32), VecDeque<Instant>>,
    unknown: u64,
}

impl XidClassifier {
    /// A classifier with no history.
    pub fn new(policy: XidPolicy) -> Self {
        Self {
            policy,
            recent: HashMap::new(),
            unknown: 0,
        }
    }

    /// The verdict for Xid `code` seen on GPU `gpu` at `now`.
    pub fn classify(&mut self, now: Instant, gpu: u32, code: u32) -> XidVerdict {
        let action = self.policy.action(code).unwrap_or_else(|| {
            self.unknown += 1;
            self.policy.unknown
        });
        match action {
            RestartWorker => XidVerdict::RestartWorker,
            QuarantineGpu => XidVerdict::QuarantineGpu,
            Ignore => XidVerdict::LogOnly,
            QuarantineAboveRate if self.rate_reached(now, gpu, code) => XidVerdict::QuarantineGpu,
            QuarantineAboveRate => XidVerdict::LogOnly,
        }
    }

    /// How many events with codes the policy does not know were classified.
    pub fn unknown_count(&self) -> u64 {
        self.unknown
    }

    /// The policy in force.
    pub fn policy(&self) -> &XidPolicy {
        &self.policy
    }

    /// Records an event at `now`; true when `rate_count` events of this
    /// (GPU, code), this one included, fall within the window.
    fn rate_reached(&mut self, now: Instant, gpu: u32, code: u32) -> bool {
        let limit = self.policy.rate_count as usize;
        let window = self.policy.rate_window;
        let times = self.recent.entry((gpu, code)).or_default();
        while times
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= window)
        {
            times.pop_front();
        }
        times.push_back(now);
        while times.len() > limit {
            times.pop_front();
        }
        times.len() >= limit
    }
}

#[cfg(test)]
mod tests {
    use serde::de::IntoDeserializer;
    use serde::de::value::{Error, StrDeserializer};

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn default_table_follows_the_catalog() {
        let policy = XidPolicy::default();
        assert_eq!(policy.action(31), Some(RestartWorker));
        assert_eq!(policy.action(13), Some(RestartWorker));
        assert_eq!(policy.action(94), Some(RestartWorker));
        assert_eq!(policy.action(79), Some(QuarantineGpu));
        assert_eq!(policy.action(48), Some(QuarantineGpu));
        assert_eq!(policy.action(120), Some(QuarantineGpu));
        assert_eq!(policy.action(92), Some(QuarantineAboveRate));
        assert_eq!(policy.action(63), Some(Ignore));
        assert_eq!(policy.action(12345), None);
        assert!(policy.restarts_worker(43) && !policy.restarts_worker(79));
        assert!(!policy.restarts_worker(12345));
        assert_eq!(XidPolicy::describe(79), Some("GPU has fallen off the bus"));
    }

    #[test]
    fn default_table_is_sorted_without_duplicates() {
        let table = XidPolicy::default_table();
        assert!(table.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn verdicts_for_restart_and_quarantine_codes() {
        let mut xid = XidClassifier::new(XidPolicy::default());
        let now = Instant::now();
        assert_eq!(xid.classify(now, 0, 31), XidVerdict::RestartWorker);
        assert_eq!(xid.classify(now, 0, 79), XidVerdict::QuarantineGpu);
        assert_eq!(xid.classify(now, 0, 63), XidVerdict::LogOnly);
        assert_eq!(xid.unknown_count(), 0);
    }

    #[test]
    fn double_bit_ecc_event_classifies_as_xid_48() {
        let mut xid = XidClassifier::new(XidPolicy::default());
        let code = crate::GpuEventKind::EccDoubleBit.xid();
        assert_eq!(code, 48);
        assert_eq!(
            xid.classify(Instant::now(), 0, code),
            XidVerdict::QuarantineGpu
        );
    }

    #[test]
    fn rate_rule_logs_below_and_quarantines_at_the_limit() {
        let mut xid = XidClassifier::new(XidPolicy::default());
        let t0 = Instant::now();
        assert_eq!(xid.classify(t0, 0, 92), XidVerdict::LogOnly);
        assert_eq!(xid.classify(t0 + secs(20), 0, 92), XidVerdict::LogOnly);
        // Another GPU has its own count.
        assert_eq!(xid.classify(t0 + secs(30), 1, 92), XidVerdict::LogOnly);
        assert_eq!(
            xid.classify(t0 + secs(40), 0, 92),
            XidVerdict::QuarantineGpu
        );
    }

    #[test]
    fn rate_rule_forgets_events_outside_the_window() {
        let mut xid = XidClassifier::new(XidPolicy::default());
        let t0 = Instant::now();
        for minute in 0..10 {
            // Two events 40 s apart every 80 s: never three within 60 s.
            let t = t0 + secs(minute * 80);
            assert_eq!(xid.classify(t, 0, 92), XidVerdict::LogOnly);
            assert_eq!(xid.classify(t + secs(40), 0, 92), XidVerdict::LogOnly);
        }
    }

    #[test]
    fn unknown_codes_are_counted_and_take_the_unknown_action() {
        let mut xid = XidClassifier::new(XidPolicy::default());
        let now = Instant::now();
        assert_eq!(xid.classify(now, 0, 999), XidVerdict::LogOnly);
        assert_eq!(xid.classify(now, 1, 4242), XidVerdict::LogOnly);
        assert_eq!(xid.unknown_count(), 2);

        let strict = XidPolicy::new(&[], QuarantineGpu, 3, secs(60));
        let mut xid = XidClassifier::new(strict);
        assert_eq!(xid.classify(now, 0, 4242), XidVerdict::QuarantineGpu);
        assert_eq!(xid.unknown_count(), 1);
    }

    #[test]
    fn overrides_take_effect() {
        let policy = XidPolicy::new(
            &[
                (13, Ignore),
                (31, QuarantineGpu),
                (150, RestartWorker),
                (92, QuarantineAboveRate),
            ],
            Ignore,
            1,
            secs(10),
        );
        assert_eq!(policy.action(150), Some(RestartWorker));
        let mut xid = XidClassifier::new(policy);
        let now = Instant::now();
        assert_eq!(xid.classify(now, 0, 13), XidVerdict::LogOnly);
        assert_eq!(xid.classify(now, 0, 31), XidVerdict::QuarantineGpu);
        assert_eq!(xid.classify(now, 0, 150), XidVerdict::RestartWorker);
        assert_eq!(xid.classify(now, 0, 79), XidVerdict::QuarantineGpu);
        // A rate of one: the first event quarantines.
        assert_eq!(xid.classify(now, 0, 92), XidVerdict::QuarantineGpu);
        assert_eq!(xid.unknown_count(), 0);
    }

    #[test]
    fn actions_deserialize_in_snake_case() {
        let parse = |s: &'static str| {
            let de: StrDeserializer<'_, Error> = s.into_deserializer();
            XidAction::deserialize(de)
        };
        assert_eq!(parse("restart_worker").unwrap(), RestartWorker);
        assert_eq!(parse("quarantine_gpu").unwrap(), QuarantineGpu);
        assert_eq!(parse("quarantine_above_rate").unwrap(), QuarantineAboveRate);
        assert_eq!(parse("ignore").unwrap(), Ignore);
        assert!(parse("reboot").is_err());
    }
}
