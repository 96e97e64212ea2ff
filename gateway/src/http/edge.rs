//! The gateway's own limits, in front of every API route, so that no caller can take more
//! than its share of the gateway:
//!
//! - a **rate per token**: a token bucket for each configured bearer token (refilled at
//!   `rate_per_second`, holding up to `burst`); a request past it is `429 rate_limited` with
//!   `Retry-After`, and other tokens are not affected. Requests without a configured token are
//!   not counted here: they are refused as unauthenticated at once, or, with no tokens
//!   configured (loopback only, one scope), there is no one to tell apart;
//! - a bound on **requests in flight**, streamed answers included until their last byte, in
//!   all and per client (its token; else the workspace adapter it calls; else its address),
//!   so that one client's slow requests cannot take every place: past either, `503
//!   unavailable` with `Retry-After` at once rather than a queue;
//! - a **deadline** from a request's arrival to its answer's head. A streamed answer (a
//!   followed build log, a streamed exec) sends its head at once, so the deadline never cuts
//!   it. Routes whose answer waits on work the caller asked for and that has its own limit (a
//!   command runs to its time limit; a session's version is materialized on its node) or on a
//!   body the caller is streaming in (bounded by its size limit) are not under it; see
//!   [`answers_when_work_ends`].
//!
//! The order, outermost first: rate, in flight, deadline; a request refused by its rate takes
//! no place in flight.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::http::auth::Tokens;
use crate::http::error::{self, ApiError};

/// The limits, as configured.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    /// Requests per second each token may make, sustained; 0 for no limit.
    pub rate_per_second: u32,
    /// Requests a token may make at once above its rate (the bucket's size).
    pub rate_burst: u32,
    /// From a request's arrival to its answer's head (outside the routes that run work with
    /// limits of their own).
    pub request_timeout: Duration,
    /// Requests in flight at once, streamed answers included.
    pub max_concurrent_requests: usize,
    /// Requests in flight at once from one client: one token, or one address for requests
    /// without a configured token.
    pub max_concurrent_requests_per_client: usize,
    /// Workspace-adapter bodies read at once before their signature is known.
    pub max_unverified_bodies: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            rate_per_second: 100,
            rate_burst: 200,
            request_timeout: Duration::from_secs(60),
            max_concurrent_requests: 1024,
            max_concurrent_requests_per_client: 256,
            max_unverified_bodies: 4,
        }
    }
}

/// Whether a route's answer waits on work with a limit of its own, or on a body the caller
/// streams in, so that the request deadline does not apply to it. Every other route answers
/// within the deadline or is cut.
pub fn answers_when_work_ends(method: &Method, route: &str) -> bool {
    matches!(
        (method.as_str(), route),
        // A command runs until it ends or hits its own time limit.
        ("POST", "/v1/sessions/{id}/exec")
            | ("POST", "/v1/workspace-adapters/{id}/novo")
            | ("POST", "/v1/workspace-adapters/{id}/brain/v1/operations")
            // Attaching a session materializes its version on the node.
            | ("POST", "/v1/sessions")
            | ("POST", "/v1/tasks")
            // The body streams in at the caller's pace, bounded by the size limits.
            | ("POST", "/v1/environments/{id}/import")
            | ("PUT", "/v1/environments/{id}/files/{*path}")
            | ("PUT", "/v1/sessions/{id}/files/{*path}")
    )
}

/// A token bucket: `burst` calls at once, refilled at `rate` calls a second (one token's at the
/// edge, one adapter's in the agents' adapters module).
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    /// A bucket holding `burst` calls at `now`.
    pub(crate) fn full(burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            refilled: now,
        }
    }

    /// Whether it would be full again at `now`: its holder was idle long enough.
    pub(crate) fn full_at(&self, now: Instant, rate: f64, burst: f64) -> bool {
        self.tokens + now.duration_since(self.refilled).as_secs_f64() * rate >= burst
    }

    /// Takes one call at `now`, or answers the whole seconds (at least 1) until one is back.
    pub(crate) fn take(&mut self, now: Instant, rate: f64, burst: f64) -> Result<(), u64> {
        let refill = now.duration_since(self.refilled).as_secs_f64() * rate;
        self.tokens = (self.tokens + refill).min(burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - self.tokens) / rate).ceil();
            Err((wait as u64).max(1))
        }
    }
}

/// The limits' shared state.
pub(crate) struct Edge {
    limits: EdgeLimits,
    tokens: Arc<Tokens>,
    /// One per configured token, by its position.
    buckets: Vec<Mutex<Bucket>>,
    in_flight: Arc<Semaphore>,
    /// Requests in flight per client; a client with none has no entry.
    clients: Mutex<HashMap<Client, usize>>,
}

/// Who a request's place in flight is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Client {
    /// A configured token, by its position.
    Token(usize),
    /// A workspace adapter's runtime (which signs its calls instead), by the adapter's id.
    Adapter(String),
    /// The address of any other client.
    Address(IpAddr),
}

impl Client {
    /// Whom `request` is counted against: its token, else the workspace adapter it calls,
    /// else the address it came from.
    fn of(edge: &Edge, request: &Request) -> Option<Client> {
        let token = edge.tokens.identify(
            request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|value| value.as_bytes()),
        );
        if let Some(index) = token {
            return Some(Client::Token(index));
        }
        let adapter = request
            .uri()
            .path()
            .strip_prefix("/v1/workspace-adapters/")
            .and_then(|rest| rest.split_once('/'))
            .map(|(id, _)| id)
            .filter(|id| !id.is_empty() && id.len() <= 128);
        if let Some(id) = adapter {
            return Some(Client::Adapter(id.to_owned()));
        }
        request
            .extensions()
            .get::<ClientAddress>()
            .map(|ClientAddress(address)| Client::Address(*address))
    }
}

/// The address a request came from, set by the connection that carried it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddress(pub(crate) IpAddr);

/// One request's place among its client's requests in flight, given back when dropped.
struct ClientPlace {
    edge: Arc<Edge>,
    client: Client,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut clients = self
            .edge
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = clients.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

impl Edge {
    pub(crate) fn new(limits: EdgeLimits, tokens: Arc<Tokens>) -> Arc<Self> {
        let now = Instant::now();
        let buckets = (0..tokens.count())
            .map(|_| Mutex::new(Bucket::full(f64::from(limits.rate_burst.max(1)), now)))
            .collect();
        Arc::new(Edge {
            limits,
            tokens,
            buckets,
            in_flight: Arc::new(Semaphore::new(limits.max_concurrent_requests.max(1))),
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a place for one more of `client`'s requests, unless it has its most in flight.
    fn admit(self: &Arc<Self>, client: Client) -> Option<ClientPlace> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = clients.entry(client.clone()).or_insert(0);
        if *count >= self.limits.max_concurrent_requests_per_client.max(1) {
            return None;
        }
        *count += 1;
        Some(ClientPlace {
            edge: self.clone(),
            client,
        })
    }

    /// Takes one request from token `index`'s bucket, or answers how many whole seconds until
    /// one is there.
    fn take(&self, index: usize) -> Result<(), u64> {
        let rate = f64::from(self.limits.rate_per_second);
        if rate <= 0.0 {
            return Ok(());
        }
        let Some(bucket) = self.buckets.get(index) else {
            return Ok(());
        };
        let burst = f64::from(self.limits.rate_burst.max(1));
        let mut bucket = bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        bucket.take(Instant::now(), rate, burst)
    }
}

/// Every reason the edge refuses for, so each series exists (at 0) from the start.
pub(crate) const REFUSAL_REASONS: [&str; 7] = [
    "rate_limited",
    "max_concurrent_requests",
    "max_concurrent_requests_per_client",
    "request_timeout",
    "novo_unverified_bodies",
    "host_not_allowed",
    "origin_not_allowed",
];

/// Makes the refusal counters' series, at 0.
pub(crate) fn register_refusals() {
    plinth_kit::telemetry::metrics();
    for reason in REFUSAL_REASONS {
        metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(0);
    }
}

fn refused(reason: &'static str) {
    metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(1);
}

/// `429 rate_limited` past a token's rate.
pub(crate) async fn rate_limit(
    State(edge): State<Arc<Edge>>,
    request: Request,
    next: Next,
) -> Response {
    let token = edge.tokens.identify(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes()),
    );
    if let Some(index) = token
        && let Err(wait) = edge.take(index)
    {
        refused("rate_limited");
        let limits = &edge.limits;
        return error::retry_after(
            ErrorCode::RateLimited,
            format!(
                "this token may make {} requests per second ({} at once); retry after {wait} s",
                limits.rate_per_second, limits.rate_burst
            ),
            wait,
        )
        .into_response();
    }
    next.run(request).await
}

/// `503 unavailable` past the requests in flight, in all or from the request's client; a
/// place is held until the answer's last byte is sent (or the client goes away).
pub(crate) async fn in_flight(
    State(edge): State<Arc<Edge>>,
    request: Request,
    next: Next,
) -> Response {
    let own = match Client::of(&edge, &request).map(|client| edge.admit(client)) {
        Some(None) => {
            refused("max_concurrent_requests_per_client");
            return error::retry_after(
                ErrorCode::Unavailable,
                format!(
                    "this client has its most requests in flight at once ({}, \
                     gateway.max_concurrent_requests_per_client); retry when one has ended",
                    edge.limits.max_concurrent_requests_per_client
                ),
                1,
            )
            .into_response();
        }
        Some(Some(place)) => Some(place),
        None => None,
    };
    let Ok(place) = edge.in_flight.clone().try_acquire_owned() else {
        refused("max_concurrent_requests");
        return error::retry_after(
            ErrorCode::Unavailable,
            format!(
                "the gateway is serving its most requests at once ({}); retry shortly",
                edge.limits.max_concurrent_requests
            ),
            1,
        )
        .into_response();
    };
    next.run(request).await.map(|body| {
        Body::new(Holding {
            body,
            _held: (place, own),
        })
    })
}

/// An answer's body with what its request holds (its place in flight at the edge, its place
/// on the connection), given back when the body is done with.
pub(crate) struct Holding<H> {
    pub(crate) body: Body,
    pub(crate) _held: H,
}

impl<H: Unpin> http_body::Body for Holding<H> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// `503 unavailable` when a request's answer has no head after the deadline.
pub(crate) async fn deadline(
    State(edge): State<Arc<Edge>>,
    request: Request,
    next: Next,
) -> Response {
    let exempt = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|route| answers_when_work_ends(request.method(), route.as_str()));
    if exempt {
        return next.run(request).await;
    }
    let limit = edge.limits.request_timeout;
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            refused("request_timeout");
            ApiError(PlinthError::new(
                ErrorCode::Unavailable,
                format!(
                    "the request did not finish within {} s (gateway.request_timeout_seconds); \
                     retry, and if it persists, the server log may say why",
                    limit.as_secs()
                ),
            ))
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use plinth_kit::config::Secret;

    fn edge(rate: u32, burst: u32) -> Arc<Edge> {
        Edge::new(
            EdgeLimits {
                rate_per_second: rate,
                rate_burst: burst,
                ..EdgeLimits::default()
            },
            Arc::new(Tokens::new(vec![
                (Secret::new("tok-a"), "acme".into()),
                (Secret::new("tok-b"), "globex".into()),
            ])),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn each_token_has_its_own_bucket_that_refills_at_its_rate() {
        let edge = edge(2, 3);
        for _ in 0..3 {
            edge.take(0).expect("within the burst");
        }
        assert_eq!(edge.take(0), Err(1), "empty: a whole second to wait");
        edge.take(1).expect("another token is not affected");
        tokio::time::advance(Duration::from_millis(500)).await;
        edge.take(0).expect("one more after half a second at 2/s");
        assert!(edge.take(0).is_err());
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            edge.take(0).expect("refilled up to the burst only");
        }
        assert!(edge.take(0).is_err());
        let unlimited = self::edge(0, 1);
        for _ in 0..1000 {
            unlimited.take(0).expect("0 is no limit");
        }
    }

    /// A router with the edge's layers over a slow route, an exempt slow route and a route
    /// whose answer streams until told to end.
    fn app(limits: EdgeLimits) -> (axum::Router, tokio::sync::mpsc::Sender<()>) {
        use axum::routing::{get, post};
        let (end, ended) = tokio::sync::mpsc::channel::<()>(1);
        let ended = Arc::new(tokio::sync::Mutex::new(Some(ended)));
        let edge = Edge::new(limits, Arc::new(Tokens::new(Vec::new())));
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "slow"
        };
        let router = axum::Router::new()
            .route("/v1/environments", get(slow))
            .route("/v1/sessions/{id}/exec", post(slow))
            .route(
                "/stream",
                get(move || {
                    let ended = ended.clone();
                    async move {
                        let mut ended = ended.lock().await.take().expect("one stream");
                        let body = futures::stream::once(async move {
                            ended.recv().await;
                            Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"end"))
                        });
                        Body::from_stream(body)
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(edge.clone(), deadline))
            .layer(axum::middleware::from_fn_with_state(edge, in_flight));
        (router, end)
    }

    fn request(method: Method, uri: &str) -> Request {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_deadline_a_request_is_cut_unless_its_route_runs_work_with_its_own_limit() {
        use tower::ServiceExt as _;
        let limits = EdgeLimits {
            request_timeout: Duration::from_secs(1),
            ..EdgeLimits::default()
        };
        let (router, _end) = app(limits);
        let cut = router
            .clone()
            .oneshot(request(Method::GET, "/v1/environments"))
            .await
            .expect("answer");
        assert_eq!(cut.status(), 503);
        let body = cut.into_body().collect().await.expect("body").to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(body["error"]["code"], "unavailable");
        let ran = router
            .oneshot(request(Method::POST, "/v1/sessions/s/exec"))
            .await
            .expect("answer");
        assert_eq!(ran.status(), 200, "a command is not cut");
    }

    #[tokio::test]
    async fn a_place_in_flight_is_held_until_the_answer_has_been_sent() {
        use tower::ServiceExt as _;
        let limits = EdgeLimits {
            max_concurrent_requests: 1,
            request_timeout: Duration::from_secs(1),
            ..EdgeLimits::default()
        };
        let (router, end) = app(limits);
        let streaming = router
            .clone()
            .oneshot(request(Method::GET, "/stream"))
            .await
            .expect("head");
        assert_eq!(streaming.status(), 200);
        // The head is sent, the body is not: the place is still taken, past the deadline too.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let refused = router
            .clone()
            .oneshot(request(Method::GET, "/nowhere"))
            .await
            .expect("answer");
        assert_eq!(refused.status(), 503);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        end.send(()).await.expect("end the stream");
        let body = streaming
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(body.as_ref(), b"end", "the stream was not cut");
        let served = router
            .oneshot(request(Method::GET, "/nowhere"))
            .await
            .expect("answer");
        assert_eq!(served.status(), 404, "the place is free again");
        assert!(
            http_body::Body::size_hint(served.body()).exact().is_some(),
            "a whole answer keeps its length"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_holding_its_places_leaves_the_others_served() {
        use tower::ServiceExt as _;
        let limits = EdgeLimits {
            max_concurrent_requests_per_client: 1,
            ..EdgeLimits::default()
        };
        let (router, _end) = app(limits);
        let from = |address: [u8; 4], uri: &str| {
            let mut request = request(Method::GET, uri);
            request
                .extensions_mut()
                .insert(ClientAddress(IpAddr::from(address)));
            request
        };
        // One client's slow request holds its only place; the slow route answers after 5 s.
        let held = plinth_kit::tasks::spawn(
            router
                .clone()
                .oneshot(from([10, 0, 0, 1], "/v1/environments")),
        );
        tokio::task::yield_now().await;
        let refused = router
            .clone()
            .oneshot(from([10, 0, 0, 1], "/nowhere"))
            .await
            .expect("answer");
        assert_eq!(refused.status(), 503);
        let body = refused
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|text| text.contains("max_concurrent_requests_per_client")),
            "{body}"
        );
        // Another address, and the same one on a workspace adapter's route, are their own.
        let other = router
            .clone()
            .oneshot(from([10, 0, 0, 2], "/nowhere"))
            .await
            .expect("answer");
        assert_eq!(other.status(), 404);
        let adapter = router
            .clone()
            .oneshot(from([10, 0, 0, 1], "/v1/workspace-adapters/wa_1/novo"))
            .await
            .expect("answer");
        assert_eq!(adapter.status(), 404);
        let held = held.await.expect("task").expect("answer");
        assert_eq!(held.status(), 200);
        let _ = held.into_body().collect().await.expect("body");
        let again = router
            .oneshot(from([10, 0, 0, 1], "/nowhere"))
            .await
            .expect("answer");
        assert_eq!(again.status(), 404, "its place is free again");
    }

    #[test]
    fn only_routes_with_limits_of_their_own_escape_the_deadline() {
        assert!(answers_when_work_ends(
            &Method::POST,
            "/v1/sessions/{id}/exec"
        ));
        assert!(answers_when_work_ends(
            &Method::PUT,
            "/v1/environments/{id}/files/{*path}"
        ));
        assert!(!answers_when_work_ends(
            &Method::GET,
            "/v1/environments/{id}/files/{*path}"
        ));
        assert!(!answers_when_work_ends(
            &Method::GET,
            "/v1/sessions/{id}/exec"
        ));
        assert!(!answers_when_work_ends(&Method::POST, "/v1/environments"));
    }
}
