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

/// Facts about how this process runs, shown under `ready` by `/readyz` (e.g. which cgroup
/// version holds sessions' limits). One line each, replaced by `key`.
static DETAILS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Sets a line `/readyz` shows once the process is ready: `key: value`.
pub fn describe(key: &str, value: impl Into<String>) {
    let mut details = DETAILS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    details.retain(|(existing, _)| existing != key);
    details.push((key.to_owned(), value.into()));
}

async fn readyz(State(readiness): State<ReadinessCheck>) -> Response {
    match readiness().await {
        Ok(()) => {
            let mut body = String::from("ready\n");
            for (key, value) in DETAILS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
            {
                body.push_str(&format!("{key}: {value}\n"));
            }
            (StatusCode::OK, body).into_response()
        }
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
