//! The small HTTP surface every Plinth process offers operators: `/healthz` (the process
//! runs), `/readyz` (its dependencies answer) and `/metrics` (Prometheus text).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::telemetry;

/// Answers whether the process's dependencies answer; `Err` says which does not.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// `/healthz`, `/readyz` and `/metrics`, to merge into a router or serve on their own.
pub fn router(readiness: ReadinessCheck) -> Router {
    // Installed now, not at the first scrape, so nothing recorded before it is lost.
    telemetry::metrics();
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<ReadinessCheck>) -> Response {
    match readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

async fn metrics() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        telemetry::render_metrics(),
    )
        .into_response()
}

/// Serves the admin endpoints on `listener`, when there is one, in the background.
pub fn spawn(
    listener: Option<TcpListener>,
    readiness: ReadinessCheck,
    shutdown: CancellationToken,
) {
    if let Some(listener) = listener {
        crate::tasks::spawn_background("admin server", serve(listener, readiness, shutdown));
    }
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
