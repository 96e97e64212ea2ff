//! The effective configuration of a `plinth` process: defaults, then the TOML file, then
//! environment variables and flags (see `args`). Each command resolves what it will use, so
//! `--dump-config` prints exactly that, secrets redacted.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use plinth_kit::config::{self, ConfigError, Secret};
use plinth_kit::telemetry::{LogConfig, LogFormat};
use serde::{Deserialize, Serialize};

use crate::args::{
    AccessArgs, BuilderArgs, CatalogArgs, CommonArgs, GatewayArgs, GitArgs, LogFormatArg, NodeArgs,
    ServeArgs, SourceArgs,
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
    /// Shared secret between services; calls without it are refused when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_token: Option<Secret>,
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source_file: None,
            data_dir: PathBuf::from("./plinth-data"),
            internal_token: None,
            log: LogConfig::default(),
            gateway: GatewaySection::default(),
            catalog: CatalogSection::default(),
            source: SourceSection::default(),
            builder: BuilderSection::default(),
            node: NodeSection::default(),
            sessions: SessionsSection::default(),
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
}

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
    /// How long a builder's lease on a build lasts unless renewed, in seconds.
    pub build_lease_seconds: u64,
    /// Leases a build may be handed before a lost builder fails it.
    pub build_max_attempts: u32,
    /// How long a workspace adapter's rotated-out secret or token is still accepted, in
    /// seconds.
    pub adapter_credential_grace_seconds: u64,
}

impl Default for CatalogSection {
    fn default() -> Self {
        CatalogSection {
            listen: None,
            admin_listen: None,
            database_url: None,
            max_connections: 10,
            build_lease_seconds: 30,
            build_max_attempts: 3,
            adapter_credential_grace_seconds: 3600,
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
    /// A root-owned directory every user can search, where `uv` is made reachable by the
    /// build user.
    pub tools_dir: PathBuf,
    /// This builder's name; the host name when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
            tools_dir: PathBuf::from("/var/lib/plinth/tools"),
            name: None,
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
            exec_timeout_seconds: 120,
            exec_max_timeout_seconds: 3600,
            network: SessionNetwork::Egress,
            egress_allow: Vec::new(),
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
    /// Seconds from creation until a session is ended.
    pub lifetime_s: u64,
    /// The longest lifetime a session may ask for, in seconds.
    pub max_lifetime_s: u64,
    /// Seconds without an exec or file call until a session is ended.
    pub idle_s: u64,
    /// The longest idle time a session may ask for, in seconds.
    pub max_idle_s: u64,
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
            lifetime_s: 86_400,
            max_lifetime_s: 604_800,
            idle_s: 3_600,
            max_idle_s: 86_400,
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
            .with(Limit::LifetimeS, Some(self.lifetime_s))
            .with(Limit::IdleS, Some(self.idle_s));
        let maxima = [
            self.max_memory_mb,
            self.max_pids,
            cpu(self.max_cpu, "max_cpu")?,
            self.max_disk_mb,
            self.max_lifetime_s,
            self.max_idle_s,
        ];
        LimitPolicy::new(defaults, maxima).map_err(ConfigError::Invalid)
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
        if let Some(token) = &common.internal_token {
            config.internal_token = Some(Secret::new(token.clone()));
        }
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
        if let Some(builders) = args.builders {
            config.builder.count = builders;
        }
        if let Some(network) = args.builder_network {
            config.builder.network = network;
        }
        if args.insecure_no_isolation {
            config.node.insecure_no_isolation = true;
        }
        apply_access_flags(&mut config, &args.access)?;
        config.make_paths_absolute()?;
        config.resolve_database();
        config.resolve_source();
        config.resolve_builder()?;
        config.resolve_node();
        config.node.listen.get_or_insert(EPHEMERAL_LOOPBACK);
        config.catalog.listen.get_or_insert(EPHEMERAL_LOOPBACK);
        config.source.listen.get_or_insert(EPHEMERAL_LOOPBACK);
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
        config.make_paths_absolute()?;
        config.resolve_database();
        config.catalog.listen.get_or_insert(DEFAULT_CATALOG_LISTEN);
        Ok(config)
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
        if let Some(url) = &args.blob_url {
            config.source.blob_url = Some(url.clone());
        }
        config.apply_git_flags(&args.git);
        config.make_paths_absolute()?;
        config.resolve_source();
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
        config.make_paths_absolute()?;
        config.resolve_source();
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
        if args.insecure_no_isolation {
            config.node.insecure_no_isolation = true;
        }
        config.make_paths_absolute()?;
        config.resolve_source();
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
        apply_access_flags(&mut config, &args.access)?;
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

fn apply_access_flags(config: &mut Config, access: &AccessArgs) -> Result<(), ConfigError> {
    if let Some(tokens) = access.tokens.as_deref() {
        config.gateway.tokens = config::parse_token_scopes(tokens)?
            .into_iter()
            .map(|(token, scope)| TokenEntry { token, scope })
            .collect();
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
    Ok(())
}

/// The SQLite URL of a database file.
pub fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
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

    #[test]
    fn an_open_scope_stays_on_loopback() {
        let error = serve(&["--listen", "0.0.0.0:8080"]).expect_err("refused");
        assert!(error.to_string().contains("without tokens"), "{error}");
        serve(&["--listen", "0.0.0.0:8080", "--tokens", "t=acme"]).expect("tokens make it safe");
        let error = serve(&["--tokens", "t=has space"]).expect_err("bad scope");
        assert!(error.to_string().contains("scope"), "{error}");
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
            "[sessions]\ncpu = 0.5\ndisk_mb = 2048\nidle_s = 60\n",
        )
        .expect("write");
        let config = serve(&["--config", path]).expect("config");
        let policy = config.sessions.policy().expect("valid");
        assert_eq!(policy.defaults().get(Limit::Cpu), Some(500));
        assert_eq!(policy.defaults().get(Limit::DiskMb), Some(2048));
        assert_eq!(policy.defaults().get(Limit::IdleS), Some(60));
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
            ("max_idle_s = 0\n", "sessions.max_idle_s"),
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
        let config = serve(&[
            "--tokens",
            "tok-very-secret=acme",
            "--database-url",
            "postgres://app:db-password@db/plinth",
            "--internal-token",
            "internal-secret",
        ])
        .expect("config");
        let dumped = config.dump().expect("dump");
        for secret in ["tok-very-secret", "db-password", "internal-secret"] {
            assert!(!dumped.contains(secret), "{secret} leaked:\n{dumped}");
        }
        assert!(dumped.contains("scope = \"acme\""));
        assert!(dumped.contains("postgres://app:<redacted>@db/plinth"));
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
}
