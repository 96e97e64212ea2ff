//! plinth-gateway: the REST face of Plinth. It speaks UHP's environments API to clients,
//! hosts the Novo and Brain workspace adapters for agent runtimes, and speaks gRPC to the
//! services behind it.
//!
//! It owns authentication (bearer token → scope), request parsing, the HTTP error envelope
//! and the OpenAPI document. It owns no durable state and no business rule: every decision
//! about an environment is the catalog's, reached over `plinth.catalog.v1`.
//!
//! Built in floors, each importing only from those below it: `http` (and `public`, the
//! public gRPC face), `runtime`, `agents`, `rest`, `options`, `router`, and this root, whose
//! state each handler takes only its part of (`tests/e2e/structure.rs` keeps it so).

mod agents;
mod http;
mod options;
mod public;
mod rest;
mod router;
mod runtime;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;

use plinth_kit::tasks::CancellationToken;
use tokio::net::TcpListener;

pub use agents::adapters::AdapterRate;
pub use agents::novo::DEFAULT_REPLAY_MEMORY_PER_ADAPTER;
pub use http::auth::DEFAULT_SCOPE;
pub use http::browsers::BrowserSettingError;
pub use http::connections::ConnectionLimits;
pub use http::edge::EdgeLimits;
pub use http::error::{ErrorBody, ErrorObject};
pub use options::{Backends, GatewayError, GatewayOptions, LocalReady};
pub use runtime::limits;
pub use runtime::nodes::NodeCallLimits;

use agents::Agents;
use runtime::{Runtime, Services};

/// Checks the browser settings (`gateway.allowed_hosts`, `gateway.allowed_origins`) as the
/// gateway will read them, so a bad entry is refused when the configuration is read.
pub fn check_browser_settings(
    allowed_hosts: &[String],
    allowed_origins: &[String],
) -> Result<(), BrowserSettingError> {
    http::browsers::BrowserPolicy::new(allowed_hosts, allowed_origins, None).map(|_| ())
}

/// What the handlers reach, each through the part it needs (`State<Services>`,
/// `State<Runtime>`, `State<Agents>`, …), never the whole.
#[derive(Clone, FromRef)]
pub(crate) struct AppState {
    services: Services,
    runtime: Runtime,
    agents: Agents,
    tokens: Arc<http::auth::Tokens>,
    test_commands: rest::sessions::TestCommands,
    capabilities: router::Capabilities,
}

/// The whole HTTP surface: the API, `/openapi.json`, `/healthz`, `/readyz`, `/metrics`.
pub fn router(options: &GatewayOptions, backends: Backends) -> Result<axum::Router, GatewayError> {
    let state = app_state(options, &backends)?;
    router::router_with(options, backends, state)
}

fn app_state(options: &GatewayOptions, backends: &Backends) -> Result<AppState, GatewayError> {
    let interceptor = options.internal.interceptor("gateway")?;
    let services = Services::new(&backends.catalog, &backends.source, &interceptor);
    let runtime = Runtime {
        nodes: Arc::new(runtime::nodes::NodeClients::new(
            interceptor,
            options.internal.clone(),
            backends.local_nodes.clone(),
            options.node_calls,
            services.sessions(),
        )),
        live: Arc::default(),
        session_limits: options.session_limits,
        services: services.clone(),
    };
    let agents = Agents {
        runtime: runtime.clone(),
        brain_runtime: Arc::new(agents::brain::Runtime::new(
            options.brain_operation_lease,
            agents::brain::CallbackAddresses::new(options.callback_allow.clone()),
        )),
        adapter_credentials: Arc::new(agents::adapters::Credentials::new()),
        adapter_rates: Arc::new(agents::adapters::AdapterRates::new(options.adapter_rate)),
        novo: agents::novo::NovoOptions::new(
            options.command_inline_bytes,
            options.edge.max_unverified_bodies,
            options.edge.request_timeout,
        )
        .with_call_lease(options.novo_call_lease)
        .with_replay_memory(options.novo_replay_memory),
        public_url: options.public_url.clone(),
    };
    Ok(AppState {
        services,
        runtime,
        agents,
        tokens: Arc::new(http::auth::Tokens::new(options.tokens.clone())),
        // A version's packages never change: kept an hour, for as many versions as are
        // likely in use at once.
        test_commands: rest::sessions::TestCommands::new(Duration::from_secs(3600), 10_000),
        capabilities: router::Capabilities {
            environments: options.environments,
        },
    })
}

/// Serves the gateway on `listener` until `shutdown` is cancelled.
pub async fn run(
    options: GatewayOptions,
    listener: TcpListener,
    backends: Backends,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let state = app_state(&options, &backends)?;
    plinth_kit::tasks::spawn(agents::novo::end_idle_runs(
        state.agents.clone(),
        options.adapter_run_idle,
        shutdown.clone(),
    ));
    let app = router::router_with(&options, backends, state)?;
    tracing::info!(address = ?listener.local_addr().ok(), environments = options.environments, scopes = if options.tokens.is_empty() { "single" } else { "by token" }, "gateway serving");
    for reason in http::connections::REFUSAL_REASONS {
        metrics::counter!("plinth_gateway_refused_total", "reason" => reason).increment(0);
    }
    http::connections::serve(listener, app, options.connections, shutdown).await?;
    Ok(())
}
