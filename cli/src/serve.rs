//! The processes `plinth` runs: every service in one (`serve`), or one service each
//! (`catalog`, `gateway`). Services talk gRPC even inside one process: under `serve` a call
//! goes straight into the other service's gRPC stack (the same encoding, credential check,
//! spans and metrics) instead of over HTTP/2 on loopback, and each service still listens on its
//! port for callers elsewhere. Every process first locks the directories it keeps alone
//! ([`lock_state`]), and stops in order: builders first, giving their builds back, then the
//! rest ([`Running::wait`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use plinth_catalog::{CatalogOptions, LeasePolicy};
use plinth_gateway::{Backends, GatewayOptions};
use plinth_kit::admin::Listener as AdminListener;
use plinth_kit::grpc::{Internal, LocalSlot, Transport};
use plinth_kit::tasks::CancellationToken;
use plinth_source::{GitPolicy, SourceLimits, SourceOptions};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::config::Config;

/// A running set of services.
pub struct Running {
    /// Where REST is served (the gRPC address for `plinth catalog`).
    pub http_addr: SocketAddr,
    /// Where the catalog serves gRPC.
    pub catalog_addr: SocketAddr,
    /// Where the source service serves gRPC.
    pub source_addr: SocketAddr,
    /// Where the node agent serves gRPC, when this process runs one.
    pub node_addr: Option<SocketAddr>,
    /// Under `serve`: the credentials it made for its parts, for callers in this process.
    pub credentials: Option<crate::internal::ServeInternal>,
    /// Every address this process listens on, by the flag that sets it (`listen`,
    /// `admin_listen`, …), as bound: a port given as 0 is the one the system chose.
    pub bound: Vec<(&'static str, SocketAddr)>,
    /// Cancel to stop everything: builders first, then the rest ([`Running::wait`]).
    pub shutdown: CancellationToken,
    /// Builders, which stop first.
    builders: Services,
    services: Services,
    /// What stops `services`, once the builders have stopped (the same token as `shutdown`
    /// in a process without builders beside other services).
    rest: CancellationToken,
    /// The directories of state this process holds, released once every service stopped.
    _locks: Locks,
}

impl Running {
    /// Waits until every service has stopped. A service that fails, or stops while nothing
    /// asked it to, stops the others; the first such error is returned. Stopping goes in
    /// order: builders stop taking work and give their running builds back to the catalog
    /// (so another builder takes them at once), and only then do the catalog and the other
    /// services stop, their databases with them.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut first_error = None;
        loop {
            let joined = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                Some(joined) = self.builders.join_next() => joined,
                Some(joined) = self.services.join_next() => joined,
                else => break,
            };
            if let Some(error) = failure(joined, &self.shutdown) {
                first_error.get_or_insert(error);
                self.shutdown.cancel();
            }
        }
        self.shutdown.cancel();
        let builders = !self.builders.is_empty();
        while let Some(joined) = self.builders.join_next().await {
            if let Some(error) = failure(joined, &self.shutdown) {
                first_error.get_or_insert(error);
            }
        }
        if builders {
            tracing::info!("builders stopped; stopping the other services");
        }
        self.rest.cancel();
        while let Some(joined) = self.services.join_next().await {
            if let Some(error) = failure(joined, &self.shutdown) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// [`Running::bound`] as `--ready-file` writes it: one JSON object naming each address
    /// by its flag, e.g. `{"listen":"127.0.0.1:41234","admin_listen":"127.0.0.1:41235"}`.
    pub fn bound_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .bound
            .iter()
            .map(|(name, address)| ((*name).to_owned(), address.to_string().into()))
            .collect();
        format!("{}\n", serde_json::Value::Object(map))
    }

    /// Writes [`Running::bound_json`] to `path` whole: to a file beside it first, renamed over
    /// it, so a reader sees no file or all of it.
    pub fn write_ready_file(&self, path: &Path) -> anyhow::Result<()> {
        let mut name = path
            .file_name()
            .with_context(|| format!("--ready-file {} names no file", path.display()))?
            .to_owned();
        name.push(format!(".{}.tmp", std::process::id()));
        let temporary = path.with_file_name(name);
        std::fs::write(&temporary, self.bound_json())
            .and_then(|()| std::fs::rename(&temporary, path))
            .with_context(|| format!("cannot write the --ready-file {}", path.display()))
    }

    /// Stops everything and waits for it.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

impl Drop for Running {
    /// Dropped without being waited for: everything is told to stop (the tasks themselves
    /// end with their sets).
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.rest.cancel();
    }
}

/// What a service's end says: nothing when it stopped as asked.
fn failure(
    joined: Result<(&'static str, anyhow::Result<()>), tokio::task::JoinError>,
    shutdown: &CancellationToken,
) -> Option<anyhow::Error> {
    match joined {
        Ok((_, Ok(()))) if shutdown.is_cancelled() => None,
        Ok((name, Ok(()))) => Some(anyhow::anyhow!("{name} stopped unexpectedly")),
        Ok((name, Err(error))) => Some(error.context(format!("{name} stopped"))),
        Err(join) => Some(anyhow::anyhow!("a service panicked: {join}")),
    }
}

/// Starts every service in this process: the catalog and the source service on loopback gRPC
/// listeners, the gateway on `http`. The embedded databases and object store live under
/// `config.data_dir`.
pub async fn start_all(config: &Config, http: TcpListener) -> anyhow::Result<Running> {
    let locks = lock_state(config, "serve")?;
    locks.listening(http.local_addr()?);
    start_all_locked(config, http, locks).await
}

/// [`start_all`] for a process that holds its directories already ([`lock_state`]).
pub async fn start_all_locked(
    config: &Config,
    http: TcpListener,
    locks: Locks,
) -> anyhow::Result<Running> {
    raise_open_file_limit();
    let catalog_listener = bind(config.catalog.listen, "catalog").await?;
    let source_listener = bind(config.source.listen, "source service").await?;
    let shutdown = CancellationToken::new();
    let catalog_addr = catalog_listener.local_addr()?;
    let source_addr = source_listener.local_addr()?;
    let node_name = config
        .node
        .name
        .clone()
        .unwrap_or_else(|| "node".to_owned());
    let internal = config.internal.for_serve(&node_name)?;
    let scheme = scheme(config);
    let mut services = JoinSet::new();
    let mut peers = Peers {
        catalog: format!("{scheme}://{catalog_addr}"),
        source: format!("{scheme}://{source_addr}"),
        catalog_local: Some(LocalSlot::default()),
        source_local: Some(LocalSlot::default()),
        nodes: Vec::new(),
        local_ready: Vec::new(),
    };
    // Admin addresses given for the catalog or the source service are served here too. This
    // is one process, and its metrics cover every service in it: the gateway's `/metrics` has
    // them, each series once, and these ports' `/metrics` say so (a scrape of them succeeds
    // and adds nothing).
    let metrics_at = format!(
        "/metrics of the gateway's listen address ({})",
        http.local_addr()?
    );
    let mut bound = vec![
        ("listen", http.local_addr()?),
        ("catalog_listen", catalog_addr),
        ("source_listen", source_addr),
    ];
    let catalog_admin = match config.catalog.admin_listen {
        Some(address) => {
            let listener = bind(Some(address), "catalog admin endpoints").await?;
            bound.push(("catalog_admin_listen", listener.local_addr()?));
            Some(AdminListener::metrics_elsewhere(
                listener,
                metrics_at.clone(),
            ))
        }
        None => None,
    };
    let source_admin = match config.source.admin_listen {
        Some(address) => {
            let listener = bind(Some(address), "source service admin endpoints").await?;
            bound.push(("source_admin_listen", listener.local_addr()?));
            Some(AdminListener::metrics_elsewhere(listener, metrics_at))
        }
        None => None,
    };
    spawn_catalog(
        &mut services,
        config,
        &internal.services,
        catalog_listener,
        catalog_admin,
        peers.catalog_local.clone(),
        shutdown.clone(),
    )?;
    let collector = (
        peers.catalog(&internal.source)?,
        internal.source.interceptor("source")?,
    );
    spawn_source_with(
        &mut services,
        config,
        &internal.services,
        source_listener,
        source_admin,
        peers.source_local.clone(),
        Some(collector),
        shutdown.clone(),
    )?;
    let http_addr = http.local_addr()?;
    let mut node_addr = None;
    let node = if config.node.enabled {
        let listener = bind(config.node.listen, "node agent").await?;
        node_addr = Some(listener.local_addr()?);
        bound.push(("node_listen", listener.local_addr()?));
        let slot = LocalSlot::default();
        peers
            .nodes
            .push((node_url(config, listener.local_addr()?), slot.clone()));
        Some((listener, slot))
    } else {
        None
    };
    let serve_node = ServeNode::default();
    let node_ready = serve_node.ready.clone();
    if let Some((listener, slot)) = node {
        peers.local_ready.push(serve_node.readiness());
        spawn_node(
            &mut services,
            config,
            &internal.node,
            peers.catalog(&internal.node)?,
            listener,
            None,
            Some(slot),
            Some(serve_node),
            shutdown.clone(),
        )?;
        // Serve (the gateway starts below) once its node has registered (or said why it
        // cannot run): after a restart the catalog still names the node's old address until
        // then, and a session's call would be refused; the HTTP listener is bound, so clients
        // wait in its backlog meanwhile. A service that stops meanwhile (a catalog refusing its seal key,
        // say) stops the start at once, with its reason.
        tokio::select! {
            waited = tokio::time::timeout(NODE_READY_WAIT, node_ready.notified()) => {
                if waited.is_err() {
                    tracing::warn!(
                        "the node agent has not registered with the catalog yet; sessions may be refused until it has"
                    );
                }
            }
            Some(stopped) = services.join_next() => {
                shutdown.cancel();
                while services.join_next().await.is_some() {}
                return Err(match stopped {
                    Ok((name, Err(error))) => error.context(format!("{name} stopped")),
                    Ok((name, Ok(()))) => anyhow::anyhow!("{name} stopped unexpectedly"),
                    Err(join) => anyhow::anyhow!("a service panicked: {join}"),
                });
            }
        }
    }
    spawn_gateway(
        &mut services,
        config,
        &internal.gateway,
        http,
        &peers,
        shutdown.clone(),
    )?;
    // Builders stop first, when asked to (`Running::shutdown`), and give their builds back
    // while the catalog still serves; the other services stop after them (`shutdown` here).
    let stop = CancellationToken::new();
    let mut builders = JoinSet::new();
    for index in 0..config.builder.count {
        spawn_builder(
            &mut builders,
            config,
            &internal.builder,
            peers.catalog(&internal.builder)?,
            Some(peers.source(&internal.builder)?),
            index,
            stop.clone(),
        )?;
    }
    tracing::info!(%http_addr, %catalog_addr, %source_addr, builders = config.builder.count, data_dir = %config.data_dir.display(), "plinth serving");
    Ok(Running {
        http_addr,
        catalog_addr,
        source_addr,
        node_addr,
        credentials: Some(internal),
        bound,
        shutdown: stop,
        builders,
        services,
        rest: shutdown,
        _locks: locks,
    })
}

/// The directories of state a process holds for its life ([`lock_state`]).
#[derive(Debug, Default)]
pub struct Locks(Vec<plinth_kit::dir_lock::DirLock>);

impl Locks {
    /// Records where this process listens in each lock file, for whoever is refused.
    pub fn listening(&self, address: SocketAddr) {
        for lock in &self.0 {
            lock.listening(&address.to_string());
        }
    }
}

/// Takes, before anything else touches them, the directories of state `command` keeps for
/// itself alone: a SQLite database's directory (`catalog.lock`, `source.lock`; the data
/// directory unless configured elsewhere), the node's state directory (`node.lock`) and the
/// builders' work directory (`.lock`). `serve` takes every one it uses, so a second process on
/// the same data directory (another `serve`, or a split service) is refused at once, naming
/// the holder's pid and listen address, before it listens, registers a node or opens a
/// database. Databases on PostgreSQL and blobs in a bucket are shared by design and take no
/// lock; split services on one host each keep their own node and work directories.
pub fn lock_state(config: &Config, command: &str) -> anyhow::Result<Locks> {
    let serve = command == "serve";
    if serve {
        private_data_dir(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}; choose another with --data-dir or PLINTH_DATA_DIR",
                config.data_dir.display()
            )
        })?;
    }
    let mut locks = Locks::default();
    let mut take = |dir: &Path, file: &str| -> anyhow::Result<()> {
        let lock = plinth_kit::dir_lock::DirLock::acquire(dir, file, command, "--data-dir")?;
        locks.0.push(lock);
        Ok(())
    };
    if (serve || command == "catalog")
        && let Some(dir) = config.catalog.database_url.as_deref().and_then(sqlite_dir)
    {
        take(&dir, "catalog.lock")?;
    }
    if (serve || command == "source service")
        && let Some(dir) = config.source.database_url.as_deref().and_then(sqlite_dir)
    {
        take(&dir, "source.lock")?;
    }
    if (serve && config.node.enabled) || command == "node" {
        let state_dir = config
            .node
            .state_dir
            .clone()
            .context("node state directory is not resolved")?;
        take(&state_dir, "node.lock")?;
    }
    if (serve && config.builder.count > 0) || command == "builder" {
        let work_dir = config
            .builder
            .work_dir
            .clone()
            .context("builder work directory is not resolved")?;
        locks
            .0
            .push(plinth_builder::worker::lock_work_dir(&work_dir, command)?);
    }
    Ok(locks)
}

/// The directory of a SQLite database's file, for a `sqlite:` URL naming one.
fn sqlite_dir(url: &str) -> Option<PathBuf> {
    let path = sqlite_file(url)?;
    let parent = path.parent()?;
    Some(if parent.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        parent.to_owned()
    })
}

/// The file a `sqlite:` URL names (none for an in-memory database).
fn sqlite_file(url: &str) -> Option<&Path> {
    let rest = url.strip_prefix("sqlite:")?;
    let path = rest.trim_start_matches("//");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path.starts_with(':') {
        return None;
    }
    Some(Path::new(path))
}

async fn bind(address: Option<SocketAddr>, what: &str) -> anyhow::Result<TcpListener> {
    let address = address.with_context(|| format!("{what} listen address is not resolved"))?;
    TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen for the {what} on {address}"))
}

/// One gRPC service started alone: its listeners bound, and the credentials it accepts
/// required, so that nothing reaches it without proving its role.
async fn start_alone(
    config: &Config,
    name: &'static str,
    exposure: &str,
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
    spawn: SpawnService,
) -> anyhow::Result<Running> {
    let internal = config.internal.for_process(name, false, true)?;
    let locks = lock_state(config, name)?;
    let listener = bind(listen, name).await?;
    let address = listener.local_addr()?;
    locks.listening(address);
    tracing::info!(%address, "the {name} answers only the roles that may call it: {exposure}");
    let mut bound = vec![("listen", address)];
    let admin = match admin_listen {
        Some(address) => {
            let listener = bind(Some(address), &format!("{name} admin endpoints")).await?;
            bound.push(("admin_listen", listener.local_addr()?));
            Some(AdminListener::new(listener))
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    spawn(
        &mut services,
        config,
        &internal,
        listener,
        admin,
        None,
        shutdown.clone(),
    )?;
    Ok(Running {
        http_addr: address,
        catalog_addr: address,
        source_addr: address,
        node_addr: None,
        credentials: None,
        bound,
        shutdown: shutdown.clone(),
        builders: JoinSet::new(),
        services,
        rest: shutdown,
        _locks: locks,
    })
}

/// Starts the catalog alone.
pub async fn start_catalog(config: &Config) -> anyhow::Result<Running> {
    start_alone(
        config,
        "catalog",
        "the gateway acts for scopes, builders for their builds, nodes for themselves",
        config.catalog.listen,
        config.catalog.admin_listen,
        spawn_catalog,
    )
    .await
}

/// Starts the source service alone.
pub async fn start_source(config: &Config) -> anyhow::Result<Running> {
    start_alone(
        config,
        "source service",
        "the gateway only",
        config.source.listen,
        config.source.admin_listen,
        spawn_source,
    )
    .await
}

/// Starts one builder alone.
pub async fn start_builder(config: &Config) -> anyhow::Result<Running> {
    let internal = config.internal.for_process("builder", true, false)?;
    let locks = lock_state(config, "builder")?;
    let admin = match config.builder.admin_listen {
        Some(address) => Some(bind(Some(address), "builder admin endpoints").await?),
        None => None,
    };
    let mut bound = Vec::new();
    if let Some(admin) = &admin {
        locks.listening(admin.local_addr()?);
        bound.push(("admin_listen", admin.local_addr()?));
    }
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    let layers = config
        .builder
        .source_url
        .as_deref()
        .map(|url| transport(&internal, url, "source", None))
        .transpose()?;
    let catalog = Peers::remote(config).catalog(&internal)?;
    if admin.is_some() {
        plinth_kit::admin::spawn(
            admin,
            builder_readiness(config, catalog.clone())?,
            Some(internal.accepted.clone()),
            shutdown.clone(),
        );
    }
    spawn_builder(
        &mut services,
        config,
        &internal,
        catalog,
        layers,
        0,
        shutdown.clone(),
    )?;
    let unbound = SocketAddr::from(([0, 0, 0, 0], 0));
    Ok(Running {
        http_addr: unbound,
        catalog_addr: unbound,
        source_addr: unbound,
        node_addr: None,
        credentials: None,
        bound,
        shutdown: shutdown.clone(),
        builders: JoinSet::new(),
        services,
        rest: shutdown,
        _locks: locks,
    })
}

/// A builder is ready while at least one catalog replica serves (or it gets no builds and can
/// report none). Checked in the background ([`plinth_kit::admin::watch`]).
fn builder_readiness(
    config: &Config,
    catalog: Transport,
) -> anyhow::Result<plinth_kit::admin::ReadinessCheck> {
    let blob_url = config
        .source
        .blob_url
        .clone()
        .context("blob URL is not resolved")?;
    let spool = config
        .source
        .spool_dir
        .clone()
        .context("spool directory is not resolved")?;
    let blobs = plinth_blobs::BlobStore::open(&blob_url, spool).with_context(|| {
        format!(
            "cannot open the blob store {}",
            plinth_kit::config::redact_url(&blob_url)
        )
    })?;
    Ok(plinth_kit::admin::watch(std::sync::Arc::new(move || {
        let (catalog, blobs) = (catalog.clone(), blobs.clone());
        Box::pin(async move {
            let within = plinth_kit::admin::CHECK_WITHIN - std::time::Duration::from_millis(250);
            catalog
                .any_serving(plinth_catalog::SERVICE_NAME, within)
                .await
                .map_err(|reason| format!("no catalog serves: {reason}"))?;
            // The blob store is every builder's: its outage leaves them ready (they take no
            // traffic, and all of them not ready at once would only stall a rollout); `/readyz`
            // says so under its details, and a build that needs it fails saying why.
            plinth_kit::admin::describe(
                "blob store",
                match blobs.ping().await {
                    Ok(()) => "answers".to_owned(),
                    Err(error) => format!("does not answer ({error})"),
                },
            );
            Ok(())
        })
    })))
}

fn spawn_builder(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    catalog: Transport,
    source: Option<Transport>,
    index: u32,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    plinth_builder::worker::register_metrics();
    let section = &config.builder;
    let work_dir = section
        .work_dir
        .clone()
        .context("builder work directory is not resolved")?;
    // The process holds the work directory already ([`lock_state`]); once per work
    // directory, before any of its builders starts, what an earlier run left goes.
    if index == 0 {
        // Build cgroups a killed builder of this work directory left (with whatever runs in
        // them); a host without cgroups is the builders' own error, at their start.
        if let Ok(removed @ 1..) = plinth_builder::limits::remove_leftovers(&work_dir) {
            tracing::info!(removed, "removed build cgroups left by an earlier run");
        }
        match plinth_builder::worker::remove_leftovers(&work_dir) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(removed, "removed build scratch left by an earlier run")
            }
            Err(error) => {
                tracing::warn!(%error, work_dir = %work_dir.display(), "cannot remove build scratch left by an earlier run; check the work directory's permissions")
            }
        }
    }
    let blob_url = config
        .source
        .blob_url
        .clone()
        .context("blob URL is not resolved")?;
    let spool = config
        .source
        .spool_dir
        .clone()
        .unwrap_or_else(|| work_dir.join("spool"));
    let blobs = plinth_blobs::BlobStore::open(&blob_url, spool).with_context(|| {
        format!(
            "cannot open the blob store {}",
            plinth_kit::config::redact_url(&blob_url)
        )
    })?;
    let interceptor = internal.interceptor("builder")?;
    let layers = source.map(|source| {
        plinth_proto::source::v1::source_service_client::SourceServiceClient::with_interceptor(
            source,
            interceptor.clone(),
        )
    });
    let collection =
        plinth_proto::catalog::v1::collection_service_client::CollectionServiceClient::with_interceptor(
            catalog.clone(),
            interceptor.clone(),
        );
    let catalog =
        plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient::with_interceptor(
            catalog,
            interceptor,
        );
    let name = section.name.clone().unwrap_or_else(|| "builder".to_owned());
    let tools_dir = section.tools_dir.clone();
    let toolchain_dirs = section.toolchain_dirs.clone();
    let offline = if section.network {
        Vec::new()
    } else {
        [
            ("UV_OFFLINE", "1"),
            ("PIP_NO_INDEX", "1"),
            ("npm_config_offline", "true"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .to_vec()
    };
    let registries = config.registries();
    let install = plinth_builder::InstallOptions {
        network: builds_network(section, &registries, index == 0)?,
        extra_env: offline,
        // One uid per builder, so builds running at once (of different scopes) never share
        // one: their processes, files and process limits stay apart.
        uid: section.uid.saturating_add(index),
        gid: section.gid.saturating_add(index),
        step_timeout: std::time::Duration::from_secs(section.step_timeout_seconds.max(1)),
        limits: section.limits.build_limits(),
        hidden_paths: config.builder_hidden_paths(),
        cache_dir: None,
        ..plinth_builder::InstallOptions::default()
    };
    let options = plinth_builder::worker::BuilderOptions {
        name: if config.builder.count > 1 {
            format!("{name}-{index}")
        } else {
            name
        },
        work_dir,
        install,
        idle_poll: std::time::Duration::from_millis(500),
        toolchain: String::new(),
        layers,
        disk: None,
        disk_required: section.limits.disk_required(),
        kept_budget: section.kept_dependencies_mb.saturating_mul(1024 * 1024),
    };
    let result = async move {
        let result = async {
            let shown = tools_dir.display().to_string();
            let (prepared, registries) = tokio::task::spawn_blocking(move || {
                let prepared = plinth_builder::tools::prepare(&tools_dir);
                let registries = builds_registries(&tools_dir, prepared.is_ok(), registries)?;
                anyhow::Ok((prepared, registries))
            })
            .await??;
            tracing::info!(
                ca_bundle = ?registries.ca_bundle,
                https_proxy = registries.https_proxy.as_deref().map(plinth_kit::config::redact_url),
                python_index_url = registries.python_index_url.as_deref().map(plinth_kit::config::redact_url),
                npm_registry = registries.npm_registry.as_deref().map(plinth_kit::config::redact_url),
                "builds reach registries with these settings"
            );
            // A builder that cannot place uv still builds (pip instead of uv); one that
            // cannot sandbox says so in each build's error. Neither stops the other services.
            let path = prepared.unwrap_or_else(|error| {
                tracing::error!(tools_dir = %shown, %error, "cannot make uv reachable by builds; they will use pip (set builder.tools_dir to a directory root can write)");
                plinth_builder::tools::SYSTEM_PATH.to_owned()
            });
            let path = plinth_builder::tools::with_toolchain_dirs(&path, &toolchain_dirs);
            let mut options = options;
            let identity_path = path.clone();
            options.toolchain = tokio::task::spawn_blocking(move || {
                plinth_builder::tools::identity(&identity_path)
            })
            .await?;
            options.install.path = path;
            options.install.registries = registries;
            plinth_builder::worker::run(options, catalog, collection, blobs, shutdown).await?;
            anyhow::Ok(())
        }
        .await;
        ("builder", result)
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

/// The registry settings as builds see them: the certificate bundle replaced by a copy in
/// the tools directory, which the build user can read and the sandbox shows.
fn builds_registries(
    tools_dir: &std::path::Path,
    tools_ready: bool,
    mut registries: plinth_builder::Registries,
) -> anyhow::Result<plinth_builder::Registries> {
    let Some(bundle) = registries.ca_bundle.take() else {
        return Ok(registries);
    };
    anyhow::ensure!(
        tools_ready,
        "builds need the certificate bundle {} and it cannot be placed in builder.tools_dir {} \
         (see the error above)",
        bundle.display(),
        tools_dir.display()
    );
    registries.ca_bundle = Some(plinth_builder::tools::place_ca_bundle(tools_dir, &bundle)?);
    Ok(registries)
}

/// What builds reach: nothing (`builder.network = false`), or the package registries through
/// each build's egress proxy, which goes through the configured upstream proxy, if any
/// (`https_proxy`/`http_proxy`): builds never get the host's network.
fn builds_network(
    section: &crate::config::BuilderSection,
    registries: &plinth_builder::Registries,
    warn: bool,
) -> anyhow::Result<plinth_builder::BuildNetwork> {
    if !section.network {
        return Ok(plinth_builder::BuildNetwork::None);
    }
    if warn && (registries.https_proxy.is_some() || registries.http_proxy.is_some()) {
        tracing::info!(
            https_proxy = registries
                .https_proxy
                .as_deref()
                .map(plinth_kit::config::redact_url),
            http_proxy = registries
                .http_proxy
                .as_deref()
                .map(plinth_kit::config::redact_url),
            "builds' egress proxies reach what they let through by the configured upstream proxy"
        );
    }
    Ok(plinth_builder::BuildNetwork::Egress(std::sync::Arc::new(
        builds_egress_policy(registries, &section.egress_allow)?,
    )))
}

/// What builds may reach through their egress proxy: what sessions may (the internet, never
/// the host's loopback, private, link-local or metadata addresses, nor the node's own), plus
/// the package registries by name (PyPI, npm and the configured indexes, wherever the node's
/// resolver says they are) and `builder.egress_allow`.
pub fn builds_egress_policy(
    registries: &plinth_builder::Registries,
    allow: &[String],
) -> anyhow::Result<plinth_sandbox::egress::EgressPolicy> {
    let registries = registries
        .egress_allow()
        .map_err(|why| anyhow::anyhow!("builds' registries: {why}"))?;
    let entries: Vec<String> = registries
        .into_iter()
        .chain(allow.iter().cloned())
        .collect();
    egress_policy(&entries, "builder.egress_allow")
}

/// What sessions and builds may reach on the network: the internet, never the host's
/// loopback, private, link-local or metadata addresses, nor the node's own addresses, plus
/// what `allow` names (a private mirror; `key` is its configuration key, for the error).
pub fn egress_policy(
    allow: &[String],
    key: &str,
) -> anyhow::Result<plinth_sandbox::egress::EgressPolicy> {
    // The node's own addresses the range table would let through (a public address): its
    // services listen there too. Loopback and private ones are refused already, and stay
    // open to `allow` (a test's loopback server, a mirror on the private network).
    let table = plinth_sandbox::egress::EgressPolicy::default();
    let own: Vec<String> = plinth_sandbox::egress::node_addresses()
        .unwrap_or_default()
        .into_iter()
        .filter(|address| table.check(*address).is_ok())
        .map(|address| address.to_string())
        .collect();
    plinth_sandbox::egress::EgressPolicy::from_config(allow, &own).with_context(|| {
        format!(
            "{key}: entries are addresses, networks (CIDR) or host names, each with an optional :port"
        )
    })
}

/// How long `serve` waits for its node agent to register before it serves anyway.
const NODE_READY_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Starts this host's node agent alone.
pub async fn start_node(
    config: &Config,
    admin_listen: Option<SocketAddr>,
) -> anyhow::Result<Running> {
    let internal = config.internal.for_process("node agent", true, true)?;
    let locks = lock_state(config, "node")?;
    let listener = bind(config.node.listen, "node agent").await?;
    let address = listener.local_addr()?;
    locks.listening(address);
    let mut bound = vec![("listen", address)];
    let admin = match admin_listen {
        Some(address) => {
            let listener = bind(Some(address), "node admin endpoints").await?;
            bound.push(("admin_listen", listener.local_addr()?));
            Some(listener)
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    spawn_node(
        &mut services,
        config,
        &internal,
        Peers::remote(config).catalog(&internal)?,
        listener,
        admin,
        None,
        None,
        shutdown.clone(),
    )?;
    Ok(Running {
        http_addr: address,
        catalog_addr: address,
        source_addr: address,
        node_addr: Some(address),
        credentials: None,
        bound,
        shutdown: shutdown.clone(),
        builders: JoinSet::new(),
        services,
        rest: shutdown,
        _locks: locks,
    })
}

/// `plinth node --drain`: tells the catalog, with the node's own credential, that the node
/// named in `config` leaves on purpose, and says what that means for its sessions.
pub async fn drain_node(config: &Config) -> anyhow::Result<()> {
    let internal = config.internal.for_process("node agent", true, true)?;
    let name = config
        .node
        .name
        .clone()
        .context("the node's name is not resolved")?;
    let catalog = Peers::remote(config).catalog(&internal)?;
    let interceptor = internal.interceptor("node")?;
    let mut client =
        plinth_proto::catalog::v1::session_service_client::SessionServiceClient::with_interceptor(
            catalog,
            interceptor,
        );
    let answer = client
        .deregister_node(plinth_proto::catalog::v1::DeregisterNodeRequest { name: name.clone() })
        .await
        .map_err(|status| {
            anyhow::anyhow!(
                "the catalog at {} did not take node {name:?}'s leaving: {}",
                config.gateway.catalog_url,
                plinth_kit::PlinthError::from_status(&status).message
            )
        })?
        .into_inner();
    println!(
        "node {name:?} ({}) left on purpose: it gets no new sessions and is not reported late; \
         {} of its sessions are still active and end as sessions do. Starting it again brings it back.",
        answer.node_id, answer.active_sessions
    );
    Ok(())
}

/// What `serve` learns of its node agent: told once it registers (or cannot start), and when
/// the catalog last answered it, for the gateway's readiness.
#[derive(Clone, Default)]
struct ServeNode {
    ready: std::sync::Arc<tokio::sync::Notify>,
    contact: std::sync::Arc<plinth_node::CatalogContact>,
    /// The node cannot isolate sessions here, said so, and stays out of the way: the rest of
    /// the process is ready without it.
    cannot_run: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ServeNode {
    /// Ready once the node registered with the catalog at the address this process serves,
    /// while the catalog keeps answering it (or once it said why it cannot run here).
    fn readiness(&self) -> plinth_gateway::LocalReady {
        let node = self.clone();
        plinth_gateway::LocalReady(std::sync::Arc::new(move || {
            if node.cannot_run.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            node.contact
                .check()
                .map_err(|why| format!("the node agent in this process: {why}"))
        }))
    }
}

/// The node agent. Under `serve` (`tolerant`), a node that cannot isolate sessions logs why
/// and stays out of the way, so the other services keep running; alone, it fails.
#[allow(clippy::too_many_arguments)]
fn spawn_node(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    catalog: Transport,
    listener: TcpListener,
    admin: Option<TcpListener>,
    local: Option<LocalSlot>,
    // Under `serve`: what the process learns of its node (registered, or cannot start).
    serve_node: Option<ServeNode>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tolerant = serve_node.is_some();
    let serve_ready = serve_node.as_ref().map(|node| node.ready.clone());
    let section = &config.node;
    let state_dir = section
        .state_dir
        .clone()
        .context("node state directory is not resolved")?;
    std::fs::create_dir_all(&state_dir).with_context(|| {
        format!(
            "cannot create the node's state directory {}",
            state_dir.display()
        )
    })?;
    // Mounts need absolute paths.
    let state_dir = std::fs::canonicalize(&state_dir)?;
    let data_dir =
        std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
    let blob_url = config
        .source
        .blob_url
        .clone()
        .context("blob URL is not resolved")?;
    let address = listener.local_addr()?;
    let options = plinth_node::NodeOptions {
        name: section.name.clone().unwrap_or_else(|| "node".to_owned()),
        advertise_url: node_url(config, address),
        isolation: plinth_node::Isolation {
            enabled: !section.insecure_no_isolation,
            // Sessions see neither Plinth's data (databases, blobs, builds), the node's state
            // (the cache, other sessions), the configuration file nor the seal key, wherever
            // they are.
            hidden: [data_dir, state_dir.clone()]
                .into_iter()
                .chain(config.source_file.clone())
                .chain(config.catalog.seal_key_file.clone())
                .collect(),
            cgroups: None,
            shares: Default::default(),
            // For sessions whose record carries no limits (made before limits existed).
            limits: plinth_sandbox::cgroup::Limits {
                memory_bytes: Some(config.sessions.memory_mb.saturating_mul(1024 * 1024)),
                pids: Some(config.sessions.pids),
                cpu_millicores: Some((config.sessions.cpu * 1000.0).round() as u64),
            },
            egress: match section.network {
                crate::config::SessionNetwork::None => None,
                crate::config::SessionNetwork::Egress => Some(std::sync::Arc::new(egress_policy(
                    &section.egress_allow,
                    "node.egress_allow",
                )?)),
            },
            seccomp: None,
            networks: None,
            tools: None,
            etc: None,
        },
        state_dir,
        blob_url,
        cache_cap_bytes: section.cache_max_bytes,
        lazy_versions: section.lazy_versions,
        fetch_concurrency: section.fetch_concurrency,
        fetch_timeout: std::time::Duration::from_millis(section.fetch_timeout_ms.max(1)),
        prewarm: section.prewarm.clone(),
        disk_required: config.sessions.disk_mb,
        base_uid: section.session_base_uid,
        max_sessions: section.max_sessions,
        memory_reserve_mb: section.memory_reserve_mb,
        limits: plinth_node::ExecLimits {
            default_timeout: std::time::Duration::from_secs(section.exec_timeout_seconds.max(1)),
            max_timeout: std::time::Duration::from_secs(
                section
                    .exec_max_timeout_seconds
                    .max(section.exec_timeout_seconds)
                    .max(1),
            ),
            default_output_bytes: 1024 * 1024,
            max_output_bytes: 16 * 1024 * 1024,
            max_file_bytes: 64 * 1024 * 1024,
            workspace_snapshot_max_bytes: section.workspace_snapshot_max_bytes,
        },
        internal: internal.clone(),
        local,
        registered: serve_ready.clone(),
        contact: serve_node.as_ref().map(|node| node.contact.clone()),
    };
    let result = async move {
        let result = match plinth_node::run(options, catalog, listener, admin, shutdown.clone())
            .await
        {
            Err(plinth_node::NodeError::NotPermitted(why)) if tolerant => {
                tracing::error!(reason = %why, "the node agent cannot start, so sessions cannot run here");
                if let Some(node) = &serve_node {
                    node.cannot_run
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    node.ready.notify_one();
                }
                shutdown.cancelled().await;
                Ok(())
            }
            other => other.map_err(anyhow::Error::from),
        };
        // A node that stopped (failed) is not waited for either.
        if let Some(ready) = &serve_ready {
            ready.notify_one();
        }
        ("node", result)
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

/// Starts the gateway alone.
pub async fn start_gateway(config: &Config) -> anyhow::Result<Running> {
    raise_open_file_limit();
    let listen = config.gateway.listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let internal = config.internal.for_process("gateway", true, false)?;
    let shutdown = CancellationToken::new();
    let http_addr = listener.local_addr()?;
    let mut services = JoinSet::new();
    spawn_gateway(
        &mut services,
        config,
        &internal,
        listener,
        &Peers::remote(config),
        shutdown.clone(),
    )?;
    Ok(Running {
        http_addr,
        catalog_addr: http_addr,
        source_addr: http_addr,
        node_addr: None,
        credentials: None,
        bound: vec![("listen", http_addr)],
        shutdown: shutdown.clone(),
        builders: JoinSet::new(),
        services,
        rest: shutdown,
        _locks: Locks::default(),
    })
}

type Services = JoinSet<(&'static str, anyhow::Result<()>)>;

/// Starts one gRPC service into `Services`: its listener, its admin listener, the slot through
/// which this process calls it directly, and what stops it.
type SpawnService = fn(
    &mut Services,
    &Config,
    &Internal,
    TcpListener,
    Option<AdminListener>,
    Option<LocalSlot>,
    CancellationToken,
) -> anyhow::Result<()>;

fn spawn_catalog(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    listener: TcpListener,
    admin: Option<AdminListener>,
    local: Option<LocalSlot>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if let Some(url) = &config.catalog.database_url
        && url.starts_with("sqlite:")
    {
        private_data_dir(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}",
                config.data_dir.display()
            )
        })?;
        private_sqlite_file(url)?;
    }
    let leases = LeasePolicy {
        lease_ms: i64::try_from(config.catalog.build_lease_seconds.max(1))
            .unwrap_or(i64::MAX / 2_000)
            .saturating_mul(1000),
        max_attempts: config.catalog.build_max_attempts.max(1),
        running_per_scope: config.catalog.build_running_per_scope.max(1),
    };
    let node_ttl = plinth_catalog::NodeTtl::from_ms(
        i64::try_from(config.catalog.node_ttl_ms).unwrap_or(i64::MAX),
    );
    let seal_key = seal_key(config)?;
    let options = CatalogOptions {
        leases,
        node_ttl,
        database_url: config
            .catalog
            .database_url
            .clone()
            .context("database URL is not resolved")?,
        max_connections: config.catalog.max_connections,
        internal: internal.clone(),
        adapter_credential_grace: std::time::Duration::from_secs(
            config.catalog.adapter_credential_grace_seconds,
        ),
        local,
        seal_key,
        quotas: config.quotas.quotas()?,
        retention: config.retention(),
        retention_every: config.gc_every(),
        prewarm_versions: config.catalog.prewarm_versions,
    };
    let result = async move {
        let result = plinth_catalog::run(options, listener, admin, shutdown).await;
        ("catalog", result.map_err(anyhow::Error::from))
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

/// The key the catalog seals adapter credentials with: `PLINTH_SEAL_KEY`, else the key file
/// (`plinth serve`'s own is made at its first start), else a refusal that says how to make one.
fn seal_key(config: &Config) -> anyhow::Result<plinth_catalog::SealKey> {
    use plinth_catalog::SealKey;
    let section = &config.catalog;
    if let Some(key) = &section.seal_key {
        return SealKey::from_base64(key.expose())
            .context("PLINTH_SEAL_KEY holds no usable seal key");
    }
    let Some(path) = &section.seal_key_file else {
        anyhow::bail!(
            "the catalog needs a key to seal workspace adapters' credentials in its database, and none is configured: {}",
            plinth_catalog::seal::MAKE_A_KEY
        );
    };
    let (key, made) = if section.make_seal_key_file {
        SealKey::read_or_create_file(path)?
    } else {
        (SealKey::read_file(path)?, false)
    };
    if made {
        tracing::info!(path = %path.display(), seal_key = key.id(), "made a seal key for adapter credentials: back it up, but never beside the database's own backups");
    }
    let mode = std::fs::metadata(path).map_or(0, |meta| {
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
    });
    if mode & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "the seal key file can be read by other users: chmod 600 it");
    }
    Ok(key)
}

/// Where services find the catalog and the source service (and, under `serve`, the node):
/// their URLs, and the slots through which those in this process are called directly.
struct Peers {
    catalog: String,
    source: String,
    catalog_local: Option<LocalSlot>,
    source_local: Option<LocalSlot>,
    /// Node agents in this process, by the URL they register.
    nodes: Vec<(String, LocalSlot)>,
    /// What the gateway in this process is ready only with (its node agent registered).
    local_ready: Vec<plinth_gateway::LocalReady>,
}

impl Peers {
    /// The configured URLs, nothing in this process.
    fn remote(config: &Config) -> Self {
        Peers {
            catalog: config.gateway.catalog_url.clone(),
            source: config.gateway.source_url.clone(),
            catalog_local: None,
            source_local: None,
            nodes: Vec::new(),
            local_ready: Vec::new(),
        }
    }

    fn catalog(&self, internal: &Internal) -> anyhow::Result<Transport> {
        transport(
            internal,
            &self.catalog,
            "catalog",
            self.catalog_local.as_ref(),
        )
    }

    fn source(&self, internal: &Internal) -> anyhow::Result<Transport> {
        transport(internal, &self.source, "source", self.source_local.as_ref())
    }
}

fn transport(
    internal: &Internal,
    url: &str,
    name: &str,
    local: Option<&LocalSlot>,
) -> anyhow::Result<Transport> {
    let channel = channel(internal, url, name)?;
    Ok(match local {
        Some(slot) => Transport::in_process(channel, slot.clone()),
        None => Transport::remote(channel),
    })
}

/// The URL a node registers, so the gateway can reach it.
fn node_url(config: &Config, address: SocketAddr) -> String {
    config
        .node
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{}://{address}", scheme(config)))
}

/// `https` when the services serve TLS, `http` otherwise.
fn scheme(config: &Config) -> &'static str {
    if config.internal.serves_tls() {
        "https"
    } else {
        "http"
    }
}

fn channel(
    internal: &Internal,
    url: &str,
    name: &str,
) -> anyhow::Result<plinth_kit::grpc::Replicas> {
    internal
        .connect(url)
        .with_context(|| format!("{name} URL {url:?} cannot be used"))
}

/// The source service alone: it collects garbage when it has a credential to ask the catalog
/// (at `gateway.catalog_url`, `--catalog-url`) what it keeps.
fn spawn_source(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    listener: TcpListener,
    admin: Option<AdminListener>,
    local: Option<LocalSlot>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let collector = if internal.credential.is_some() {
        Some((
            Peers::remote(config).catalog(internal)?,
            internal.interceptor("source")?,
        ))
    } else {
        if config.gc_every().is_some() {
            tracing::warn!(
                fix = "give it a credential of role `source` (PLINTH_INTERNAL_CREDENTIAL, `plinth credential new --role source`), or run `plinth gc`",
                "garbage collection is off in this source service: it has no credential to ask the catalog what it keeps"
            );
        }
        None
    };
    spawn_source_with(
        services, config, internal, listener, admin, local, collector, shutdown,
    )
}

#[allow(clippy::too_many_arguments)]
fn spawn_source_with(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    listener: TcpListener,
    admin: Option<AdminListener>,
    local: Option<LocalSlot>,
    collector: Option<(Transport, plinth_kit::grpc::ClientInterceptor)>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let section = &config.source;
    let collector = match (collector, config.gc_every()) {
        (Some((catalog, interceptor)), Some(every)) => Some(plinth_source::Collector {
            catalog: std::sync::Arc::new(plinth_source::gc::GrpcCatalog::new(catalog, interceptor)),
            every,
        }),
        _ => None,
    };
    let options = SourceOptions {
        database_url: section
            .database_url
            .clone()
            .context("source database URL is not resolved")?,
        max_connections: section.max_connections,
        blob_url: section
            .blob_url
            .clone()
            .context("blob URL is not resolved")?,
        spool_dir: section
            .spool_dir
            .clone()
            .context("spool directory is not resolved")?,
        limits: SourceLimits {
            max_file_bytes: section.max_file_bytes,
            max_import_bytes: section.max_import_bytes,
            max_import_entries: section.max_import_entries,
        },
        git: GitPolicy {
            allowed_schemes: section.git_allowed_schemes.clone(),
            allow_private_addresses: section.git_allow_private_addresses,
            max_fetch_bytes: section.git_max_fetch_bytes,
            fetch_timeout: std::time::Duration::from_secs(section.git_fetch_timeout_seconds.max(1)),
            ..GitPolicy::default()
        },
        internal: internal.clone(),
        local,
        quotas: config.quotas.quotas()?,
        collection: config.gc_options(),
        collector,
    };
    if options.database_url.starts_with("sqlite:") || options.blob_url.starts_with("file:") {
        private_data_dir(&config.data_dir).with_context(|| {
            format!(
                "cannot create the data directory {}",
                config.data_dir.display()
            )
        })?;
        private_sqlite_file(&options.database_url)?;
    }
    let result = async move {
        let result = plinth_source::run(options, listener, admin, shutdown).await;
        ("source", result.map_err(anyhow::Error::from))
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

/// Makes the data directory (and any parent it makes) `0700`, so that no other local user
/// reaches the databases, blobs, keys and sessions' files beneath it, whatever their own
/// modes. An existing directory this user owns is narrowed to `0700` too; one it does not own,
/// or a shared sticky directory (`/tmp`), is left as it is, with a warning.
pub fn private_data_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let ours = meta.uid() == rustix::process::geteuid().as_raw();
    let shared = mode & 0o1000 != 0 || dir.parent().is_none();
    if ours && !shared {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        tracing::info!(path = %dir.display(), was = format!("{mode:o}"), "the data directory was readable by other users; it is 0700 now");
    } else {
        tracing::warn!(path = %dir.display(), mode = format!("{mode:o}"), "the data directory can be read by other users and is not this user's own to narrow: choose a private one (--data-dir)");
    }
    Ok(())
}

/// Makes a SQLite database file `0600` before SQLite opens it (SQLite gives its `-wal` and
/// `-shm` files the database's mode), or narrows an existing one and its companions.
fn private_sqlite_file(url: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let Some(path) = sqlite_file(url) else {
        return Ok(());
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => return Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(error).with_context(|| format!("cannot create {}", path.display()));
        }
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot make {} private", file.display()))?;
        }
    }
    Ok(())
}

/// Raises this process's soft limit on open files to its hard limit, so that connections,
/// databases, blobs and sessions have every descriptor the host grants (a soft limit of 1024
/// is common; the hard limit is usually far higher). Answers the limit now in force (`None`:
/// none). A failure leaves the limit as it was, and says so.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => return limit.maximum,
            Err(error) => {
                tracing::warn!(%error, soft = ?limit.current, hard = ?limit.maximum, "cannot raise the open-file limit to its hard limit");
            }
        }
    }
    limit.current
}

fn spawn_gateway(
    services: &mut Services,
    config: &Config,
    internal: &Internal,
    listener: TcpListener,
    peers: &Peers,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let backends = Backends {
        catalog: peers.catalog(internal)?,
        source: peers.source(internal)?,
        local_nodes: peers
            .nodes
            .iter()
            .map(|(url, slot)| Ok((url.clone(), transport(internal, url, "node", Some(slot))?)))
            .collect::<anyhow::Result<_>>()?,
        local_ready: peers.local_ready.clone(),
    };
    let options = GatewayOptions {
        environments: config.gateway.environments,
        tokens: config.token_scopes(),
        internal: internal.clone(),
        public_url: config.gateway.public_url.clone(),
        adapter_run_idle: std::time::Duration::from_secs(config.gateway.adapter_run_idle_seconds),
        command_inline_bytes: config.gateway.adapter_command_inline_bytes,
        brain_operation_lease: std::time::Duration::from_secs(
            config.gateway.brain_operation_lease_seconds.max(1),
        ),
        session_limits: config.sessions.policy()?,
        edge: config.gateway.edge_limits()?,
        novo_call_lease: std::time::Duration::from_secs(
            config.gateway.novo_call_lease_seconds.max(1),
        ),
        adapter_rate: config.gateway.adapter_rate()?,
        novo_replay_memory: config.gateway.novo_replay_memory_per_adapter,
        callback_allow: config.gateway.callback_allow()?,
        allowed_hosts: config.gateway.allowed_hosts.clone(),
        allowed_origins: config.gateway.allowed_origins.clone(),
        connections: config.gateway.connection_limits(
            rustix::process::getrlimit(rustix::process::Resource::Nofile).current,
        ),
        node_calls: config.gateway.node_call_limits()?,
    };
    let result = async move {
        let result = plinth_gateway::run(options, listener, backends, shutdown).await;
        ("gateway", result.map_err(anyhow::Error::from))
    };
    services.spawn(result.instrument(tracing::Span::current()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plinth_sandbox::egress::Host;

    fn can(policy: &plinth_sandbox::egress::EgressPolicy, host: &str, addr: &str) -> bool {
        let host = Host::parse(host).expect("a host");
        policy
            .permit(&host, addr.parse().expect("an address"))
            .is_ok()
    }

    #[test]
    fn builds_reach_the_registries_by_name_and_what_egress_allow_adds_nothing_else() {
        let registries = plinth_builder::Registries {
            python_index_url: Some("https://mirror.internal:8443/simple".to_owned()),
            ..plinth_builder::Registries::default()
        };
        let policy = builds_egress_policy(&registries, &["downloads.example:443".to_owned()])
            .expect("policy");
        // By name, wherever the resolver says they are (a documentation address here).
        assert!(can(&policy, "pypi.org", "203.0.113.80:443"));
        assert!(can(&policy, "files.pythonhosted.org", "203.0.113.80:443"));
        assert!(can(&policy, "registry.npmjs.org", "203.0.113.80:443"));
        assert!(can(&policy, "mirror.internal", "10.0.0.5:8443"));
        assert!(can(&policy, "downloads.example", "192.168.1.1:443"));
        // Not on another port, not another name, not the node's loopback.
        assert!(!can(&policy, "pypi.org", "203.0.113.80:22"));
        assert!(!can(&policy, "mirror.internal", "10.0.0.5:22"));
        assert!(!can(&policy, "evil.example", "203.0.113.80:443"));
        assert!(!can(&policy, "localhost", "127.0.0.1:443"));
        assert!(!can(&policy, "169.254.169.254", "169.254.169.254:80"));

        let error =
            builds_egress_policy(&registries, &["not a host".to_owned()]).expect_err("a bad entry");
        assert!(
            format!("{error:#}").contains("builder.egress_allow"),
            "{error:#}"
        );
    }

    #[test]
    fn builds_get_no_network_or_the_egress_proxy_also_behind_an_upstream_proxy() {
        let mut section = crate::config::BuilderSection::default();
        let registries = plinth_builder::Registries::default();
        assert!(matches!(
            builds_network(&section, &registries, false).expect("network"),
            plinth_builder::BuildNetwork::Egress(_)
        ));
        let behind = plinth_builder::Registries {
            https_proxy: Some("http://proxy.internal:3128".to_owned()),
            ..plinth_builder::Registries::default()
        };
        assert!(matches!(
            builds_network(&section, &behind, false).expect("network"),
            plinth_builder::BuildNetwork::Egress(_)
        ));
        section.network = false;
        assert!(matches!(
            builds_network(&section, &behind, false).expect("network"),
            plinth_builder::BuildNetwork::None
        ));
    }
}
