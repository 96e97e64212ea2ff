//! What every Plinth HTTP server wraps its routes in: a `http.server` span that continues the
//! caller's W3C trace, and request counts and latencies by route template and status.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::telemetry;

/// Middleware (`axum::middleware::from_fn(observe)`) applied to a router's routes. Labels use
/// the route template, never the raw path, which would let callers grow them without bound.
pub async fn observe(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = request.method().as_str().to_owned();
    let span = tracing::info_span!(
        "http.server",
        otel.kind = "server",
        http.method = %method,
        http.route = %route,
        http.status = tracing::field::Empty,
    );
    telemetry::extract(&span, request.headers());
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.status", status);
    let labels = [
        ("route", route),
        ("method", method),
        ("status", status.to_string()),
    ];
    metrics::counter!("plinth_http_requests_total", &labels).increment(1);
    metrics::histogram!("plinth_http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}
