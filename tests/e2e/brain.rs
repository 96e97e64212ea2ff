//! The Brain environment service through real HTTP, on a really built Brain-style Python
//! project (`pyproject.toml` + `uv.lock`, built with `uv sync --locked`, no network): the
//! whole lifecycle for both lifetimes, every receipt kind, `unsupported`, the bearer token,
//! duplicate deliveries, a deadline, a cancellation, lost resources, callbacks sent only to the
//! adapter's registered origins, and (with a real `plinth serve` process killed and started
//! again) redelivery across a restart and `unknown` for an operation interrupted mid-effect.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::builds::tiny_wheel;
use crate::helpers::{Server, assert_error, send};
use crate::processes::Process;
use crate::waiting::eventually;

/// A Brain-style project: its dependency comes from a wheel it carries, pinned by its lock.
const PYPROJECT: &str = r#"[project]
name = "brain-tools"
version = "0.1.0"
requires-python = ">=3.8"
dependencies = ["tinypkg==1.0"]

[tool.uv]
package = false
no-index = true
find-links = ["wheels"]
"#;

/// What `uv lock --offline` wrote for [`PYPROJECT`].
const UV_LOCK: &str = r#"version = 1
revision = 5
requires-python = ">=3.8"

[[package]]
name = "brain-tools"
version = "0.1.0"
source = { virtual = "." }
dependencies = [
    { name = "tinypkg" },
]

[package.metadata]
requires-dist = [{ name = "tinypkg", specifier = "==1.0" }]

[[package]]
name = "tinypkg"
version = "1.0"
source = { registry = "wheels" }
wheels = [
    { path = "tinypkg-1.0-py3-none-any.whl" },
]
"#;

/// Creates the project on `base` and builds it; answers its id and slug.
async fn python_project(client: &reqwest::Client, base: &str, name: &str) -> (String, String) {
    let (status, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .json(&json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let slug = created["slug"].as_str().expect("slug").to_owned();
    for (path, body) in [
        ("pyproject.toml", PYPROJECT.as_bytes().to_vec()),
        ("uv.lock", UV_LOCK.as_bytes().to_vec()),
        ("wheels/tinypkg-1.0-py3-none-any.whl", tiny_wheel()),
        (
            "tool.py",
            b"import tinypkg\nprint('tool ran with', tinypkg.__file__)\n".to_vec(),
        ),
    ] {
        let (status, answer) = send(
            client
                .put(format!("{base}/v1/environments/{id}/files/{path}"))
                .body(body),
        )
        .await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (status, queued) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{queued}");
    let build =
        crate::helpers::wait_for_build_at(client, base, &id, 1, Duration::from_secs(120)).await;
    assert_eq!(build["status"], "ready", "{build}");
    let log = build["log"].as_str().unwrap_or_default();
    assert!(log.contains("==> uv sync --locked"), "{log}");
    (id, slug)
}

/// A registered Brain adapter: its id, where Brain posts, and its token.
struct Adapter {
    id: String,
    url: String,
    token: String,
}

/// The configuration that lets callbacks reach this test's loopback listeners (public
/// addresses only otherwise).
const LOOPBACK_CALLBACKS: &str = "[gateway]\ncallback_allow = [\"127.0.0.0/8\"]\n";

/// Registers a Brain adapter whose Brain calls back from `callback_origins`.
async fn register(
    client: &reqwest::Client,
    base: &str,
    environment: &str,
    callback_origins: &[&str],
) -> Adapter {
    let (status, adapter) = send(
        client
            .post(format!("{base}/v1/workspace-adapters"))
            .json(&json!({ "protocol": "brain", "environment": environment, "callback_origins": callback_origins })),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    Adapter {
        id: adapter["id"].as_str().expect("id").to_owned(),
        url: adapter["url"].as_str().expect("url").to_owned(),
        token: adapter["token"].as_str().expect("token").to_owned(),
    }
}

/// The origin (`http://127.0.0.1:<port>`) of a loopback URL.
fn origin_of(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("http");
    format!("http://{}", rest.split('/').next().expect("authority"))
}

/// One Brain session's Environment, as Brain addresses it.
struct Brain<'a> {
    client: &'a reqwest::Client,
    adapter: &'a Adapter,
    session: String,
    environment: &'static str,
    configuration: Value,
}

impl Brain<'_> {
    /// A command as Brain sends it, with the binding, template, context and reporter Plinth
    /// keeps unread.
    fn command(&self, sequence: u64, request: Value) -> Value {
        json!({
            "contract": "environment/v1",
            "operation": {
                "session_id": self.session,
                "environment": self.environment,
                "sequence": sequence,
                "request": request,
                "binding": { "id": format!("bnd_{}", self.session), "revision": 1 },
                "configuration": self.configuration,
                "template": { "driver": "plinth", "credential": "sealed" },
                "context": { "url": "http://127.0.0.1:9/context", "token": "ctx", "methods": ["emit"] },
                "reporter": { "url": "http://127.0.0.1:9/reporter", "token": "rep" },
            }
        })
    }

    async fn post(&self, body: &Value, token: Option<&str>) -> (u16, Value) {
        let mut request = self
            .client
            .post(format!("{}/v1/operations", self.adapter.url))
            .json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        send(request).await
    }

    /// Delivers an operation; answers the whole answer after checking it echoes the
    /// contract and sequence.
    async fn deliver(&self, sequence: u64, request: Value) -> Value {
        let (status, answer) = self
            .post(&self.command(sequence, request), Some(&self.adapter.token))
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["contract"], "environment/v1", "{answer}");
        assert_eq!(answer["sequence"], sequence, "{answer}");
        answer
    }

    /// Delivers an operation; answers its receipt.
    async fn receipt(&self, sequence: u64, request: Value) -> Value {
        self.deliver(sequence, request).await["receipt"].clone()
    }

    /// Runs a tool; answers its receipt.
    async fn tool(&self, sequence: u64, name: &str, input: Value) -> Value {
        self.receipt(
            sequence,
            json!({ "type": "execute", "descriptor": { "kind": "tool", "name": name }, "input": input }),
        )
        .await
    }

    /// Runs a command that must succeed; answers its output.
    async fn run(&self, sequence: u64, command: &str) -> Value {
        let receipt = self
            .tool(sequence, "run_command", json!({ "command": command }))
            .await;
        assert_eq!(receipt["type"], "result", "{command}: {receipt}");
        let output = receipt["output"].clone();
        assert_eq!(output["exit_code"], 0, "{command}: {output}");
        output
    }
}

/// Brain's side of an execution's callback: a real HTTP endpoint that records each call's
/// bearer token and body, and answers a committed sequence.
async fn callback_endpoint() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(String, Value)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}/callback",
        listener.local_addr().expect("address")
    );
    let (calls, received) = tokio::sync::mpsc::unbounded_channel();
    plinth_kit::tasks::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let calls = calls.clone();
            plinth_kit::tasks::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                let (head, body) = loop {
                    let read = stream.read(&mut buffer).await.unwrap_or(0);
                    if read == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..read]);
                    let text = String::from_utf8_lossy(&request).into_owned();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let length = head
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break (head.to_owned(), body[..length].to_owned());
                    }
                };
                let authorization = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("authorization")
                            .then(|| value.trim().to_owned())
                    })
                    .unwrap_or_default();
                let body = serde_json::from_str(&body).unwrap_or(Value::Null);
                let _ = calls.send((authorization, body));
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1\r\nconnection: close\r\n\r\n7")
                    .await;
            });
        }
    });
    (url, received)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|now| u64::try_from(now.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn assert_failure(receipt: &Value, code: &str) {
    assert_eq!(receipt["type"], "failure", "{receipt}");
    assert_eq!(receipt["code"], code, "{receipt}");
    assert!(receipt["retryable"].is_boolean(), "{receipt}");
    assert!(
        !receipt["message"].as_str().unwrap_or_default().is_empty(),
        "{receipt}"
    );
}

fn stdout(output: &Value) -> &str {
    output["stdout"].as_str().expect("stdout")
}

#[tokio::test]
async fn a_brain_session_lives_through_setup_tools_release_detach_and_teardown() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with_config(LOOPBACK_CALLBACKS, &["--builder-network", "false"]).await;
    let (environment, slug) = python_project(&server.client, &server.base, "Brain Tools").await;
    let mount = format!("/env/{slug}");
    // Brain's side of executions' callbacks, whose origin the adapter registers.
    let (callback, mut finished_calls) = callback_endpoint().await;
    let adapter = register(
        &server.client,
        &server.base,
        &environment,
        &[&origin_of(&callback)],
    )
    .await;
    assert_eq!(
        adapter.url,
        server.url(&format!(
            "/v1/workspace-adapters/{}/brain",
            adapter.url.rsplit('/').nth(1).expect("id")
        ))
    );

    // A workspace: its files last across turns until teardown.
    let workspace = Brain {
        client: &server.client,
        adapter: &adapter,
        session: "ses_workspace".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace", "image": "kept unread" }),
    };

    // Without the right token nothing runs: the same sequence is new afterwards.
    let setup = workspace.command(1, json!({ "type": "setup" }));
    for token in [
        None,
        Some("wrong"),
        Some(&adapter.token[..adapter.token.len() - 1]),
    ] {
        let (status, answer) = workspace.post(&setup, token).await;
        assert_error(status, &answer, 401, "unauthenticated");
    }
    let accepted = workspace.deliver(1, json!({ "type": "setup" })).await;
    assert_eq!(
        accepted["receipt"],
        json!({ "type": "accepted", "on_turn_end": "release" })
    );

    // Tools run in a Plinth session with the project mounted read-only at /env/<slug>, its
    // locked dependencies installed by the build: nothing is installed now.
    let python = workspace
        .run(
            2,
            "set -e; pwd; echo $PLINTH_SESSION_ID; python -c 'import sys, tinypkg; print(sys.prefix); print(tinypkg.__file__)'; \
             tinytool; python $PROJECT_ROOT/tool.py; echo UV_NO_SYNC=$UV_NO_SYNC; \
             test ! -e \"$HOME/.cache\" && test ! -e .venv && echo nothing-cached",
        )
        .await;
    let text = stdout(&python);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("/home/session"), "{python}");
    let plinth_session = lines.next().expect("the session's id").to_owned();
    let workdir = crate::helpers::host_workdir(&server.data_dir(), &plinth_session);
    assert!(workdir.is_dir(), "{}", workdir.display());
    assert!(text.contains(&format!("{mount}/.venv\n")), "{python}");
    assert!(
        text.contains(&format!("{mount}/.venv/lib/")) && text.contains("tinytool ran"),
        "{python}"
    );
    assert!(text.contains("tool ran with"), "{python}");
    assert!(text.contains("UV_NO_SYNC=1"), "{python}");
    assert!(text.contains("nothing-cached"), "{python}");
    assert_eq!(python["version"], 1);
    let refused = workspace
        .tool(
            3,
            "run_command",
            json!({ "command": format!("touch {mount}/.venv/x") }),
        )
        .await;
    assert_eq!(refused["type"], "result", "{refused}");
    assert_ne!(refused["output"]["exit_code"], 0, "{refused}");

    // A Tool granted `finish` is finished through its callback once its receipt is stored,
    // once: a duplicate delivery answers the receipt and calls nothing.
    let granted = json!({
        "type": "execute",
        "descriptor": { "kind": "tool", "name": "run_command" },
        "input": { "command": "echo called back" },
        "callback": { "url": callback, "token": "cb-token-1", "methods": ["emit", "result", "finish"] },
    });
    let first = workspace.receipt(40, granted.clone()).await;
    assert_eq!(first["output"]["stdout"], "called back\n", "{first}");
    let (authorization, body) =
        tokio::time::timeout(Duration::from_secs(10), finished_calls.recv())
            .await
            .expect("finish was called")
            .expect("a call");
    assert_eq!(authorization, "Bearer cb-token-1");
    assert_eq!(body, json!({ "method": "finish", "input": null }));
    let mut redelivered = granted;
    redelivered["callback"]["token"] = json!("cb-token-2");
    assert_eq!(workspace.receipt(40, redelivered).await, first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(finished_calls.try_recv().is_err(), "finish is called once");

    // Large inputs and outputs: a 3 MiB write; a 5 MiB read; an output too large to keep for
    // redelivery is refused as such, not lost.
    let big = "b".repeat(3 * 1024 * 1024);
    let written = workspace
        .tool(
            41,
            "write_file",
            json!({ "path": "big.txt", "contents": big }),
        )
        .await;
    assert_eq!(
        written["output"]["bytes_written"],
        3 * 1024 * 1024,
        "{written}"
    );
    workspace
        .run(42, "head -c 9437184 /dev/zero | tr '\\0' a > huge.txt")
        .await;
    let read = workspace
        .tool(
            43,
            "read_file",
            json!({ "path": "huge.txt", "max_bytes": 5 * 1024 * 1024 }),
        )
        .await;
    assert_eq!(read["type"], "result", "{}", read["type"]);
    assert_eq!(read["output"]["bytes"], 9437184);
    assert_eq!(read["output"]["truncated"], true);
    assert_eq!(
        read["output"]["content"].as_str().map(str::len),
        Some(5 * 1024 * 1024)
    );
    let too_large = workspace
        .tool(
            44,
            "read_file",
            json!({ "path": "huge.txt", "max_bytes": 9437184 }),
        )
        .await;
    assert_failure(&too_large, "file_too_large");

    // Files: the workspace operations the Novo adapter uses too.
    let written = workspace
        .tool(
            4,
            "write_file",
            json!({ "path": "notes/plan.md", "contents": "step one\n" }),
        )
        .await;
    assert_eq!(written["type"], "result", "{written}");
    assert_eq!(written["output"]["path"], "notes/plan.md", "{written}");
    assert_eq!(written["output"]["bytes_written"], 9, "{written}");
    assert_eq!(written["output"]["created"], true, "{written}");
    let edited = workspace
        .tool(
            5,
            "edit_file",
            json!({ "path": "notes/plan.md", "operation": "append", "contents": "step two\n" }),
        )
        .await;
    assert_eq!(edited["type"], "result", "{edited}");
    let read = workspace
        .tool(6, "read_file", json!({ "path": "notes/plan.md" }))
        .await;
    assert_eq!(read["output"]["content"], "step one\nstep two\n", "{read}");
    assert_eq!(read["output"]["encoding"], "utf8");
    assert_eq!(read["output"]["total_lines"], 2, "{read}");
    let missing = workspace
        .tool(7, "read_file", json!({ "path": "notes/none.md" }))
        .await;
    assert_failure(&missing, "workspace_not_found");
    let listed = workspace
        .tool(30, "list_files", json!({ "path": "notes" }))
        .await;
    assert_eq!(
        listed["output"]["entries"],
        json!([{ "path": "notes/plan.md", "type": "file", "bytes": 18 }]),
        "{listed}"
    );
    let searched = workspace
        .tool(31, "search_files", json!({ "pattern": "step t.o" }))
        .await;
    assert_eq!(
        searched["output"]["matches"][0]["path"], "notes/plan.md",
        "{searched}"
    );
    assert_eq!(searched["output"]["matches"][0]["line"], 2, "{searched}");
    let found = workspace
        .tool(32, "find_files", json!({ "pattern": "*.md" }))
        .await;
    assert_eq!(
        found["output"]["entries"][0]["path"], "notes/plan.md",
        "{found}"
    );
    let patched = workspace
        .tool(
            33,
            "apply_patch",
            json!({ "operations": [{ "type": "update_file", "path": "notes/plan.md", "diff": "@@ -1,2 +1,2 @@\n step one\n-step two\n+step 2\n" }] }),
        )
        .await;
    assert_eq!(patched["output"]["applied"], true, "{patched}");
    let mounted = workspace
        .tool(
            34,
            "read_file",
            json!({ "path": format!("{mount}/pyproject.toml") }),
        )
        .await;
    assert!(
        mounted["output"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("brain-tools"),
        "{mounted}"
    );
    let read_only = workspace
        .tool(
            35,
            "write_file",
            json!({ "path": format!("{mount}/x.txt"), "contents": "no" }),
        )
        .await;
    assert_failure(&read_only, "workspace_read_only");

    // Every tool call is a turn of the Plinth session, with the version it read.
    let (status, turns) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{plinth_session}/turns"))),
    )
    .await;
    assert_eq!(status, 200, "{turns}");
    let kinds: Vec<&str> = turns["data"]
        .as_array()
        .expect("turns")
        .iter()
        .map(|turn| {
            assert_eq!(turn["version"], 1, "{turn}");
            turn["kind"].as_str().expect("kind")
        })
        .collect();
    for kind in [
        "exec",
        "write_file",
        "edit_file",
        "read_file",
        "list_files",
        "search_files",
        "find_files",
        "apply_patch",
    ] {
        assert!(kinds.contains(&kind), "{kind} not in {kinds:?}");
    }

    // Duplicate delivery: the identical answer, and the effect happened once.
    let once = workspace.deliver(8, json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo tick >> ticks.txt; wc -l < ticks.txt" } })).await;
    let twice = workspace.deliver(8, json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo tick >> ticks.txt; wc -l < ticks.txt" } })).await;
    assert_eq!(once, twice);
    assert_eq!(stdout(&workspace.run(9, "cat ticks.txt").await), "tick\n");
    // The same sequence with another request is refused, and nothing runs.
    let reused = workspace
        .tool(
            8,
            "run_command",
            json!({ "command": "echo tock >> ticks.txt" }),
        )
        .await;
    assert_failure(&reused, "sequence_reused");
    assert_eq!(stdout(&workspace.run(10, "cat ticks.txt").await), "tick\n");

    // `progress`: a delivery that meets the first one still running.
    let slow = workspace.command(
        11,
        json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "sleep 2; echo slow" } }),
    );
    let first = {
        let client = server.client.clone();
        let url = format!("{}/v1/operations", adapter.url);
        let token = adapter.token.clone();
        let body = slow.clone();
        plinth_kit::tasks::spawn(async move {
            send(client.post(url).bearer_auth(token).json(&body)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (status, meanwhile) = workspace.post(&slow, Some(&adapter.token)).await;
    assert_eq!(status, 200, "{meanwhile}");
    assert_eq!(meanwhile["receipt"]["type"], "progress", "{meanwhile}");
    let (status, finished) = first.await.expect("first delivery");
    assert_eq!(status, 200);
    assert_eq!(
        finished["receipt"]["output"]["stdout"], "slow\n",
        "{finished}"
    );
    let (_, after) = workspace.post(&slow, Some(&adapter.token)).await;
    assert_eq!(after, finished);

    // Two identical deliveries at once: one execution, and both answer the same receipt.
    let twin = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo twin >> twins.txt; wc -l < twins.txt" } });
    let (one, other) = tokio::join!(
        workspace.deliver(901, twin.clone()),
        workspace.deliver(901, twin.clone())
    );
    assert_eq!(one, other);
    assert_eq!(one["receipt"]["output"]["stdout"], "1\n", "{one}");
    assert_eq!(stdout(&workspace.run(902, "cat twins.txt").await), "twin\n");
    // A read (run without a claim) twice at once, then again after the file changed: the
    // first receipt every time; another request under its sequence is refused.
    let read = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "read_file" }, "input": { "path": "twins.txt" } });
    let (one, other) = tokio::join!(
        workspace.deliver(903, read.clone()),
        workspace.deliver(903, read.clone())
    );
    assert_eq!(one, other);
    assert_eq!(one["receipt"]["type"], "result", "{one}");
    workspace.run(904, "echo changed > twins.txt").await;
    assert_eq!(workspace.deliver(903, read).await, one);
    assert_failure(
        &workspace
            .tool(903, "read_file", json!({ "path": "ticks.txt" }))
            .await,
        "sequence_reused",
    );

    // A deadline that passes: `timeout`, and what the command left running is killed.
    let timed_out = workspace
        .receipt(
            12,
            json!({
                "type": "execute",
                "descriptor": { "kind": "tool", "name": "run_command" },
                "input": { "command": "echo started > deadline.txt; sleep 30; echo finished >> deadline.txt" },
                "deadline": now_ms() + 1500,
            }),
        )
        .await;
    assert_failure(&timed_out, "timeout");
    let killed = &timed_out["details"]["cleanup"]["killed_processes"];
    assert!(
        killed.as_array().is_some_and(|pids| !pids.is_empty()),
        "{timed_out}"
    );
    let past = workspace
        .receipt(
            13,
            json!({
                "type": "execute",
                "descriptor": { "kind": "tool", "name": "run_command" },
                "input": { "command": "echo never > never.txt" },
                "deadline": now_ms() - 1,
            }),
        )
        .await;
    assert_failure(&past, "timeout");
    assert_eq!(past["details"]["cleanup"]["started"], false, "{past}");

    // An explicit cancellation: `cancelled` for the tool, `returned` for the cancel.
    let long = {
        let client = server.client.clone();
        let url = format!("{}/v1/operations", adapter.url);
        let token = adapter.token.clone();
        let body = workspace.command(
            14,
            json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "sleep 60" } }),
        );
        plinth_kit::tasks::spawn(async move {
            send(client.post(url).bearer_auth(token).json(&body)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let cancel = workspace
        .receipt(15, json!({ "type": "cancel", "sequence": 14 }))
        .await;
    assert_eq!(cancel["type"], "returned", "{cancel}");
    assert_eq!(cancel["output"]["running"], true, "{cancel}");
    let (status, cancelled) = long.await.expect("cancelled delivery");
    assert_eq!(status, 200);
    assert_failure(&cancelled["receipt"], "cancelled");
    assert!(
        cancelled["receipt"]["details"]["cleanup"]["killed_processes"]
            .as_array()
            .is_some_and(|pids| !pids.is_empty()),
        "{cancelled}"
    );
    let files = workspace.run(16, "cat deadline.txt; ls").await;
    assert_eq!(
        stdout(&files).lines().next(),
        Some("started"),
        "the command stopped at the deadline: {files}"
    );
    assert!(!stdout(&files).contains("never.txt"), "{files}");

    // `unsupported`: another contract, an operation, a descriptor, a call, a tool.
    let (status, other) = workspace
        .post(
            &json!({ "contract": "environment/v2", "operation": { "session_id": "ses_workspace", "environment": "plinth", "sequence": 17, "request": { "type": "setup" } } }),
            Some(&adapter.token),
        )
        .await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["contract"], "environment/v2");
    assert_eq!(other["sequence"], 17);
    assert_failure(&other["receipt"], "unsupported");
    for (sequence, request) in [
        (18, json!({ "type": "turn" })),
        (
            19,
            json!({ "type": "execute", "descriptor": { "kind": "agentloop", "name": "loop" } }),
        ),
        (
            20,
            json!({ "type": "call", "name": "snapshot", "input": {} }),
        ),
        (
            21,
            json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "teleport" } }),
        ),
    ] {
        assert_failure(&workspace.receipt(sequence, request).await, "unsupported");
    }

    // Turn end: a workspace keeps its session and files.
    let release = workspace
        .receipt(
            22,
            json!({ "type": "call", "name": "release", "input": { "sequence": 2 } }),
        )
        .await;
    assert_eq!(release["type"], "returned", "{release}");
    assert_eq!(release["output"]["released"], false, "{release}");
    let kept = release["output"]["kept"].as_str().expect("kept").to_owned();
    let next_turn = workspace.run(23, "pwd; cat notes/plan.md").await;
    assert_eq!(stdout(&next_turn), "/home/session\nstep one\nstep 2\n");

    // Detach: no more tools; the working directory is kept for teardown.
    let detached = workspace.receipt(24, json!({ "type": "detach" })).await;
    assert_eq!(detached["type"], "returned", "{detached}");
    let after_detach = workspace
        .tool(25, "read_file", json!({ "path": "notes/plan.md" }))
        .await;
    assert_failure(&after_detach, "not_attached");
    assert!(workdir.is_dir());

    // Teardown: everything the session had is gone.
    let teardown = workspace.receipt(26, json!({ "type": "teardown" })).await;
    assert_eq!(teardown["type"], "returned", "{teardown}");
    assert_eq!(teardown["output"]["ended"][0]["session"], kept.as_str());
    assert!(!workdir.exists(), "{}", workdir.display());
    let (_, session) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{kept}"))),
    )
    .await;
    assert_eq!(session["status"], "ended", "{session}");
    assert_failure(
        &workspace.receipt(27, json!({ "type": "setup" })).await,
        "not_attached",
    );

    // A disposable session: each turn's end ends its resources; the next turn gets new ones.
    let disposable = Brain {
        client: &server.client,
        adapter: &adapter,
        session: "ses_disposable".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "disposable" }),
    };
    assert_eq!(
        disposable.receipt(1, json!({ "type": "setup" })).await,
        json!({ "type": "accepted", "on_turn_end": "release" })
    );
    let first_turn = disposable
        .run(2, "echo $PLINTH_SESSION_ID; echo draft > draft.txt")
        .await;
    let first_session = stdout(&first_turn).trim().to_owned();
    let first_workdir = crate::helpers::host_workdir(&server.data_dir(), &first_session);
    assert!(first_workdir.is_dir(), "{}", first_workdir.display());
    let release = disposable
        .receipt(
            3,
            json!({ "type": "call", "name": "release", "input": { "sequence": 2 } }),
        )
        .await;
    assert_eq!(release["type"], "returned", "{release}");
    assert_eq!(release["output"]["released"], true, "{release}");
    assert!(!first_workdir.exists());
    let second_turn = disposable
        .run(
            4,
            "echo $PLINTH_SESSION_ID; test ! -e draft.txt && echo fresh",
        )
        .await;
    let lines: Vec<&str> = stdout(&second_turn).lines().collect();
    assert_ne!(lines[0], first_session);
    assert_eq!(lines[1], "fresh");
    // Its Plinth session ended outside Brain: that loss is reported, never replaced.
    let second_session = disposable
        .receipt(
            5,
            json!({ "type": "call", "name": "release", "input": { "sequence": 4 } }),
        )
        .await["output"]["cleanup"]["session"]
        .as_str()
        .expect("released session")
        .to_owned();
    let third = disposable.run(6, "echo $PLINTH_SESSION_ID").await;
    let third_session = stdout(&third).trim().to_owned();
    assert!(third_session.starts_with("sess_"), "{third}");
    assert_ne!(third_session, second_session);
    let (status, _) = send(
        server
            .client
            .delete(server.url(&format!("/v1/sessions/{third_session}"))),
    )
    .await;
    assert_eq!(status, 200);
    let lost = disposable.run_lost(7).await;
    assert_failure(&lost, "resource_lost");
    assert_eq!(
        lost["details"]["resource"],
        third_session.as_str(),
        "{lost}"
    );
    assert_failure(&disposable.run_lost(8).await, "resource_lost");
    let detached = disposable.receipt(9, json!({ "type": "detach" })).await;
    assert_eq!(detached["type"], "returned", "{detached}");
    let teardown = disposable.receipt(10, json!({ "type": "teardown" })).await;
    assert_eq!(teardown["type"], "returned", "{teardown}");
    // Delivered again after teardown: the stored receipt, nothing new.
    assert_eq!(
        disposable.receipt(10, json!({ "type": "teardown" })).await,
        teardown
    );

    // Setup on a version that is not ready: refused, with Plinth's code.
    let pinned = Brain {
        client: &server.client,
        adapter: &adapter,
        session: "ses_pinned".into(),
        environment: "plinth",
        configuration: json!({ "version": 7 }),
    };
    assert_failure(
        &pinned.receipt(1, json!({ "type": "setup" })).await,
        "environment_not_ready",
    );
    server.stop().await;
}

/// An execution of `run_command` whose callback grants `finish` at `url` with `token`.
fn called_back(command: &str, url: &str, token: &str) -> Value {
    json!({
        "type": "execute",
        "descriptor": { "kind": "tool", "name": "run_command" },
        "input": { "command": command },
        "callback": { "url": url, "token": token, "methods": ["emit", "finish"] },
    })
}

/// A listener on loopback that accepts every connection and counts it: where an attacker
/// would have Plinth send a callback. Answers its base URL and the count.
async fn counting_listener() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    plinth_kit::tasks::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    (url, count)
}

#[tokio::test]
async fn an_execution_is_called_back_only_at_a_registered_origin() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with_config(LOOPBACK_CALLBACKS, &["--builder-network", "false"]).await;
    let environment =
        crate::helpers::built_environment(&server, "Called Back", Duration::from_secs(120)).await;
    let (callback, mut finished_calls) = callback_endpoint().await;
    let allowed = origin_of(&callback);
    let port = allowed.rsplit(':').next().expect("port").to_owned();
    let (target, connections) = counting_listener().await;

    // Registered with a trailing slash; kept and shown as the origin.
    let adapter = register(
        &server.client,
        &server.base,
        &environment,
        &[&format!("{allowed}/")],
    )
    .await;
    let (status, shown) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{}", adapter.id))),
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["callback_origins"], json!([allowed]), "{shown}");
    let brain = Brain {
        client: &server.client,
        adapter: &adapter,
        session: "ses_callbacks".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace" }),
    };
    assert_eq!(
        brain.receipt(1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );

    // As whoever holds the adapter's token: callbacks elsewhere on loopback (another port,
    // the registered port under another name or scheme). Each is refused before it runs, and
    // says why.
    let mut refusals = Vec::new();
    for (sequence, url) in [
        (2, format!("{target}/steal")),
        (3, format!("http://localhost:{port}/callback")),
        (4, format!("https://127.0.0.1:{port}/callback")),
    ] {
        let receipt = brain
            .receipt(
                sequence,
                called_back("echo ran >> ran.txt", &url, "stolen-token"),
            )
            .await;
        assert_failure(&receipt, "callback_refused");
        assert_eq!(receipt["retryable"], false, "{receipt}");
        let message = receipt["message"].as_str().expect("message");
        assert!(
            message.contains("not a registered callback origin") && message.contains(&allowed),
            "{message}"
        );
        assert!(!message.contains("stolen-token"), "{message}");
        assert_eq!(receipt["details"]["callback_origins"], json!([allowed]));
        refusals.push(receipt);
    }
    // A redelivery with another token answers the same refusal and sends nothing either.
    assert_eq!(
        brain
            .receipt(
                2,
                called_back("echo ran >> ran.txt", &format!("{target}/steal"), "token-2")
            )
            .await,
        refusals[0]
    );

    // At the registered origin: the tool runs (and nothing of the refused ones ran before
    // it), and it is finished through its callback with its token.
    let inside = brain
        .receipt(
            5,
            called_back(
                "test ! -e ran.txt && echo nothing-ran",
                &callback,
                "cb-token-inside",
            ),
        )
        .await;
    assert_eq!(inside["type"], "result", "{inside}");
    assert_eq!(stdout(&inside["output"]), "nothing-ran\n", "{inside}");
    let (authorization, body) =
        tokio::time::timeout(Duration::from_secs(10), finished_calls.recv())
            .await
            .expect("finish was called")
            .expect("a call");
    assert_eq!(authorization, "Bearer cb-token-inside");
    assert_eq!(body, json!({ "method": "finish", "input": null }));
    // The refused executions were delivered before this one, whose callback has come; well
    // after it, nothing has reached the target, nor the registered origin for them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing was sent outside the registered origins"
    );
    assert!(finished_calls.try_recv().is_err(), "only the one finish");

    // An adapter registered without origins runs executions without a callback and refuses
    // those with one, saying how to register its origin; once registered, it is called back.
    let bare = register(&server.client, &server.base, &environment, &[]).await;
    let bare_brain = Brain {
        client: &server.client,
        adapter: &bare,
        session: "ses_bare".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace" }),
    };
    assert_eq!(
        bare_brain.receipt(1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );
    assert_eq!(stdout(&bare_brain.run(2, "echo plain").await), "plain\n");
    let refused = bare_brain
        .receipt(3, called_back("echo x", &callback, "cb-token-bare"))
        .await;
    assert_failure(&refused, "callback_refused");
    let message = refused["message"].as_str().expect("message");
    assert!(
        message.contains("registered none")
            && message.contains(&format!("PATCH /v1/workspace-adapters/{}", bare.id)),
        "{message}"
    );
    let (status, patched) = send(
        server
            .client
            .patch(server.url(&format!("/v1/workspace-adapters/{}", bare.id)))
            .json(&json!({ "callback_origins": [allowed] })),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["callback_origins"], json!([allowed]));
    assert!(patched.get("token").is_none(), "{patched}");
    let later = bare_brain
        .receipt(4, called_back("echo later", &callback, "cb-token-later"))
        .await;
    assert_eq!(stdout(&later["output"]), "later\n", "{later}");
    let (authorization, _) = tokio::time::timeout(Duration::from_secs(10), finished_calls.recv())
        .await
        .expect("finish was called")
        .expect("a call");
    assert_eq!(authorization, "Bearer cb-token-later");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        finished_calls.try_recv().is_err(),
        "the refused one was never sent"
    );
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    server.stop().await;
}

impl Brain<'_> {
    /// A tool call on lost resources; answers its receipt.
    async fn run_lost(&self, sequence: u64) -> Value {
        self.tool(sequence, "run_command", json!({ "command": "true" }))
            .await
    }
}

/// `plinth serve` as a real process, so it can be killed and started again on the same data
/// directory: on port 0 at first, then at `http`, the address it had; answers it once ready,
/// and that address.
async fn serve(
    data: &std::path::Path,
    http: Option<std::net::SocketAddr>,
) -> (Process, std::net::SocketAddr) {
    let http = http.map_or_else(|| "127.0.0.1:0".to_owned(), |http| http.to_string());
    let config = data.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[gateway]\nlisten = \"{http}\"\nbrain_operation_lease_seconds = 2\n[builder]\nnetwork = false\n",
            data.display()
        ),
    )
    .expect("config");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.join("serve.log"))
        .expect("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("PLINTH_LOG", "info")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    crate::cluster::spawn_serve(&mut command).await
}

#[tokio::test]
async fn redelivery_after_a_restart_answers_the_stored_receipt_or_unknown() {
    if !crate::helpers::can_build() {
        return;
    }
    let data = tempfile::tempdir().expect("data");
    let client = crate::helpers::http_client();
    let (mut process, http) = serve(data.path(), None).await;
    let base = format!("http://{http}");
    let (environment, _) = python_project(&client, &base, "Restarted Tools").await;
    let adapter = register(&client, &base, &environment, &[]).await;
    let brain = Brain {
        client: &client,
        adapter: &adapter,
        session: "ses_restart".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace" }),
    };
    assert_eq!(
        brain.receipt(1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );
    let append = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo once >> effects.txt; cat effects.txt" } });
    let before = brain.deliver(2, append.clone()).await;
    assert_eq!(before["receipt"]["output"]["stdout"], "once\n", "{before}");

    // A command still running when the service is killed.
    let interrupted = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo started >> interrupted.txt; sleep 60; echo finished >> interrupted.txt" } });
    let pending = {
        let client = client.clone();
        let url = format!("{}/v1/operations", adapter.url);
        let token = adapter.token.clone();
        let body = brain.command(3, interrupted.clone());
        plinth_kit::tasks::spawn(async move {
            client.post(url).bearer_auth(token).json(&body).send().await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A read answered just before the service is killed.
    let read = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "read_file" }, "input": { "path": "effects.txt" } });
    let read_before = brain.deliver(8, read.clone()).await;
    assert_eq!(read_before["receipt"]["type"], "result", "{read_before}");
    process.0.kill().expect("kill");
    process.0.wait().expect("wait");
    assert!(
        pending.await.expect("task").is_err(),
        "the connection died with the service"
    );

    let (mut process, _) = serve(data.path(), Some(http)).await;

    // Finished before the restart: the stored receipt, and the effect is not repeated.
    let again = brain.deliver(2, append).await;
    assert_eq!(again, before);
    // Interrupted mid-effect: `unknown` once its lease has run out (`progress` until then),
    // the same `unknown` ever after, and never run again.
    let unknown = eventually(Duration::from_secs(20), async || {
        let answer = brain.deliver(3, interrupted.clone()).await;
        match answer["receipt"]["type"].as_str() {
            Some("progress") => Err(answer),
            Some("unknown") => Ok(answer),
            _ => panic!("neither progress nor unknown: {answer}"),
        }
    })
    .await;
    assert_eq!(unknown["receipt"]["type"], "unknown", "{unknown}");
    assert_eq!(brain.deliver(3, interrupted).await, unknown);
    let effects = brain
        .tool(
            4,
            "run_command",
            json!({ "command": "echo $PLINTH_SESSION_ID; cat effects.txt; cat interrupted.txt" }),
        )
        .await;
    assert_eq!(
        effects["type"],
        "result",
        "{effects}\n{}",
        std::fs::read_to_string(data.path().join("serve.log")).unwrap_or_default()
    );
    let effects = effects["output"].clone();
    let text = stdout(&effects);
    let (session, effects) = text.split_once('\n').expect("the session's id");
    let workdir = crate::helpers::host_workdir(data.path(), session);
    assert_eq!(effects, "once\nstarted\n", "{text}");
    // The read answered before the restart answers the same after it, though the file changed.
    brain.run(9, "echo more >> effects.txt").await;
    assert_eq!(brain.deliver(8, read).await, read_before);

    // Its working directory lost while the service was down: a failure naming the session,
    // and no new one in its place.
    process.0.kill().expect("kill");
    process.0.wait().expect("wait");
    let session_dir = workdir.parent().expect("session dir");
    std::fs::remove_dir_all(session_dir).expect("remove the session's directory");
    let (process, _) = serve(data.path(), Some(http)).await;
    let lost = brain
        .tool(5, "run_command", json!({ "command": "pwd" }))
        .await;
    assert_failure(&lost, "resource_lost");
    let session = session_dir
        .file_name()
        .and_then(|name| name.to_str())
        .expect("session id");
    assert_eq!(lost["details"]["resource"], session, "{lost}");
    assert_failure(
        &brain
            .tool(6, "read_file", json!({ "path": "effects.txt" }))
            .await,
        "resource_lost",
    );
    assert!(!session_dir.exists(), "nothing was made in its place");
    let teardown = brain.receipt(7, json!({ "type": "teardown" })).await;
    assert_eq!(teardown["type"], "returned", "{teardown}");
    drop(process);
}

#[tokio::test]
async fn reads_under_the_mount_see_a_layered_version_as_its_commands_do() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (environment, slug) =
        crate::novo::environment(&server, "Layered", &crate::novo::studio_files()).await;
    let adapter = register(&server.client, &server.base, &environment, &[]).await;
    let brain = |session: &str| Brain {
        client: &server.client,
        adapter: &adapter,
        session: session.to_owned(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace" }),
    };
    let scale = format!("/env/{slug}/studio/scale.py");
    // A session on version 1 puts it in the node's cache, so version 2, which changes one
    // file, is cached as a layer over it.
    let first = brain("ses_layered_1");
    assert_eq!(
        first.receipt(1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );
    assert_eq!(
        stdout(&first.run(2, &format!("cat {scale}")).await),
        "def scale(x):\n    return x * 2\n"
    );
    crate::helpers::put_file(
        &server,
        &environment,
        "studio/notes.txt",
        "Scale by three.\n",
    )
    .await;
    crate::helpers::build_ready(&server, &environment, 2, Duration::from_secs(180)).await;

    let second = brain("ses_layered_2");
    assert_eq!(
        second.receipt(1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );
    assert_eq!(
        stdout(
            &second
                .run(2, &format!("cat /env/{slug}/studio/notes.txt"))
                .await
        ),
        "Scale by three.\n",
        "the session is on version 2"
    );
    // A file version 2 did not change lives only in the layer below: the tools see it as
    // the session's commands do.
    let read = second.tool(3, "read_file", json!({ "path": scale })).await;
    let listed = second
        .tool(
            4,
            "list_files",
            json!({ "path": format!("/env/{slug}/studio") }),
        )
        .await;
    let found = second
        .tool(
            5,
            "search_files",
            json!({ "pattern": "return x", "path": format!("/env/{slug}") }),
        )
        .await;
    for receipt in [&read, &listed, &found] {
        assert_eq!(receipt["type"], "result", "{receipt}");
    }
    crate::novo::assert_reads_see_the_layer_below(
        &slug,
        &read["output"],
        &listed["output"],
        &found["output"],
    );
    server.stop().await;
}

/// The catalog killed (SIGKILL) while a tool runs, so its receipt cannot be stored when it
/// ends: that delivery is answered a transport failure, no receipt; every later delivery
/// answers one receipt (`unknown`: the tool may have had its effect), and the tool never
/// runs again. A read while the catalog is gone is answered a transport failure too, and
/// once it is back, its result, the same ever after.
#[tokio::test]
async fn a_catalog_gone_at_the_write_never_makes_an_operation_answer_twice_differently() {
    if !crate::helpers::can_build() {
        return;
    }
    let mut cluster = crate::cluster::Cluster::builder()
        .config("[gateway]\nbrain_operation_lease_seconds = 2\n")
        .with(crate::cluster::Part::Builder, 1)
        .with(crate::cluster::Part::Node, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    let base = cluster.base();
    let client = cluster.client.clone();
    let (environment, _) = python_project(&client, &base, "Catalog Gone").await;
    let mut adapter = register(&client, &base, &environment, &[]).await;
    adapter.url = format!("{base}/v1/workspace-adapters/{}/brain", adapter.id);
    let brain = Brain {
        client: &client,
        adapter: &adapter,
        session: "ses_catalog_gone".into(),
        environment: "plinth",
        configuration: json!({ "lifetime": "workspace" }),
    };
    // Set up once the node has registered (a setup with no node fails, and is kept).
    let mut sequence = 0;
    let setup = eventually(Duration::from_secs(20), async || {
        sequence += 1;
        let receipt = brain.receipt(sequence, json!({ "type": "setup" })).await;
        if receipt["type"] == "accepted" {
            Ok(receipt)
        } else {
            Err(receipt)
        }
    })
    .await;
    assert_eq!(setup["type"], "accepted");

    let command = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "run_command" }, "input": { "command": "echo c >> c.txt; sleep 3; echo ran" } });
    let first = {
        let client = client.clone();
        let url = format!("{}/v1/operations", adapter.url);
        let token = adapter.token.clone();
        let body = brain.command(100, command.clone());
        plinth_kit::tasks::spawn(async move {
            send(client.post(url).bearer_auth(token).json(&body)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.kill("catalog-1");
    let (status, first) = first.await.expect("first delivery");
    assert_eq!(status, 503, "no receipt could be stored: {first}");

    // A read while the catalog is gone: no receipt either.
    let read = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "read_file" }, "input": { "path": "c.txt" } });
    let (status, gone) = brain
        .post(&brain.command(101, read.clone()), Some(&adapter.token))
        .await;
    assert_eq!(status, 503, "{gone}");

    cluster.restart("catalog-1").await;
    // `progress` while the dead delivery's lease lasts (503 while the catalog comes back),
    // then `unknown`, the same ever after.
    let unknown = eventually(Duration::from_secs(30), async || {
        let (status, answer) = brain
            .post(&brain.command(100, command.clone()), Some(&adapter.token))
            .await;
        if status == 200 && answer["receipt"]["type"] == "unknown" {
            Ok(answer)
        } else if status == 503 || answer["receipt"]["type"] == "progress" {
            Err(answer)
        } else {
            panic!("neither progress nor unknown: {status} {answer}");
        }
    })
    .await;
    assert_eq!(brain.deliver(100, command).await, unknown);
    let read = brain.deliver(101, read).await;
    assert_eq!(read["receipt"]["type"], "result", "{read}");
    assert_eq!(
        stdout(&brain.run(102, "cat c.txt").await),
        "c\n",
        "it ran once"
    );
    assert_eq!(
        brain
            .deliver(
                101,
                json!({ "type": "execute", "descriptor": { "kind": "tool", "name": "read_file" }, "input": { "path": "c.txt" } })
            )
            .await,
        read
    );
}
