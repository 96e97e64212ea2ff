//! gRPC plumbing shared by every Plinth service: the server (health, reflection, traces carried
//! in from metadata, per-rpc metrics, the internal token) and the client side (trace context
//! and the internal token carried out).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::{Interceptor, RoutesBuilder};
use tonic::transport::{Channel, Endpoint};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::Instrument;

use crate::admin::ReadinessCheck;
use crate::config::Secret;
use crate::telemetry;

/// Paths every caller may use without the internal token: probes and reflection.
const OPEN_PREFIXES: [&str; 2] = ["/grpc.health.", "/grpc.reflection."];

/// A gRPC server with health and reflection, built up service by service.
pub struct GrpcServer {
    routes: RoutesBuilder,
    health: HealthReporter,
    internal_token: Option<Secret>,
    local: Option<LocalSlot>,
}

impl GrpcServer {
    /// A server that answers `grpc.health.v1` and reflection over `descriptor_set`, and, when
    /// `internal_token` is set, refuses every other call that does not carry it.
    pub fn new(descriptor_set: &'static [u8], internal_token: Option<Secret>) -> Self {
        telemetry::metrics();
        let (health, health_service) = tonic_health::server::health_reporter();
        let mut routes = RoutesBuilder::default();
        routes.add_service(health_service);
        match tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(descriptor_set)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
        {
            Ok(reflection) => {
                routes.add_service(reflection);
            }
            Err(error) => {
                tracing::error!(%error, "gRPC reflection is off: the descriptor set does not load")
            }
        }
        GrpcServer {
            routes,
            health,
            internal_token,
            local: None,
        }
    }

    /// Once serving, also answers calls made in this process through `slot` (see
    /// [`Transport::in_process`]): the same services, token check, spans and metrics, without
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
    /// same dependencies) true to `check` (those dependencies, such as its database): SERVING
    /// now, then re-checked every 5 s until `shutdown`, so load balancers and the gateway's
    /// `/readyz` see a service that lost its database. One check speaks for all of them, so
    /// they never disagree.
    pub async fn report_health(
        &self,
        services: &[&'static str],
        check: ReadinessCheck,
        shutdown: CancellationToken,
    ) {
        let services = services.to_vec();
        let health = self.health.clone();
        for service in &services {
            health
                .set_service_status(*service, ServingStatus::Serving)
                .await;
        }
        crate::tasks::spawn(async move {
            let mut serving = true;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
                let outcome = check().await;
                let status = match (&outcome, serving) {
                    (Err(reason), true) => {
                        tracing::error!(?services, %reason, "a dependency does not answer; reporting NOT_SERVING");
                        Some(ServingStatus::NotServing)
                    }
                    (Ok(()), false) => {
                        tracing::info!(?services, "dependencies answer again; reporting SERVING");
                        Some(ServingStatus::Serving)
                    }
                    _ => None,
                };
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
        self.routes.add_service(service);
        self
    }

    /// Serves until `shutdown` is cancelled, then drains in-flight calls.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        let layer = ServerLayer {
            internal_token: self.internal_token.map(Arc::new),
        };
        let routes = self.routes.routes();
        if let Some(slot) = self.local {
            slot.fill(LocalService::new(tower::Layer::layer(
                &layer,
                routes.clone(),
            )));
        }
        tonic::transport::Server::builder()
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

/// Wraps every call: a `grpc.server` span that continues the caller's trace, the internal
/// token check, and the request counter and latency histogram.
#[derive(Clone)]
struct ServerLayer {
    internal_token: Option<Arc<Secret>>,
}

impl<S> tower::Layer<S> for ServerLayer {
    type Service = ServerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerService {
            inner,
            internal_token: self.internal_token.clone(),
        }
    }
}

#[derive(Clone)]
struct ServerService<S> {
    inner: S,
    internal_token: Option<Arc<Secret>>,
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
        let span = tracing::info_span!("grpc.server", otel.kind = "server", rpc = %path, grpc.code = tracing::field::Empty);
        telemetry::extract(&span, request.headers());
        let open = OPEN_PREFIXES.iter().any(|prefix| path.starts_with(prefix));
        if !open && !carries_token(&request, self.internal_token.as_deref()) {
            let _entered = span.enter();
            tracing::warn!("call without the internal token refused");
            record(&path, tonic::Code::Unauthenticated, Duration::ZERO);
            let status = tonic::Status::unauthenticated(
                "this service needs the deployment's internal token (PLINTH_INTERNAL_TOKEN)",
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        // The clone that was polled ready is the one that must be called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let started = Instant::now();
        let record_span = span.clone();
        Box::pin(
            async move {
                let response = inner.call(request).await;
                let code = match &response {
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .map(|value| tonic::Code::from_bytes(value.as_bytes()))
                        .unwrap_or(tonic::Code::Ok),
                    Err(_) => tonic::Code::Internal,
                };
                record_span.record("grpc.code", tracing::field::debug(code));
                record(&path, code, started.elapsed());
                response
            }
            .instrument(span),
        )
    }
}

fn carries_token(request: &http::Request<Body>, token: Option<&Secret>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(value) = request.headers().get(http::header::AUTHORIZATION) else {
        return false;
    };
    let Some(given) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    constant_time_eq(given, token.expose().as_bytes())
}

/// Compares without an early exit, so the time taken says nothing about the secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn record(path: &str, code: tonic::Code, elapsed: Duration) {
    // Unknown paths are answered Unimplemented; naming them would let callers grow labels.
    let rpc = if code == tonic::Code::Unimplemented {
        "unknown".to_owned()
    } else {
        path.to_owned()
    };
    let code = format!("{code:?}");
    metrics::counter!("plinth_grpc_server_requests_total", "rpc" => rpc.clone(), "code" => code.clone())
        .increment(1);
    metrics::histogram!("plinth_grpc_server_request_duration_seconds", "rpc" => rpc, "code" => code)
        .record(elapsed.as_secs_f64());
}

/// A service's whole call stack (token check, spans, metrics, routing), called directly.
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

/// How a client reaches another Plinth service: over its gRPC channel, or, when the service
/// runs in the same process and is serving, by calling its stack directly. A direct call is
/// still a gRPC call (messages are encoded, the token checked, the span and metrics recorded
/// by the same server code); it skips HTTP/2 over loopback, whose connection and buffer tasks
/// cost about 0.3 ms of thread hand-offs per call.
#[derive(Clone)]
pub struct Transport {
    channel: Channel,
    local: Option<LocalSlot>,
    /// The direct path, chosen when the caller polled ready, for the call that follows.
    chosen: Option<LocalService>,
}

impl Transport {
    /// Over the network only.
    pub fn remote(channel: Channel) -> Self {
        Transport {
            channel,
            local: None,
            chosen: None,
        }
    }

    /// Directly once `slot`'s service serves; over `channel` until then.
    pub fn in_process(channel: Channel, slot: LocalSlot) -> Self {
        Transport {
            channel,
            local: Some(slot),
            chosen: None,
        }
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
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
        if self.chosen.is_some() {
            return Poll::Ready(Ok(()));
        }
        tower::Service::poll_ready(&mut self.channel, cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self.chosen.take() {
            Some(service) => Box::pin(async move {
                match tower::ServiceExt::oneshot(service, request).await {
                    Ok(response) => Ok(response),
                    Err(never) => match never {},
                }
            }),
            None => {
                let response = tower::Service::call(&mut self.channel, request);
                Box::pin(async move { response.await.map_err(Into::into) })
            }
        }
    }
}

/// A channel to another Plinth service that connects on first use and reconnects as needed,
/// so services can start in any order.
pub fn connect_lazy(url: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// Carries the caller's trace context and the internal token on every outgoing call.
#[derive(Clone, Default)]
pub struct ClientInterceptor {
    internal_token: Option<Arc<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>>,
}

impl ClientInterceptor {
    /// An interceptor that sends `internal_token`, when set, as a bearer token.
    pub fn new(internal_token: Option<&Secret>) -> Result<Self, InvalidToken> {
        let internal_token = match internal_token {
            Some(token) => Some(Arc::new(
                format!("Bearer {}", token.expose())
                    .parse()
                    .map_err(|_| InvalidToken)?,
            )),
            None => None,
        };
        Ok(ClientInterceptor { internal_token })
    }
}

/// The internal token holds characters that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("the internal token must be printable ASCII")]
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
        if let Some(token) = &self.internal_token {
            metadata.insert("authorization", token.as_ref().clone());
        }
        Ok(request)
    }
}
