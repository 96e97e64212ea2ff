//! The small HTTP surface every Plinth process offers operators: `/healthz` (the process
//! runs), `/readyz` (its dependencies answer) and `/metrics` (Prometheus text), plus the
//! middleware that counts HTTP requests by route and outcome.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::telemetry;

/// Answers whether the process's dependencies answer; `Err` says which does not.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// `/healthz`, `/readyz` and `/metrics`, to merge into a router or serve on their own.
pub fn router(readiness: ReadinessCheck) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<ReadinessCheck>) -> Response {
    match readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

async fn metrics() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        telemetry::render_metrics(),
    )
        .into_response()
}

/// Serves the admin router on its own listener until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    readiness: ReadinessCheck,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(readiness))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Counts requests and records their latency by route template (never the raw path, which
/// would let callers grow labels without bound), method and status.
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [("route", route), ("method", method), ("status", status)];
    metrics::counter!("plinth_http_requests_total", &labels).increment(1);
    metrics::histogram!("plinth_http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}
