//! A `plinth serve` child process for benchmarks: started from the release binary beside
//! the benchmark's own, with its own data directory, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// The release `plinth` binary beside this benchmark's own.
pub fn binary() -> anyhow::Result<PathBuf> {
    let binary = std::env::current_exe()?
        .parent()
        .context("no directory")?
        .join("plinth");
    anyhow::ensure!(
        binary.exists(),
        "{} is missing: build it with `cargo build --release -p plinth -p plinth-bench`",
        binary.display()
    );
    Ok(binary)
}

/// POSTs a build; returns how long the POST took and how long until the build was ready, as
/// seen by asking every 10 ms (so the figure includes ~5 ms of polling on average).
pub async fn build(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    version: u64,
) -> anyhow::Result<(f64, f64)> {
    let begun = Instant::now();
    client
        .post(format!("{base}/v1/environments/{id}/build"))
        .send()
        .await?
        .error_for_status()?;
    let answered = begun.elapsed().as_secs_f64();
    wait_for_build(client, base, id, version, Duration::from_millis(10)).await?;
    Ok((answered, begun.elapsed().as_secs_f64()))
}

/// Asks for build `version` of `environment` every `every` until it is ready; an error when it
/// failed.
pub async fn wait_for_build(
    client: &reqwest::Client,
    base: &str,
    environment: &str,
    version: u64,
    every: Duration,
) -> anyhow::Result<()> {
    loop {
        let record: serde_json::Value = client
            .get(format!(
                "{base}/v1/environments/{environment}/builds/{version}"
            ))
            .send()
            .await?
            .json()
            .await?;
        match record["status"].as_str() {
            Some("ready") => return Ok(()),
            Some("failed") => anyhow::bail!("build failed: {}\n{}", record["error"], record["log"]),
            _ => tokio::time::sleep(every).await,
        }
    }
}

/// Quotas no benchmark reaches (thousands of environments and sessions in one scope).
pub const UNLIMITED_QUOTAS: [(&str, &str); 4] = [
    ("PLINTH_QUOTA_ENVIRONMENTS", "1000000000"),
    ("PLINTH_QUOTA_STORED_BYTES", "1000000000000000"),
    ("PLINTH_QUOTA_SESSIONS", "1000000000"),
    ("PLINTH_QUOTA_QUEUED_BUILDS", "1000000000"),
];

/// A `plinth serve` child process with its own data directory.
pub struct Service {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Starts `plinth serve` with `extra` flags and waits until it is ready.
    pub async fn start(binary: &Path, data_dir: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .env(
                "PLINTH_LOG",
                std::env::var("BENCH_SERVE_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            // Benchmarks measure speed, not quotas: every quota is out of their way.
            .envs(UNLIMITED_QUOTAS)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let service = Service {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if let Ok(response) = client.get(format!("{}/readyz", service.base)).send().await
                && response.status().is_success()
            {
                return Ok(service);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("plinth serve did not become ready")
    }

    /// Stops the service as an operator would (`SIGTERM`), and waits until it has exited;
    /// killed if it has not within 30 s.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// The service's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the service so far, MiB (VmHWM).
    pub fn peak_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find(|line| line.starts_with("VmHWM:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }

    pub async fn environment(
        &self,
        client: &reqwest::Client,
        name: &str,
    ) -> anyhow::Result<String> {
        let created: serde_json::Value = client
            .post(format!("{}/v1/environments", self.base))
            .json(&serde_json::json!({ "name": name }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(created["id"].as_str().context("no id")?.to_owned())
    }
}
