//! Logs, traces and metrics for every Plinth process.
//!
//! * Logs and spans go through `tracing`; [`init`] installs the subscriber once per process.
//!   Server spans record their `trace_id`, so every log line inside a request carries it.
//! * Every span is also an OpenTelemetry span, so a trace id exists even when nothing exports
//!   it. Export follows the OpenTelemetry SDK variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` switches it on, `OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL` picks
//!   `http/protobuf` (the default) or `grpc`, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
//!   name the service, `OTEL_TRACES_SAMPLER[_ARG]` samples, and `OTEL_SDK_DISABLED=true` or
//!   `OTEL_TRACES_EXPORTER=none` switches export off.
//! * W3C trace context crosses process boundaries in HTTP headers and gRPC metadata
//!   ([`inject`], [`extract`]), so one REST request is one trace across services. Background
//!   loops poll inside [`idle`] spans, which are never sampled: an idle process exports nothing.
//! * Metrics use the `metrics` facade with one Prometheus recorder per process ([`metrics()`]),
//!   rendered on `/metrics` with the process's own `process_*` figures and `plinth_build_info`.

use std::sync::OnceLock;

use http::HeaderMap;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
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
    // The FUSE library's own warnings (an unmount of a mount the node detached already, a
    // request it does not implement) say nothing an operator acts on; its errors stay.
    let filter = match config.filter.contains("fuser") {
        true => filter,
        false => filter.add_directive("fuser=error".parse().map_err(
            |error: tracing_subscriber::filter::ParseError| TelemetryError::Filter {
                filter: "fuser=error".to_owned(),
                message: error.to_string(),
            },
        )?),
    };
    let (provider, export) = tracer_provider(service_name, &|name| std::env::var(name).ok())?;
    let tracer = provider.tracer(service_name.to_owned());
    let fmt = match config.format {
        // Colour only for a person at a terminal: a file, a pipe or a collector gets plain
        // text (and `NO_COLOR` turns it off at a terminal too).
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .fmt_fields(TextFields)
            .with_ansi(colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty()),
            ))
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .event_format(JsonWithTrace(
                tracing_subscriber::fmt::format()
                    .json()
                    .with_current_span(true),
            ))
            .with_writer(std::io::stderr)
            .boxed(),
    };
    // The log filter is the log's own: a quiet log (`warn`) must not switch traces off, so
    // spans go to OpenTelemetry at `info` and above whatever the log shows.
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .try_init();
    if let Some(export) = export {
        tracing::info!(endpoint = %export.endpoint, protocol = export.protocol, "exporting traces over OTLP");
    }
    metrics();
    Ok(TelemetryGuard { provider })
}

/// JSON log lines as `tracing_subscriber` writes them, with the trace's and the span's ids
/// as top-level `trace_id` and `span_id`, so a log pipeline joins a line to its trace without
/// reading the span list.
struct JsonWithTrace(
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>,
);

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonWithTrace
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.0.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        match (trace_ids(), line.trim_end().strip_suffix('}')) {
            // One object and a line break: the ids go in before its closing brace.
            (Some((trace_id, span_id)), Some(object)) => writeln!(
                writer,
                "{object},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            ),
            _ => writer.write_str(&line),
        }
    }
}

/// The current span's trace and span ids, when it is in a trace.
fn trace_ids() -> Option<(opentelemetry::trace::TraceId, opentelemetry::trace::SpanId)> {
    use opentelemetry::trace::TraceContextExt as _;
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| (span_context.trace_id(), span_context.span_id()))
}

/// The fields of text log lines, events' and their spans': `name=value`, the message bare,
/// each event on one line (a value's line breaks are written `\n`). The OpenTelemetry
/// attributes that only repeat a span's name (`rpc.*`, `http.*`, `otel.kind`,
/// `otel.status_code`) stay in traces and out of the log, so a request that crosses services
/// in one process (an HTTP span, then a client and a server span per call) does not fill a
/// line with them; `otel.name`, `url.path` and `trace_id` remain.
struct TextFields;

impl<'writer> tracing_subscriber::fmt::FormatFields<'writer> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = TextVisitor {
            writer: &mut writer,
            result: Ok(()),
            first: true,
        };
        fields.record(&mut visitor);
        visitor.result
    }

    /// Fields recorded on a span later (`otel.status_code`, say): added after a space, or not
    /// at all when every one of them is left out.
    fn add_fields(
        &self,
        current: &'writer mut tracing_subscriber::fmt::FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let mut more = String::new();
        <Self as tracing_subscriber::fmt::FormatFields<'_>>::format_fields(
            self,
            tracing_subscriber::fmt::format::Writer::new(&mut more),
            fields,
        )?;
        if !more.is_empty() {
            if !current.fields.is_empty() {
                current.fields.push(' ');
            }
            current.fields.push_str(&more);
        }
        Ok(())
    }
}

struct TextVisitor<'a, 'writer> {
    writer: &'a mut tracing_subscriber::fmt::format::Writer<'writer>,
    result: std::fmt::Result,
    first: bool,
}

impl TextVisitor<'_, '_> {
    fn write(&mut self, field: &tracing::field::Field, value: std::fmt::Arguments<'_>) {
        let name = field.name().trim_start_matches("r#");
        if self.result.is_err() || hidden_in_text(name) {
            return;
        }
        let value = value.to_string();
        let value = if value.contains(['\n', '\r']) {
            value.replace('\n', "\\n").replace('\r', "\\r")
        } else {
            value
        };
        let gap = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if name == "message" {
            write!(self.writer, "{gap}{value}")
        } else {
            write!(self.writer, "{gap}{name}={value}")
        };
    }
}

impl tracing::field::Visit for TextVisitor<'_, '_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.write(field, format_args!("{value}"));
        } else {
            self.write(field, format_args!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.write(field, format_args!("{value:?}"));
    }
}

/// Fields text logs leave out: span attributes for traces only, and the `log` crate's own.
fn hidden_in_text(name: &str) -> bool {
    name.starts_with("rpc.")
        || name.starts_with("http.")
        || name.starts_with("log.")
        || name == "otel.kind"
        || name == "otel.status_code"
}

/// Whether text logs are coloured: on a terminal, unless `NO_COLOR` says otherwise.
fn colour(terminal: bool, no_color: bool) -> bool {
    terminal && !no_color
}

/// Where spans go, when they are exported.
#[derive(Debug, PartialEq, Eq)]
struct Export {
    endpoint: String,
    protocol: &'static str,
}

/// The tracer provider the `OTEL_*` variables (read through `var`) ask for, and where it
/// exports. The exporters read the endpoint, headers and timeout from the same variables.
fn tracer_provider(
    service_name: &str,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(SdkTracerProvider, Option<Export>), TelemetryError> {
    let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
    let mut resource = opentelemetry_sdk::Resource::builder()
        .with_attribute(opentelemetry::KeyValue::new("service.version", VERSION));
    // The builder's own detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the
    // process's role names the service only when the operator did not.
    if set("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service_name.to_owned());
    }
    let builder = SdkTracerProvider::builder().with_resource(resource.build());
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|value| value.eq_ignore_ascii_case("none"));
    let endpoint =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let Some(endpoint) = endpoint.filter(|_| !disabled) else {
        return Ok((builder.build(), None));
    };
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".to_owned());
    let failed = |message: String| TelemetryError::Otlp {
        endpoint: endpoint.clone(),
        message,
    };
    let (exporter, protocol) = match protocol.trim() {
        "grpc" => (
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|error| failed(error.to_string()))?,
            "grpc",
        ),
        "http/protobuf" => (
            {
                // reqwest's rustls needs a process-wide provider; every Plinth client uses ring.
                let _ = rustls::crypto::ring::default_provider().install_default();
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .build()
                    .map_err(|error| failed(error.to_string()))?
            },
            "http/protobuf",
        ),
        other => {
            return Err(failed(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL {other:?} is not supported: use `grpc` or `http/protobuf`"
            )));
        }
    };
    Ok((
        builder.with_batch_exporter(exporter).build(),
        Some(Export { endpoint, protocol }),
    ))
}

/// This build's version, as `plinth_build_info` and the `service.version` resource say.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Records `span`'s OpenTelemetry trace id in its `trace_id` field (declared empty where the
/// span is made), so log lines inside it can be found from the trace and back.
pub fn record_trace_id(span: &tracing::Span) {
    use opentelemetry::trace::TraceContextExt as _;
    let context = span.context();
    let trace_id = context.span().span_context().trace_id();
    if trace_id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace_id));
    }
}

/// A span for one round of a background loop that usually finds nothing to do (a builder's
/// poll, a node's heartbeat): it and everything beneath it, the calls it makes in other
/// processes included (their trace context says "not sampled"), are never exported, so an
/// idle process sends no traces. Work the round finds runs in a new root span
/// (`tracing::info_span!(parent: None, …)`), which is traced as usual.
pub fn idle(name: &'static str) -> tracing::Span {
    let span = tracing::info_span!("idle", otel.name = name);
    unsampled(&span);
    span
}

/// Makes `span` the root of a trace that is never sampled: neither it nor anything beneath
/// it, in this process or another, is exported. For rounds of polling loops ([`idle`]) and
/// for probes and scrapes, which come every few seconds whether anything happens or not.
pub fn unsampled(span: &tracing::Span) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    let mut id = [0u8; 16];
    // A fresh trace id per round keeps unrelated rounds apart should a sampler that ignores
    // the parent keep some of them; without randomness the rounds share one.
    let _ = getrandom::fill(&mut id);
    let mut span_id = [0u8; 8];
    let _ = getrandom::fill(&mut span_id);
    let unsampled = SpanContext::new(
        TraceId::from_bytes(id),
        SpanId::from_bytes(span_id),
        TraceFlags::default(),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(unsampled));
}

/// The label for an HTTP method: the standard methods by name, anything else `other`, so a
/// caller cannot add label values.
pub fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::HEAD => "HEAD",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::CONNECT => "CONNECT",
        http::Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// The process's Prometheus recorder, installed on first use. Request latencies are
/// histograms with buckets from 0.5 ms to 10 s; build durations from 1 s to 30 min.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        const BUCKETS: [f64; 14] = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        const BUILD_BUCKETS: [f64; 11] = [
            1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
        ];
        let builder = PrometheusBuilder::new()
            .set_buckets(&BUCKETS)
            .and_then(|builder| {
                builder.set_buckets_for_metric(
                    Matcher::Full("plinth_build_duration_seconds".to_owned()),
                    &BUILD_BUCKETS,
                )
            });
        let builder = match builder {
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
        process_collector().describe();
        describe();
        metrics::gauge!("plinth_build_info", "version" => VERSION).set(1.0);
        crate::storage::register();
        handle
    })
}

/// The HELP text of every Plinth metric, with its unit; a process shows those it exports.
/// `docs/operating/telemetry.md` has the same table with labels and who exports what.
const DESCRIPTIONS: &[(&str, Kind, &str)] = &[
    (
        "plinth_build_info",
        Kind::Gauge,
        "The Plinth version running, in its version label (always 1).",
    ),
    (
        "plinth_http_requests_total",
        Kind::Counter,
        "HTTP requests answered, by route template, method and status.",
    ),
    (
        "plinth_http_request_duration_seconds",
        Kind::Histogram,
        "Time from an HTTP request to the end of its response body, in seconds.",
    ),
    (
        "plinth_http_requests_in_flight",
        Kind::Gauge,
        "HTTP requests whose response has not finished, by route.",
    ),
    (
        "plinth_gateway_refused_total",
        Kind::Counter,
        "Requests and connections the gateway refused at its edge, by reason.",
    ),
    (
        "plinth_gateway_connections",
        Kind::Gauge,
        "Connections open to the gateway's port, WebSockets included.",
    ),
    (
        "plinth_store_full",
        Kind::Gauge,
        "1 while writes to the store found its disk full and it has no room yet, else 0.",
    ),
    (
        "plinth_grpc_server_requests_total",
        Kind::Counter,
        "gRPC calls answered, by method and status code as gRPC names it.",
    ),
    (
        "plinth_grpc_server_request_duration_seconds",
        Kind::Histogram,
        "Time from a gRPC call to the end of its response stream, in seconds, by method and status code.",
    ),
    (
        "plinth_grpc_server_requests_in_flight",
        Kind::Gauge,
        "gRPC calls being answered, by method.",
    ),
    (
        "plinth_grpc_server_deadlines_total",
        Kind::Counter,
        "gRPC calls still working at their deadline, answered UNAVAILABLE.",
    ),
    (
        "plinth_grpc_server_refused_total",
        Kind::Counter,
        "gRPC calls refused before any work while the replica's readiness check failed.",
    ),
    (
        "plinth_grpc_client_requests_total",
        Kind::Counter,
        "Outgoing gRPC calls, by method and status code as gRPC names it.",
    ),
    (
        "plinth_grpc_client_request_duration_seconds",
        Kind::Histogram,
        "Time of outgoing gRPC calls, connecting included, in seconds.",
    ),
    (
        "plinth_grpc_client_requests_in_flight",
        Kind::Gauge,
        "Outgoing gRPC calls not yet finished, by method.",
    ),
    (
        "plinth_builds",
        Kind::Gauge,
        "Builds by state (queued, running); every catalog replica reports the same: use max.",
    ),
    (
        "plinth_build_queue_oldest_seconds",
        Kind::Gauge,
        "Age of the oldest queued build in seconds, 0 when none; use max.",
    ),
    (
        "plinth_build_lease_takeovers_total",
        Kind::Counter,
        "Builds whose builder's lease ran out, by outcome (requeued, failed).",
    ),
    (
        "plinth_session_placement_retries_total",
        Kind::Counter,
        "Session creates placed again on another node after the first node failed them.",
    ),
    (
        "plinth_builder_claims_total",
        Kind::Counter,
        "The builder's polls for work, by result (claimed, empty, error).",
    ),
    (
        "plinth_build_duration_seconds",
        Kind::Histogram,
        "Time from claim to finish of each build, in seconds, by outcome.",
    ),
    (
        "plinth_nodes",
        Kind::Gauge,
        "Registered nodes by state (live, suspect, late); use max.",
    ),
    (
        "plinth_gateway_nodes_marked_suspect_total",
        Kind::Counter,
        "Nodes this gateway began to hold suspect.",
    ),
    (
        "plinth_sessions_live",
        Kind::Gauge,
        "Sessions not yet ended; use max.",
    ),
    (
        "plinth_node_sessions",
        Kind::Gauge,
        "Sessions attached on this node.",
    ),
    (
        "plinth_node_attach_duration_seconds",
        Kind::Histogram,
        "Time to attach a session (version fetched and mounted), in seconds.",
    ),
    (
        "plinth_node_cache_bytes",
        Kind::Gauge,
        "Bytes of blobs in the node's version cache.",
    ),
    (
        "plinth_node_fetch_limit",
        Kind::Gauge,
        "Blobs materializations and pre-warm may fetch at once now (fewer while the store slows under them).",
    ),
    (
        "plinth_node_lazy_mounts",
        Kind::Gauge,
        "Sessions' mounts of versions served lazily (fetched file by file as they are opened).",
    ),
    (
        "plinth_node_lazy_fetches_total",
        Kind::Counter,
        "Blobs a session's open of a lazily served file waited for, by outcome (fetched, failed: the open failed with EIO).",
    ),
    (
        "plinth_node_lazy_fetch_seconds",
        Kind::Histogram,
        "Time a session's open of a lazily served file waited for its blob, in seconds.",
    ),
    (
        "plinth_node_prewarm_listed",
        Kind::Gauge,
        "Versions the catalog names for this node to hold warm, as node.prewarm filters them.",
    ),
    (
        "plinth_node_prewarm_versions_total",
        Kind::Counter,
        "Versions fetched before any session asked, by outcome (fetched, failed, no_room: the cache was at its budget).",
    ),
    (
        "plinth_node_prewarm_blobs_total",
        Kind::Counter,
        "Blobs fetched by pre-warm.",
    ),
    (
        "plinth_node_packs_total",
        Kind::Counter,
        "Versions' packs asked for by this node when it lacked the version, by outcome (read, none: the store has none, failed: it ended early or held a file not its head's).",
    ),
    (
        "plinth_node_pack_blobs_total",
        Kind::Counter,
        "Blobs versions' packs brought to this node.",
    ),
    (
        "plinth_node_packs_written_total",
        Kind::Counter,
        "Packs this node stored, of what a version's first sessions on it read.",
    ),
    (
        "plinth_node_cache_lookups_total",
        Kind::Counter,
        "Version lookups in the node's cache at attach, by result (hit, miss).",
    ),
    (
        "plinth_node_disk_free_bytes",
        Kind::Gauge,
        "Free bytes on the filesystem of the node's data directory.",
    ),
    (
        "plinth_node_disk_size_bytes",
        Kind::Gauge,
        "Size in bytes of the filesystem of the node's data directory.",
    ),
    (
        "plinth_blob_store_bytes",
        Kind::Gauge,
        "Bytes in the blob store, as of the last count (at start, then each collection pass).",
    ),
    (
        "plinth_blob_store_objects",
        Kind::Gauge,
        "Objects in the blob store, as of the last count (at start, then each collection pass).",
    ),
    (
        "plinth_gc_reclaimed_objects_total",
        Kind::Counter,
        "Blob store objects collection passes removed.",
    ),
    (
        "plinth_gc_reclaimed_bytes_total",
        Kind::Counter,
        "Blob store bytes collection passes removed.",
    ),
    (
        "plinth_gc_pass_duration_seconds",
        Kind::Histogram,
        "Duration of each collection pass, in seconds.",
    ),
];

/// A metric's type, as the HELP text is given for it.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Gives every Plinth metric its HELP text (and unit) in this process's recorder.
fn describe() {
    use metrics::Unit;
    for &(name, kind, help) in DESCRIPTIONS {
        let unit = if name.ends_with("_seconds") {
            Unit::Seconds
        } else if name.ends_with("_bytes") {
            Unit::Bytes
        } else {
            Unit::Count
        };
        match kind {
            Kind::Counter => metrics::describe_counter!(name, unit, help),
            Kind::Gauge => metrics::describe_gauge!(name, unit, help),
            Kind::Histogram => metrics::describe_histogram!(name, unit, help),
        }
    }
}

fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Renders every metric of this process in the Prometheus text format, with the process's
/// CPU, memory, descriptors and threads read as of now.
pub fn render_metrics() -> String {
    let handle = metrics();
    process_collector().collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn export(vars: &[(&str, &str)]) -> Result<Option<Export>, TelemetryError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let var = move |name: &str| {
            vars.iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        };
        tracer_provider("plinth-test", &var).map(|(_, export)| export)
    }

    #[tokio::test]
    async fn the_otel_variables_decide_whether_and_how_traces_are_exported() {
        assert_eq!(export(&[]).expect("no export"), None);
        assert_eq!(
            export(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4318/v1/traces"
            )])
            .expect("the per-signal endpoint alone"),
            Some(Export {
                endpoint: "http://127.0.0.1:4318/v1/traces".to_owned(),
                protocol: "http/protobuf",
            })
        );
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ])
            .expect("grpc")
            .map(|export| export.protocol),
            Some("grpc")
        );
        // The per-signal protocol wins over the generic one.
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ])
            .expect("grpc")
            .map(|export| export.protocol),
            Some("grpc")
        );
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(
                export(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    off
                ])
                .expect("switched off"),
                None,
                "{off:?}"
            );
        }
        let refused = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ])
        .expect_err("not supported");
        let message = refused.to_string();
        assert!(
            message.contains("http/json")
                && message.contains("grpc")
                && message.contains("http/protobuf"),
            "{message}"
        );
    }

    #[test]
    fn a_text_log_event_is_one_plain_line_without_trace_only_attributes() {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("buffer").extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(TextFields)
            .with_ansi(colour(false, false))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "grpc",
                otel.name = "plinth.catalog.v1.CatalogService/GetBuild",
                otel.kind = "client",
                rpc.system = "grpc",
                rpc.method = "GetBuild"
            );
            let _entered = span.enter();
            tracing::warn!(error = "first\nsecond", path = %"/a b", "short message");
        });
        let said = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(!said.contains('\u{1b}'), "{said}");
        assert!(
            said.contains("grpc{otel.name=\"plinth.catalog.v1.CatalogService/GetBuild\"}")
                && !said.contains("rpc.system")
                && !said.contains("otel.kind"),
            "{said}"
        );
        assert!(
            said.contains("short message error=\"first\\nsecond\" path=/a b"),
            "{said}"
        );
        assert!(colour(true, false) && !colour(true, true) && !colour(false, false));
    }

    #[test]
    fn only_standard_methods_name_themselves() {
        assert_eq!(method_label(&http::Method::POST), "POST");
        let invented = http::Method::from_bytes(b"BREW").expect("a method");
        assert_eq!(method_label(&invented), "other");
    }
}
