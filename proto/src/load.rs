//! The load report an agent attaches to each response's trailing metadata
//! (in the spirit of gRPC ORCA), so clients learn a node's load without extra
//! RPCs. Keys are plain ASCII metadata entries:
//!
//! | key                  | value                                         |
//! |----------------------|-----------------------------------------------|
//! | `infermesh-inflight` | requests accepted and not yet answered        |
//! | `infermesh-queued`   | requests waiting for a worker slot            |
//! | `infermesh-busy`     | share of the last 10 s with work in flight    |
//! | `infermesh-weight`   | advertised weight (the node record's)         |
//!
//! `infermesh-queue`, the earlier spelling agents before 0.2 sent, is still read.

use tonic::metadata::{MetadataMap, MetadataValue};

/// Trailer key: requests in flight at the agent.
pub const INFLIGHT_KEY: &str = "infermesh-inflight";
/// Trailer key: requests queued for a worker slot.
pub const QUEUED_KEY: &str = "infermesh-queued";
/// The earlier spelling of [`QUEUED_KEY`], still read.
pub const LEGACY_QUEUE_KEY: &str = "infermesh-queue";
/// Trailer key: busy ratio over the last 10 s, in `[0, 1]`.
pub const BUSY_KEY: &str = "infermesh-busy";
/// Trailer key: the node's advertised weight.
pub const WEIGHT_KEY: &str = "infermesh-weight";

/// One load report.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadReport {
    /// Requests accepted and not yet answered.
    pub in_flight: u64,
    /// Requests waiting for a worker slot.
    pub queued: u64,
    /// Share of the last 10 s during which at least one request was in flight.
    pub busy_ratio: f64,
    /// Advertised weight.
    pub weight: f64,
}

impl LoadReport {
    /// The `(key, value)` pairs of this report, ready for HTTP/2 trailers.
    pub fn entries(&self) -> [(&'static str, String); 4] {
        [
            (INFLIGHT_KEY, self.in_flight.to_string()),
            (QUEUED_KEY, self.queued.to_string()),
            (BUSY_KEY, format!("{:.3}", self.busy_ratio)),
            (WEIGHT_KEY, format!("{:.3}", self.weight)),
        ]
    }

    /// Writes the report into gRPC metadata.
    pub fn write_to(&self, map: &mut MetadataMap) {
        for (key, value) in self.entries() {
            if let Ok(v) = MetadataValue::try_from(value.as_str()) {
                map.insert(key, v);
            }
        }
    }

    /// Whether `map` holds an agent's load report, well-formed or not: the
    /// response or status came from an infermesh agent (which writes one
    /// into every answer), not from the connection failing under the call.
    pub fn sent_in(map: &MetadataMap) -> bool {
        [
            INFLIGHT_KEY,
            QUEUED_KEY,
            LEGACY_QUEUE_KEY,
            BUSY_KEY,
            WEIGHT_KEY,
        ]
        .iter()
        .any(|key| map.contains_key(*key))
    }

    /// Reads a report from gRPC metadata (a client merges trailers into the
    /// response metadata). `None` when the peer sent no report or a malformed
    /// one: a report from the network is never trusted to parse.
    pub fn from_metadata(map: &MetadataMap) -> Option<Self> {
        fn get<T: std::str::FromStr>(map: &MetadataMap, key: &str) -> Option<T> {
            map.get(key)?.to_str().ok()?.trim().parse().ok()
        }
        let report = LoadReport {
            in_flight: get(map, INFLIGHT_KEY)?,
            queued: get(map, QUEUED_KEY).or_else(|| get(map, LEGACY_QUEUE_KEY))?,
            busy_ratio: get(map, BUSY_KEY)?,
            weight: get(map, WEIGHT_KEY)?,
        };
        let sane = report.busy_ratio.is_finite()
            && (0.0..=1.0).contains(&report.busy_ratio)
            && report.weight.is_finite()
            && report.weight >= 0.0;
        sane.then_some(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_metadata() {
        let report = LoadReport {
            in_flight: 7,
            queued: 2,
            busy_ratio: 0.5,
            weight: 1.25,
        };
        let mut map = MetadataMap::new();
        report.write_to(&mut map);
        assert_eq!(LoadReport::from_metadata(&map), Some(report));
    }

    #[test]
    fn tells_a_report_from_none() {
        let mut map = MetadataMap::new();
        assert!(!LoadReport::sent_in(&map));
        map.insert(
            "content-type",
            MetadataValue::from_static("application/grpc"),
        );
        assert!(!LoadReport::sent_in(&map));
        map.insert(LEGACY_QUEUE_KEY, MetadataValue::from_static("junk"));
        assert!(LoadReport::sent_in(&map));
    }

    #[test]
    fn reads_the_earlier_queue_key() {
        let report = LoadReport {
            queued: 4,
            ..Default::default()
        };
        let mut map = MetadataMap::new();
        report.write_to(&mut map);
        let queued = map.remove(QUEUED_KEY).unwrap();
        map.insert(LEGACY_QUEUE_KEY, queued);
        assert_eq!(LoadReport::from_metadata(&map), Some(report));
    }

    #[test]
    fn rejects_malformed_reports() {
        let mut map = MetadataMap::new();
        LoadReport::default().write_to(&mut map);
        map.insert(BUSY_KEY, MetadataValue::from_static("NaN"));
        assert_eq!(LoadReport::from_metadata(&map), None);
        map.insert(BUSY_KEY, MetadataValue::from_static("2.0"));
        assert_eq!(LoadReport::from_metadata(&map), None);
        map.remove(BUSY_KEY);
        assert_eq!(LoadReport::from_metadata(&map), None);
    }
}
