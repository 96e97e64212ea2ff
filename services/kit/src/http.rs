//! What every Plinth HTTP server wraps its routes in: a server span in OpenTelemetry's HTTP
//! conventions that continues the caller's W3C trace, and request counts, latencies and
//! requests in flight by route template, method and status. A request ends with its response
//! body, so a streamed exec or a followed log is timed to its last byte.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::metered::{End, Metered, Watcher};
use crate::telemetry;

/// The routes of health checks and metric scrapes.
const PROBES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Middleware (`axum::middleware::from_fn(observe)`) applied to a router's routes. Labels come
/// from closed sets: the route template (never the raw path) or `unmatched`, and the standard
/// methods or `other`, so callers cannot grow them.
pub async fn observe(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let method = telemetry::method_label(request.method());
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.to_owned(),
    };
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    let (address, port) = server_address(&request);
    let span = tracing::info_span!(
        "http.server",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = %route,
        url.path = %request.uri().path(),
        url.scheme = request.uri().scheme_str().unwrap_or("http"),
        server.address = address.as_deref(),
        server.port = port.map(i64::from),
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    // Probes and scrapes come every few seconds, busy or idle: counted, never traced.
    if PROBES.contains(&route.as_str()) {
        telemetry::unsampled(&span);
    } else {
        telemetry::extract(&span, request.headers());
        telemetry::record_trace_id(&span);
    }
    let in_flight = metrics::gauge!("plinth_http_requests_in_flight", "route" => route.clone());
    in_flight.increment(1.0);
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    let watcher = Finish {
        span,
        route,
        method,
        status,
        started,
        in_flight,
    };
    response.map(|body| axum::body::Body::new(Metered::new(body, watcher)))
}

/// The host and port the client addressed (OpenTelemetry's `server.address` and
/// `server.port`), from the `Host` header or the URI's authority; the port is the scheme's
/// default when none is given. Left out when the request names none.
fn server_address(request: &Request) -> (Option<String>, Option<u16>) {
    let authority = request
        .uri()
        .authority()
        .map(|authority| authority.as_str().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(axum::http::header::HOST)
                .and_then(|host| host.to_str().ok())
                .map(str::to_owned)
        });
    let Some(authority) = authority.and_then(|a| a.parse::<axum::http::uri::Authority>().ok())
    else {
        return (None, None);
    };
    let port = authority.port_u16().or(match request.uri().scheme_str() {
        Some("https") => Some(443),
        _ => Some(80),
    });
    (Some(authority.host().to_owned()), port)
}

/// Makes `route`'s request series (answered `200`) exist from the start, at zero, so a
/// dashboard shows a rate of 0 rather than no data before the first request.
pub fn register_route(route: &str, method: &'static str) {
    metrics::counter!("plinth_http_requests_total", "route" => route.to_owned(), "method" => method, "status" => "200")
        .increment(0);
    let _ = metrics::histogram!("plinth_http_request_duration_seconds", "route" => route.to_owned(), "method" => method, "status" => "200");
}

/// Records a request once its body has ended.
struct Finish {
    span: tracing::Span,
    route: String,
    method: &'static str,
    status: u16,
    started: Instant,
    in_flight: metrics::Gauge,
}

impl Watcher for Finish {
    fn span(&self) -> Option<&tracing::Span> {
        Some(&self.span)
    }

    fn end(self, end: End) {
        // Server spans are errors for 5xx (OpenTelemetry's HTTP conventions), and for a body
        // that failed part-way, whose client got less than the status promised.
        if self.status >= 500 {
            self.span.record("otel.status_code", "error");
            self.span.record("error.type", self.status.to_string());
        } else if end == End::Failed {
            self.span.record("otel.status_code", "error");
            self.span.record("error.type", "body_failed");
        }
        self.in_flight.decrement(1.0);
        let (route, method, status) = (self.route, self.method, self.status.to_string());
        metrics::counter!("plinth_http_requests_total", "route" => route.clone(), "method" => method, "status" => status.clone())
            .increment(1);
        metrics::histogram!("plinth_http_request_duration_seconds", "route" => route, "method" => method, "status" => status)
            .record(self.started.elapsed().as_secs_f64());
    }
}
