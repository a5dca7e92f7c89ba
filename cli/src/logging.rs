//! Log setup: lines on stderr, filtered by `RUST_LOG` (default `info`),
//! as human-readable text or one JSON object per line (`--log-format json`).

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`, `spans`.
    Json,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    init_with(format, None);
}

/// Installs the global subscriber; with `tracer`, the spans of infermesh's
/// own crates also go to OpenTelemetry (`tracing-opentelemetry`), whatever
/// `RUST_LOG` says about log lines.
pub fn init_with(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::SdkTracerProvider>) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let otel = tracer.map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("infermesh"))
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.is_span() && m.target().starts_with("infermesh")
            }))
    });
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(otel);
    match format {
        LogFormat::Text => registry
            .with(
                lines
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Json => registry
            .with(lines.json().with_ansi(false).with_filter(filter))
            .init(),
    }
}
