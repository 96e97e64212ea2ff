//! Nodes that say what they can take, with real processes (`plinth catalog`, `source`,
//! `gateway`, `builder` and two `plinth node`s): a node with `--max-sessions 2` refuses the
//! third session, a node in a memory cgroup refuses the session its memory cannot hold, each
//! with `503 unavailable` and `Retry-After`, and each takes a session again once one ends. A
//! node stopped after `plinth node --drain` gets no sessions and is not reported late by
//! `plinth_nodes`, where a node that just died is; started again, it is back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{create_environment_at, send};
use crate::node_restart::{Core, spawn, start_core, strings};
use crate::processes::{Process, wait_until_ready};

/// A memory cgroup of its own made for one process (v2 `memory.max`, or v1
/// `memory.limit_in_bytes` on a host without v2 memory), removed when dropped.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    fn new(name: &str, bytes: u64) -> Self {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
        let (dir, limit) = if v2 {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        } else {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        };
        std::fs::create_dir_all(&dir).expect("a memory cgroup (the test runs as root)");
        std::fs::write(dir.join(limit), bytes.to_string()).expect("its memory limit");
        MemoryCgroup { dir }
    }

    /// `command` run in this cgroup, its errors to `log`: a shell moves itself in, then
    /// becomes the command.
    fn wrap(&self, command: &Command, log: std::fs::File) -> Command {
        let mut wrapped = Command::new("sh");
        wrapped
            .arg("-c")
            .arg(r#"echo $$ > "$PLINTH_TEST_CGROUP_PROCS" && exec "$0" "$@""#)
            .arg(command.get_program())
            .args(command.get_args())
            .env("PLINTH_TEST_CGROUP_PROCS", self.dir.join("cgroup.procs"));
        for (name, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(name, value),
                None => wrapped.env_remove(name),
            };
        }
        wrapped
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        wrapped
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its process was killed (and reaped) first; a moment for the kernel to let go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The catalog, source, gateway and builder of a split deployment, on SQLite and files.
struct Deployment {
    data: tempfile::TempDir,
    config: PathBuf,
    log: PathBuf,
    blob_url: String,
    catalog: SocketAddr,
    catalog_admin: SocketAddr,
    base: String,
    _services: Vec<Process>,
}

impl Deployment {
    async fn start(client: &reqwest::Client) -> Self {
        let data = tempfile::tempdir().expect("data");
        let config = crate::failover::write_config(data.path(), "");
        let log = data.path().join("services.log");
        let blob_url = format!("file://{}/blobs", data.path().display());
        let (mut services, core) = start_core(client, &config, &log, &blob_url).await;
        let Core {
            catalog,
            catalog_admin,
            http,
            ..
        } = core;
        services.push(spawn(
            &strings(&[
                "builder",
                "--standalone",
                "--name",
                "builder",
                "--catalog-url",
                &format!("http://{catalog}"),
                "--blob-url",
                &blob_url,
            ]),
            &config,
            &log,
        ));
        Deployment {
            data,
            config,
            log,
            blob_url,
            catalog,
            catalog_admin,
            base: format!("http://{http}"),
            _services: services,
        }
    }

    /// `plinth node` named `name` with `flags` added: its own state, on port 0.
    fn node_command(&self, name: &str, flags: &[&str]) -> Command {
        let state = self.data.path().join(name);
        let mut args = strings(&[
            "node",
            "--standalone",
            "--insecure-no-isolation",
            "--name",
            name,
            "--data-dir",
            &state.display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--catalog-url",
            &format!("http://{}", self.catalog),
            "--blob-url",
            &self.blob_url,
        ]);
        args.extend(strings(flags));
        let log = self.node_log(name);
        let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
        crate::credentials::apply(&mut command, crate::credentials::shared(), "node");
        command
            .args(&args)
            .env("PLINTH_CONFIG", &self.config)
            .env("PLINTH_LOG", "info")
            .env_remove("PLINTH_TOKENS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        command
    }

    /// Where node `name` logs.
    fn node_log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.path().join(format!("{name}.log")))
            .expect("log file")
    }

    /// Starts `command` (a node on port 0, named `name`) and waits until it has
    /// registered.
    async fn ready_node(
        &self,
        client: &reqwest::Client,
        mut command: Command,
        name: &str,
    ) -> Process {
        let ready_file = self.data.path().join(format!("{name}.ready"));
        let (mut node, bound) = crate::cluster::spawn_reporting(
            &mut command,
            &ready_file,
            Some(&self.data.path().join(format!("{name}.log"))),
        )
        .await;
        let admin = bound["admin_listen"];
        wait_until_ready(client, &format!("http://{admin}/readyz"), &mut node).await;
        node
    }

    /// One sample of the catalog's `/metrics`, e.g. `plinth_nodes{state="late"}`.
    async fn gauge(&self, client: &reqwest::Client, series: &str) -> Option<f64> {
        let text = client
            .get(format!("http://{}/metrics", self.catalog_admin))
            .bearer_auth(crate::credentials::shared().token(plinth_kit::auth::Role::Observer))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
    }

    /// Polls `series` until it is `wanted`; fails after 60 s (gauges are read every 10 s).
    async fn until_gauge(&self, client: &reqwest::Client, series: &str, wanted: f64) {
        crate::waiting::eventually(Duration::from_secs(60), async || {
            let last = self.gauge(client, series).await;
            if last == Some(wanted) {
                Ok(())
            } else {
                Err(format!(
                    "{series} is {last:?}, not {wanted}\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ))
            }
        })
        .await;
    }
}

/// `POST /v1/sessions`: its status, `Retry-After` header and body.
async fn create(client: &reqwest::Client, base: &str, body: Value) -> (u16, Option<String>, Value) {
    let response = client
        .post(format!("{base}/v1/sessions"))
        .json(&body)
        .send()
        .await
        .expect("create session");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    (status, retry_after, response.json().await.expect("json"))
}

/// A session that must be created.
async fn created(client: &reqwest::Client, base: &str, body: Value) -> String {
    let (status, _, session) = create(client, base, body.clone()).await;
    assert_eq!(status, 201, "{body}: {session}");
    session["id"].as_str().expect("id").to_owned()
}

/// A create that no node has room for: 503 unavailable, `Retry-After`, and a message that
/// says why and what to do.
async fn refused_for_room(client: &reqwest::Client, base: &str, body: Value) -> Value {
    let (status, retry_after, answer) = create(client, base, body.clone()).await;
    assert_eq!(status, 503, "{body}: {answer}");
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
    assert_eq!(
        answer["error"]["detail"]["reason"], "no_capacity",
        "{answer}"
    );
    let seconds: u64 = retry_after
        .expect("a Retry-After header")
        .parse()
        .expect("whole seconds");
    assert!(seconds >= 1, "{seconds}");
    let message = answer["error"]["message"].as_str().expect("message");
    for what in [
        "no node has room",
        "node.max_sessions",
        "add nodes",
        "memory",
    ] {
        assert!(message.contains(what), "{what:?} not in {message:?}");
    }
    answer
}

async fn end(client: &reqwest::Client, base: &str, session: &str) {
    let (status, answer) = send(client.delete(format!("{base}/v1/sessions/{session}"))).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn full_nodes_refuse_with_retry_after_and_a_drained_node_is_not_late() {
    if !crate::helpers::can_build() {
        return;
    }
    let client = crate::helpers::http_client();
    let deployment = Deployment::start(&client).await;
    let base = deployment.base.clone();
    let id = create_environment_at(&client, &base, "Capacity").await;
    let (status, _) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/hello.txt"))
            .body("hello\n"),
    )
    .await;
    assert_eq!(status, 200);
    send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    let build =
        crate::helpers::wait_for_build_at(&client, &base, &id, 1, Duration::from_secs(60)).await;
    assert_eq!(build["status"], "ready", "{build}");
    let session = json!({"environment": id});

    // A node that runs two sessions at most.
    let command = deployment.node_command("slots", &["--max-sessions", "2"]);
    let mut slots = deployment.ready_node(&client, command, "slots").await;
    let first = created(&client, &base, session.clone()).await;
    let second = created(&client, &base, session.clone()).await;
    refused_for_room(&client, &base, session.clone()).await;
    end(&client, &base, &first).await;
    let third = created(&client, &base, session.clone()).await;
    refused_for_room(&client, &base, session.clone()).await;

    // It leaves on purpose: `plinth node --drain`, as an operator (or a preStop hook) runs it.
    let mut drain = deployment.node_command("slots", &["--drain"]);
    let drained = drain
        .stdout(Stdio::piped())
        .output()
        .expect("plinth node --drain");
    let said = String::from_utf8_lossy(&drained.stdout);
    assert!(drained.status.success(), "{said}");
    assert!(said.contains("left on purpose"), "{said}");
    assert!(
        said.contains("2 of its sessions are still active"),
        "{said}"
    );
    // With no other node, that is not "full" but "no node alive".
    let (status, retry_after, answer) = create(&client, &base, session.clone()).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(
        answer["error"]["detail"]["reason"], "no_live_node",
        "{answer}"
    );
    assert!(retry_after.is_some(), "{answer}");

    // A node whose cgroup holds 2.5 GiB: 2 GiB for sessions after its 512 MiB reserve, so
    // two sessions of the default 1 GiB.
    let cgroup = MemoryCgroup::new(
        &format!("plinth-e2e-capacity-{}", std::process::id()),
        2560 * 1024 * 1024,
    );
    let command = deployment.node_command("small", &[]);
    let small = deployment
        .ready_node(
            &client,
            cgroup.wrap(&command, deployment.node_log("small")),
            "small",
        )
        .await;
    let on_small = created(&client, &base, session.clone()).await;
    created(&client, &base, session.clone()).await;
    let full = refused_for_room(&client, &base, session.clone()).await;
    assert!(
        full["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("1024 MiB")),
        "{full}"
    );
    end(&client, &base, &on_small).await;
    // A GiB is free: more than that does not fit, a GiB does.
    refused_for_room(
        &client,
        &base,
        json!({"environment": id, "limits": {"memory_mb": 1536}}),
    )
    .await;
    created(
        &client,
        &base,
        json!({"environment": id, "limits": {"memory_mb": 1024}}),
    )
    .await;

    // Both stop: the drained one is not late, the one that just died is.
    drop(slots);
    drop(small);
    deployment
        .until_gauge(&client, "plinth_nodes{state=\"late\"}", 1.0)
        .await;
    assert_eq!(
        deployment
            .gauge(&client, "plinth_nodes{state=\"live\"}")
            .await,
        Some(0.0)
    );
    drop(cgroup);

    // Started again under its name, the drained node is back: live, and given sessions.
    let command = deployment.node_command("slots", &["--max-sessions", "2"]);
    slots = deployment.ready_node(&client, command, "slots").await;
    deployment
        .until_gauge(&client, "plinth_nodes{state=\"live\"}", 1.0)
        .await;
    end(&client, &base, &second).await;
    created(&client, &base, session.clone()).await;
    refused_for_room(&client, &base, session.clone()).await;
    end(&client, &base, &third).await;
    drop(slots);
}
