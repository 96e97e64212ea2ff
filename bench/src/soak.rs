//! Soak: does `plinth serve` give back what a day of work took? Sessions created, used and
//! ended; environments built and then deleted; Brain sessions set up, used and torn down,
//! with retention and the garbage collection grace period short. The data directory's bytes,
//! the rows of every table of the catalog's and the source service's databases, and the
//! service's resident memory are read at the start (after one round of each kind of work,
//! so what the first use creates once counts as the start), at the peak (right after the
//! load) and once collection has settled. The baseline is the start: the report is each
//! figure after the last pass over the same figure at the start.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::service::{Service, wait_for_build};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sessions created, used (one command) and ended.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// Environments created, built and deleted.
    #[arg(long, default_value_t = 30)]
    builds: usize,
    /// Brain sessions, each set up, used (one command) and torn down: three operations.
    #[arg(long, default_value_t = 50)]
    brain_sessions: usize,
    /// Seconds between the service's collection passes and retention runs.
    #[arg(long, default_value_t = 2)]
    gc_interval_seconds: u64,
    /// Seconds to wait at most for the figures to settle after the load.
    #[arg(long, default_value_t = 180)]
    settle_seconds: u64,
}

/// The figures read at one moment.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    /// Bytes of the regular files under the data directory.
    bytes: u64,
    /// The same, per entry of the data directory.
    parts: BTreeMap<String, u64>,
    /// Rows per table, `catalog.<table>` and `source.<table>`.
    rows: BTreeMap<String, u64>,
    /// Resident memory of the service, MiB (VmRSS).
    rss_mib: f64,
}

impl Figures {
    fn total_rows(&self) -> u64 {
        self.rows.values().sum()
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "the soak benchmark needs root (sessions run isolated)"
    );
    let binary = crate::service::binary()?;
    let data = tempfile::tempdir()?;
    let interval = args.gc_interval_seconds.max(1).to_string();
    let service = Service::start(
        &binary,
        data.path(),
        &[
            "--builder-network",
            "false",
            "--gc-interval-seconds",
            &interval,
            "--gc-grace-seconds",
            "0",
            "--gc-hold-seconds",
            "2",
            "--keep-versions",
            "1",
            "--retention-days",
            "0",
        ],
    )
    .await?;
    let client = reqwest::Client::new();
    let soak = Soak {
        client: &client,
        base: &service.base,
    };
    println!("machine: {}", crate::machine());

    // The environment sessions and Brain run on, and one round of each kind of work.
    let environment = service.environment(&client, "soak").await?;
    soak.put(&environment, "setup.sh", b"echo built > out.txt\n".to_vec())
        .await?;
    soak.build(&environment, 1).await?;
    let adapter = soak.brain_adapter(&environment).await?;
    soak.session(&environment).await?;
    soak.build_and_delete(0).await?;
    soak.brain_session(&adapter, "ses_warm").await?;
    let settle = Duration::from_secs(args.settle_seconds);
    let every = Duration::from_secs(args.gc_interval_seconds.max(1));
    let start = settled(data.path(), service.pid(), every, settle).await?;

    let load = Instant::now();
    for _ in 0..args.sessions {
        soak.session(&environment).await?;
    }
    for round in 1..=args.builds {
        soak.build_and_delete(round).await?;
    }
    for round in 0..args.brain_sessions {
        soak.brain_session(&adapter, &format!("ses_soak_{round}"))
            .await?;
    }
    let load_s = load.elapsed().as_secs_f64();
    let mut peak = figures(data.path(), service.pid()).await?;
    peak.rss_mib = service.peak_mib();

    let after = settled(data.path(), service.pid(), every, settle).await?;
    report(&args, load_s, &start, &peak, &after);
    Ok(())
}

/// Reads the figures every collection interval until two readings a few passes apart agree
/// (or `limit` passes): what collection and retention leave once they have nothing more to do.
async fn settled(
    data_dir: &Path,
    pid: u32,
    every: Duration,
    limit: Duration,
) -> anyhow::Result<Figures> {
    let begun = Instant::now();
    let mut last = figures(data_dir, pid).await?;
    loop {
        tokio::time::sleep(every * 3).await;
        let now = figures(data_dir, pid).await?;
        if (now.bytes == last.bytes && now.rows == last.rows) || begun.elapsed() > limit {
            return Ok(now);
        }
        last = now;
    }
}

async fn figures(data_dir: &Path, pid: u32) -> anyhow::Result<Figures> {
    let mut rows = BTreeMap::new();
    for (name, file) in [("catalog", "catalog.db"), ("source", "source.db")] {
        for (table, count) in table_rows(&data_dir.join(file)).await? {
            rows.insert(format!("{name}.{table}"), count);
        }
    }
    let mut parts = BTreeMap::new();
    for entry in std::fs::read_dir(data_dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        parts.insert(name, bytes_under(&entry.path())?);
    }
    Ok(Figures {
        bytes: parts.values().sum(),
        parts,
        rows,
        rss_mib: rss_mib(pid),
    })
}

/// Rows of every table of a SQLite database, read while the service writes it (WAL).
async fn table_rows(file: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    use sqlx::ConnectOptions as _;
    let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(file)
        .read_only(true)
        .connect()
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let tables: Vec<String> = sqlx::query(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .fetch_all(&mut connection)
    .await?
    .iter()
    .map(|row| row.get::<String, _>("name"))
    .collect();
    let mut counts = Vec::with_capacity(tables.len());
    for table in tables {
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let count: i64 = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) AS n FROM {quoted}"
        )))
        .fetch_one(&mut connection)
        .await?
        .get("n");
        counts.push((table, u64::try_from(count).unwrap_or(0)));
    }
    Ok(counts)
}

/// Bytes of the regular files at or under `path` (files that vanish while it walks are
/// skipped).
fn bytes_under(path: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    if let Ok(metadata) = path.symlink_metadata()
        && metadata.is_file()
    {
        return Ok(metadata.len());
    }
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.is_file() {
                total += metadata.len();
            }
        }
    }
    Ok(total)
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The work, through the REST API.
struct Soak<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
}

impl Soak<'_> {
    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let response = request.send().await?;
        let status = response.status();
        let body = response.text().await?;
        anyhow::ensure!(status.is_success(), "{status}: {body}");
        Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    async fn put(&self, environment: &str, path: &str, content: Vec<u8>) -> anyhow::Result<()> {
        self.send(
            self.client
                .put(format!(
                    "{}/v1/environments/{environment}/files/{path}",
                    self.base
                ))
                .body(content),
        )
        .await?;
        Ok(())
    }

    async fn build(&self, environment: &str, version: u64) -> anyhow::Result<()> {
        self.send(
            self.client
                .post(format!("{}/v1/environments/{environment}/build", self.base)),
        )
        .await?;
        wait_for_build(
            self.client,
            self.base,
            environment,
            version,
            Duration::from_millis(20),
        )
        .await
    }

    /// A session: created, one command that writes its working directory, ended.
    async fn session(&self, environment: &str) -> anyhow::Result<()> {
        let session = self
            .send(
                self.client
                    .post(format!("{}/v1/sessions", self.base))
                    .json(&json!({ "environment": environment })),
            )
            .await?;
        let id = session["id"].as_str().context("session id")?;
        let ran = self
            .send(
                self.client
                    .post(format!("{}/v1/sessions/{id}/exec", self.base))
                    .json(&json!({ "command": "echo soak > note.txt && cat note.txt" })),
            )
            .await?;
        anyhow::ensure!(ran["exit_code"] == 0, "the command failed: {ran}");
        self.send(
            self.client
                .delete(format!("{}/v1/sessions/{id}", self.base)),
        )
        .await?;
        Ok(())
    }

    /// An environment with files of its own (128 KiB), built, then deleted.
    async fn build_and_delete(&self, round: usize) -> anyhow::Result<()> {
        let created = self
            .send(
                self.client
                    .post(format!("{}/v1/environments", self.base))
                    .json(&json!({ "name": format!("soak build {round}") })),
            )
            .await?;
        let id = created["id"].as_str().context("environment id")?.to_owned();
        for file in 0..2 {
            let mut content = format!("round {round} file {file}\n").into_bytes();
            content.resize(64 * 1024, b'x');
            self.put(&id, &format!("data/{file}.txt"), content).await?;
        }
        self.put(
            &id,
            "setup.sh",
            format!("printf 'round {round}\\n' > out.txt\n").into_bytes(),
        )
        .await?;
        self.build(&id, 1).await?;
        self.send(
            self.client
                .delete(format!("{}/v1/environments/{id}", self.base)),
        )
        .await?;
        Ok(())
    }

    async fn brain_adapter(&self, environment: &str) -> anyhow::Result<(String, String)> {
        let adapter = self
            .send(
                self.client
                    .post(format!("{}/v1/workspace-adapters", self.base))
                    .json(&json!({
                        "protocol": "brain",
                        "environment": environment,
                        "callback_origins": ["https://brain.example:9"],
                    })),
            )
            .await?;
        Ok((
            adapter["url"].as_str().context("adapter url")?.to_owned(),
            adapter["token"]
                .as_str()
                .context("adapter token")?
                .to_owned(),
        ))
    }

    /// A disposable Brain session: setup, one command, teardown.
    async fn brain_session(&self, adapter: &(String, String), session: &str) -> anyhow::Result<()> {
        let requests = [
            json!({ "type": "setup" }),
            json!({
                "type": "execute",
                "descriptor": { "kind": "tool", "name": "run_command" },
                "input": { "command": "echo brain > note.txt" },
            }),
            json!({ "type": "teardown" }),
        ];
        for (sequence, request) in (1u64..).zip(requests) {
            let answer = self
                .send(
                    self.client
                        .post(format!("{}/v1/operations", adapter.0))
                        .bearer_auth(&adapter.1)
                        .json(&json!({
                            "contract": "environment/v1",
                            "operation": {
                                "session_id": session,
                                "environment": "plinth",
                                "sequence": sequence,
                                "request": request,
                                "binding": { "id": format!("bnd_{session}"), "revision": 1 },
                                "configuration": { "lifetime": "disposable" },
                            }
                        })),
                )
                .await?;
            anyhow::ensure!(
                answer["receipt"]["type"] != "failed" && answer["receipt"]["type"] != "unsupported",
                "Brain operation {sequence} of {session}: {answer}"
            );
        }
        Ok(())
    }
}

fn ratio(after: f64, start: f64) -> f64 {
    if start == 0.0 { 1.0 } else { after / start }
}

fn report(args: &Args, load_s: f64, start: &Figures, peak: &Figures, after: &Figures) {
    println!(
        "load: {} sessions, {} environments built and deleted, {} Brain sessions ({} operations) in {load_s:.0} s",
        args.sessions,
        args.builds,
        args.brain_sessions,
        args.brain_sessions * 3
    );
    println!();
    println!("| figure | start (baseline) | peak | after the last pass | after / start | target |");
    println!("|---|---|---|---|---|---|");
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "| data directory | {:.2} MiB | {:.2} MiB | {:.2} MiB | {:.2} | ≤ 1.10 |",
        mib(start.bytes),
        mib(peak.bytes),
        mib(after.bytes),
        ratio(after.bytes as f64, start.bytes as f64)
    );
    println!(
        "| rows, all tables | {} | {} | {} | {:.2} | ≤ 1.10 |",
        start.total_rows(),
        peak.total_rows(),
        after.total_rows(),
        ratio(after.total_rows() as f64, start.total_rows() as f64)
    );
    println!(
        "| resident memory | {:.1} MiB | {:.1} MiB (VmHWM) | {:.1} MiB | {:.2} | ≤ 1.20 |",
        start.rss_mib,
        peak.rss_mib,
        after.rss_mib,
        ratio(after.rss_mib, start.rss_mib)
    );
    println!();
    println!("| data directory entry | start | peak | after |");
    println!("|---|---|---|---|");
    for (name, peak_bytes) in &peak.parts {
        let at = |figures: &Figures| figures.parts.get(name).copied().unwrap_or(0);
        println!("| {name} | {} | {peak_bytes} | {} |", at(start), at(after));
    }
    println!();
    println!("| table | start | peak | after |");
    println!("|---|---|---|---|");
    for (table, peak_rows) in &peak.rows {
        let at = |figures: &Figures| figures.rows.get(table).copied().unwrap_or(0);
        if at(start) == 0 && *peak_rows == 0 && at(after) == 0 {
            continue;
        }
        println!("| {table} | {} | {peak_rows} | {} |", at(start), at(after));
    }
}
