//! The load report on every gRPC response of the OIP port, and the one body
//! type the port answers with.
//!
//! The report ([`LoadReport`]: in-flight, queue, busy ratio, weight) goes
//! into the trailers of a normal response, or into the headers of a
//! "trailers-only" error response. It is taken when the response ends, so
//! it reflects the load after this request. Values are formatted without
//! allocating.

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use infermesh_proto::load::{BUSY_KEY, INFLIGHT_KEY, LoadReport, QUEUE_KEY, WEIGHT_KEY};

use crate::forward::ForwardBody;
use crate::pool::Pool;

/// Writes `report` into `map` (trailers, or the headers of a trailers-only
/// response).
pub fn write_report(report: &LoadReport, map: &mut HeaderMap) {
    let mut buf = String::with_capacity(16);
    let mut put = |key: &'static str, args: std::fmt::Arguments<'_>| {
        buf.clear();
        let _ = buf.write_fmt(args);
        if let Ok(v) = HeaderValue::from_str(&buf) {
            map.insert(key, v);
        }
    };
    put(INFLIGHT_KEY, format_args!("{}", report.in_flight));
    put(QUEUE_KEY, format_args!("{}", report.queued));
    let (whole, thousandths) = milli(report.busy_ratio);
    put(BUSY_KEY, format_args!("{whole}.{thousandths:03}"));
    let (whole, thousandths) = milli(report.weight);
    put(WEIGHT_KEY, format_args!("{whole}.{thousandths:03}"));
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

/// Adds the pool's current report to `map`.
pub fn add_report(pool: &Pool, map: &mut HeaderMap) {
    write_report(&pool.load(), map);
}

/// A response body of the OIP port.
#[derive(Default)]
pub enum FrontBody {
    /// No body (trailers-only responses).
    #[default]
    Empty,
    /// One encoded message, then trailers.
    Message {
        /// The gRPC frame, taken when sent.
        data: Option<Bytes>,
        /// Trailers, taken when sent.
        trailers: Option<HeaderMap>,
    },
    /// A worker's response passed through ([`crate::forward`]).
    Forward(ForwardBody),
    /// A response of a tonic service, with the load report added to its
    /// trailers.
    Tonic {
        /// The service's body.
        inner: tonic::body::Body,
        /// Whose load to report.
        pool: Arc<Pool>,
    },
}

impl Body for FrontBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            FrontBody::Empty => Poll::Ready(None),
            FrontBody::Message { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(d))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            FrontBody::Forward(f) => Pin::new(f).poll_frame(cx),
            FrontBody::Tonic { inner, pool } => {
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                Poll::Ready(frame.map(|f| {
                    f.map(|frame| match frame.into_trailers() {
                        Ok(mut trailers) => {
                            add_report(pool, &mut trailers);
                            Frame::trailers(trailers)
                        }
                        Err(frame) => frame,
                    })
                }))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            FrontBody::Empty => true,
            FrontBody::Message { data, trailers } => data.is_none() && trailers.is_none(),
            FrontBody::Forward(f) => f.is_end_stream(),
            FrontBody::Tonic { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FrontBody::Empty => SizeHint::with_exact(0),
            FrontBody::Message { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            FrontBody::Forward(_) => SizeHint::default(),
            FrontBody::Tonic { inner, .. } => inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_formatting_matches_three_decimals() {
        for x in [0.0, 0.0004, 0.0005, 0.25, 0.9995, 1.0, 2.5, 123.4567] {
            let (w, t) = milli(x);
            assert_eq!(format!("{w}.{t:03}"), format!("{x:.3}"), "{x}");
        }
        assert_eq!(milli(f64::NAN), (0, 0));
    }

    #[test]
    fn report_round_trips_through_metadata() {
        let report = LoadReport {
            in_flight: 3,
            queued: 1,
            busy_ratio: 0.25,
            weight: 2.5,
        };
        let mut map = HeaderMap::new();
        write_report(&report, &mut map);
        let md = tonic::metadata::MetadataMap::from_headers(map);
        assert_eq!(LoadReport::from_metadata(&md), Some(report));
    }
}
