//! Failures across replicas, with real processes: a node killed with `SIGKILL` costs no
//! session create while another node is live, and after the catalog's node TTL gets no new
//! sessions at all; a build queued through one catalog replica wakes a builder long-polling
//! another one (PostgreSQL `LISTEN`/`NOTIFY`); a builder's `/readyz` says which of the
//! catalog and the blob store it is missing.

use std::path::Path;
use std::time::{Duration, Instant};

use plinth_catalog::testing::{self, PostgresAvailability};
use serde_json::{Value, json};

use crate::helpers::{create_environment_at, send};
use crate::node_restart::{spawn, start_core, strings};
use crate::processes::{Process, free_port, wait_until_ready};

/// A service's `/metrics` or `/readyz` as an operator with the observer credential reads it.
async fn observe(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client
        .get(url)
        .bearer_auth(crate::credentials::shared().token(plinth_kit::auth::Role::Observer))
        .send()
        .await
        .expect("observe");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// A counter's value in a Prometheus text page (0 when absent).
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Writes `plinth.toml` in `dir` for processes that keep their data there: builds without
/// network, a seal key beside it, and `extra` (more settings, whole sections) after that.
pub(crate) fn write_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let config = dir.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[builder]\nnetwork = false\n[catalog]\nseal_key_file = \"{}\"\n{extra}",
            dir.display(),
            crate::helpers::seal_key_file(dir).display()
        ),
    )
    .expect("config");
    config
}

/// Starts each `(args, readiness URL)` in order, each once the one before is ready.
async fn start_all(
    client: &reqwest::Client,
    config: &Path,
    log: &Path,
    services: Vec<(Vec<String>, String)>,
) -> Vec<Process> {
    let mut running = Vec::new();
    for (args, ready) in services {
        let mut process = spawn(&args, config, log);
        wait_until_ready(client, &ready, &mut process).await;
        running.push(process);
    }
    running
}

/// Makes an environment with one file and queues its first build; answers its id.
async fn queue_build(client: &reqwest::Client, base: &str, name: &str) -> String {
    let id = create_environment_at(client, base, name).await;
    let (status, _) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/README.md"))
            .body("a trivial environment\n"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{body}");
    id
}

async fn build_of(client: &reqwest::Client, base: &str, id: &str) -> Value {
    send(client.get(format!("{base}/v1/environments/{id}/builds/1")))
        .await
        .1
}

async fn wait_ready(client: &reqwest::Client, base: &str, id: &str) {
    for _ in 0..600 {
        let build = build_of(client, base, id).await;
        match build["status"].as_str() {
            Some("ready") => return,
            Some("failed") => panic!("the build failed: {build}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("the build of {id} was not ready within 60 s");
}

#[tokio::test]
async fn a_killed_node_costs_no_session_create_and_gets_none_after_its_ttl() {
    if !crate::helpers::can_build() {
        return;
    }
    let data = tempfile::tempdir().expect("data");
    // A TTL longer than the default, so that the creates right after the kill surely fall
    // within it on a loaded machine: those are the ones placed on the dead node.
    let config = write_config(data.path(), "node_ttl_ms = 5000\n");
    let log = data.path().join("services.log");
    let client = crate::helpers::http_client();
    let blob_url = format!("file://{}/blobs", data.path().display());
    let (mut services, core) = start_core(&client, &config, &log, &blob_url).await;
    let catalog_url = format!("http://{}", core.catalog);
    let base = format!("http://{}", core.http);
    services.push(spawn(
        &strings(&[
            "builder",
            "--standalone",
            "--name",
            "builder",
            "--catalog-url",
            &catalog_url,
            "--blob-url",
            &blob_url,
        ]),
        &config,
        &log,
    ));
    // Two nodes of one host, each with its own state; `doomed` registers first, so an empty
    // fleet places the next session on it.
    let mut nodes = Vec::new();
    for name in ["doomed", "survivor"] {
        let (listen, admin) = (free_port(), free_port());
        let state = data.path().join(name);
        nodes.push(
            start_all(
                &client,
                &config,
                &log,
                vec![(
                    strings(&[
                        "node",
                        "--standalone",
                        "--name",
                        name,
                        "--data-dir",
                        &state.display().to_string(),
                        "--listen",
                        &listen.to_string(),
                        "--admin-listen",
                        &admin.to_string(),
                        "--catalog-url",
                        &catalog_url,
                        "--blob-url",
                        &blob_url,
                        "--insecure-no-isolation",
                    ]),
                    format!("http://{admin}/readyz"),
                )],
            )
            .await
            .remove(0),
        );
    }
    let id = queue_build(&client, &base, "Failover").await;
    wait_ready(&client, &base, &id).await;

    let doomed = nodes.remove(0);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &doomed.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    drop(doomed);

    let create = || async {
        let (status, session) = send(
            client
                .post(format!("{base}/v1/sessions"))
                .json(&json!({ "environment": id })),
        )
        .await;
        assert_eq!(
            status, 201,
            "a session is created on the live node: {session}"
        );
        let session_id = session["id"].as_str().expect("session id").to_owned();
        let (status, ran) = send(
            client
                .post(format!("{base}/v1/sessions/{session_id}/exec"))
                .json(&json!({ "command": "echo alive" })),
        )
        .await;
        assert_eq!(status, 200, "{ran}");
        assert_eq!(ran["stdout"], "alive\n", "{ran}");
    };
    // Right after the kill the catalog still counts the dead node live: every create succeeds
    // all the same, the gateway placing it again when the dead node cannot be reached.
    for _ in 0..4 {
        create().await;
    }
    let retries_metric = "plinth_session_placement_retries_total";
    let (_, metrics) = observe(&client, &format!("{base}/metrics")).await;
    let retried = counter(&metrics, retries_metric);
    assert!(
        retried >= 1.0,
        "the dead node was tried and passed over: {metrics}"
    );

    // Past the TTL the dead node is no longer placed on at all: no create needs a retry.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    for _ in 0..4 {
        create().await;
    }
    let (_, metrics) = observe(&client, &format!("{base}/metrics")).await;
    assert_eq!(
        counter(&metrics, retries_metric),
        retried,
        "no session was placed on the dead node after its TTL: {metrics}"
    );
}

#[tokio::test]
async fn a_build_queued_through_one_catalog_wakes_a_builder_waiting_on_another() {
    if !crate::helpers::can_build() {
        return;
    }
    let PostgresAvailability::Available(server) = testing::postgres() else {
        return;
    };
    let database_url = testing::fresh_postgres_database(&server).await;
    let data = tempfile::tempdir().expect("data");
    let config = write_config(data.path(), "");
    let log = data.path().join("services.log");
    let client = crate::helpers::http_client();
    let blob_url = format!("file://{}/blobs", data.path().display());
    let (first, first_admin, second, second_admin) =
        (free_port(), free_port(), free_port(), free_port());
    let (source, source_admin, http) = (free_port(), free_port(), free_port());
    let base = format!("http://{http}");
    let catalog = |listen: std::net::SocketAddr, admin: std::net::SocketAddr| {
        (
            strings(&[
                "catalog",
                "--standalone",
                "--listen",
                &listen.to_string(),
                "--admin-listen",
                &admin.to_string(),
                "--database-url",
                &database_url,
            ]),
            format!("http://{admin}/readyz"),
        )
    };
    let mut services = start_all(
        &client,
        &config,
        &log,
        vec![
            catalog(first, first_admin),
            catalog(second, second_admin),
            (
                strings(&[
                    "source",
                    "--standalone",
                    "--listen",
                    &source.to_string(),
                    "--admin-listen",
                    &source_admin.to_string(),
                    "--blob-url",
                    &blob_url,
                ]),
                format!("http://{source_admin}/readyz"),
            ),
            (
                strings(&[
                    "gateway",
                    "--listen",
                    &http.to_string(),
                    "--catalog-url",
                    &format!("http://{first}"),
                    "--source-url",
                    &format!("http://{source}"),
                ]),
                format!("{base}/readyz"),
            ),
        ],
    )
    .await;
    let builder_admin = free_port();
    services.extend(
        start_all(
            &client,
            &config,
            &log,
            vec![(
                strings(&[
                    "builder",
                    "--standalone",
                    "--name",
                    "on-second",
                    "--catalog-url",
                    &format!("http://{second}"),
                    "--blob-url",
                    &blob_url,
                    "--admin-listen",
                    &builder_admin.to_string(),
                ]),
                format!("http://{builder_admin}/readyz"),
            )],
        )
        .await,
    );
    // The builder long-polls the second catalog, which hears of a build queued through the
    // first only by its notification: without it, the build would wait for the poll to end
    // (20 s). Three builds, each queued while the builder waits.
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let queued = Instant::now();
        let id = queue_build(&client, &base, &format!("Across {round}")).await;
        let started = loop {
            let build = build_of(&client, &base, &id).await;
            if build["phase"] != "queued" {
                break queued.elapsed();
            }
            assert!(
                queued.elapsed() < Duration::from_secs(5),
                "round {round}: the builder waiting on the other catalog did not start the build: {build}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            started < Duration::from_secs(2),
            "round {round}: started {started:?} after queuing"
        );
        wait_ready(&client, &base, &id).await;
    }
}

#[tokio::test]
async fn a_builder_is_ready_only_while_a_catalog_serves() {
    let data = tempfile::tempdir().expect("data");
    let config = write_config(data.path(), "");
    let log = data.path().join("services.log");
    let client = crate::helpers::http_client();
    let blob_url = format!("file://{}/blobs", data.path().display());
    let (catalog, catalog_admin, builder_admin) = (free_port(), free_port(), free_port());
    let mut catalog_process = start_all(
        &client,
        &config,
        &log,
        vec![(
            strings(&[
                "catalog",
                "--standalone",
                "--listen",
                &catalog.to_string(),
                "--admin-listen",
                &catalog_admin.to_string(),
            ]),
            format!("http://{catalog_admin}/readyz"),
        )],
    )
    .await;
    let readyz = format!("http://{builder_admin}/readyz");
    let _builder = start_all(
        &client,
        &config,
        &log,
        vec![(
            strings(&[
                "builder",
                "--standalone",
                "--name",
                "probed",
                "--catalog-url",
                &format!("http://{catalog}"),
                "--blob-url",
                &blob_url,
                "--admin-listen",
                &builder_admin.to_string(),
            ]),
            readyz.clone(),
        )],
    )
    .await;
    let (status, body) = observe(&client, &readyz).await;
    assert_eq!(
        (status, body.lines().next()),
        (200, Some("ready")),
        "{body}"
    );
    let (status, _) = observe(&client, &format!("http://{builder_admin}/healthz")).await;
    assert_eq!(status, 200);
    let (status, _) = observe(&client, &format!("http://{builder_admin}/metrics")).await;
    assert_eq!(status, 200);

    // The catalog goes away: the builder is alive but not ready, and says why, from its next
    // check on (it checks every second in the background).
    drop(catalog_process.remove(0));
    let mut seen = observe(&client, &readyz).await;
    for _ in 0..100 {
        if seen.0 == 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        seen = observe(&client, &readyz).await;
    }
    let (status, body) = seen;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no catalog serves"), "{body}");
    let (status, _) = observe(&client, &format!("http://{builder_admin}/healthz")).await;
    assert_eq!(status, 200);
}
