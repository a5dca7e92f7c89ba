//! W3C trace context on calls (issue 14). The client opens a `tracing` span
//! per call (`infermesh.infer`) and per attempt (`infermesh.attempt`); when
//! the calling service has installed an OpenTelemetry layer
//! (`tracing-opentelemetry`), each attempt's request carries a
//! `traceparent` header naming the attempt's span, so the agent's span (and
//! the worker's) join the caller's trace. Without such a layer the spans
//! have no trace id and nothing is added: tracing is off unless the service
//! turns it on.

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C `traceparent` header name.
pub const TRACEPARENT: &str = "traceparent";

/// `traceparent` for `span` (`00-<trace id>-<span id>-<flags>`), if it is
/// part of an OpenTelemetry trace.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Adds the current span's `traceparent` to an outgoing request's metadata.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    if let Some(value) = traceparent(&tracing::Span::current()).and_then(|t| t.parse().ok()) {
        metadata.insert(TRACEPARENT, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_without_an_opentelemetry_layer() {
        let span = tracing::info_span!("infermesh.attempt");
        assert_eq!(traceparent(&span), None);
        let mut md = tonic::metadata::MetadataMap::new();
        let _in = span.enter();
        inject(&mut md);
        assert!(md.get(TRACEPARENT).is_none());
    }
}
