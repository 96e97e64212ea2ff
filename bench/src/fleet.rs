//! `plinth-bench fleet`: many nodes heartbeating to catalog replicas on PostgreSQL, and
//! sessions placed among them.
//!
//! Every simulated node is a task of its own with its own connection and its own node
//! credential (accepted by name, as a real node's is); it registers as a node agent does and
//! heartbeats on the period the catalog gives it, building each heartbeat with the node
//! agent's own [`CacheReporter`] from a cache of `--versions` versions drawn from ready builds
//! of `--environments` environments (two versions each, the second active). A node's cache
//! changes now and then (`--churn`: the chance per heartbeat that one version was swapped for
//! another), as versions are materialized and evicted. Nodes are spread over the catalogs.
//!
//! Once every node has sent its first heartbeat, `--sessions` sessions are placed through the
//! catalogs' `CreateSession` (as the gateway places them), and then, for `--seconds`, the
//! heartbeats are measured while one caller places a session and ends it again, over and over,
//! so that `--sessions` stay live: heartbeats completed per second against the rate offered
//! (one per node per period), their latency, and the latency of each placement.
//!
//! Needs a PostgreSQL server (`--database-url`, or `PLINTH_TEST_POSTGRES_URL`) on which a
//! fresh database is made for the `plinth catalog` replicas it starts; or `--catalog-url`s of
//! running catalogs that accept the credentials `--write-credentials` wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plinth_kit::config::Secret;
use plinth_kit::grpc::ClientInterceptor;
use plinth_node::cache::VersionKey;
use plinth_node::heartbeat::CacheReporter;
use plinth_proto::catalog::v1 as pb;
use sqlx::{Connection as _, Executor as _};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::failover::{Process, fresh_database, port};

/// Fleet benchmark.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Simulated nodes, each a task with its own connection and credential.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Versions each node caches.
    #[arg(long, default_value_t = 200)]
    versions: usize,
    /// Sessions kept live while placement is measured.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Environments whose versions (two each) the nodes' caches are drawn from.
    #[arg(long, default_value_t = 500)]
    environments: usize,
    /// Scopes the environments, and so the sessions, are dealt over (each quota counts the
    /// sessions of one scope; 100 per scope is the default quota).
    #[arg(long, default_value_t = 100)]
    scopes: usize,
    /// Catalog replicas to start over one PostgreSQL database; nodes are spread over them.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Seconds of measurement.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The chance, per heartbeat, that a node's cache changed since its last one (one version
    /// swapped for another).
    #[arg(long, default_value_t = 0.01)]
    churn: f64,
    /// Sessions placed at once while filling up to `--sessions`.
    #[arg(long, default_value_t = 8)]
    fill_concurrency: usize,
    /// A PostgreSQL server URL; a fresh database is created on it for the replicas.
    #[arg(long, env = "PLINTH_TEST_POSTGRES_URL")]
    database_url: Option<String>,
    /// Running catalogs to use instead of starting replicas (repeat for each); they must
    /// accept the credentials in `--credentials-dir` (their `internal.accept_file` being the
    /// `accept.toml` that `--write-credentials` wrote there).
    #[arg(long = "catalog-url")]
    catalog_urls: Vec<String>,
    /// Where the credentials of `--nodes` nodes, a gateway and a builder are: `accept.toml`
    /// for the catalogs, `tokens` for this benchmark.
    #[arg(long)]
    credentials_dir: Option<PathBuf>,
    /// Write fresh credentials into `--credentials-dir` and stop.
    #[arg(long)]
    write_credentials: bool,
    /// Keep the replicas' database when done (its URL is printed), to look into.
    #[arg(long)]
    keep_database: bool,
    /// The `plinth` binary whose catalogs to start (default: the one beside this benchmark),
    /// e.g. an earlier release's, for a baseline.
    #[arg(long)]
    plinth: Option<PathBuf>,
}

/// The scope of the benchmark's environment `index` (and of its sessions): environments are
/// dealt over `scopes` scopes in turn.
fn scope_of(index: usize, scopes: usize) -> String {
    format!("fleet-{}", index % scopes.max(1))
}

/// A ready environment: its scope and id.
#[derive(Debug, Clone)]
struct Environment {
    scope: String,
    id: String,
}

type SessionClient = pb::session_service_client::SessionServiceClient<
    InterceptedService<Channel, ClientInterceptor>,
>;
type CatalogClient = pb::catalog_service_client::CatalogServiceClient<
    InterceptedService<Channel, ClientInterceptor>,
>;

/// The gateway's, the builder's and every node's credential.
struct Credentials {
    gateway: String,
    builder: String,
    /// `(name, token)` of each node.
    nodes: Vec<(String, String)>,
}

impl Credentials {
    fn generate(nodes: usize) -> anyhow::Result<Self> {
        let token =
            || -> anyhow::Result<String> { Ok(plinth_kit::auth::new_token()?.expose().to_owned()) };
        Ok(Credentials {
            gateway: token()?,
            builder: token()?,
            nodes: (0..nodes)
                .map(|index| Ok((format!("fleet-node-{index:05}"), token()?)))
                .collect::<anyhow::Result<_>>()?,
        })
    }

    /// Writes `accept.toml` (digests only) and `tokens` (`role name token` per line) in `dir`.
    fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let entry = |role: &str, name: Option<&str>, token: &str| {
            let name = name
                .map(|name| format!("name = \"{name}\"\n"))
                .unwrap_or_default();
            format!(
                "[[accept]]\nrole = \"{role}\"\n{name}token_sha256 = \"{}\"\n\n",
                plinth_kit::auth::digest_hex(token)
            )
        };
        let mut accept = entry("gateway", None, &self.gateway);
        accept.push_str(&entry("builder", None, &self.builder));
        let mut tokens = format!("gateway - {}\nbuilder - {}\n", self.gateway, self.builder);
        for (name, token) in &self.nodes {
            accept.push_str(&entry("node", Some(name), token));
            tokens.push_str(&format!("node {name} {token}\n"));
        }
        std::fs::write(dir.join("accept.toml"), accept)?;
        std::fs::write(dir.join("tokens"), tokens)?;
        Ok(())
    }

    fn read(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("tokens");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (made by --write-credentials)", path.display()))?;
        let (mut gateway, mut builder, mut nodes) = (None, None, Vec::new());
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("gateway"), _, Some(token)) => gateway = Some(token.to_owned()),
                (Some("builder"), _, Some(token)) => builder = Some(token.to_owned()),
                (Some("node"), Some(name), Some(token)) => {
                    nodes.push((name.to_owned(), token.to_owned()));
                }
                _ => anyhow::bail!("{}: unreadable line {line:?}", path.display()),
            }
        }
        Ok(Credentials {
            gateway: gateway.context("no gateway token")?,
            builder: builder.context("no builder token")?,
            nodes,
        })
    }
}

/// A gRPC channel of its own to `url`, connected on first use.
fn channel(url: &str) -> anyhow::Result<Channel> {
    Ok(tonic::transport::Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(10))
        .connect_lazy())
}

/// `channel` sending `token` as its credential on every call.
fn intercepted(
    channel: Channel,
    token: &str,
) -> anyhow::Result<InterceptedService<Channel, ClientInterceptor>> {
    Ok(InterceptedService::new(
        channel,
        ClientInterceptor::new(&Secret::new(token))?,
    ))
}

/// `plinth catalog` replicas over a fresh database, each accepting `credentials`.
struct Replicas {
    urls: Vec<String>,
    server_url: String,
    database_url: String,
    _dir: tempfile::TempDir,
    processes: Vec<Process>,
}

impl Replicas {
    async fn start(
        binary: &Path,
        server_url: &str,
        count: usize,
        credentials: &Credentials,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let database_url = fresh_database(server_url).await?;
        credentials.write(dir.path())?;
        let mut seal = [0u8; 32];
        getrandom::fill(&mut seal).map_err(|error| anyhow::anyhow!("no randomness: {error}"))?;
        let seal_file = dir.path().join("seal.key");
        std::fs::write(
            &seal_file,
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, seal),
        )?;
        let config = dir.path().join("plinth.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[internal]\naccept_file = \"{}\"\n[catalog]\nseal_key_file = \"{}\"\n",
                dir.path().display(),
                dir.path().join("accept.toml").display(),
                seal_file.display()
            ),
        )?;
        let client = reqwest::Client::new();
        let mut urls = Vec::new();
        let mut processes = Vec::new();
        for replica in 0..count {
            let (listen, admin) = (port()?, port()?);
            let log = std::fs::File::create(dir.path().join(format!("catalog-{replica}.log")))?;
            let child = Command::new(binary)
                .args([
                    "catalog",
                    "--listen",
                    &format!("127.0.0.1:{listen}"),
                    "--admin-listen",
                    &format!("127.0.0.1:{admin}"),
                    "--database-url",
                    &database_url,
                ])
                .env("PLINTH_CONFIG", &config)
                .env("PLINTH_LOG", "warn")
                .env_remove("PLINTH_INTERNAL_CREDENTIAL")
                .envs(crate::service::UNLIMITED_QUOTAS)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            processes.push(Process(child));
            let ready = format!("http://127.0.0.1:{admin}/readyz");
            let mut up = false;
            for _ in 0..600 {
                if let Ok(response) = client.get(&ready).send().await
                    && response.status().is_success()
                {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::ensure!(up, "catalog replica {replica} did not become ready");
            urls.push(format!("http://127.0.0.1:{listen}"));
        }
        Ok(Replicas {
            urls,
            server_url: server_url.to_owned(),
            database_url,
            _dir: dir,
            processes,
        })
    }

    /// The replicas' process ids.
    fn pids(&self) -> Vec<u32> {
        self.processes
            .iter()
            .map(|process| process.0.id())
            .collect()
    }

    /// Stops the replicas and drops their database.
    async fn stop(mut self) -> anyhow::Result<()> {
        self.processes.clear();
        let name = self
            .database_url
            .rsplit('/')
            .next()
            .and_then(|tail| tail.split('?').next())
            .context("no database name")?;
        let mut connection = sqlx::PgConnection::connect(&self.server_url).await?;
        connection
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name}"
            )))
            .await?;
        Ok(())
    }
}

/// A small deterministic generator (splitmix64): the same caches for the same seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    fn chance(&mut self, probability: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < probability
    }
}

/// `call` again, a quarter of a second later, while the catalog answers `UNAVAILABLE` (a
/// replica whose pool is saturated, as a thousand nodes registering at once make it, turns
/// callers away before doing anything), for up to a minute; as the gateway's and the
/// builder's clients do.
async fn retrying<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(answer) => return Ok(answer.into_inner()),
            Err(status) if status.code() == tonic::Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(status) => return Err(status),
        }
    }
}

/// Makes `count` environments of two ready versions each (the second active); answers every
/// `(environment, version)`.
async fn seed(
    catalog: &str,
    credentials: &Credentials,
    count: usize,
    scopes: usize,
) -> anyhow::Result<(Vec<Environment>, Vec<VersionKey>)> {
    let gateway = CatalogClient::new(intercepted(channel(catalog)?, &credentials.gateway)?);
    let builder = CatalogClient::new(intercepted(channel(catalog)?, &credentials.builder)?);
    let mut ids = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(16) {
        let creates = chunk.iter().map(|index| {
            let gateway = gateway.clone();
            async move {
                let scope = scope_of(*index, scopes);
                let environment = retrying(|| {
                    let (mut client, request) = (
                        gateway.clone(),
                        pb::CreateEnvironmentRequest {
                            scope: scope.clone(),
                            name: format!("fleet {index}"),
                            ..Default::default()
                        },
                    );
                    async move { client.create_environment(request).await }
                })
                .await?;
                anyhow::Ok(Environment {
                    scope,
                    id: environment.id,
                })
            }
        });
        for id in futures::future::join_all(creates).await {
            ids.push(id?);
        }
    }
    for version in 1..=2u32 {
        for chunk in ids.chunks(16) {
            let starts = chunk.iter().map(|environment| {
                let gateway = gateway.clone();
                async move {
                    retrying(|| {
                        let (mut client, request) = (
                            gateway.clone(),
                            pb::StartBuildRequest {
                                scope: environment.scope.clone(),
                                id: environment.id.clone(),
                                source_tree: format!("sha256:{:064x}", version),
                                clean: false,
                            },
                        );
                        async move { client.start_build(request).await }
                    })
                    .await?;
                    anyhow::Ok(())
                }
            });
            for started in futures::future::join_all(starts).await {
                started?;
            }
        }
        // Each build queued is claimed and completed, by a few builders at once.
        let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(ids.len()));
        let workers = (0..4).map(|_| {
            let builder = builder.clone();
            let remaining = remaining.clone();
            async move {
                loop {
                    let left = remaining.load(std::sync::atomic::Ordering::Acquire);
                    if left == 0 {
                        return anyhow::Ok(());
                    }
                    if remaining
                        .compare_exchange(
                            left,
                            left - 1,
                            std::sync::atomic::Ordering::AcqRel,
                            std::sync::atomic::Ordering::Acquire,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    let claim = loop {
                        let answer = retrying(|| {
                            let (mut client, request) = (
                                builder.clone(),
                                pb::ClaimBuildRequest {
                                    builder: "fleet-seed".to_owned(),
                                },
                            );
                            async move { client.claim_build(request).await }
                        })
                        .await?;
                        if let Some(claim) = answer.claim {
                            break claim;
                        }
                    };
                    let build = claim.build.context("a claim without its build")?;
                    let ready = pb::CompleteBuildRequest {
                        lease_token: claim.lease_token,
                        outcome: Some(pb::complete_build_request::Outcome::Ready(pb::BuildReady {
                            layer_tree: format!(
                                "sha256:{:032x}{:032x}",
                                build.version,
                                fnv(&build.environment_id)
                            ),
                            size: 1,
                            ..Default::default()
                        })),
                    };
                    retrying(|| {
                        let (mut client, request) = (builder.clone(), ready.clone());
                        async move { client.complete_build(request).await }
                    })
                    .await?;
                }
            }
        });
        for worker in futures::future::join_all(workers).await {
            worker?;
        }
    }
    let versions = ids
        .iter()
        .flat_map(|environment| [(environment.id.clone(), 1), (environment.id.clone(), 2)])
        .collect();
    Ok((ids, versions))
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One heartbeat as the node saw it.
#[derive(Debug, Clone, Copy)]
struct Beat {
    /// When its answer came, from the benchmark's start.
    done: Duration,
    /// How long it took.
    latency: Duration,
    /// Whether it carried the whole set.
    whole: bool,
    /// Whether it failed.
    failed: bool,
}

/// Registers as `register` says, again every second while the catalog answers `UNAVAILABLE`
/// (as the node agent does), until `stop`.
async fn register_retrying(
    client: &mut SessionClient,
    register: &impl Fn() -> pb::RegisterNodeRequest,
    stop: &plinth_kit::tasks::CancellationToken,
) -> anyhow::Result<pb::RegisterNodeResponse> {
    loop {
        match client.register_node(register()).await {
            Ok(answer) => return Ok(answer.into_inner()),
            Err(status) if status.code() == tonic::Code::Unavailable && !stop.is_cancelled() => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(status) => return Err(status.into()),
        }
    }
}

/// One simulated node: registers, then heartbeats on the catalog's period until `stop`.
#[allow(clippy::too_many_arguments)]
async fn node(
    catalog: String,
    name: String,
    token: String,
    pool: Arc<Vec<VersionKey>>,
    versions: usize,
    churn: f64,
    origin: Instant,
    first_at: Duration,
    stop: plinth_kit::tasks::CancellationToken,
) -> anyhow::Result<(Duration, Vec<Beat>)> {
    let mut client = SessionClient::new(intercepted(channel(&catalog)?, &token)?);
    let mut random = Random(fnv(&name));
    // The cache: `versions` distinct versions of the pool, drawn at random.
    let mut order: Vec<usize> = (0..pool.len()).collect();
    for index in (1..order.len()).rev() {
        order.swap(index, random.below(index + 1));
    }
    let mut cache: Vec<VersionKey> = order[..versions.min(pool.len())]
        .iter()
        .map(|&index| pool[index].clone())
        .collect();
    let mut beats = Vec::new();
    let mut reporter = CacheReporter::new();
    tokio::time::sleep_until((origin + first_at).into()).await;
    let register = || pb::RegisterNodeRequest {
        name: name.clone(),
        address: "http://127.0.0.1:9".to_owned(),
        isolated: true,
        sessions_dir: format!("/var/lib/plinth/{name}/sessions"),
        session_workdir: "/home/session".to_owned(),
        // Unlimited, as an earlier node says: placement here measures the index, not room.
        ..Default::default()
    };
    // As the node agent does: a catalog that cannot answer now (a thousand nodes registering
    // at once exhaust its pool) is asked again a second later.
    let mut registered = register_retrying(&mut client, &register, &stop).await?;
    let every = Duration::from_millis(u64::try_from(registered.heartbeat_every_ms)?.max(100));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok((every, beats)),
            _ = ticks.tick() => {}
        }
        if random.chance(churn) && cache.len() < pool.len() {
            // One version evicted, another materialized.
            let evicted = random.below(cache.len());
            let added = loop {
                let candidate = &pool[random.below(pool.len())];
                if !cache.contains(candidate) {
                    break candidate.clone();
                }
            };
            cache[evicted] = added;
        }
        let (request, sent) = reporter.request(registered.node_id.clone(), cache.clone());
        let whole = !request.cache_unchanged;
        let started = Instant::now();
        let answer = client.node_heartbeat(request).await;
        let latency = started.elapsed();
        let failed = match answer {
            Ok(answer) => {
                reporter.answered(sent, &answer.into_inner());
                false
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                registered = register_retrying(&mut client, &register, &stop).await?;
                reporter.forget();
                true
            }
            Err(_) => true,
        };
        beats.push(Beat {
            done: origin.elapsed(),
            latency,
            whole,
            failed,
        });
    }
}

/// CPU time used so far, in clock ticks: by this process, by `catalogs`, by every
/// `postgres` process, and by the whole machine (busy, idle).
#[derive(Debug, Clone, Copy, Default)]
struct CpuTicks {
    nodes: u64,
    catalogs: u64,
    postgres: u64,
    busy: u64,
    idle: u64,
}

/// utime + stime of process `pid`, and its command name.
fn process_ticks(pid: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat[open + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

impl CpuTicks {
    fn now(catalogs: &[u32]) -> Self {
        let mut ticks = CpuTicks {
            nodes: process_ticks("self").map_or(0, |(_, ticks)| ticks),
            catalogs: catalogs
                .iter()
                .filter_map(|pid| process_ticks(&pid.to_string()))
                .map(|(_, ticks)| ticks)
                .sum(),
            ..CpuTicks::default()
        };
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                if let Some((command, used)) = process_ticks(pid)
                    && command == "postgres"
                {
                    ticks.postgres += used;
                }
            }
        }
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|field| field.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        if cpu.len() >= 8 {
            ticks.idle = cpu[3] + cpu[4];
            ticks.busy = cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6] + cpu[7];
        }
        ticks
    }
}

fn percentile(values: &[f64], fraction: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Places a session on `environment`; answers it and how long the call took.
async fn place(
    client: &mut SessionClient,
    environment: &Environment,
) -> anyhow::Result<(pb::Session, Duration)> {
    let started = Instant::now();
    let session = retrying(|| {
        let (mut client, request) = (
            client.clone(),
            pb::CreateSessionRequest {
                scope: environment.scope.clone(),
                environment_id: environment.id.clone(),
                ..Default::default()
            },
        );
        async move { client.create_session(request).await }
    })
    .await?;
    Ok((session, started.elapsed()))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    plinth::serve::raise_open_file_limit();
    if args.write_credentials {
        let dir = args
            .credentials_dir
            .context("--write-credentials needs --credentials-dir")?;
        Credentials::generate(args.nodes)?.write(&dir)?;
        println!(
            "wrote {} and {}",
            dir.join("accept.toml").display(),
            dir.join("tokens").display()
        );
        return Ok(());
    }
    anyhow::ensure!(
        args.nodes > 0 && args.environments > 0,
        "--nodes and --environments must be at least 1"
    );
    let binary = match &args.plinth {
        Some(binary) => binary.clone(),
        None => crate::service::binary()?,
    };
    let (credentials, replicas, catalogs) = if args.catalog_urls.is_empty() {
        let server = args
            .database_url
            .as_deref()
            .context("a PostgreSQL server is needed: --database-url or PLINTH_TEST_POSTGRES_URL")?;
        let credentials = Credentials::generate(args.nodes)?;
        let replicas = Replicas::start(&binary, server, args.replicas.max(1), &credentials).await?;
        let urls = replicas.urls.clone();
        (credentials, Some(replicas), urls)
    } else {
        let dir = args
            .credentials_dir
            .as_deref()
            .context("--catalog-url needs --credentials-dir (see --write-credentials)")?;
        let credentials = Credentials::read(dir)?;
        anyhow::ensure!(
            credentials.nodes.len() >= args.nodes,
            "{} holds credentials for {} nodes, fewer than --nodes",
            dir.display(),
            credentials.nodes.len()
        );
        (credentials, None, args.catalog_urls.clone())
    };

    let seeding = Instant::now();
    let (environments, pool) =
        seed(&catalogs[0], &credentials, args.environments, args.scopes).await?;
    let pool = Arc::new(pool);
    let seeded = seeding.elapsed();

    // The nodes, their first heartbeats spread over the first second.
    let origin = Instant::now();
    let stop = plinth_kit::tasks::CancellationToken::new();
    let mut nodes = Vec::with_capacity(args.nodes);
    for (index, (name, token)) in credentials.nodes.iter().take(args.nodes).enumerate() {
        let first_at = Duration::from_micros((index as u64 * 1_000_000) / args.nodes as u64);
        nodes.push(plinth_kit::tasks::spawn(node(
            catalogs[index % catalogs.len()].clone(),
            name.clone(),
            token.clone(),
            pool.clone(),
            args.versions,
            args.churn,
            origin,
            first_at,
            stop.clone(),
        )));
    }
    // Every node's first heartbeat (its whole set) is in before sessions are placed.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Fill up to `--sessions` live sessions.
    let gateways: Vec<SessionClient> = catalogs
        .iter()
        .map(|url| {
            Ok(SessionClient::new(intercepted(
                channel(url)?,
                &credentials.gateway,
            )?))
        })
        .collect::<anyhow::Result<_>>()?;
    let filling = Instant::now();
    let placed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fillers = (0..args.fill_concurrency.max(1)).map(|worker| {
        let mut client = gateways[worker % gateways.len()].clone();
        let environments = environments.clone();
        let placed = placed.clone();
        let target = args.sessions;
        async move {
            // Dealt over the environments in turn, so every scope gets its share.
            loop {
                let next = placed.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                if next >= target {
                    return anyhow::Ok(());
                }
                place(&mut client, &environments[next % environments.len()]).await?;
            }
        }
    });
    for filled in futures::future::join_all(fillers).await {
        filled?;
    }
    let filled = filling.elapsed();

    // Measure: heartbeats go on; one caller places a session and ends it, over and over.
    let catalog_pids = replicas.as_ref().map(Replicas::pids).unwrap_or_default();
    let cpu_before = CpuTicks::now(&catalog_pids);
    let window_start = origin.elapsed();
    let measuring = Instant::now();
    let mut placements = Vec::new();
    let mut client = gateways[0].clone();
    let mut random = Random(7);
    while measuring.elapsed() < Duration::from_secs(args.seconds) {
        let environment = &environments[random.below(environments.len())];
        let (session, took) = place(&mut client, environment).await?;
        placements.push(took.as_secs_f64() * 1000.0);
        retrying(|| {
            let (mut client, request) = (
                client.clone(),
                pb::EndSessionRequest {
                    scope: session.scope.clone(),
                    id: session.id.clone(),
                },
            );
            async move { client.end_session(request).await }
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let window_end = origin.elapsed();
    let cpu_after = CpuTicks::now(&catalog_pids);
    stop.cancel();
    let mut beats = Vec::new();
    let mut offered = 0.0;
    for node in nodes {
        let (every, node_beats) = node.await??;
        offered += 1.0 / every.as_secs_f64();
        beats.extend(node_beats);
    }
    if let Some(replicas) = replicas {
        if args.keep_database {
            println!("database kept: {}", replicas.database_url);
        } else {
            replicas.stop().await?;
        }
    }

    let window = (window_end - window_start).as_secs_f64();
    let measured: Vec<&Beat> = beats
        .iter()
        .filter(|beat| beat.done >= window_start && beat.done < window_end)
        .collect();
    let succeeded: Vec<f64> = measured
        .iter()
        .filter(|beat| !beat.failed)
        .map(|beat| beat.latency.as_secs_f64() * 1000.0)
        .collect();
    let failed = measured.iter().filter(|beat| beat.failed).count();
    let whole = measured.iter().filter(|beat| beat.whole).count();

    println!("machine: {}", crate::machine());
    println!(
        "catalog: {} × {} on PostgreSQL; {} nodes × {} cached versions (of {} environments × 2 versions), churn {}",
        binary.display(),
        catalogs.len(),
        args.nodes,
        args.versions,
        args.environments,
        args.churn
    );
    println!(
        "seeded in {:.1} s; {} sessions placed in {:.1} s ({:.0}/s)",
        seeded.as_secs_f64(),
        args.sessions,
        filled.as_secs_f64(),
        args.sessions as f64 / filled.as_secs_f64()
    );
    println!(
        "| heartbeats, {window:.0} s | offered/s | sustained/s | p50 | p99 | max | whole sets | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} nodes | {offered:.0} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {whole} | {failed} |",
        args.nodes,
        succeeded.len() as f64 / window,
        percentile(&succeeded, 0.5),
        percentile(&succeeded, 0.99),
        percentile(&succeeded, 1.0),
    );
    // /proc counts CPU time in USER_HZ ticks, 100 a second on Linux whatever the kernel's HZ.
    let hertz = 100.0;
    let cores = |before: u64, after: u64| after.saturating_sub(before) as f64 / hertz / window;
    let busy = cores(cpu_before.busy, cpu_after.busy);
    let (nodes_cpu, catalogs_cpu, postgres_cpu) = (
        cores(cpu_before.nodes, cpu_after.nodes),
        cores(cpu_before.catalogs, cpu_after.catalogs),
        cores(cpu_before.postgres, cpu_after.postgres),
    );
    println!(
        "| CPU in the window, cores | nodes (this process) | catalogs | PostgreSQL | anything else | idle |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| | {nodes_cpu:.2} | {catalogs_cpu:.2} | {postgres_cpu:.2} | {:.2} | {:.2} |",
        (busy - nodes_cpu - catalogs_cpu - postgres_cpu).max(0.0),
        cores(cpu_before.idle, cpu_after.idle)
    );
    println!(
        "| placement at {} live sessions ({} scopes) | calls | p50 | p99 | max |",
        args.sessions, args.scopes
    );
    println!("|---|---|---|---|---|");
    println!(
        "| CreateSession | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
        placements.len(),
        percentile(&placements, 0.5),
        percentile(&placements, 0.99),
        percentile(&placements, 1.0),
    );
    Ok(())
}
