//! The effective configuration of a `plinth` process: defaults, then the TOML file, then
//! environment variables and flags (see `args`). Each command resolves what it will use, so
//! `--dump-config` prints exactly that, secrets redacted.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use plinth_kit::config::{self, ConfigError, Secret};
use plinth_kit::telemetry::{LogConfig, LogFormat};
use serde::{Deserialize, Serialize};

use crate::args::{
    AccessArgs, BuilderArgs, CatalogArgs, CommonArgs, EdgeArgs, GatewayArgs, GitArgs, LogFormatArg,
    NodeArgs, ServeArgs, SourceArgs,
};

/// The REST address when none is given.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
/// The catalog's gRPC address for `plinth catalog` when none is given.
pub const DEFAULT_CATALOG_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7001);
/// The source service's gRPC address for `plinth source` when none is given.
pub const DEFAULT_SOURCE_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7003);
const EPHEMERAL_LOOPBACK: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Everything a `plinth` process can be told.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The configuration file this was read from, if any: hidden from sessions and builds.
    #[serde(skip)]
    pub source_file: Option<PathBuf>,
    /// Where the embedded database and object store live.
    pub data_dir: PathBuf,
    /// Replaced by `[internal]`; refused with a message that says so.
    #[serde(skip_serializing)]
    pub internal_token: Option<Secret>,
    /// Credentials and TLS between services.
    pub internal: crate::internal::InternalSection,
    /// Logging.
    pub log: LogConfig,
    /// The REST gateway.
    pub gateway: GatewaySection,
    /// The catalog.
    pub catalog: CatalogSection,
    /// The source service.
    pub source: SourceSection,
    /// Builders.
    pub builder: BuilderSection,
    /// The node agent.
    pub node: NodeSection,
    /// Sessions' limits: the default and maximum of each.
    pub sessions: SessionsSection,
    /// Quotas per scope: defaults, and overrides for named scopes.
    pub quotas: QuotasSection,
    /// Garbage collection of the blob store.
    pub gc: GcSection,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source_file: None,
            data_dir: PathBuf::from("./plinth-data"),
            internal_token: None,
            internal: crate::internal::InternalSection::default(),
            log: LogConfig::default(),
            gateway: GatewaySection::default(),
            catalog: CatalogSection::default(),
            source: SourceSection::default(),
            builder: BuilderSection::default(),
            node: NodeSection::default(),
            sessions: SessionsSection::default(),
            quotas: QuotasSection::default(),
            gc: GcSection::default(),
        }
    }
}

/// `[gateway]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    /// REST address.
    pub listen: SocketAddr,
    /// The catalog's gRPC URL (`plinth gateway` only; `serve` uses its own catalog).
    pub catalog_url: String,
    /// The source service's gRPC URL (`plinth gateway` only).
    pub source_url: String,
    /// Whether the environments chapter is served.
    pub environments: bool,
    /// Bearer tokens and the scope each one grants.
    pub tokens: Vec<TokenEntry>,
    /// The gateway's address as runtimes reach it, for the URLs workspace adapters answer
    /// (`https://plinth.example.com`); the request's `Host` over plain HTTP when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// A workspace adapter's run whose session saw no call this long is ended, in seconds.
    pub adapter_run_idle_seconds: u64,
    /// Bytes of each of stdout and stderr a Novo runCommand answers inline.
    pub adapter_command_inline_bytes: u64,
    /// How long a claim on a Brain operation lasts unless its runner renews it (every third
    /// of it); a redelivery that finds an older claim with no result answers `unknown`.
    pub brain_operation_lease_seconds: u64,
    /// Requests per second each client token may make, sustained (0: no limit).
    pub rate_limit_per_second: u32,
    /// Requests a client token may make at once above its rate.
    pub rate_limit_burst: u32,
    /// Seconds from a request's arrival to its answer's head; commands, uploads and session
    /// starts have limits of their own.
    pub request_timeout_seconds: u64,
    /// Requests the gateway serves at once, streamed answers included; past it, 503.
    pub max_concurrent_requests: u32,
    /// Requests one client (a token, or an address without one) has in flight at once; past
    /// it, 503, while other clients are served.
    pub max_concurrent_requests_per_client: u32,
    /// Workspace-adapter (Novo) bodies read at once before their signature is known.
    pub adapter_max_unverified_bodies: u32,
    /// How long a Novo idempotent call's claim lasts unless renewed (every third of it while
    /// the call runs), in seconds; a retry that finds it run out with no answer stored
    /// answers `outcome_unknown` and never runs the call again.
    pub novo_call_lease_seconds: u64,
    /// Calls per second each workspace adapter's runtime may make (Novo dispatch, Brain
    /// operations), sustained, on each gateway (0: no limit).
    pub adapter_rate_limit_per_second: u32,
    /// Calls a workspace adapter's runtime may make at once above its rate.
    pub adapter_rate_limit_burst: u32,
    /// Most signatures of mutating Novo calls the replay memory holds per adapter; past it
    /// that adapter's mutating calls are answered 503 until the oldest expire.
    pub novo_replay_memory_per_adapter: u64,
    /// Networks beyond the public internet that Brain callbacks may reach (`127.0.0.0/8`,
    /// `10.1.0.0/16`, `fd00::/8`); none by default.
    pub callback_allow: Vec<String>,
    /// Names the gateway answers to besides IP address literals, `localhost` and the host of
    /// `public_url`: `plinth.example.com` (any port), `name:port`, `*.example.com`, or `*`
    /// for any. A request under another `Host` is `421 host_not_allowed`.
    pub allowed_hosts: Vec<String>,
    /// Web page origins (`https://console.example.com`) that may make state-changing
    /// requests and open terminals; none by default. Requests without an `Origin` (clients
    /// that are not browsers) are not affected.
    pub allowed_origins: Vec<String>,
    /// Seconds a request's headers may take to arrive (from the connection's opening, or
    /// the previous answer's end on a kept-alive HTTP/1 connection) before the connection is
    /// closed.
    pub header_timeout_seconds: u64,
    /// Seconds an HTTP/2 connection may stay open with no request in flight.
    pub idle_timeout_seconds: u64,
    /// Connections open at once; past it a connection is answered 503 and closed. 0: half
    /// the process's open-file limit (raised to its hard limit at start), at most 16384.
    pub max_connections: u32,
    /// Connections open at once from one client address; past it, 503 and closed.
    pub max_connections_per_client: u32,
    /// Milliseconds a node agent has to answer a call (and a stream's head) before the
    /// caller is answered 503 and the node is held suspect.
    pub node_call_timeout_ms: u64,
    /// Milliseconds a node agent has to attach a session, which may fetch its version from
    /// the blob store; past it the session is placed on another node.
    pub node_attach_timeout_ms: u64,
    /// Milliseconds the catalog holds a node suspect (no new sessions) unless the gateway,
    /// still unable to reach it, renews the mark; cleared as soon as it answers again.
    pub node_suspect_ms: u64,
}

/// The most connections `gateway.max_connections = 0` comes to, however many files the
/// process may open.
pub const AUTO_MAX_CONNECTIONS: u64 = 16384;

impl Default for GatewaySection {
    fn default() -> Self {
        GatewaySection {
            listen: DEFAULT_LISTEN,
            catalog_url: format!("http://{DEFAULT_CATALOG_LISTEN}"),
            source_url: format!("http://{DEFAULT_SOURCE_LISTEN}"),
            environments: true,
            tokens: Vec::new(),
            public_url: None,
            adapter_run_idle_seconds: 3600,
            adapter_command_inline_bytes: 32 * 1024,
            brain_operation_lease_seconds: 30,
            rate_limit_per_second: 100,
            rate_limit_burst: 200,
            request_timeout_seconds: 60,
            max_concurrent_requests: 1024,
            max_concurrent_requests_per_client: 256,
            adapter_max_unverified_bodies: 4,
            novo_call_lease_seconds: 30,
            adapter_rate_limit_per_second: 100,
            adapter_rate_limit_burst: 200,
            novo_replay_memory_per_adapter: plinth_gateway::DEFAULT_REPLAY_MEMORY_PER_ADAPTER,
            callback_allow: Vec::new(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            header_timeout_seconds: 20,
            idle_timeout_seconds: 60,
            max_connections: 0,
            max_connections_per_client: 1024,
            node_call_timeout_ms: 5_000,
            node_attach_timeout_ms: 60_000,
            node_suspect_ms: 30_000,
        }
    }
}

impl GatewaySection {
    /// The networks `callback_allow` names, or which entry is not one.
    pub fn callback_allow(&self) -> Result<Vec<plinth_sandbox::egress::policy::Cidr>, ConfigError> {
        self.callback_allow
            .iter()
            .map(|entry| {
                entry.trim().parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "gateway.callback_allow: {entry:?} is not an address or a network (a.b.c.d/n, x::/n)"
                    ))
                })
            })
            .collect()
    }

    /// Each adapter's rate, or why these values make none.
    pub fn adapter_rate(&self) -> Result<plinth_gateway::AdapterRate, ConfigError> {
        if self.adapter_rate_limit_per_second > 0 && self.adapter_rate_limit_burst == 0 {
            return Err(ConfigError::Invalid(
                "gateway.adapter_rate_limit_burst must be at least 1".to_owned(),
            ));
        }
        if self.novo_replay_memory_per_adapter == 0 {
            return Err(ConfigError::Invalid(
                "gateway.novo_replay_memory_per_adapter must be at least 1".to_owned(),
            ));
        }
        Ok(plinth_gateway::AdapterRate {
            per_second: self.adapter_rate_limit_per_second,
            burst: self.adapter_rate_limit_burst,
        })
    }
}

impl GatewaySection {
    /// The gateway's own limits, or why these values make none.
    pub fn edge_limits(&self) -> Result<plinth_gateway::EdgeLimits, ConfigError> {
        let positive = |value: u64, key: &str| {
            if value == 0 {
                Err(ConfigError::Invalid(format!(
                    "gateway.{key} must be at least 1"
                )))
            } else {
                Ok(value)
            }
        };
        positive(self.request_timeout_seconds, "request_timeout_seconds")?;
        positive(
            self.max_concurrent_requests.into(),
            "max_concurrent_requests",
        )?;
        positive(
            self.max_concurrent_requests_per_client.into(),
            "max_concurrent_requests_per_client",
        )?;
        positive(
            self.adapter_max_unverified_bodies.into(),
            "adapter_max_unverified_bodies",
        )?;
        if self.rate_limit_per_second > 0 {
            positive(self.rate_limit_burst.into(), "rate_limit_burst")?;
        }
        plinth_gateway::check_browser_settings(&self.allowed_hosts, &self.allowed_origins)
            .map_err(|error| ConfigError::Invalid(error.to_string()))?;
        positive(self.header_timeout_seconds, "header_timeout_seconds")?;
        positive(self.idle_timeout_seconds, "idle_timeout_seconds")?;
        positive(
            self.max_connections_per_client.into(),
            "max_connections_per_client",
        )?;
        Ok(plinth_gateway::EdgeLimits {
            rate_per_second: self.rate_limit_per_second,
            rate_burst: self.rate_limit_burst,
            request_timeout: std::time::Duration::from_secs(self.request_timeout_seconds),
            max_concurrent_requests: usize::try_from(self.max_concurrent_requests)
                .unwrap_or(usize::MAX),
            max_concurrent_requests_per_client: usize::try_from(
                self.max_concurrent_requests_per_client,
            )
            .unwrap_or(usize::MAX),
            max_unverified_bodies: usize::try_from(self.adapter_max_unverified_bodies)
                .unwrap_or(usize::MAX),
        })
    }
}

impl GatewaySection {
    /// The deadlines on calls to node agents, or which setting makes none.
    pub fn node_call_limits(&self) -> Result<plinth_gateway::NodeCallLimits, ConfigError> {
        let at_least = |value: u64, least: u64, key: &str| {
            if value < least {
                Err(ConfigError::Invalid(format!(
                    "gateway.{key} must be at least {least}"
                )))
            } else {
                Ok(std::time::Duration::from_millis(value))
            }
        };
        let call = at_least(self.node_call_timeout_ms, 100, "node_call_timeout_ms")?;
        let attach = at_least(self.node_attach_timeout_ms, 100, "node_attach_timeout_ms")?;
        let suspect_for = at_least(self.node_suspect_ms, 1000, "node_suspect_ms")?;
        Ok(plinth_gateway::NodeCallLimits {
            call,
            attach: attach.max(call),
            suspect_for,
        })
    }

    /// The bounds on connections for a process that may open `open_files` files (`None`: no
    /// limit): `max_connections = 0` is half of them, at most [`AUTO_MAX_CONNECTIONS`],
    /// leaving the other half to databases, blobs, sessions and the services' own
    /// connections.
    pub fn connection_limits(&self, open_files: Option<u64>) -> plinth_gateway::ConnectionLimits {
        let max_connections = match self.max_connections {
            0 => open_files
                .map_or(AUTO_MAX_CONNECTIONS, |files| files / 2)
                .clamp(16, AUTO_MAX_CONNECTIONS),
            max => u64::from(max),
        };
        plinth_gateway::ConnectionLimits {
            header_timeout: std::time::Duration::from_secs(self.header_timeout_seconds.max(1)),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_seconds.max(1)),
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_connections_per_client: usize::try_from(self.max_connections_per_client.max(1))
                .unwrap_or(usize::MAX),
        }
    }
}

/// `[[gateway.tokens]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The bearer token.
    pub token: Secret,
    /// The scope it grants.
    pub scope: String,
}

/// `[catalog]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogSection {
    /// gRPC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Address for /healthz, /readyz and /metrics (`plinth catalog` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    /// `sqlite://…` or `postgres://…`; SQLite in `data_dir` when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub database_url: Option<String>,
    /// Upper bound on pooled database connections.
    pub max_connections: u32,
    /// How long a node may go without a heartbeat before placement passes it over, in ms;
    /// nodes are told to heartbeat three times in it.
    pub node_ttl_ms: u64,
    /// How many versions heartbeats tell nodes to hold warm (fetched in the background): every
    /// environment's active version, the most recently activated first, at most this many; 0
    /// tells nodes none.
    pub prewarm_versions: u32,
    /// How long a builder's lease on a build lasts unless renewed, in seconds; builders renew
    /// every third of it, and a crashed builder's build is taken over once it runs out.
    pub build_lease_seconds: u64,
    /// Leases a build may be handed before a lost builder fails it.
    pub build_max_attempts: u32,
    /// Builds of one scope that may run at once (at least 1); builders take turns over the
    /// scopes with queued builds.
    pub build_running_per_scope: u32,
    /// How long a workspace adapter's rotated-out secret or token is still accepted, in
    /// seconds, when the rotation does not say.
    pub adapter_credential_grace_seconds: u64,
    /// A file holding the key that seals workspace adapters' credentials in the database: 32
    /// random bytes in base64. Every catalog on one database needs the same key.
    /// `plinth serve` makes `<data_dir>/seal.key` when neither this nor `PLINTH_SEAL_KEY` is
    /// given; `plinth catalog` refuses to start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seal_key_file: Option<PathBuf>,
    /// The key itself, from `PLINTH_SEAL_KEY` (never from the file); it wins over the file.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub seal_key: Option<Secret>,
    /// Whether `seal_key_file` is made when missing (`plinth serve`'s own key file only).
    #[serde(skip)]
    pub make_seal_key_file: bool,
    /// Ready versions kept per environment, newest first, besides the active one and those
    /// live sessions or Brain bindings read (at least 1).
    pub keep_versions: u32,
    /// Days records of ended work (sessions and their turns and tasks, adapter runs,
    /// idempotency records, Brain operations, torn-down Brain bindings) are kept.
    pub retention_days: u32,
}

impl Default for CatalogSection {
    fn default() -> Self {
        CatalogSection {
            listen: None,
            admin_listen: None,
            database_url: None,
            max_connections: 10,
            node_ttl_ms: 3_000,
            prewarm_versions: plinth_catalog::warm::DEFAULT_PREWARM_VERSIONS,
            build_lease_seconds: 6,
            build_max_attempts: 3,
            build_running_per_scope: plinth_catalog::DEFAULT_RUNNING_PER_SCOPE,
            adapter_credential_grace_seconds: 3600,
            seal_key_file: None,
            seal_key: None,
            make_seal_key_file: false,
            keep_versions: 10,
            retention_days: 30,
        }
    }
}

/// `[source]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceSection {
    /// gRPC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Address for /healthz, /readyz and /metrics (`plinth source` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    /// The index's database; SQLite in `data_dir` when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub database_url: Option<String>,
    /// The blob store; files in `data_dir` when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub blob_url: Option<String>,
    /// Where uploads are spooled and large blobs verified; in `data_dir` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_dir: Option<PathBuf>,
    /// Upper bound on pooled database connections.
    pub max_connections: u32,
    /// Largest file, in bytes (`file_too_large` past it).
    pub max_file_bytes: u64,
    /// Largest import, in bytes: the archive and everything it inflates to.
    pub max_import_bytes: u64,
    /// Most members an import may have.
    pub max_import_entries: u64,
    /// Git URL schemes imports may use.
    pub git_allowed_schemes: Vec<String>,
    /// Whether git imports may reach loopback and private addresses.
    pub git_allow_private_addresses: bool,
    /// Most bytes one git fetch may write (the pack as received); past it the fetch is
    /// stopped and the import answered `file_too_large`.
    pub git_max_fetch_bytes: u64,
    /// Longest one git fetch (and resolving the repository's host) may take, in seconds; past
    /// it the fetch is stopped and the import answered `remote_timeout` (504).
    pub git_fetch_timeout_seconds: u64,
}

impl Default for SourceSection {
    fn default() -> Self {
        let limits = plinth_source::SourceLimits::default();
        SourceSection {
            listen: None,
            admin_listen: None,
            database_url: None,
            blob_url: None,
            spool_dir: None,
            max_connections: 10,
            max_file_bytes: limits.max_file_bytes,
            max_import_bytes: limits.max_import_bytes,
            max_import_entries: limits.max_import_entries,
            git_allowed_schemes: vec!["https".to_owned()],
            git_allow_private_addresses: false,
            git_max_fetch_bytes: plinth_source::git::DEFAULT_MAX_FETCH_BYTES,
            git_fetch_timeout_seconds: plinth_source::git::DEFAULT_FETCH_TIMEOUT.as_secs(),
        }
    }
}

/// `[builder]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuilderSection {
    /// Builders `plinth serve` runs in its own process.
    pub count: u32,
    /// Where builds happen; `<data_dir>/builder` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<PathBuf>,
    /// The unprivileged user installers run as.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Longest one installer step may run, in seconds.
    pub step_timeout_seconds: u64,
    /// The dependency trees (`.venv`, `node_modules`) kept for rebuilds, in MiB: each
    /// environment's newest, least recently kept evicted first; per builder work directory,
    /// or per scope's build disk with `limits.disk_mb`. 0 keeps none.
    pub kept_dependencies_mb: u64,
    /// Each build's bounds (`[builder.limits]`).
    pub limits: BuilderLimits,
    /// A root-owned directory every user can search, where `uv` is made reachable by the
    /// build user.
    pub tools_dir: PathBuf,
    /// Directories of further interpreters builds may choose from when a project pins one
    /// (`.python-version`, `requires-python`, `.nvmrc`, `engines.node`): each holds
    /// `python3.X` or `node` executables directly (a toolchain's `bin`). They come after
    /// the system's on the installers' PATH (a chosen Node's goes first). Each must lie
    /// under `/usr` or `/opt`, which sessions see read-only: a venv names its interpreter by
    /// path, so a session of the version runs the interpreter the build used.
    pub toolchain_dirs: Vec<PathBuf>,
    /// This builder's name; the host name when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The source service's gRPC URL, where `plinth builder` counts each built layer in its
    /// scope's stored bytes; when absent, layers are not counted (`serve` always counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_url: Option<String>,
    /// Address for /healthz, /readyz and /metrics (`plinth builder` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    /// Whether installers may use the network. On: the package registries through the build's
    /// egress proxy (or, with `https_proxy`/`http_proxy` set, the host's network and that
    /// proxy). Off: no network at all, and uv, pip and npm install only from what the project
    /// carries (find-links, `file:` packages, caches).
    pub network: bool,
    /// Addresses, networks or host names (each with an optional `:port`) builds may reach
    /// although the egress policy refuses their range, besides the package registries (PyPI,
    /// npm and the configured indexes, allowed by name): a private mirror or download host.
    pub egress_allow: Vec<String>,
    /// A PEM bundle of the certificate authorities installers trust; when absent, the first
    /// of `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `PIP_CERT`, `CURL_CA_BUNDLE` and
    /// `NODE_EXTRA_CA_CERTS` in the builder's environment that names a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<PathBuf>,
    /// The proxy for HTTPS; `HTTPS_PROXY` (or `https_proxy`) when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub https_proxy: Option<String>,
    /// The proxy for plain HTTP; `HTTP_PROXY` (or `http_proxy`) when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub http_proxy: Option<String>,
    /// Hosts reached without a proxy; `NO_PROXY` (or `no_proxy`) when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_proxy: Option<String>,
    /// The Python index used instead of PyPI; `UV_DEFAULT_INDEX`, `UV_INDEX_URL` or
    /// `PIP_INDEX_URL` when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub python_index_url: Option<String>,
    /// Further Python indexes; `UV_INDEX`, `UV_EXTRA_INDEX_URL` or `PIP_EXTRA_INDEX_URL`
    /// (space-separated) when empty.
    #[serde(serialize_with = "serialize_redacted_urls")]
    pub python_extra_index_urls: Vec<String>,
    /// The npm registry used instead of the public one; `NPM_CONFIG_REGISTRY` (or
    /// `npm_config_registry`) when absent.
    #[serde(
        serialize_with = "config::serialize_redacted_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub npm_registry: Option<String>,
}

fn serialize_redacted_urls<S: serde::Serializer>(
    urls: &[String],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(urls.iter().map(|url| config::redact_url(url)))
}

impl Default for BuilderSection {
    fn default() -> Self {
        BuilderSection {
            count: 1,
            work_dir: None,
            uid: 65534,
            gid: 65534,
            step_timeout_seconds: 1800,
            kept_dependencies_mb: 4096,
            limits: BuilderLimits::default(),
            tools_dir: PathBuf::from("/var/lib/plinth/tools"),
            toolchain_dirs: Vec::new(),
            name: None,
            source_url: None,
            admin_listen: None,
            network: true,
            egress_allow: Vec::new(),
            ca_bundle: None,
            https_proxy: None,
            http_proxy: None,
            no_proxy: None,
            python_index_url: None,
            python_extra_index_urls: Vec::new(),
            npm_registry: None,
        }
    }
}

/// `[builder.limits]`: what one build may use, all of its commands together. A build over a
/// bound fails with a reason naming the bound and this setting; the builder and other builds
/// go on. Memory, processes and CPU are held by a cgroup per build (v1 or v2, as sessions'),
/// which the builder makes below its own cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuilderLimits {
    /// Memory in MiB: the installers' and `setup.sh`'s processes, their `/tmp`, `/dev/shm`
    /// and the page cache of what they write; no swap. From 32 to 1048576.
    pub memory_mb: u64,
    /// Processes and threads at once. From 16 to 4194304.
    pub pids: u64,
    /// CPU time per wall time, in thousandths of a core (1000 = one core). From 10 to
    /// 1024000.
    pub cpu_millicores: u64,
    /// Wall time of the whole build (each step is also held to `step_timeout_seconds`), in
    /// seconds. From 1 to 604800.
    pub wall_seconds: u64,
    /// Disk in MiB for each scope's builds on a builder: its builds' project trees with
    /// `.venv` and `node_modules`, their HOME and `/tmp`, and what the builder keeps for the
    /// scope between builds (its download cache and dependency trees), on an ext4 image of
    /// this size per scope (sparse; loop devices, as sessions' `disk_mb`). From 64 to
    /// 16777216, or 0 for no limit. Left out: [`DEFAULT_BUILD_DISK_MB`] where the host can
    /// make the images, and no limit (with a warning) where it cannot; set, a host that
    /// cannot stops the builder.
    pub disk_mb: Option<u64>,
}

/// A scope's build disk when `builder.limits.disk_mb` is left out, in MiB.
pub const DEFAULT_BUILD_DISK_MB: u64 = 8192;

impl Default for BuilderLimits {
    fn default() -> Self {
        BuilderLimits {
            memory_mb: 4096,
            pids: 1024,
            cpu_millicores: 2000,
            wall_seconds: 3600,
            disk_mb: None,
        }
    }
}

impl BuilderLimits {
    /// Each bound within its range (see the fields).
    pub fn check(&self) -> Result<(), ConfigError> {
        for (name, value, low, high) in [
            ("memory_mb", self.memory_mb, 32, 1_048_576),
            ("pids", self.pids, 16, 4_194_304),
            ("cpu_millicores", self.cpu_millicores, 10, 1_024_000),
            ("wall_seconds", self.wall_seconds, 1, 604_800),
            (
                "disk_mb",
                self.disk_mb.unwrap_or(DEFAULT_BUILD_DISK_MB),
                if self.disk_mb == Some(0) { 0 } else { 64 },
                16_777_216,
            ),
        ] {
            if !(low..=high).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "builder.limits.{name} = {value}: it must be from {low} to {high}{}",
                    if name == "disk_mb" {
                        " (or 0 for no limit)"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(())
    }

    /// The bounds as the builder holds them.
    pub fn build_limits(&self) -> plinth_builder::limits::BuildLimits {
        plinth_builder::limits::BuildLimits {
            memory_mb: Some(self.memory_mb),
            pids: Some(self.pids),
            cpu_millicores: Some(self.cpu_millicores),
            wall: Some(std::time::Duration::from_secs(self.wall_seconds)),
            disk_mb: Some(self.disk_mb.unwrap_or(DEFAULT_BUILD_DISK_MB)).filter(|&mb| mb > 0),
        }
    }

    /// Whether the disk limit was asked for (not just the default): a host that cannot hold
    /// it then stops the builder rather than building without.
    pub fn disk_required(&self) -> bool {
        self.disk_mb.is_some_and(|mb| mb > 0)
    }
}

/// `[node]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Whether `plinth serve` runs a node agent in its own process.
    pub enabled: bool,
    /// gRPC address; an ephemeral loopback port under `serve`, `127.0.0.1:7005` alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The URL the gateway reaches the node at; `http://<listen>` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// The node's state: version cache and sessions; `<data_dir>/node` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The node's name, one per host; the host name when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Run commands without isolation (see `--insecure-no-isolation`).
    pub insecure_no_isolation: bool,
    /// Blob bytes the version cache may hold before unused versions are evicted.
    pub cache_max_bytes: u64,
    /// The first uid sessions get; each session has its own, counting up.
    pub session_base_uid: u32,
    /// Sessions the node runs at once at most; 0: no limit but its memory.
    pub max_sessions: u64,
    /// MiB of the node's memory limit it keeps for itself; it offers sessions the rest.
    pub memory_reserve_mb: u64,
    /// A command's time limit when the caller names none, in seconds.
    pub exec_timeout_seconds: u64,
    /// The longest time limit a caller may ask for, in seconds.
    pub exec_max_timeout_seconds: u64,
    /// What sessions may reach: `egress` (the internet through the node's filtering proxy,
    /// never the host's services or private addresses) or `none` (only their own loopback).
    pub network: SessionNetwork,
    /// Addresses, networks or host names (each with an optional `:port`) sessions may reach
    /// although the egress policy refuses their range: a private package mirror.
    pub egress_allow: Vec<String>,
    /// Bytes of workspace snapshots (what Novo and Brain writes replaced, kept so they can be
    /// undone) each session keeps on the node; the oldest past it are removed.
    pub workspace_snapshot_max_bytes: u64,
    /// Show sessions a version the node has not fetched at once, each file fetched on first
    /// open (needs FUSE and isolation).
    pub lazy_versions: bool,
    /// Blobs fetched at once for whole versions, and as many again for sessions' files.
    pub fetch_concurrency: usize,
    /// How long a session's open of a file not yet fetched waits, in milliseconds.
    pub fetch_timeout_ms: u64,
    /// Environments whose active version the node fetches when it is activated: `*` every
    /// one, or ids and slugs; empty: none.
    pub prewarm: Vec<String>,
}

/// `node.network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionNetwork {
    /// Nothing but the session's own loopback.
    None,
    /// The internet through the node's filtering proxy.
    Egress,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            enabled: true,
            listen: None,
            advertise_url: None,
            state_dir: None,
            name: None,
            insecure_no_isolation: false,
            cache_max_bytes: 20 * 1024 * 1024 * 1024,
            session_base_uid: 200_000,
            max_sessions: 0,
            memory_reserve_mb: 512,
            exec_timeout_seconds: 120,
            exec_max_timeout_seconds: 3600,
            network: SessionNetwork::Egress,
            egress_allow: Vec::new(),
            workspace_snapshot_max_bytes: 256 * 1024 * 1024,
            lazy_versions: true,
            fetch_concurrency: 64,
            fetch_timeout_ms: 30_000,
            prewarm: vec!["*".to_owned()],
        }
    }
}

/// `[sessions]`: each limit's default (what a session gets when it does not ask) and maximum
/// (the most it may ask for). The gateway applies them; tasks and workspace adapters' sessions
/// get the defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsSection {
    /// Memory, in MiB.
    pub memory_mb: u64,
    /// The most memory a session may ask for, in MiB.
    pub max_memory_mb: u64,
    /// Processes and threads at once.
    pub pids: u64,
    /// The most processes a session may ask for.
    pub max_pids: u64,
    /// CPU, in cores (fractional).
    pub cpu: f64,
    /// The most CPU a session may ask for, in cores.
    pub max_cpu: f64,
    /// Disk used in the working directory, in MiB; none when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// The most disk a session may ask for, in MiB.
    pub max_disk_mb: u64,
    /// Milliseconds from creation until a session is ended. Named and counted as the
    /// session's `limits.lifetime_ms` is, so a default reads as what a client would ask for.
    pub lifetime_ms: u64,
    /// The longest lifetime a session may ask for, in milliseconds.
    pub max_lifetime_ms: u64,
    /// Milliseconds without an exec or file call until a session is ended.
    pub idle_ms: u64,
    /// The longest idle time a session may ask for, in milliseconds.
    pub max_idle_ms: u64,
}

impl Default for SessionsSection {
    fn default() -> Self {
        SessionsSection {
            memory_mb: 1024,
            max_memory_mb: 8192,
            pids: 512,
            max_pids: 4096,
            cpu: 1.0,
            max_cpu: 4.0,
            disk_mb: None,
            max_disk_mb: 10_240,
            lifetime_ms: 86_400_000,
            max_lifetime_ms: 604_800_000,
            idle_ms: 3_600_000,
            max_idle_ms: 86_400_000,
        }
    }
}

impl SessionsSection {
    /// The policy the gateway applies, or why these values make none: a default above its
    /// maximum, a zero, a CPU that is not a positive number.
    pub fn policy(&self) -> Result<plinth_gateway::limits::LimitPolicy, ConfigError> {
        use plinth_gateway::limits::{Limit, LimitPolicy, SessionLimits, millicores};
        let cpu = |cores: f64, key: &str| {
            millicores(cores).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "sessions.{key} ({cores}) must be a positive number of cores"
                ))
            })
        };
        let defaults = SessionLimits::default()
            .with(Limit::MemoryMb, Some(self.memory_mb))
            .with(Limit::Pids, Some(self.pids))
            .with(Limit::Cpu, Some(cpu(self.cpu, "cpu")?))
            .with(Limit::DiskMb, self.disk_mb)
            .with(Limit::LifetimeMs, Some(self.lifetime_ms))
            .with(Limit::IdleMs, Some(self.idle_ms));
        let maxima = [
            self.max_memory_mb,
            self.max_pids,
            cpu(self.max_cpu, "max_cpu")?,
            self.max_disk_mb,
            self.max_lifetime_ms,
            self.max_idle_ms,
        ];
        LimitPolicy::new(defaults, maxima).map_err(|error| ConfigError::Invalid(error.to_string()))
    }
}

/// `[quotas]`: what each scope may have at most, by default; `[[quotas.scopes]]` raise or
/// lower them for one scope. The catalog enforces environments, sessions and queued builds;
/// the source service stored bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasSection {
    /// Environments a scope may have.
    pub environments: u64,
    /// Bytes of distinct blobs a scope's sources and build layers may hold (each blob counted
    /// once per scope).
    pub stored_bytes: u64,
    /// Sessions a scope may have active at once.
    pub sessions: u64,
    /// Builds a scope may have queued or running at once.
    pub queued_builds: u64,
    /// Per-scope overrides.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<ScopeQuotas>,
}

/// `[[quotas.scopes]]`: one scope's own limits; each one left out is the default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScopeQuotas {
    /// The scope (as `[[gateway.tokens]]` names it).
    pub scope: String,
    /// Environments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environments: Option<u64>,
    /// Stored bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    /// Active sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    /// Builds queued or running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_builds: Option<u64>,
}

impl Default for QuotasSection {
    fn default() -> Self {
        let defaults = plinth_kit::quota::QuotaLimits::DEFAULT;
        QuotasSection {
            environments: defaults.environments,
            stored_bytes: defaults.stored_bytes,
            sessions: defaults.sessions,
            queued_builds: defaults.queued_builds,
            scopes: Vec::new(),
        }
    }
}

impl QuotasSection {
    /// `PLINTH_QUOTA_ENVIRONMENTS`, `PLINTH_QUOTA_STORED_BYTES`, `PLINTH_QUOTA_SESSIONS` and
    /// `PLINTH_QUOTA_QUEUED_BUILDS` (from `lookup`) replace the file's defaults.
    fn apply_env(&mut self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (name, value) in [
            ("PLINTH_QUOTA_ENVIRONMENTS", &mut self.environments),
            ("PLINTH_QUOTA_STORED_BYTES", &mut self.stored_bytes),
            ("PLINTH_QUOTA_SESSIONS", &mut self.sessions),
            ("PLINTH_QUOTA_QUEUED_BUILDS", &mut self.queued_builds),
        ] {
            if let Some(text) = lookup(name).filter(|text| !text.trim().is_empty()) {
                *value = text.trim().parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "{name} is {text:?}; it must be a whole number (0 allows none)"
                    ))
                })?;
            }
        }
        Ok(())
    }

    /// The limits the services apply, or why these make none: a scope override without a
    /// scope, or a scope named twice.
    pub fn quotas(&self) -> Result<plinth_kit::quota::Quotas, ConfigError> {
        let mut quotas = plinth_kit::quota::Quotas::new(plinth_kit::quota::QuotaLimits {
            environments: self.environments,
            stored_bytes: self.stored_bytes,
            sessions: self.sessions,
            queued_builds: self.queued_builds,
        });
        let mut seen = std::collections::HashSet::new();
        for (index, entry) in self.scopes.iter().enumerate() {
            if entry.scope.trim().is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "quotas.scopes[{index}] names no scope: give scope = \"<scope>\""
                )));
            }
            if !seen.insert(entry.scope.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "quotas.scopes names scope {:?} more than once; give each scope one entry",
                    entry.scope
                )));
            }
            quotas = quotas.with_scope(
                entry.scope.clone(),
                plinth_kit::quota::QuotaOverride {
                    environments: entry.environments,
                    stored_bytes: entry.stored_bytes,
                    sessions: entry.sessions,
                    queued_builds: entry.queued_builds,
                },
            );
        }
        Ok(quotas)
    }
}

impl Config {
    fn load(common: &CommonArgs) -> Result<Self, ConfigError> {
        let mut config: Config = match &common.config {
            Some(path) => config::read_toml(path)?,
            None => Config::default(),
        };
        config.source_file = common
            .config
            .as_ref()
            .map(|path| std::path::absolute(path).unwrap_or_else(|_| path.clone()));
        if let Some(filter) = &common.log {
            config.log.filter = filter.clone();
        }
        if let Some(format) = common.log_format {
            config.log.format = match format {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            };
        }
        if config.internal_token.is_some() || std::env::var_os("PLINTH_INTERNAL_TOKEN").is_some() {
            return Err(ConfigError::Invalid(
                crate::internal::TOKEN_REPLACED.to_owned(),
            ));
        }
        config.internal.apply_env()?;
        config.quotas.apply_env(&|name| std::env::var(name).ok())?;
        config.quotas.quotas()?;
        Ok(config)
    }

    /// The configuration `plinth serve` runs with.
    pub fn for_serve(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(listen) = args.listen {
            config.gateway.listen = listen;
        }
        if let Some(url) = &args.database_url {
            config.catalog.database_url = Some(url.clone());
        }
        if let Some(most) = args.database_max_connections {
            config.catalog.max_connections = most;
        }
        if let Some(listen) = args.catalog_listen {
            config.catalog.listen = Some(listen);
        }
        if let Some(listen) = args.source_listen {
            config.source.listen = Some(listen);
        }
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        config.apply_git_flags(&args.git);
        config.apply_gc_flags(&args.gc)?;
        config.apply_liveness_flags(&args.liveness);
        if let Some(builders) = args.builders {
            config.builder.count = builders;
        }
        if let Some(network) = args.builder_network {
            config.builder.network = network;
        }
        if args.insecure_no_isolation {
            config.node.insecure_no_isolation = true;
        }
        apply_access_flags(&mut config, &args.access, &|name| std::env::var(name).ok())?;
        apply_edge_flags(&mut config, &args.edge)?;
        config.make_paths_absolute()?;
        config.resolve_database();
        config.resolve_source();
        config.resolve_builder()?;
        config.resolve_node();
        config.node.listen.get_or_insert(EPHEMERAL_LOOPBACK);
        config.catalog.listen.get_or_insert(EPHEMERAL_LOOPBACK);
        config.source.listen.get_or_insert(EPHEMERAL_LOOPBACK);
        config.resolve_seal_key(&|name| std::env::var(name).ok(), true)?;
        config.refuse_open_scope_beyond_loopback()?;
        config.sessions.policy()?;
        Ok(config)
    }

    /// The configuration `plinth catalog` runs with.
    pub fn for_catalog(args: &CatalogArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(listen) = args.listen {
            config.catalog.listen = Some(listen);
        }
        if let Some(listen) = args.admin_listen {
            config.catalog.admin_listen = Some(listen);
        }
        if let Some(url) = &args.database_url {
            config.catalog.database_url = Some(url.clone());
        }
        if let Some(most) = args.database_max_connections {
            config.catalog.max_connections = most;
        }
        config.apply_gc_flags(&args.gc)?;
        config.apply_liveness_flags(&args.liveness);
        config.make_paths_absolute()?;
        let private = config.catalog.database_url.is_none();
        config.resolve_database();
        if private {
            refuse_private_fallback(
                "catalog",
                args.standalone,
                &[(
                    "its database in a private SQLite file",
                    config.catalog.database_url.as_deref(),
                    "--database-url or PLINTH_DATABASE_URL",
                )],
            )?;
        }
        config.catalog.listen.get_or_insert(DEFAULT_CATALOG_LISTEN);
        config.resolve_seal_key(&|name| std::env::var(name).ok(), false)?;
        Ok(config)
    }

    /// Where the catalog's seal key comes from: `PLINTH_SEAL_KEY` (from `lookup`), else
    /// `catalog.seal_key_file`, else (`plinth serve` only, `own_file`) `<data_dir>/seal.key`,
    /// made at first start: beside the database, never in it. A rotation's grace past its
    /// maximum is refused here too, since the catalog would refuse every rotation that asked
    /// for it.
    fn resolve_seal_key(
        &mut self,
        lookup: &dyn Fn(&str) -> Option<String>,
        own_file: bool,
    ) -> Result<(), ConfigError> {
        let max = plinth_catalog::adapters::MAX_GRACE_MS / 1000;
        if self.catalog.adapter_credential_grace_seconds > max {
            return Err(ConfigError::Invalid(format!(
                "catalog.adapter_credential_grace_seconds is {}; it must be at most {max} (a week)",
                self.catalog.adapter_credential_grace_seconds
            )));
        }
        self.catalog.seal_key = lookup("PLINTH_SEAL_KEY")
            .filter(|key| !key.trim().is_empty())
            .map(Secret::new);
        if self.catalog.seal_key.is_none() && self.catalog.seal_key_file.is_none() && own_file {
            self.catalog.seal_key_file = Some(self.data_dir.join("seal.key"));
            self.catalog.make_seal_key_file = true;
        }
        Ok(())
    }

    /// The configuration `plinth source` runs with.
    pub fn for_source(args: &SourceArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(listen) = args.listen {
            config.source.listen = Some(listen);
        }
        if let Some(listen) = args.admin_listen {
            config.source.admin_listen = Some(listen);
        }
        if let Some(url) = &args.database_url {
            config.source.database_url = Some(url.clone());
        }
        if let Some(most) = args.database_max_connections {
            config.source.max_connections = most;
        }
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        if let Some(url) = &args.catalog_url {
            config.gateway.catalog_url = url.clone();
        }
        if config.source.database_url.is_none() {
            // The catalog's database, when only that is named: the two keep apart tables
            // (each its own migrations), so one database serves both.
            config.source.database_url = std::env::var("PLINTH_DATABASE_URL")
                .ok()
                .filter(|url| !url.trim().is_empty());
        }
        config.apply_git_flags(&args.git);
        config.apply_gc_flags(&args.gc)?;
        config.make_paths_absolute()?;
        let (private_index, private_blobs) = (
            config.source.database_url.is_none(),
            config.source.blob_url.is_none(),
        );
        config.resolve_source();
        let mut fallbacks = Vec::new();
        if private_index {
            fallbacks.push((
                "its index in a private SQLite file",
                config.source.database_url.as_deref(),
                "--database-url, PLINTH_SOURCE_DATABASE_URL or PLINTH_DATABASE_URL",
            ));
        }
        if private_blobs {
            fallbacks.push((
                "its blobs in a private directory",
                config.source.blob_url.as_deref(),
                "--blob-url or PLINTH_BLOB_URL",
            ));
        }
        refuse_private_fallback("source service", args.standalone, &fallbacks)?;
        config.source.listen.get_or_insert(DEFAULT_SOURCE_LISTEN);
        Ok(config)
    }

    fn apply_git_flags(&mut self, git: &GitArgs) {
        if let Some(schemes) = &git.git_allowed_schemes {
            self.source.git_allowed_schemes = schemes
                .iter()
                .map(|scheme| scheme.trim().to_ascii_lowercase())
                .filter(|scheme| !scheme.is_empty())
                .collect();
        }
        if let Some(private) = git.git_allow_private_addresses {
            self.source.git_allow_private_addresses = private;
        }
        if let Some(max) = git.git_max_fetch_bytes {
            self.source.git_max_fetch_bytes = max;
        }
        if let Some(seconds) = git.git_fetch_timeout_seconds {
            self.source.git_fetch_timeout_seconds = seconds;
        }
    }

    fn resolve_source(&mut self) {
        let source = &mut self.source;
        if source.database_url.is_none() {
            source.database_url = Some(sqlite_url(&self.data_dir.join("source.db")));
        }
        if source.blob_url.is_none() {
            source.blob_url = Some(format!("file://{}", self.data_dir.join("blobs").display()));
        }
        source
            .spool_dir
            .get_or_insert_with(|| self.data_dir.join("spool"));
    }

    /// The configuration `plinth builder` runs with.
    pub fn for_builder(args: &BuilderArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(url) = &args.catalog_url {
            config.gateway.catalog_url = url.clone();
        }
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        if let Some(name) = &args.name {
            config.builder.name = Some(name.clone());
        }
        if let Some(dir) = &args.work_dir {
            config.builder.work_dir = Some(dir.clone());
        }
        if let Some(uid) = args.uid {
            config.builder.uid = uid;
            config.builder.gid = uid;
        }
        if let Some(url) = &args.source_url {
            config.builder.source_url = Some(url.clone());
        }
        if let Some(listen) = args.admin_listen {
            config.builder.admin_listen = Some(listen);
        }
        config.make_paths_absolute()?;
        let private_blobs = config.source.blob_url.is_none();
        config.resolve_source();
        if private_blobs {
            refuse_private_fallback(
                "builder",
                args.standalone,
                &[(
                    "built layers in a private directory",
                    config.source.blob_url.as_deref(),
                    "--blob-url or PLINTH_BLOB_URL",
                )],
            )?;
        }
        config.resolve_builder()?;
        Ok(config)
    }

    /// The configuration `plinth node` runs with.
    pub fn for_node(args: &NodeArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(listen) = args.listen {
            config.node.listen = Some(listen);
        }
        if let Some(url) = &args.advertise_url {
            config.node.advertise_url = Some(url.clone());
        }
        if let Some(url) = &args.catalog_url {
            config.gateway.catalog_url = url.clone();
        }
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        if let Some(name) = &args.name {
            config.node.name = Some(name.clone());
        }
        if let Some(uid) = args.session_base_uid {
            config.node.session_base_uid = uid;
        }
        if let Some(most) = args.max_sessions {
            config.node.max_sessions = most;
        }
        if let Some(reserve) = args.memory_reserve_mb {
            config.node.memory_reserve_mb = reserve;
        }
        if args.insecure_no_isolation {
            config.node.insecure_no_isolation = true;
        }
        config.make_paths_absolute()?;
        let private_blobs = config.source.blob_url.is_none();
        config.resolve_source();
        // `--drain` only tells the catalog: it reads no versions.
        if private_blobs && !args.drain {
            refuse_private_fallback(
                "node",
                args.standalone,
                &[(
                    "versions from a private directory",
                    config.source.blob_url.as_deref(),
                    "--blob-url or PLINTH_BLOB_URL",
                )],
            )?;
        }
        config.resolve_node();
        config
            .node
            .listen
            .get_or_insert(SocketAddr::from(([127, 0, 0, 1], 7005)));
        Ok(config)
    }

    fn resolve_node(&mut self) {
        self.node
            .state_dir
            .get_or_insert_with(|| self.data_dir.join("node"));
        if self.node.name.is_none() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_owned())
                .unwrap_or_else(|_| "node".to_owned());
            self.node.name = Some(host);
        }
    }

    fn resolve_builder(&mut self) -> Result<(), ConfigError> {
        self.builder.limits.check()?;
        self.builder
            .work_dir
            .get_or_insert_with(|| self.data_dir.join("builder"));
        if self.builder.name.is_none() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|name| name.trim().to_owned())
                .unwrap_or_else(|_| "builder".to_owned());
            self.builder.name = Some(format!("{host}-{}", std::process::id()));
        }
        self.resolve_registries(&|name| std::env::var(name).ok());
        let hidden = self.builder_hidden_paths();
        if let Some(why) =
            plinth_builder::sandbox::hidden_from_builds(&self.builder.tools_dir, &hidden)
        {
            return Err(ConfigError::Invalid(format!(
                "builder.tools_dir: builds could not reach the tools placed there: {why}. \
                 Choose a directory outside it, such as the default /var/lib/plinth/tools"
            )));
        }
        for dir in &self.builder.toolchain_dirs {
            if !dir.is_absolute()
                || !(dir.starts_with("/opt") || dir.starts_with("/usr"))
                || dir
                    .components()
                    .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(ConfigError::Invalid(format!(
                    "builder.toolchain_dirs: {} is not under /opt or /usr; sessions see only \
                     those read-only, so a version built with an interpreter elsewhere could \
                     not run. Install the toolchain under /opt (e.g. /opt/python3.12/bin)",
                    dir.display()
                )));
            }
        }
        if let Some(bundle) = &self.builder.ca_bundle
            && !bundle.is_file()
        {
            return Err(ConfigError::Invalid(format!(
                "builder.ca_bundle {} is not a readable file: name the PEM bundle of the \
                 certificate authorities builds should trust",
                bundle.display()
            )));
        }
        Ok(())
    }

    /// What builds must not see, as sessions do not: Plinth's data (databases, blobs, other
    /// builds), the builder's and the node's state, and the configuration file. They are absent
    /// from a build's root, and covered where they lie beneath a system directory it shows; the
    /// build's own scratch directory is shown all the same.
    pub fn builder_hidden_paths(&self) -> Vec<PathBuf> {
        let mut hidden = vec![self.data_dir.clone()];
        hidden.extend(self.builder.work_dir.clone());
        hidden.extend(self.node.state_dir.clone());
        hidden.extend(self.source_file.clone());
        hidden.extend(self.catalog.seal_key_file.clone());
        hidden
    }

    /// Fills the registry settings the file and flags left unset from the standard variables
    /// of the builder's own environment (`lookup`), so a machine that reaches registries
    /// through its own certificate authority, a proxy or a mirror builds as its other tools
    /// do. A certificate variable naming no file is passed over.
    fn resolve_registries(&mut self, lookup: &dyn Fn(&str) -> Option<String>) {
        let first = |names: &[&str]| {
            names
                .iter()
                .filter_map(|name| lookup(name))
                .map(|value| value.trim().to_owned())
                .find(|value| !value.is_empty())
        };
        let builder = &mut self.builder;
        if builder.ca_bundle.is_none() {
            builder.ca_bundle = [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "PIP_CERT",
                "CURL_CA_BUNDLE",
                "NODE_EXTRA_CA_CERTS",
            ]
            .iter()
            .filter_map(|name| lookup(name))
            .map(|value| PathBuf::from(value.trim()))
            .find(|path| path.is_absolute() && path.is_file());
        }
        if builder.https_proxy.is_none() {
            builder.https_proxy = first(&["HTTPS_PROXY", "https_proxy"]);
        }
        if builder.http_proxy.is_none() {
            builder.http_proxy = first(&["HTTP_PROXY", "http_proxy"]);
        }
        if builder.no_proxy.is_none() {
            builder.no_proxy = first(&["NO_PROXY", "no_proxy"]);
        }
        if builder.python_index_url.is_none() {
            builder.python_index_url =
                first(&["UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"]);
        }
        if builder.python_extra_index_urls.is_empty() {
            builder.python_extra_index_urls =
                first(&["UV_INDEX", "UV_EXTRA_INDEX_URL", "PIP_EXTRA_INDEX_URL"])
                    .map(|urls| urls.split_whitespace().map(str::to_owned).collect())
                    .unwrap_or_default();
        }
        if builder.npm_registry.is_none() {
            builder.npm_registry = first(&["NPM_CONFIG_REGISTRY", "npm_config_registry"]);
        }
    }

    /// The registry settings builds use (the certificate bundle as the builder found it; the
    /// builder passes builds a copy they can read).
    pub fn registries(&self) -> plinth_builder::Registries {
        let builder = &self.builder;
        plinth_builder::Registries {
            ca_bundle: builder.ca_bundle.clone(),
            https_proxy: builder.https_proxy.clone(),
            http_proxy: builder.http_proxy.clone(),
            no_proxy: builder.no_proxy.clone(),
            python_index_url: builder.python_index_url.clone(),
            python_extra_index_urls: builder.python_extra_index_urls.clone(),
            npm_registry: builder.npm_registry.clone(),
        }
    }

    /// The configuration `plinth gateway` runs with.
    pub fn for_gateway(args: &GatewayArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(listen) = args.listen {
            config.gateway.listen = listen;
        }
        if let Some(url) = &args.catalog_url {
            config.gateway.catalog_url = url.clone();
        }
        if let Some(url) = &args.source_url {
            config.gateway.source_url = url.clone();
        }
        apply_access_flags(&mut config, &args.access, &|name| std::env::var(name).ok())?;
        apply_edge_flags(&mut config, &args.edge)?;
        config.make_paths_absolute()?;
        config.refuse_open_scope_beyond_loopback()?;
        config.sessions.policy()?;
        Ok(config)
    }

    /// Makes every configured path absolute, against the working directory `plinth` was
    /// started in, once, before anything is derived from them: a relative path would otherwise
    /// mean something else to each service that uses it (the builder's sandbox changes
    /// directory; mounts need absolute paths), and `--dump-config` shows what is used.
    fn make_paths_absolute(&mut self) -> Result<(), ConfigError> {
        fn absolute(path: &mut PathBuf, key: &str) -> Result<(), ConfigError> {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "{key} is empty: name a directory"
                )));
            }
            if !path.is_absolute() {
                *path = std::path::absolute(&*path).map_err(|error| {
                    ConfigError::Invalid(format!(
                        "{key} {} is relative and the working directory cannot be read ({error}): \
                         give an absolute path",
                        path.display()
                    ))
                })?;
            }
            Ok(())
        }
        fn absolute_url(
            url: &mut Option<String>,
            scheme: &str,
            key: &str,
        ) -> Result<(), ConfigError> {
            let Some(rest) = url.as_deref().and_then(|url| url.strip_prefix(scheme)) else {
                return Ok(());
            };
            if rest.starts_with('/') || rest.starts_with(":memory:") || rest.is_empty() {
                return Ok(());
            }
            let (path, query) = rest
                .split_once('?')
                .map_or((rest, None), |(path, query)| (path, Some(query)));
            let mut path = PathBuf::from(path);
            absolute(&mut path, key)?;
            *url = Some(match query {
                Some(query) => format!("{scheme}{}?{query}", path.display()),
                None => format!("{scheme}{}", path.display()),
            });
            Ok(())
        }
        absolute(&mut self.data_dir, "data_dir")?;
        if let Some(dir) = &mut self.source.spool_dir {
            absolute(dir, "source.spool_dir")?;
        }
        if let Some(dir) = &mut self.builder.work_dir {
            absolute(dir, "builder.work_dir")?;
        }
        absolute(&mut self.builder.tools_dir, "builder.tools_dir")?;
        if let Some(bundle) = &mut self.builder.ca_bundle {
            absolute(bundle, "builder.ca_bundle")?;
        }
        if let Some(dir) = &mut self.node.state_dir {
            absolute(dir, "node.state_dir")?;
        }
        if let Some(file) = &mut self.catalog.seal_key_file {
            if file.as_os_str().is_empty() {
                return Err(ConfigError::Invalid(
                    "catalog.seal_key_file is empty: name the file that holds the seal key"
                        .to_owned(),
                ));
            }
            absolute(file, "catalog.seal_key_file")?;
        }
        absolute_url(
            &mut self.catalog.database_url,
            "sqlite://",
            "catalog.database_url",
        )?;
        absolute_url(
            &mut self.source.database_url,
            "sqlite://",
            "source.database_url",
        )?;
        absolute_url(&mut self.source.blob_url, "file://", "source.blob_url")?;
        Ok(())
    }

    fn resolve_database(&mut self) {
        if self.catalog.database_url.is_none() {
            self.catalog.database_url = Some(sqlite_url(&self.data_dir.join("catalog.db")));
        }
    }

    /// Without tokens every caller shares one scope: fine on a laptop, never on a network.
    fn refuse_open_scope_beyond_loopback(&self) -> Result<(), ConfigError> {
        let listen = self.gateway.listen;
        if self.gateway.tokens.is_empty() && !listen.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {listen} without tokens: every caller would share one scope. \
                 Configure tokens (PLINTH_TOKENS=token=scope or [[gateway.tokens]] in the config file), \
                 or listen on a loopback address such as 127.0.0.1:{}",
                listen.port()
            )));
        }
        Ok(())
    }

    /// The configuration as TOML, secrets redacted.
    pub fn dump(&self) -> Result<String, ConfigError> {
        config::dump_toml(self)
    }

    /// The token → scope pairs for the gateway.
    pub fn token_scopes(&self) -> Vec<(Secret, String)> {
        self.gateway
            .tokens
            .iter()
            .map(|entry| (entry.token.clone(), entry.scope.clone()))
            .collect()
    }
}

/// The variable client tokens may come from besides the config file.
const TOKENS_VARIABLE: &str = "PLINTH_TOKENS";

/// Client tokens come from the config file or `PLINTH_TOKENS` (`lookup` reads the
/// environment), never from the command line, which every process of the host can read.
fn apply_access_flags(
    config: &mut Config,
    access: &AccessArgs,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if access.tokens_on_the_command_line.is_some() {
        return Err(ConfigError::Invalid(format!(
            "--tokens is refused: a command line is readable by every process of this host \
             (ps, /proc/<pid>/cmdline), so a token given there is not secret. Put the tokens in \
             the config file ([[gateway.tokens]] with token and scope) or in the environment \
             variable {TOKENS_VARIABLE}=token=scope,token=scope"
        )));
    }
    let mut source = "gateway.tokens";
    if let Some(tokens) = lookup(TOKENS_VARIABLE).filter(|tokens| !tokens.trim().is_empty()) {
        config.gateway.tokens = config::parse_token_scopes(&tokens)
            .map_err(|error| ConfigError::Invalid(format!("{TOKENS_VARIABLE}: {error}")))?
            .into_iter()
            .map(|(token, scope)| TokenEntry { token, scope })
            .collect();
        source = TOKENS_VARIABLE;
    }
    if let Some(environments) = access.environments {
        config.gateway.environments = environments;
    }
    for entry in &config.gateway.tokens {
        if entry.token.expose().is_empty()
            || !entry.token.expose().bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::Invalid(
                "every token must be non-empty printable ASCII without spaces".to_owned(),
            ));
        }
        let scope_ok = !entry.scope.is_empty()
            && entry.scope.len() <= 128
            && entry.scope.bytes().all(|b| b.is_ascii_graphic());
        if !scope_ok {
            return Err(ConfigError::Invalid(format!(
                "scope {:?}: scopes are 1 to 128 printable ASCII characters without spaces",
                entry.scope
            )));
        }
    }
    refuse_duplicate_tokens(&config.gateway.tokens, source)
}

/// The same token twice would grant whichever scope came last, silently: a start-up error
/// that names the entries by position and scope, never the token.
fn refuse_duplicate_tokens(tokens: &[TokenEntry], source: &str) -> Result<(), ConfigError> {
    for (later, entry) in tokens.iter().enumerate() {
        if let Some(first) = tokens[..later]
            .iter()
            .position(|earlier| earlier.token.expose() == entry.token.expose())
        {
            return Err(ConfigError::Invalid(format!(
                "{source}: entries {} (scope {:?}) and {} (scope {:?}) have the same token; \
                 each token must be listed once, with the one scope it grants",
                first + 1,
                tokens[first].scope,
                later + 1,
                entry.scope
            )));
        }
    }
    Ok(())
}

fn apply_edge_flags(config: &mut Config, edge: &EdgeArgs) -> Result<(), ConfigError> {
    let gateway = &mut config.gateway;
    if let Some(rate) = edge.rate_limit_per_second {
        gateway.rate_limit_per_second = rate;
    }
    if let Some(burst) = edge.rate_limit_burst {
        gateway.rate_limit_burst = burst;
    }
    if let Some(seconds) = edge.request_timeout_seconds {
        gateway.request_timeout_seconds = seconds;
    }
    if let Some(max) = edge.max_concurrent_requests {
        gateway.max_concurrent_requests = max;
    }
    if let Some(max) = edge.max_concurrent_requests_per_client {
        gateway.max_concurrent_requests_per_client = max;
    }
    if let Some(max) = edge.adapter_max_unverified_bodies {
        gateway.adapter_max_unverified_bodies = max;
    }
    gateway.adapter_rate()?;
    gateway.callback_allow()?;
    if let Some(hosts) = &edge.allowed_hosts {
        gateway.allowed_hosts = listed(hosts);
    }
    if let Some(origins) = &edge.allowed_origins {
        gateway.allowed_origins = listed(origins);
    }
    if let Some(seconds) = edge.header_timeout_seconds {
        gateway.header_timeout_seconds = seconds;
    }
    if let Some(seconds) = edge.idle_timeout_seconds {
        gateway.idle_timeout_seconds = seconds;
    }
    if let Some(max) = edge.max_connections {
        gateway.max_connections = max;
    }
    if let Some(max) = edge.max_connections_per_client {
        gateway.max_connections_per_client = max;
    }
    if let Some(ms) = edge.node_call_timeout_ms {
        gateway.node_call_timeout_ms = ms;
    }
    if let Some(ms) = edge.node_attach_timeout_ms {
        gateway.node_attach_timeout_ms = ms;
    }
    if let Some(ms) = edge.node_suspect_ms {
        gateway.node_suspect_ms = ms;
    }
    gateway.node_call_limits()?;
    gateway.edge_limits().map(|_| ())
}

/// A comma-separated list's entries, without blanks (an empty variable is an empty list).
fn listed(entries: &[String]) -> Vec<String> {
    entries
        .iter()
        .map(|entry| entry.trim())
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

// ---- Garbage collection and retention (`[gc]`, `catalog.keep_versions`,
// `catalog.retention_days`, `plinth gc`) ----

impl Config {
    /// Applies the garbage collection and retention flags (and their variables) over the file.
    fn apply_liveness_flags(&mut self, liveness: &crate::args::LivenessArgs) {
        if let Some(ms) = liveness.node_ttl_ms {
            self.catalog.node_ttl_ms = ms;
        }
        if let Some(seconds) = liveness.build_lease_seconds {
            self.catalog.build_lease_seconds = seconds;
        }
    }

    fn apply_gc_flags(&mut self, gc: &crate::args::GcArgs) -> Result<(), ConfigError> {
        if let Some(seconds) = gc.gc_interval_seconds {
            self.gc.interval_seconds = seconds;
        }
        if let Some(seconds) = gc.gc_grace_seconds {
            self.gc.grace_seconds = seconds;
        }
        if let Some(seconds) = gc.gc_hold_seconds {
            self.gc.hold_seconds = seconds;
        }
        if let Some(keep) = gc.keep_versions {
            self.catalog.keep_versions = keep;
        }
        if let Some(days) = gc.retention_days {
            self.catalog.retention_days = days;
        }
        if self.catalog.keep_versions == 0 {
            return Err(ConfigError::Invalid(
                "catalog.keep_versions is 0: keep at least 1 ready version per environment \
                 (the active one is always kept besides)"
                    .to_owned(),
            ));
        }
        if self.gc.hold_seconds == 0 {
            return Err(ConfigError::Invalid(
                "gc.hold_seconds is 0: holds of work in progress must live at least a second"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The configuration `plinth gc` runs with: the catalog's and the source's databases and
    /// the blob store, as `serve` (or the split services) would find them.
    pub fn for_gc(args: &crate::args::GcCommandArgs) -> Result<Self, ConfigError> {
        let mut config = Config::load(&args.common)?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(url) = &args.database_url {
            config.catalog.database_url = Some(url.clone());
        }
        if let Some(url) = &args.source_database_url {
            config.source.database_url = Some(url.clone());
        }
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        config.apply_gc_flags(&args.gc)?;
        config.make_paths_absolute()?;
        config.resolve_database();
        config.resolve_source();
        Ok(config)
    }
}

/// A service run alone (not under `serve`) that was given no shared database or blob store
/// would fall back to files of its own under the data directory, which its siblings and other
/// replicas never see: the builds it stores would be missing everywhere else. That is refused
/// unless asked for with `--standalone`. Each fallback is (what it would keep, where, how to
/// name the shared one).
fn refuse_private_fallback(
    service: &str,
    standalone: bool,
    fallbacks: &[(&str, Option<&str>, &str)],
) -> Result<(), ConfigError> {
    if standalone || fallbacks.is_empty() {
        return Ok(());
    }
    let what = fallbacks
        .iter()
        .map(|(what, url, _)| format!("{what} ({})", url.unwrap_or("under --data-dir")))
        .collect::<Vec<_>>()
        .join(" and ");
    let how = fallbacks
        .iter()
        .map(|(_, _, how)| *how)
        .collect::<Vec<_>>()
        .join("; ");
    Err(ConfigError::Invalid(format!(
        "this {service} would keep {what}, which no other service or replica sees: give it the \
         deployment's shared ones ({how}), or pass --standalone (PLINTH_STANDALONE=true) to run \
         it alone on this machine's files"
    )))
}

/// The SQLite URL of a database file.
pub fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
}

/// `[gc]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcSection {
    /// Seconds between collection passes (in the source service) and retention runs (in the
    /// catalog); 0: only when `plinth gc` is run.
    pub interval_seconds: u64,
    /// Seconds a blob nothing names is kept after it was last written.
    pub grace_seconds: u64,
    /// Seconds the holds of work in progress outlive their last renewal: how long the blobs of
    /// an upload or import whose process died are kept past it.
    pub hold_seconds: u64,
}

impl Default for GcSection {
    fn default() -> Self {
        GcSection {
            interval_seconds: 3600,
            grace_seconds: 3600,
            hold_seconds: 60,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::args::Cli;

    fn serve(argv: &[&str]) -> Result<Config, ConfigError> {
        let mut full = vec!["plinth", "serve"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full).expect("flags parse");
        let crate::args::Command::Serve(args) = &cli.command else {
            unreachable!("serve")
        };
        Config::for_serve(args)
    }

    /// The configuration of a split service (`catalog`, `source`, `builder`, `node`).
    fn split(argv: &[&str]) -> Result<Config, ConfigError> {
        let mut full = vec!["plinth"];
        full.extend_from_slice(argv);
        let cli = Cli::try_parse_from(full).expect("flags parse");
        match &cli.command {
            crate::args::Command::Catalog(args) => Config::for_catalog(args),
            crate::args::Command::Source(args) => Config::for_source(args),
            crate::args::Command::Builder(args) => Config::for_builder(args),
            crate::args::Command::Node(args) => Config::for_node(args),
            _ => unreachable!("a split service"),
        }
    }

    #[test]
    fn a_split_service_refuses_private_files_unless_standalone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().to_str().expect("utf-8");
        for (service, says) in [
            ("catalog", "its database in a private SQLite file"),
            ("source", "its index in a private SQLite file"),
            ("source", "its blobs in a private directory"),
            ("builder", "built layers in a private directory"),
            ("node", "versions from a private directory"),
        ] {
            let error = split(&[service, "--data-dir", data])
                .expect_err("private files are refused")
                .to_string();
            assert!(
                error.contains(says) && error.contains("--standalone") && error.contains(data),
                "{service}: {error}"
            );
            split(&[service, "--data-dir", data, "--standalone"]).expect("standalone runs");
        }
        // Named shared stores are what a split deployment gives; explicit local ones are the
        // user's choice.
        split(&["catalog", "--database-url", "postgres://db/plinth"]).expect("catalog");
        split(&[
            "source",
            "--database-url",
            "postgres://db/plinth",
            "--blob-url",
            "s3://bucket/prefix",
        ])
        .expect("source");
        split(&["node", "--blob-url", "file:///srv/blobs"]).expect("node");
        // The source's index, given none of its own, is the catalog's database.
        let error = split(&["source", "--blob-url", "s3://bucket/prefix"])
            .expect_err("no database")
            .to_string();
        assert!(error.contains("PLINTH_DATABASE_URL"), "{error}");
    }

    #[test]
    fn the_example_config_in_deploy_is_valid() {
        let example: Config =
            toml::from_str(include_str!("../../deploy/plinth.example.toml")).expect("parses");
        assert_eq!(example.gateway.listen, DEFAULT_LISTEN);
    }

    #[test]
    fn flags_override_the_file_and_typos_in_the_file_are_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        std::fs::write(
            &file,
            "data_dir = \"/from/file\"\n[gateway]\nlisten = \"127.0.0.1:9999\"\n",
        )
        .expect("write");
        let path = file.to_str().expect("utf-8");
        let config = serve(&["--config", path, "--listen", "127.0.0.1:7777"]).expect("config");
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.gateway.listen.port(), 7777, "the flag wins");
        assert_eq!(
            config.catalog.database_url.as_deref(),
            Some("sqlite:///from/file/catalog.db?mode=rwc")
        );

        std::fs::write(&file, "[gateway]\nlisten_addr = \"127.0.0.1:1\"\n").expect("write");
        let error = serve(&["--config", path]).expect_err("unknown key");
        assert!(error.to_string().contains("listen_addr"), "{error}");
    }

    /// A config file with `body`, kept as long as the answer lives.
    fn config_file(body: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        std::fs::write(&file, body).expect("write");
        let path = file.to_str().expect("utf-8").to_owned();
        (dir, path)
    }

    #[test]
    fn an_open_scope_stays_on_loopback() {
        let error = serve(&["--listen", "0.0.0.0:8080"]).expect_err("refused");
        assert!(error.to_string().contains("without tokens"), "{error}");
        let (_dir, path) = config_file("[[gateway.tokens]]\ntoken = \"t\"\nscope = \"acme\"\n");
        serve(&["--listen", "0.0.0.0:8080", "--config", &path]).expect("tokens make it safe");
        let (_dir, path) =
            config_file("[[gateway.tokens]]\ntoken = \"t\"\nscope = \"has space\"\n");
        let error = serve(&["--config", &path]).expect_err("bad scope");
        assert!(error.to_string().contains("scope"), "{error}");
    }

    #[test]
    fn client_tokens_come_from_the_file_or_the_environment_never_a_flag() {
        let error = serve(&["--tokens", "tok-on-the-command-line=acme"]).expect_err("refused");
        let said = error.to_string();
        assert!(
            said.contains("--tokens is refused")
                && said.contains("[[gateway.tokens]]")
                && said.contains("PLINTH_TOKENS"),
            "{said}"
        );
        assert!(!said.contains("tok-on-the-command-line"), "{said}");

        let access = |environments| AccessArgs {
            tokens_on_the_command_line: None,
            environments,
        };
        let from_env =
            |name: &str| (name == "PLINTH_TOKENS").then(|| "tok-a=acme, tok-b=globex".to_owned());
        let mut config = Config::default();
        apply_access_flags(&mut config, &access(None), &from_env).expect("variable");
        let scopes: Vec<_> = config
            .token_scopes()
            .into_iter()
            .map(|(token, scope)| (token.expose().to_owned(), scope))
            .collect();
        assert_eq!(
            scopes,
            [
                ("tok-a".to_owned(), "acme".to_owned()),
                ("tok-b".to_owned(), "globex".to_owned())
            ]
        );
        let twice =
            |name: &str| (name == "PLINTH_TOKENS").then(|| "tok-a=acme,tok-a=globex".to_owned());
        let error = apply_access_flags(&mut Config::default(), &access(None), &twice)
            .expect_err("duplicate");
        assert!(
            error.to_string().starts_with("PLINTH_TOKENS: entries 1"),
            "{error}"
        );
    }

    #[test]
    fn the_same_token_twice_in_the_file_is_a_start_up_error_that_does_not_print_it() {
        let (_dir, path) = config_file(
            "[[gateway.tokens]]\ntoken = \"tok-secret-twice\"\nscope = \"acme\"\n\
             [[gateway.tokens]]\ntoken = \"tok-other\"\nscope = \"initech\"\n\
             [[gateway.tokens]]\ntoken = \"tok-secret-twice\"\nscope = \"globex\"\n",
        );
        let said = serve(&["--config", &path])
            .expect_err("duplicate")
            .to_string();
        assert!(
            said.contains("gateway.tokens")
                && said.contains("entries 1 (scope \"acme\") and 3 (scope \"globex\")")
                && said.contains("same token"),
            "{said}"
        );
        assert!(!said.contains("tok-secret-twice"), "{said}");
    }

    #[test]
    fn node_call_deadlines_have_defaults_a_file_flags_and_a_floor() {
        let ms = std::time::Duration::from_millis;
        let limits = serve(&[])
            .expect("defaults")
            .gateway
            .node_call_limits()
            .expect("valid");
        assert_eq!(
            (limits.call, limits.attach, limits.suspect_for),
            (ms(5_000), ms(60_000), ms(30_000))
        );
        let (_dir, path) =
            config_file("[gateway]\nnode_call_timeout_ms = 700\nnode_attach_timeout_ms = 9000\n");
        let limits = serve(&["--config", &path, "--node-suspect-ms", "4000"])
            .expect("file and flag")
            .gateway
            .node_call_limits()
            .expect("valid");
        assert_eq!(
            (limits.call, limits.attach, limits.suspect_for),
            (ms(700), ms(9_000), ms(4_000))
        );
        // An attach deadline under the unary one is raised to it.
        let limits = serve(&[
            "--node-call-timeout-ms",
            "3000",
            "--node-attach-timeout-ms",
            "200",
        ])
        .expect("flags")
        .gateway
        .node_call_limits()
        .expect("valid");
        assert_eq!(limits.attach, ms(3_000));
        for (flag, floor) in [
            ("--node-call-timeout-ms", "at least 100"),
            ("--node-attach-timeout-ms", "at least 100"),
            ("--node-suspect-ms", "at least 1000"),
        ] {
            let error = serve(&[flag, "0"]).expect_err(flag);
            assert!(error.to_string().contains(floor), "{flag}: {error}");
        }
    }

    #[test]
    fn the_edge_limits_have_defaults_a_file_flags_and_a_floor() {
        let config = serve(&[]).expect("defaults");
        let limits = config.gateway.edge_limits().expect("valid");
        assert_eq!(limits.rate_per_second, 100);
        assert_eq!(limits.rate_burst, 200);
        assert_eq!(limits.request_timeout, std::time::Duration::from_secs(60));
        assert_eq!(limits.max_concurrent_requests, 1024);
        assert_eq!(limits.max_unverified_bodies, 4);
        let dumped = config.dump().expect("dump");
        for line in [
            "rate_limit_per_second = 100",
            "rate_limit_burst = 200",
            "request_timeout_seconds = 60",
            "max_concurrent_requests = 1024",
            "adapter_max_unverified_bodies = 4",
        ] {
            assert!(dumped.contains(line), "{line} not in:\n{dumped}");
        }
        let (_dir, path) =
            config_file("[gateway]\nrate_limit_per_second = 5\nrate_limit_burst = 7\n");
        let config = serve(&["--config", &path, "--request-timeout-seconds", "9"]).expect("file");
        let limits = config.gateway.edge_limits().expect("valid");
        assert_eq!((limits.rate_per_second, limits.rate_burst), (5, 7));
        assert_eq!(limits.request_timeout, std::time::Duration::from_secs(9));
        for flag in [
            "--request-timeout-seconds",
            "--max-concurrent-requests",
            "--adapter-max-unverified-bodies",
            "--rate-limit-burst",
        ] {
            let error = serve(&[flag, "0"]).expect_err(flag);
            assert!(error.to_string().contains("at least 1"), "{flag}: {error}");
        }
        serve(&["--rate-limit-per-second", "0", "--rate-limit-burst", "0"])
            .expect("no rate limit needs no burst");
    }

    #[test]
    fn every_configured_path_is_absolute_once_loaded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        std::fs::write(
            &file,
            "[node]\nstate_dir = \"node-state\"\n[source]\nspool_dir = \"./spool\"\n",
        )
        .expect("write");
        let path = file.to_str().expect("utf-8");
        let config = serve(&["--config", path, "--data-dir", "./data"]).expect("config");
        let here = std::env::current_dir().expect("working directory");
        assert_eq!(config.data_dir, here.join("data"));
        assert_eq!(config.node.state_dir, Some(here.join("node-state")));
        assert_eq!(config.source.spool_dir, Some(here.join("spool")));
        assert_eq!(config.builder.work_dir, Some(here.join("data/builder")));
        assert_eq!(
            config.catalog.database_url,
            Some(sqlite_url(&here.join("data/catalog.db")))
        );
        let config =
            serve(&["--database-url", "sqlite://rel/catalog.db?mode=rwc"]).expect("config");
        assert_eq!(
            config.catalog.database_url,
            Some(format!(
                "sqlite://{}?mode=rwc",
                here.join("rel/catalog.db").display()
            ))
        );
    }

    #[test]
    fn a_tools_dir_the_build_sandbox_hides_is_a_start_up_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        for (tools, why) in [
            ("/tmp/plinth-tools", "/tmp"),
            ("/srv/plinth/builder/tools", "/srv/plinth"),
        ] {
            std::fs::write(
                &file,
                format!("data_dir = \"/srv/plinth\"\n[builder]\ntools_dir = \"{tools}\"\n"),
            )
            .expect("write");
            let error = serve(&["--config", file.to_str().expect("utf-8")]).expect_err(tools);
            let said = error.to_string();
            assert!(
                said.contains("builder.tools_dir") && said.contains(why),
                "{said}"
            );
        }
    }

    #[test]
    fn toolchain_dirs_sessions_could_not_see_are_a_start_up_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        for (dirs, ok) in [
            ("[\"/opt/python3.12/bin\", \"/usr/local/node22/bin\"]", true),
            ("[\"/root/.pyenv/versions/3.12.1/bin\"]", false),
            ("[\"/opt/../home/python\"]", false),
            ("[\"relative/bin\"]", false),
        ] {
            std::fs::write(
                &file,
                format!("data_dir = \"/srv/plinth\"\n[builder]\ntoolchain_dirs = {dirs}\n"),
            )
            .expect("write");
            let answer = serve(&["--config", file.to_str().expect("utf-8")]);
            match answer {
                Ok(config) => assert!(ok, "{dirs} accepted: {:?}", config.builder.toolchain_dirs),
                Err(error) => {
                    let said = error.to_string();
                    assert!(
                        !ok && said.contains("builder.toolchain_dirs"),
                        "{dirs}: {said}"
                    );
                }
            }
        }
    }

    #[test]
    fn registry_settings_come_from_the_builders_environment_unless_configured() {
        let bundle = tempfile::NamedTempFile::new().expect("bundle");
        let bundle_path = bundle.path().to_string_lossy().into_owned();
        let variables = [
            ("SSL_CERT_FILE", "/no/such/bundle.pem"),
            ("REQUESTS_CA_BUNDLE", bundle_path.as_str()),
            ("https_proxy", "http://u:p@proxy:3128"),
            ("NO_PROXY", "localhost,.internal"),
            ("PIP_INDEX_URL", "https://mirror/simple"),
            ("UV_EXTRA_INDEX_URL", "https://a/simple https://b/simple"),
            ("npm_config_registry", "https://npm.mirror/"),
        ];
        let lookup = |name: &str| {
            variables
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        let mut config = Config::default();
        config.builder.npm_registry = Some("https://configured/".to_owned());
        config.resolve_registries(&lookup);
        let registries = config.registries();
        // A variable naming no file is passed over for the next.
        assert_eq!(registries.ca_bundle, Some(bundle.path().to_owned()));
        assert_eq!(
            registries.https_proxy.as_deref(),
            Some("http://u:p@proxy:3128")
        );
        assert_eq!(registries.http_proxy, None);
        assert_eq!(registries.no_proxy.as_deref(), Some("localhost,.internal"));
        assert_eq!(
            registries.python_index_url.as_deref(),
            Some("https://mirror/simple")
        );
        assert_eq!(
            registries.python_extra_index_urls,
            vec!["https://a/simple".to_owned(), "https://b/simple".to_owned()]
        );
        assert_eq!(
            registries.npm_registry.as_deref(),
            Some("https://configured/")
        );
        let dumped = config.dump().expect("dump");
        assert!(
            dumped.contains("https_proxy = \"http://u:<redacted>@proxy:3128\""),
            "{dumped}"
        );
        assert!(!dumped.contains("u:p@"), "{dumped}");
        assert!(dumped.contains(&bundle_path), "{dumped}");
    }

    #[test]
    fn a_builds_disk_limit_is_on_by_default_required_when_set_and_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        let path = file.to_str().expect("utf-8");
        let limits = serve(&[]).expect("config").builder.limits;
        assert_eq!(limits.build_limits().disk_mb, Some(DEFAULT_BUILD_DISK_MB));
        assert!(!limits.disk_required());

        std::fs::write(&file, "[builder.limits]\ndisk_mb = 64\n").expect("write");
        let config = serve(&["--config", path]).expect("config");
        assert_eq!(config.builder.limits.build_limits().disk_mb, Some(64));
        assert!(config.builder.limits.disk_required());

        std::fs::write(&file, "[builder.limits]\ndisk_mb = 0\n").expect("write");
        let config = serve(&["--config", path]).expect("config");
        assert_eq!(config.builder.limits.build_limits().disk_mb, None);
        assert!(!config.builder.limits.disk_required());

        for bad in ["16", "20000000"] {
            std::fs::write(&file, format!("[builder.limits]\ndisk_mb = {bad}\n")).expect("write");
            let error = serve(&["--config", path]).expect_err("refused").to_string();
            assert!(
                error.contains("builder.limits.disk_mb") && error.contains("or 0 for no limit"),
                "{error}"
            );
        }
    }

    #[test]
    fn session_limits_are_configured_by_file_and_a_default_above_its_maximum_is_refused() {
        use plinth_gateway::limits::Limit;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        let path = file.to_str().expect("utf-8");
        let policy = serve(&[])
            .expect("config")
            .sessions
            .policy()
            .expect("defaults");
        assert_eq!(policy.defaults().get(Limit::MemoryMb), Some(1024));
        assert_eq!(policy.defaults().get(Limit::Cpu), Some(1000));
        assert_eq!(policy.defaults().get(Limit::DiskMb), None);
        assert_eq!(policy.max(Limit::DiskMb), 10_240);

        std::fs::write(
            &file,
            "[sessions]\ncpu = 0.5\ndisk_mb = 2048\nidle_ms = 60000\n",
        )
        .expect("write");
        let config = serve(&["--config", path]).expect("config");
        let policy = config.sessions.policy().expect("valid");
        assert_eq!(policy.defaults().get(Limit::Cpu), Some(500));
        assert_eq!(policy.defaults().get(Limit::DiskMb), Some(2048));
        assert_eq!(policy.defaults().get(Limit::IdleMs), Some(60_000));
        let dumped = config.dump().expect("dump");
        for line in [
            "[sessions]",
            "cpu = 0.5",
            "disk_mb = 2048",
            "max_memory_mb = 8192",
        ] {
            assert!(dumped.contains(line), "{line} not in:\n{dumped}");
        }

        for (body, key) in [
            ("memory_mb = 9000\n", "sessions.max_memory_mb"),
            ("max_cpu = 0.5\n", "sessions.max_cpu"),
            ("max_idle_ms = 0\n", "sessions.max_idle_ms"),
            ("cpu = -1.0\n", "sessions.cpu"),
        ] {
            std::fs::write(&file, format!("[sessions]\n{body}")).expect("write");
            let error = serve(&["--config", path]).expect_err(body);
            assert!(error.to_string().contains(key), "{body}: {error}");
        }
        std::fs::write(&file, "[sessions]\nmemory = 1\n").expect("write");
        let error = serve(&["--config", path]).expect_err("unknown key");
        assert!(error.to_string().contains("memory"), "{error}");
    }

    #[test]
    fn dumped_config_hides_every_secret() {
        let (_dir, path) = config_file(
            "[[gateway.tokens]]\ntoken = \"tok-very-secret\"\nscope = \"acme\"\n\
             [internal]\ncredential = \"internal-secret\"\n\
             [[internal.accept]]\nrole = \"observer\"\ntoken = \"observer-secret-0123456789\"\n",
        );
        let config = serve(&[
            "--config",
            &path,
            "--database-url",
            "postgres://app:db-password@db/plinth",
        ])
        .expect("config");
        let dumped = config.dump().expect("dump");
        for secret in [
            "tok-very-secret",
            "db-password",
            "internal-secret",
            "observer-secret-0123456789",
        ] {
            assert!(!dumped.contains(secret), "{secret} leaked:\n{dumped}");
        }
        assert!(dumped.contains("scope = \"acme\""));
        assert!(dumped.contains("postgres://app:<redacted>@db/plinth"));
    }

    #[test]
    fn the_seal_key_comes_from_the_environment_a_file_or_serves_own_file() {
        let here = std::env::current_dir().expect("cwd");
        let mut config = serve(&["--data-dir", "data"]).expect("config");
        config.catalog.seal_key_file = None;
        config
            .resolve_seal_key(&|_| None, true)
            .expect("serve's own file");
        assert_eq!(
            config.catalog.seal_key_file,
            Some(here.join("data/seal.key"))
        );
        assert!(config.catalog.make_seal_key_file);
        assert!(
            config
                .builder_hidden_paths()
                .contains(&here.join("data/seal.key"))
        );

        let mut config = serve(&["--data-dir", "data"]).expect("config");
        config.catalog.seal_key_file = None;
        config
            .resolve_seal_key(
                &|name| (name == "PLINTH_SEAL_KEY").then(|| "a-key-in-base64".to_owned()),
                true,
            )
            .expect("from the environment");
        assert_eq!(config.catalog.seal_key_file, None);
        let dumped = config.dump().expect("dump");
        assert!(!dumped.contains("a-key-in-base64"), "{dumped}");
        assert!(dumped.contains("seal_key = \"<redacted>\""), "{dumped}");

        let mut config = Config::default();
        config
            .resolve_seal_key(&|_| None, false)
            .expect("a catalog alone");
        assert_eq!(
            config.catalog.seal_key_file, None,
            "plinth catalog makes none"
        );
        assert!(!config.catalog.make_seal_key_file);

        let mut config = Config::default();
        config.catalog.adapter_credential_grace_seconds = 604_801;
        let error = config
            .resolve_seal_key(&|_| None, false)
            .expect_err("past a week");
        assert!(error.to_string().contains("604800"), "{error}");
    }

    #[test]
    fn the_git_fetch_cap_has_a_default_shown_in_the_dump_and_the_file_and_flag_set_it() {
        let config = serve(&[]).expect("config");
        assert_eq!(config.source.git_max_fetch_bytes, 1 << 30);
        let dumped = config.dump().expect("dump");
        assert!(
            dumped.contains("git_max_fetch_bytes = 1073741824"),
            "{dumped}"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("plinth.toml");
        std::fs::write(&file, "[source]\ngit_max_fetch_bytes = 5000\n").expect("write");
        let path = file.to_str().expect("utf-8");
        let config = serve(&["--config", path]).expect("config");
        assert_eq!(config.source.git_max_fetch_bytes, 5000);
        let config = serve(&["--config", path, "--git-max-fetch-bytes", "7000"]).expect("config");
        assert_eq!(config.source.git_max_fetch_bytes, 7000, "the flag wins");
    }

    #[test]
    fn quotas_come_from_the_file_the_environment_and_per_scope_overrides() {
        let (_dir, path) = config_file(
            "[quotas]\nsessions = 5\nstored_bytes = 4096\n\
             [[quotas.scopes]]\nscope = \"acme\"\nsessions = 500\n",
        );
        let config = serve(&["--config", &path]).expect("config");
        let quotas = config.quotas.quotas().expect("quotas");
        use plinth_kit::quota::Quota;
        assert_eq!(quotas.limit("acme", Quota::Sessions), 500);
        assert_eq!(quotas.limit("acme", Quota::StoredBytes), 4096);
        assert_eq!(quotas.limit("globex", Quota::Sessions), 5);
        assert_eq!(quotas.limit("globex", Quota::Environments), 1000);
        assert_eq!(quotas.limit("globex", Quota::QueuedBuilds), 20);

        let mut section = QuotasSection::default();
        let env = |name: &str| match name {
            "PLINTH_QUOTA_ENVIRONMENTS" => Some("7".to_owned()),
            "PLINTH_QUOTA_QUEUED_BUILDS" => Some(" 3 ".to_owned()),
            _ => None,
        };
        section.apply_env(&env).expect("env");
        assert_eq!((section.environments, section.queued_builds), (7, 3));
        assert_eq!(section.stored_bytes, 50 * 1024 * 1024 * 1024);
        let error = section
            .apply_env(&|name: &str| (name == "PLINTH_QUOTA_SESSIONS").then(|| "lots".to_owned()))
            .expect_err("not a number");
        assert!(
            error.to_string().contains("PLINTH_QUOTA_SESSIONS"),
            "{error}"
        );

        let (_dir, path) = config_file(
            "[[quotas.scopes]]\nscope = \"acme\"\n[[quotas.scopes]]\nscope = \"acme\"\nsessions = 1\n",
        );
        let error = serve(&["--config", &path]).expect_err("twice");
        assert!(
            error.to_string().contains("\"acme\" more than once"),
            "{error}"
        );
    }

    /// The fields a `Deserialize` struct accepts, as its derive names them.
    fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
        #[derive(Debug)]
        struct Stop;
        impl std::fmt::Display for Stop {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("stop")
            }
        }
        impl std::error::Error for Stop {}
        impl serde::de::Error for Stop {
            fn custom<M: std::fmt::Display>(_: M) -> Self {
                Stop
            }
        }
        struct Capture<'a>(&'a mut &'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for Capture<'_> {
            type Error = Stop;
            fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
                Err(Stop)
            }
            fn deserialize_struct<V: serde::de::Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Stop> {
                *self.0 = fields;
                Err(Stop)
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Capture(&mut fields));
        assert!(
            !fields.is_empty(),
            "{} names no fields",
            std::any::type_name::<T>()
        );
        fields
    }

    #[test]
    fn the_example_configuration_names_every_section_and_key_and_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/plinth.example.toml");
        let text = std::fs::read_to_string(&path).expect("the example configuration");
        use std::collections::BTreeSet;
        // Its keys, commented out or not, by the section (table) they are under.
        let mut named: BTreeSet<(String, String)> = BTreeSet::new();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some(header) = line.strip_prefix('[') {
                let header = header.trim_start_matches('[');
                if let Some(end) = header.find(']') {
                    section = header[..end].trim().to_owned();
                    named.insert((String::new(), section.clone()));
                    continue;
                }
            }
            let Some((key, _)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                named.insert((section.clone(), key.to_owned()));
            }
        }
        let tables: &[(&str, &[&str])] = &[
            ("", fields_of::<Config>()),
            ("internal", fields_of::<crate::internal::InternalSection>()),
            (
                "internal.accept",
                fields_of::<plinth_kit::auth::AcceptEntry>(),
            ),
            ("internal.tls", fields_of::<crate::internal::InternalTls>()),
            ("log", fields_of::<LogConfig>()),
            ("gateway", fields_of::<GatewaySection>()),
            ("gateway.tokens", fields_of::<TokenEntry>()),
            ("catalog", fields_of::<CatalogSection>()),
            ("source", fields_of::<SourceSection>()),
            ("builder", fields_of::<BuilderSection>()),
            ("builder.limits", fields_of::<BuilderLimits>()),
            ("node", fields_of::<NodeSection>()),
            ("sessions", fields_of::<SessionsSection>()),
            ("quotas", fields_of::<QuotasSection>()),
            ("quotas.scopes", fields_of::<ScopeQuotas>()),
            ("gc", fields_of::<GcSection>()),
        ];
        // Refused keys, kept only to say what replaced them.
        let retired = [("", "internal_token")];
        let mut missing = Vec::new();
        for (table, fields) in tables {
            for field in *fields {
                if retired.contains(&(*table, *field)) {
                    continue;
                }
                // A sub-table is named by its own header.
                let sub = if table.is_empty() {
                    (*field).to_owned()
                } else {
                    format!("{table}.{field}")
                };
                let as_key = named.contains(&((*table).to_owned(), (*field).to_owned()));
                let as_table = named.contains(&(String::new(), sub.clone()));
                if !as_key && !as_table {
                    missing.push(sub);
                }
            }
        }
        assert!(missing.is_empty(), "not in {}: {missing:?}", path.display());
        // Nothing it names is unknown to the configuration.
        let known: BTreeSet<(String, String)> = tables
            .iter()
            .flat_map(|(table, fields)| {
                fields
                    .iter()
                    .map(|field| ((*table).to_owned(), (*field).to_owned()))
            })
            .collect();
        let unknown: Vec<&(String, String)> = named
            .iter()
            .filter(|entry| {
                let (table, key) = entry;
                if table.is_empty() && tables.iter().any(|(name, _)| name == key) {
                    return false;
                }
                !known.contains(*entry)
            })
            .collect();
        assert!(
            unknown.is_empty(),
            "unknown keys in {}: {unknown:?}",
            path.display()
        );
        // And it loads as it is, with the real loader, for every command.
        let file = path.to_str().expect("utf-8");
        let config = serve(&["--config", file]).expect("serve loads the example");
        assert_eq!(config.log.format, LogFormat::Text);
        for command in ["catalog", "source", "builder", "node"] {
            split(&[command, "--config", file, "--standalone"])
                .unwrap_or_else(|error| panic!("{command} loads the example: {error}"));
        }
    }
}
