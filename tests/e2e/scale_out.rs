//! Two of every service as real processes on one PostgreSQL and one S3-protocol store, each
//! client given every catalog and source replica and no balancer in between. A workload of
//! file writes, builds and sessions runs through both gateways while one catalog, one
//! builder, one node and one source are killed with SIGKILL in turn. The test reports the
//! failed requests of each kill and the takeover of the killed builder's build, and asserts
//! what users rely on: every acknowledged write is still there, no build stays stuck beyond
//! its lease, every kill is over for the workload within seconds, and no session is placed
//! on the dead node once its heartbeat is late.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plinth_catalog::testing::{self, PostgresAvailability};
use serde_json::{Value, json};

use crate::credentials::Credentials;
use crate::helpers::send;
use crate::processes::{Process, plinth_command, wait_until_ready};

/// How long after its last heartbeat a node gets no new sessions (`catalog.node_ttl_ms`).
const NODE_TTL: Duration = Duration::from_secs(3);
/// A build's lease (`catalog.build_lease_seconds`, the default).
const BUILD_LEASE: Duration = Duration::from_secs(6);
/// How long the workload runs after each kill before the next.
const PHASE: Duration = Duration::from_secs(10);
/// The end of each phase in which no request may fail: the kill is over by then.
const QUIET_TAIL: Duration = Duration::from_secs(3);

/// One request of the workload, as its client saw it.
struct Outcome {
    /// When it was sent.
    at: Instant,
    kind: &'static str,
    ok: bool,
    what: String,
    /// The longest any one of its requests waited for its answer, and which.
    slowest: (Duration, &'static str),
}

#[derive(Default)]
pub(crate) struct Log(Mutex<Vec<Outcome>>);

impl Log {
    /// A request of one call, answered now.
    fn record(&self, sent: Instant, kind: &'static str, ok: bool, what: String) {
        self.record_slowest(sent, kind, ok, what, (sent.elapsed(), kind));
    }

    fn record_slowest(
        &self,
        sent: Instant,
        kind: &'static str,
        ok: bool,
        what: String,
        slowest: (Duration, &'static str),
    ) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Outcome {
                at: sent,
                kind,
                ok,
                what,
                slowest,
            });
    }

    /// Requests sent in `[from, to)` of which one call waited `bound` or longer.
    pub(crate) fn slower_than(&self, from: Instant, to: Instant, bound: Duration) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|outcome| outcome.at >= from && outcome.at < to && outcome.slowest.0 >= bound)
            .map(|outcome| {
                format!(
                    "{} ({} took {:.1} s): {}",
                    outcome.kind,
                    outcome.slowest.1,
                    outcome.slowest.0.as_secs_f64(),
                    outcome.what
                )
            })
            .collect()
    }

    /// Requests sent in `[from, to)`, how many failed, and what failed.
    pub(crate) fn count(&self, from: Instant, to: Instant) -> (usize, usize, Vec<String>) {
        let outcomes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let within: Vec<&Outcome> = outcomes
            .iter()
            .filter(|outcome| outcome.at >= from && outcome.at < to)
            .collect();
        let failed: Vec<String> = within
            .iter()
            .filter(|outcome| !outcome.ok)
            .map(|outcome| format!("{}: {}", outcome.kind, outcome.what))
            .collect();
        (within.len(), failed.len(), failed)
    }
}

/// A service process and what it is called in the report.
pub(crate) struct Service {
    name: String,
    process: Process,
}

/// `psql -At -c <sql>` against the deployment's database: the catalog's own record of where
/// things ran.
pub(crate) fn psql(database_url: &str, sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([database_url, "-At", "-c", sql])
        .output()
        .expect("psql (PostgreSQL's client) runs");
    assert!(
        output.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

pub(crate) fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}

fn spawn(args: &[&str], credentials: &Credentials, log: &Path, tokens: Option<&str>) -> Process {
    Process(
        command(args, credentials, log, tokens)
            .spawn()
            .expect("spawn plinth"),
    )
}

/// The command [`spawn`] runs: its output appended to `log`, client `tokens` for a gateway.
fn command(
    args: &[&str],
    credentials: &Credentials,
    log: &Path,
    tokens: Option<&str>,
) -> std::process::Command {
    let mut command = plinth_command(args, credentials);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    command.stdout(file.try_clone().expect("log")).stderr(file);
    if let Some(tokens) = tokens {
        command.env("PLINTH_TOKENS", tokens);
    }
    command
}

/// [`spawn`] on port 0 (`args` say so), once it has said where it listens and its `/readyz`,
/// at `probe`'s address, answers 200: it, and where it listens.
async fn spawn_ready(
    args: &[&str],
    credentials: &Credentials,
    log: &Path,
    tokens: Option<&str>,
    probe: &str,
) -> (Process, crate::cluster::Bound) {
    let mut command = command(args, credentials, log, tokens);
    let ready_file = log.with_file_name(format!("{}.ready", uuid::Uuid::new_v4().simple()));
    let (mut process, bound) =
        crate::cluster::spawn_reporting(&mut command, &ready_file, Some(log)).await;
    let client = crate::helpers::http_client();
    wait_until_ready(
        &client,
        &format!("http://{}/readyz", bound[probe]),
        &mut process,
    )
    .await;
    (process, bound)
}

fn urls(addresses: &[SocketAddr]) -> String {
    addresses
        .iter()
        .map(|address| format!("http://{address}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn kill(service: &mut Service) {
    // SIGKILL: no goodbye, no lease given back, connections reset.
    let _ = service.process.0.kill();
    let _ = service.process.0.wait();
}

/// Two of every service as processes on one database and one blob store.
pub(crate) struct Fleet {
    pub(crate) services: Vec<Service>,
    pub(crate) gateways: [SocketAddr; 2],
    /// The nodes' admin listeners (`/readyz`).
    pub(crate) node_admins: Vec<SocketAddr>,
    pub(crate) client: reqwest::Client,
    /// Where the catalogs' records are, for the test to read.
    pub(crate) database_url: String,
    log: std::path::PathBuf,
    /// The environments of the workload: file writes, sessions (built once), builds.
    pub(crate) writes: String,
    pub(crate) sessions: String,
    pub(crate) builds: String,
    _data: tempfile::TempDir,
}

impl Fleet {
    /// Everything the services logged.
    pub(crate) fn services_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The gateway of request `n`, alternating.
    pub(crate) fn base(&self, n: usize) -> String {
        format!("http://{}", self.gateways[n % 2])
    }
}

/// What a fleet test needs, when this machine has it (under CI it must, see `can_build`,
/// `testing::postgres` and `gc::fresh_bucket`): a fresh PostgreSQL database and a fresh bucket.
pub(crate) async fn fleet_stores() -> Option<(String, String)> {
    if !crate::helpers::can_build() {
        return None;
    }
    let PostgresAvailability::Available(server) = testing::postgres() else {
        return None;
    };
    let blob_url = crate::gc::fresh_bucket().await?;
    Some((testing::fresh_postgres_database(&server).await, blob_url))
}

/// Starts two of every service: catalog `i` on `catalog_databases[i]` (the same database,
/// reached directly or through a test's forwarder), sources and the rest on `database_url`,
/// every service on `blob_url`, and `config_extra` added to their configuration file; makes the
/// workload's environments and builds the sessions' one. Node `i` advertises the URL of
/// `node_fronts[i]`, if given (a test's forwarder in front of it), and sets its upstream to
/// where the node listens. Every service listens on port 0.
pub(crate) async fn start_fleet(
    database_url: &str,
    catalog_databases: [&str; 2],
    blob_url: &str,
    config_extra: &str,
    node_fronts: [Option<(Arc<std::sync::OnceLock<SocketAddr>>, String)>; 2],
) -> Fleet {
    let blob_url = blob_url.to_owned();
    let credentials = Credentials::new();
    let data = tempfile::tempdir().expect("data");
    let log = data.path().join("services.log");
    let config = data.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!("[builder]\nnetwork = false\n{config_extra}"),
    )
    .expect("config");
    let config = config.to_str().expect("utf-8").to_owned();
    let dir = |name: &str| {
        let path = data.path().join(name);
        std::fs::create_dir_all(&path).expect("dir");
        path.to_str().expect("utf-8").to_owned()
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("client");

    let mut services: Vec<Service> = Vec::new();
    let mut catalogs = Vec::new();
    for (index, database) in catalog_databases.iter().enumerate() {
        let (process, bound) = spawn_ready(
            &[
                "catalog",
                "--config",
                &config,
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--database-url",
                database,
            ],
            &credentials,
            &log,
            None,
            "admin_listen",
        )
        .await;
        catalogs.push(bound["listen"]);
        services.push(Service {
            name: format!("catalog-{}", index + 1),
            process,
        });
    }
    let catalog_urls = urls(&catalogs);
    let mut sources = Vec::new();
    for index in 0..2 {
        let (process, bound) = spawn_ready(
            &[
                "source",
                "--config",
                &config,
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--database-url",
                database_url,
                "--blob-url",
                &blob_url,
                "--data-dir",
                &dir(&format!("source-{}", index + 1)),
                "--catalog-url",
                &catalog_urls,
            ],
            &credentials,
            &log,
            None,
            "admin_listen",
        )
        .await;
        sources.push(bound["listen"]);
        services.push(Service {
            name: format!("source-{}", index + 1),
            process,
        });
    }
    let source_urls = urls(&sources);
    for index in 0..2 {
        let name = format!("builder-{}", index + 1);
        let process = spawn(
            &[
                "builder",
                "--config",
                &config,
                "--name",
                &name,
                "--catalog-url",
                &catalog_urls,
                "--source-url",
                &source_urls,
                "--blob-url",
                &blob_url,
                "--data-dir",
                &dir(&name),
            ],
            &credentials,
            &log,
            None,
        );
        services.push(Service { name, process });
    }
    let mut node_admins = Vec::new();
    for (index, front) in node_fronts.iter().enumerate() {
        let name = format!("node-{}", index + 1);
        let data_dir = dir(&name);
        let mut args = vec![
            "node",
            "--config",
            &config,
            "--name",
            &name,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--catalog-url",
            &catalog_urls,
            "--blob-url",
            &blob_url,
            "--data-dir",
            &data_dir,
        ];
        if let Some((_, advertise)) = front {
            args.extend(["--advertise-url", advertise.as_str()]);
        }
        let mut command = command(&args, &credentials, &log, None);
        let ready_file = data.path().join(format!("{name}.ready"));
        let (mut process, bound) =
            crate::cluster::spawn_reporting(&mut command, &ready_file, Some(&log)).await;
        // The front forwards to the node once it knows where the node listens.
        if let Some((upstream, _)) = front {
            upstream.set(bound["listen"]).expect("set once");
        }
        let admin = bound["admin_listen"];
        node_admins.push(admin);
        wait_until_ready(&client, &format!("http://{admin}/readyz"), &mut process).await;
        services.push(Service { name, process });
    }
    let mut gateways = Vec::new();
    for index in 0..2 {
        let (process, bound) = spawn_ready(
            &[
                "gateway",
                "--config",
                &config,
                "--listen",
                "127.0.0.1:0",
                "--catalog-url",
                &catalog_urls,
                "--source-url",
                &source_urls,
            ],
            &credentials,
            &log,
            Some("tok-acme=acme"),
            "listen",
        )
        .await;
        gateways.push(bound["listen"]);
        services.push(Service {
            name: format!("gateway-{}", index + 1),
            process,
        });
    }
    let gateways: [SocketAddr; 2] = [gateways[0], gateways[1]];
    let base = |index: usize| format!("http://{}", gateways[index % 2]);

    // An environment for writes, one for sessions (built once), one for builds (each build
    // sleeps in setup.sh, so a builder killed mid-build is holding one).
    let mut ids = Vec::new();
    for name in ["writes", "sessions", "builds"] {
        let (status, created) = send(
            client
                .post(format!("{}/v1/environments", base(0)))
                .bearer_auth("tok-acme")
                .json(&json!({ "name": name })),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        ids.push(created["id"].as_str().expect("id").to_owned());
    }
    let (writes, sessions, builds) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    for (id, path, body) in [
        (&sessions, "run.py", "print('hi')\n"),
        (&builds, "setup.sh", "sleep 3\n"),
    ] {
        let (status, answer) = send(
            client
                .put(format!("{}/v1/environments/{id}/files/{path}", base(0)))
                .bearer_auth("tok-acme")
                .body(body),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, queued) = send(
        client
            .post(format!("{}/v1/environments/{sessions}/build", base(0)))
            .bearer_auth("tok-acme"),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, build) = send(
            client
                .get(format!("{}/v1/environments/{sessions}/builds/1", base(1)))
                .bearer_auth("tok-acme"),
        )
        .await;
        if build["status"] == "ready" {
            break;
        }
        assert_ne!(build["status"], "failed", "{build}");
        assert!(
            Instant::now() < deadline,
            "the first build did not end: {build}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Fleet {
        services,
        gateways,
        node_admins,
        client,
        database_url: database_url.to_owned(),
        log,
        writes,
        sessions,
        builds,
        _data: data,
    }
}

/// File writes, session rounds and builds through both gateways until stopped, each request's
/// outcome logged by when it started.
pub(crate) struct Workload {
    pub(crate) outcomes: Arc<Log>,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<BTreeMap<String, String>>>,
    build_ends: Arc<Mutex<Vec<(u64, Value)>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    pub(crate) fn start(fleet: &Fleet) -> Workload {
        let (client, gateways) = (fleet.client.clone(), fleet.gateways);
        let (writes, sessions, builds) = (
            fleet.writes.clone(),
            fleet.sessions.clone(),
            fleet.builds.clone(),
        );
        let outcomes = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let mut workers = Vec::new();
        {
            let (client, outcomes, stop, acknowledged, writes) = (
                client.clone(),
                outcomes.clone(),
                stop.clone(),
                acknowledged.clone(),
                writes.clone(),
            );
            workers.push(plinth_kit::tasks::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (path, body) = (format!("w/{n}.txt"), format!("write {n}\n"));
                    let sent = Instant::now();
                    let url = format!(
                        "http://{}/v1/environments/{writes}/files/{path}",
                        gateways[n % 2]
                    );
                    let answer = client
                        .put(url)
                        .bearer_auth("tok-acme")
                        .body(body.clone())
                        .send()
                        .await;
                    match answer {
                        Ok(response) if response.status() == 200 => {
                            acknowledged
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .insert(path, body);
                            outcomes.record(sent, "write", true, String::new());
                        }
                        Ok(response) => {
                            let status = response.status();
                            let text = response.text().await.unwrap_or_default();
                            outcomes.record(sent, "write", false, format!("{status} {text}"));
                        }
                        Err(error) => outcomes.record(sent, "write", false, error.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }));
        }
        {
            let (client, outcomes, stop, sessions) = (
                client.clone(),
                outcomes.clone(),
                stop.clone(),
                sessions.clone(),
            );
            workers.push(plinth_kit::tasks::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let base = format!("http://{}", gateways[n % 2]);
                    let sent = Instant::now();
                    let mut slowest = (Duration::ZERO, "create");
                    let result = session_round(&client, &base, &sessions, &mut slowest).await;
                    outcomes.record_slowest(
                        sent,
                        "session",
                        result.is_ok(),
                        result.err().unwrap_or_default(),
                        slowest,
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        let build_ends: Arc<Mutex<Vec<(u64, Value)>>> = Arc::default();
        {
            let (client, outcomes, stop, builds, build_ends) = (
                client.clone(),
                outcomes.clone(),
                stop.clone(),
                builds.clone(),
                build_ends.clone(),
            );
            workers.push(plinth_kit::tasks::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let base = format!("http://{}", gateways[n % 2]);
                    // A change, so each build installs rather than finds its source built.
                    let _ = client
                        .put(format!("{base}/v1/environments/{builds}/files/stamp.txt"))
                        .bearer_auth("tok-acme")
                        .body(format!("{n}\n"))
                        .send()
                        .await;
                    let sent = Instant::now();
                    let queued = client
                        .post(format!("{base}/v1/environments/{builds}/build"))
                        .bearer_auth("tok-acme")
                        .send()
                        .await;
                    let version = match queued {
                        Ok(response) if response.status() == 202 => {
                            let body: Value = response.json().await.unwrap_or_default();
                            outcomes.record(sent, "build", true, String::new());
                            body["version"].as_u64()
                        }
                        Ok(response) => {
                            let status = response.status();
                            let text = response.text().await.unwrap_or_default();
                            outcomes.record(sent, "build", false, format!("{status} {text}"));
                            None
                        }
                        Err(error) => {
                            outcomes.record(sent, "build", false, error.to_string());
                            None
                        }
                    };
                    let Some(version) = version else {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    };
                    // Followed to its end through either gateway (polls are not the workload).
                    loop {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let base = format!("http://{}", gateways[n % 2]);
                        n += 1;
                        let Ok(response) = client
                            .get(format!("{base}/v1/environments/{builds}/builds/{version}"))
                            .bearer_auth("tok-acme")
                            .send()
                            .await
                        else {
                            continue;
                        };
                        let build: Value = response.json().await.unwrap_or_default();
                        if build["status"] == "ready" || build["status"] == "failed" {
                            build_ends
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push((version, build));
                            break;
                        }
                    }
                }
            }));
        }
        Workload {
            outcomes,
            stop,
            acknowledged,
            build_ends,
            workers,
        }
    }

    /// Stops the workload; asserts that every acknowledged write reads back through the
    /// other gateway and that every build followed to its end is ready; answers those builds.
    pub(crate) async fn finish(self, fleet: &Fleet) -> Vec<(u64, Value)> {
        let Workload {
            outcomes: _,
            stop,
            acknowledged,
            build_ends,
            workers,
        } = self;
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let _ = tokio::time::timeout(Duration::from_secs(60), worker).await;
        }
        let (client, writes) = (&fleet.client, &fleet.writes);
        let base = |n: usize| fleet.base(n);
        // Every acknowledged write is there, read through the other gateway.
        let acknowledged = acknowledged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        assert!(
            acknowledged.len() > 50,
            "{} writes acknowledged",
            acknowledged.len()
        );
        for (path, body) in &acknowledged {
            let response = client
                .get(format!("{}/v1/environments/{writes}/files/{path}", base(1)))
                .bearer_auth("tok-acme")
                .send()
                .await
                .expect("read back");
            assert_eq!(
                response.status(),
                200,
                "{path} was acknowledged and is gone"
            );
            assert_eq!(&response.text().await.expect("body"), body, "{path}");
        }
        // Every build that was followed to its end is ready, the one the killed builder held
        // included.
        let ends = build_ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for (version, build) in &ends {
            assert_eq!(build["status"], "ready", "build {version}: {build}");
        }
        ends
    }
}

#[tokio::test]
async fn two_of_everything_survive_a_kill_of_each_with_no_acknowledged_write_lost() {
    let Some((database_url, blob_url)) = fleet_stores().await else {
        return;
    };
    let mut fleet = start_fleet(
        &database_url,
        [&database_url, &database_url],
        &blob_url,
        "",
        [None, None],
    )
    .await;
    let workload = Workload::start(&fleet);
    let outcomes = workload.outcomes.clone();
    let builds = fleet.builds.clone();
    let services = &mut fleet.services;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut report: Vec<String> = Vec::new();
    let find = |services: &[Service], name: &str| -> usize {
        services
            .iter()
            .position(|service| service.name == name)
            .expect("a service of that name")
    };

    // 1. A catalog.
    let index = find(services, "catalog-1");
    kill(&mut services[index]);
    let killed = Instant::now();
    tokio::time::sleep(PHASE).await;
    let catalog_phase = phase(&outcomes, &mut report, "catalog-1", killed);

    // 2. The builder holding a build, mid-build.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (version, holder) = loop {
        let running = psql(
            &database_url,
            &format!(
                "SELECT version, builder FROM builds WHERE environment_id = '{builds}' AND status = 'building' AND builder <> '' AND started_at_ms < {}",
                now_ms() - 500
            ),
        );
        if let Some((version, builder)) =
            running.lines().next().and_then(|line| line.split_once('|'))
        {
            break (version.to_owned(), builder.to_owned());
        }
        assert!(
            Instant::now() < deadline,
            "no build was running on a builder within 30 s: builds {:?}, failures {:?}\n{}",
            psql(
                &database_url,
                &format!(
                    "SELECT version, status, builder, error FROM builds WHERE environment_id = '{builds}'"
                )
            ),
            outcomes
                .count(Instant::now() - Duration::from_secs(3600), Instant::now())
                .2,
            fleet.services_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let index = find(services, &holder);
    kill(&mut services[index]);
    let killed = Instant::now();
    let takeover = loop {
        let now = psql(
            &database_url,
            &format!(
                "SELECT status, builder FROM builds WHERE environment_id = '{builds}' AND version = {version}"
            ),
        );
        let (status, builder) = now.split_once('|').unwrap_or((&now, ""));
        if (status == "building" && builder != holder) || status == "ready" || status == "failed" {
            break killed.elapsed();
        }
        assert!(
            // A takeover by default stays under 10 s. Under the full suite's load
            // on 2 cores, takeovers here took 4.9 to 9.1 s with the 6 s lease.
            killed.elapsed() < BUILD_LEASE + Duration::from_secs(4),
            "build {version} was still held by the killed {holder} {:?} after the kill (lease {BUILD_LEASE:?}): {now}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let rest = PHASE.saturating_sub(killed.elapsed());
    tokio::time::sleep(rest).await;
    let builder_phase = phase(&outcomes, &mut report, &holder, killed);
    report.push(format!(
        "  its build {version} was taken over {:.1} s after the kill (lease {BUILD_LEASE:?})",
        takeover.as_secs_f64()
    ));

    // 3. A node.
    let index = find(services, "node-1");
    kill(&mut services[index]);
    let killed = Instant::now();
    let killed_ms = now_ms();
    tokio::time::sleep(PHASE).await;
    let node_phase = phase(&outcomes, &mut report, "node-1", killed);
    let placed_after_ttl = psql(
        &database_url,
        &format!(
            "SELECT count(*) FROM sessions s JOIN nodes n ON s.node_id = n.id WHERE n.name = 'node-1' AND s.created_at_ms > {}",
            killed_ms + i64::try_from(NODE_TTL.as_millis()).expect("fits") + 1000
        ),
    );
    let placed_on_live = psql(
        &database_url,
        &format!(
            "SELECT count(*) FROM sessions s JOIN nodes n ON s.node_id = n.id WHERE n.name = 'node-2' AND s.created_at_ms > {killed_ms}"
        ),
    );

    // 4. A source service.
    let index = find(services, "source-1");
    kill(&mut services[index]);
    let killed = Instant::now();
    tokio::time::sleep(PHASE).await;
    let source_phase = phase(&outcomes, &mut report, "source-1", killed);

    let total = outcomes.count(Instant::now() - Duration::from_secs(3600), Instant::now());
    let ends = workload.finish(&fleet).await;
    report.push(format!(
        "workload: {} requests, {} failed; sessions after the node kill: {placed_on_live} on node-2",
        total.0, total.1
    ));
    // The figures, for the table in docs/design/measured.md.
    println!("{}", report.join("\n"));
    assert!(ends.len() >= 3, "{} builds ended", ends.len());
    assert!(
        ends.iter().any(|(v, _)| v.to_string() == version),
        "the killed builder's build {version} never ended: {ends:?}"
    );
    assert_eq!(
        placed_after_ttl, "0",
        "sessions were placed on the dead node after its TTL"
    );
    assert_ne!(
        placed_on_live, "0",
        "no session ran after the node was killed"
    );
    for (name, (tail_failed, tail_what)) in [
        ("catalog", catalog_phase),
        ("builder", builder_phase),
        ("node", node_phase),
        ("source", source_phase),
    ] {
        assert_eq!(
            tail_failed,
            0,
            "requests still failed in the last {QUIET_TAIL:?} of the {name} kill's phase: {tail_what:?}\n{}",
            report.join("\n")
        );
    }
}

/// What the workload saw in the phase after a kill at `killed_at`: failures in all, and in
/// the phase's quiet tail (with what failed); the phase's line goes into `report`.
fn phase(
    outcomes: &Log,
    report: &mut Vec<String>,
    name: &str,
    killed_at: Instant,
) -> (usize, Vec<String>) {
    let (requests, failed, what) = outcomes.count(killed_at, killed_at + PHASE);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for failure in &what {
        let short: String = failure.chars().take(160).collect();
        *kinds.entry(short).or_default() += 1;
    }
    for (failure, count) in &kinds {
        println!("  after kill -9 {name}: {count} × {failure}");
    }
    let (_, tail_failed, tail_what) =
        outcomes.count(killed_at + PHASE - QUIET_TAIL, killed_at + PHASE);
    let line = format!(
        "kill -9 {name}: {failed} of {requests} requests failed in the {} s after it",
        PHASE.as_secs()
    );
    println!("{line}");
    report.push(line);
    (tail_failed, tail_what)
}

/// Creates a session, runs a command in it and ends it.
async fn session_round(
    client: &reqwest::Client,
    base: &str,
    environment: &str,
    slowest: &mut (Duration, &'static str),
) -> Result<(), String> {
    let mut timed = |what: &'static str, sent: Instant| {
        if sent.elapsed() > slowest.0 {
            *slowest = (sent.elapsed(), what);
        }
    };
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/v1/sessions"))
        .bearer_auth("tok-acme")
        .json(&json!({ "environment": environment }))
        .send()
        .await;
    timed("create", sent);
    let response = response.map_err(|error| format!("create: {error}"))?;
    let status = response.status();
    let session: Value = response.json().await.unwrap_or_default();
    if status != 201 {
        return Err(format!("create: {status} {session}"));
    }
    let id = session["id"].as_str().unwrap_or_default().to_owned();
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/v1/sessions/{id}/exec"))
        .bearer_auth("tok-acme")
        .json(&json!({ "command": "echo ok" }))
        .send()
        .await;
    timed("exec", sent);
    let response = response.map_err(|error| format!("exec: {error}"))?;
    let status = response.status();
    let result: Value = response.json().await.unwrap_or_default();
    if status != 200 || result["stdout"] != "ok\n" {
        return Err(format!("exec: {status} {result}"));
    }
    let sent = Instant::now();
    let response = client
        .delete(format!("{base}/v1/sessions/{id}"))
        .bearer_auth("tok-acme")
        .send()
        .await;
    timed("end", sent);
    let response = response.map_err(|error| format!("end: {error}"))?;
    if !response.status().is_success() {
        return Err(format!("end: {}", response.status()));
    }
    Ok(())
}
