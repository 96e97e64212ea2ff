//! A split deployment as real `plinth` processes: any number of catalogs, source services,
//! gateways, builders and nodes, the catalog on SQLite or PostgreSQL
//! (`PLINTH_TEST_POSTGRES_URL`), blobs in a directory or on the S3 test server
//! (`PLINTH_TEST_S3_ENDPOINT`). Every process listens on port 0 and says where with
//! `--ready-file`; a restarted one listens where it did before.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use plinth_catalog::testing::{self, PostgresAvailability};

use crate::credentials::Credentials;
use crate::processes::Process;
use crate::waiting::eventually;

/// How long a process may take to listen and become ready.
const START_WITHIN: Duration = Duration::from_secs(60);

/// The roles a cluster runs, in the order it starts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Part {
    Catalog,
    Source,
    Gateway,
    Builder,
    Node,
}

impl Part {
    /// Every role, in the order a cluster starts them.
    pub(crate) const ALL: [Part; 5] = [
        Part::Catalog,
        Part::Source,
        Part::Gateway,
        Part::Builder,
        Part::Node,
    ];

    fn command(self) -> &'static str {
        match self {
            Part::Catalog => "catalog",
            Part::Source => "source",
            Part::Gateway => "gateway",
            Part::Builder => "builder",
            Part::Node => "node",
        }
    }
}

/// What a cluster is made of, before it starts ([`Cluster::builder`]).
pub(crate) struct ClusterBuilder {
    counts: BTreeMap<Part, usize>,
    postgres: bool,
    s3: bool,
    config: String,
    tokens: Option<String>,
    flags: BTreeMap<Part, Vec<String>>,
}

impl ClusterBuilder {
    /// `count` processes of `part` (one catalog, one source and one gateway by default).
    pub(crate) fn with(mut self, part: Part, count: usize) -> Self {
        self.counts.insert(part, count);
        self
    }

    /// The catalog and the source index on a fresh PostgreSQL database.
    pub(crate) fn postgres(mut self) -> Self {
        self.postgres = true;
        self
    }

    /// Blobs in a fresh bucket of the S3 test server.
    pub(crate) fn s3(mut self) -> Self {
        self.s3 = true;
        self
    }

    /// More of the configuration file every process reads (whole sections).
    pub(crate) fn config(mut self, toml: &str) -> Self {
        self.config.push_str(toml);
        self
    }

    /// The gateways' client tokens, as `PLINTH_TOKENS` takes them (`token=scope,…`).
    pub(crate) fn tokens(mut self, tokens: &str) -> Self {
        self.tokens = Some(tokens.to_owned());
        self
    }

    /// Flags added to every process of `part`.
    pub(crate) fn flags(mut self, part: Part, flags: &[&str]) -> Self {
        self.flags
            .entry(part)
            .or_default()
            .extend(flags.iter().map(|flag| (*flag).to_owned()));
        self
    }

    /// Starts every process, each once the ones it needs are ready; `None` when PostgreSQL or
    /// the S3 server was asked for and is not configured (outside CI only).
    pub(crate) async fn start(self) -> Option<Cluster> {
        let dir = tempfile::tempdir().expect("cluster dir");
        let database_url = if self.postgres {
            let PostgresAvailability::Available(server) = testing::postgres() else {
                return None;
            };
            Some(testing::fresh_postgres_database(&server).await)
        } else {
            None
        };
        let blob_url = if self.s3 {
            Some(crate::gc::fresh_bucket().await?)
        } else {
            None
        };
        let standalone = database_url.is_none() || blob_url.is_none();
        let blob_url =
            blob_url.unwrap_or_else(|| format!("file://{}", dir.path().join("blobs").display()));
        let count = |part| self.counts.get(&part).copied().unwrap_or(0);
        assert!(
            count(Part::Catalog) <= 1 || database_url.is_some(),
            "several catalogs share PostgreSQL: ask for it"
        );
        let config = dir.path().join("plinth.toml");
        std::fs::write(
            &config,
            format!("[builder]\nnetwork = false\n{}", self.config),
        )
        .expect("config");
        let mut cluster = Cluster {
            client: crate::helpers::http_client(),
            credentials: Credentials::new(),
            config,
            database_url,
            blob_url,
            standalone,
            tokens: self.tokens,
            flags: self.flags,
            members: Vec::new(),
            dir,
        };
        for part in Part::ALL {
            for _ in 0..count(part) {
                cluster.add(part, &[]).await;
            }
        }
        Some(cluster)
    }
}

/// Where a process started with `--ready-file` listens, by flag (`listen`, `admin_listen`,
/// …).
pub(crate) type Bound = BTreeMap<String, SocketAddr>;

/// Spawns `command` (a `plinth` service started on port 0, say) with `--ready-file
/// ready_file` added, and waits until it says where it listens. A process that exits first
/// fails the test, with `log` (its standard error, when the caller keeps it).
pub(crate) async fn spawn_reporting(
    command: &mut Command,
    ready_file: &Path,
    log: Option<&Path>,
) -> (Process, Bound) {
    let _ = std::fs::remove_file(ready_file);
    let mut process = Process(
        command
            .arg("--ready-file")
            .arg(ready_file)
            .spawn()
            .expect("spawn plinth"),
    );
    let bound = reported(&mut process, ready_file, log).await;
    (process, bound)
}

/// Waits until `process`, started with `--ready-file ready_file`, says where it listens. A
/// process that exits first fails the test, with `log` (its standard error, when the caller
/// keeps it).
pub(crate) async fn reported(
    process: &mut Process,
    ready_file: &Path,
    log: Option<&Path>,
) -> Bound {
    eventually(START_WITHIN, async || {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!(
                "plinth exited with {status} before listening:\n{}",
                log.and_then(|log| std::fs::read_to_string(log).ok())
                    .unwrap_or_default()
            );
        }
        let text = std::fs::read_to_string(ready_file).map_err(|error| error.to_string())?;
        serde_json::from_str::<Bound>(&text).map_err(|error| format!("{text:?}: {error}"))
    })
    .await
}

/// Spawns `command`, a `plinth` service given port 0 (or the addresses an earlier run
/// reported), and waits until it says where it listens and its `/readyz`, on the address of
/// `probe` (`listen` for a gateway or `serve`, `admin_listen` for the others), answers 200.
pub(crate) async fn spawn_ready(command: &mut Command, probe: &str) -> (Process, Bound) {
    let ready_file =
        std::env::temp_dir().join(format!("plinth-ready-{}", uuid::Uuid::new_v4().simple()));
    let (mut process, bound) = spawn_reporting(command, &ready_file, None).await;
    let _ = std::fs::remove_file(&ready_file);
    let address = bound
        .get(probe)
        .unwrap_or_else(|| panic!("no {probe} in {bound:?}"));
    crate::processes::wait_until_ready(
        &crate::helpers::http_client(),
        &format!("http://{address}/readyz"),
        &mut process,
    )
    .await;
    (process, bound)
}

/// [`spawn_ready`] for a `plinth serve` given `--listen`: it, and where it serves REST.
pub(crate) async fn spawn_serve(command: &mut Command) -> (Process, SocketAddr) {
    let (process, bound) = spawn_ready(command, "listen").await;
    (process, bound["listen"])
}

/// The loopback TCP addresses (IPv4) the process `pid` listens on, from `/proc`: for a
/// program of another project given port 0, which says nowhere which port it got.
pub(crate) fn listening_addresses_of(pid: u32) -> Vec<SocketAddr> {
    let sockets: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_str()?;
                    Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A: listening), inode.
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            if *state != "0A" || !sockets.contains(*inode) {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(SocketAddr::from((ip.to_le_bytes(), port)))
        })
        .collect()
}

/// Starts a catalog, a source service (asking that catalog what it keeps) and a gateway in
/// front of them, each on port 0 and each once the one before is ready. `spawn` starts `plinth` with the arguments it is given
/// (the role first) and what the test adds (`--standalone`, data directories, its
/// environment), and waits until it is ready at the address of the flag given
/// ([`spawn_ready`]). Answers the three processes and where each listens.
pub(crate) async fn start_trio(
    mut spawn: impl AsyncFnMut(Vec<String>, &'static str) -> (Process, Bound),
) -> (Vec<Process>, [Bound; 3]) {
    let port_zero = |role: &str| {
        [
            role,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (catalog_process, catalog) = spawn(port_zero("catalog"), "admin_listen").await;
    let mut source_args = port_zero("source");
    source_args.extend([
        "--catalog-url".to_owned(),
        format!("http://{}", catalog["listen"]),
    ]);
    let (source_process, source) = spawn(source_args, "admin_listen").await;
    let gateway_args = [
        "gateway".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--catalog-url".to_owned(),
        format!("http://{}", catalog["listen"]),
        "--source-url".to_owned(),
        format!("http://{}", source["listen"]),
    ];
    let (gateway_process, gateway) = spawn(gateway_args.to_vec(), "listen").await;
    (
        vec![catalog_process, source_process, gateway_process],
        [catalog, source, gateway],
    )
}

/// One process of a cluster.
pub(crate) struct Member {
    part: Part,
    name: String,
    args: Vec<String>,
    process: Option<Process>,
    bound: Bound,
}

impl Member {
    /// Its name (`catalog-1`, `node-2`, …): a node's and a builder's `--name`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Where it serves (gRPC, or REST for a gateway).
    pub(crate) fn listen(&self) -> SocketAddr {
        self.address("listen")
    }

    /// `http://` and [`Member::listen`].
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.listen())
    }

    /// Where it serves `/readyz` and `/metrics`.
    pub(crate) fn admin(&self) -> SocketAddr {
        self.address(if self.part == Part::Gateway {
            "listen"
        } else {
            "admin_listen"
        })
    }

    /// `http://` and [`Member::admin`].
    pub(crate) fn admin_url(&self) -> String {
        format!("http://{}", self.admin())
    }

    fn address(&self, flag: &str) -> SocketAddr {
        *self
            .bound
            .get(flag)
            .unwrap_or_else(|| panic!("{} reported no {flag}: {:?}", self.name, self.bound))
    }
}

/// A running split deployment ([`Cluster::builder`]); every process is killed when it drops.
pub(crate) struct Cluster {
    /// An HTTP client for tests.
    pub(crate) client: reqwest::Client,
    credentials: Credentials,
    config: PathBuf,
    database_url: Option<String>,
    blob_url: String,
    standalone: bool,
    tokens: Option<String>,
    flags: BTreeMap<Part, Vec<String>>,
    members: Vec<Member>,
    // Last: the processes stop before their directories go.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// One catalog, one source service and one gateway, on SQLite and a blob directory.
    pub(crate) fn builder() -> ClusterBuilder {
        ClusterBuilder {
            counts: [(Part::Catalog, 1), (Part::Source, 1), (Part::Gateway, 1)]
                .into_iter()
                .collect(),
            postgres: false,
            s3: false,
            config: String::new(),
            tokens: None,
            flags: BTreeMap::new(),
        }
    }

    /// The credentials every process has (one per role).
    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The directory every process keeps its data under (`<name>/`), logs (`<name>.log`) too.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `index`th process of `part` (from 0).
    pub(crate) fn get(&self, part: Part, index: usize) -> &Member {
        self.members
            .iter()
            .filter(|member| member.part == part)
            .nth(index)
            .unwrap_or_else(|| panic!("no {part:?} {index}"))
    }

    /// The process named `name` (`catalog-1`, `node-2`, …).
    pub(crate) fn named(&self, name: &str) -> &Member {
        self.members
            .iter()
            .find(|member| member.name == name)
            .unwrap_or_else(|| panic!("no process {name}"))
    }

    /// The first gateway's URL.
    pub(crate) fn base(&self) -> String {
        self.get(Part::Gateway, 0).url()
    }

    /// The catalog URLs, comma-separated, as `--catalog-url` takes them.
    pub(crate) fn catalog_urls(&self) -> String {
        self.urls(Part::Catalog)
    }

    /// The source service URLs, comma-separated, as `--source-url` takes them.
    pub(crate) fn source_urls(&self) -> String {
        self.urls(Part::Source)
    }

    fn urls(&self, part: Part) -> String {
        self.members
            .iter()
            .filter(|member| member.part == part)
            .map(Member::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A process's log (its standard error).
    pub(crate) fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// Starts one more process of `part`, with `flags` added to its command line (over the
    /// cluster's own: `--catalog-url` names every catalog unless `flags` names some), and
    /// waits until it is ready; answers it.
    pub(crate) async fn add(&mut self, part: Part, flags: &[&str]) -> &Member {
        self.launch(part, flags, true).await
    }

    /// [`Cluster::add`] without waiting for its `/readyz`: it listens, and may never be ready
    /// (a node cut off from its catalog, say).
    pub(crate) async fn add_unready(&mut self, part: Part, flags: &[&str]) -> &Member {
        self.launch(part, flags, false).await
    }

    async fn launch(&mut self, part: Part, flags: &[&str], ready: bool) -> &Member {
        let index = self
            .members
            .iter()
            .filter(|member| member.part == part)
            .count();
        let name = format!("{}-{}", part.command(), index + 1);
        // Flags the cluster gives unless `flags` or the cluster's flags for `part` give them.
        let mut defaults: Vec<(&str, String)> = Vec::new();
        if part != Part::Gateway {
            defaults.push((
                "--data-dir",
                self.dir.path().join(&name).display().to_string(),
            ));
        }
        if part != Part::Builder {
            defaults.push(("--listen", "127.0.0.1:0".to_owned()));
        }
        if part != Part::Gateway {
            defaults.push(("--admin-listen", "127.0.0.1:0".to_owned()));
        }
        if let Some(url) = &self.database_url
            && matches!(part, Part::Catalog | Part::Source)
        {
            defaults.push(("--database-url", url.clone()));
        }
        if matches!(part, Part::Source | Part::Builder | Part::Node) {
            defaults.push(("--blob-url", self.blob_url.clone()));
        }
        let (catalogs, sources) = (self.catalog_urls(), self.source_urls());
        if matches!(
            part,
            Part::Source | Part::Gateway | Part::Builder | Part::Node
        ) && !catalogs.is_empty()
        {
            defaults.push(("--catalog-url", catalogs));
        }
        if matches!(part, Part::Gateway | Part::Builder) && !sources.is_empty() {
            defaults.push(("--source-url", sources));
        }
        if matches!(part, Part::Builder | Part::Node) {
            defaults.push(("--name", name.clone()));
        }
        let given: Vec<String> = self
            .flags
            .get(&part)
            .into_iter()
            .flatten()
            .cloned()
            .chain(flags.iter().map(|flag| (*flag).to_owned()))
            .collect();
        let mut args: Vec<String> = vec![part.command().to_owned()];
        if self.standalone && part != Part::Gateway {
            args.push("--standalone".to_owned());
        }
        for (flag, value) in defaults {
            if !given.iter().any(|arg| arg == flag) {
                args.extend([flag.to_owned(), value]);
            }
        }
        args.extend(given);
        let mut member = Member {
            part,
            name,
            args,
            process: None,
            bound: BTreeMap::new(),
        };
        self.run(&mut member, ready).await;
        self.members.push(member);
        self.members.last().expect("just added")
    }

    /// Kills the process named `name` (`SIGKILL`: no goodbye to anyone) and waits for it to
    /// exit.
    pub(crate) fn kill(&mut self, name: &str) {
        let member = self.member_mut(name);
        let mut process = member
            .process
            .take()
            .unwrap_or_else(|| panic!("{name} runs"));
        process.0.kill().expect("kill");
        process.0.wait().expect("reaped");
    }

    /// Stops the process named `name` as an operator would (`SIGTERM`) and waits for it to
    /// exit.
    pub(crate) fn stop(&mut self, name: &str) -> std::process::ExitStatus {
        let member = self.member_mut(name);
        let mut process = member
            .process
            .take()
            .unwrap_or_else(|| panic!("{name} runs"));
        let status = Command::new("kill")
            .args(["-TERM", &process.0.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        process.0.wait().expect("reaped")
    }

    /// Starts the stopped or killed process named `name` again, on the addresses it had, and
    /// waits until it is ready.
    pub(crate) async fn restart(&mut self, name: &str) -> &Member {
        let index = self
            .members
            .iter()
            .position(|member| member.name == name)
            .unwrap_or_else(|| panic!("no process {name}"));
        let mut member = self.members.remove(index);
        assert!(member.process.is_none(), "{name} is still running");
        for flag in ["listen", "admin_listen"] {
            if let Some(address) = member.bound.get(flag) {
                let at = member
                    .args
                    .iter()
                    .position(|arg| *arg == format!("--{}", flag.replace('_', "-")))
                    .expect("the flag it was started with");
                member.args[at + 1] = address.to_string();
            }
        }
        self.run(&mut member, true).await;
        self.members.insert(index, member);
        &self.members[index]
    }

    /// Whether the process named `name` has exited (fails the test if it has, with its log).
    pub(crate) fn assert_running(&mut self, name: &str) {
        let log = self.log(name);
        let member = self.member_mut(name);
        let process = member
            .process
            .as_mut()
            .unwrap_or_else(|| panic!("{name} runs"));
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!(
                "{name} exited with {status}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }

    fn member_mut(&mut self, name: &str) -> &mut Member {
        self.members
            .iter_mut()
            .find(|member| member.name == name)
            .unwrap_or_else(|| panic!("no process {name}"))
    }

    /// Spawns `member` with a ready file, reads where it listens, and waits for its `/readyz`.
    async fn run(&self, member: &mut Member, ready: bool) {
        let ready_file = self.dir.path().join(format!("{}.ready", member.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(&member.name))
            .expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
        crate::credentials::apply(&mut command, &self.credentials, member.part.command());
        command
            .args(&member.args)
            .env("PLINTH_CONFIG", &self.config)
            .env("PLINTH_LOG", "info")
            .env("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)
            .env_remove("PLINTH_TOKENS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let (Part::Gateway, Some(tokens)) = (member.part, &self.tokens) {
            command.env("PLINTH_TOKENS", tokens);
        }
        let log = self.log(&member.name);
        let (process, bound) = spawn_reporting(&mut command, &ready_file, Some(&log)).await;
        member.bound = bound;
        member.process = Some(process);
        if !ready {
            return;
        }
        let readyz = format!("{}/readyz", member.admin_url());
        let client = &self.client;
        eventually(START_WITHIN, async || {
            if let Some(Ok(Some(status))) = member.process.as_mut().map(|p| p.0.try_wait()) {
                panic!(
                    "{} exited with {status}:\n{}",
                    member.name,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let response = client
                .get(&readyz)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            match response.status().as_u16() {
                200 => Ok(()),
                status => Err(format!(
                    "{readyz}: {status} {}",
                    response.text().await.unwrap_or_default()
                )),
            }
        })
        .await;
    }
}

/// An address where a server hangs up on every connection: a catalog or a blob store that
/// cannot be reached, for as long as the test runs.
pub(crate) fn hanging_up() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    address
}

/// Every role started with port 0 says where it listens, and answers there.
#[tokio::test]
async fn every_role_started_on_port_zero_reports_addresses_that_answer() {
    if !crate::helpers::can_build() {
        return;
    }
    let cluster = Cluster::builder()
        .with(Part::Builder, 1)
        .with(Part::Node, 1)
        .flags(Part::Node, &["--insecure-no-isolation"])
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    for part in Part::ALL {
        let member = cluster.get(part, 0);
        let admin = member.admin();
        assert_ne!(admin.port(), 0, "{}", member.name());
        let response = cluster
            .client
            .get(format!("{}/readyz", member.admin_url()))
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status(), 200, "{}", member.name());
        if part != Part::Builder {
            assert_ne!(member.listen().port(), 0, "{}", member.name());
            tokio::net::TcpStream::connect(member.listen())
                .await
                .unwrap_or_else(|error| panic!("{}: {error}", member.name()));
        }
    }
}

/// `plinth serve` given port 0 says where it listens, and answers there.
#[tokio::test]
async fn serve_started_on_port_zero_reports_an_address_that_answers() {
    let dir = tempfile::tempdir().expect("dir");
    let ready_file = dir.path().join("ready.json");
    let data_dir = dir.path().join("data");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .env("PLINTH_LOG", "warn")
        .env("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_TOKENS")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let (_process, bound) = spawn_reporting(&mut command, &ready_file, None).await;
    for flag in ["listen", "catalog_listen", "source_listen"] {
        let address = bound[flag];
        assert_ne!(address.port(), 0, "{flag}: {bound:?}");
        tokio::net::TcpStream::connect(address)
            .await
            .unwrap_or_else(|error| panic!("{flag} {address}: {error}"));
    }
    let answer = crate::helpers::http_client()
        .get(format!("http://{}/healthz", bound["listen"]))
        .send()
        .await
        .expect("the gateway answers");
    assert!(answer.status().as_u16() < 500, "{}", answer.status());
}

/// A cluster on PostgreSQL and the S3 test server keeps a file across a source service
/// stopped and started again on its address.
#[tokio::test]
async fn a_cluster_on_postgres_and_s3_keeps_a_file_across_a_source_restart() {
    let Some(mut cluster) = Cluster::builder().postgres().s3().start().await else {
        return;
    };
    let base = cluster.base();
    let client = cluster.client.clone();
    let id = crate::helpers::create_environment_at(&client, &base, "On S3").await;
    let file = format!("{base}/v1/environments/{id}/files/notes.txt");
    let (status, written) = crate::helpers::send(client.put(&file).body("kept\n")).await;
    assert_eq!(status, 200, "{written}");
    let before = cluster.named("source-1").listen();
    assert!(cluster.stop("source-1").success());
    assert_eq!(cluster.restart("source-1").await.listen(), before);
    let read = eventually(Duration::from_secs(10), async || {
        let response = client.get(&file).send().await;
        match response {
            Ok(response) if response.status() == 200 => {
                response.text().await.map_err(|e| e.to_string())
            }
            Ok(response) => Err(response.status().to_string()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    assert_eq!(read, "kept\n");
}
