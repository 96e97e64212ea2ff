//! The small HTTP surface every Plinth process offers operators: `/healthz` (the process
//! runs), `/readyz` (its dependencies answer) and `/metrics` (Prometheus text). When guarded,
//! `/readyz` tells anyone whether the process is ready but says why, and how it runs, only to
//! a caller with a credential the process accepts, and `/metrics` answers only such callers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Accepted;
use crate::telemetry;

/// Answers whether the process's dependencies answer; `Err` says which does not.
pub type ReadinessCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// How long one readiness check may take before it counts as failed.
pub const CHECK_WITHIN: Duration = Duration::from_secs(2);
/// How often a ready process checks again: a dependency that stops answering is noticed
/// within this and its check's own bound, and a replica that refuses calls meanwhile (see
/// `GrpcServer::refuse_while_not_ready`) starts to.
const READY_EVERY: Duration = Duration::from_millis(500);
/// How often a process that is not ready checks again.
const NOT_READY_EVERY: Duration = Duration::from_millis(250);

/// Runs `check` in the background (at once, then every half second while it passes and four
/// times a second while it fails, each run cut at [`CHECK_WITHIN`]) and answers from its last
/// outcome at once. `/readyz` and the gRPC health status read the same outcome, so a probe
/// never waits on a dependency (a catalog whose database stalls answers its probe in
/// microseconds) and the two never disagree. The background task ends when the returned
/// check and every copy of it are dropped.
pub fn watch(check: ReadinessCheck) -> ReadinessCheck {
    let last: Arc<Mutex<Result<(), String>>> = Arc::new(Mutex::new(Err(
        "starting: its dependencies are being checked".to_owned(),
    )));
    let weak = Arc::downgrade(&last);
    crate::tasks::spawn(async move {
        loop {
            // Routine: not worth a trace, nor are the health checks it makes elsewhere.
            let round =
                tracing::Instrument::instrument(check(), crate::telemetry::idle("readiness.check"));
            let outcome = match tokio::time::timeout(CHECK_WITHIN, round).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "its dependencies did not answer within {} s",
                    CHECK_WITHIN.as_secs()
                )),
            };
            let ready = outcome.is_ok();
            let Some(last) = weak.upgrade() else {
                return;
            };
            *last.lock().unwrap_or_else(PoisonError::into_inner) = outcome;
            drop(last);
            tokio::time::sleep(if ready { READY_EVERY } else { NOT_READY_EVERY }).await;
        }
    });
    Arc::new(move || {
        let outcome = last.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Box::pin(async move { outcome })
    })
}

/// An admin port: its listener, and whether its `/metrics` shows the process's metrics.
pub struct Listener {
    listener: TcpListener,
    metrics_at: Option<String>,
}

impl Listener {
    /// A port whose `/metrics` shows the process's metrics.
    pub fn new(listener: TcpListener) -> Self {
        Listener {
            listener,
            metrics_at: None,
        }
    }

    /// A port of a service sharing its process with others (under `plinth serve`), whose
    /// `/metrics` answers an exposition without series and a comment naming `metrics_at`,
    /// where the process's metrics are: a process exports each series once, and a scrape of
    /// this port still succeeds.
    pub fn metrics_elsewhere(listener: TcpListener, metrics_at: String) -> Self {
        Listener {
            listener,
            metrics_at: Some(metrics_at),
        }
    }
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::new(listener)
    }
}

/// `/healthz`, `/readyz` and `/metrics`, to merge into a router or serve on their own.
/// With `guard`, details and metrics need a credential it accepts (any role: the services'
/// own, or an `observer`'s for a scraper); without, they are open.
pub fn router(readiness: ReadinessCheck, guard: Option<Arc<Accepted>>) -> Router {
    routes(readiness, guard, None)
}

fn routes(
    readiness: ReadinessCheck,
    guard: Option<Arc<Accepted>>,
    metrics_at: Option<String>,
) -> Router {
    // Installed now, not at the first scrape, so nothing recorded before it is lost.
    telemetry::metrics();
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(|| async {
            (
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                [(axum::http::header::ALLOW, "GET, HEAD")],
                "/healthz, /readyz and /metrics answer GET and HEAD only\n",
            )
        })
        .with_state(Admin {
            readiness,
            guard,
            metrics_at: metrics_at.map(Arc::from),
        })
}

#[derive(Clone)]
struct Admin {
    readiness: ReadinessCheck,
    guard: Option<Arc<Accepted>>,
    /// Where this process's metrics are, when not here.
    metrics_at: Option<Arc<str>>,
}

impl Admin {
    fn trusts(&self, headers: &HeaderMap) -> bool {
        self.guard
            .as_ref()
            .is_none_or(|accepted| accepted.authenticate_headers(headers).is_some())
    }
}

pub use crate::details::describe;

async fn readyz(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    let trusted = admin.trusts(&headers);
    match (admin.readiness)().await {
        Ok(()) if !trusted => (StatusCode::OK, "ready\n").into_response(),
        Err(_) if !trusted => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response(),
        Ok(()) => {
            let mut body = String::from("ready\n");
            for (key, value) in crate::details::lines() {
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

async fn metrics(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    if !admin.trusts(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "metrics need `Authorization: Bearer <token>` with an internal credential this \
             process accepts (an `observer` entry in `[[internal.accept]]`)\n",
        )
            .into_response();
    }
    let body = match &admin.metrics_at {
        None => telemetry::render_metrics(),
        Some(elsewhere) => format!(
            "# This process serves several Plinth services; its metrics, each series once, \
             are on {elsewhere}\n"
        ),
    };
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        body,
    )
        .into_response()
}

/// Serves the admin endpoints on `listener`, when there is one, in the background.
pub fn spawn(
    listener: Option<impl Into<Listener>>,
    readiness: ReadinessCheck,
    guard: Option<Arc<Accepted>>,
    shutdown: CancellationToken,
) {
    if let Some(listener) = listener {
        crate::tasks::spawn_background(
            "admin server",
            serve(listener.into(), readiness, guard, shutdown),
        );
    }
}

/// Serves the admin router on its own listener until `shutdown`.
pub async fn serve(
    listener: Listener,
    readiness: ReadinessCheck,
    guard: Option<Arc<Accepted>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let Listener {
        listener,
        metrics_at,
    } = listener;
    axum::serve(listener, routes(readiness, guard, metrics_at))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
