//! The scaling rule of one service (WPAI's): with `y` the mean busy ratio
//! of the serving nodes and `N` their count, recommend `ceil(y / target ×
//! N)` — up once `y` has stayed above `max` for `up_window`, down once it
//! has stayed below `min` for `down_window`, never below `min_nodes`, and
//! *hold* (recommend nothing) while any node's figure is missing. Sans-IO:
//! each sample comes with its time.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The scaling rule's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRule {
    /// Busy ratio aimed for.
    pub target: f64,
    /// Lower edge of the band.
    pub min: f64,
    /// Upper edge of the band.
    pub max: f64,
    /// Time above `max` before scaling up.
    pub up_window: Duration,
    /// Time below `min` before scaling down.
    pub down_window: Duration,
    /// Floor.
    pub min_nodes: usize,
}

/// What the rule says.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase", tag = "advice")]
pub enum Advice {
    /// Missing data: recommend nothing.
    Hold {
        /// Why.
        reason: String,
    },
    /// Within the band, or outside it for less than its window.
    Keep {
        /// Why.
        reason: String,
    },
    /// Grow to `to` nodes.
    Up {
        /// Recommended count.
        to: usize,
    },
    /// Shrink to `to` nodes.
    Down {
        /// Recommended count.
        to: usize,
    },
}

/// The rule with its memory of how long the busy ratio has been out of band.
#[derive(Debug)]
pub struct Scaler {
    rule: ScaleRule,
    above_since: Option<Instant>,
    below_since: Option<Instant>,
}

impl Scaler {
    /// A rule with no history.
    pub fn new(rule: ScaleRule) -> Self {
        Self {
            rule,
            above_since: None,
            below_since: None,
        }
    }

    /// The formula alone: `ceil(busy / target × nodes)`, at least `min_nodes`.
    pub fn formula(&self, nodes: usize, busy: f64) -> usize {
        let want = (busy / self.rule.target * nodes as f64).ceil();
        (want.max(0.0) as usize).max(self.rule.min_nodes)
    }

    /// One sample: the busy ratio of each serving node (`None` where it is
    /// unknown) at `now`.
    pub fn observe(&mut self, now: Instant, busy: &[Option<f64>]) -> Advice {
        let known: Option<Vec<f64>> = busy.iter().copied().collect();
        let Some(known) = known.filter(|k| !k.is_empty()) else {
            self.above_since = None;
            self.below_since = None;
            return Advice::Hold {
                reason: if busy.is_empty() {
                    "no serving node".into()
                } else {
                    "a node's busy ratio is missing".into()
                },
            };
        };
        let n = known.len();
        let y = known.iter().sum::<f64>() / n as f64;
        let r = self.rule;
        if y > r.max {
            self.below_since = None;
            let since = *self.above_since.get_or_insert(now);
            let held = now.saturating_duration_since(since);
            if held >= r.up_window {
                return Advice::Up {
                    to: self.formula(n, y).max(n + 1),
                };
            }
            return Advice::Keep {
                reason: format!(
                    "busy {y:.2} above {:.2} for {}s of {}s",
                    r.max,
                    held.as_secs(),
                    r.up_window.as_secs()
                ),
            };
        }
        self.above_since = None;
        if y < r.min {
            let since = *self.below_since.get_or_insert(now);
            let held = now.saturating_duration_since(since);
            let to = self.formula(n, y);
            if held >= r.down_window && to < n {
                return Advice::Down { to };
            }
            return Advice::Keep {
                reason: if to >= n {
                    format!(
                        "busy {y:.2} below {:.2}, but {n} nodes are what the formula asks for \
                         (floor {})",
                        r.min, r.min_nodes
                    )
                } else {
                    format!(
                        "busy {y:.2} below {:.2} for {}s of {}s",
                        r.min,
                        held.as_secs(),
                        r.down_window.as_secs()
                    )
                },
            };
        }
        self.below_since = None;
        Advice::Keep {
            reason: format!("busy {y:.2} within {:.2}-{:.2}", r.min, r.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> ScaleRule {
        ScaleRule {
            target: 0.7,
            min: 0.6,
            max: 0.8,
            up_window: Duration::from_secs(120),
            down_window: Duration::from_secs(300),
            min_nodes: 2,
        }
    }

    #[test]
    fn up_only_after_the_window_and_by_the_formula() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let hot = [Some(0.95); 4];
        assert!(matches!(s.observe(t0, &hot), Advice::Keep { .. }));
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(119), &hot),
            Advice::Keep { .. }
        ));
        // ceil(0.95 / 0.7 × 4) = 6.
        assert_eq!(
            s.observe(t0 + Duration::from_secs(120), &hot),
            Advice::Up { to: 6 }
        );
        // Back in band: the clock restarts.
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(121), &[Some(0.7); 4]),
            Advice::Keep { .. }
        ));
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(122), &hot),
            Advice::Keep { .. }
        ));
    }

    #[test]
    fn down_after_its_longer_window_and_never_below_the_floor() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let cold = [Some(0.2); 6];
        assert!(matches!(s.observe(t0, &cold), Advice::Keep { .. }));
        // ceil(0.2 / 0.7 × 6) = 2.
        assert_eq!(
            s.observe(t0 + Duration::from_secs(300), &cold),
            Advice::Down { to: 2 }
        );
        // At the floor already: keep.
        let mut s = Scaler::new(rule());
        let two = [Some(0.05); 2];
        s.observe(t0, &two);
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(600), &two),
            Advice::Keep { .. }
        ));
    }

    #[test]
    fn missing_data_holds_and_resets_the_windows() {
        let t0 = Instant::now();
        let mut s = Scaler::new(rule());
        let hot = [Some(0.95); 2];
        s.observe(t0, &hot);
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(60), &[Some(0.95), None]),
            Advice::Hold { .. }
        ));
        assert!(matches!(s.observe(t0, &[]), Advice::Hold { .. }));
        // The hot spell restarts after the gap.
        assert!(matches!(
            s.observe(t0 + Duration::from_secs(130), &hot),
            Advice::Keep { .. }
        ));
        assert_eq!(
            s.observe(t0 + Duration::from_secs(250), &hot),
            Advice::Up { to: 3 }
        );
    }
}
