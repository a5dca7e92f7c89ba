//! OpenTelemetry traces (issue 14), off unless an OTLP endpoint is set
//! (`otlp_endpoint`, `--otlp-endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! When on, every `ModelInfer` gets a span `infermesh.request` (kind server;
//! fields `model`, `worker`, `outcome` = the gRPC code) whose parent is the
//! caller's W3C `traceparent` header when it sends one (the client library
//! does, per attempt), and the request goes on to the worker with a
//! `traceparent` naming the agent's span, so a worker that traces (Triton
//! with `--trace-config mode=opentelemetry`) joins the same trace. Spans
//! leave through a batch exporter over OTLP/gRPC (tonic). When off, no span
//! is created on the request path at all.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C `traceparent` header.
pub const TRACEPARENT: &str = "traceparent";

/// The service name spans are exported under.
pub const SERVICE_NAME: &str = "infermesh-agent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether request spans are made (an OTLP exporter is installed).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Builds the OTLP/gRPC exporter to `endpoint` (e.g. `http://collector:4317`)
/// and its tracer provider, and turns request spans on. Must be called
/// within a Tokio runtime (the exporter's channel lives on it). The caller
/// installs `tracing_opentelemetry::layer().with_tracer(...)` and calls
/// `shutdown()` on the provider at exit to flush.
pub fn otlp(endpoint: &str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP exporter to {endpoint}: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(SERVICE_NAME)
                .build(),
        )
        .build();
    ENABLED.store(true, Ordering::Relaxed);
    Ok(provider)
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one request, child of the caller's `traceparent` if valid;
/// [`tracing::Span::none`] while tracing is off.
pub fn request_span(headers: &HeaderMap) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "infermesh.request",
        otel.kind = "server",
        model = tracing::field::Empty,
        worker = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// Records `value` in the current request span's `field`, when tracing.
pub fn record(field: &'static str, value: &dyn std::fmt::Display) {
    if enabled() {
        tracing::Span::current().record(field, tracing::field::display(value));
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes `tracestate` even when it is empty.
        if value.is_empty() {
            return;
        }
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Sets `traceparent` in the headers going to the worker to the current
/// span, so the worker's spans are children of the agent's.
pub fn inject(headers: &mut HeaderMap) {
    if !enabled() {
        return;
    }
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const CALLER_SPAN: &str = "b7ad6b7169203331";

    /// A subscriber exporting finished spans to the returned exporter (the
    /// provider must stay alive while spans finish: dropped, it shuts down).
    fn recording() -> (
        InMemorySpanExporter,
        SdkTracerProvider,
        impl tracing::Subscriber + Send + Sync,
    ) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        (exporter, provider, subscriber)
    }

    /// Extraction, the span's parent, the header to the worker and the
    /// exported span, against an in-memory exporter.
    #[test]
    fn the_request_span_is_a_child_of_the_callers_and_the_workers_parent() {
        let (exporter, _provider, subscriber) = recording();
        ENABLED.store(true, Ordering::Relaxed);
        let to_worker = tracing::subscriber::with_default(subscriber, || {
            let mut headers = HeaderMap::new();
            headers.insert(
                TRACEPARENT,
                HeaderValue::from_str(&format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")).unwrap(),
            );
            let span = request_span(&headers);
            let _in = span.enter();
            record("model", &"dense");
            record("worker", &"w0");
            record("outcome", &"Ok");
            // The caller's header is replaced by the agent's span.
            let mut out = headers.clone();
            inject(&mut out);
            out[TRACEPARENT].to_str().unwrap().to_string()
        });
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.name, "infermesh.request");
        assert_eq!(
            s.span_context.trace_id(),
            TraceId::from_hex(CALLER_TRACE).unwrap()
        );
        assert_eq!(s.parent_span_id, SpanId::from_hex(CALLER_SPAN).unwrap());
        assert_eq!(
            to_worker,
            format!("00-{CALLER_TRACE}-{}-01", s.span_context.span_id())
        );
        for (key, value) in [("model", "dense"), ("worker", "w0"), ("outcome", "Ok")] {
            assert!(
                s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == key && kv.value.as_str() == value),
                "{key}={value} in {:?}",
                s.attributes
            );
        }
        // A malformed header is ignored: a root span.
        let mut bad = HeaderMap::new();
        bad.insert(TRACEPARENT, HeaderValue::from_static("00-zz-yy-01"));
        let (exporter2, _provider2, subscriber2) = recording();
        tracing::subscriber::with_default(subscriber2, || drop(request_span(&bad)));
        let spans = exporter2.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
    }
}
