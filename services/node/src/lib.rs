//! plinth-node: the node agent, one per host, serving `plinth.node.v1` (`grpc`, and `pty` for
//! terminals). It materializes versions from the blob store into a local cache (`cache`), keeps
//! the sessions placed on it and their private working directories (`sessions`, `workdir`), and
//! runs each session's commands and workspace calls (`workspace`) in the session's sandbox
//! (`isolation`, `session_sandbox`, `spawn`), where the version is read-only at `/env/<slug>`.
//! It registers with the catalog and heartbeats (`heartbeat`); each heartbeat's answer lists the
//! node's live sessions, so a session the catalog ended without telling the node is detached
//! here within a heartbeat.
//!
//! What does not belong here: placing sessions or pinning versions (the catalog), HTTP shapes
//! and turn records (the gateway and the catalog), building versions (the builder).

pub mod cache;
mod grpc;
pub mod heartbeat;
pub mod identity;
pub mod isolation;
pub mod lazy;
mod node;
pub mod prewarm;
mod pty;
pub mod session_sandbox;
pub mod sessions;
pub mod shares;
pub mod spawn;
pub mod toolchains;
pub mod workdir;
pub mod workspace;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plinth_blobs::BlobStore;
use plinth_kit::admin::{self, ReadinessCheck};
use plinth_kit::auth::{Access, Role};
use plinth_kit::grpc::{ClientInterceptor, Internal, Transport};
use plinth_kit::tasks::CancellationToken;
use plinth_proto::catalog::v1 as catalog_pb;
use plinth_proto::catalog::v1::session_service_client::SessionServiceClient;
use plinth_proto::node::v1::node_service_server::NodeServiceServer;
use plinth_proto::node::v1::workspace_service_server::WorkspaceServiceServer;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tracing::Instrument as _;

pub use cache::VersionCache;
pub use isolation::Isolation;
pub use node::ExecLimits;
pub use sessions::SessionTable;

/// The node's gRPC service name, as health checks name it.
pub const SERVICE_NAME: &str = "plinth.node.v1.NodeService";

/// How a node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Unique per host; a restarted node with the same name is the same node.
    pub name: String,
    /// Where the gateway reaches this node's gRPC service.
    pub advertise_url: String,
    /// The node's state: its version cache and its sessions.
    pub state_dir: PathBuf,
    /// Where versions' blobs are.
    pub blob_url: String,
    /// Isolation of commands (disabled only by `--insecure-no-isolation`).
    pub isolation: Isolation,
    /// Blob bytes the cache may hold before it evicts versions no session uses.
    pub cache_cap_bytes: u64,
    /// The first uid given to sessions (each session has its own).
    pub base_uid: u32,
    /// Limits of commands and file calls.
    pub limits: ExecLimits,
    /// Its own credential (sent to the catalog), who may call it (the gateway), and TLS.
    pub internal: Internal,
    /// Where callers in this process reach the node directly, when they run beside it.
    pub local: Option<plinth_kit::grpc::LocalSlot>,
    /// Told once the node has registered with the catalog (and every time it registers
    /// again): `plinth serve` waits for it before it serves.
    pub registered: Option<Arc<tokio::sync::Notify>>,
    /// When the catalog last answered the node, shared with the process it runs in
    /// (`plinth serve` is ready only while its node is registered and heard); the node makes
    /// its own when `None`.
    pub contact: Option<Arc<CatalogContact>>,
    /// Sessions it runs at once at most (`node.max_sessions`); 0: no limit.
    pub max_sessions: u64,
    /// MiB of its memory limit it keeps for itself (`node.memory_reserve_mb`): what it offers
    /// sessions is its cgroup's memory limit (or the host's memory) less this.
    pub memory_reserve_mb: u64,
    /// The default disk limit sessions get, in MiB: when set, a node that cannot limit
    /// working directories refuses to start; when not, it starts and refuses only the
    /// sessions that ask for one. Spare session directories are made with an image of it.
    pub disk_required: Option<u64>,
    /// Shows sessions a version this node has not fetched at once, each file fetched on first
    /// open, while the whole version is fetched behind it (`node.lazy_versions`; isolated
    /// nodes where `/dev/fuse` opens). Off: a session's first command waits for the whole
    /// version.
    pub lazy_versions: bool,
    /// Blobs fetched at once for materializations and pre-warm, and as many again for
    /// sessions waiting on a file (`node.fetch_concurrency`).
    pub fetch_concurrency: usize,
    /// How long a session's open of a file not yet fetched waits before it fails with `EIO`
    /// (`node.fetch_timeout_ms`).
    pub fetch_timeout: Duration,
    /// Which environments' active versions the node fetches when they are activated, before
    /// any session asks (`node.prewarm`): `*` every one the catalog lists, or ids and slugs;
    /// empty: none.
    pub prewarm: Vec<String>,
}

/// What a node offers sessions, as it tells the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Sessions at once; 0: no limit.
    pub max_sessions: u64,
    /// MiB of memory for sessions; never 0 (which the wire reads as "no limit").
    pub memory_mb: u64,
}

impl Capacity {
    /// This process's: the least memory limit of its cgroups (v2 `memory.max`, v1
    /// `memory.limit_in_bytes`), the host's memory when none is limited, less
    /// `memory_reserve_mb`; and `max_sessions` as given.
    pub fn measure(max_sessions: u64, memory_reserve_mb: u64) -> Self {
        let host = plinth_sandbox::cgroup::host_memory();
        let cgroup = plinth_sandbox::cgroup::memory_limit();
        let bytes = match (cgroup, host) {
            (Some(cgroup), Some(host)) => cgroup.min(host),
            (one, other) => one.or(other).unwrap_or(0),
        };
        let total_mb = bytes / (1024 * 1024);
        let memory_mb = total_mb.saturating_sub(memory_reserve_mb);
        if memory_mb == 0 {
            tracing::warn!(
                memory_limit_mb = total_mb,
                memory_reserve_mb,
                "node.memory_reserve_mb leaves no memory for sessions: this node takes only sessions without a memory limit; lower node.memory_reserve_mb or raise the node's memory limit"
            );
        }
        Capacity {
            max_sessions,
            memory_mb: memory_mb.max(1),
        }
    }
}

/// Why the node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// It cannot isolate sessions and was not told to run without.
    #[error("{0}")]
    NotPermitted(String),
    /// The cache could not be opened.
    #[error("opening the version cache: {0}")]
    Cache(#[from] cache::CacheError),
    /// The session table could not be loaded.
    #[error("loading the sessions: {0}")]
    Sessions(#[from] sessions::SessionError),
    /// The blob store URL is wrong.
    #[error("opening the blob store: {0}")]
    Blobs(String),
    /// The token is not a valid header value.
    #[error("the internal token cannot be sent: {0}")]
    Token(String),
    /// The thread that makes sessions' mount namespaces could not start.
    #[error("starting the namespace thread: {0}")]
    Namespaces(std::io::Error),
    /// The gRPC server failed.
    #[error("node gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// Which roles may call the node: the gateway, which places sessions and acts for their
/// scopes.
pub const ACCESS: Access = Access(&[
    ("/plinth.node.v1.NodeService/", &[Role::Gateway]),
    ("/plinth.node.v1.WorkspaceService/", &[Role::Gateway]),
]);

type Catalog = SessionServiceClient<InterceptedService<Transport, ClientInterceptor>>;

/// Checks isolation, opens the cache and the sessions on disk, registers with the catalog
/// (on `catalog`), and serves gRPC on `grpc` until `shutdown`.
pub async fn run(
    options: NodeOptions,
    catalog: Transport,
    grpc: TcpListener,
    admin: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    options
        .isolation
        .check()
        .map_err(|error| NodeError::NotPermitted(error.to_string()))?;
    // Every series the dashboards show exists from the start, at zero.
    plinth_kit::telemetry::metrics();
    for result in ["hit", "miss"] {
        metrics::counter!("plinth_node_cache_lookups_total", "result" => result).increment(0);
    }
    let _ = metrics::histogram!("plinth_node_attach_duration_seconds");
    for outcome in ["fetched", "failed"] {
        metrics::counter!("plinth_node_lazy_fetches_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["read", "none", "failed"] {
        metrics::counter!("plinth_node_packs_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("plinth_node_pack_blobs_total").increment(0);
    metrics::counter!("plinth_node_packs_written_total").increment(0);
    for outcome in ["fetched", "failed", "no_room"] {
        metrics::counter!("plinth_node_prewarm_versions_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("plinth_node_prewarm_blobs_total").increment(0);
    metrics::gauge!("plinth_node_prewarm_listed").set(0.0);
    metrics::gauge!("plinth_node_lazy_mounts").set(0.0);
    let _ = metrics::histogram!("plinth_node_lazy_fetch_seconds");
    let mut options = options;
    if options.isolation.enabled {
        sandbox_setup(&mut options)?;
    }
    let tools = options.state_dir.join("tools");
    options.isolation.tools = tokio::task::spawn_blocking(move || place_tools(&tools))
        .await
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "placing uv for sessions stopped; they have no uv");
            None
        });
    if !options.isolation.enabled {
        tracing::warn!(
            "running with --insecure-no-isolation: session commands share this node's user and file system, and nothing but file modes keeps them out of the environment; every session says so"
        );
    }
    let blobs = BlobStore::open(&options.blob_url, options.state_dir.join("spool"))
        .map_err(|error| NodeError::Blobs(error.to_string()))?;
    plinth_kit::storage::watch(
        plinth_kit::error::Store::NodeCache,
        options.state_dir.clone(),
    );
    let probe = blobs.clone();
    let cache = {
        let (dir, cap) = (options.state_dir.join("cache"), options.cache_cap_bytes);
        // Versions may be layers over cached ones where sessions see them through the mounts
        // the node makes; without isolation they are linked whole.
        let layered = options.isolation.enabled;
        let fetches = options.fetch_concurrency;
        tokio::task::spawn_blocking(move || {
            VersionCache::open(&dir, blobs, cap)
                .map(|cache| cache.with_layers(layered).with_fetch_concurrency(fetches))
        })
        .await
        .map_err(|error| NodeError::Blobs(error.to_string()))??
    };
    let cache = Arc::new(cache);
    if options.lazy_versions && options.isolation.enabled {
        if lazy::available() {
            cache.set_lazy(Some(cache::LazySettings {
                fetch_deadline: options.fetch_timeout,
            }));
        } else {
            tracing::warn!(
                "/dev/fuse does not open here: sessions wait for whole versions (node.lazy_versions needs FUSE)"
            );
        }
    }
    let sessions_dir = options.state_dir.join("sessions");
    let disk = if options.isolation.enabled {
        let dir = sessions_dir.clone();
        let checked =
            tokio::task::spawn_blocking(move || plinth_sandbox::disk::DiskLimits::check(&dir))
                .await
                .map_err(|error| NodeError::NotPermitted(error.to_string()))?;
        match (checked, options.disk_required) {
            (Ok(limits), default) => Some((Arc::new(limits), default)),
            (Err(error), Some(_)) => {
                return Err(NodeError::NotPermitted(format!(
                    "sessions.disk_mb gives every session a disk limit, and this node cannot limit working directories: {error}"
                )));
            }
            (Err(error), None) => {
                tracing::warn!(%error, "this node cannot limit working directories; sessions that ask for disk_mb are refused");
                None
            }
        }
    } else {
        None
    };
    let sessions = Arc::new(SessionTable::load_limited(
        &sessions_dir,
        options.base_uid,
        disk,
    )?);
    tracing::info!(node = %options.name, sessions = sessions.len(), cached_versions = cache.cached_versions().len(), cache_bytes = cache.blob_bytes(), isolated = options.isolation.enabled, "node state loaded");

    let interceptor = options
        .internal
        .interceptor("node")
        .map_err(|error| NodeError::Token(error.to_string()))?;
    // A read order at its bounds (4,096 paths of up to 1,024 bytes) is just over 4 MiB.
    let catalog = SessionServiceClient::with_interceptor(catalog, interceptor)
        .max_decoding_message_size(8 * 1024 * 1024)
        .max_encoding_message_size(8 * 1024 * 1024);
    let node_id: Arc<Mutex<String>> = Arc::default();
    cache.set_read_orders(Arc::new(prewarm::CatalogReadOrders::new(
        catalog.clone(),
        node_id.clone(),
    )));
    let (warm, warm_list) = tokio::sync::watch::channel(Vec::new());
    let chosen = prewarm::Chosen::new(options.prewarm.clone());
    if !chosen.is_empty() {
        plinth_kit::tasks::spawn(prewarm::keep_warm(cache.clone(), chosen, warm_list));
    }
    let active: Arc<Mutex<HashSet<cache::VersionKey>>> = Arc::default();
    let contact = options.contact.clone().unwrap_or_default();
    plinth_kit::tasks::spawn(keep_registered(
        options.clone(),
        contact.clone(),
        catalog,
        cache.clone(),
        sessions.clone(),
        Listened {
            active: active.clone(),
            warm,
            node_id,
        },
        shutdown.clone(),
    ));
    plinth_kit::tasks::spawn(keep_spares(sessions.clone(), shutdown.clone()));
    if let Some(networks) = options.isolation.networks.clone() {
        plinth_kit::tasks::spawn(keep_spare_networks(networks, shutdown.clone()));
    }
    plinth_kit::tasks::spawn(evict_in_background(
        cache.clone(),
        sessions.clone(),
        active,
        shutdown.clone(),
    ));

    let server = options
        .internal
        .server(plinth_proto::FILE_DESCRIPTOR_SET, ACCESS)
        .answer_locally(options.local.clone());
    // Ready when it can do its work: the catalog hears its heartbeats (or the node would get
    // no sessions and learn of no ended ones). A blob store that does not answer leaves it
    // ready: its cached versions still serve sessions (a version it lacks fails to attach,
    // saying why); `/readyz` says so under its details.
    let readiness: ReadinessCheck = admin::watch(Arc::new(move || {
        let (contact, probe) = (contact.clone(), probe.clone());
        Box::pin(async move {
            contact.check().map_err(|unheard| unheard.to_string())?;
            // Bounded: a store that is gone is retried by its client for minutes, and this
            // round must end within its own bound to keep the node's readiness current.
            let within = std::time::Duration::from_secs(1);
            admin::describe(
                "blob store",
                match tokio::time::timeout(within, probe.ping()).await {
                    Ok(Ok(())) => "answers".to_owned(),
                    Ok(Err(error)) => {
                        format!("does not answer ({error}); cached versions still serve sessions")
                    }
                    Err(_) => "does not answer within 1 s; cached versions still serve sessions"
                        .to_owned(),
                },
            );
            Ok(())
        })
    }));
    server
        .report_health(&[SERVICE_NAME], readiness.clone(), shutdown.clone())
        .await;
    admin::spawn(
        admin,
        readiness,
        Some(options.internal.accepted.clone()),
        shutdown.clone(),
    );
    let namespaces = if options.isolation.enabled {
        Some(isolation::Namespaces::start().map_err(NodeError::Namespaces)?)
    } else {
        None
    };
    let node = node::Node {
        cache,
        sessions,
        isolation: options.isolation.clone(),
        namespaces,
        limits: options.limits.clone(),
        edits: Default::default(),
    };
    let stopping = node.cache.clone();
    let node = Arc::new(node);
    let limit = usize::try_from(options.limits.max_file_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024);
    tracing::info!(address = ?grpc.local_addr().ok(), "node serving");
    server
        .add_service(
            NodeServiceServer::from_arc(node.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .add_service(
            WorkspaceServiceServer::from_arc(node)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .serve(grpc, shutdown)
        .await?;
    // What this node's sessions read first, for the nodes after it.
    stopping.tell_before_stopping(TELL_WITHIN).await;
    Ok(())
}

/// What an isolated node needs beyond root, found at start: its cgroups (v2, or v1 where a
/// host has no v2 controllers), the seccomp filter, the egress policy and the copy of `/etc`
/// sessions see. Every session cgroup a stopped node left behind is removed.
fn sandbox_setup(options: &mut NodeOptions) -> Result<(), NodeError> {
    use std::hash::{Hash, Hasher};
    // One group per node state directory: stable across restarts, apart from other nodes
    // (and test runs) on the same host.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    options.state_dir.hash(&mut hasher);
    let group = format!("plinth-{:08x}", hasher.finish() as u32);
    let cgroups = plinth_sandbox::cgroup::Cgroups::detect(&group).map_err(|error| {
        NodeError::NotPermitted(format!(
            "sessions need cgroups for their memory, process and CPU limits: {error}"
        ))
    })?;
    tracing::info!(cgroups = %cgroups.describe(), "session limits on cgroups");
    plinth_kit::admin::describe("session limits", cgroups.describe());
    // A node that starts holds no sandbox: every session group there is was left by a node
    // that stopped (its processes died with their keepers, or die now). The sessions it keeps
    // get a new group with their sandbox before their next command, so all are removed, those
    // of kept sessions too: none lingers until its session ends.
    match cgroups.list() {
        Ok(names) => {
            for name in names {
                if let Err(error) = cgroups.destroy(&name) {
                    tracing::warn!(cgroup = %name, %error, "cannot remove a session cgroup a stopped node left");
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot list the session cgroups a stopped node left");
        }
    }
    options.isolation.cgroups = Some(Arc::new(cgroups));
    // What sessions see of the host's /etc: a copy of what tools read, made again at each
    // start (the host's may have changed).
    let etc = options.state_dir.join("etc");
    plinth_sandbox::root::copy_etc(&etc).map_err(|error| {
        NodeError::NotPermitted(format!(
            "copying what sessions see of /etc into {}: {error}",
            etc.display()
        ))
    })?;
    options.isolation.etc = Some(etc);
    options.isolation.networks = Some(Arc::new(plinth_sandbox::egress::SpareNetworks::new(
        SPARE_NETWORKS,
        options
            .isolation
            .egress
            .as_ref()
            .map(|_| plinth_sandbox::egress::DEFAULT_PROXY_ADDR),
    )));
    options.isolation.seccomp =
        Some(plinth_sandbox::seccomp::Filter::shared().map_err(|error| {
            NodeError::NotPermitted(format!("building the seccomp filter: {error}"))
        })?);
    Ok(())
}

/// Copies the host's `uv` into the node's tools directory `dir` (root's, shown read-only to
/// sessions), so sessions run the `uv` builds installed with, wherever the host keeps it;
/// answers `dir`, or `None` (said in the log) when there is no `uv` to give them.
fn place_tools(dir: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let placed = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| plinth_sandbox::tools::place_uv(dir));
    match placed {
        Ok(Some(uv)) => {
            tracing::info!(from = %uv.display(), to = %dir.join("uv").display(), "uv available to sessions");
            Some(dir.to_owned())
        }
        Ok(None) => {
            tracing::warn!(
                "no uv found on this host (python3's uv package, or PATH): sessions have no uv"
            );
            None
        }
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot place uv for sessions; they have no uv");
            None
        }
    }
}

/// Network namespaces kept ready for sessions' sandboxes.
const SPARE_NETWORKS: usize = 8;

/// The longest a stopping node waits to tell what its lazily mounted versions' sessions read
/// (and to store those versions' packs).
const TELL_WITHIN: Duration = Duration::from_secs(5);

/// Keeps spare network namespaces ready, checking every 50 ms.
async fn keep_spare_networks(
    networks: Arc<plinth_sandbox::egress::SpareNetworks>,
    shutdown: CancellationToken,
) {
    loop {
        if networks.wanting() {
            let refill = networks.clone();
            match tokio::task::spawn_blocking(move || refill.refill()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "cannot make spare network namespaces; sessions make their own");
                }
                Err(error) => tracing::warn!(%error, "making spare network namespaces stopped"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// Keeps spare session directories ready: at start, and again whenever one is taken.
async fn keep_spares(sessions: Arc<SessionTable>, shutdown: CancellationToken) {
    loop {
        let table = sessions.clone();
        match tokio::task::spawn_blocking(move || table.make_spares()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot make spare session directories; sessions make their own");
            }
            Err(error) => tracing::warn!(%error, "making spare session directories stopped"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = sessions.spare_taken() => {}
        }
    }
}

/// When the catalog last answered the node (its registration or a heartbeat), for readiness.
#[derive(Debug, Default)]
pub struct CatalogContact {
    /// Milliseconds since the Unix epoch; 0 until the node registers.
    last_ms: std::sync::atomic::AtomicI64,
    /// The heartbeat period the catalog asked for, in milliseconds.
    every_ms: std::sync::atomic::AtomicI64,
}

impl CatalogContact {
    fn answered(&self, every: Duration) {
        self.every_ms.store(
            i64::try_from(every.as_millis()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        self.last_ms
            .store(plinth_kit::clock::now_ms(), Ordering::Relaxed);
    }

    /// Fine once the node registered at its address (and reconciled its sessions), while the
    /// catalog answered within three heartbeats (and at least 10 s).
    pub fn check(&self) -> Result<(), CatalogUnheard> {
        let last = self.last_ms.load(Ordering::Relaxed);
        if last == 0 {
            return Err(CatalogUnheard::NotRegistered);
        }
        let silent = plinth_kit::clock::now_ms().saturating_sub(last);
        let allowed = (3 * self.every_ms.load(Ordering::Relaxed)).max(10_000);
        if silent > allowed {
            return Err(CatalogUnheard::Silent {
                seconds: silent / 1000,
            });
        }
        Ok(())
    }
}

/// Why the node is not in touch with the catalog ([`CatalogContact::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CatalogUnheard {
    /// The node has not registered yet.
    #[error("not registered with the catalog yet (is catalog_url right, and the catalog up?)")]
    NotRegistered,
    /// The catalog has not answered a heartbeat for longer than three heartbeats (and 10 s).
    #[error("the catalog has not answered a heartbeat for {seconds} s")]
    Silent {
        /// Since the last answer, in whole seconds.
        seconds: i64,
    },
}

/// Registers (again after a restart, or when the catalog forgot the node), reconciles the
/// sessions on disk with the catalog's, then heartbeats, learning which cached versions are
/// active and which of its sessions are live: those that are not are detached.
/// What the node learns from the catalog, for its other loops.
struct Listened {
    /// The cached versions that are their environment's active one (kept from eviction).
    active: Arc<Mutex<HashSet<cache::VersionKey>>>,
    /// The versions to hold warm.
    warm: tokio::sync::watch::Sender<Vec<catalog_pb::WarmVersion>>,
    /// The node's id, once registered.
    node_id: Arc<Mutex<String>>,
}

async fn keep_registered(
    options: NodeOptions,
    contact: Arc<CatalogContact>,
    mut catalog: Catalog,
    cache: Arc<VersionCache>,
    sessions: Arc<SessionTable>,
    listened: Listened,
    shutdown: CancellationToken,
) {
    let Listened {
        active,
        warm,
        node_id: shared_id,
    } = listened;
    let mut registered: Option<(String, Duration)> = None;
    let mut report = heartbeat::CacheReporter::new();
    let capacity = Capacity::measure(options.max_sessions, options.memory_reserve_mb);
    tracing::info!(
        max_sessions = capacity.max_sessions,
        memory_mb = capacity.memory_mb,
        memory_reserve_mb = options.memory_reserve_mb,
        "what this node offers sessions (0 sessions: no limit)"
    );
    plinth_kit::admin::describe(
        "capacity",
        format!(
            "{} MiB of memory for sessions, {}",
            capacity.memory_mb,
            match capacity.max_sessions {
                0 => "no limit on sessions".to_owned(),
                most => format!("at most {most} sessions"),
            }
        ),
    );
    // Set while sessions a heartbeat found ended are being detached, so a slow removal is not
    // started again by the next heartbeat.
    let detaching = Arc::new(AtomicBool::new(false));
    // From the start, not from the first heartbeat (the catalog may not answer yet).
    report_gauges(&options.state_dir, &cache, &sessions);
    loop {
        let pause = match registered.clone() {
            None => match catalog
                .register_node(catalog_pb::RegisterNodeRequest {
                    name: options.name.clone(),
                    address: options.advertise_url.clone(),
                    isolated: options.isolation.enabled,
                    sessions_dir: options
                        .state_dir
                        .join("sessions")
                        .to_string_lossy()
                        .into_owned(),
                    session_workdir: if options.isolation.enabled {
                        isolation::WORKDIR.to_owned()
                    } else {
                        String::new()
                    },
                    max_sessions: capacity.max_sessions,
                    memory_mb: capacity.memory_mb,
                })
                .await
            {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    let every = Duration::from_millis(
                        u64::try_from(answer.heartbeat_every_ms)
                            .unwrap_or(2000)
                            .max(100),
                    );
                    tracing::info!(node_id = %answer.node_id, "node registered with the catalog");
                    reconcile(&mut catalog, &answer.node_id, &sessions).await;
                    contact.answered(every);
                    // Told only now, so a process that waits for this is ready when told.
                    if let Some(registered) = &options.registered {
                        registered.notify_one();
                    }
                    report.forget();
                    answer.node_id.clone_into(
                        &mut shared_id
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                    );
                    registered = Some((answer.node_id, every));
                    every
                }
                Err(status) => {
                    tracing::warn!(error = %status.message(), "cannot register with the catalog; retrying");
                    Duration::from_secs(1)
                }
            },
            Some((node_id, every)) => {
                let cached = cache
                    .cached_versions()
                    .into_iter()
                    .map(|(key, _)| key)
                    .collect();
                let (mut request, sent) = report.request(node_id, cached);
                request.max_sessions = capacity.max_sessions;
                request.memory_mb = capacity.memory_mb;
                // The sessions held before asking: only these may be found ended by the answer.
                let known = sessions.ids();
                report_gauges(&options.state_dir, &cache, &sessions);
                // A heartbeat is routine: not worth a trace (see `telemetry::idle`).
                // A replica that does not answer within the period is passed for another, so
                // one sick catalog does not make this node late.
                let mut request = tonic::Request::new(request);
                request.set_timeout(every);
                match catalog
                    .node_heartbeat(request)
                    .instrument(plinth_kit::telemetry::idle("node.heartbeat"))
                    .await
                {
                    Ok(answer) => {
                        contact.answered(every);
                        let answer = answer.into_inner();
                        if let Some(now_active) = report.answered(sent, &answer) {
                            *active
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) = now_active;
                            warm.send_if_modified(|held| {
                                let changed = held.as_slice() != report.warm();
                                if changed {
                                    *held = report.warm().to_vec();
                                }
                                changed
                            });
                        }
                        if answer.sessions_listed {
                            let live: HashSet<String> = answer.live_sessions.into_iter().collect();
                            detach_ended(&sessions, known, live, &detaching);
                        }
                    }
                    Err(status) if status.code() == tonic::Code::NotFound => registered = None,
                    Err(status) => {
                        tracing::warn!(error = %status.message(), "heartbeat to the catalog failed; retrying")
                    }
                }
                every
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Sets the node's gauges: sessions attached, cache bytes, the background fetch limit, and the
/// free and total bytes of the filesystem its state lives on. Called with every heartbeat.
fn report_gauges(state_dir: &std::path::Path, cache: &VersionCache, sessions: &SessionTable) {
    metrics::gauge!("plinth_node_sessions").set(sessions.len() as f64);
    metrics::gauge!("plinth_node_cache_bytes").set(cache.blob_bytes() as f64);
    metrics::gauge!("plinth_node_fetch_limit").set(cache.fetch_limit() as f64);
    match rustix::fs::statvfs(state_dir) {
        Ok(stat) => {
            let fragment = stat.f_frsize as f64;
            metrics::gauge!("plinth_node_disk_free_bytes").set(stat.f_bavail as f64 * fragment);
            metrics::gauge!("plinth_node_disk_size_bytes").set(stat.f_blocks as f64 * fragment);
        }
        Err(error) => {
            tracing::debug!(%error, dir = %state_dir.display(), "cannot read the state directory's filesystem");
        }
    }
}

/// Detaches, in the background, the sessions of `known` the catalog no longer lists as live:
/// ended by their lifetime or idle limit, or by a caller whose call to this node failed. Their
/// processes are killed and their working directories removed. Does nothing while an earlier
/// round is still at it; the next heartbeat finds what is left.
fn detach_ended(
    sessions: &Arc<SessionTable>,
    known: Vec<String>,
    live: HashSet<String>,
    detaching: &Arc<AtomicBool>,
) {
    if known.iter().all(|id| live.contains(id)) || detaching.swap(true, Ordering::AcqRel) {
        return;
    }
    let (sessions, detaching) = (sessions.clone(), detaching.clone());
    plinth_kit::tasks::spawn(async move {
        let removed = sessions.retain_of(known, &live).await;
        if removed > 0 {
            tracing::info!(
                removed,
                "detached sessions the catalog ended (lifetime, idle, or a missed end)"
            );
        }
        detaching.store(false, Ordering::Release);
    });
}

/// After a restart: sessions the catalog ended while the node was away are removed.
async fn reconcile(catalog: &mut Catalog, node_id: &str, sessions: &SessionTable) {
    match live_sessions(catalog, node_id).await {
        Ok(live) => {
            let removed = sessions.retain(&live).await;
            if removed > 0 {
                tracing::info!(removed, "removed sessions the catalog no longer has");
            }
        }
        Err(status) => {
            tracing::warn!(error = %status.message(), "cannot list this node's sessions; keeping every session on disk")
        }
    }
}

/// Every live session the catalog has placed on this node, read page by page: a node with
/// more sessions than one page holds must not take the rest for ended and remove them.
async fn live_sessions(
    catalog: &mut Catalog,
    node_id: &str,
) -> Result<HashSet<String>, tonic::Status> {
    let mut live = HashSet::new();
    let mut after = String::new();
    loop {
        let page = catalog
            .list_node_sessions(catalog_pb::ListNodeSessionsRequest {
                node_id: node_id.to_owned(),
                limit: LIST_PAGE,
                after,
            })
            .await?
            .into_inner();
        live.extend(page.sessions.into_iter().map(|session| session.id));
        if !page.has_more || page.next.is_empty() {
            return Ok(live);
        }
        after = page.next;
    }
}

/// Sessions asked for in one page when reconciling: the catalog's most.
const LIST_PAGE: u32 = 1000;

/// Every few seconds: evicts cached versions no live session uses and no environment has
/// active, least recently used first, while the cache is over its cap.
async fn evict_in_background(
    cache: Arc<VersionCache>,
    sessions: Arc<SessionTable>,
    active: Arc<Mutex<HashSet<cache::VersionKey>>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let mut keep = sessions.live_versions();
        keep.extend(
            active
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .cloned(),
        );
        let cache = cache.clone();
        let removed = tokio::task::spawn_blocking(move || cache.evict(&keep))
            .await
            .unwrap_or_default();
        for (environment, version) in removed {
            tracing::info!(%environment, version, "evicted a cached version");
        }
    }
}
