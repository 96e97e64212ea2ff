//! Logs, traces and metrics for every Plinth process.
//!
//! * Logs and spans go through `tracing`; [`init`] installs the subscriber once per process.
//! * Every span is also an OpenTelemetry span, so a trace id exists even when nothing exports
//!   it; with `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans are exported over OTLP/gRPC.
//! * W3C trace context crosses process boundaries in HTTP headers and gRPC metadata
//!   ([`inject`], [`extract`]), so one REST request is one trace across services.
//! * Metrics use the `metrics` facade with one Prometheus recorder per process ([`metrics`]),
//!   rendered on `/metrics`.

use std::sync::OnceLock;

use http::HeaderMap;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How logs are written to standard error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logging settings shared by every binary.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// An `EnvFilter` directive such as `info` or `plinth_catalog=debug,info`.
    pub filter: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            filter: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

/// Keeps the tracer provider alive; dropping it flushes spans still buffered for export.
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("plinth: flushing traces at exit failed: {error}");
        }
    }
}

/// Errors setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("invalid log filter {filter:?}: {message}")]
    Filter {
        /// The directive given.
        filter: String,
        /// What the parser said.
        message: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot set up OTLP export to {endpoint}: {message}")]
    Otlp {
        /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
        endpoint: String,
        /// Why.
        message: String,
    },
}

/// Installs logging, tracing and metrics for this process. Call it once, from `main`, inside
/// the Tokio runtime (the OTLP exporter's channel lives on it). If a subscriber is already
/// installed (as in tests), that one stays.
pub fn init(service_name: &str, config: &LogConfig) -> Result<TelemetryGuard, TelemetryError> {
    let filter = EnvFilter::try_new(&config.filter).map_err(|error| TelemetryError::Filter {
        filter: config.filter.clone(),
        message: error.to_string(),
    })?;
    let provider = tracer_provider(service_name)?;
    let tracer = provider.tracer(service_name.to_owned());
    let fmt = match config.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    metrics();
    Ok(TelemetryGuard { provider })
}

fn tracer_provider(service_name: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name.to_owned())
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    if endpoint.is_empty() {
        return Ok(builder.build());
    }
    // The exporter reads the endpoint (and headers, timeout) from the standard variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|error| TelemetryError::Otlp {
            endpoint: endpoint.clone(),
            message: error.to_string(),
        })?;
    tracing::info!(%endpoint, "exporting traces over OTLP");
    Ok(builder.with_batch_exporter(exporter).build())
}

/// The process's Prometheus recorder, installed on first use. Request latencies are
/// histograms with buckets from 0.5 ms to 10 s.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        const BUCKETS: [f64; 14] = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets(&BUCKETS) {
            Ok(builder) => builder,
            Err(error) => {
                tracing::warn!(%error, "histogram buckets refused; latencies are summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was already installed; /metrics shows only Plinth's own"
            );
        }
        handle
    })
}

/// Renders every metric of this process in the Prometheus text format.
pub fn render_metrics() -> String {
    let handle = metrics();
    handle.run_upkeep();
    handle.render()
}

fn propagator() -> &'static TraceContextPropagator {
    static PROPAGATOR: OnceLock<TraceContextPropagator> = OnceLock::new();
    PROPAGATOR.get_or_init(TraceContextPropagator::new)
}

/// Writes the current span's trace context into outgoing HTTP headers or gRPC metadata.
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    let context = span.context();
    propagator().inject_context(&context, &mut HeaderInjector(headers));
}

/// Makes `span` a child of the trace context an incoming request carries, if it carries one.
pub fn extract(span: &tracing::Span, headers: &HeaderMap) {
    let context = propagator().extract(&HeaderExtractor(headers));
    use opentelemetry::trace::TraceContextExt as _;
    if context.span().span_context().is_valid() {
        // Fails only when the span is disabled by the filter; then there is nothing to link.
        let _ = span.set_parent(context);
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = http::header::HeaderName::from_bytes(key.as_bytes()) else {
            return;
        };
        let Ok(value) = http::HeaderValue::from_str(&value) else {
            return;
        };
        self.0.insert(name, value);
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
