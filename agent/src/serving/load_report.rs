//! The load report on every gRPC response of the OIP port.
//!
//! The report ([`LoadReport`]: inflight, queued, busy ratio, weight) goes
//! into the trailers of a normal response, or into the headers of a
//! "trailers-only" error response. It is taken when the response ends, so
//! in flight, queued and weight reflect the load after this request; the
//! busy ratio (and the ORCA report below) come from a snapshot at most
//! 100 ms old ([`Pool::report`]). Values are formatted without allocating.
//!
//! Beside it, unless `[transport] orca = false`, the standard ORCA report
//! (`endpoint-load-metrics-bin`: an xds `OrcaLoadReport`), which gRPC's and
//! Envoy's client-side weighted round robin read: `application_utilization`
//! = busy ratio, `rps_fractional` = requests completed per second over the
//! last 10 s, and `named_metrics` `inflight`, `queued`, `busy`, `weight`.

use http::{HeaderMap, HeaderName, HeaderValue};
use infermesh_proto::load::{BUSY_KEY, INFLIGHT_KEY, LoadReport, QUEUED_KEY, WEIGHT_KEY};

use crate::dispatch::pool::Pool;

/// The names every response of the agent carries: the worker's content
/// type and status, and the load report the agent adds. Its HTTP/2 server
/// puts them in each client's HPACK table once (`Settings::response_names`).
pub const RESPONSE_NAMES: &[&str] = &[
    "content-type",
    "grpc-status",
    INFLIGHT_KEY,
    QUEUED_KEY,
    BUSY_KEY,
    WEIGHT_KEY,
    ORCA_KEY,
];

/// Writes `report` into `map` (trailers, or the headers of a trailers-only
/// response).
///
/// HPACK: the agent's encoder (`infermesh_http2::hpack::Indexer`) adds the
/// report's names to the client's table with the first response of a
/// connection and refers to them by index after, with values as plain
/// literals (no Huffman coding), or the whole field by index when the
/// value is the one in the table. (Under `h2`'s server, whose encoder
/// Huffman-coded every literal a byte at a time, never-indexed report
/// values were the largest single cost of a pass-through response;
/// BENCHMARKS.md.) None of the values is marked sensitive.
pub fn write_report(report: &LoadReport, map: &mut HeaderMap) {
    // Names made once (no parsing per response), numbers formatted with
    // `itoa` into a stack buffer (no `fmt` machinery). Consecutive
    // responses mostly carry the same figures (busy ratio and weight come
    // from a snapshot, in flight and queued change with load), so each
    // field's last value is kept per thread, keyed by the figure itself,
    // and cloned (a reference count) instead of formatted and copied.
    const INFLIGHT: HeaderName = HeaderName::from_static(INFLIGHT_KEY);
    const QUEUED: HeaderName = HeaderName::from_static(QUEUED_KEY);
    const BUSY: HeaderName = HeaderName::from_static(BUSY_KEY);
    const WEIGHT: HeaderName = HeaderName::from_static(WEIGHT_KEY);
    type Last = [Option<(u64, HeaderValue)>; 4];
    thread_local! {
        static LAST: std::cell::RefCell<Last> = const { std::cell::RefCell::new([None, None, None, None]) };
    }
    LAST.with_borrow_mut(|last| {
        let mut put =
            |slot: usize, key: HeaderName, figure: u64, text: &dyn Fn(&mut [u8; 48]) -> &[u8]| {
                let value = match &last[slot] {
                    Some((f, v)) if *f == figure => v.clone(),
                    _ => {
                        let mut buf = [0u8; 48];
                        let Ok(v) = HeaderValue::from_bytes(text(&mut buf)) else {
                            return;
                        };
                        last[slot] = Some((figure, v.clone()));
                        v
                    }
                };
                map.insert(key, value);
            };
        put(0, INFLIGHT, report.in_flight, &|buf| {
            integer(report.in_flight, buf)
        });
        put(1, QUEUED, report.queued, &|buf| integer(report.queued, buf));
        let busy = report.busy_ratio;
        put(2, BUSY, busy.to_bits(), &|buf| fixed3(busy, buf));
        let weight = report.weight;
        put(3, WEIGHT, weight.to_bits(), &|buf| fixed3(weight, buf));
    });
}

/// `n` in decimal, into `buf`.
fn integer(n: u64, buf: &mut [u8; 48]) -> &[u8] {
    let mut b = itoa::Buffer::new();
    let digits = b.format(n).as_bytes();
    buf[..digits.len()].copy_from_slice(digits);
    &buf[..digits.len()]
}

/// `x` with three decimals (`12.345`), as `{:.3}` would write it for the
/// finite, non-negative values of a report; into `buf`.
fn fixed3(x: f64, buf: &mut [u8; 48]) -> &[u8] {
    let (whole, thousandths) = milli(x);
    let mut n = itoa::Buffer::new();
    let digits = n.format(whole).as_bytes();
    let len = digits.len();
    buf[..len].copy_from_slice(digits);
    buf[len] = b'.';
    buf[len + 1] = b'0' + (thousandths / 100) as u8;
    buf[len + 2] = b'0' + (thousandths / 10 % 10) as u8;
    buf[len + 3] = b'0' + (thousandths % 10) as u8;
    &buf[..len + 4]
}

/// `x` (finite, non-negative) rounded to thousandths, as whole and
/// thousandths: formatting `{:.3}` takes std's slow exact path per response.
fn milli(x: f64) -> (u64, u64) {
    let m = if x.is_finite() && x > 0.0 {
        (x * 1000.0).round().min(u64::MAX as f64) as u64
    } else {
        0
    };
    (m / 1000, m % 1000)
}

/// Adds the pool's current report to `map`: the `infermesh-*` trailers
/// and, unless turned off, the ORCA report, which is the pool's snapshot
/// whole (at most `REPORT_REFRESH`, 100 ms, old, and of the current weight;
/// see [`Pool::report`]).
pub fn add_report(pool: &Pool, map: &mut HeaderMap) {
    let report = pool.report();
    write_report(&report.load, map);
    if pool.orca() {
        write_orca(&report.snapshot, report.rps, map);
    }
}

/// The ORCA trailer's name.
pub const ORCA_KEY: &str = "endpoint-load-metrics-bin";

/// Writes `report` as an xds `OrcaLoadReport` (protobuf, base64 without
/// padding as gRPC's `-bin` metadata is sent) into `map`. Encoded by hand
/// into a stack buffer: field numbers from
/// `xds/data/orca/v3/orca_load_report.proto`.
pub fn write_orca(report: &LoadReport, rps: f64, map: &mut HeaderMap) {
    // Made once, as the report's names are (see `write_report`).
    const ORCA: HeaderName = HeaderName::from_static(ORCA_KEY);
    // The value comes from a snapshot renewed at most every 100 ms, so
    // most responses carry the same one: it is encoded when the figures
    // change and cloned otherwise (a reference count). Kept per thread and
    // keyed by the figures themselves, so it cannot go stale.
    thread_local! {
        static LAST: std::cell::RefCell<Option<(LoadReport, u64, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    let value = LAST.with_borrow_mut(|last| match last {
        Some((r, bits, v)) if r == report && *bits == rps.to_bits() => Some(v.clone()),
        _ => {
            let v = encode_orca(report, rps)?;
            *last = Some((*report, rps.to_bits(), v.clone()));
            Some(v)
        }
    });
    if let Some(v) = value {
        map.insert(ORCA, v);
    }
}

/// The ORCA trailer's value for `report` and `rps`.
fn encode_orca(report: &LoadReport, rps: f64) -> Option<HeaderValue> {
    use base64::Engine as _;
    const APPLICATION_UTILIZATION: u8 = 9;
    const RPS_FRACTIONAL: u8 = 6;
    const NAMED_METRICS: u8 = 8;
    const FIXED64: u8 = 1;
    const LEN: u8 = 2;
    let mut buf = [0u8; 128];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        buf[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    let double = |field: u8, v: f64, put: &mut dyn FnMut(&[u8])| {
        put(&[(field << 3) | FIXED64]);
        put(&v.to_le_bytes());
    };
    double(APPLICATION_UTILIZATION, report.busy_ratio, &mut put);
    double(RPS_FRACTIONAL, rps, &mut put);
    for (name, value) in [
        ("inflight", report.in_flight as f64),
        ("queued", report.queued as f64),
        ("busy", report.busy_ratio),
        ("weight", report.weight),
    ] {
        // A map entry: key (field 1, string) and value (field 2, double).
        let entry_len = 2 + name.len() + 9;
        put(&[(NAMED_METRICS << 3) | LEN, entry_len as u8]);
        put(&[(1 << 3) | LEN, name.len() as u8]);
        put(name.as_bytes());
        double(2, value, &mut put);
    }
    let mut text = [0u8; 172];
    let len = base64::engine::general_purpose::STANDARD_NO_PAD
        .encode_slice(&buf[..n], &mut text)
        .expect("128 bytes fit in 172 base64 characters");
    HeaderValue::from_bytes(&text[..len]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_formatting_matches_three_decimals() {
        for x in [
            0.0, 0.0004, 0.0005, 0.25, 0.9995, 1.0, 2.5, 123.4567, 44370.809, 1e15,
        ] {
            let (w, t) = milli(x);
            assert_eq!(format!("{w}.{t:03}"), format!("{x:.3}"), "{x}");
            let mut buf = [0u8; 48];
            assert_eq!(fixed3(x, &mut buf), format!("{x:.3}").as_bytes(), "{x}");
        }
        let mut buf = [0u8; 48];
        assert_eq!(fixed3(f64::INFINITY, &mut buf), b"0.000");
        assert_eq!(milli(f64::NAN), (0, 0));
    }

    /// Every report reads back as written, whether its fields were
    /// formatted or taken from the values kept from the report before.
    #[test]
    fn report_round_trips_through_metadata() {
        let first = LoadReport {
            in_flight: 3,
            queued: 1,
            busy_ratio: 0.25,
            weight: 2.5,
        };
        let busier = LoadReport {
            in_flight: 4,
            busy_ratio: 0.5,
            ..first
        };
        let heavier = LoadReport {
            weight: 7.0,
            ..busier
        };
        for report in [first, first, busier, heavier, first] {
            let mut map = HeaderMap::new();
            write_report(&report, &mut map);
            let md = tonic::metadata::MetadataMap::from_headers(map);
            assert_eq!(LoadReport::from_metadata(&md), Some(report));
        }
    }
}

#[cfg(test)]
mod orca_tests {
    use super::*;

    /// Field numbers as in xds `orca_load_report.proto`.
    #[derive(Clone, PartialEq, prost::Message)]
    struct OrcaLoadReport {
        #[prost(double, tag = "6")]
        rps_fractional: f64,
        #[prost(map = "string, double", tag = "8")]
        named_metrics: std::collections::HashMap<String, f64>,
        #[prost(double, tag = "9")]
        application_utilization: f64,
    }

    #[test]
    fn the_orca_report_decodes_as_an_orca_load_report() {
        use base64::Engine as _;
        use prost::Message as _;
        let report = LoadReport {
            in_flight: 3,
            queued: 12,
            busy_ratio: 0.25,
            weight: 2.5,
        };
        let mut map = HeaderMap::new();
        write_orca(&report, 1234.5, &mut map);
        let text = map.get(ORCA_KEY).expect("the ORCA trailer");
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(text.as_bytes())
            .unwrap();
        let orca = OrcaLoadReport::decode(&bytes[..]).unwrap();
        assert_eq!(orca.rps_fractional, 1234.5);
        assert_eq!(orca.application_utilization, 0.25);
        assert_eq!(orca.named_metrics["inflight"], 3.0);
        assert_eq!(orca.named_metrics["queued"], 12.0);
        assert_eq!(orca.named_metrics["busy"], 0.25);
        assert_eq!(orca.named_metrics["weight"], 2.5);
    }
}
