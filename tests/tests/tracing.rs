//! Issue 14: OpenTelemetry traces from the client library through the agent
//! to the worker. The test process traces its client calls into an
//! in-memory exporter; the agent (`otlp_endpoint`) exports to a small OTLP
//! collector served here with tonic (`opentelemetry-proto`'s trace
//! service). One call must show: the client's attempt span sent as
//! `traceparent`; the agent's `infermesh.request` span a child of it in the
//! same trace, with model, worker and outcome; and the worker receiving a
//! `traceparent` naming the agent's span (the test worker logs it, and the
//! agent logs worker output).

use std::sync::{Arc, Mutex};

use infermesh_client::Client;
use infermesh_tests::{Agent, dense, eventually, testworker};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;

/// Every span exported to it, with its resource's `service.name`.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_call_is_one_trace_from_client_to_worker() {
    // The collector.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let collector = Collector::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let agent = Agent::builder()
        .config(format!(
            "otlp_endpoint = \"http://127.0.0.1:{port}\"\n[[workers]]\nid = \"w0\"\ncommand = \"{}\"\n",
            testworker("")
        ))
        .start()
        .await;

    // The caller's tracing: spans into memory.
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let client = Client::builder()
        .registry(format!("static://{}", agent.oip))
        .build()
        .await
        .unwrap();
    let input = dense::input(1, 3);
    let resp = client.infer(dense::request(&input, true)).await.unwrap();
    assert_eq!(dense::output(&resp).0, dense::forward(&input));

    // The client's spans: the call and its one attempt, one trace.
    let spans = exporter.get_finished_spans().unwrap();
    let call = spans
        .iter()
        .find(|s| s.name == "infermesh.infer")
        .expect("a span per call");
    let attempt = spans
        .iter()
        .find(|s| s.name == "infermesh.attempt")
        .expect("a span per attempt");
    assert_eq!(attempt.parent_span_id, call.span_context.span_id());
    let trace = call.span_context.trace_id().to_string();
    assert_eq!(attempt.span_context.trace_id().to_string(), trace);

    // The agent's span reaches the collector: a child of the attempt.
    let (service, request) = eventually("the agent exports its request span", || async {
        collector
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|(_, s)| s.name == "infermesh.request")
            .cloned()
    })
    .await;
    assert_eq!(service, "infermesh-agent");
    assert_eq!(hex(&request.trace_id), trace, "same trace as the caller");
    assert_eq!(
        hex(&request.parent_span_id),
        attempt.span_context.span_id().to_string(),
        "the agent's span is the attempt's child"
    );
    assert_eq!(attribute(&request, "model").as_deref(), Some("dense"));
    assert_eq!(attribute(&request, "worker").as_deref(), Some("w0"));
    assert_eq!(attribute(&request, "outcome").as_deref(), Some("Ok"));

    // The worker got the agent's span as its parent.
    let expected = format!("traceparent=00-{trace}-{}-01", hex(&request.span_id));
    eventually("the worker logs the trace context it received", || async {
        agent.log_text().contains(&expected).then_some(())
    })
    .await;
}
