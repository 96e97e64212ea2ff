//! Sessions through real HTTP on a really built environment (`plinth serve` with its
//! in-process builder and node agent): the environment's Python and Node dependencies run
//! from `/env/<slug>` with nothing installed; the environment cannot be written, however
//! hard a command tries; the working directory is writable and private; a session keeps its
//! version across activations; tasks are refused unless their environment is ready.

use std::os::unix::fs::FileTypeExt as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::builds::{put_tiny_wheel, tiny_npm_package};
use crate::helpers::{
    Server, assert_error, build_ready, create_environment, created_environment, exec_in, put_file,
    send, start_session_with,
};
use crate::waiting::eventually;

/// How long a build of these small projects may take.
const BUILD_LIMIT: Duration = Duration::from_secs(120);

/// An environment with a wheel, an npm package and a script, built once.
async fn project(server: &Server, name: &str) -> (String, String) {
    let created =
        created_environment(server, json!({"name": name, "entry": "python3 run.py"})).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let slug = created["slug"].as_str().expect("slug").to_owned();
    put_tiny_wheel(server, &id).await;
    put_file(
        server,
        &id,
        "requirements.txt",
        "--no-index\n--find-links wheels\ntinypkg==1.0\n",
    )
    .await;
    put_file(server, &id, "vendor/tinynpm-1.2.3.tgz", tiny_npm_package()).await;
    put_file(server,
        &id,
        "package.json",
        r#"{"name": "studio", "version": "0.0.0", "dependencies": {"tinynpm": "file:vendor/tinynpm-1.2.3.tgz"}}"#,
    )
    .await;
    put_file(server, &id, "run.py", "print('version one')\n").await;
    put_file(server, &id, "data/deep/nested/file.txt", "nested\n").await;
    build_ready(server, &id, 1, BUILD_LIMIT).await;
    (id, slug)
}

pub(crate) async fn start_session(server: &Server, environment: &str) -> Value {
    start_session_with(server, json!({ "environment": environment })).await
}

pub(crate) async fn exec(server: &Server, session: &Value, command: &str) -> Value {
    let id = session["id"].as_str().expect("session id");
    exec_in(server, id, json!({ "command": command })).await
}

#[tokio::test]
async fn a_session_runs_the_environment_read_only_beside_its_private_workdir() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (id, slug) = project(&server, "Session Studio").await;
    let mount = format!("/env/{slug}");

    let first = start_session(&server, &id).await;
    assert_eq!(first["object"], "session");
    assert_eq!(first["environment"]["id"], id.as_str());
    assert_eq!(first["environment"]["version"], 1);
    assert_eq!(first["environment"]["mount"], mount.as_str());
    assert_eq!(first["isolated"], true);
    // The session sees its working directory at one path, whatever the node's data
    // directory.
    let workdir = first["workdir"].as_str().expect("workdir").to_owned();
    assert_eq!(workdir, "/home/session", "{first}");
    let first_id = first["id"].as_str().expect("id");
    let host_workdir = crate::helpers::host_workdir(&server.data_dir(), first_id);
    assert!(host_workdir.is_dir(), "{}", host_workdir.display());
    let instructions = first["instructions"].as_str().expect("instructions");
    for needle in [
        mount.as_str(),
        "read-only",
        "shared",
        "installed",
        workdir.as_str(),
        "python3 run.py",
    ] {
        assert!(
            instructions.contains(needle),
            "{needle:?} not in {instructions:?}"
        );
    }

    // The dependencies run from the mount, installed by the build; nothing is installed now.
    let ran = exec(
        &server,
        &first,
        "set -e; tinytool; tinynpm; command -v python; python -c 'import tinypkg, sys; print(tinypkg.__file__)'; node -e \"console.log(require.resolve('tinynpm/package.json'))\"; python3 $PROJECT_ROOT/run.py",
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let stdout = ran["stdout"].as_str().expect("stdout");
    assert!(
        stdout.contains("tinytool ran") && stdout.contains("tinynpm ran"),
        "{ran}"
    );
    assert!(
        stdout.contains(&format!("{mount}/.venv/bin/python")),
        "{ran}"
    );
    assert!(stdout.contains(&format!("{mount}/.venv/lib/")), "{ran}");
    assert!(
        stdout.contains(&format!("{mount}/node_modules/tinynpm/package.json")),
        "{ran}"
    );
    assert!(stdout.contains("version one"), "{ran}");
    assert_eq!(ran["version"], 1);

    // The environment cannot be written: not at its top, not deep inside, not by any means.
    for attempt in [
        format!("touch {mount}/new-file"),
        format!("rm {mount}/run.py"),
        format!("chmod 777 {mount}/run.py"),
        format!("mkdir {mount}/data/deep/new-dir"),
        format!("echo x >> {mount}/data/deep/nested/file.txt"),
        format!("touch {mount}/.venv/lib/new-file"),
        format!("python3 -c \"open('{mount}/data/deep/nested/py.txt', 'w').write('x')\""),
        format!("mv {mount}/run.py {mount}/moved.py"),
    ] {
        let result = exec(&server, &first, &attempt).await;
        assert_ne!(result["exit_code"], 0, "{attempt}: {result}");
        let stderr = result["stderr"].as_str().unwrap_or("");
        // Opening an existing file for writing is refused by its owner and mode (root's file)
        // before the mount is asked; everything else meets the read-only mount.
        let refused = stderr.contains("Read-only file system")
            || (attempt.contains(">>") && stderr.contains("Permission denied"));
        assert!(refused, "{attempt}: {result}");
    }

    // The variables of UHP §6.3.
    let env = exec(
        &server,
        &first,
        "printf '%s\\n' \"$PATH\" \"$PYTHONPATH\" \"$NODE_PATH\" \"$PROJECT_ROOT\" \"$HOME\" \"$(pwd)\"",
    )
    .await;
    let lines: Vec<&str> = env["stdout"].as_str().expect("stdout").lines().collect();
    assert!(
        lines[0].starts_with(&format!("{mount}/.venv/bin:{mount}/node_modules/.bin:")),
        "{env}"
    );
    assert!(lines[1].starts_with(&mount), "{env}");
    assert!(
        lines[2].starts_with(&format!("{mount}/node_modules")),
        "{env}"
    );
    assert_eq!(lines[3], mount);
    assert_eq!(lines[4], workdir);
    assert_eq!(lines[5], workdir);

    // The working directory is writable, through commands and through the API.
    let wrote = exec(
        &server,
        &first,
        "echo from-exec > out.txt && mkdir -p a/b && echo deep > a/b/c.txt && cat out.txt",
    )
    .await;
    assert_eq!(wrote["exit_code"], 0, "{wrote}");
    let session_id = first["id"].as_str().expect("id");
    let file = |path: &str| server.url(&format!("/v1/sessions/{session_id}/files/{path}"));
    let (status, put_answer) =
        send(server.client.put(file("notes/api.txt")).body("from-api")).await;
    assert_eq!(status, 200, "{put_answer}");
    assert_eq!(put_answer["version"], 1);
    let read = exec(
        &server,
        &first,
        "cat notes/api.txt; stat -c %U:%a notes/api.txt .",
    )
    .await;
    assert!(
        read["stdout"]
            .as_str()
            .unwrap_or("")
            .starts_with("from-api"),
        "{read}"
    );
    let response = server
        .client
        .get(file("out.txt"))
        .send()
        .await
        .expect("get");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("body"), "from-exec\n");
    let (status, missing) = send(server.client.get(file("nope.txt"))).await;
    assert_error(status, &missing, 404, "not_found");
    let (status, escaped) = send(server.client.get(file("a/../../x"))).await;
    assert!(status == 400 || status == 404, "{escaped}");
    // A link the session made out of its directory is not followed by the API.
    exec(&server, &first, "ln -s /etc/passwd passwd-link").await;
    let (status, refused) = send(server.client.get(file("passwd-link"))).await;
    assert_error(status, &refused, 400, "environment_invalid");
    let (status, _) = send(server.client.delete(file("a"))).await;
    assert_eq!(status, 200);
    let gone = exec(&server, &first, "test -e a && echo present || echo gone").await;
    assert_eq!(gone["stdout"], "gone\n");

    // A second session on the same environment cannot read the first's working directory.
    let second = start_session(&server, &id).await;
    let second_workdir = second["workdir"].as_str().expect("workdir");
    assert_eq!(second_workdir, workdir, "the same path, its own directory");
    let first_on_host = host_workdir.display();
    let peek = exec(
        &server,
        &second,
        &format!(
            "cat {workdir}/out.txt; ls {workdir}; cat {first_on_host}/out.txt; ls {first_on_host}"
        ),
    )
    .await;
    assert_ne!(peek["exit_code"], 0, "{peek}");
    assert!(
        !peek["stdout"].as_str().unwrap_or("").contains("from-exec"),
        "{peek}"
    );
    assert!(
        !peek["stdout"].as_str().unwrap_or("").contains("out.txt"),
        "{peek}"
    );
    let ids = exec(&server, &second, "id -u").await;
    let own = exec(&server, &first, "id -u").await;
    assert_ne!(ids["stdout"], own["stdout"], "each session has its own uid");
    assert_ne!(ids["stdout"], "0\n");
    // Nor the node's state or Plinth's data.
    let data = server.data_dir();
    let snoop = exec(
        &server,
        &second,
        &format!(
            "ls {}/node/cache; cat {}/catalog.db",
            data.display(),
            data.display()
        ),
    )
    .await;
    assert_ne!(snoop["exit_code"], 0, "{snoop}");

    // A new version: the running session keeps its own; a new session reads the new one.
    // It changes one file and removes another, so the node makes it as a layer over version 1:
    // what its sessions see must still be exactly version 2.
    put_file(&server, &id, "run.py", "print('version two')\n").await;
    let (status, removed) = send(server.client.delete(server.url(&format!(
        "/v1/environments/{id}/files/data/deep/nested/file.txt"
    ))))
    .await;
    assert_eq!(status, 200, "{removed}");
    build_ready(&server, &id, 2, BUILD_LIMIT).await;
    let kept = exec(&server, &first, "python3 $PROJECT_ROOT/run.py").await;
    assert_eq!(kept["stdout"], "version one\n", "{kept}");
    assert_eq!(kept["version"], 1);
    let still = exec(
        &server,
        &first,
        "cat $PROJECT_ROOT/data/deep/nested/file.txt",
    )
    .await;
    assert_eq!(still["stdout"], "nested\n", "{still}");
    let third = start_session(&server, &id).await;
    assert_eq!(third["environment"]["version"], 2);
    // The node may still be fetching version 2 behind a lazy mount (pre-warm, or this
    // session's own): once it is whole in the cache it is a layer over version 1.
    let versions = server.data_dir().join("node/cache/versions").join(&id);
    eventually(BUILD_LIMIT, async || {
        let whole = std::fs::symlink_metadata(versions.join("2")).is_ok();
        let base = std::fs::read_to_string(versions.join("2.base")).ok();
        if whole && base.is_some() {
            Ok(())
        } else {
            Err(format!(
                "version 2 in the cache: whole {whole}, base {base:?}"
            ))
        }
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(versions.join("2.base")).expect("version 2 is a layer"),
        "1"
    );
    assert!(
        std::fs::symlink_metadata(versions.join("2/data/deep/nested/file.txt"))
            .is_ok_and(|whiteout| whiteout.file_type().is_char_device()),
        "the removed file is a whiteout in the layer"
    );
    let fresh = exec(&server, &third, "python3 $PROJECT_ROOT/run.py").await;
    assert_eq!(fresh["stdout"], "version two\n", "{fresh}");
    assert_eq!(fresh["version"], 2);
    let view = exec(
        &server,
        &third,
        "test ! -e $PROJECT_ROOT/data/deep/nested/file.txt && echo gone && \
         python -c 'import tinypkg; print(tinypkg.__name__)' && touch $PROJECT_ROOT/new.txt",
    )
    .await;
    assert_ne!(view["exit_code"], 0, "{view}");
    assert_eq!(view["stdout"], "gone\ntinypkg\n", "{view}");
    assert!(
        view["stderr"]
            .as_str()
            .is_some_and(|stderr| stderr.contains("Read-only file system")),
        "{view}"
    );

    // Every exec and file call is a turn with the version it read; a command's turn gets its
    // exit status when it ends (recorded just after the answer).
    let turns = eventually(Duration::from_secs(5), async || {
        let (status, listed) = send(
            server
                .client
                .get(server.url(&format!("/v1/sessions/{session_id}/turns"))),
        )
        .await;
        assert_eq!(status, 200, "{listed}");
        let ended = listed["data"]
            .as_array()
            .expect("turns")
            .iter()
            .filter(|turn| turn["kind"] == "exec")
            .all(|turn| turn["exit_code"].is_i64());
        ended.then_some(()).map(|()| listed.clone()).ok_or(listed)
    })
    .await;
    let turns = turns["data"].as_array().expect("turns");
    let exits: Vec<i64> = turns
        .iter()
        .filter(|turn| turn["kind"] == "exec")
        .map(|turn| {
            turn["exit_code"]
                .as_i64()
                .expect("every command's end is recorded")
        })
        .collect();
    assert!(
        exits.contains(&0) && exits.iter().any(|code| *code != 0),
        "{turns:?}"
    );
    assert!(turns.len() >= 15, "{turns:?}");
    assert!(turns.iter().all(|turn| turn["version"] == 1), "{turns:?}");
    assert!(
        turns.iter().any(|turn| turn["kind"] == "write_file"),
        "{turns:?}"
    );
    let sequences: Vec<u64> = turns
        .iter()
        .filter_map(|t| t["sequence"].as_u64())
        .collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>());

    // Ending a session removes its working directory; it runs nothing more.
    let (status, ended) = send(
        server
            .client
            .delete(server.url(&format!("/v1/sessions/{session_id}"))),
    )
    .await;
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended["status"], "ended");
    assert!(!host_workdir.exists(), "{} is gone", host_workdir.display());
    let (status, refused) = send(
        server
            .client
            .post(server.url(&format!("/v1/sessions/{session_id}/exec")))
            .json(&json!({"command": "true"})),
    )
    .await;
    assert_error(status, &refused, 404, "not_found");
}

#[tokio::test]
async fn exec_output_is_capped_timed_and_streamed() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (_, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Plain"})),
    )
    .await;
    let id = created["id"].as_str().expect("id").to_owned();
    put_file(&server, &id, "hello.txt", "hello\n").await;
    build_ready(&server, &id, 1, BUILD_LIMIT).await;
    let session = start_session(&server, &id).await;
    let session_id = session["id"].as_str().expect("id");

    let big = exec(
        &server,
        &session,
        "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
    )
    .await;
    assert_eq!(big["exit_code"], 0, "{}", big["stderr"]);
    assert_eq!(big["stdout_truncated"], true);
    let stdout = big["stdout"].as_str().expect("stdout");
    assert!(stdout.len() < 1_100_000, "capped: {}", stdout.len());
    assert!(
        stdout.ends_with("[output truncated: 1951424 more bytes were not kept]\n"),
        "{}",
        &stdout[stdout.len() - 80..]
    );
    assert_eq!(big["stderr"], "done\n");

    let slow = exec_in(
        &server,
        session_id,
        json!({"command": "echo started; sleep 30; echo never", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(slow["timed_out"], true, "{slow}");
    assert_eq!(slow["stdout"], "started\n");
    assert!(slow["duration_ms"].as_u64().unwrap_or(0) < 10_000, "{slow}");

    let failed = exec(&server, &session, "exit 3").await;
    assert_eq!(failed["exit_code"], 3);

    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session_id}/exec?stream=true")))
        .json(&json!({"command": "echo one; sleep 0.2; echo two >&2; echo three", "cwd": format!("/env/{}", created["slug"].as_str().expect("slug")), "env": {"GREETING": "hi"}}))
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let body = response.text().await.expect("body");
    let events: Vec<Value> = body
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let stdout: String = events.iter().filter_map(|e| e["stdout"].as_str()).collect();
    assert_eq!(stdout, "one\nthree\n", "{body}");
    assert!(events.iter().any(|e| e["stderr"] == "two\n"), "{body}");
    let last = events.last().expect("a result");
    assert_eq!(last["exit_code"], 0, "{body}");
    assert_eq!(last["version"], 1, "{body}");

    for (body, field) in [
        (json!({"command": ""}), "command"),
        (json!({"command": "true", "cwd": "../.."}), "cwd"),
        (json!({"command": "true", "cwd": "/etc"}), "cwd"),
        // A directory that does not exist is refused like every other bad cwd, not run.
        (
            json!({"command": "true", "cwd": "no/such/dir"}),
            "no/such/dir",
        ),
        (
            json!({"command": "true", "env": {"BAD=NAME": "x"}}),
            "BAD=NAME",
        ),
        (json!({"command": "true", "extra": 1}), "extra"),
    ] {
        let (status, refused) = send(
            server
                .client
                .post(server.url(&format!("/v1/sessions/{session_id}/exec")))
                .json(&body),
        )
        .await;
        assert_error(status, &refused, 400, "environment_invalid");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(field),
            "{refused}"
        );
    }
}

#[tokio::test]
async fn sessions_and_tasks_are_refused_unless_their_environment_is_ready() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let unbuilt = create_environment(&server, "Unbuilt").await;
    let missing = "henv_00000000000000000000000000000000";

    for (body, code, status) in [
        (
            json!({"environment": unbuilt}),
            "environment_not_ready",
            409,
        ),
        (
            json!({"environment": missing}),
            "environment_not_found",
            404,
        ),
        (
            json!({"environment": "not-an-id"}),
            "environment_not_found",
            404,
        ),
        (json!({}), "environment_invalid", 400),
    ] {
        let (got, refused) = send(server.client.post(server.url("/v1/sessions")).json(&body)).await;
        assert_error(got, &refused, status, code);
    }
    for (body, code, status) in [
        (
            json!({"input": "go", "environment": unbuilt}),
            "environment_not_ready",
            409,
        ),
        (
            json!({"input": "go", "environment": missing}),
            "environment_not_found",
            404,
        ),
        (json!({"input": "go"}), "environment_not_found", 404),
        (json!({"input": 5}), "environment_invalid", 400),
    ] {
        let (got, refused) = send(server.client.post(server.url("/v1/tasks")).json(&body)).await;
        assert_error(got, &refused, status, code);
    }

    // A harness names the environment; its task reads the active version, and the task's own
    // environment overrides the harness's.
    let ready = create_environment(&server, "Ready").await;
    put_file(&server, &ready, "hello.txt", "hello\n").await;
    build_ready(&server, &ready, 1, BUILD_LIMIT).await;
    let (status, harness) = send(
        server
            .client
            .post(server.url("/v1/harnesses"))
            .json(&json!({"name": "Cutter", "base": "codex", "environment": ready})),
    )
    .await;
    assert_eq!(status, 201, "{harness}");
    let harness_id = harness["id"].as_str().expect("harness id");
    let (status, task) = send(
        server
            .client
            .post(server.url("/v1/tasks"))
            .json(&json!({"input": "Render it.", "metadata": {"harness_id": harness_id}})),
    )
    .await;
    assert_eq!(status, 201, "{task}");
    assert_eq!(task["object"], "task");
    assert_eq!(task["environment"]["id"], ready.as_str());
    assert_eq!(task["version"], 1);
    assert_eq!(task["session"]["harness_id"], harness_id);
    let session = &task["session"];
    let hello = exec(&server, session, "cat $PROJECT_ROOT/hello.txt").await;
    assert_eq!(hello["stdout"], "hello\n");
    let (got, refused) = send(server.client.post(server.url("/v1/tasks")).json(
        &json!({"input": "go", "metadata": {"harness_id": harness_id}, "environment": unbuilt}),
    ))
    .await;
    assert_error(got, &refused, 409, "environment_not_ready");
    let (status, by_harness) = send(
        server
            .client
            .post(server.url("/v1/sessions"))
            .json(&json!({"harness_id": harness_id})),
    )
    .await;
    assert_eq!(status, 201, "{by_harness}");
    assert_eq!(by_harness["environment"]["id"], ready.as_str());

    // Once the harness's environment is deleted, its next task is refused.
    let (status, _) = send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{ready}"))),
    )
    .await;
    assert_eq!(status, 200);
    let (got, refused) = send(
        server
            .client
            .post(server.url("/v1/tasks"))
            .json(&json!({"input": "go", "metadata": {"harness_id": harness_id}})),
    )
    .await;
    assert_error(got, &refused, 404, "environment_not_found");
}

#[tokio::test]
async fn without_isolation_every_session_says_so() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with(&["--builder-network", "false", "--insecure-no-isolation"]).await;
    let id = create_environment(&server, "Open").await;
    put_file(&server, &id, "hello.txt", "hello\n").await;
    build_ready(&server, &id, 1, BUILD_LIMIT).await;
    let session = start_session(&server, &id).await;
    assert_eq!(session["isolated"], false, "{session}");
    let instructions = session["instructions"].as_str().expect("instructions");
    assert!(instructions.contains("without isolation"), "{instructions}");
    // Commands still start in the working directory with the environment's variables.
    let ran = exec(&server, &session, "pwd; echo $PROJECT_ROOT").await;
    let workdir = session["workdir"].as_str().expect("workdir");
    assert_eq!(ran["stdout"], format!("{workdir}\n/env/open\n"), "{ran}");
}

#[tokio::test]
async fn session_files_answer_304_206_and_416_and_a_changed_file_gets_a_new_tag() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = crate::helpers::built_environment(&server, "Session Ranges", BUILD_LIMIT).await;
    let session = start_session(&server, &id).await;
    let session_id = session["id"].as_str().expect("id");
    let wrote = exec(&server, &session, "printf 0123456789 > digits.txt").await;
    assert_eq!(wrote["exit_code"], 0, "{wrote}");
    let url = server.url(&format!("/v1/sessions/{session_id}/files/digits.txt"));

    let whole = server.client.get(&url).send().await.expect("get");
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    let tag = whole
        .headers()
        .get("etag")
        .and_then(|value| value.to_str().ok())
        .expect("an ETag")
        .to_owned();
    assert!(tag.starts_with("\"sha256:") && tag.len() == 73, "{tag}");
    assert_eq!(whole.text().await.expect("body"), "0123456789");

    let unchanged = server
        .client
        .get(&url)
        .header("if-none-match", &tag)
        .send()
        .await
        .expect("get");
    assert_eq!(unchanged.status(), 304);
    assert_eq!(unchanged.headers()["etag"], tag.as_str());
    assert!(unchanged.bytes().await.expect("body").is_empty());

    for (range, content_range, bytes) in [
        ("bytes=2-4", "bytes 2-4/10", "234"),
        ("bytes=7-", "bytes 7-9/10", "789"),
        ("bytes=-2", "bytes 8-9/10", "89"),
    ] {
        let part = server
            .client
            .get(&url)
            .header("range", range)
            .send()
            .await
            .expect("get");
        assert_eq!(part.status(), 206, "{range}");
        assert_eq!(part.headers()["content-range"], content_range);
        assert_eq!(part.text().await.expect("body"), bytes);
    }
    let past = server
        .client
        .get(&url)
        .header("range", "bytes=10-")
        .send()
        .await
        .expect("get");
    assert_eq!(past.status(), 416);
    assert_eq!(past.headers()["content-range"], "bytes */10");
    let (status, body) = crate::helpers::json(past).await;
    assert_error(status, &body, 416, "range_not_satisfiable");

    // The session changes the file, keeping its size: the old tag no longer holds.
    exec(&server, &session, "printf 9876543210 > digits.txt").await;
    let changed = server
        .client
        .get(&url)
        .header("if-none-match", &tag)
        .send()
        .await
        .expect("get");
    assert_eq!(changed.status(), 200);
    assert_ne!(changed.headers()["etag"], tag.as_str());
    assert_eq!(changed.text().await.expect("body"), "9876543210");
}

/// A command reads what its exec gives it on standard input (text, or any bytes as base64),
/// and Python's output streams as it is printed: the first line arrives as an event of its
/// own, before the second is printed, since exec sets `PYTHONUNBUFFERED` unless told not to.
#[tokio::test]
async fn exec_feeds_stdin_and_streams_python_as_it_prints() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Stdin Studio").await;
    put_file(&server, &id, "hello.txt", "hello\n").await;
    build_ready(&server, &id, 1, BUILD_LIMIT).await;
    let session = start_session(&server, &id).await;
    let session_id = session["id"].as_str().expect("id");

    let read = exec_in(
        &server,
        session_id,
        json!({"command": "tr a-z A-Z", "stdin": "piped in\n"}),
    )
    .await;
    assert_eq!(read["stdout"], "PIPED IN\n", "{read}");
    // 300,000 bytes, every byte value, to a command that reads them all.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let encoded = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&bytes)
    };
    let counted = exec_in(
        &server,
        session_id,
        json!({"command": "od -An -tx1 -v | wc -w", "stdin_base64": encoded}),
    )
    .await;
    assert_eq!(
        counted["stdout"].as_str().map(str::trim),
        Some("300000"),
        "{counted}"
    );
    // A command that never reads its input still ends, and without any input reads nothing.
    let ignored = exec_in(
        &server,
        session_id,
        json!({"command": "echo ignored", "stdin_base64": encoded}),
    )
    .await;
    assert_eq!(ignored["stdout"], "ignored\n", "{ignored}");
    let nothing = exec_in(&server, session_id, json!({"command": "wc -c"})).await;
    assert_eq!(
        nothing["stdout"].as_str().map(str::trim),
        Some("0"),
        "{nothing}"
    );
    for body in [
        json!({"command": "cat", "stdin": "a", "stdin_base64": "YQ=="}),
        json!({"command": "cat", "stdin_base64": "not base64!"}),
    ] {
        let (status, refused) = send(
            server
                .client
                .post(server.url(&format!("/v1/sessions/{session_id}/exec")))
                .json(&body),
        )
        .await;
        assert_error(status, &refused, 400, "environment_invalid");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("stdin")),
            "{refused}"
        );
    }

    // Streamed: events are read as they arrive, one line at a time.
    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session_id}/exec?stream=true")))
        .json(&json!({
            "command": "python3 -c 'print(1); import time; time.sleep(2); print(2)'"
        }))
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), 200);
    let events = ndjson_events(response).await;
    let outputs: Vec<&str> = events.iter().filter_map(|e| e["stdout"].as_str()).collect();
    // Python writes a line's text and its end apart when unbuffered; what matters is that
    // the whole first line came in events of its own, before any event with the second.
    let second = outputs
        .iter()
        .position(|out| out.contains('2'))
        .unwrap_or_else(|| panic!("no 2 printed: {events:?}"));
    assert_eq!(
        outputs[..second].concat(),
        "1\n",
        "the first line arrived with the second, not as printed: {events:?}"
    );
    assert_eq!(outputs[second..].concat(), "2\n", "{events:?}");
    assert_eq!(
        events.last().map(|e| e["exit_code"].clone()),
        Some(json!(0))
    );
    // The caller's own setting stands: buffered, both lines come at the end, together.
    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session_id}/exec?stream=true")))
        .json(&json!({
            "command": "python3 -c 'print(1); import time; time.sleep(1); print(2)'",
            "env": {"PYTHONUNBUFFERED": ""}
        }))
        .send()
        .await
        .expect("stream");
    let events = ndjson_events(response).await;
    let outputs: Vec<&str> = events.iter().filter_map(|e| e["stdout"].as_str()).collect();
    assert_eq!(outputs.concat(), "1\n2\n", "{events:?}");
    assert!(
        outputs.first().is_some_and(|first| first.contains('2')),
        "{events:?}"
    );
}

/// The events of a streamed exec, each parsed as its line arrives.
async fn ndjson_events(response: reqwest::Response) -> Vec<Value> {
    use futures::StreamExt as _;
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    let mut events = Vec::new();
    while let Some(chunk) = stream.next().await {
        pending.extend_from_slice(&chunk.expect("chunk"));
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            events.push(serde_json::from_slice(&line).expect("a JSON line"));
        }
    }
    events
}

/// `GET /v1/sessions`: the caller's sessions, oldest first, in pages that together hold each
/// once; filtered by environment and by state; another scope's sessions are not there.
#[tokio::test]
async fn sessions_are_listed_in_pages_by_environment_and_state_within_their_scope() {
    if !crate::helpers::can_build() {
        return;
    }
    let tokens = crate::helpers::tokens_toml(&[("tok-acme", "acme"), ("tok-globex", "globex")]);
    let mut server = Server::start_with_config(&tokens, &["--builder-network", "false"]).await;
    let as_token = |token: &str| {
        reqwest::Client::builder()
            .default_headers(
                [(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {token}").parse().expect("header"),
                )]
                .into_iter()
                .collect(),
            )
            .build()
            .expect("client")
    };
    server.client = as_token("tok-acme");
    let first = create_environment(&server, "List One").await;
    put_file(&server, &first, "a.txt", "a\n").await;
    build_ready(&server, &first, 1, BUILD_LIMIT).await;
    let second = create_environment(&server, "List Two").await;
    put_file(&server, &second, "b.txt", "b\n").await;
    build_ready(&server, &second, 1, BUILD_LIMIT).await;
    let mut made = Vec::new();
    for environment in [&first, &second, &first, &second, &first] {
        let session = start_session(&server, environment).await;
        made.push(session["id"].as_str().expect("id").to_owned());
    }
    // Two ended, one of each environment.
    for ended in [&made[0], &made[1]] {
        let (status, body) = send(
            server
                .client
                .delete(server.url(&format!("/v1/sessions/{ended}"))),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // Another scope's session, on its own environment.
    server.client = as_token("tok-globex");
    let theirs = create_environment(&server, "Theirs").await;
    put_file(&server, &theirs, "c.txt", "c\n").await;
    build_ready(&server, &theirs, 1, BUILD_LIMIT).await;
    let their_session = start_session(&server, &theirs).await;
    let their_id = their_session["id"].as_str().expect("id").to_owned();
    // Their list holds theirs only; our environment's id shows them nothing.
    assert_eq!(pages_with(&server, "").await.0, vec![their_id.clone()]);
    let (none, _) = pages_with(&server, &format!("&environment={first}")).await;
    assert!(none.is_empty(), "{none:?}");
    server.client = as_token("tok-acme");

    let (all, count) = pages_with(&server, "").await;
    assert_eq!(
        all, made,
        "every session once, oldest first, none of another scope"
    );
    assert_eq!(count, 3);
    assert_eq!(
        pages_with(&server, "&state=active").await.0,
        made[2..].to_vec()
    );
    assert_eq!(
        pages_with(&server, "&state=ended").await.0,
        made[..2].to_vec()
    );
    assert_eq!(
        pages_with(&server, &format!("&environment={first}"))
            .await
            .0,
        vec![made[0].clone(), made[2].clone(), made[4].clone()]
    );
    assert_eq!(
        pages_with(&server, &format!("&environment={second}&state=active"))
            .await
            .0,
        vec![made[3].clone()]
    );
    // What a listed session says is what GET of it says.
    let (_, one) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{}", made[4]))),
    )
    .await;
    let (_, page) = send(
        server
            .client
            .get(server.url("/v1/sessions?state=active&limit=1000")),
    )
    .await;
    assert_eq!(
        page["data"].as_array().and_then(|d| d.last()),
        Some(&one),
        "{page}"
    );

    for (query, field) in [
        ("state=gone", "state"),
        ("limit=0", "limit"),
        ("after=nonsense", "after"),
        ("colour=blue", "colour"),
    ] {
        let (status, refused) = send(
            server
                .client
                .get(server.url(&format!("/v1/sessions?{query}"))),
        )
        .await;
        assert_error(status, &refused, 400, "environment_invalid");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(field)),
            "{query}: {refused}"
        );
    }
    let (_, openapi) = send(server.client.get(server.url("/openapi.json"))).await;
    let listed = &openapi["paths"]["/v1/sessions"]["get"];
    assert!(listed.is_object(), "{}", openapi["paths"]["/v1/sessions"]);
    let params: Vec<&str> = listed["parameters"]
        .as_array()
        .map(|params| params.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    for name in ["limit", "after", "environment", "state"] {
        assert!(params.contains(&name), "{params:?}");
    }
}

/// Every page of `GET /v1/sessions?limit=2<query>`: the ids in order, and how many pages.
async fn pages_with(server: &Server, query: &str) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("/v1/sessions?limit=2{query}");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let (status, page) = send(server.client.get(server.url(&url))).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["object"], "list", "{page}");
        let data = page["data"].as_array().expect("data");
        assert!(data.len() <= 2, "{page}");
        pages += 1;
        for session in data {
            ids.push(session["id"].as_str().expect("id").to_owned());
        }
        if page["has_more"] != true {
            assert!(page["next"].is_null(), "{page}");
            break;
        }
        after = Some(page["next"].as_str().expect("next").to_owned());
    }
    (ids, pages)
}
