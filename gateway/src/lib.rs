//! plinth-gateway: the REST face of Plinth. It speaks UHP's environments API (and, as they
//! arrive, the Novo and Brain adapters) to clients and gRPC to the services behind it.
//!
//! It owns authentication (bearer token → scope), request parsing, the HTTP error envelope
//! and the OpenAPI document. It owns no durable state and no business rule: every decision
//! about an environment is the catalog's, reached over `plinth.catalog.v1`.

mod adapters;
mod auth;
mod brain;
mod browsers;
mod build_status;
mod builds;
mod conditional;
mod connections;
mod downloads;
mod edge;
mod environments;
mod error;
mod files;
mod harnesses;
mod idempotency;
mod json;
mod ledger;
pub mod limits;
mod nodes;
mod novo;
mod openapi;
mod paging;
mod public;
mod query;
mod recent;
mod runtime;
mod sessions;
mod terminal;
mod tools;
mod usage;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use plinth_kit::admin::{self, ReadinessCheck};
use plinth_kit::auth::Role;
use plinth_kit::config::Secret;
use plinth_kit::grpc::{ClientInterceptor, ClientSetupError, Internal, Transport};
use plinth_kit::tasks::CancellationToken;
use plinth_proto::catalog::v1::adapter_service_client::AdapterServiceClient;
use plinth_proto::catalog::v1::brain_service_client::BrainServiceClient;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use plinth_proto::catalog::v1::harness_service_client::HarnessServiceClient;
use plinth_proto::catalog::v1::quota_service_client::QuotaServiceClient;
use plinth_proto::catalog::v1::replay_memory_service_client::ReplayMemoryServiceClient;
use plinth_proto::catalog::v1::request_key_service_client::RequestKeyServiceClient;
use plinth_proto::catalog::v1::session_service_client::SessionServiceClient;
use plinth_proto::source::v1::source_service_client::SourceServiceClient;
use serde::Serialize;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use adapters::AdapterRate;
pub use auth::DEFAULT_SCOPE;
pub use connections::ConnectionLimits;
pub use edge::EdgeLimits;
pub use error::{ErrorBody, ErrorObject};
pub use nodes::NodeCallLimits;
pub use novo::DEFAULT_REPLAY_MEMORY_PER_ADAPTER;

/// How the gateway behaves.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Whether the environments chapter is served; when false, `/v1/capabilities` says so and
    /// every environment endpoint answers 404, and so do the harness endpoints, which exist to
    /// attach environments (§5).
    pub environments: bool,
    /// Bearer token → scope. Empty: one scope, [`DEFAULT_SCOPE`], for every caller.
    pub tokens: Vec<(Secret, String)>,
    /// The gateway's credential for the services behind, TLS to them, and who may read its
    /// `/metrics` and `/readyz` details when the API itself needs a token.
    pub internal: Internal,
    /// How long a claim on a Brain operation lasts unless its runner renews it; a delivery
    /// that finds a claim older than this with no result answers `unknown`.
    pub brain_operation_lease: Duration,
    /// The gateway's root URL as agent runtimes reach it, for the URLs workspace adapters
    /// answer; the request's `Host` over plain HTTP when absent.
    pub public_url: Option<String>,
    /// A workspace adapter's run whose session saw no call this long is ended.
    pub adapter_run_idle: Duration,
    /// Bytes of each of stdout and stderr a Novo runCommand answers inline (the rest is
    /// paged with readCommandOutput).
    pub command_inline_bytes: u64,
    /// How long a Novo idempotent call's claim lasts unless renewed (the gateway renews it
    /// every third while the call runs); a retry that finds it run out with no answer stored
    /// settles it as `outcome_unknown` and never runs the call again.
    pub novo_call_lease: Duration,
    /// Sessions' limits: the default and maximum of each. Tasks' and workspace adapters'
    /// sessions get the defaults.
    pub session_limits: limits::LimitPolicy,
    /// The gateway's own limits: rate per token, requests in flight, the request deadline,
    /// unverified adapter bodies.
    pub edge: EdgeLimits,
    /// Calls each workspace adapter's runtime may make (Novo dispatch, Brain operations).
    pub adapter_rate: adapters::AdapterRate,
    /// Most signatures of mutating Novo calls remembered per adapter (the replay memory).
    pub novo_replay_memory: u64,
    /// Networks beyond the public internet that Brain callbacks may reach
    /// (`gateway.callback_allow`).
    pub callback_allow: Vec<plinth_sandbox::egress::policy::Cidr>,
    /// Names the gateway answers to besides IP address literals, `localhost` and the host of
    /// `public_url` (`plinth.example.com`, `name:port`, `*.example.com`, or `*` for any).
    pub allowed_hosts: Vec<String>,
    /// Web page origins that may make state-changing requests and open terminals (none by
    /// default; requests without an `Origin`, from clients that are not browsers, are not
    /// affected).
    pub allowed_origins: Vec<String>,
    /// The bounds on connections: headers in time, idle connections closed, connections at
    /// once in all and per client address.
    pub connections: ConnectionLimits,
    /// Deadlines on calls to node agents, and how long a node that misses one is held
    /// suspect (gets no new sessions).
    pub node_calls: NodeCallLimits,
}

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No usable internal credential.
    #[error(transparent)]
    InternalCredential(#[from] ClientSetupError),
    /// The HTTP server failed.
    #[error("gateway HTTP server failed: {0}")]
    Serve(#[from] std::io::Error),
    /// A setting makes no sense; the message names it.
    #[error("{0}")]
    Config(String),
}

/// Checks the browser settings (`gateway.allowed_hosts`, `gateway.allowed_origins`) as the
/// gateway will read them, so a bad entry is refused when the configuration is read.
pub fn check_browser_settings(
    allowed_hosts: &[String],
    allowed_origins: &[String],
) -> Result<(), String> {
    browsers::BrowserPolicy::new(allowed_hosts, allowed_origins, None).map(|_| ())
}

type CatalogClient = CatalogServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type SourceClient = SourceServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type HarnessClient = HarnessServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type SessionClient = SessionServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type BrainClient = BrainServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type AdapterClient = AdapterServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type ReplayClient = ReplayMemoryServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type QuotaClient = QuotaServiceClient<InterceptedService<Transport, ClientInterceptor>>;
type RequestKeyClient = RequestKeyServiceClient<InterceptedService<Transport, ClientInterceptor>>;

/// What every handler can reach.
#[derive(Clone)]
pub(crate) struct AppState {
    catalog: CatalogClient,
    harnesses: HarnessClient,
    sessions: SessionClient,
    brain: BrainClient,
    brain_runtime: Arc<brain::Runtime>,
    adapters: AdapterClient,
    /// Novo's replay memory, in the catalog.
    replays: ReplayClient,
    quotas: QuotaClient,
    /// The tenant API's idempotency keys, in the catalog.
    request_keys: RequestKeyClient,
    nodes: nodes::Nodes,
    live: Arc<runtime::LiveSessions>,
    /// Adapters' credentials as the catalog answered them in the last second.
    adapter_credentials: Arc<adapters::Credentials>,
    /// Each adapter's rate of calls on this gateway.
    adapter_rates: Arc<adapters::AdapterRates>,
    source: SourceClient,
    tokens: Arc<auth::Tokens>,
    environments: bool,
    public_url: Option<String>,
    novo: novo::NovoOptions,
    session_limits: limits::LimitPolicy,
    /// The test command each version's sessions are offered, by environment and version.
    test_commands: Arc<recent::Recent<(String, u32), sessions::TestCommand>>,
}

impl AppState {
    /// A catalog client for one request; clones share the channel.
    fn catalog(&self) -> CatalogClient {
        self.catalog.clone()
    }

    /// A harness client for one request; it shares the catalog's channel.
    fn harnesses(&self) -> HarnessClient {
        self.harnesses.clone()
    }

    /// A session client for one request; it shares the catalog's channel.
    fn sessions(&self) -> SessionClient {
        self.sessions.clone()
    }

    /// A replay-memory client for one request; it shares the catalog's channel.
    fn replays(&self) -> ReplayClient {
        self.replays.clone()
    }

    /// A workspace-adapter client for one request; it shares the catalog's channel.
    fn adapters(&self) -> AdapterClient {
        self.adapters.clone()
    }

    /// A quota client for one request; it shares the catalog's channel.
    fn quotas(&self) -> QuotaClient {
        self.quotas.clone()
    }

    /// An idempotency-key client for one request; it shares the catalog's channel.
    fn request_keys(&self) -> RequestKeyClient {
        self.request_keys.clone()
    }

    /// A Brain ledger client for one request; it shares the catalog's channel.
    fn brain(&self) -> BrainClient {
        self.brain.clone()
    }

    /// A source client for one request; clones share the channel.
    fn source(&self) -> SourceClient {
        self.source.clone()
    }
}

/// The OpenAPI document's fixed parts; paths are added from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Plinth",
        description = "Environments for agent sessions: a project's files and installed dependencies, built once into immutable versions and mounted read-only at /env/<slug>."
    ),
    components(schemas(ErrorBody, ErrorObject)),
    modifiers(&BearerAuth),
    tags((name = "environments", description = "UHP Environments §2"), (name = "files", description = "UHP Environments §3"), (name = "builds", description = "UHP Environments §4"), (name = "harnesses", description = "UHP Environments §5: harnesses and the environment their tasks read"), (name = "sessions", description = "UHP Environments §6: what a session sees"), (name = "tasks", description = "UHP Environments §5: tasks refused unless their environment is ready"), (name = "discovery", description = "UHP Environments §7"), (name = "workspace-adapters", description = "Endpoints Plinth hosts for agent runtimes (Novo, Brain) to work in sessions on an environment"))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `GET /v1/capabilities`.
#[derive(Debug, Serialize, ToSchema)]
struct CapabilitiesBody {
    capabilities: Capabilities,
}

/// Which optional chapters this server implements.
#[derive(Debug, Serialize, ToSchema)]
struct Capabilities {
    /// The Environments chapter: every endpoint under `/v1/environments`.
    environments: bool,
}

/// Which optional chapters this server implements.
#[utoipa::path(
    get,
    path = "/v1/capabilities",
    tag = "discovery",
    responses(
        (status = 200, description = "The capabilities", body = CapabilitiesBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn capabilities(
    State(state): State<AppState>,
    _caller: auth::Caller,
) -> Json<CapabilitiesBody> {
    Json(CapabilitiesBody {
        capabilities: Capabilities {
            environments: state.environments,
        },
    })
}

/// How the gateway reaches the services behind it (see `plinth_kit::grpc::Transport`).
#[derive(Debug, Clone)]
pub struct Backends {
    /// The catalog.
    pub catalog: Transport,
    /// The source service.
    pub source: Transport,
    /// Node agents in this process, by the address they register; others are reached over
    /// the network at their address.
    pub local_nodes: Vec<(String, Transport)>,
    /// What else in this process the gateway is ready only with (under `plinth serve`: its
    /// node agent registered with the catalog at the address it serves, and heard since).
    pub local_ready: Vec<LocalReady>,
}

/// A condition of a service in the gateway's own process: `Err` says why it is not met.
#[derive(Clone)]
pub struct LocalReady(pub Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for LocalReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalReady")
    }
}

/// The whole HTTP surface: the API, `/openapi.json`, `/healthz`, `/readyz`, `/metrics`.
pub fn router(options: &GatewayOptions, backends: Backends) -> Result<Router, GatewayError> {
    let state = app_state(options, &backends)?;
    router_with(options, backends, state)
}

fn app_state(options: &GatewayOptions, backends: &Backends) -> Result<AppState, GatewayError> {
    let interceptor = options.internal.interceptor("gateway")?;
    Ok(AppState {
        catalog: CatalogServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        ),
        harnesses: HarnessServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        ),
        sessions: SessionServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        ),
        replays: ReplayMemoryServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        ),
        adapters: AdapterServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        ),
        quotas: QuotaServiceClient::with_interceptor(backends.catalog.clone(), interceptor.clone()),
        request_keys: RequestKeyServiceClient::with_interceptor(
            backends.catalog.clone(),
            interceptor.clone(),
        )
        .max_decoding_message_size(idempotency::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(idempotency::MAX_MESSAGE_BYTES),
        brain: BrainServiceClient::with_interceptor(backends.catalog.clone(), interceptor.clone())
            .max_decoding_message_size(brain::CATALOG_MESSAGE_BYTES)
            .max_encoding_message_size(brain::CATALOG_MESSAGE_BYTES),
        brain_runtime: Arc::new(brain::Runtime::new(
            options.brain_operation_lease,
            brain::CallbackAddresses::new(options.callback_allow.clone()),
        )),
        nodes: Arc::new(nodes::NodeClients::new(
            interceptor.clone(),
            options.internal.clone(),
            backends.local_nodes.clone(),
            options.node_calls,
            SessionServiceClient::with_interceptor(backends.catalog.clone(), interceptor.clone()),
        )),
        live: Arc::default(),
        adapter_credentials: Arc::new(adapters::Credentials::new()),
        adapter_rates: Arc::new(adapters::AdapterRates::new(options.adapter_rate)),
        source: SourceServiceClient::with_interceptor(backends.source.clone(), interceptor)
            .max_decoding_message_size(4 * 1024 * 1024),
        tokens: Arc::new(auth::Tokens::new(options.tokens.clone())),
        environments: options.environments,
        public_url: options.public_url.clone(),
        novo: novo::NovoOptions::new(
            options.command_inline_bytes,
            options.edge.max_unverified_bodies,
            options.edge.request_timeout,
        )
        .with_call_lease(options.novo_call_lease)
        .with_replay_memory(options.novo_replay_memory),
        session_limits: options.session_limits,
        // A version's packages never change: kept an hour, for as many versions as are
        // likely in use at once.
        test_commands: Arc::new(recent::Recent::new(Duration::from_secs(3600), 10_000)),
    })
}

fn router_with(
    options: &GatewayOptions,
    backends: Backends,
    state: AppState,
) -> Result<Router, GatewayError> {
    let mut api = OpenApiRouter::with_openapi(ApiDoc::openapi()).routes(routes!(capabilities));
    if options.environments {
        api = api
            .merge(environments::routes())
            .merge(files::routes())
            .merge(builds::routes())
            .merge(harnesses::routes())
            .merge(sessions::routes())
            .merge(novo::routes())
            .merge(adapters::routes())
            .merge(brain::routes())
            .merge(usage::routes());
    }
    let (api, mut openapi) = api.split_for_parts();
    plinth_kit::telemetry::metrics();
    for (route, item) in &openapi.paths.paths {
        let methods = [
            ("GET", item.get.is_some()),
            ("PUT", item.put.is_some()),
            ("POST", item.post.is_some()),
            ("DELETE", item.delete.is_some()),
            ("PATCH", item.patch.is_some()),
        ];
        for (method, served) in methods {
            if served {
                plinth_kit::http::register_route(route, method);
            }
        }
    }
    let query_rules = query::QueryRules::from_openapi(&openapi);
    // axum spells a multi-segment parameter `{*path}`; OpenAPI spells it `{path}`.
    let paths = std::mem::take(&mut openapi.paths.paths);
    openapi.paths.paths = paths
        .into_iter()
        .map(|(path, item)| (path.replace("{*", "{"), item))
        .collect();
    document_rate_limits(&mut openapi);
    state.session_limits.document(&mut openapi);
    openapi::complete(&mut openapi);
    let openapi = Arc::new(openapi);
    let browsers = Arc::new(
        browsers::BrowserPolicy::new(
            &options.allowed_hosts,
            &options.allowed_origins,
            options.public_url.as_deref(),
        )
        .map_err(GatewayError::Config)?,
    );
    let edge = edge::Edge::new(options.edge, state.tokens.clone());
    edge::register_refusals();
    // At 0 from the start, so a dashboard sees the series before the first node dies.
    metrics::counter!("plinth_session_placement_retries_total").increment(0);
    metrics::counter!("plinth_gateway_nodes_marked_suspect_total").increment(0);
    let app = api
        .route(
            "/openapi.json",
            get(move || {
                let openapi = openapi.clone();
                async move { Json(openapi.as_ref().clone()) }
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            query_rules,
            query::known_parameters,
        ))
        .fallback(error::no_such_route)
        .method_not_allowed_fallback(error::method_not_allowed)
        // Outermost last: a token's rate, then the requests in flight, then the deadline.
        .layer(axum::middleware::from_fn_with_state(
            edge.clone(),
            edge::deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(
            edge.clone(),
            edge::in_flight,
        ))
        .layer(axum::middleware::from_fn_with_state(edge, edge::rate_limit))
        .with_state(state)
        .merge(admin::router(readiness(backends), metrics_guard(options)))
        .layer(axum::middleware::from_fn(plinth_kit::http::observe));
    // Outside everything, the gRPC face included: what a web page may not do.
    Ok(
        public::beside(app).layer(axum::middleware::from_fn_with_state(
            browsers,
            browsers::guard,
        )),
    )
}

/// Who may read `/metrics` and `/readyz` details: anyone while the API itself is open (no
/// client tokens, and no `observer` credential configured), otherwise an internal credential.
fn metrics_guard(options: &GatewayOptions) -> Option<Arc<plinth_kit::auth::Accepted>> {
    let open = options.tokens.is_empty() && !options.internal.accepted.has_role(Role::Observer);
    (!open).then(|| options.internal.accepted.clone())
}

/// Every operation a bearer token calls may be refused for the token's rate: `429
/// rate_limited`, with `Retry-After`.
fn document_rate_limits(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, HeaderBuilder, Object, Ref, ResponseBuilder, Type};
    let refused = ResponseBuilder::new()
        .description("rate_limited: past this token's rate (`gateway.rate_limit_per_second`, `gateway.rate_limit_burst`); retry after `Retry-After` seconds")
        .header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(Object::with_type(Type::Integer)))
                .description(Some("Seconds until the token may call again"))
                .build(),
        )
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for (path, operation) in openapi::operations_mut(openapi) {
        // Workspace adapters' dispatch endpoints are called with the adapter's credential,
        // not a client token.
        if path.ends_with("/novo") || path.contains("/brain/") {
            continue;
        }
        let bearer = operation
            .security
            .as_ref()
            .is_some_and(|security| !security.is_empty());
        if !bearer {
            continue;
        }
        // An operation may already answer 429 for another reason (a quota): it gains the
        // rate's description and its `Retry-After`.
        match operation.responses.responses.entry("429".to_owned()) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(refused.clone().into());
            }
            std::collections::btree_map::Entry::Occupied(mut slot) => {
                if let utoipa::openapi::RefOr::T(response) = slot.get_mut() {
                    if !response.description.contains("rate_limited") {
                        response.description.push_str(
                            "; or rate_limited: past this token's rate, retry after `Retry-After` seconds",
                        );
                    }
                    for (name, header) in &refused.headers {
                        response
                            .headers
                            .entry(name.clone())
                            .or_insert_with(|| header.clone());
                    }
                }
            }
        }
    }
}

/// Ready while at least one replica of each service behind says it is serving (which each
/// says only while its database answers): one sick replica of several leaves the gateway
/// ready, as calls go to the others. Under `plinth serve`, also only once its node agent has
/// registered ([`Backends::local_ready`]), so the first session after a start finds it.
/// Checked in the background ([`admin::watch`]).
fn readiness(backends: Backends) -> ReadinessCheck {
    admin::watch(Arc::new(move || {
        let backends = backends.clone();
        Box::pin(async move {
            for ready in &backends.local_ready {
                (ready.0)()?;
            }
            let within = admin::CHECK_WITHIN - Duration::from_millis(250);
            let catalog = backends
                .catalog
                .any_serving("plinth.catalog.v1.CatalogService", within);
            let source = backends
                .source
                .any_serving("plinth.source.v1.SourceService", within);
            match tokio::join!(catalog, source) {
                (Ok(()), Ok(())) => Ok(()),
                (Err(catalog), Ok(())) => Err(format!("no catalog serves: {catalog}")),
                (Ok(()), Err(source)) => Err(format!("no source serves: {source}")),
                (Err(catalog), Err(source)) => Err(format!(
                    "no catalog serves: {catalog}; no source serves: {source}"
                )),
            }
        })
    }))
}

/// Serves the gateway on `listener` until `shutdown` is cancelled.
pub async fn run(
    options: GatewayOptions,
    listener: TcpListener,
    backends: Backends,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let state = app_state(&options, &backends)?;
    plinth_kit::tasks::spawn(novo::end_idle_runs(
        state.clone(),
        options.adapter_run_idle,
        shutdown.clone(),
    ));
    let app = router_with(&options, backends, state)?;
    tracing::info!(address = ?listener.local_addr().ok(), environments = options.environments, scopes = if options.tokens.is_empty() { "single" } else { "by token" }, "gateway serving");
    for reason in connections::REFUSAL_REASONS {
        metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(0);
    }
    connections::serve(listener, app, options.connections, shutdown).await?;
    Ok(())
}
