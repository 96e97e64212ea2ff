//! What the gateway is told: its options, the services behind it, and why it could not start.

use std::sync::Arc;
use std::time::Duration;

use plinth_kit::config::Secret;
use plinth_kit::grpc::{ClientSetupError, Internal, Transport};

use crate::agents::adapters::AdapterRate;
use crate::http::browsers::BrowserSettingError;
use crate::http::connections::ConnectionLimits;
use crate::http::edge::EdgeLimits;
use crate::runtime::limits::LimitPolicy;
use crate::runtime::nodes::NodeCallLimits;

/// How the gateway behaves.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Whether the environments chapter is served; when false, `/v1/capabilities` says so and
    /// every environment endpoint answers 404, and so do the harness endpoints, which exist to
    /// attach environments (§5).
    pub environments: bool,
    /// Bearer token → scope. Empty: one scope, [`DEFAULT_SCOPE`](crate::DEFAULT_SCOPE), for every caller.
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
    pub session_limits: LimitPolicy,
    /// The gateway's own limits: rate per token, requests in flight, the request deadline,
    /// unverified adapter bodies.
    pub edge: EdgeLimits,
    /// Calls each workspace adapter's runtime may make (Novo dispatch, Brain operations).
    pub adapter_rate: AdapterRate,
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
    /// A browser setting makes no sense; the error names it.
    #[error(transparent)]
    BrowserSetting(#[from] BrowserSettingError),
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
