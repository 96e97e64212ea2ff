//! What a command leaves running in the background, in real sessions of a really built
//! environment (`plinth serve` with its in-process builder and node agent, over real HTTP): a
//! server started by one command answers the next, whether or not it still holds the
//! command's output, through `exec`, a streamed `exec` and a terminal alike; it stays inside
//! its session's limits; a command stopped by its time limit takes what it started with it,
//! and nothing an earlier command started; and all of it ends with the session, with or
//! without isolation. Processes are looked for from the host (each session has a network
//! namespace of its own, so a port the host cannot reach proves nothing).

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, built_environment, exec_in, send, start_session_with};
use crate::sandbox::{gone, host_processes, processes_of};

const BUILD_LIMIT: Duration = Duration::from_secs(120);

/// How long a streamed answer may take to end before the test calls it hung.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

async fn run(server: &Server, session: &Value, command: &str, timeout_ms: u64) -> Value {
    let id = session["id"].as_str().expect("session id");
    exec_in(
        server,
        id,
        json!({ "command": command, "timeout_ms": timeout_ms }),
    )
    .await
}

/// Runs `command`; it must exit 0 within its time limit. Answers its stdout.
async fn ok(server: &Server, session: &Value, command: &str) -> String {
    let ran = run(server, session, command, 60_000).await;
    assert_eq!(ran["exit_code"], 0, "{command}: {ran}");
    assert_eq!(ran["timed_out"], false, "{command}: {ran}");
    ran["stdout"].as_str().expect("stdout").to_owned()
}

/// A script that fetches `/served.txt` from a server of the session on the port it is given,
/// waiting (bounded) for it to listen, and prints the body.
const FETCH: &str = r#"import sys, time, urllib.request
port = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(200):
    try:
        print(opener.open(f"http://127.0.0.1:{port}/served.txt", timeout=5).read().decode(), end="")
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit(f"nothing answered on port {port}")
"#;

/// The command that runs [`FETCH`] for `port`, from the working directory.
fn fetch(port: u16) -> String {
    format!("python3 \"$HOME/fetch.py\" {port}")
}

/// Waits (bounded) until `count` host processes hold `marker`: one the command started
/// last may still be between `fork` and `execve` when the command's answer comes. Answers
/// how many there were at the last look.
async fn running(marker: &str, count: usize) -> usize {
    let mut found = 0;
    for _ in 0..50 {
        found = host_processes(marker).len();
        if found == count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    found
}

async fn end(server: &Server, session: &Value) {
    let id = session["id"].as_str().expect("session id");
    let (status, ended) = send(
        server
            .client
            .delete(server.url(&format!("/v1/sessions/{id}"))),
    )
    .await;
    assert_eq!(status, 200, "{ended}");
}

/// What a session's server serves.
const SERVED: &str = "served from the working directory\n";

/// What a terminal's command runs: a server, left running once it answers (a `nohup`
/// that has not yet ignored the hang-up when its shell exits dies of it, at any terminal).
const START_ON_A_TERMINAL: &str = "nohup python3 -m http.server 18434 > /dev/null 2>&1 &\n\
python3 \"$HOME/fetch.py\" 18434 > /dev/null && echo listening\n";

/// Puts `content` at `path` in the session's working directory.
async fn put(server: &Server, session: &Value, path: &str, content: &'static str) {
    let id = session["id"].as_str().expect("session id");
    let (status, answer) = send(
        server
            .client
            .put(server.url(&format!("/v1/sessions/{id}/files/{path}")))
            .body(content),
    )
    .await;
    assert!(status == 200 || status == 201, "{status}: {answer}");
}

#[tokio::test]
async fn a_server_started_by_one_command_answers_the_next_and_ends_with_its_session() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Background Servers", BUILD_LIMIT).await;
    let session = start_session_with(&server, json!({ "environment": id })).await;
    for (path, content) in [
        ("served.txt", SERVED),
        ("fetch.py", FETCH),
        ("start.sh", START_ON_A_TERMINAL),
    ] {
        put(&server, &session, path, content).await;
    }

    // One server with its output sent away, one still holding the command's stdout and
    // stderr (where it logs every request): the command answers when its shell exits.
    let started = ok(
        &server,
        &session,
        "nohup python3 -m http.server 18431 > /dev/null 2>&1 & \
         python3 -m http.server 18432 & echo started",
    )
    .await;
    assert!(started.contains("started\n"), "{started:?}");
    for port in [18431, 18432] {
        assert_eq!(ok(&server, &session, &fetch(port)).await, SERVED, "{port}");
        // Again: the one logging to the pipe it inherited still can.
        assert_eq!(ok(&server, &session, &fetch(port)).await, SERVED, "{port}");
    }
    assert_eq!(host_processes("http.server 18431").len(), 1);
    assert_eq!(host_processes("http.server 18432").len(), 1);

    // A streamed exec ends with its result too while what it started holds its output.
    let session_id = session["id"].as_str().expect("id");
    let response = server
        .client
        .post(server.url(&format!("/v1/sessions/{session_id}/exec?stream=true")))
        .json(&json!({ "command": "python3 -m http.server 18433 & echo streamed", "timeout_ms": 60_000 }))
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(ANSWER_WITHIN, response.text())
        .await
        .expect("the streamed answer ended")
        .expect("body");
    let last: Value = serde_json::from_str(body.lines().last().expect("a line")).expect("JSON");
    assert_eq!(
        (last["exit_code"].clone(), last["timed_out"].clone()),
        (json!(0), json!(false)),
        "{body}"
    );
    assert!(body.contains("streamed"), "{body}");
    assert_eq!(ok(&server, &session, &fetch(18433)).await, SERVED);

    // A terminal's command too: its shell exits, its nohup'd server goes on.
    let mut socket = crate::terminal::open_socket(
        &server,
        "unused",
        reqwest::Method::POST,
        session_id,
        "pty=true&command=sh+start.sh",
    )
    .await
    .expect("a terminal");
    let (shown, exit, closed) = crate::terminal::read_socket(&mut socket, |_| false).await;
    assert_eq!((exit, closed), (Some(0), true), "{shown:?}");
    assert!(shown.contains("listening"), "{shown:?}");
    assert_eq!(ok(&server, &session, &fetch(18434)).await, SERVED);

    // A command stopped at its time limit is stopped with what it started; what earlier
    // commands started is not its.
    let timed = run(
        &server,
        &session,
        "nohup python3 -m http.server 18435 > /dev/null 2>&1 & sleep 60",
        2_000,
    )
    .await;
    assert_eq!(timed["timed_out"], true, "{timed}");
    assert_eq!(gone("http.server 18435").await, Vec::<String>::new());
    assert_eq!(ok(&server, &session, &fetch(18431)).await, SERVED);

    // Ending the session ends every one of them.
    end(&server, &session).await;
    for port in [18431, 18432, 18433, 18434] {
        assert_eq!(
            gone(&format!("http.server {port}")).await,
            Vec::<String>::new(),
            "{port}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn what_a_command_leaves_running_counts_in_its_sessions_limits() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Background Limits", BUILD_LIMIT).await;
    let session = start_session_with(
        &server,
        json!({ "environment": id, "limits": { "pids": 48 } }),
    )
    .await;
    let session_id = session["id"].as_str().expect("id");
    let started = ok(
        &server,
        &session,
        "for i in $(seq 24); do nohup sleep 1021 > /dev/null 2>&1 & done; echo started",
    )
    .await;
    assert_eq!(started, "started\n");
    assert_eq!(running("sleep 1021", 24).await, 24);
    // The kernel counts them in the session's group (with its keeper)...
    assert!(
        processes_of(session_id) >= 25,
        "{}",
        processes_of(session_id)
    );
    // ...so the next command gets only what is left of the limit: 48, less the keeper, the
    // 24 sleeps and itself.
    let forked = ok(
        &server,
        &session,
        r#"python3 - <<'EOF'
import os
read, write = os.pipe()
children = []
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    children.append(pid)
print(len(children))
os.close(write)
for pid in children:
    os.waitpid(pid, 0)
EOF"#,
    )
    .await;
    let forked: usize = forked.trim().parse().expect("a count");
    assert!(
        forked <= 48 - 26,
        "{forked} forks beside 24 sleeps under pids 48"
    );
    end(&server, &session).await;
    assert_eq!(gone("sleep 1021").await, Vec::<String>::new());
    server.stop().await;
}

#[tokio::test]
async fn memory_a_command_left_holding_counts_in_its_sessions_limit() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = built_environment(&server, "Background Memory", BUILD_LIMIT).await;
    let hog = start_session_with(
        &server,
        json!({ "environment": id, "limits": { "memory_mb": 64 } }),
    )
    .await;
    // One command leaves 40 MiB of touched memory behind it, in the background...
    let started = ok(
        &server,
        &hog,
        "nohup python3 -c 'import time; held = bytearray(40 << 20); time.sleep(1022)' \
         > /dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(started, "started\n");
    assert_eq!(running("time.sleep(1022)", 1).await, 1);
    // (until it has touched its pages: its resident size, read from the host, passes 40 MiB)
    let resident_kib = || {
        host_processes("time.sleep(1022)")
            .first()
            .and_then(|found| found.split(':').next().map(str::to_owned))
            .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .and_then(|status| {
                status
                    .lines()
                    .find(|line| line.starts_with("VmRSS:"))
                    .and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    crate::waiting::eventually(Duration::from_secs(10), async || {
        let resident = resident_kib();
        if resident > 40 * 1024 {
            Ok(())
        } else {
            Err(format!(
                "the background process holds {resident} KiB, not its 40 MiB"
            ))
        }
    })
    .await;
    // ...so the next one cannot take 40 MiB more: the session's 64 MiB hold both. Whichever
    // the kernel kills, they never stand side by side.
    let next = run(
        &server,
        &hog,
        "python3 -c 'held = bytearray(40 << 20); print(\"allocated\")'",
        60_000,
    )
    .await;
    let allocated = next["stdout"].as_str().unwrap_or("").contains("allocated");
    let left = host_processes("time.sleep(1022)").len();
    assert!(
        !(allocated && left == 1),
        "80 MiB side by side under a 64 MiB limit: {next}"
    );
    // The server and another session go on.
    let other = start_session_with(&server, json!({ "environment": id })).await;
    assert_eq!(ok(&server, &other, "echo fine").await, "fine\n");
    end(&server, &hog).await;
    assert_eq!(gone("time.sleep(1022)").await, Vec::<String>::new());
    end(&server, &other).await;
    server.stop().await;
}

#[tokio::test]
async fn without_isolation_what_a_command_left_running_still_ends_with_its_session() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with(&["--builder-network", "false", "--insecure-no-isolation"]).await;
    let id = built_environment(&server, "Background Open", BUILD_LIMIT).await;
    let session = start_session_with(&server, json!({ "environment": id })).await;
    assert_eq!(session["isolated"], false, "{session}");
    let other = start_session_with(&server, json!({ "environment": id })).await;
    let started = ok(
        &server,
        &session,
        "nohup sleep 1022 > /dev/null 2>&1 & setsid -f sleep 1023 > /dev/null 2>&1 < /dev/null; \
         sleep 1024 & echo started",
    )
    .await;
    assert!(started.contains("started\n"), "{started:?}");
    ok(&server, &other, "nohup sleep 1025 > /dev/null 2>&1 &").await;
    for marker in ["sleep 1022", "sleep 1023", "sleep 1024", "sleep 1025"] {
        assert_eq!(running(marker, 1).await, 1, "{marker}");
    }
    end(&server, &session).await;
    for marker in ["sleep 1022", "sleep 1023", "sleep 1024"] {
        assert_eq!(gone(marker).await, Vec::<String>::new(), "{marker}");
    }
    // Another session's are its own.
    assert_eq!(host_processes("sleep 1025").len(), 1);
    end(&server, &other).await;
    assert_eq!(gone("sleep 1025").await, Vec::<String>::new());
    server.stop().await;
}
