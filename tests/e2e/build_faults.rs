//! Builder faults with real processes: `plinth catalog`, `plinth source`, `plinth gateway`
//! and two `plinth builder`s. A builder killed mid-build loses its lease and another builder
//! completes the build (with the default lease, within seconds of the kill); a builder paused
//! past its lease and resumed cannot publish. Either way exactly one version exists.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::send;
use crate::processes::Process;
use crate::waiting::eventually;

struct Cluster {
    data: tempfile::TempDir,
    config: std::path::PathBuf,
    blob_url: String,
    catalog_url: String,
    /// The catalog's `/metrics` and `/readyz`.
    catalog_admin: std::net::SocketAddr,
    base: String,
    _services: Vec<Process>,
    client: reqwest::Client,
}

fn spawn(args: &[&str], config: &std::path::Path, log: Option<std::fs::File>) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    crate::credentials::apply(&mut command, crate::credentials::shared(), args[0]);
    command
        .args(args)
        .env("PLINTH_CONFIG", config)
        .env("PLINTH_LOG", "info")
        .env_remove("PLINTH_TOKENS")
        .stdin(Stdio::null());
    match log {
        Some(file) => command.stderr(file).stdout(Stdio::null()),
        None => command.stderr(Stdio::null()).stdout(Stdio::null()),
    };
    Process(command.spawn().expect("spawn plinth"))
}

impl Drop for Cluster {
    /// The services go first (builders the test started are gone by now), then what a
    /// builder killed mid-build left mounted.
    fn drop(&mut self) {
        self._services.clear();
        crate::helpers::unmount_under(self.data.path());
    }
}

impl Cluster {
    async fn start() -> Self {
        Self::with_lease(Some(3)).await
    }

    /// The cluster with builds leased for `lease_seconds` (`None`: the default lease).
    async fn with_lease(lease_seconds: Option<u64>) -> Self {
        let data = tempfile::tempdir().expect("data");
        let config = data.path().join("plinth.toml");
        let lease = lease_seconds
            .map(|seconds| format!("build_lease_seconds = {seconds}\n"))
            .unwrap_or_default();
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[catalog]\n{lease}build_max_attempts = 5\nseal_key_file = \"{}\"\n[builder]\nnetwork = false\n",
                data.path().display(),
                crate::helpers::seal_key_file(data.path()).display()
            ),
        )
        .expect("config");
        let client = crate::helpers::http_client();
        let (services, core, blob_url) =
            crate::node_restart::start_core_in(data.path(), &config).await;
        let crate::node_restart::Core {
            catalog,
            catalog_admin,
            http,
            ..
        } = core;
        Cluster {
            data,
            config,
            blob_url,
            catalog_url: format!("http://{catalog}"),
            catalog_admin,
            base: format!("http://{http}"),
            _services: services,
            client,
        }
    }

    fn builder(&self, name: &str, log: &std::path::Path) -> Process {
        // Each builder process its own work directory: they lock it.
        let work = self.data.path().join(format!("builder-{name}"));
        let work = work.to_str().expect("utf-8");
        let file = std::fs::File::create(log).expect("log file");
        spawn(
            &[
                "builder",
                "--standalone",
                "--name",
                name,
                "--data-dir",
                work,
                "--catalog-url",
                &self.catalog_url,
                "--blob-url",
                &self.blob_url,
            ],
            &self.config,
            Some(file),
        )
    }

    async fn project(&self) -> String {
        let (_, created) = send(
            self.client
                .post(format!("{}/v1/environments", self.base))
                .json(&json!({"name": "Slow"})),
        )
        .await;
        let id = created["id"].as_str().expect("id").to_owned();
        let script = "sleep 5\ndate +%s%N > built-at.txt\n";
        let (status, _) = send(
            self.client
                .put(format!("{}/v1/environments/{id}/files/setup.sh", self.base))
                .body(script),
        )
        .await;
        assert_eq!(status, 200);
        let (status, body) = send(
            self.client
                .post(format!("{}/v1/environments/{id}/build", self.base)),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        id
    }

    async fn build(&self, id: &str) -> Value {
        send(
            self.client
                .get(format!("{}/v1/environments/{id}/builds/1", self.base)),
        )
        .await
        .1
    }

    async fn wait_for(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        eventually(Duration::from_secs(40), async || {
            let build = self.build(id).await;
            if done(&build) {
                Ok(build)
            } else {
                Err(format!("{what}: build is {build}"))
            }
        })
        .await
    }

    async fn versions(&self, id: &str) -> Value {
        send(
            self.client
                .get(format!("{}/v1/environments/{id}/versions", self.base)),
        )
        .await
        .1
    }

    async fn layer(&self, id: &str) -> String {
        crate::helpers::layer_tree(
            &self.catalog_url,
            crate::credentials::shared().interceptor(plinth_kit::auth::Role::Gateway),
            id,
            1,
        )
        .await
    }
}

fn signal(process: &Process, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &process.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test]
async fn a_builder_killed_mid_build_loses_its_lease_and_another_finishes_it() {
    if !crate::helpers::can_build() {
        return;
    }
    let cluster = Cluster::start().await;
    let logs = tempfile::tempdir().expect("logs");
    let id = cluster.project().await;
    let first = cluster.builder("first", &logs.path().join("first.log"));
    cluster
        .wait_for(&id, "the first builder takes the build", |b| {
            b["phase"] == "running"
        })
        .await;
    signal(&first, "KILL");
    drop(first);
    let _second = cluster.builder("second", &logs.path().join("second.log"));
    let build = cluster
        .wait_for(&id, "the second builder finishes", |b| {
            b["status"] == "ready" || b["status"] == "failed"
        })
        .await;
    assert_eq!(build["status"], "ready", "{build}");
    // Leased again after the first lease expired (more than twice only if a loaded machine
    // starved the second builder's renewals too).
    assert!(build["attempt"].as_u64() >= Some(2), "{build}");
    let versions = cluster.versions(&id).await;
    assert_eq!(
        versions["data"].as_array().map(Vec::len),
        Some(1),
        "exactly one version: {versions}"
    );
    assert_eq!(versions["active"], 1);
    // The operator sees the takeover, and the build's duration under its outcome.
    let metrics = cluster
        .client
        .get(format!("http://{}/metrics", cluster.catalog_admin))
        .bearer_auth(crate::credentials::shared().token(plinth_kit::auth::Role::Observer))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics");
    let requeued = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("plinth_build_lease_takeovers_total{outcome=\"requeued\"} ")
        })
        .and_then(|value| value.trim().parse::<f64>().ok());
    assert!(requeued >= Some(1.0), "{metrics}");
}

#[tokio::test]
async fn a_builder_killed_mid_build_and_restarted_leaves_no_mount_and_builds_again() {
    if !crate::helpers::can_build() {
        return;
    }
    let cluster = Cluster::start().await;
    let logs = tempfile::tempdir().expect("logs");
    let id = cluster.project().await;
    let work_dir = cluster.data.path().join("builder-first/builder");
    let first = cluster.builder("first", &logs.path().join("first.log"));
    // Killed while its build runs on the scope's disk (on by default), not while it checks
    // at start that it can make one.
    let scope_mounts = || {
        crate::helpers::mounts_under(&work_dir)
            .into_iter()
            .filter(|point| !point.contains("/.disk-check-"))
            .count()
    };
    cluster
        .wait_for(&id, "the builder takes the build", |b| {
            b["phase"] == "running" && scope_mounts() == 1
        })
        .await;
    signal(&first, "KILL");
    drop(first);
    assert_eq!(scope_mounts(), 1, "the killed builder's mount outlives it");
    // The same builder again, on the same work directory, takes the build over.
    let again = logs.path().join("again.log");
    let _again = cluster.builder("first", &again);
    let build = eventually(Duration::from_secs(60), async || {
        let build = cluster.build(&id).await;
        if build["status"] == "ready" || build["status"] == "failed" {
            Ok(build)
        } else {
            Err(build)
        }
    })
    .await;
    assert_eq!(
        build["status"],
        "ready",
        "{build}\nthe restarted builder's log:\n{}",
        std::fs::read_to_string(&again).unwrap_or_default()
    );
    assert!(build["attempt"].as_u64() >= Some(2), "{build}");
    crate::helpers::until_unmounted(&work_dir).await;
    assert_eq!(crate::helpers::scope_images(&work_dir).len(), 1);
}

#[tokio::test]
async fn a_builder_paused_past_its_lease_cannot_publish_when_it_resumes() {
    if !crate::helpers::can_build() {
        return;
    }
    let cluster = Cluster::start().await;
    let logs = tempfile::tempdir().expect("logs");
    let id = cluster.project().await;
    let paused_log = logs.path().join("paused.log");
    let paused = cluster.builder("paused", &paused_log);
    cluster
        .wait_for(&id, "the first builder takes the build", |b| {
            b["phase"] == "running"
        })
        .await;
    signal(&paused, "STOP");
    let _second = cluster.builder("second", &logs.path().join("second.log"));
    let build = cluster
        .wait_for(&id, "the second builder finishes", |b| {
            b["status"] == "ready" || b["status"] == "failed"
        })
        .await;
    assert_eq!(build["status"], "ready", "{build}");
    assert!(build["attempt"].as_u64() >= Some(2), "{build}");
    let published = cluster.layer(&id).await;

    signal(&paused, "CONT");
    // The resumed builder learns its lease is gone from its next call to the catalog (a renewal,
    // a log append or a reuse query) and abandons the build; wait for it to say so.
    eventually(Duration::from_secs(30), async || {
        let said = std::fs::read_to_string(&paused_log).unwrap_or_default();
        if said.contains("lease lost: this build was abandoned") {
            Ok(())
        } else {
            Err(format!("the resumed builder has not noticed: {said}"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        cluster.layer(&id).await,
        published,
        "the resumed builder published nothing"
    );
    let versions = cluster.versions(&id).await;
    assert_eq!(
        versions["data"].as_array().map(Vec::len),
        Some(1),
        "exactly one version: {versions}"
    );
    drop(paused);
}

#[tokio::test]
async fn a_builder_stopped_gracefully_gives_its_build_back_at_once() {
    if !crate::helpers::can_build() {
        return;
    }
    // A lease far longer than the test waits: only a released build is taken over in time.
    let cluster = Cluster::with_lease(Some(120)).await;
    let logs = tempfile::tempdir().expect("logs");
    let id = cluster.project().await;
    let mut first = cluster.builder("first", &logs.path().join("first.log"));
    cluster
        .wait_for(&id, "the first builder takes the build", |b| {
            b["phase"] == "running"
        })
        .await;
    signal(&first, "TERM");
    let stopped = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(Some(status)) = first.0.try_wait() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the first builder stops on SIGTERM");
    assert!(stopped.success(), "{stopped}");
    let said = std::fs::read_to_string(logs.path().join("first.log")).expect("first log");
    let errors: Vec<&str> = said.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(errors.is_empty(), "errors on a clean stop: {errors:#?}");
    let released = cluster.build(&id).await;
    assert_eq!(
        (&released["status"], &released["phase"]),
        (&json!("building"), &json!("queued")),
        "given back at once: {released}"
    );
    let _second = cluster.builder("second", &logs.path().join("second.log"));
    let build = cluster
        .wait_for(&id, "the second builder finishes", |b| {
            b["status"] == "ready" || b["status"] == "failed"
        })
        .await;
    assert_eq!(build["status"], "ready", "{build}");
    assert_eq!(build["attempt"], 2, "{build}");
}

#[tokio::test]
async fn by_default_a_killed_builders_build_is_taken_over_within_seconds() {
    if !crate::helpers::can_build() {
        return;
    }
    // The default lease (6 s, renewed every 2 s): a builder waiting for work takes over a
    // dead builder's build once its lease runs out, not at some later poll.
    let cluster = Cluster::with_lease(None).await;
    let logs = tempfile::tempdir().expect("logs");
    let id = cluster.project().await;
    let first = cluster.builder("first", &logs.path().join("first.log"));
    cluster
        .wait_for(&id, "the first builder takes the build", |b| {
            b["phase"] == "running"
        })
        .await;
    // The second builder is up and long-polling before the first dies.
    let _second = cluster.builder("second", &logs.path().join("second.log"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(&first, "KILL");
    let killed = std::time::Instant::now();
    drop(first);
    cluster
        .wait_for(&id, "the second builder takes the build over", |b| {
            b["attempt"].as_u64() >= Some(2)
        })
        .await;
    let taken_over = killed.elapsed();
    // The lease, plus slack for a loaded machine; the old 30 s lease is far past it.
    assert!(
        taken_over < Duration::from_secs(10),
        "taken over {taken_over:?} after the kill"
    );
    let build = cluster
        .wait_for(&id, "the second builder finishes", |b| {
            b["status"] == "ready" || b["status"] == "failed"
        })
        .await;
    assert_eq!(build["status"], "ready", "{build}");
}

#[tokio::test]
async fn a_second_builder_process_on_the_same_work_directory_is_refused() {
    if !crate::helpers::can_build() {
        return;
    }
    let data = tempfile::tempdir().expect("data");
    let dir = data.path().to_str().expect("utf-8");
    let args = [
        "builder",
        "--data-dir",
        dir,
        "--catalog-url",
        "http://127.0.0.1:9",
        "--blob-url",
        &format!("file://{dir}/blobs"),
    ];
    let first = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(args)
        .env("PLINTH_INTERNAL_CREDENTIAL", "plinth_first")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("first builder");
    let _first = Process(first);
    // The first holds the directory once it has made it.
    let lock = data.path().join("builder/.lock");
    eventually(Duration::from_secs(5), async || lock.exists().then_some(())).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut second = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(args)
        .env("PLINTH_INTERNAL_CREDENTIAL", "plinth_second")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("second builder");
    for _ in 0..100 {
        if second.try_wait().expect("wait").is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if second.try_wait().expect("wait").is_none() {
        let _ = second.kill();
        let _ = second.wait();
        panic!("a second builder process started on a work directory another one uses");
    }
    let second = second.wait_with_output().expect("second builder's output");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{said}");
    assert!(
        said.contains("another builder process works in") && said.contains(dir),
        "{said}"
    );
}
