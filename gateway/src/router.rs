//! The whole HTTP surface assembled: the API's routes with their OpenAPI document, the edge
//! layers around them, and `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use plinth_kit::admin::{self, ReadinessCheck};
use plinth_kit::auth::Role;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agents::Agents;
use crate::http::error::{ErrorBody, ErrorObject};
use crate::http::{auth, browsers, console, edge, error, openapi, query};
use crate::options::{Backends, GatewayError, GatewayOptions};
use crate::rest::sessions::TestCommands;
use crate::runtime::{Runtime, Services};
use crate::{agents, public, rest};
use axum::extract::FromRef;

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
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub(crate) struct Capabilities {
    /// The Environments chapter: every endpoint under `/v1/environments`.
    pub(crate) environments: bool,
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
    State(capabilities): State<Capabilities>,
    _caller: auth::Caller,
) -> Json<CapabilitiesBody> {
    Json(CapabilitiesBody { capabilities })
}

pub(crate) fn router_with<S>(
    options: &GatewayOptions,
    backends: Backends,
    state: S,
) -> Result<Router, GatewayError>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Runtime: FromRef<S>,
    Agents: FromRef<S>,
    TestCommands: FromRef<S>,
    Capabilities: FromRef<S>,
    Arc<auth::Tokens>: FromRef<S>,
{
    let mut api = OpenApiRouter::with_openapi(ApiDoc::openapi()).routes(routes!(capabilities));
    if options.environments {
        api = api
            .merge(rest::environments::routes())
            .merge(rest::files::routes())
            .merge(rest::builds::routes())
            .merge(rest::harnesses::routes())
            .merge(rest::sessions::routes())
            .merge(rest::exec::routes())
            .merge(rest::session_files::routes())
            .merge(rest::tasks::routes())
            .merge(agents::novo::routes())
            .merge(agents::adapters::routes())
            .merge(agents::brain::routes())
            .merge(rest::usage::routes());
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
    Runtime::from_ref(&state)
        .session_limits
        .document(&mut openapi);
    openapi::complete(&mut openapi);
    let openapi = Arc::new(openapi);
    let browsers = Arc::new(browsers::BrowserPolicy::new(
        &options.allowed_hosts,
        &options.allowed_origins,
        options.public_url.as_deref(),
    )?);
    let edge = edge::Edge::new(options.edge, Arc::<auth::Tokens>::from_ref(&state));
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
        .merge(console::router())
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
