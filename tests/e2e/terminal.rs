//! `plinth shell` and the terminal WebSocket under it: the real `plinth` binary on a
//! pseudo-terminal this test opens, typed at as a person types, against a real `plinth serve`;
//! and the WebSocket as any client (or an attacker holding another scope's token) opens it.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::helpers::{Server, assert_error, built_environment, send, start_session_with};

/// How long anything typed may take to show.
const SHOWN_WITHIN: Duration = Duration::from_secs(30);

/// `plinth shell` on a pseudo-terminal of the test's: the test holds the master (the
/// person's screen and keyboard), `plinth` has the slave as its controlling terminal.
struct Terminal {
    master: std::fs::File,
    seen: Arc<Mutex<Vec<u8>>>,
    child: Child,
    typed: usize,
    /// The terminal's settings before `plinth` ran (cooked, echoing).
    initial: rustix::termios::Termios,
}

impl Terminal {
    /// Starts `plinth shell <args>` (as `setsid --ctty`, so it leads a session whose
    /// controlling terminal is ours and is the foreground job that `SIGWINCH` reaches) on a
    /// terminal of `cols` x `rows`.
    fn open(server: &Server, args: &[&str], cols: u16, rows: u16) -> Self {
        use rustix::pty::OpenptFlags;
        let master =
            rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
                .expect("a pseudo-terminal");
        rustix::pty::grantpt(&master).expect("grantpt");
        rustix::pty::unlockpt(&master).expect("unlockpt");
        let name = rustix::pty::ptsname(&master, Vec::new()).expect("ptsname");
        let slave: OwnedFd = rustix::fs::open(
            name.as_c_str(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY,
            rustix::fs::Mode::empty(),
        )
        .expect("the slave");
        set_size(&master, cols, rows);
        let initial = rustix::termios::tcgetattr(&master).expect("termios");
        let home = std::env::temp_dir();
        let mut command = Command::new("setsid");
        command
            .arg("--ctty")
            .arg(env!("CARGO_BIN_EXE_plinth"))
            .arg("shell")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join("plinth-terminal-test-config"))
            .env("PLINTH_URL", &server.base)
            .stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave));
        let child = command.spawn().expect("plinth shell starts");
        let master = std::fs::File::from(master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("dup");
        let into = seen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // EIO once every slave is closed: plinth is gone.
            while let Ok(read) = reader.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                into.lock()
                    .expect("lock")
                    .extend_from_slice(&buffer[..read]);
            }
        });
        Terminal {
            master,
            seen,
            child,
            typed: 0,
            initial,
        }
    }

    fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("lock")).into_owned()
    }

    /// Types `line` and Enter, and waits for it to finish: a marker is echoed after it that
    /// only the output can hold (the terminal's echo of the typed line shows the arithmetic,
    /// not its result). Answers what showed from the typing on.
    fn run(&mut self, line: &str) -> String {
        let from = self.seen.lock().expect("lock").len();
        self.typed += 1;
        let marker = format!("done-{}", self.typed + 1000);
        self.master
            .write_all(format!("{line}; echo done-$(({} + 1000))\r", self.typed).as_bytes())
            .expect("typed");
        let started = Instant::now();
        loop {
            let shown = {
                let seen = self.seen.lock().expect("lock");
                String::from_utf8_lossy(&seen[from..]).into_owned()
            };
            if shown.contains(&marker) {
                return shown;
            }
            assert!(
                started.elapsed() < SHOWN_WITHIN,
                "typed {line:?}; {marker:?} never showed. The terminal so far:\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for `plinth shell` to exit; answers its status.
    fn exit_status(&mut self) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            assert!(
                started.elapsed() < SHOWN_WITHIN,
                "plinth shell did not exit. The terminal:\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn set_size(master: impl std::os::fd::AsFd, cols: u16, rows: u16) {
    rustix::termios::tcsetwinsize(
        master,
        rustix::termios::Winsize {
            ws_col: cols,
            ws_row: rows,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .expect("TIOCSWINSZ");
}

/// The text after `prefix` in `shown` up to the end of its line.
fn after(shown: &str, prefix: &str) -> String {
    shown
        .rsplit_once(prefix)
        .map(|(_, rest)| rest.lines().next().unwrap_or("").trim().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn plinth_shell_is_a_sized_terminal_in_a_sandboxed_session_and_exits_with_its_status() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let env = built_environment(&server, "Terminal Studio", Duration::from_secs(120)).await;
    let base = server.base.clone();
    let client = server.client.clone();

    let mut terminal = Terminal::open(&server, &["terminal-studio"], 100, 30);
    let (session, checks) = tokio::task::spawn_blocking(move || {
        let terminal = &mut terminal;
        // A person's shell: what is typed runs, and answers.
        let shown = terminal.run("echo hi-$((40+2))");
        assert!(shown.contains("hi-42"), "{shown}");
        let shown = terminal.run("tty");
        assert!(shown.contains("/dev/pts/"), "{shown}");
        assert!(!shown.contains("not a tty"), "{shown}");
        let shown = terminal.run("stty size");
        assert!(shown.contains("30 100"), "the size set on our terminal: {shown}");
        // Resizing our terminal reaches plinth as SIGWINCH, and the remote terminal follows.
        set_size(&terminal.master, 120, 40);
        let mut resized = String::new();
        for _ in 0..40 {
            resized = terminal.run("stty size");
            if resized.contains("40 120") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(resized.contains("40 120"), "{}", terminal.transcript());
        let shown = terminal.run("echo sid=$PLINTH_SESSION_ID");
        let session = after(&shown, "sid=");

        // As an attacker at that prompt: the environment is read-only ...
        let shown = terminal.run(
            "echo pwned > /env/terminal-studio/run.py; echo write=$?; touch /env/terminal-studio/new; echo touch=$?",
        );
        assert_ne!(after(&shown, "write="), "0", "{shown}");
        assert_ne!(after(&shown, "touch="), "0", "{shown}");
        let shown = terminal.run("cat /env/terminal-studio/run.py");
        assert!(shown.contains("print('hi')"), "{shown}");
        // ... and the host's processes are not there to see: only the session's own.
        let shown = terminal.run(
            // `e2[e]-`: grep's own command line must not match.
            "echo pids=$(ls /proc | grep -c '^[0-9]*$'); echo seen=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'e2[e]-')",
        );
        let pids: u32 = after(&shown, "pids=").parse().expect("a count");
        let host_pids = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count() as u32;
        assert!(
            pids < 10 && pids < host_pids,
            "the shell sees {pids} processes (the host has {host_pids}): {shown}"
        );
        assert_eq!(after(&shown, "seen="), "0", "the test's own process is visible: {shown}");

        // `exit 3` ends the remote shell, and plinth with its status.
        terminal.master.write_all(b"exit 3\r").expect("typed");
        let status = terminal.exit_status();
        let restored = rustix::termios::tcgetattr(&terminal.master).expect("termios");
        (
            session,
            (
                status,
                restored.local_modes == terminal.initial.local_modes
                    && restored.input_modes == terminal.initial.input_modes
                    && restored.output_modes == terminal.initial.output_modes,
                terminal.transcript(),
            ),
        )
    })
    .await
    .expect("joined");
    let (status, restored, transcript) = checks;
    assert_eq!(status, Some(3), "{transcript}");
    assert!(restored, "plinth shell left the terminal in raw mode");

    // The session made for the environment was ended.
    let (code, body) = send(client.get(format!("{base}/v1/sessions/{session}"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "ended", "{body}");
    // The shell was a turn of it, like any command.
    let (code, turns) = send(client.get(format!("{base}/v1/sessions/{session}/turns"))).await;
    assert_eq!(code, 200, "{turns}");
    assert!(
        turns["data"]
            .as_array()
            .is_some_and(|turns| turns.iter().any(|turn| turn["kind"] == "exec")),
        "{turns}"
    );
    // The environment is as it was.
    let file = client
        .get(format!("{base}/v1/environments/{env}/files/run.py"))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert_eq!(file, "print('hi')\n");
    server.stop().await;
}

/// Runs `plinth <args>` against `server` as `token`, with `stdin` piped in; answers how it
/// ended.
async fn plinth_shell(
    server: &Server,
    token: &str,
    args: &[&str],
    stdin: &str,
) -> std::process::Output {
    let home = tempfile::tempdir().expect("home");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("PLINTH_URL", &server.base)
        .env("PLINTH_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("plinth runs");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin.as_bytes()).expect("piped");
        drop(input);
        let output = child.wait_with_output().expect("plinth ends");
        drop(home);
        output
    })
    .await
    .expect("joined")
}

/// Runs `plinth <args>` against `server` with a newline typed every millisecond until it
/// exits; answers how it ended.
async fn plinth_shell_typing(server: &Server, args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().expect("home");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("PLINTH_URL", &server.base)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("plinth runs");
        let mut input = child.stdin.take().expect("stdin");
        // Ends when plinth has exited (its end of the pipe is closed).
        let typing = std::thread::spawn(move || {
            while input.write_all(b"\n").is_ok() {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let output = child.wait_with_output().expect("plinth ends");
        let _ = typing.join();
        drop(home);
        output
    })
    .await
    .expect("joined")
}

/// Opens the terminal WebSocket of session `id` as `token`, by `method`, with `query`;
/// answers the socket, or the refusal's status and JSON body.
pub(crate) async fn open_socket(
    server: &Server,
    token: &str,
    method: reqwest::Method,
    id: &str,
    query: &str,
) -> Result<WebSocketStream<reqwest::Upgraded>, (u16, Value)> {
    open_socket_at(&server.base, token, method, id, query).await
}

/// [`open_socket`] on the server at `base` (`http://host:port`).
pub(crate) async fn open_socket_at(
    base: &str,
    token: &str,
    method: reqwest::Method,
    id: &str,
    query: &str,
) -> Result<WebSocketStream<reqwest::Upgraded>, (u16, Value)> {
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let client = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client");
    let response = client
        .request(method, format!("{base}/v1/sessions/{id}/exec?{query}"))
        .bearer_auth(token)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", &key)
        .send()
        .await
        .expect("request");
    if response.status() != 101 {
        return Err(crate::helpers::json(response).await);
    }
    assert_eq!(
        response
            .headers()
            .get("sec-websocket-accept")
            .and_then(|value| value.to_str().ok()),
        Some(tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()).as_str())
    );
    let upgraded = response.upgrade().await.expect("upgraded");
    Ok(WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await)
}

/// Reads the socket until `until` holds for the bytes shown, or an exit frame or a close
/// comes; answers the bytes, the exit code and whether it closed.
pub(crate) async fn read_socket(
    socket: &mut WebSocketStream<reqwest::Upgraded>,
    until: impl Fn(&str) -> bool,
) -> (String, Option<i64>, bool) {
    let mut shown = Vec::new();
    let mut exit = None;
    let read = tokio::time::timeout(SHOWN_WITHIN, async {
        while let Some(frame) = socket.next().await {
            match frame {
                Ok(Message::Binary(bytes)) => {
                    shown.extend_from_slice(&bytes);
                    if until(&String::from_utf8_lossy(&shown)) {
                        return false;
                    }
                }
                Ok(Message::Text(text)) => {
                    let control: Value = serde_json::from_str(text.as_str()).expect("JSON");
                    assert_eq!(control["type"], "exit", "{control}");
                    exit = control["exit_code"].as_i64();
                }
                Ok(Message::Close(_)) | Err(_) => return true,
                Ok(_) => {}
            }
        }
        true
    })
    .await;
    let closed = read.unwrap_or_else(|_| {
        panic!(
            "the socket showed nothing awaited within {SHOWN_WITHIN:?}: {:?}",
            String::from_utf8_lossy(&shown)
        )
    });
    (String::from_utf8_lossy(&shown).into_owned(), exit, closed)
}

#[tokio::test]
async fn the_terminal_socket_needs_an_upgrade_and_the_sessions_scope_and_closes_when_the_session_ends()
 {
    if !crate::helpers::can_build() {
        return;
    }
    let mut server =
        Server::start_with_tokens(&[("tok-acme", "acme"), ("tok-globex", "globex")], &[]).await;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        "Bearer tok-acme".parse().expect("header"),
    );
    server.client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client");
    let env = built_environment(&server, "Socket Studio", Duration::from_secs(120)).await;
    let session = start_session_with(&server, json!({ "environment": env })).await;
    let id = session["id"].as_str().expect("id");

    // Without an upgrade there is nothing to hold a terminal: `426 upgrade_required` with
    // `Upgrade: websocket` (RFC 9110 §15.5.22), saying what is needed.
    let answer = server
        .client
        .post(server.url(&format!("/v1/sessions/{id}/exec?pty=true")))
        .send()
        .await
        .expect("answered");
    assert_eq!(
        answer
            .headers()
            .get("upgrade")
            .and_then(|v| v.to_str().ok()),
        Some("websocket")
    );
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.expect("JSON");
    assert_error(status, &body, 426, "upgrade_required");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("WebSocket upgrade")),
        "{body}"
    );
    let (status, body) = send(
        server
            .client
            .get(server.url(&format!("/v1/sessions/{id}/exec?pty=true"))),
    )
    .await;
    assert_error(status, &body, 426, "upgrade_required");

    // Another scope's token cannot even learn that the session exists.
    let refused = open_socket(&server, "tok-globex", reqwest::Method::POST, id, "pty=true")
        .await
        .expect_err("refused");
    assert_error(refused.0, &refused.1, 404, "not_found");
    // A size no terminal has is refused before anything runs.
    let refused = open_socket(
        &server,
        "tok-acme",
        reqwest::Method::POST,
        id,
        "pty=true&cols=0",
    )
    .await
    .expect_err("refused");
    assert_error(refused.0, &refused.1, 400, "environment_invalid");

    // A command on a terminal over GET (as a browser opens one): its output, then its exit.
    let mut socket = open_socket(
        &server,
        "tok-acme",
        reqwest::Method::GET,
        id,
        "pty=true&command=test+-t+0+%26%26+echo+on-a-tty%3B+exit+5",
    )
    .await
    .expect("a terminal");
    let (shown, exit, closed) = read_socket(&mut socket, |_| false).await;
    assert!(shown.contains("on-a-tty"), "{shown:?}");
    assert_eq!((exit, closed), (Some(5), true));

    // `plinth shell` with piped input (no local terminal, so no raw mode): what is piped is
    // typed at the remote terminal, then its end-of-file; a command after `--` runs instead
    // of a shell, on the terminal all the same.
    let piped = plinth_shell(
        &server,
        "tok-acme",
        &["shell", id],
        "echo piped-$((1+1))\nexit 4\n",
    )
    .await;
    assert_eq!(piped.status.code(), Some(4), "{piped:?}");
    assert!(
        String::from_utf8_lossy(&piped.stdout).contains("piped-2"),
        "{piped:?}"
    );
    let ran = plinth_shell(
        &server,
        "tok-acme",
        &[
            "shell",
            id,
            "--",
            "sh",
            "-c",
            "test -t 1 && echo stdout-is-a-tty; exit 6",
        ],
        "",
    )
    .await;
    assert_eq!(ran.status.code(), Some(6), "{ran:?}");
    assert!(
        String::from_utf8_lossy(&ran.stdout).contains("stdout-is-a-tty"),
        "{ran:?}"
    );
    // Another scope's token gets the session's 404 from plinth shell too.
    let refused = plinth_shell(&server, "tok-globex", &["shell", id], "").await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not_found"),
        "{refused:?}"
    );

    // A shell left running is ended with its session: the socket says so and closes.
    let mut socket = open_socket(&server, "tok-acme", reqwest::Method::POST, id, "pty=true")
        .await
        .expect("a terminal");
    socket
        .send(Message::Binary("echo ready-$((6*7)); sleep 600\r".into()))
        .await
        .expect("typed");
    let (shown, _, _) = read_socket(&mut socket, |shown| shown.contains("ready-42")).await;
    assert!(shown.contains("ready-42"), "{shown:?}");
    let (status, ended) = send(
        server
            .client
            .delete(server.url(&format!("/v1/sessions/{id}"))),
    )
    .await;
    assert_eq!(status, 200, "{ended}");
    let (_, exit, closed) = read_socket(&mut socket, |_| false).await;
    assert!(closed, "the socket stayed open after its session ended");
    assert_ne!(
        exit,
        Some(0),
        "a shell killed with its session did not exit 0"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_node_without_isolation_still_gives_a_terminal() {
    if !crate::helpers::can_build() {
        return;
    }
    let server =
        Server::start_with(&["--builder-network", "false", "--insecure-no-isolation"]).await;
    let env = built_environment(&server, "Open Terminal", Duration::from_secs(120)).await;
    let session = start_session_with(&server, json!({ "environment": env })).await;
    let id = session["id"].as_str().expect("id");
    let mut socket = open_socket(
        &server,
        "unused",
        reqwest::Method::POST,
        id,
        "pty=true&command=tty%3B+exit+7&cols=90&rows=20",
    )
    .await
    .expect("a terminal");
    let (shown, exit, closed) = read_socket(&mut socket, |_| false).await;
    assert!(shown.contains("/dev/pts/"), "{shown:?}");
    assert_eq!((exit, closed), (Some(7), true));
    server.stop().await;
}

/// A person working in a terminal is using the session, though the whole terminal is one turn:
/// a session whose idle limit is 2 s keeps running while its terminal shows output for 6 s,
/// and is ended as idle only once the terminal is gone and 2 s pass.
#[tokio::test]
async fn a_terminal_in_use_keeps_its_session_from_its_idle_end() {
    if !crate::helpers::can_build() {
        return;
    }
    let mut server = Server::start_with_tokens(&[("tok-acme", "acme")], &[]).await;
    server.client = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                "Bearer tok-acme".parse().expect("header"),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .expect("client");
    let env = built_environment(&server, "Idle Studio", Duration::from_secs(120)).await;
    let session = start_session_with(
        &server,
        json!({ "environment": env, "limits": { "idle_ms": 2000 } }),
    )
    .await;
    let id = session["id"].as_str().expect("id").to_owned();
    let mut socket = open_socket(
        &server,
        "tok-acme",
        reqwest::Method::POST,
        &id,
        "pty=true&command=for+i+in+1+2+3+4+5+6%3B+do+echo+tick-%24i%3B+sleep+1%3B+done",
    )
    .await
    .expect("a terminal");
    let (shown, exit, closed) = read_socket(&mut socket, |_| false).await;
    assert!(
        shown.contains("tick-6"),
        "the terminal was cut off before its command ended: {shown:?}"
    );
    assert_eq!((exit, closed), (Some(0), true));
    let (status, answer) = send(server.client.get(server.url(&format!("/v1/sessions/{id}")))).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "active", "{answer}");

    // With the terminal gone nothing uses it: ended at its idle end.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, answer) = send(server.client.get(server.url(&format!("/v1/sessions/{id}")))).await;
        if answer["status"] == "ended" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an unused session outlived its idle limit: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    server.stop().await;
}

/// `plinth shell ENV -- CMD` run again and again, a few at once: every run prints all of its
/// command's output and exits with the command's status. The command ends at once, so its
/// last output, its exit and the socket's close come together, as fast as they ever do, and
/// the node has often ended the terminal before the client's first frame (its `close_stdin`)
/// reaches the gateway.
#[tokio::test]
async fn plinth_shell_never_loses_a_commands_output_or_status() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    built_environment(&server, "Many Shells", Duration::from_secs(120)).await;
    const WORKERS: usize = 4;
    const RUNS: usize = 50;
    let failures = futures::future::join_all((0..WORKERS).map(|worker| {
        let server = &server;
        async move {
            let mut failures = Vec::new();
            for run in 0..RUNS {
                let n = worker * RUNS + run;
                let command = format!("seq 1 500; echo out-{n}; exit {}", n % 7 + 1);
                let args = ["shell", "many-shells", "--", "sh", "-c", &command];
                // Half the runs keep typing until plinth exits, so frames reach the gateway
                // as the command ends, and after.
                let ran = if n.is_multiple_of(2) {
                    plinth_shell(server, "unused", &args, "").await
                } else {
                    plinth_shell_typing(server, &args).await
                };
                let stdout = String::from_utf8_lossy(&ran.stdout);
                let printed = stdout
                    .lines()
                    .any(|line| line.trim_end() == format!("out-{n}"));
                if !printed || ran.status.code() != Some((n % 7 + 1) as i32) {
                    failures.push(format!(
                        "run {n}: {:?}, stdout {stdout:?}, stderr {:?}",
                        ran.status.code(),
                        String::from_utf8_lossy(&ran.stderr)
                    ));
                }
            }
            failures
        }
    }))
    .await
    .concat();
    assert!(
        failures.is_empty(),
        "{} of {} runs went wrong:\n{}",
        failures.len(),
        WORKERS * RUNS,
        failures.join("\n")
    );
    server.stop().await;
}
