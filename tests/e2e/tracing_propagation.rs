//! One REST call is one trace: the gateway's span and the catalog's spans share the caller's
//! trace id, carried over HTTP headers into the gateway and over gRPC metadata into the
//! catalog. Spans are caught with OpenTelemetry's in-memory exporter.

use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::helpers::Server;

#[test]
fn gateway_and_catalog_spans_share_one_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    // The process-wide subscriber, as `plinth serve` installs one: spans also end on threads
    // the runtime does not own (SQLite's connection workers drop the last handle of a
    // handler's span), and a span's parent is released through whatever subscriber that
    // thread has. The test runner gives every test its own process, so this one is its own.
    tracing::subscriber::set_global_default(subscriber)
        .expect("no other subscriber in this test's process");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    runtime.block_on(async {
        let server = Server::start().await;
        let response = server
            .client
            .post(server.url("/v1/environments"))
            .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
            .json(&json!({"name": "Traced"}))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 201);
        server.stop().await;
    });
    // A span ends when the task holding it does: the connection task that carried the
    // response may still hold the gateway's span, so every task is dropped before reading.
    drop(runtime);
    provider.force_flush().expect("flush");
    let spans = exporter.get_finished_spans().expect("spans");

    let trace = TraceId::from_hex(caller_trace).expect("trace id");
    let find = |name: &str, kind: SpanKind| {
        spans
            .iter()
            .find(|span| {
                span.name == name && span.span_kind == kind && span.span_context.trace_id() == trace
            })
            .unwrap_or_else(|| {
                let seen: Vec<_> = spans
                    .iter()
                    .map(|s| {
                        (
                            s.name.to_string(),
                            s.span_kind.clone(),
                            s.span_context.trace_id(),
                        )
                    })
                    .collect();
                panic!("no {kind:?} span {name} in the caller's trace; saw {seen:?}")
            })
    };
    let rpc = "plinth.catalog.v1.CatalogService/CreateEnvironment";
    let gateway = find("POST /v1/environments", SpanKind::Server);
    let client = find(rpc, SpanKind::Client);
    let grpc = find(rpc, SpanKind::Server);
    let catalog = find("catalog.create_environment", SpanKind::Internal);

    assert_eq!(
        gateway.parent_span_id,
        SpanId::from_hex(caller_span).expect("span id"),
        "the gateway continues the caller's trace"
    );
    // The client span sits somewhere beneath the gateway's server span.
    let mut parent = client.parent_span_id;
    let mut steps = 0;
    while parent != gateway.span_context.span_id() {
        let next = spans
            .iter()
            .find(|span| span.span_context.span_id() == parent)
            .unwrap_or_else(|| panic!("the client span is not beneath the gateway's span"));
        parent = next.parent_span_id;
        steps += 1;
        assert!(
            steps < 10,
            "no path from the client span to the gateway's span"
        );
    }
    assert_eq!(
        grpc.parent_span_id,
        client.span_context.span_id(),
        "the catalog's server span is the gateway's client span's child"
    );
    assert_eq!(
        catalog.parent_span_id,
        grpc.span_context.span_id(),
        "the handler runs inside the server span"
    );
}
