//! gRPC plumbing shared by every Plinth service: the server (health, reflection, traces carried
//! in from metadata, per-rpc metrics, each call's credential checked against the RPC's rule,
//! optional TLS) and the client side (trace context and the caller's credential carried out).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub use crate::replicas::{
    CallRule, CallRules, Deadlines, KeepAlive, LONG_CALLS, Replicas, TargetError, grpc_timeout,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::{Interceptor, RoutesBuilder};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::Instrument;

use crate::admin::ReadinessCheck;
use crate::auth::{Principal, ServerAuth};
use crate::config::Secret;
use crate::metered::{End, Metered, Watcher};
use crate::reflection::{Descriptors, ReflectionError};
use crate::telemetry;
use crate::tls::TlsSettings;

/// Paths every caller may use without a credential: health probes.
const OPEN_PREFIX: &str = "/grpc.health.";
/// Paths any accepted credential may use, whatever its role: reflection.
const ANY_ROLE_PREFIX: &str = "/grpc.reflection.";
/// The health service every server answers.
const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// The reflection methods every server answers.
const REFLECTION_RPCS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Calls a capped server answered `UNAVAILABLE` at their deadline.
const DEADLINES_TOTAL: &str = "plinth_grpc_server_deadlines_total";
/// Calls a server refused before any work while it could not serve.
const REFUSED_TOTAL: &str = "plinth_grpc_server_refused_total";

/// A gRPC server with health and reflection, built up service by service.
pub struct GrpcServer {
    routes: RoutesBuilder,
    /// What the served services' methods are called: the only values the `rpc` label takes.
    descriptor_set: &'static [u8],
    served: Vec<&'static str>,
    health: HealthReporter,
    auth: ServerAuth,
    tls: Option<TlsSettings>,
    local: Option<LocalSlot>,
    caps: Option<CallRules>,
    refuse_unless: Option<ReadinessCheck>,
}

impl GrpcServer {
    /// A server that answers `grpc.health.v1` to anyone, reflection over `descriptor_set` to
    /// any caller `auth` accepts, and every other call only from the roles `auth`'s rules name.
    pub fn new(descriptor_set: &'static [u8], auth: ServerAuth) -> Self {
        telemetry::metrics();
        let (health, health_service) = tonic_health::server::health_reporter();
        let mut routes = RoutesBuilder::default();
        routes.add_service(health_service);
        GrpcServer {
            routes,
            descriptor_set,
            served: vec![HEALTH_SERVICE],
            health,
            auth,
            tls: None,
            local: None,
            caps: None,
            refuse_unless: None,
        }
    }

    /// Caps every call (health and reflection excepted) at its deadline under `rules` (see
    /// [`Deadlines`]): a call still working then (its database statement blackholed, say) is
    /// answered `UNAVAILABLE` saying so, and its work dropped, so that callers try another
    /// replica instead of waiting on this one.
    pub fn cap_calls(mut self, rules: CallRules) -> Self {
        // Counted from the start, so a dashboard sees 0 rather than nothing.
        metrics::counter!(DEADLINES_TOTAL).increment(0);
        metrics::counter!(REFUSED_TOTAL).increment(0);
        self.caps = Some(rules);
        self
    }

    /// Refuses every call (health and reflection excepted) at once while `check` (a
    /// [`crate::admin::watch`]ed check, which answers at once) fails: `UNAVAILABLE`, marked
    /// as refused before any work, so callers send even a call that is not idempotent to
    /// another replica. For a service that has replicas to fail over to: one whose database
    /// stopped answering turns callers away in a millisecond instead of a deadline.
    pub fn refuse_while_not_ready(mut self, check: ReadinessCheck) -> Self {
        self.refuse_unless = Some(check);
        self
    }

    /// Serves over TLS with `tls`'s certificate (and requires client certificates when it
    /// says so); plain HTTP/2 when `None`.
    pub fn tls(mut self, tls: Option<TlsSettings>) -> Self {
        self.tls = tls;
        self
    }

    /// Once serving, also answers calls made in this process through `slot` (see
    /// [`Transport::in_process`]): the same services, credential check, spans and metrics, without
    /// the network.
    pub fn answer_locally(mut self, slot: Option<LocalSlot>) -> Self {
        self.local = slot;
        self
    }

    /// The health reporter, for the service to say when it is serving.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Keeps the health status of `services` (the gRPC services one process serves over the
    /// same dependencies), and the server's overall status (service `""`), true to `check`
    /// (those dependencies, such as its database; a [`crate::admin::watch`]ed check answers at
    /// once): SERVING now, then re-checked four times a second until `shutdown`, so load balancers,
    /// the clients' replica probes and the gateway's `/readyz` see a service that lost its
    /// database. One check speaks for all of them, so they never disagree.
    pub async fn report_health(
        &self,
        services: &[&'static str],
        check: ReadinessCheck,
        shutdown: CancellationToken,
    ) {
        let mut services = services.to_vec();
        services.push("");
        let health = self.health.clone();
        for service in &services {
            health
                .set_service_status(*service, ServingStatus::Serving)
                .await;
        }
        crate::tasks::spawn(async move {
            let mut serving = true;
            // Until its dependencies first answer, the process is starting (a node waits to
            // register): not serving then is expected, and logged as such, not as an error.
            let mut answered = false;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
                let outcome = check().await;
                let status = match (&outcome, serving) {
                    (Err(reason), true) if answered => {
                        tracing::error!(?services, %reason, "a dependency does not answer; reporting NOT_SERVING");
                        Some(ServingStatus::NotServing)
                    }
                    (Err(reason), true) => {
                        tracing::info!(?services, %reason, "starting: NOT_SERVING until its dependencies answer");
                        Some(ServingStatus::NotServing)
                    }
                    (Ok(()), false) => {
                        tracing::info!(?services, "dependencies answer; reporting SERVING");
                        Some(ServingStatus::Serving)
                    }
                    _ => None,
                };
                answered |= outcome.is_ok();
                if let Some(status) = status {
                    for service in &services {
                        health.set_service_status(*service, status).await;
                    }
                }
                serving = outcome.is_ok();
            }
        });
    }

    /// Adds a service.
    pub fn add_service<S>(mut self, service: S) -> Self
    where
        S: tower::Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.served.push(S::NAME);
        self.routes.add_service(service);
        self
    }

    /// Reflection listing only the services this server serves (see [`add_reflection`]).
    fn add_reflection(&mut self) {
        if let Err(error) = add_reflection(&mut self.routes, self.descriptor_set, &self.served) {
            tracing::error!(%error, "gRPC reflection is off: the descriptor set does not load")
        }
    }

    /// Serves until `shutdown` is cancelled, then drains in-flight calls.
    pub async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        self.add_reflection();
        let layer = ServerLayer {
            auth: Arc::new(self.auth),
            rpcs: Arc::new(Rpcs::metered(self.descriptor_set, &self.served)),
            caps: self.caps.map(Arc::new),
            refuse_unless: self.refuse_unless,
        };
        let routes = self.routes.routes();
        if let Some(slot) = self.local {
            slot.fill(LocalService::new(tower::Layer::layer(
                &layer,
                routes.clone(),
            )));
        }
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.tls.as_ref().and_then(TlsSettings::server) {
            builder = builder.tls_config(tls)?;
        }
        builder
            .accept_http1(false)
            .layer(layer)
            .add_routes(routes)
            // Nagle's algorithm would hold a streamed response's later frames until the
            // client's delayed ACK (~40 ms per call): every accepted socket is TCP_NODELAY.
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown.cancelled_owned(),
            )
            .await
    }
}

/// Adds reflection to `routes`, v1 and v1alpha (which many tools still speak), over
/// `descriptor_set` and health's, listing `services` and reflection itself: only what the
/// server serves, though the set may describe more, and only what it describes (see
/// [`crate::reflection`]).
pub fn add_reflection(
    routes: &mut RoutesBuilder,
    descriptor_set: &'static [u8],
    services: &[&str],
) -> Result<(), ReflectionError> {
    let descriptors = Descriptors::new(
        &[descriptor_set, tonic_health::pb::FILE_DESCRIPTOR_SET],
        services,
    )?;
    let (v1, v1alpha) = crate::reflection::servers(descriptors);
    routes.add_service(v1);
    routes.add_service(v1alpha);
    Ok(())
}

/// Wraps every call: a server span in OpenTelemetry's RPC conventions that continues the
/// caller's trace, the credential and role check, and the request counter, latency histogram
/// and in-flight gauge, all recorded when the response stream ends.
#[derive(Clone)]
struct ServerLayer {
    auth: Arc<ServerAuth>,
    rpcs: Arc<Rpcs>,
    caps: Option<Arc<CallRules>>,
    refuse_unless: Option<ReadinessCheck>,
}

impl<S> tower::Layer<S> for ServerLayer {
    type Service = ServerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerService {
            inner,
            auth: self.auth.clone(),
            rpcs: self.rpcs.clone(),
            caps: self.caps.clone(),
            refuse_unless: self.refuse_unless.clone(),
        }
    }
}

#[derive(Clone)]
struct ServerService<S> {
    inner: S,
    auth: Arc<ServerAuth>,
    rpcs: Arc<Rpcs>,
    caps: Option<Arc<CallRules>>,
    refuse_unless: Option<ReadinessCheck>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for ServerService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path().to_owned();
        // A path this server does not serve is labelled `other`: naming it would let any
        // caller, even one refused, add series.
        let rpc = self.rpcs.get(&path);
        let span = server_span(&rpc, &path, request.headers());
        let call = Call::start(Side::Server, span.clone(), rpc.clone());
        let mut request = request;
        if !path.starts_with(OPEN_PREFIX) {
            match self.check(&path, request.headers()) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(status) => {
                    let _entered = span.enter();
                    if rpc.is_known() {
                        tracing::warn!(code = ?status.code(), "{}", status.message());
                    } else {
                        tracing::debug!(code = ?status.code(), %path, "{}", status.message());
                    }
                    call.finish(Some(status.code()), End::Complete);
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        }
        // Health and reflection answer whatever the dependencies do.
        let guarded = !path.starts_with(OPEN_PREFIX) && !path.starts_with(ANY_ROLE_PREFIX);
        let refuse_unless = self.refuse_unless.clone().filter(|_| guarded);
        let deadline = self
            .caps
            .as_ref()
            .filter(|_| guarded)
            .and_then(|rules| rules.deadlines().of(rules.rule_of(&path)));
        // The clone that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(
            async move {
                if let Some(check) = refuse_unless
                    && let Err(reason) = check().await
                {
                    tracing::debug!(%reason, "refusing a call: this replica cannot serve");
                    let mut response = tonic::Status::unavailable(format!(
                        "this replica cannot serve now ({reason}); the call was not processed: \
                         send it to another replica, or again shortly"
                    ))
                    .into_http();
                    response.headers_mut().insert(
                        crate::replicas::REFUSED_HEADER,
                        http::HeaderValue::from_static("not-processed"),
                    );
                    metrics::counter!(REFUSED_TOTAL).increment(1);
                    return Ok(call.watch(response));
                }
                let answered = match deadline {
                    Some(deadline) => match tokio::time::timeout(deadline, inner.call(request))
                        .await
                    {
                        Ok(answered) => answered,
                        Err(_) => {
                            tracing::warn!(
                                deadline_s = deadline.as_secs_f64(),
                                "a call did not finish within its deadline; answering UNAVAILABLE"
                            );
                            metrics::counter!(DEADLINES_TOTAL).increment(1);
                            return Ok(call.watch(
                                tonic::Status::unavailable(format!(
                                    "this replica did not finish the call within {:.1} s (what it \
                                     depends on, such as its database, may not be answering); \
                                     try again",
                                    deadline.as_secs_f64()
                                ))
                                .into_http(),
                            ));
                        }
                    },
                    None => inner.call(request).await,
                };
                match answered {
                    Ok(response) => Ok(call.watch(response)),
                    Err(error) => {
                        call.finish(Some(tonic::Code::Internal), End::Failed);
                        Err(error)
                    }
                }
            }
            .instrument(span),
        )
    }
}

/// The server side's spans and `plinth_grpc_server_*` metrics for gRPC calls answered by
/// something other than a [`GrpcServer`] (the gateway's public gRPC face): each call is
/// counted under its method (`other` for a path not among `served`'s methods, health's and
/// reflection's) and the status it ends with.
#[derive(Clone)]
pub struct ServerMeter {
    rpcs: Arc<Rpcs>,
}

impl ServerMeter {
    /// Meters the methods of the `served` services described in `descriptor_set`, and
    /// `grpc.health.v1` and reflection.
    pub fn new(descriptor_set: &'static [u8], served: &[&str]) -> Self {
        telemetry::metrics();
        let served: Vec<&str> = served.iter().copied().chain([HEALTH_SERVICE]).collect();
        ServerMeter {
            rpcs: Arc::new(Rpcs::metered(descriptor_set, &served)),
        }
    }

    /// Answers `request` with `answer`, inside the call's server span, counting the call from
    /// now until its response stream ends.
    pub async fn call<B, F>(
        &self,
        request: http::Request<B>,
        answer: impl FnOnce(http::Request<B>) -> F,
    ) -> http::Response<Body>
    where
        F: Future<Output = http::Response<Body>>,
    {
        let rpc = self.rpcs.get(request.uri().path());
        let span = server_span(&rpc, request.uri().path(), request.headers());
        let call = Call::start(Side::Server, span.clone(), rpc);
        let response = answer(request).instrument(span).await;
        call.watch(response)
    }
}

/// One gRPC method, as labels and span attributes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rpc {
    /// `/package.Service/Method`, or `other`.
    path: Arc<str>,
    /// `package.Service`.
    service: Arc<str>,
    /// `Method`.
    method: Arc<str>,
}

impl Rpc {
    fn parse(path: &str) -> Option<Rpc> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        if service.is_empty() || method.is_empty() || method.contains('/') {
            return None;
        }
        Some(Rpc {
            path: path.into(),
            service: service.into(),
            method: method.into(),
        })
    }

    fn other() -> Rpc {
        Rpc {
            path: "other".into(),
            service: "".into(),
            method: "".into(),
        }
    }

    fn is_known(&self) -> bool {
        !self.method.is_empty()
    }
}

/// The methods one server serves, read from its descriptor sets.
#[derive(Debug, Default)]
struct Rpcs(std::collections::HashMap<String, Rpc>);

impl Rpcs {
    /// Every method of `served` services described in `descriptor_sets`, with reflection.
    fn served(descriptor_sets: &[&[u8]], served: &[&str]) -> Rpcs {
        use prost::Message as _;
        let mut rpcs = std::collections::HashMap::new();
        for bytes in descriptor_sets {
            let set = match prost_types::FileDescriptorSet::decode(*bytes) {
                Ok(set) => set,
                Err(error) => {
                    tracing::error!(%error, "a descriptor set does not decode; its methods are labelled `other`");
                    continue;
                }
            };
            for file in &set.file {
                let package = file.package();
                for service in &file.service {
                    let name = if package.is_empty() {
                        service.name().to_owned()
                    } else {
                        format!("{package}.{}", service.name())
                    };
                    if !served.contains(&name.as_str()) {
                        continue;
                    }
                    for method in &service.method {
                        let path = format!("/{name}/{}", method.name());
                        if let Some(rpc) = Rpc::parse(&path) {
                            rpcs.insert(path, rpc);
                        }
                    }
                }
            }
        }
        for path in REFLECTION_RPCS {
            if let Some(rpc) = Rpc::parse(path) {
                rpcs.insert(path.to_owned(), rpc);
            }
        }
        Rpcs(rpcs)
    }

    /// The methods of `served` (described in `descriptor_set` or health's), each with its
    /// series made now (see [`Rpcs::with_series`]).
    fn metered(descriptor_set: &'static [u8], served: &[&str]) -> Self {
        Rpcs::served(
            &[descriptor_set, tonic_health::pb::FILE_DESCRIPTOR_SET],
            served,
        )
        .with_series()
    }

    /// These methods' series, made now: each method's calls answered `OK` at zero and none
    /// in flight, so a dashboard shows a served method before its first call.
    fn with_series(self) -> Self {
        for rpc in self.0.values() {
            let path = rpc.path.clone();
            metrics::counter!("plinth_grpc_server_requests_total", "rpc" => path.clone(), "code" => "OK")
                .increment(0);
            let _ = metrics::histogram!("plinth_grpc_server_request_duration_seconds", "rpc" => path.clone(), "code" => "OK");
            metrics::gauge!("plinth_grpc_server_requests_in_flight", "rpc" => path).increment(0.0);
        }
        self
    }

    fn get(&self, path: &str) -> Rpc {
        self.0.get(path).cloned().unwrap_or_else(Rpc::other)
    }
}

/// Which end of a call this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

impl Side {
    /// Whether `code` makes this side's span an error: every failure for a client; for a
    /// server only its own (OpenTelemetry's gRPC conventions), not a caller's bad request.
    fn is_error(self, code: tonic::Code) -> bool {
        use tonic::Code;
        match self {
            Side::Client => code != Code::Ok,
            Side::Server => matches!(
                code,
                Code::Unknown
                    | Code::DeadlineExceeded
                    | Code::Unimplemented
                    | Code::Internal
                    | Code::Unavailable
                    | Code::DataLoss
            ),
        }
    }
}

/// A status code's name as gRPC spells it (`NOT_FOUND`), for the `code` label.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The client side's [`Rpc`] for `path`, parsed once per method (the generated clients' paths
/// are a closed set).
fn client_rpc(path: &str) -> Rpc {
    static SEEN: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Rpc>>> =
        OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(rpc) = seen.get(path) {
        return rpc.clone();
    }
    let rpc = Rpc::parse(path).unwrap_or_else(Rpc::other);
    if seen.len() < 4096 {
        seen.insert(path.to_owned(), rpc.clone());
    }
    rpc
}

/// The server span of a call to `path`, in the caller's trace. Health checks are probes:
/// counted, never traced.
fn server_span(rpc: &Rpc, path: &str, headers: &http::HeaderMap) -> tracing::Span {
    let span = rpc_span(Side::Server, rpc);
    if path.starts_with(OPEN_PREFIX) {
        telemetry::unsampled(&span);
    } else {
        telemetry::extract(&span, headers);
        telemetry::record_trace_id(&span);
    }
    span
}

fn rpc_span(side: Side, rpc: &Rpc) -> tracing::Span {
    let name: &str = if rpc.is_known() {
        rpc.path.trim_start_matches('/')
    } else {
        "other"
    };
    let kind = match side {
        Side::Server => "server",
        Side::Client => "client",
    };
    tracing::info_span!(
        "grpc",
        otel.name = name,
        otel.kind = kind,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = &*rpc.service,
        rpc.method = &*rpc.method,
        rpc.grpc.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        // Recorded on the client side once a replica is chosen.
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
        // Recorded on the server side, where the trace enters this process.
        trace_id = tracing::field::Empty,
    )
}

/// One call being measured: counted in flight from [`Call::start`] until its response
/// stream ends, then counted and timed under its status code, read from the trailers when
/// the status comes there.
struct Call {
    side: Side,
    span: tracing::Span,
    rpc: Rpc,
    started: Instant,
    in_flight: metrics::Gauge,
    /// The status, once seen (in the headers of a trailers-only answer, or the trailers).
    code: Option<tonic::Code>,
}

impl Call {
    fn start(side: Side, span: tracing::Span, rpc: Rpc) -> Call {
        let in_flight = match side {
            Side::Server => {
                metrics::gauge!("plinth_grpc_server_requests_in_flight", "rpc" => rpc.path.clone())
            }
            Side::Client => {
                metrics::gauge!("plinth_grpc_client_requests_in_flight", "rpc" => rpc.path.clone())
            }
        };
        in_flight.increment(1.0);
        Call {
            side,
            span,
            rpc,
            started: Instant::now(),
            in_flight,
            code: None,
        }
    }

    /// Follows `response`'s body to its end.
    fn watch(mut self, response: http::Response<Body>) -> http::Response<Body> {
        self.code = response
            .headers()
            .get("grpc-status")
            .map(|value| tonic::Code::from_bytes(value.as_bytes()));
        response.map(|body| Body::new(Metered::new(body, self)))
    }

    fn finish(mut self, code: Option<tonic::Code>, end: End) {
        if code.is_some() {
            self.code = code;
        }
        Watcher::end(self, end);
    }
}

impl Watcher for Call {
    fn span(&self) -> Option<&tracing::Span> {
        // A server's stream is made as it is sent, in its call's span.
        matches!(self.side, Side::Server).then_some(&self.span)
    }

    fn frame(&mut self, frame: &http_body::Frame<bytes::Bytes>) {
        if let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status")) {
            self.code = Some(tonic::Code::from_bytes(status.as_bytes()));
        }
    }

    fn end(self, end: End) {
        let code = match (self.code, end) {
            (Some(code), _) => code,
            // The stream stopped before its status: the caller went away, or the peer did.
            (None, End::Dropped) => tonic::Code::Cancelled,
            (None, End::Failed | End::Complete) => tonic::Code::Unknown,
        };
        self.span.record("rpc.grpc.status_code", code as i64);
        if self.side.is_error(code) {
            self.span.record("otel.status_code", "error");
            self.span
                .record("otel.status_description", format!("{code:?}"));
            self.span.record("error.type", code_name(code));
        }
        self.in_flight.decrement(1.0);
        let elapsed = self.started.elapsed().as_secs_f64();
        // Labels without allocating: the path is shared, the code's name static.
        let (rpc, code) = (self.rpc.path.clone(), code_name(code));
        match self.side {
            Side::Server => {
                metrics::counter!("plinth_grpc_server_requests_total", "rpc" => rpc.clone(), "code" => code)
                    .increment(1);
                metrics::histogram!("plinth_grpc_server_request_duration_seconds", "rpc" => rpc, "code" => code)
                    .record(elapsed);
            }
            Side::Client => {
                metrics::counter!("plinth_grpc_client_requests_total", "rpc" => rpc.clone(), "code" => code)
                    .increment(1);
                metrics::histogram!("plinth_grpc_client_request_duration_seconds", "rpc" => rpc, "code" => code)
                    .record(elapsed);
            }
        }
    }
}

impl<S> ServerService<S> {
    /// Who the call's credential says it is, if it may call `path`.
    fn check(&self, path: &str, headers: &http::HeaderMap) -> Result<Principal, tonic::Status> {
        let Some(principal) = self.auth.accepted.authenticate_headers(headers) else {
            return Err(tonic::Status::unauthenticated(
                "this service needs an internal credential it accepts (`internal.credential` or \
                 PLINTH_INTERNAL_CREDENTIAL in the caller, `[[internal.accept]]` here)",
            ));
        };
        if path.starts_with(ANY_ROLE_PREFIX) || self.auth.access.allows(path, principal.role) {
            return Ok(principal);
        }
        Err(tonic::Status::permission_denied(format!(
            "a {} credential may not call {path}",
            principal.role
        )))
    }
}

pub use crate::auth::constant_time_eq;

/// A service's whole call stack (credential check, spans, metrics, routing), called directly.
type LocalService =
    tower::util::BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

/// Where a service running in this process can be called directly, once it serves. Made by
/// whoever starts the services together (`plinth serve`), given to the service's
/// [`GrpcServer::answer_locally`] and to its callers' [`Transport::in_process`].
#[derive(Clone, Default)]
pub struct LocalSlot(Arc<OnceLock<LocalService>>);

impl LocalSlot {
    fn fill(&self, service: LocalService) {
        // A slot is given to one server; a second fill would be a wiring mistake, and the
        // first service stays.
        if self.0.set(service).is_err() {
            tracing::warn!("a local call slot was filled twice; keeping the first service");
        }
    }
}

impl std::fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSlot")
            .field("serving", &self.0.get().is_some())
            .finish()
    }
}

/// How a client reaches another Plinth service: over gRPC to its replicas (balanced, see
/// [`Replicas`]), or, when the service runs in the same process and is serving, by calling its
/// stack directly. A direct call is
/// still a gRPC call (messages are encoded, the credential checked, the span and metrics recorded
/// by the same server code); it skips HTTP/2 over loopback, whose connection and buffer tasks
/// cost about 0.3 ms of thread hand-offs per call.
#[derive(Clone)]
pub struct Transport {
    remote: Replicas,
    local: Option<LocalSlot>,
    /// The direct path, chosen when the caller polled ready, for the call that follows.
    chosen: Option<LocalService>,
}

impl Transport {
    /// Over the network only.
    pub fn remote(remote: Replicas) -> Self {
        Transport {
            remote,
            local: None,
            chosen: None,
        }
    }

    /// Directly once `slot`'s service serves; over the network until then.
    pub fn in_process(remote: Replicas, slot: LocalSlot) -> Self {
        Transport {
            remote,
            local: Some(slot),
            chosen: None,
        }
    }

    /// `Ok` when `service` is SERVING in this process (when it serves it here), else on at
    /// least one replica (see [`Replicas::any_serving`]).
    pub async fn any_serving(
        &self,
        service: &str,
        within: Duration,
    ) -> Result<(), crate::replicas::NotServing> {
        if self
            .local
            .as_ref()
            .is_some_and(|slot| slot.0.get().is_some())
        {
            let mut client = tonic_health::pb::health_client::HealthClient::new(self.clone());
            let check = client.check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            });
            return crate::replicas::health_answer(check, within)
                .await
                .map_err(crate::replicas::NotServing::InProcess);
        }
        self.remote.any_serving(service, within).await
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("remote", &self.remote)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl tower::Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.chosen.is_none() {
            self.chosen = self.local.as_ref().and_then(|slot| slot.0.get().cloned());
        }
        // The replicas' channels are polled for readiness by the call itself, once it knows
        // which replica it goes to.
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The paths are the generated clients' own: a closed set.
        let rpc = client_rpc(request.uri().path());
        let span = rpc_span(Side::Client, &rpc);
        // The server's span is this call's child, across the network or within the process.
        telemetry::inject(&span, request.headers_mut());
        let call = Call::start(Side::Client, span.clone(), rpc);
        let response: BoxFuture<Result<http::Response<Body>, Self::Error>> =
            match self.chosen.take() {
                Some(service) => Box::pin(async move {
                    match tower::ServiceExt::oneshot(service, request).await {
                        Ok(response) => Ok(response),
                        Err(never) => match never {},
                    }
                }),
                None => {
                    let remote = self.remote.clone();
                    Box::pin(async move { remote.call(request).await })
                }
            };
        Box::pin(
            async move {
                match response.await {
                    Ok(response) => Ok(call.watch(response)),
                    Err(error) => {
                        // Not connected, or the connection broke: tonic answers Unavailable.
                        call.finish(Some(tonic::Code::Unavailable), End::Failed);
                        Err(error)
                    }
                }
            }
            .instrument(span),
        )
    }
}

/// Carries the caller's trace context and its credential on every outgoing call.
#[derive(Clone)]
pub struct ClientInterceptor {
    credential: Arc<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl ClientInterceptor {
    /// An interceptor that sends `credential` as a bearer token.
    pub fn new(credential: &Secret) -> Result<Self, InvalidToken> {
        let credential = Arc::new(
            format!("Bearer {}", credential.expose())
                .parse()
                .map_err(|_| InvalidToken)?,
        );
        Ok(ClientInterceptor { credential })
    }
}

/// The credential holds characters that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("the internal credential must be printable ASCII")]
pub struct InvalidToken;

impl Interceptor for ClientInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let mut headers = http::HeaderMap::new();
        telemetry::inject(&tracing::Span::current(), &mut headers);
        let metadata = request.metadata_mut();
        for (name, value) in &headers {
            if let (Ok(key), Ok(value)) = (
                tonic::metadata::AsciiMetadataKey::from_bytes(name.as_str().as_bytes()),
                tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()),
            ) {
                metadata.insert(key, value);
            }
        }
        metadata.insert("authorization", self.credential.as_ref().clone());
        Ok(request)
    }
}

/// How one process takes part in calls between services: its own credential (sent on the
/// calls it makes), the credentials it accepts (on the calls it answers), and TLS for both.
#[derive(Clone, Debug, Default)]
pub struct Internal {
    /// What this process sends; required by every process that calls another.
    pub credential: Option<Secret>,
    /// Who may call this process's services.
    pub accepted: Arc<crate::auth::Accepted>,
    /// Certificates, when the deployment uses TLS between services.
    pub tls: Option<TlsSettings>,
    /// Which calls may be sent again to another replica (from the services' descriptors).
    pub calls: CallRules,
}

/// A process that calls other services was given no credential to call them with.
#[derive(Debug, thiserror::Error)]
#[error(
    "the {0} calls other services and needs its own internal credential: set \
     PLINTH_INTERNAL_CREDENTIAL (or `internal.credential_file`); `plinth credential new --role {0}` makes one"
)]
pub struct MissingCredential(pub &'static str);

/// Why a process cannot make its clients.
#[derive(Debug, thiserror::Error)]
pub enum ClientSetupError {
    /// No credential.
    #[error(transparent)]
    Missing(#[from] MissingCredential),
    /// A credential that cannot travel in a header.
    #[error(transparent)]
    Invalid(#[from] InvalidToken),
}

impl Internal {
    /// The interceptor that sends this process's credential; `role` names the process in the
    /// error when it has none.
    pub fn interceptor(&self, role: &'static str) -> Result<ClientInterceptor, ClientSetupError> {
        let credential = self.credential.as_ref().ok_or(MissingCredential(role))?;
        Ok(ClientInterceptor::new(credential)?)
    }

    /// A gRPC server that checks callers against what this process accepts and `access`.
    pub fn server(&self, descriptor_set: &'static [u8], access: crate::auth::Access) -> GrpcServer {
        GrpcServer::new(
            descriptor_set,
            ServerAuth {
                accepted: self.accepted.clone(),
                access,
            },
        )
        .tls(self.tls.clone())
    }

    /// The replicas at `urls` (one URL, or several separated by commas; names are resolved
    /// to every address), connected on first use and again as needed, so services can start
    /// in any order. `https://` ones are reached over TLS, verified against this process's CA
    /// and presenting its certificate.
    pub fn connect(&self, urls: &str) -> Result<Replicas, TargetError> {
        self.connect_with(urls, KeepAlive::default())
    }

    /// As [`Internal::connect`], pinging each connection as `keep_alive` says.
    pub fn connect_with(&self, urls: &str, keep_alive: KeepAlive) -> Result<Replicas, TargetError> {
        Replicas::with_keep_alive(
            urls,
            self.tls.as_ref().and_then(TlsSettings::client),
            self.calls.clone(),
            keep_alive,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    /// A server stack in front of `inner`, serving health (an open method) only.
    fn server<S>(inner: S) -> ServerService<S> {
        telemetry::metrics();
        ServerService {
            inner,
            auth: Arc::new(ServerAuth {
                accepted: Arc::new(crate::auth::Accepted::default()),
                access: crate::auth::Access(&[]),
            }),
            rpcs: Arc::new(Rpcs::served(
                &[tonic_health::pb::FILE_DESCRIPTOR_SET],
                &[HEALTH_SERVICE],
            )),
            caps: None,
            refuse_unless: None,
        }
    }

    fn series(metrics: &str, name: &str) -> Vec<String> {
        metrics
            .lines()
            .filter(|line| line.starts_with(name))
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn a_status_in_the_trailers_is_counted_under_its_code_when_the_stream_ends() {
        let mut service = server(tower::service_fn(|_request: http::Request<Body>| async {
            let (frames, receiver) = tokio::sync::mpsc::channel(4);
            crate::tasks::spawn(async move {
                let _ = frames
                    .send(Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(
                        b"\0\0\0\0\0",
                    ))))
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("5"));
                let _ = frames.send(Ok(Frame::trailers(trailers))).await;
            });
            let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
            Ok::<_, Infallible>(http::Response::new(Body::new(body)))
        }));
        let request = http::Request::builder()
            .uri("/grpc.health.v1.Health/Watch")
            .body(Body::empty())
            .expect("test setup");
        let response = tower::Service::call(&mut service, request)
            .await
            .expect("test setup");
        let before = telemetry::render_metrics();
        assert!(
            series(&before, "plinth_grpc_server_requests_total").is_empty(),
            "nothing is counted before the stream ends: {before}"
        );
        assert!(
            before.contains(
                "plinth_grpc_server_requests_in_flight{rpc=\"/grpc.health.v1.Health/Watch\"} 1"
            ),
            "{before}"
        );
        response.into_body().collect().await.expect("test setup");

        let after = telemetry::render_metrics();
        assert_eq!(
            series(&after, "plinth_grpc_server_requests_total"),
            [
                "plinth_grpc_server_requests_total{rpc=\"/grpc.health.v1.Health/Watch\",code=\"NOT_FOUND\"} 1"
            ]
        );
        let sum = series(&after, "plinth_grpc_server_request_duration_seconds_sum")
            .first()
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .expect("a duration");
        assert!(sum >= 0.3, "timed to the trailers, not the headers: {sum}");
        assert!(
            after.contains(
                "plinth_grpc_server_requests_in_flight{rpc=\"/grpc.health.v1.Health/Watch\"} 0"
            ),
            "{after}"
        );
    }

    #[tokio::test]
    async fn paths_nobody_serves_add_no_series_even_when_refused() {
        let mut service = server(tower::service_fn(|_request: http::Request<Body>| async {
            Ok::<_, Infallible>(tonic::Status::unimplemented("").into_http())
        }));
        for n in 0..20 {
            let request = http::Request::builder()
                .uri(format!("/junk{n}.Service/Method{n}"))
                .body(Body::empty())
                .expect("test setup");
            let response = tower::Service::call(&mut service, request)
                .await
                .expect("test setup");
            response.into_body().collect().await.expect("test setup");
        }
        let metrics = telemetry::render_metrics();
        assert!(!metrics.contains("junk"), "{metrics}");
        assert_eq!(
            series(&metrics, "plinth_grpc_server_requests_total"),
            ["plinth_grpc_server_requests_total{rpc=\"other\",code=\"UNAUTHENTICATED\"} 20"]
        );
    }
}
