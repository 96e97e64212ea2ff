//! Command-line flags. Every flag that sets configuration has an environment variable; both
//! override the config file, and flags override variables.
//!
//! The flags that mean the same wherever they are given (`--config`, `--dump-config`, `--log`,
//! `--log-format` for the services, `--output` and `--url` for the client) are global: they go before or
//! after the subcommand alike (`plinth --config plinth.toml serve` is `plinth serve --config
//! plinth.toml`). Parsing hands them to the command they belong to, and refuses one typed for
//! a command that has no use for it rather than ignoring it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::client_args as client;

/// A parsed command line: the command, with the global flags handed to it.
#[derive(Debug)]
pub struct Cli {
    /// What to run.
    pub command: Command,
    /// `--url`: the server a client command talks to, over `PLINTH_URL` and the saved one.
    pub url: Option<String>,
}

// The command line as clap reads it, before the global flags are handed to the command.
/// Plinth: environments for agent sessions.
#[derive(Debug, Parser)]
#[command(name = "plinth", version, about, long_about = None)]
struct RawCli {
    #[command(flatten)]
    global: GlobalArgs,
    /// What to run.
    #[command(subcommand)]
    command: Command,
}

// The global flags.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct GlobalArgs {
    /// A TOML config file for a service (`serve`, `gateway`, …, `gc`); flags and environment
    /// variables override it.
    #[arg(long, env = "PLINTH_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Print a service's effective configuration (secrets redacted) and exit.
    #[arg(long, global = true)]
    dump_config: bool,
    /// A service's log filter, e.g. `info` or `plinth_catalog=debug,info`.
    #[arg(long, env = "PLINTH_LOG", global = true)]
    log: Option<String>,
    /// A service's log format.
    #[arg(long, env = "PLINTH_LOG_FORMAT", value_enum, global = true)]
    log_format: Option<LogFormatArg>,
    /// Once a service listens, write the addresses it bound to this file (one JSON object,
    /// e.g. `{"listen":"127.0.0.1:41234"}`), so whoever gave port 0 learns the port.
    #[arg(long, value_name = "PATH", global = true)]
    ready_file: Option<PathBuf>,
    /// How a client command prints: `text` for people, `json` for the API's own answers (one
    /// JSON document per line when a command streams).
    #[arg(long, short = 'o', value_enum, global = true)]
    output: Option<client::OutputFormat>,
    /// The server a client command talks to, over PLINTH_URL and the one `plinth login` saved
    /// (the token is still PLINTH_TOKEN's or the saved one).
    #[arg(long = "url", id = "server_url", value_name = "URL", global = true)]
    url: Option<String>,
}

impl CommandFactory for Cli {
    fn command() -> clap::Command {
        RawCli::command()
    }

    fn command_for_update() -> clap::Command {
        RawCli::command_for_update()
    }
}

impl FromArgMatches for Cli {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let RawCli {
            global,
            mut command,
        } = RawCli::from_arg_matches(matches)?;
        // Typed on this command line (an environment variable is no request for this command).
        let typed = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        let name = command.name();
        let refuse = |flag: &str, why: &str| {
            Err(clap::Error::raw(
                ErrorKind::ArgumentConflict,
                format!("{flag} does not apply to `plinth {name}`: {why}"),
            ))
        };
        match command.common_mut() {
            Some(common) => {
                common.config = global.config;
                common.dump_config = global.dump_config;
                common.log = global.log;
                common.log_format = global.log_format;
                common.ready_file = global.ready_file;
            }
            None => {
                for flag in ["config", "dump_config", "log", "log_format", "ready_file"] {
                    if typed(flag) {
                        let client = if command.is_client() {
                            "; client commands find their server by --url, PLINTH_URL or \
                             `plinth login`"
                        } else {
                            ""
                        };
                        return refuse(
                            &format!("--{}", flag.replace('_', "-")),
                            &format!(
                                "it sets up a service (serve, catalog, source, gateway, \
                                 builder, node, gc){client}"
                            ),
                        );
                    }
                }
            }
        }
        match command.output_args_mut() {
            Some(output) => output.output = global.output.unwrap_or_default(),
            None if typed("output") => {
                return refuse("--output", "it prints no answer of the API's to format");
            }
            None => {}
        }
        let mut url = None;
        if typed("server_url") {
            match &mut command {
                Command::Login(login) if login.url.is_some() => {
                    return refuse("--url", "login takes the URL as its argument; give one");
                }
                Command::Login(login) => login.url = global.url,
                command if command.talks_to_a_server() => url = global.url,
                _ => return refuse("--url", "it talks to no server"),
            }
        }
        Ok(Cli { command, url })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Parser for Cli {}

/// The services `plinth` can run, and the client commands that talk to them.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every service in one process: SQLite and local files under --data-dir, REST on
    /// --listen. Nothing else needs to be installed.
    Serve(Box<ServeArgs>),
    /// Run the catalog service alone (gRPC), for a split deployment.
    Catalog(CatalogArgs),
    /// Run the source service alone (gRPC): environment files and imports.
    Source(SourceArgs),
    /// Run the REST gateway alone, in front of the catalog and source services.
    Gateway(GatewayArgs),
    /// Run one builder: lease builds from the catalog and install them (needs root).
    Builder(BuilderArgs),
    /// Run this host's node agent: materialize versions and run sessions' commands, each in
    /// its own mount namespace with the environment read-only (needs root unless
    /// --insecure-no-isolation).
    Node(NodeArgs),
    /// Make credentials for calls between services.
    #[command(subcommand)]
    Credential(CredentialCommand),
    /// Run retention and one garbage collection pass now, against the configured databases
    /// and blob store (beside running services or not); --dry-run only says what it would
    /// reclaim.
    Gc(GcCommandArgs),

    // The client: commands for people talking to a running server.
    /// Save the server's URL and a token for the commands below (PLINTH_URL and PLINTH_TOKEN
    /// override them).
    Login(client::LoginArgs),
    /// Create, list, show and delete environments.
    #[command(subcommand)]
    Env(client::EnvCommand),
    /// Make an environment's source equal a local directory: one streamed archive import,
    /// honouring .gitignore and .plinthignore, and leaving out .venv, node_modules and
    /// __pycache__ unless --no-default-ignores.
    Push(client::PushArgs),
    /// Import a git repository into an environment's source: over it, or in place of it with
    /// --replace.
    Import(client::ImportArgs),
    /// Build the next version of an environment; --follow prints its log as it is written.
    /// `build logs` prints a build's log, or follows a running one.
    Build(client::BuildArgs),
    /// List an environment's versions, and which one is active.
    Versions(client::EnvArgs),
    /// Make a ready version the active one (roll back or forward).
    Activate(client::ActivateArgs),
    /// Start and end sessions.
    #[command(subcommand)]
    Session(client::SessionCommand),
    /// Run a command in a session (or in a new one on an environment) and exit with its
    /// status.
    Exec(client::ExecArgs),
    /// Copy a file between this machine and a session's working directory.
    Cp(client::CpArgs),
    /// Open an interactive terminal in a session (or in a new one on an environment, ended
    /// afterwards) and exit with its status.
    Shell(client::ShellArgs),
    /// Print a shell completion script.
    Completions(client::CompletionsArgs),
    /// Print the manual page (roff).
    Man,
}

impl Command {
    /// Whether this is a client command (it talks to a server over REST) rather than a
    /// service: those need no configuration file, telemetry or service runtime.
    pub fn is_client(&self) -> bool {
        matches!(
            self,
            Command::Login(_)
                | Command::Env(_)
                | Command::Push(_)
                | Command::Import(_)
                | Command::Build(_)
                | Command::Versions(_)
                | Command::Activate(_)
                | Command::Session(_)
                | Command::Exec(_)
                | Command::Cp(_)
                | Command::Shell(_)
                | Command::Completions(_)
                | Command::Man
        )
    }

    /// Whether this is a client command that calls the REST API (`completions` and `man`
    /// need no server).
    pub fn talks_to_a_server(&self) -> bool {
        self.is_client() && !matches!(self, Command::Completions(_) | Command::Man)
    }

    /// The subcommand's name as typed, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Serve(_) => "serve",
            Command::Catalog(_) => "catalog",
            Command::Source(_) => "source",
            Command::Gateway(_) => "gateway",
            Command::Builder(_) => "builder",
            Command::Node(_) => "node",
            Command::Credential(_) => "credential",
            Command::Gc(_) => "gc",
            Command::Login(_) => "login",
            Command::Env(_) => "env",
            Command::Push(_) => "push",
            Command::Import(_) => "import",
            Command::Build(_) => "build",
            Command::Versions(_) => "versions",
            Command::Activate(_) => "activate",
            Command::Session(_) => "session",
            Command::Exec(_) => "exec",
            Command::Cp(_) => "cp",
            Command::Shell(_) => "shell",
            Command::Completions(_) => "completions",
            Command::Man => "man",
        }
    }

    /// The flags every service takes, for a service.
    pub fn common_mut(&mut self) -> Option<&mut CommonArgs> {
        Some(match self {
            Command::Serve(args) => &mut args.common,
            Command::Catalog(args) => &mut args.common,
            Command::Source(args) => &mut args.common,
            Command::Gateway(args) => &mut args.common,
            Command::Builder(args) => &mut args.common,
            Command::Node(args) => &mut args.common,
            Command::Gc(args) => &mut args.common,
            _ => return None,
        })
    }

    /// Where the global `--output` goes, for a client command that prints an answer.
    pub fn output_args_mut(&mut self) -> Option<&mut client::OutputArgs> {
        use crate::client_args::{BuildCommand, EnvCommand, SessionCommand};
        Some(match self {
            Command::Login(args) => &mut args.output,
            Command::Env(EnvCommand::Create(args)) => &mut args.output,
            Command::Env(EnvCommand::List(output)) => output,
            Command::Env(EnvCommand::Show(args)) => &mut args.output,
            Command::Env(EnvCommand::Rm(args)) => &mut args.output,
            Command::Push(args) => &mut args.output,
            Command::Import(args) => &mut args.output,
            Command::Build(args) => match &mut args.command {
                Some(BuildCommand::Logs(logs)) => &mut logs.output,
                None => &mut args.output,
            },
            Command::Versions(args) => &mut args.output,
            Command::Activate(args) => &mut args.output,
            Command::Session(SessionCommand::New(args)) => &mut args.output,
            Command::Session(SessionCommand::End(args)) => &mut args.output,
            Command::Session(SessionCommand::List(args)) => &mut args.output,
            Command::Exec(args) => &mut args.output,
            Command::Cp(args) => &mut args.output,
            _ => return None,
        })
    }
}

/// `plinth credential …`.
#[derive(Debug, Subcommand)]
pub enum CredentialCommand {
    /// Print a new random credential for one role (and, for a node or builder, one name),
    /// and the `[[accept]]` entry the services it calls need (its digest, not the token).
    New(NewCredentialArgs),
}

/// `plinth credential new`.
#[derive(Debug, Args)]
pub struct NewCredentialArgs {
    /// `gateway`, `builder`, `node`, `source` or `observer`.
    #[arg(long)]
    pub role: String,
    /// The one node or builder the credential is for (its `--name`); any when absent.
    #[arg(long)]
    pub name: Option<String>,
}

/// Flags every service takes. They are global flags (given before or after the subcommand);
/// parsing hands them here.
#[derive(Debug, Default, Args)]
pub struct CommonArgs {
    /// A TOML config file; flags and environment variables override it (`--config`).
    #[arg(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (secrets redacted) and exit (`--dump-config`).
    #[arg(skip)]
    pub dump_config: bool,
    /// Log filter, e.g. `info` or `plinth_catalog=debug,info` (`--log`).
    #[arg(skip)]
    pub log: Option<String>,
    /// Log format (`--log-format`).
    #[arg(skip)]
    pub log_format: Option<LogFormatArg>,
    /// Where to write the addresses the service bound, once it listens (`--ready-file`).
    #[arg(skip)]
    pub ready_file: Option<PathBuf>,
}

/// Log formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What git imports may reach: `serve` and `source` take these.
#[derive(Debug, Args)]
pub struct GitArgs {
    /// Git URL schemes imports may use, comma-separated (`https`, `http`, `file`).
    #[arg(long, env = "PLINTH_GIT_ALLOWED_SCHEMES", value_delimiter = ',')]
    pub git_allowed_schemes: Option<Vec<String>>,
    /// Let git imports reach loopback and private addresses (`true`/`false`).
    #[arg(long, env = "PLINTH_GIT_ALLOW_PRIVATE_ADDRESSES")]
    pub git_allow_private_addresses: Option<bool>,
    /// Most bytes one git fetch may write; past it the fetch is stopped.
    #[arg(long, env = "PLINTH_GIT_MAX_FETCH_BYTES")]
    pub git_max_fetch_bytes: Option<u64>,
    /// Longest one git fetch may take, in seconds; past it the import answers 504.
    #[arg(long, env = "PLINTH_GIT_FETCH_TIMEOUT_SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub git_fetch_timeout_seconds: Option<u64>,
}

/// Who may call the REST API and what it serves: `serve` and `gateway` take these. Client
/// tokens come from the config file (`[[gateway.tokens]]`) or `PLINTH_TOKENS` only: a command
/// line is readable by every process of the host.
#[derive(Debug, Args)]
pub struct AccessArgs {
    /// Refused with a message saying where tokens go instead.
    #[arg(long = "tokens", hide = true, value_name = "TOKENS")]
    pub tokens_on_the_command_line: Option<String>,
    /// Serve the environments chapter (`true`/`false`).
    #[arg(long, env = "PLINTH_ENVIRONMENTS")]
    pub environments: Option<bool>,
}

/// The gateway's own limits: `serve` and `gateway` take these.
#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// Requests per second each client token may make (0: no limit).
    #[arg(long, env = "PLINTH_RATE_LIMIT_PER_SECOND")]
    pub rate_limit_per_second: Option<u32>,
    /// Requests a client token may make at once above its rate.
    #[arg(long, env = "PLINTH_RATE_LIMIT_BURST")]
    pub rate_limit_burst: Option<u32>,
    /// Seconds from a request's arrival to its answer's head (commands, uploads and session
    /// starts have limits of their own).
    #[arg(long, env = "PLINTH_REQUEST_TIMEOUT_SECONDS")]
    pub request_timeout_seconds: Option<u64>,
    /// Requests the gateway serves at once, streamed answers included.
    #[arg(long, env = "PLINTH_MAX_CONCURRENT_REQUESTS")]
    pub max_concurrent_requests: Option<u32>,
    /// Requests one client (a token, or an address without one) has in flight at once.
    #[arg(long, env = "PLINTH_MAX_CONCURRENT_REQUESTS_PER_CLIENT")]
    pub max_concurrent_requests_per_client: Option<u32>,
    /// Workspace-adapter bodies read at once before their signature is known.
    #[arg(long, env = "PLINTH_ADAPTER_MAX_UNVERIFIED_BODIES")]
    pub adapter_max_unverified_bodies: Option<u32>,
    /// Names the gateway answers to besides IP addresses and localhost, comma-separated
    /// (`plinth.example.com,*.internal.example`); replaces gateway.allowed_hosts.
    #[arg(long, env = "PLINTH_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Web page origins that may make state-changing requests and open terminals,
    /// comma-separated; replaces gateway.allowed_origins.
    #[arg(long, env = "PLINTH_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Option<Vec<String>>,
    /// Seconds a request's headers may take to arrive before its connection is closed.
    #[arg(long, env = "PLINTH_HEADER_TIMEOUT_SECONDS")]
    pub header_timeout_seconds: Option<u64>,
    /// Seconds an HTTP/2 connection may stay open with no request in flight.
    #[arg(long, env = "PLINTH_IDLE_TIMEOUT_SECONDS")]
    pub idle_timeout_seconds: Option<u64>,
    /// Connections open at once (0: half the open-file limit, at most 16384).
    #[arg(long, env = "PLINTH_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// Connections open at once from one client address.
    #[arg(long, env = "PLINTH_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<u32>,
    /// Milliseconds a node agent has to answer a call before the caller gets 503 and the
    /// node is held suspect.
    #[arg(long, env = "PLINTH_NODE_CALL_TIMEOUT_MS")]
    pub node_call_timeout_ms: Option<u64>,
    /// Milliseconds a node agent has to attach a session before it is placed elsewhere.
    #[arg(long, env = "PLINTH_NODE_ATTACH_TIMEOUT_MS")]
    pub node_attach_timeout_ms: Option<u64>,
    /// Milliseconds a node stays suspect (no new sessions) unless the mark is renewed.
    #[arg(long, env = "PLINTH_NODE_SUSPECT_MS")]
    pub node_suspect_ms: Option<u64>,
}

/// `plinth serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where the embedded database and object store live.
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// REST address.
    #[arg(long, env = "PLINTH_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// The catalog's database; defaults to SQLite in --data-dir.
    #[arg(long, env = "PLINTH_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Most connections the catalog's database pool opens (`catalog.max_connections`).
    #[arg(long, env = "PLINTH_DATABASE_MAX_CONNECTIONS")]
    pub database_max_connections: Option<u32>,
    /// The in-process catalog's gRPC address; defaults to an ephemeral loopback port.
    #[arg(long, env = "PLINTH_CATALOG_LISTEN")]
    pub catalog_listen: Option<SocketAddr>,
    /// The in-process source service's gRPC address; defaults to an ephemeral loopback port.
    #[arg(long, env = "PLINTH_SOURCE_LISTEN")]
    pub source_listen: Option<SocketAddr>,
    /// The blob store: `file://…`, `s3://bucket/prefix?…`; defaults to files in --data-dir.
    #[arg(long, env = "PLINTH_BLOB_URL", hide_env_values = true)]
    pub blob_url: Option<String>,
    #[command(flatten)]
    pub git: GitArgs,
    #[command(flatten)]
    pub gc: GcArgs,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    /// Builders to run in this process (0: builds wait for `plinth builder` elsewhere).
    #[arg(long, env = "PLINTH_BUILDERS")]
    pub builders: Option<u32>,
    /// Whether installers may use the network (`true`/`false`).
    #[arg(long, env = "PLINTH_BUILDER_NETWORK")]
    pub builder_network: Option<bool>,
    /// Run sessions' commands without isolation (no root needed; the environment is then
    /// read-only only by file modes, and every session says so).
    #[arg(long, env = "PLINTH_INSECURE_NO_ISOLATION")]
    pub insecure_no_isolation: bool,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
}

/// `plinth catalog`.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where the default SQLite database lives.
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC address.
    #[arg(long, env = "PLINTH_CATALOG_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "PLINTH_CATALOG_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// `sqlite://…` or `postgres://…`; defaults to SQLite in --data-dir.
    #[arg(long, env = "PLINTH_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Most connections the database pool opens (`catalog.max_connections`): every replica
    /// opens up to this many, and all of them together must fit the database's own limit.
    #[arg(long, env = "PLINTH_DATABASE_MAX_CONNECTIONS")]
    pub database_max_connections: Option<u32>,
    #[command(flatten)]
    pub gc: GcArgs,
    /// Run alone on this machine's own files: allow the private SQLite file and local blob
    /// directory under --data-dir that a split service otherwise refuses to fall back to.
    #[arg(long, env = "PLINTH_STANDALONE")]
    pub standalone: bool,
    #[command(flatten)]
    pub liveness: LivenessArgs,
}

/// `plinth source`.
#[derive(Debug, Args)]
pub struct SourceArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where the default SQLite index, blob store and spool live.
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC address.
    #[arg(long, env = "PLINTH_SOURCE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "PLINTH_SOURCE_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// The index's database, `sqlite://…` or `postgres://…`; defaults to SQLite in --data-dir.
    #[arg(long, env = "PLINTH_SOURCE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Most connections the index's database pool opens (`source.max_connections`): every
    /// replica opens up to this many, and all of them together must fit the database's limit.
    #[arg(long, env = "PLINTH_SOURCE_DATABASE_MAX_CONNECTIONS")]
    pub database_max_connections: Option<u32>,
    /// The blob store: `file://…`, `s3://bucket/prefix?…`; defaults to files in --data-dir.
    #[arg(long, env = "PLINTH_BLOB_URL", hide_env_values = true)]
    pub blob_url: Option<String>,
    /// The catalog's gRPC URL, asked what it keeps when collecting garbage (with a `source`
    /// credential).
    #[arg(long, env = "PLINTH_CATALOG_URL")]
    pub catalog_url: Option<String>,
    #[command(flatten)]
    pub git: GitArgs,
    #[command(flatten)]
    pub gc: GcArgs,
    /// Run alone on this machine's own files: allow the private SQLite file and local blob
    /// directory under --data-dir that a split service otherwise refuses to fall back to.
    #[arg(long, env = "PLINTH_STANDALONE")]
    pub standalone: bool,
}

/// `plinth builder`.
#[derive(Debug, Args)]
pub struct BuilderArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where builds happen by default (`<data-dir>/builder`).
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The catalog's gRPC URL.
    #[arg(long, env = "PLINTH_CATALOG_URL")]
    pub catalog_url: Option<String>,
    /// The blob store the source service uses.
    #[arg(long, env = "PLINTH_BLOB_URL", hide_env_values = true)]
    pub blob_url: Option<String>,
    /// This builder's name, for operators.
    #[arg(long, env = "PLINTH_BUILDER_NAME")]
    pub name: Option<String>,
    /// Where its builds happen (`<data-dir>/builder`): each builder on a host needs its own.
    #[arg(long, env = "PLINTH_BUILDER_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// The first uid (and gid) its builds run as (slot i runs as uid + i): builders on one
    /// host need ranges that do not overlap, nor the host's nodes' session uids.
    #[arg(long, env = "PLINTH_BUILDER_UID")]
    pub uid: Option<u32>,
    /// The source service's gRPC URL, where built layers are counted in their scope's stored
    /// bytes (none: they are not counted).
    #[arg(long, env = "PLINTH_BUILDER_SOURCE_URL")]
    pub source_url: Option<String>,
    /// Run alone on this machine's own files: allow the private SQLite file and local blob
    /// directory under --data-dir that a split service otherwise refuses to fall back to.
    #[arg(long, env = "PLINTH_STANDALONE")]
    pub standalone: bool,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "PLINTH_BUILDER_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
}

/// How soon the catalog gives up on a silent node or builder: `serve` and `catalog` take these.
#[derive(Debug, Args)]
pub struct LivenessArgs {
    /// Milliseconds a node may go without a heartbeat before it gets no new sessions (nodes
    /// heartbeat three times in it).
    #[arg(long, env = "PLINTH_NODE_TTL_MS")]
    pub node_ttl_ms: Option<u64>,
    /// Seconds a builder's lease on a build lasts unless renewed (renewed every third of it);
    /// a crashed builder's build is taken over once it runs out.
    #[arg(long, env = "PLINTH_BUILD_LEASE_SECONDS")]
    pub build_lease_seconds: Option<u64>,
}

/// `plinth node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The node's state (`<data-dir>/node`: its version cache and sessions).
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC address.
    #[arg(long, env = "PLINTH_NODE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "PLINTH_NODE_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// The URL the gateway reaches this node at; `http://<listen>` by default.
    #[arg(long, env = "PLINTH_NODE_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// The catalog's gRPC URL.
    #[arg(long, env = "PLINTH_CATALOG_URL")]
    pub catalog_url: Option<String>,
    /// The blob store versions are in.
    #[arg(long, env = "PLINTH_BLOB_URL", hide_env_values = true)]
    pub blob_url: Option<String>,
    /// This node's name (one per host; the host name by default).
    #[arg(long, env = "PLINTH_NODE_NAME")]
    pub name: Option<String>,
    /// The first uid its sessions run as: nodes (and builders) sharing a host need ranges that
    /// do not overlap.
    #[arg(long, env = "PLINTH_NODE_SESSION_BASE_UID")]
    pub session_base_uid: Option<u32>,
    /// Sessions this node runs at once at most (0: no limit but its memory); the catalog
    /// places none past it.
    #[arg(long, env = "PLINTH_NODE_MAX_SESSIONS")]
    pub max_sessions: Option<u64>,
    /// MiB of the node's memory limit kept for the node itself: it offers sessions its
    /// cgroup's memory limit (or the host's memory) less this.
    #[arg(long, env = "PLINTH_NODE_MEMORY_RESERVE_MB")]
    pub memory_reserve_mb: Option<u64>,
    /// Do not run: tell the catalog that the node named by --name (this host's, by default)
    /// leaves on purpose, so it gets no new sessions and is not reported late, then exit. The
    /// node is back once it registers again (starts).
    #[arg(long)]
    pub drain: bool,
    /// Run sessions' commands without isolation (no root needed; the environment is then
    /// read-only only by file modes, and every session says so).
    #[arg(long, env = "PLINTH_INSECURE_NO_ISOLATION")]
    pub insecure_no_isolation: bool,
    /// Run alone on this machine's own files: allow the private SQLite file and local blob
    /// directory under --data-dir that a split service otherwise refuses to fall back to.
    #[arg(long, env = "PLINTH_STANDALONE")]
    pub standalone: bool,
}

/// `plinth gateway`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// REST address.
    #[arg(long, env = "PLINTH_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// The catalog's gRPC URL.
    #[arg(long, env = "PLINTH_CATALOG_URL")]
    pub catalog_url: Option<String>,
    /// The source service's gRPC URL.
    #[arg(long, env = "PLINTH_SOURCE_URL")]
    pub source_url: Option<String>,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
}

/// Garbage collection and retention: `serve`, `source`, `catalog` and `gc` take these.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Seconds between garbage collection passes and retention runs (0: only `plinth gc`).
    #[arg(long, env = "PLINTH_GC_INTERVAL_SECONDS")]
    pub gc_interval_seconds: Option<u64>,
    /// Seconds a blob nothing names is kept after it was last written.
    #[arg(long, env = "PLINTH_GC_GRACE_SECONDS")]
    pub gc_grace_seconds: Option<u64>,
    /// Seconds the holds of work in progress outlive their last renewal (a holder that died
    /// keeps its blobs this long).
    #[arg(long, env = "PLINTH_GC_HOLD_SECONDS")]
    pub gc_hold_seconds: Option<u64>,
    /// Ready versions kept per environment besides the active one and those sessions read.
    #[arg(long, env = "PLINTH_KEEP_VERSIONS")]
    pub keep_versions: Option<u32>,
    /// Days records of ended work are kept (sessions, turns, tasks, adapter runs,
    /// idempotency records, Brain operations, torn-down Brain bindings).
    #[arg(long, env = "PLINTH_RETENTION_DAYS")]
    pub retention_days: Option<u32>,
}

/// `plinth gc`.
#[derive(Debug, Args)]
pub struct GcCommandArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where the default SQLite databases and blob store live.
    #[arg(long, env = "PLINTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The catalog's database; defaults to SQLite in --data-dir.
    #[arg(long, env = "PLINTH_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The source index's database; defaults to SQLite in --data-dir.
    #[arg(long, env = "PLINTH_SOURCE_DATABASE_URL", hide_env_values = true)]
    pub source_database_url: Option<String>,
    /// The blob store; defaults to files in --data-dir.
    #[arg(long, env = "PLINTH_BLOB_URL", hide_env_values = true)]
    pub blob_url: Option<String>,
    #[command(flatten)]
    pub gc: GcArgs,
    /// Say what a pass would reclaim (objects and bytes) and change nothing: no blob removed,
    /// no version retired, no record deleted.
    #[arg(long)]
    pub dry_run: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(argv)
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        for argv in [
            &["plinth", "--config", "p.toml", "--log", "debug", "serve"][..],
            &[
                "plinth",
                "--dump-config",
                "serve",
                "--config",
                "p.toml",
                "--log",
                "debug",
            ],
            &["plinth", "serve", "--config", "p.toml", "--log", "debug"],
            &["plinth", "--config", "p.toml", "serve", "--log", "debug"],
        ] {
            let Command::Serve(args) = parse(argv).expect("parses").command else {
                panic!("not serve: {argv:?}");
            };
            assert_eq!(
                args.common.config,
                Some(PathBuf::from("p.toml")),
                "{argv:?}"
            );
            assert_eq!(args.common.log.as_deref(), Some("debug"), "{argv:?}");
        }
        for argv in [
            &["plinth", "-o", "json", "env", "list"][..],
            &["plinth", "env", "list", "--output", "json"],
            &["plinth", "env", "-o", "json", "list"],
        ] {
            let Command::Env(client::EnvCommand::List(output)) =
                parse(argv).expect("parses").command
            else {
                panic!("not env list: {argv:?}");
            };
            assert_eq!(output.output, client::OutputFormat::Json, "{argv:?}");
        }
        let cli = parse(&["plinth", "versions", "studio", "--url", "http://h:1"]).expect("parses");
        assert_eq!(cli.url.as_deref(), Some("http://h:1"));
        let Command::Login(login) = parse(&["plinth", "--url", "http://h:2", "login"])
            .expect("parses")
            .command
        else {
            panic!("not login");
        };
        assert_eq!(login.url.as_deref(), Some("http://h:2"));
    }

    #[test]
    fn a_global_flag_a_command_has_no_use_for_is_refused() {
        for argv in [
            &["plinth", "--config", "p.toml", "env", "list"][..],
            &["plinth", "serve", "--output", "json"],
            &["plinth", "env", "list", "--dump-config"],
            &["plinth", "--url", "http://h:1", "serve"],
            &["plinth", "completions", "bash", "-o", "json"],
            &["plinth", "--url", "http://h:1", "login", "http://h:2"],
        ] {
            let error = parse(argv).expect_err("refused");
            assert_eq!(error.kind(), ErrorKind::ArgumentConflict, "{argv:?}");
            assert!(error.to_string().contains("does not apply"), "{error}");
        }
    }

    #[test]
    fn build_takes_an_environment_or_the_logs_subcommand() {
        let Command::Build(build) = parse(&["plinth", "build", "studio", "-f"])
            .expect("parses")
            .command
        else {
            panic!("not build");
        };
        assert_eq!(build.env.as_deref(), Some("studio"));
        assert!(build.follow && build.command.is_none());
        let Command::Build(build) = parse(&["plinth", "build", "logs", "studio", "3", "--follow"])
            .expect("parses")
            .command
        else {
            panic!("not build");
        };
        let Some(client::BuildCommand::Logs(logs)) = build.command else {
            panic!("not build logs");
        };
        assert_eq!(
            (logs.env.as_str(), logs.version, logs.follow),
            ("studio", Some(3), true)
        );
        assert!(
            parse(&["plinth", "build"]).is_err(),
            "an environment is needed"
        );
    }
}
