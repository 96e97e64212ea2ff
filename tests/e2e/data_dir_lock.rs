//! `plinth serve` as a user runs it, as a process of its own: one server per data directory
//! (a second is refused at once, naming the first, and the first goes on running sessions),
//! `/readyz` that means sessions run, an orderly stop that gives a running build back to the
//! queue before the databases close, and logs a file or a collector can take.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use plinth_catalog::testing::{self, PostgresAvailability};
use serde_json::{Value, json};

use crate::helpers::{Server, send};
use crate::processes::{Process, wait_until_ready};
use crate::waiting::eventually;

/// `plinth serve` on `data_dir`, listening on `http`, its log (stderr) written to `log`.
/// `plinth serve` on `data_dir` and port 0, its standard error in `log`; [`listening`] says
/// where it listens.
fn serve(data_dir: &Path, log: &Path, flags: &[&str], env: &[(&str, &str)]) -> Process {
    let file = std::fs::File::create(log).expect("log file");
    let dir = data_dir.to_str().expect("utf-8");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--data-dir", dir, "--listen", "127.0.0.1:0"])
        .arg("--ready-file")
        .arg(ready_file(log))
        .args(flags)
        .env("PLINTH_LOG", "info")
        .env("PLINTH_BUILDER_NETWORK", "false")
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_DATA_DIR")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    for (name, value) in env {
        command.env(name, value);
    }
    Process(command.spawn().expect("spawn plinth serve"))
}

fn ready_file(log: &Path) -> PathBuf {
    log.with_extension("ready")
}

/// Where `process`, started by [`serve`] logging to `log`, listens, once it does.
async fn listening(process: &mut Process, log: &Path) -> SocketAddr {
    crate::cluster::reported(process, &ready_file(log), Some(log)).await["listen"]
}

/// Waits (generously) for `process` to exit; `None` if it still runs.
async fn exited(process: &mut Process, within: Duration) -> Option<ExitStatus> {
    let polls = within.as_millis() / 50;
    for _ in 0..polls {
        if let Ok(Some(status)) = process.0.try_wait() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

fn signal(process: &Process, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &process.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// An environment holding one script, built through the gateway at `base`: its id.
async fn built(client: &reqwest::Client, base: &str, name: &str) -> String {
    let id = crate::helpers::create_environment_at(client, base, name).await;
    let (status, answer) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/run.py"))
            .body("print('hi')\n"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, queued) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{queued}");
    let build =
        crate::helpers::wait_for_build_at(client, base, &id, 1, Duration::from_secs(120)).await;
    assert_eq!(build["status"], "ready", "the build of {name}: {build}");
    id
}

/// `POST /v1/sessions` on `id`: the status and answer.
async fn new_session(client: &reqwest::Client, base: &str, id: &str) -> (u16, Value) {
    send(
        client
            .post(format!("{base}/v1/sessions"))
            .json(&json!({ "environment": id })),
    )
    .await
}

/// Runs `command` in `session`: the status and answer.
async fn exec(client: &reqwest::Client, base: &str, session: &str, command: &str) -> (u16, Value) {
    send(
        client
            .post(format!("{base}/v1/sessions/{session}/exec"))
            .json(&json!({ "command": command, "timeout_ms": 60_000 })),
    )
    .await
}

/// A new session of `id` in which `echo <word>` runs: anything else fails the test.
async fn session_runs(client: &reqwest::Client, base: &str, id: &str, word: &str) -> String {
    let (status, session) = new_session(client, base, id).await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().expect("session id").to_owned();
    let (status, ran) = exec(client, base, &session, &format!("echo {word}")).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], format!("{word}\n"), "{ran}");
    session
}

#[tokio::test]
async fn a_second_server_on_a_data_directory_is_refused_and_the_first_keeps_running_sessions() {
    if !crate::helpers::can_build() {
        return;
    }
    let data = tempfile::tempdir().expect("data");
    let logs = tempfile::tempdir().expect("logs");
    let client = crate::helpers::http_client();
    let first_log = logs.path().join("first.log");
    let mut first = serve(data.path(), &first_log, &[], &[]);
    let first_http = listening(&mut first, &first_log).await;
    let base = format!("http://{first_http}");
    wait_until_ready(&client, &format!("{base}/readyz"), &mut first).await;
    let id = built(&client, &base, "Locked").await;
    let session = session_runs(&client, &base, &id, "before").await;

    let second_log = logs.path().join("second.log");
    let mut second = serve(data.path(), &second_log, &[], &[]);
    let status = exited(&mut second, Duration::from_secs(60))
        .await
        .expect("the second server stops at once");
    let said = read(&second_log);
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!("pid {}", first.0.id()))
            && said.contains(&first_http.to_string())
            && said.contains("--data-dir"),
        "the refusal names the first server's pid and address, and what to do: {said}"
    );
    assert!(
        !said.contains("node registered"),
        "the second server registered a node: {said}"
    );

    // The first one is untouched: its session runs commands, and so does a new one.
    let (status, ran) = exec(&client, &base, &session, "echo after").await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "after\n", "{ran}");
    session_runs(&client, &base, &id, "new").await;
    let ready = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn at_the_first_ready_after_a_restart_a_session_runs_at_once() {
    if !crate::helpers::can_build() {
        return;
    }
    // The node of an earlier run was held suspect by a gateway that could not reach it (as
    // when a second server took its address over) when the server stopped.
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id =
        crate::helpers::built_environment(&server, "Restarted", Duration::from_secs(120)).await;
    let mut sessions =
        plinth_proto::catalog::v1::session_service_client::SessionServiceClient::with_interceptor(
            tonic::transport::Channel::from_shared(format!("http://{}", server.catalog_addr()))
                .expect("url")
                .connect()
                .await
                .expect("connect to the catalog"),
            server.interceptor(plinth_kit::auth::Role::Gateway),
        );
    let marked = sessions
        .mark_node_suspect(plinth_proto::catalog::v1::MarkNodeSuspectRequest {
            address: format!("http://{}", server.node_addr()),
            suspect_for_ms: 600_000,
        })
        .await
        .expect("mark the node suspect")
        .into_inner();
    assert_eq!(marked.nodes, 1);
    let data = server.stop_keeping_data().await;

    let logs = tempfile::tempdir().expect("logs");
    let client = crate::helpers::http_client();
    let log = logs.path().join("serve.log");
    let mut process = serve(data.path(), &log, &[], &[]);
    let http = listening(&mut process, &log).await;
    let base = format!("http://{http}");
    // From the process's start: the first time it says it is ready, sessions run.
    eventually(Duration::from_secs(60), async || {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("serve exited with {status}: {}", read(&log));
        }
        let response = client.get(format!("{base}/readyz")).send().await;
        match response {
            Ok(response) if response.status() == 200 => Ok(()),
            Ok(response) => Err(response.status().to_string()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    let (status, session) = new_session(&client, &base, &id).await;
    assert_eq!(status, 201, "a session at the first ready: {session}");
    let session = session["id"].as_str().expect("session id");
    let (status, ran) = exec(&client, &base, session, "echo ready").await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "ready\n", "{ran}");
    drop(process);
    crate::helpers::unmount_under(data.path());
}

/// Two servers on one PostgreSQL database (catalog and source index) and one blob directory,
/// each with its own data directory; the second runs no node.
struct Pair {
    root: tempfile::TempDir,
    database_url: String,
}

impl Pair {
    async fn new() -> Option<Self> {
        let PostgresAvailability::Available(server) = testing::postgres() else {
            return None;
        };
        let database_url = testing::fresh_postgres_database(&server).await;
        let root = tempfile::tempdir().expect("root");
        Some(Pair { root, database_url })
    }

    /// Starts the server `name` with `more` added to the configuration both share.
    async fn start(&self, name: &str, more: &str) -> (Process, PathBuf, SocketAddr) {
        let config = self.root.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                // A lease far longer than the test waits: only a build given back is taken
                // over in time.
                "[catalog]\nbuild_lease_seconds = 120\n[source]\ndatabase_url = \"{}\"\nblob_url = \"file://{}/blobs\"\n[gc]\ninterval_seconds = 0\n{more}",
                self.database_url,
                self.root.path().display()
            ),
        )
        .expect("config");
        let log = self.root.path().join(format!("{name}.log"));
        let mut process = serve(
            &self.root.path().join(name),
            &log,
            &[
                "--config",
                config.to_str().expect("utf-8"),
                "--database-url",
                &self.database_url,
            ],
            &[("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)],
        );
        let http = listening(&mut process, &log).await;
        (process, log, http)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        crate::helpers::unmount_under(self.root.path());
    }
}

#[tokio::test]
async fn ctrl_c_during_a_build_gives_it_back_to_another_builder_at_once() {
    if !crate::helpers::can_build() {
        return;
    }
    let Some(pair) = Pair::new().await else {
        return;
    };
    let client = crate::helpers::http_client();
    let (mut first, first_log, first_http) = pair.start("first", "").await;
    let first_base = format!("http://{first_http}");
    wait_until_ready(&client, &format!("{first_base}/readyz"), &mut first).await;
    let id = crate::helpers::create_environment_at(&client, &first_base, "Slow").await;
    let (status, answer) = send(
        client
            .put(format!("{first_base}/v1/environments/{id}/files/setup.sh"))
            .body("sleep 30\n"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, queued) =
        send(client.post(format!("{first_base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{queued}");
    let build = |base: String| {
        let (client, id) = (client.clone(), id.clone());
        async move {
            send(client.get(format!("{base}/v1/environments/{id}/builds/1")))
                .await
                .1
        }
    };
    let now = eventually(Duration::from_secs(60), async || {
        let now = build(first_base.clone()).await;
        if now["phase"] == "running" {
            Ok(now)
        } else {
            Err(format!(
                "the first server's builder has not taken the build: {now}"
            ))
        }
    })
    .await;
    assert_eq!(now["attempt"], 1, "{now}");

    // The second server's builder waits for work; the first server is stopped with Ctrl-C.
    let (mut second, _second_log, second_http) =
        pair.start("second", "[node]\nenabled = false\n").await;
    let second_base = format!("http://{second_http}");
    wait_until_ready(&client, &format!("{second_base}/readyz"), &mut second).await;
    signal(&first, "INT");
    let stopped = exited(&mut first, Duration::from_secs(60))
        .await
        .expect("the first server stops on Ctrl-C");
    let said = read(&first_log);
    assert!(stopped.success(), "{stopped}: {said}");

    // Taken by the second server's builder on the spot: its second attempt runs, while the
    // first attempt's lease had two minutes to go.
    let taken = eventually(Duration::from_secs(60), async || {
        let taken = build(second_base.clone()).await;
        if taken["attempt"].as_u64() >= Some(2) {
            Ok(taken)
        } else {
            Err(taken)
        }
    })
    .await;
    assert_eq!(taken["attempt"], 2, "{taken}");
    assert!(
        taken["status"] == "building" || taken["status"] == "ready",
        "{taken}"
    );
    // Given back while the catalog still served: before the other services were stopped.
    let given_back = said.find("given back");
    let others_stopped = said.find("builders stopped; stopping the other services");
    assert!(
        given_back.is_some() && others_stopped.is_some() && given_back < others_stopped,
        "the build was not given back before the catalog stopped: {said}"
    );
    let errors: Vec<&str> = said.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(errors.is_empty(), "errors on a clean stop: {errors:#?}");
}

#[tokio::test]
async fn logs_are_plain_lines_in_a_file_and_json_lines_when_asked() {
    let logs = tempfile::tempdir().expect("logs");
    let client = crate::helpers::http_client();
    for format in ["text", "json"] {
        let data = tempfile::tempdir().expect("data");
        let log = logs.path().join(format!("{format}.log"));
        let mut process = serve(data.path(), &log, &["--log-format", format], &[]);
        let http = listening(&mut process, &log).await;
        wait_until_ready(&client, &format!("http://{http}/readyz"), &mut process).await;
        // A request that logs as it goes: a harness is created (and its environment).
        let (status, environment) = crate::helpers::send(
            client
                .post(format!("http://{http}/v1/environments"))
                .json(&json!({"name": format!("Logged {format}")})),
        )
        .await;
        assert_eq!(status, 201, "{environment}");
        let (status, harness) = crate::helpers::send(
            client
                .post(format!("http://{http}/v1/harnesses"))
                .json(&json!({
                    "name": format!("Logged {format}"),
                    "base": "codex",
                    "environment": environment["id"],
                })),
        )
        .await;
        assert_eq!(status, 201, "{harness}");
        signal(&process, "TERM");
        let stopped = exited(&mut process, Duration::from_secs(60))
            .await
            .expect("serve stops on SIGTERM");
        let said = read(&log);
        if format == "json" {
            // A line logged in a request carries its trace's and span's ids at the top level.
            let created = said
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|event| event["fields"]["message"] == "harness created")
                .unwrap_or_else(|| panic!("no line for the harness: {said}"));
            let hex = |value: &Value, length: usize| {
                value.as_str().is_some_and(|id| {
                    id.len() == length && id.chars().all(|c| c.is_ascii_hexdigit())
                })
            };
            assert!(hex(&created["trace_id"], 32), "{created}");
            assert!(hex(&created["span_id"], 16), "{created}");
        }
        assert!(stopped.success(), "{stopped}: {said}");
        assert!(said.lines().count() >= 3, "{said}");
        assert!(!said.contains('\u{1b}'), "colour codes in a file: {said}");
        for line in said.lines() {
            // Long values are fields; the lines a person reads stay readable.
            assert!(
                format == "json" || line.chars().count() <= 600,
                "a line of {} characters: {line}",
                line.chars().count()
            );
            if format == "json" {
                let event: Value = serde_json::from_str(line)
                    .unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
                let message = event["fields"]["message"].as_str().unwrap_or_default();
                assert!(event["level"].is_string() && !message.is_empty(), "{line}");
                assert!(
                    message.chars().count() <= 160,
                    "a message of {} characters: {line}",
                    message.chars().count()
                );
            }
        }
        if format == "text" {
            assert!(said.contains(" INFO "), "{said}");
        }
    }
}
