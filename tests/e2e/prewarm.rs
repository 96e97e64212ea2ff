//! Versions reach nodes before sessions ask: an activation is fetched by every live node (as
//! their metrics show), and the files a version's first sessions read are recorded for the
//! nodes that fetch it later.

use std::time::Duration;

use serde_json::json;

use crate::cluster::{Cluster, Part};
use crate::helpers::{Server, build_ready, created_environment, put_file, send};
use crate::sessions::{exec, start_session};
use crate::waiting::eventually;

/// The sum of a counter's series whose labels hold `label` (0 when none).
fn counter(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

async fn node_metrics(cluster: &Cluster, name: &str) -> String {
    let member = cluster.named(name);
    cluster
        .client
        .get(format!("{}/metrics", member.admin_url()))
        .bearer_auth(
            cluster
                .credentials()
                .token(plinth_kit::auth::Role::Observer),
        )
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body")
}

/// `plinth serve` that pre-warms nothing, with an environment `name` built from `run.py`,
/// `data/second.txt` and `data/never.txt` holding `contents`; its id and slug.
async fn three_files_built(name: &str, contents: [&'static str; 3]) -> (Server, String, String) {
    let server =
        Server::start_with_config("[node]\nprewarm = []\n[builder]\nnetwork = false\n", &[]).await;
    let created = created_environment(&server, json!({ "name": name })).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let slug = created["slug"].as_str().expect("slug").to_owned();
    for (path, content) in ["run.py", "data/second.txt", "data/never.txt"]
        .into_iter()
        .zip(contents)
    {
        put_file(&server, &id, path, content).await;
    }
    build_ready(&server, &id, 1, Duration::from_secs(120)).await;
    (server, id, slug)
}

async fn end_session(server: &Server, session: &serde_json::Value) {
    let (status, _) = send(server.client.delete(server.url(&format!(
        "/v1/sessions/{}",
        session["id"].as_str().expect("id")
    ))))
    .await;
    assert_eq!(status, 200);
}

/// Every live node fetches each newly active version: after the first build, after the
/// second, and it stays there.
#[tokio::test]
async fn an_activation_pre_warms_every_live_node() {
    if !crate::helpers::can_build() {
        return;
    }
    let mut cluster = Cluster::builder()
        .with(Part::Builder, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    for name in ["east", "west"] {
        cluster
            .add(Part::Node, &["--name", name, "--insecure-no-isolation"])
            .await;
    }
    let nodes = ["node-1", "node-2"];
    let (client, base) = (cluster.client.clone(), cluster.base());
    let id = crate::helpers::create_environment_at(&client, &base, "Warm Studio").await;
    for version in 1..=2u32 {
        let (status, _) = send(
            client
                .put(format!("{base}/v1/environments/{id}/files/notes.txt"))
                .body(format!("version {version}\n")),
        )
        .await;
        assert_eq!(status, 200);
        let (status, body) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
        assert_eq!(status, 202, "{body}");
        let build = crate::helpers::wait_for_build_at(
            &client,
            &base,
            &id,
            version.into(),
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(build["status"], "ready", "{build}");
        // No session asked; every node holds the new active version all the same.
        for node in nodes {
            eventually(Duration::from_secs(30), async || {
                let metrics = node_metrics(&cluster, node).await;
                let fetched = counter(
                    &metrics,
                    "plinth_node_prewarm_versions_total",
                    "outcome=\"fetched\"",
                );
                (fetched >= f64::from(version))
                    .then_some(())
                    .ok_or(format!("{node} pre-warmed {fetched} versions"))
            })
            .await;
        }
    }
    for node in nodes {
        let metrics = node_metrics(&cluster, node).await;
        assert_eq!(
            counter(
                &metrics,
                "plinth_node_prewarm_versions_total",
                "outcome=\"failed\""
            ),
            0.0,
            "{node}: {metrics}"
        );
    }
}

/// The files the first session of a version opened, in order, are what the catalog records
/// for the version once that session is done with the lazy mount.
#[tokio::test]
async fn the_first_session_of_a_version_records_what_it_read_first() {
    if !crate::helpers::can_build() {
        return;
    }
    let (server, id, slug) = three_files_built(
        "Ordered Studio",
        ["print('first')\n", "second\n", "never\n"],
    )
    .await;

    let session = start_session(&server, &id).await;
    let read = exec(
        &server,
        &session,
        &format!("cat /env/{slug}/data/second.txt /env/{slug}/run.py /env/{slug}/data/second.txt"),
    )
    .await;
    assert_eq!(read["stdout"], "second\nprint('first')\nsecond\n", "{read}");
    end_session(&server, &session).await;

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
            .expect("url")
            .connect()
            .await
            .expect("connect");
    use plinth_proto::catalog::v1 as pb;
    let mut catalog = pb::session_service_client::SessionServiceClient::with_interceptor(
        channel,
        server.interceptor(plinth_kit::auth::Role::Node),
    );
    let order = eventually(Duration::from_secs(30), async || {
        let paths = catalog
            .get_read_order(pb::GetReadOrderRequest {
                environment_id: id.clone(),
                version: 1,
            })
            .await
            .map_err(|status| status.to_string())?
            .into_inner()
            .paths;
        if paths.is_empty() {
            Err("no read order yet".to_owned())
        } else {
            Ok(paths)
        }
    })
    .await;
    assert_eq!(order, ["data/second.txt", "run.py"], "{order:?}");
}

/// A node that lacks a version gets the files the version's first sessions read from its
/// pack, one object the first node stored, though that node stopped right after them: with
/// those files' own blobs gone from the store, a session on a new node still reads them
/// whole, and what no session read comes from the store as before.
#[tokio::test]
async fn a_new_node_reads_what_the_first_sessions_read_from_the_versions_pack() {
    if !crate::helpers::can_build() {
        return;
    }
    let (read_first, read_second) = ("print('first')\n", "second, and only in the pack\n");
    let (server, id, slug) = three_files_built(
        "Packed Studio",
        [read_first, read_second, "never read first\n"],
    )
    .await;

    let cat = format!("cat /env/{slug}/data/second.txt /env/{slug}/run.py");
    let session = start_session(&server, &id).await;
    let read = exec(&server, &session, &cat).await;
    assert_eq!(
        read["stdout"],
        format!("{read_second}{read_first}"),
        "{read}"
    );
    end_session(&server, &session).await;
    // The node stops at once (scaled down, say): it tells what was read, and stores the
    // pack, before it is gone.
    let store = server.data_dir().join("blobs");
    let data = server.stop_keeping_data().await;
    let packs = crate::lazy_versions::walkdir(&store.join("packs"));
    assert_eq!(packs.len(), 1, "{packs:?}");

    // A new node: the node's state gone, and the files the first session read gone from the
    // store but for the pack.
    std::fs::remove_dir_all(data.path().join("node")).expect("the node's state removed");
    for content in [read_first, read_second] {
        let location =
            plinth_blobs::BlobStore::location(&plinth_blobs::Digest::of(content.as_bytes()));
        std::fs::remove_file(store.join(location.to_string())).expect("a blob removed");
    }
    let config = data.path().join("plinth.toml");
    let server = Server::start_in(data, &["--config", config.to_str().expect("utf-8")]).await;
    let session = start_session(&server, &id).await;
    let read = exec(&server, &session, &cat).await;
    assert_eq!(
        read["stdout"],
        format!("{read_second}{read_first}"),
        "{read}"
    );
    assert_eq!(read["exit_code"], 0, "{read}");
    let never = exec(
        &server,
        &session,
        &format!("cat /env/{slug}/data/never.txt"),
    )
    .await;
    assert_eq!(never["stdout"], "never read first\n", "{never}");
}
