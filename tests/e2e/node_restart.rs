//! A node agent killed and restarted, with real processes (`plinth catalog`, `source`,
//! `gateway`, `builder` and `node`): it keeps serving its sessions' working directories,
//! rebuilds its cache state from disk instead of fetching versions again, and leaves no
//! mounts behind on the host.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{Cluster, Part};
use crate::helpers::{create_environment_at, send};
use crate::processes::{Process, wait_until_ready};
use crate::waiting::eventually;

/// A `plinth` process of a split deployment with the shared test credentials, its output
/// appended to `log`.
pub(crate) fn spawn(args: &[String], config: &std::path::Path, log: &std::path::Path) -> Process {
    Process(command(args, config, log).spawn().expect("spawn plinth"))
}

/// [`spawn`] on port 0 (`args` give `--listen 127.0.0.1:0`, say), once it has said where it
/// listens and its `/readyz` at `admin_flag`'s address answers 200: it, and where it listens.
pub(crate) async fn spawn_listening(
    client: &reqwest::Client,
    args: &[String],
    config: &std::path::Path,
    log: &std::path::Path,
    admin_flag: &str,
) -> (Process, crate::cluster::Bound) {
    let ready_file = log.with_file_name(format!("{}.ready", uuid::Uuid::new_v4().simple()));
    let (mut process, bound) =
        crate::cluster::spawn_reporting(&mut command(args, config, log), &ready_file, Some(log))
            .await;
    let admin = bound[admin_flag];
    wait_until_ready(client, &format!("http://{admin}/readyz"), &mut process).await;
    (process, bound)
}

/// The command [`spawn`] runs.
pub(crate) fn command(args: &[String], config: &std::path::Path, log: &std::path::Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    crate::credentials::apply(&mut command, crate::credentials::shared(), &args[0]);
    command
        .args(args)
        .env("PLINTH_CONFIG", config)
        .env("PLINTH_LOG", "info")
        .env_remove("PLINTH_TOKENS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    command
}

/// A log file's text without terminal colours.
fn read_log(path: &std::path::Path) -> String {
    let raw = std::fs::read_to_string(path).expect("log");
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            text.push(c);
        }
    }
    text
}

pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// Where a standalone catalog, source (blobs at `blob_url`) and gateway in front of them
/// listen, as [`start_core`] started them.
pub(crate) struct Core {
    pub(crate) catalog: std::net::SocketAddr,
    pub(crate) catalog_admin: std::net::SocketAddr,
    pub(crate) source: std::net::SocketAddr,
    pub(crate) source_admin: std::net::SocketAddr,
    pub(crate) http: std::net::SocketAddr,
}

/// Starts a standalone catalog, a source on `blob_url` and a gateway in front of them, each
/// waited for until ready; answers their processes and where they listen.
pub(crate) async fn start_core(
    client: &reqwest::Client,
    config: &std::path::Path,
    log: &std::path::Path,
    blob_url: &str,
) -> (Vec<Process>, Core) {
    let (services, [catalog, source, gateway]) =
        crate::cluster::start_trio(async |mut args, probe| {
            if args[0] != "gateway" {
                args.push("--standalone".to_owned());
            }
            if args[0] == "source" {
                args.extend(["--blob-url".to_owned(), blob_url.to_owned()]);
            }
            spawn_listening(client, &args, config, log, probe).await
        })
        .await;
    (
        services,
        Core {
            catalog: catalog["listen"],
            catalog_admin: catalog["admin_listen"],
            source: source["listen"],
            source_admin: source["admin_listen"],
            http: gateway["listen"],
        },
    )
}

/// [`start_core`] for processes that keep their data in `data` (blobs in `data/blobs`, logs
/// in `data/services.log`) and read `config`: the processes, where they listen, the blob URL.
pub(crate) async fn start_core_in(
    data: &std::path::Path,
    config: &std::path::Path,
) -> (Vec<Process>, Core, String) {
    let blob_url = format!("file://{}/blobs", data.display());
    let (services, core) = start_core(
        &crate::helpers::http_client(),
        config,
        &data.join("services.log"),
        &blob_url,
    )
    .await;
    (services, core, blob_url)
}

async fn exec(client: &reqwest::Client, base: &str, session: &str, command: &str) -> Value {
    let (status, result) = send(
        client
            .post(format!("{base}/v1/sessions/{session}/exec"))
            .json(&json!({ "command": command })),
    )
    .await;
    assert_eq!(status, 200, "{command}: {result}");
    result
}

/// Host mounts under `/env` or the data directory (there should never be any: every session
/// mount lives in its command's own namespace).
fn host_mounts(data: &std::path::Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let data = data.to_string_lossy().into_owned();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_owned))
        .filter(|point| point.starts_with("/env/") || point.starts_with(&data))
        .collect()
}

#[tokio::test]
async fn a_killed_node_restarts_with_its_sessions_and_cache_and_leaves_no_mounts() {
    if !crate::helpers::can_build() {
        return;
    }
    let mut cluster = Cluster::builder()
        .with(Part::Builder, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    let node_admin = cluster.add(Part::Node, &[]).await.admin();
    let node_log = cluster.log("node-1");
    let data = cluster.dir().to_owned();
    let node_data = data.join("node-1");
    let client = cluster.client.clone();
    // Which cgroups hold sessions' limits is said where operators look (to a caller with a
    // credential: how the node runs is no one else's business).
    let ready = client
        .get(format!("http://{node_admin}/readyz"))
        .bearer_auth(
            cluster
                .credentials()
                .token(plinth_kit::auth::Role::Observer),
        )
        .send()
        .await
        .expect("readyz")
        .text()
        .await
        .expect("readyz body");
    assert!(ready.contains("session limits: cgroup v"), "{ready}");

    let base = cluster.base();
    let id = create_environment_at(&client, &base, "Restart").await;
    let (status, _) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/hello.txt"))
            .body("hello\n"),
    )
    .await;
    assert_eq!(status, 200);
    send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    let build =
        crate::helpers::wait_for_build_at(&client, &base, &id, 1, Duration::from_secs(30)).await;
    assert_eq!(build["status"], "ready", "{build}");

    // A session (the node registers right after it is ready; retry briefly until it has).
    let session = eventually(Duration::from_secs(5), async || {
        let (status, answer) = send(
            client
                .post(format!("{base}/v1/sessions"))
                .json(&json!({"environment": id})),
        )
        .await;
        if status == 201 {
            return Ok(answer);
        }
        assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
        Err(answer)
    })
    .await;
    let session_id = session["id"].as_str().expect("a session").to_owned();
    assert_eq!(session["workdir"], "/home/session", "{session}");
    let workdir = crate::helpers::host_workdir(&node_data, &session_id);
    let wrote = exec(
        &client,
        &base,
        &session_id,
        "echo kept > mine.txt && cat $PROJECT_ROOT/hello.txt",
    )
    .await;
    assert_eq!(wrote["stdout"], "hello\n", "{wrote}");
    // A daemon the session started, and one it double-forked, die with the node.
    let daemons = exec(
        &client,
        &base,
        &session_id,
        "setsid -f sleep 1010 > /dev/null 2>&1 < /dev/null; \
         setsid -f sh -c '(sleep 1011 > /dev/null 2>&1 < /dev/null &)'; sleep 0.3; echo started",
    )
    .await;
    assert_eq!(daemons["stdout"], "started\n", "{daemons}");
    assert_eq!(crate::sandbox::host_processes("sleep 1010").len(), 1);
    assert_eq!(crate::sandbox::host_processes("sleep 1011").len(), 1);
    assert!(
        !crate::sandbox::session_cgroup_dirs(&session_id).is_empty(),
        "the session's sandbox has a cgroup"
    );
    assert!(host_mounts(&data).is_empty(), "{:?}", host_mounts(&data));

    // Killed without a chance to clean up.
    cluster.kill("node-1");
    assert!(host_mounts(&data).is_empty(), "{:?}", host_mounts(&data));
    assert!(workdir.join("mine.txt").exists());
    assert_eq!(
        crate::sandbox::gone("sleep 1010").await,
        Vec::<String>::new()
    );
    assert_eq!(
        crate::sandbox::gone("sleep 1011").await,
        Vec::<String>::new()
    );

    // The killed node left the session's cgroup behind; the restarted one, which holds no
    // sandbox yet, removes it (in every hierarchy) before it is ready.
    assert!(!crate::sandbox::session_cgroup_dirs(&session_id).is_empty());
    cluster.restart("node-1").await;
    assert_eq!(
        crate::sandbox::session_cgroup_dirs(&session_id),
        Vec::<std::path::PathBuf>::new()
    );
    let said = read_log(&node_log);
    let loaded: Vec<&str> = said
        .lines()
        .filter(|line| line.contains("node state loaded"))
        .collect();
    assert_eq!(loaded.len(), 2, "{said}");
    assert!(
        loaded[1].contains("sessions=1") && loaded[1].contains("cached_versions=1"),
        "{said}"
    );

    let read = exec(
        &client,
        &base,
        &session_id,
        "cat mine.txt; echo more >> mine.txt; cat $PROJECT_ROOT/hello.txt",
    )
    .await;
    assert_eq!(read["exit_code"], 0, "{read}");
    assert_eq!(read["stdout"], "kept\nhello\n", "{read}");
    assert_eq!(read["version"], 1);

    // New sessions land on the restarted node, from the cache it kept.
    let (status, second) = send(
        client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"environment": id})),
    )
    .await;
    assert_eq!(status, 201, "{second}");
    let said = read_log(&node_log);
    let attached = said
        .lines()
        .rfind(|line| line.contains("session attached"))
        .expect("an attach");
    assert!(attached.contains("fetched=0"), "{attached}");

    // Ending the first session removes its working directory on the node, and its cgroup
    // (made again for its sandbox after the restart).
    assert!(!crate::sandbox::session_cgroup_dirs(&session_id).is_empty());
    let (status, _) = send(client.delete(format!("{base}/v1/sessions/{session_id}"))).await;
    assert_eq!(status, 200);
    assert!(!workdir.exists());
    assert_eq!(
        crate::sandbox::session_cgroup_dirs(&session_id),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(host_mounts(&data).is_empty(), "{:?}", host_mounts(&data));
}

/// `/readyz` of the process named `name`, as an operator with the observer credential reads
/// it, polled until its body says `expected` (checked in the background, every second or more
/// often); answers its status and body.
async fn readiness_says(cluster: &mut Cluster, name: &str, expected: &str) -> (u16, String) {
    let readyz = format!("{}/readyz", cluster.named(name).admin_url());
    let token = cluster
        .credentials()
        .token(plinth_kit::auth::Role::Observer)
        .to_owned();
    let client = cluster.client.clone();
    eventually(Duration::from_secs(30), async || {
        cluster.assert_running(name);
        let response = client
            .get(&readyz)
            .bearer_auth(&token)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|error| error.to_string())?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(|error| error.to_string())?;
        if body.contains(expected) {
            Ok((status, body))
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await
}

#[tokio::test]
async fn a_node_cut_off_from_the_catalog_is_not_ready_and_a_source_without_its_blob_store_is() {
    // Nothing answers here: the catalog and the blob store are unreachable.
    let closed = crate::cluster::hanging_up();
    let unreachable_store = format!(
        "s3://plinth/blobs?endpoint=http://{closed}&allow_http=true&region=us-east-1&access_key_id=test&secret_access_key=test"
    );
    let mut cluster = Cluster::builder()
        .with(Part::Catalog, 0)
        .with(Part::Source, 0)
        .with(Part::Gateway, 0)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    let catalog_url = format!("http://{closed}");
    cluster
        .add_unready(
            Part::Node,
            &[
                "--name",
                "cut-off",
                "--catalog-url",
                &catalog_url,
                "--insecure-no-isolation",
            ],
        )
        .await;
    let (status, body) =
        readiness_says(&mut cluster, "node-1", "not registered with the catalog").await;
    assert_eq!(status, 503, "{body}");

    cluster
        .add_unready(Part::Source, &["--blob-url", &unreachable_store])
        .await;
    // The blob store is every replica's: its outage leaves the source ready (a balancer
    // keeps it in service), saying so where operators look.
    let (status, body) =
        readiness_says(&mut cluster, "source-1", "blob store: does not answer").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.lines().next(), Some("ready"), "{body}");
}
