//! Session limits through real HTTP: what `POST /v1/sessions` refuses (naming the limit and
//! its configured maximum), what a session reports and its node records, and sessions that the
//! catalog ends past their lifetime or idle time, their working directories removed by their
//! node.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, send};

/// How long a build of this one-file project may take.
const BUILD_LIMIT: Duration = Duration::from_secs(60);

/// The most a test waits for a session to be ended and its working directory removed: the
/// sweep runs every second and the node hears of the end within a heartbeat (2 s).
const END_LIMIT: Duration = Duration::from_secs(15);

/// `plinth serve` with its `[sessions]` section from `toml`, and no network for builds.
async fn server_with_sessions(toml: &str) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("plinth.toml");
    std::fs::write(&file, format!("[sessions]\n{toml}")).expect("write config");
    let path = file.to_str().expect("utf-8").to_owned();
    let server = Server::start_with(&["--config", &path, "--builder-network", "false"]).await;
    (server, dir)
}

async fn exec(server: &Server, id: &str) -> (u16, Value) {
    send(
        server
            .client
            .post(server.url(&format!("/v1/sessions/{id}/exec")))
            .json(&json!({ "command": "echo alive > alive.txt && cat alive.txt" })),
    )
    .await
}

async fn get_session(server: &Server, id: &str) -> Value {
    let (status, session) =
        send(server.client.get(server.url(&format!("/v1/sessions/{id}")))).await;
    assert_eq!(status, 200, "{session}");
    session
}

/// Polls every 200 ms until the session is ended and its working directory is gone from the
/// node's data directory; fails the test past [`END_LIMIT`]. Answers the ended session.
async fn wait_until_ended(server: &Server, id: &str) -> Value {
    let workdir = crate::helpers::host_workdir(&server.data_dir(), id);
    let started = Instant::now();
    loop {
        let session = get_session(server, id).await;
        if session["status"] == "ended" && !workdir.exists() {
            return session;
        }
        assert!(
            started.elapsed() < END_LIMIT,
            "not ended with its working directory removed within {END_LIMIT:?}: {session}, {} exists: {}",
            workdir.display(),
            workdir.exists()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An ended session answers every call with `404 not_found`.
async fn assert_gone(server: &Server, id: &str) {
    let (status, refused) = exec(server, id).await;
    assert_error(status, &refused, 404, "not_found");
    let (status, refused) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{id}/files/alive.txt"))),
    )
    .await;
    assert_error(status, &refused, 404, "not_found");
}

#[tokio::test]
async fn limits_past_their_maximum_zero_mistyped_or_unknown_are_refused_naming_the_limit() {
    let (server, _config) = server_with_sessions("max_memory_mb = 4096\nmax_cpu = 2.5\n").await;
    // Limits are checked before the environment is looked for.
    let environment = "henv_00000000000000000000000000000000";
    for (limits, limit, max) in [
        (json!({"memory_mb": 4097}), "memory_mb", json!(4096)),
        (json!({"memory_mb": 0}), "memory_mb", json!(4096)),
        (json!({"memory_mb": -1}), "memory_mb", json!(4096)),
        (json!({"memory_mb": "2048"}), "memory_mb", json!(4096)),
        (json!({"memory_mb": 1.5}), "memory_mb", json!(4096)),
        (json!({"cpu": 3}), "cpu", json!(2.5)),
        (json!({"cpu": 0}), "cpu", json!(2.5)),
        (json!({"pids": 4097}), "pids", json!(4096)),
        (json!({"disk_mb": 10241}), "disk_mb", json!(10240)),
        (
            json!({"lifetime_ms": 604_800_001}),
            "lifetime_ms",
            json!(604_800_000),
        ),
        (json!({"idle_ms": false}), "idle_ms", json!(86_400_000)),
    ] {
        let (status, refused) = send(
            server
                .client
                .post(server.url("/v1/sessions"))
                .json(&json!({ "environment": environment, "limits": limits })),
        )
        .await;
        assert_error(status, &refused, 400, "invalid_request");
        assert_eq!(
            refused["error"]["detail"],
            json!({ "limit": limit, "max": max }),
            "{limits}: {refused}"
        );
        let message = refused["error"]["message"].as_str().expect("message");
        assert!(
            message.contains(limit) && message.contains(&max.to_string()),
            "{limits}: {message}"
        );
    }
    let (status, refused) = send(
        server
            .client
            .post(server.url("/v1/sessions"))
            .json(&json!({ "environment": environment, "limits": {"memory": 1024} })),
    )
    .await;
    assert_error(status, &refused, 400, "invalid_request");
    assert_eq!(refused["error"]["detail"]["limit"], "memory", "{refused}");
    let message = refused["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("limits.memory") && message.contains("memory_mb"),
        "{message}"
    );

    // The API document describes what may be asked for and what a session shows.
    let (status, doc) = send(server.client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    let schemas = &doc["components"]["schemas"];
    for limit in [
        "memory_mb",
        "pids",
        "cpu",
        "disk_mb",
        "lifetime_ms",
        "idle_ms",
    ] {
        assert!(
            schemas["LimitsRequest"]["properties"][limit].is_object(),
            "{limit} in {}",
            schemas["LimitsRequest"]
        );
        assert!(schemas["LimitsBody"]["properties"][limit].is_object());
    }
    // The ranges the server accepts: from 1 (0.001 of a core) to the configured maximum.
    let asked = &schemas["LimitsRequest"]["properties"];
    assert_eq!(asked["memory_mb"]["minimum"], 1, "{asked}");
    assert_eq!(asked["memory_mb"]["maximum"], 4096, "{asked}");
    assert_eq!(asked["cpu"]["minimum"], 0.001, "{asked}");
    assert_eq!(asked["cpu"]["maximum"], 2.5, "{asked}");
    assert_eq!(asked["idle_ms"]["minimum"], 1, "{asked}");
    assert_eq!(
        schemas["LimitsRequest"]["additionalProperties"], false,
        "an unknown limit is refused"
    );
    // CreateSession is `allOf` its object and the rule that it names an environment.
    assert!(
        schemas["CreateSession"]["allOf"][0]["properties"]["limits"].is_object(),
        "{}",
        schemas["CreateSession"]
    );
}

#[tokio::test]
async fn a_session_reports_the_limits_it_asked_for_and_the_defaults_fill_the_rest() {
    if !crate::helpers::can_build() {
        return;
    }
    let (server, _config) = server_with_sessions("pids = 256\ndisk_mb = 512\n").await;
    let environment =
        crate::helpers::built_environment(&server, "Limited Studio", BUILD_LIMIT).await;

    let session = crate::helpers::start_session_with(
        &server,
        json!({ "environment": environment, "limits": {"memory_mb": 2048, "cpu": 0.5, "idle_ms": null} }),
    )
    .await;
    let expected = json!({
        "memory_mb": 2048, "pids": 256, "cpu": 0.5, "disk_mb": 512,
        "lifetime_ms": 86_400_000, "idle_ms": 3_600_000,
    });
    assert_eq!(session["limits"], expected, "{session}");
    let id = session["id"].as_str().expect("id");
    assert_eq!(get_session(&server, id).await["limits"], expected);

    // The node keeps them in the session's record.
    let record =
        crate::helpers::host_workdir(&server.data_dir(), id).with_file_name("session.json");
    let record: Value =
        serde_json::from_slice(&std::fs::read(&record).expect("record")).expect("JSON record");
    assert_eq!(
        record["limits"],
        json!({
            "memory_mb": 2048, "pids": 256, "cpu_millicores": 500, "disk_mb": 512,
            "lifetime_ms": 86_400_000, "idle_ms": 3_600_000,
        }),
        "{record}"
    );

    // A task's session gets the defaults.
    let (status, task) = send(
        server
            .client
            .post(server.url("/v1/tasks"))
            .json(&json!({ "input": "go", "environment": environment })),
    )
    .await;
    assert_eq!(status, 201, "{task}");
    assert_eq!(
        task["session"]["limits"],
        json!({
            "memory_mb": 1024, "pids": 256, "cpu": 1.0, "disk_mb": 512,
            "lifetime_ms": 86_400_000, "idle_ms": 3_600_000,
        }),
        "{task}"
    );

    // Ending them takes their disk images (mounted on the node) with them.
    let data = server.data_dir().display().to_string();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(&data))
            .count()
    };
    assert_eq!(mounted(), 2, "one image each");
    for ended in [
        id,
        task["session"]["id"].as_str().expect("the task's session"),
    ] {
        let (status, answer) = send(
            server
                .client
                .delete(server.url(&format!("/v1/sessions/{ended}"))),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(mounted(), 0, "an image is left mounted");
}

#[tokio::test]
async fn a_session_past_its_lifetime_is_ended_and_its_working_directory_removed() {
    if !crate::helpers::can_build() {
        return;
    }
    let (server, _config) = server_with_sessions("").await;
    let environment = crate::helpers::built_environment(&server, "Short Lived", BUILD_LIMIT).await;
    let session = crate::helpers::start_session_with(
        &server,
        json!({ "environment": environment, "limits": {"lifetime_ms": 3_000} }),
    )
    .await;
    assert_eq!(session["limits"]["lifetime_ms"], 3_000);
    let id = session["id"].as_str().expect("id");
    // Calls keep a session from idling, not from reaching its lifetime.
    let (status, ran) = exec(&server, id).await;
    assert_eq!(
        (status, ran["stdout"].as_str()),
        (200, Some("alive\n")),
        "{ran}"
    );

    let ended = wait_until_ended(&server, id).await;
    let (created, ended_at) = (
        ended["createdAt"].as_i64().expect("createdAt"),
        ended["endedAt"].as_i64().expect("endedAt is set"),
    );
    assert!(ended_at >= created + 3_000, "{ended}");
    assert_gone(&server, id).await;
}

#[tokio::test]
async fn a_session_without_a_call_for_its_idle_time_is_ended() {
    if !crate::helpers::can_build() {
        return;
    }
    let (server, _config) = server_with_sessions("").await;
    let environment = crate::helpers::built_environment(&server, "Idle Studio", BUILD_LIMIT).await;
    let session = crate::helpers::start_session_with(
        &server,
        json!({ "environment": environment, "limits": {"idle_ms": 2_000} }),
    )
    .await;
    let id = session["id"].as_str().expect("id");
    assert!(crate::helpers::host_workdir(&server.data_dir(), id).is_dir());

    let ended = wait_until_ended(&server, id).await;
    assert!(ended["endedAt"].as_i64().is_some(), "{ended}");
    assert_eq!(ended["limits"]["idle_ms"], 2_000);
    assert_gone(&server, id).await;
}
