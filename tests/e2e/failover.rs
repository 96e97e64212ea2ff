//! Failures across replicas, with real processes: a node killed with `SIGKILL` costs no
//! session create while another node is live, and after the catalog's node TTL gets no new
//! sessions at all; a build queued through one catalog replica wakes a builder long-polling
//! another one (PostgreSQL `LISTEN`/`NOTIFY`); a builder's `/readyz` says which of the
//! catalog and the blob store it is missing.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{Cluster, Part};
use crate::helpers::{create_environment_at, send};
use crate::waiting::eventually;

/// A service's `/metrics` or `/readyz` as an operator with the observer credential reads it.
async fn observe(cluster: &Cluster, url: &str) -> (u16, String) {
    let response = cluster
        .client
        .get(url)
        .bearer_auth(
            cluster
                .credentials()
                .token(plinth_kit::auth::Role::Observer),
        )
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
    let build =
        crate::helpers::wait_for_build_at(client, base, id, 1, Duration::from_secs(60)).await;
    assert_eq!(build["status"], "ready", "the build failed: {build}");
}

#[tokio::test]
async fn a_killed_node_costs_no_session_create_and_gets_none_after_its_ttl() {
    if !crate::helpers::can_build() {
        return;
    }
    // A TTL longer than the default, so that the creates right after the kill surely fall
    // within it on a loaded machine: those are the ones placed on the dead node.
    let mut cluster = Cluster::builder()
        .config("[catalog]\nnode_ttl_ms = 5000\n")
        .with(Part::Builder, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    // Two nodes of one host, each with its own state; `doomed` registers first, so an empty
    // fleet places the next session on it.
    for name in ["doomed", "survivor"] {
        cluster
            .add(Part::Node, &["--name", name, "--insecure-no-isolation"])
            .await;
    }
    let client = cluster.client.clone();
    let base = cluster.base();
    let id = queue_build(&client, &base, "Failover").await;
    wait_ready(&client, &base, &id).await;

    cluster.kill("node-1");

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
    let (_, metrics) = observe(&cluster, &format!("{base}/metrics")).await;
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
    let (_, metrics) = observe(&cluster, &format!("{base}/metrics")).await;
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
    let Some(mut cluster) = Cluster::builder()
        .postgres()
        .with(Part::Catalog, 2)
        .with(Part::Gateway, 0)
        .start()
        .await
    else {
        return;
    };
    let (first, second) = (
        cluster.get(Part::Catalog, 0).url(),
        cluster.get(Part::Catalog, 1).url(),
    );
    let base = cluster
        .add(Part::Gateway, &["--catalog-url", &first])
        .await
        .url();
    cluster
        .add(Part::Builder, &["--catalog-url", &second])
        .await;
    let client = cluster.client.clone();
    // The builder long-polls the second catalog, which hears of a build queued through the
    // first only by its notification: without it, the build would wait for the poll to end
    // (20 s). Three builds, each queued while the builder waits.
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let id = queue_build(&client, &base, &format!("Across {round}")).await;
        // Started long before the builder's poll of the second catalog would end.
        eventually(Duration::from_secs(5), async || {
            let build = build_of(&client, &base, &id).await;
            if build["phase"] != "queued" {
                Ok(())
            } else {
                Err(format!("round {round}: still queued: {build}"))
            }
        })
        .await;
        wait_ready(&client, &base, &id).await;
    }
}

#[tokio::test]
async fn a_builder_is_ready_only_while_a_catalog_serves() {
    let mut cluster = Cluster::builder()
        .with(Part::Source, 0)
        .with(Part::Gateway, 0)
        .with(Part::Builder, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    let builder_admin = cluster.get(Part::Builder, 0).admin_url();
    let readyz = format!("{builder_admin}/readyz");
    let (status, body) = observe(&cluster, &readyz).await;
    assert_eq!(
        (status, body.lines().next()),
        (200, Some("ready")),
        "{body}"
    );
    let (status, _) = observe(&cluster, &format!("{builder_admin}/healthz")).await;
    assert_eq!(status, 200);
    let (status, _) = observe(&cluster, &format!("{builder_admin}/metrics")).await;
    assert_eq!(status, 200);

    // The catalog goes away: the builder is alive but not ready, and says why, from its next
    // check on (it checks every second in the background).
    cluster.kill("catalog-1");
    let seen = eventually(Duration::from_secs(10), async || {
        let seen = observe(&cluster, &readyz).await;
        if seen.0 == 503 { Ok(seen) } else { Err(seen) }
    })
    .await;
    let (status, body) = seen;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no catalog serves"), "{body}");
    let (status, _) = observe(&cluster, &format!("{builder_admin}/healthz")).await;
    assert_eq!(status, 200);
}
