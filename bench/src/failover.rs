//! `plinth-bench failover`: a split deployment (two `plinth catalog` replicas over one
//! PostgreSQL database, `plinth source`, `plinth gateway` on the first catalog, `plinth
//! builder`s), measuring
//!
//! - **queued → started** of a trivial build queued through catalog A while the builder
//!   long-polls catalog B (woken by PostgreSQL `NOTIFY`), beside the same with the builder on
//!   catalog A (the baseline: the in-process wake-up), from the catalog's own `queued_at_ms`
//!   and `started_at_ms`;
//! - **takeover** of a build whose builder is killed with `SIGKILL` (until a waiting builder
//!   leases it again), beside the same after `SIGTERM` (the baseline: the graceful release),
//!   with the default lease.
//!
//! Needs root (builders sandbox their installers) and a PostgreSQL server
//! (`--database-url`, or `PLINTH_TEST_POSTGRES_URL`); a fresh database is made on it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sqlx::{Connection as _, Executor as _, Row as _};

/// Failover benchmark.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A PostgreSQL server URL; a fresh database is created on it.
    #[arg(long, env = "PLINTH_TEST_POSTGRES_URL")]
    database_url: String,
    /// Builds per side of the wake-up comparison.
    #[arg(long, default_value_t = 20)]
    builds: usize,
    /// Rounds per side of the takeover comparison.
    #[arg(long, default_value_t = 3)]
    takeovers: usize,
}

/// A child process, killed when dropped.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    fn signal(&self, name: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.0.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{name} failed");
        Ok(())
    }
}

/// One role's internal credential and the `[[accept]]` entry the services need for it.
fn credential(binary: &Path, role: &str) -> anyhow::Result<(String, String)> {
    let output = Command::new(binary)
        .args(["credential", "new", "--role", role])
        .output()?;
    anyhow::ensure!(output.status.success(), "plinth credential new failed");
    let text = String::from_utf8(output.stdout)?;
    let token = text
        .lines()
        .find(|line| line.starts_with("plinth_"))
        .context("no token printed")?
        .to_owned();
    let accept = text
        .split_once("[[accept]]")
        .map(|(_, entry)| format!("[[accept]]{entry}"))
        .context("no accept entry printed")?;
    Ok((token, accept))
}

/// The deployment's shared pieces.
struct Deployment {
    binary: PathBuf,
    dir: tempfile::TempDir,
    config: PathBuf,
    database_url: String,
    blob_url: String,
    tokens: Vec<(String, String)>,
    catalogs: [String; 2],
    base: String,
    _services: Vec<Process>,
    client: reqwest::Client,
}

pub(crate) fn port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A new database on the server at `server_url`, named after this process; answers its URL.
pub(crate) async fn fresh_database(server_url: &str) -> anyhow::Result<String> {
    sqlx::any::install_default_drivers();
    let name = format!("plinth_bench_{}", std::process::id());
    let mut connection = sqlx::PgConnection::connect(server_url).await?;
    let _ = connection
        .execute(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}"
        )))
        .await;
    connection
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await?;
    let _ = connection.close().await;
    let (base, query) = server_url
        .split_once('?')
        .map_or((server_url, None), |(base, query)| (base, Some(query)));
    let host_start = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[host_start..]
        .find('/')
        .map_or(base.len(), |i| host_start + i);
    let mut url = format!("{}/{name}", &base[..host_end]);
    if let Some(query) = query {
        url = format!("{url}?{query}");
    }
    Ok(url)
}

impl Deployment {
    async fn start(database_url: &str) -> anyhow::Result<Self> {
        let binary = crate::service::binary()?;
        let dir = tempfile::tempdir()?;
        let database_url = fresh_database(database_url).await?;
        let seal = Command::new("sh")
            .args(["-c", "head -c 32 /dev/urandom | base64"])
            .output()?;
        let seal_file = dir.path().join("seal.key");
        std::fs::write(&seal_file, &seal.stdout)?;
        let mut accept = String::new();
        let mut tokens = Vec::new();
        for role in ["gateway", "builder", "source"] {
            let (token, entry) = credential(&binary, role)?;
            accept.push_str(&entry);
            accept.push('\n');
            tokens.push((role.to_owned(), token));
        }
        let accept_file = dir.path().join("accept.toml");
        std::fs::write(&accept_file, accept)?;
        let config = dir.path().join("plinth.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[internal]\naccept_file = \"{}\"\n[catalog]\nseal_key_file = \"{}\"\n[builder]\nnetwork = false\n",
                dir.path().display(),
                accept_file.display(),
                seal_file.display()
            ),
        )?;
        let blob_url = format!("file://{}/blobs", dir.path().display());
        let client = reqwest::Client::new();
        let (a, b, source, http) = (port()?, port()?, port()?, port()?);
        let mut deployment = Deployment {
            binary,
            dir,
            config,
            database_url,
            blob_url,
            tokens,
            catalogs: [
                format!("http://127.0.0.1:{a}"),
                format!("http://127.0.0.1:{b}"),
            ],
            base: format!("http://127.0.0.1:{http}"),
            _services: Vec::new(),
            client,
        };
        let mut services = Vec::new();
        for (catalog, admin) in [(a, port()?), (b, port()?)] {
            let process = deployment.spawn(
                "catalog",
                &[
                    "--listen",
                    &format!("127.0.0.1:{catalog}"),
                    "--admin-listen",
                    &format!("127.0.0.1:{admin}"),
                    "--database-url",
                    &deployment.database_url.clone(),
                ],
            )?;
            deployment
                .ready(&format!("http://127.0.0.1:{admin}/readyz"))
                .await?;
            services.push(process);
        }
        let source_admin = port()?;
        services.push(deployment.spawn(
            "source",
            &[
                "--listen",
                &format!("127.0.0.1:{source}"),
                "--admin-listen",
                &format!("127.0.0.1:{source_admin}"),
                "--database-url",
                &deployment.database_url.clone(),
                "--blob-url",
                &deployment.blob_url.clone(),
            ],
        )?);
        deployment
            .ready(&format!("http://127.0.0.1:{source_admin}/readyz"))
            .await?;
        services.push(deployment.spawn(
            "gateway",
            &[
                "--listen",
                &format!("127.0.0.1:{http}"),
                "--catalog-url",
                &deployment.catalogs[0].clone(),
                "--source-url",
                &format!("http://127.0.0.1:{source}"),
            ],
        )?);
        deployment
            .ready(&format!("{}/readyz", deployment.base))
            .await?;
        deployment._services = services;
        Ok(deployment)
    }

    fn spawn(&self, role: &str, args: &[&str]) -> anyhow::Result<Process> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{role}.log")))?;
        let mut command = Command::new(&self.binary);
        command
            .arg(role)
            .args(args)
            .env("PLINTH_CONFIG", &self.config)
            .env("PLINTH_LOG", "warn")
            .env_remove("PLINTH_TOKENS")
            .env_remove("PLINTH_INTERNAL_CREDENTIAL")
            .envs(crate::service::UNLIMITED_QUOTAS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some((_, token)) = self.tokens.iter().find(|(name, _)| name == role) {
            command.env("PLINTH_INTERNAL_CREDENTIAL", token);
        }
        Ok(Process(command.spawn().context("starting plinth")?))
    }

    async fn ready(&self, url: &str) -> anyhow::Result<()> {
        for _ in 0..600 {
            if let Ok(response) = self.client.get(url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("{url} did not become ready")
    }

    /// A builder long-polling catalog `catalog` (0 or 1), with a work directory of its own
    /// (a builder starting clears what an earlier one left in its work directory).
    fn builder(&self, name: &str, catalog: usize) -> anyhow::Result<Process> {
        let data_dir = self.dir.path().join(name).display().to_string();
        self.spawn(
            "builder",
            &[
                "--name",
                name,
                "--data-dir",
                &data_dir,
                "--catalog-url",
                &self.catalogs[catalog],
                "--blob-url",
                &self.blob_url,
            ],
        )
    }

    /// Queues the first build of a new environment holding `files`; answers its id.
    async fn queue(&self, name: &str, files: &[(&str, &str)]) -> anyhow::Result<String> {
        let created: serde_json::Value = self
            .client
            .post(format!("{}/v1/environments", self.base))
            .json(&serde_json::json!({ "name": name }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let id = created["id"].as_str().context("no id")?.to_owned();
        for (path, body) in files {
            self.client
                .put(format!("{}/v1/environments/{id}/files/{path}", self.base))
                .body(body.to_string())
                .send()
                .await?
                .error_for_status()?;
        }
        self.client
            .post(format!("{}/v1/environments/{id}/build", self.base))
            .send()
            .await?
            .error_for_status()?;
        Ok(id)
    }

    /// `(status, attempt, queued_at_ms, started_at_ms)` of the environment's first build,
    /// straight from the database the catalogs share.
    async fn record(
        &self,
        db: &mut sqlx::PgConnection,
        id: &str,
    ) -> anyhow::Result<(String, i64, i64, i64)> {
        let row = sqlx::query(
            "SELECT status, attempt, queued_at_ms, started_at_ms FROM builds \
             WHERE environment_id = $1 AND version = 1",
        )
        .bind(id)
        .fetch_one(&mut *db)
        .await?;
        Ok((
            row.try_get("status")?,
            row.try_get("attempt")?,
            row.try_get("queued_at_ms")?,
            row.try_get("started_at_ms")?,
        ))
    }

    async fn wait_until(
        &self,
        db: &mut sqlx::PgConnection,
        id: &str,
        what: &str,
        done: impl Fn(&str, i64) -> bool,
    ) -> anyhow::Result<(String, i64, i64, i64)> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let record = self.record(db, id).await?;
            if record.0 == "failed" {
                anyhow::bail!("the build of {id} failed while waiting for {what}");
            }
            if done(&record.0, record.1) {
                return Ok(record);
            }
            anyhow::ensure!(Instant::now() < deadline, "{what}: timed out");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let deployment = Deployment::start(&args.database_url).await?;
    let mut db = sqlx::PgConnection::connect(&deployment.database_url).await?;

    // Queued → started, the builder on the other catalog, then on the same one.
    let mut wakeups: Vec<(&str, Vec<f64>)> = Vec::new();
    for (label, catalog) in [
        ("builder on catalog B (NOTIFY)", 1),
        ("builder on catalog A (in-process, baseline)", 0),
    ] {
        let builder = deployment.builder(&format!("wake-{catalog}"), catalog)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut figures = Vec::new();
        for round in 0..args.builds {
            let id = deployment
                .queue(
                    &format!("wake {catalog} {round}"),
                    &[("README.md", "a trivial environment\n")],
                )
                .await?;
            let (_, _, queued, started) = deployment
                .wait_until(&mut db, &id, "ready", |status, _| status == "ready")
                .await?;
            figures.push((started - queued) as f64);
            // The builder is back in its long poll before the next build is queued.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        drop(builder);
        wakeups.push((label, figures));
    }

    // Takeover: from the signal to the build leased again by the waiting builder.
    let mut takeovers: Vec<(&str, Vec<f64>)> = Vec::new();
    for (label, signal) in [
        ("SIGKILL (lease runs out)", "KILL"),
        ("SIGTERM (released, baseline)", "TERM"),
    ] {
        let mut figures = Vec::new();
        for round in 0..args.takeovers {
            let holder = deployment.builder(&format!("holder-{signal}-{round}"), 0)?;
            let id = deployment
                .queue(
                    &format!("takeover {signal} {round}"),
                    &[("setup.sh", "sleep 4\n")],
                )
                .await?;
            deployment
                .wait_until(&mut db, &id, "the first lease", |status, _| {
                    status == "building"
                })
                .await?;
            let waiting = deployment.builder(&format!("waiting-{signal}-{round}"), 1)?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            holder.signal(signal)?;
            let signalled = Instant::now();
            deployment
                .wait_until(&mut db, &id, "the takeover", |status, attempt| {
                    status == "building" && attempt >= 2
                })
                .await?;
            figures.push(signalled.elapsed().as_secs_f64() * 1000.0);
            deployment
                .wait_until(&mut db, &id, "ready", |status, _| status == "ready")
                .await?;
            drop(holder);
            drop(waiting);
        }
        takeovers.push((label, figures));
    }

    println!("machine: {}", crate::machine());
    println!(
        "queued → started, {} trivial builds each (catalog timestamps, ms):",
        args.builds
    );
    println!("| builder | median | p90 | max |\n|---|---|---|---|");
    for (label, figures) in &wakeups {
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} |",
            percentile(figures, 0.5),
            percentile(figures, 0.9),
            percentile(figures, 1.0)
        );
    }
    println!(
        "ratio of medians (B / A): {:.2}×",
        percentile(&wakeups[0].1, 0.5) / percentile(&wakeups[1].1, 0.5).max(1.0)
    );
    println!(
        "takeover after the holder's signal, {} rounds each (s):",
        args.takeovers
    );
    println!("| signal | median | max |\n|---|---|---|");
    for (label, figures) in &takeovers {
        println!(
            "| {label} | {:.2} | {:.2} |",
            percentile(figures, 0.5) / 1000.0,
            percentile(figures, 1.0) / 1000.0
        );
    }
    println!(
        "ratio of medians (KILL / TERM): {:.1}×",
        percentile(&takeovers[0].1, 0.5) / percentile(&takeovers[1].1, 0.5).max(1.0)
    );
    Ok(())
}
