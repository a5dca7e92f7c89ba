//! A load step through `infermesh scale --priority search=10 --priority
//! batch=1 --gpu-budget 8`, simulated (virtual time, no sockets): two
//! services of nodes that each serve 100 requests/s (one GPU a node), their
//! busy ratio `min(1, load / (nodes × 100))`, sampled every 15 s through the
//! command's own code ([`priorities::advise`]: each service's rule with the
//! CLI's default band and windows, then the budget), and each
//! recommendation applied at the next sample (a node that boots in under
//! 15 s). Search steps from 200 to 560 requests/s at 3 min and back at 15
//! min; batch asks a steady 250.
//!
//! `cargo test -p infermesh --bin infermesh load_step -- --nocapture`
//! prints the table in BENCHMARKS.md ("Priority-based scaling").

use std::time::{Duration, Instant};

use super::NodeLoad;
use super::priorities::{self, Service, ServiceAdvice};
use super::rule::{Advice, ScaleRule, Scaler};

const CAPACITY: f64 = 100.0;
const BUDGET: u64 = 8;
const STEP: Duration = Duration::from_secs(15);

fn search_load(t: Duration) -> f64 {
    if (180..900).contains(&t.as_secs()) {
        560.0
    } else {
        200.0
    }
}

fn batch_load(_t: Duration) -> f64 {
    250.0
}

fn nodes(count: usize, load: f64) -> Vec<NodeLoad> {
    let busy = (load / (count as f64 * CAPACITY)).min(1.0);
    (0..count)
        .map(|i| NodeLoad {
            id: format!("n{i}"),
            state: "serving".into(),
            busy_ratio: Some(busy),
            in_flight: None,
            queued: None,
            gpus: 1,
        })
        .collect()
}

fn what(r: &ServiceAdvice) -> String {
    let mut s = match &r.advice {
        Advice::Hold { .. } => "hold".to_string(),
        Advice::Keep { .. } if r.gave_way.is_some() => format!("keep (wants {})", r.wants),
        Advice::Keep { .. } => "keep".to_string(),
        Advice::Up { to } => format!("UP to {to}"),
        Advice::Down { to } => format!("DOWN to {to}"),
    };
    if let Some(g) = &r.gave_way {
        let to = if g.to.is_empty() {
            "budget".to_string()
        } else {
            g.to.join(", ")
        };
        s.push_str(&format!(", gave way {} to {to}", g.nodes));
    }
    s
}

#[test]
fn load_step_the_low_priority_gives_way_first() {
    let services = [
        Service {
            name: "search".into(),
            priority: 10,
        },
        Service {
            name: "batch".into(),
            priority: 1,
        },
    ];
    // The CLI's defaults.
    let rule = ScaleRule {
        target: 0.7,
        min: 0.6,
        max: 0.8,
        up_window: Duration::from_secs(120),
        down_window: Duration::from_secs(300),
        min_nodes: 1,
    };
    let mut scalers = [Scaler::new(rule), Scaler::new(rule)];
    let mut last = [0, 0];
    let mut count = [3usize, 4usize];
    let t0 = Instant::now();
    let mut rows_out = Vec::new();
    let mut last_key = String::new();
    let mut batch_gave_way = false;
    let mut search_peak = 0;
    for k in 0..=120u32 {
        let t = STEP * k;
        let loads = [search_load(t), batch_load(t)];
        let samples = [Ok(nodes(count[0], loads[0])), Ok(nodes(count[1], loads[1]))];
        let rows = priorities::advise(
            &services,
            &mut scalers,
            &samples,
            &mut last,
            &rule,
            Some(BUDGET),
            t0 + t,
        );
        let held: u64 = rows.iter().map(|r| r.gets as u64).sum();
        let wanted: u64 = rows.iter().map(|r| r.wants as u64).sum();
        assert!(held <= BUDGET, "at {t:?}: {rows:?}");
        // The high priority never gives way while the low one holds more
        // than its floor.
        if rows[0].gave_way.is_some() {
            assert_eq!(rows[1].gets, rule.min_nodes, "at {t:?}: {rows:?}");
        }
        batch_gave_way |= rows[1].gave_way.is_some();
        let key = format!(
            "{} {} {} {}",
            what(&rows[0]),
            what(&rows[1]),
            count[0],
            count[1]
        );
        if key != last_key {
            let busy = |r: &ServiceAdvice| r.busy_ratio.map_or("-".into(), |b| format!("{b:.2}"));
            rows_out.push(format!(
                "| {}:{:02} | {:.0} | {} | {} | {} | {:.0} | {} | {} | {} | {held} of {BUDGET} (wanted {wanted}) |",
                t.as_secs() / 60,
                t.as_secs() % 60,
                loads[0],
                count[0],
                busy(&rows[0]),
                what(&rows[0]),
                loads[1],
                count[1],
                busy(&rows[1]),
                what(&rows[1]),
            ));
            last_key = key;
        }
        // The recommendations take effect by the next sample.
        count = [rows[0].gets, rows[1].gets];
        search_peak = search_peak.max(count[0]);
    }
    println!(
        "| t (min) | search req/s | search nodes | busy | search advice | batch req/s | batch nodes | busy | batch advice | GPUs held |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows_out {
        println!("{r}");
    }
    assert!(batch_gave_way, "the step made batch give way");
    assert_eq!(search_peak, 7, "search took all but batch's floor");
    // After the step search shrinks back and batch grows into the room.
    assert!(count[0] <= 3 && count[1] >= 4, "{count:?}");
}
