//! The dispatch endpoint verifies before it reads, as an attacker who knows an adapter's URL
//! but not its secret finds it: unsigned uploads are refused from their headers alone without
//! their bodies being read (the `plinth serve` process's peak memory stays put), bodies that
//! look signed are read only a few at a time, within the request deadline and up to the size
//! limit, and a captured signed call cannot be sent again.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

use super::{Novo, SECRET, adapter, environment, now, request_id, sign, studio_files};
use crate::cluster::spawn_serve;
use crate::helpers::{Server, assert_error, send};

const MIB: usize = 1024 * 1024;
/// The endpoint's body limit.
const LIMIT: usize = 70 * MIB;
/// Bytes written per `write` call.
const PIECE: usize = 64 * 1024;

/// An HTTP/1.1 request written by hand on its own connection, so the test knows exactly how
/// much of the body it had sent when the answer came, and can pause mid-body.
struct RawUpload {
    writer: OwnedWriteHalf,
    answer: tokio::task::JoinHandle<Vec<u8>>,
    chunked: bool,
    pending: Vec<u8>,
    offset: usize,
    /// Body bytes (with chunk framing) written so far.
    sent: usize,
}

impl RawUpload {
    /// Sends the request head: `Content-Length: length`, or chunked when `None`.
    async fn start(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, String)],
        length: Option<usize>,
    ) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        let mut head =
            format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        match length {
            Some(length) => head.push_str(&format!("Content-Length: {length}\r\n\r\n")),
            None => head.push_str("Transfer-Encoding: chunked\r\n\r\n"),
        }
        writer.write_all(head.as_bytes()).await.expect("head");
        let answer = plinth_kit::tasks::spawn(async move {
            let mut answer = Vec::new();
            let mut buffer = vec![0u8; 16 * 1024];
            let read_all = async {
                loop {
                    match reader.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buffer[..n]),
                    }
                    if complete(&answer) {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(60), read_all).await;
            answer
        });
        RawUpload {
            writer,
            answer,
            chunked: length.is_none(),
            pending: Vec::new(),
            offset: 0,
            sent: 0,
        }
    }

    /// Sends up to `bytes` more of the body (spaces, made as they are sent); stops early, and
    /// answers false, once the server has answered or closed the connection.
    async fn send(&mut self, bytes: usize) -> bool {
        let mut remaining = bytes;
        loop {
            if self.offset == self.pending.len() {
                if remaining == 0 {
                    return true;
                }
                let n = remaining.min(PIECE);
                remaining -= n;
                self.pending = if self.chunked {
                    [
                        format!("{n:x}\r\n").into_bytes(),
                        vec![b' '; n],
                        b"\r\n".to_vec(),
                    ]
                    .concat()
                } else {
                    vec![b' '; n]
                };
                self.offset = 0;
            }
            if self.answer.is_finished() {
                return false;
            }
            let write = self.writer.write(&self.pending[self.offset..]);
            match tokio::time::timeout(Duration::from_millis(100), write).await {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(n)) => {
                    self.offset += n;
                    self.sent += n;
                }
                // The server is not reading: look for its answer again.
                Err(_) => {}
            }
        }
    }

    /// Ends a chunked body.
    async fn end(&mut self) {
        if self.chunked {
            let _ = self.writer.write_all(b"0\r\n\r\n").await;
        }
    }

    /// The answer's status and JSON body, and the body bytes sent before it.
    async fn answer(self) -> (u16, Value, usize) {
        let raw = self.answer.await.expect("reader");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no answer after {} bytes sent: {text:?}", self.sent));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {head:?}"));
        let body = serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {text}"));
        (status, body, self.sent)
    }
}

/// Whether `raw` holds an answer's head and all of its `Content-Length` body.
fn complete(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .is_some_and(|length| body.len() >= length)
}

/// Novo's headers for a call, without `Novo-Signature` unless given.
fn novo_headers(method: &str, signature: Option<String>) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("Novo-Environment-Id", "env_test".to_owned()),
        ("Novo-Workspace-Method", method.to_owned()),
        ("Novo-Timestamp", now().to_string()),
        ("Novo-Request-Id", request_id()),
        ("Novo-Org-Id", "org_test".to_owned()),
        ("Novo-Agent-Id", "agent_test".to_owned()),
        ("Novo-Run-Id", "run_attacked".to_owned()),
    ];
    headers.extend(signature.map(|signature| ("Novo-Signature", signature)));
    headers
}

/// A signature of the right shape and age that no secret made.
fn forged() -> String {
    format!("t={},v1={}", now(), "0".repeat(64))
}

/// The high-water mark of a process's resident memory, in bytes.
fn peak_memory(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .expect("VmHWM")
}

/// A small call to `path` with a forged signature.
async fn forged_call(server: &Server, path: &str) -> reqwest::Response {
    let mut request = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json");
    for (name, value) in novo_headers("listFiles", Some(forged())) {
        request = request.header(name, value);
    }
    request
        .body(br#"{"method":"listFiles","args":{}}"#.to_vec())
        .send()
        .await
        .expect("send")
}

fn address(base: &str) -> SocketAddr {
    base.trim_start_matches("http://").parse().expect("address")
}

#[tokio::test]
async fn unsigned_uploads_are_refused_before_their_bodies_are_read() {
    // `plinth serve` as its own process, so its memory is its own.
    let data = tempfile::tempdir().expect("data dir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--builder-network",
            "false",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_TOKENS")
        .stdin(Stdio::null());
    let (process, http) = spawn_serve(&mut command).await;
    let client = crate::helpers::http_client();
    let base = format!("http://{http}");
    let (status, env) = send(
        client
            .post(format!("{base}/v1/environments"))
            .json(&json!({"name": "Attacked Studio"})),
    )
    .await;
    assert_eq!(status, 201, "{env}");
    let (status, created) = send(
        client
            .post(format!("{base}/v1/workspace-adapters"))
            .json(&json!({"protocol": "novo", "environment": env["id"], "secret": SECRET})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let path = format!(
        "/v1/workspace-adapters/{}/novo",
        created["id"].as_str().expect("id")
    );

    // Warm the path up, then measure from there.
    let mut warm = RawUpload::start(http, &path, &novo_headers("readFile", None), Some(2)).await;
    warm.send(2).await;
    let (status, body, _) = warm.answer().await;
    assert_error(status, &body, 401, "unauthenticated");
    let before = peak_memory(process.0.id());

    // Six at once, 60 MiB each, half with a declared length and half chunked, with no
    // signature or a header that cannot be one.
    const BODY: usize = 60 * MIB;
    let uploads = (0..6).map(|i| {
        let path = path.clone();
        plinth_kit::tasks::spawn(async move {
            let signature = match i % 3 {
                0 => None,
                1 => Some(String::new()),
                _ => Some(format!("t={},v1=not-a-signature", now())),
            };
            let length = (i % 2 == 0).then_some(BODY);
            let headers = novo_headers("writeRuntimeArtifact", signature);
            let mut upload = RawUpload::start(http, &path, &headers, length).await;
            let whole = upload.send(BODY).await;
            upload.end().await;
            let (status, body, sent) = upload.answer().await;
            (whole, status, body, sent)
        })
    });
    let answers = futures::future::join_all(uploads).await;
    let after = peak_memory(process.0.id());
    for answer in answers {
        let (whole, status, body, sent) = answer.expect("upload");
        eprintln!("refused with {} KiB of 60 MiB sent", sent / 1024);
        assert_error(status, &body, 401, "unauthenticated");
        assert!(
            !whole && sent < 16 * MIB,
            "refused with {} MiB of 60 sent",
            sent / MIB
        );
    }
    eprintln!(
        "peak memory {} MiB before, {} MiB after",
        before / MIB,
        after / MIB
    );
    assert!(
        after - before < 100 * MIB,
        "peak memory rose by {} MiB (from {} MiB)",
        (after - before) / MIB,
        before / MIB
    );
    // The server is as it was.
    let (status, listed) = send(client.get(format!("{base}/v1/environments"))).await;
    assert_eq!(status, 200, "{listed}");
}

#[tokio::test]
async fn bodies_that_look_signed_are_read_few_at_a_time_within_the_deadline_and_the_limit() {
    let server = Server::start_with(&[
        "--adapter-max-unverified-bodies",
        "1",
        "--request-timeout-seconds",
        "3",
    ])
    .await;
    let http = address(&server.base);
    let (status, env) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Forged Studio"})),
    )
    .await;
    assert_eq!(status, 201, "{env}");
    let adapter = adapter(&server, env["id"].as_str().expect("id")).await;
    let path = format!("/v1/workspace-adapters/{adapter}/novo");
    // One body that looks signed is being read (slowly): another is not read beside it.
    let mut slow = RawUpload::start(
        http,
        &path,
        &novo_headers("listFiles", Some(forged())),
        Some(MIB),
    )
    .await;
    assert!(slow.send(MIB / 2).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let busy = forged_call(&server, &path).await;
    let retry_after = busy
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let (status, body) = crate::helpers::json(busy).await;
    assert_error(status, &body, 503, "unavailable");
    assert!(retry_after.is_some_and(|seconds| seconds >= 1), "{body}");
    // Once it has all arrived it is refused for its signature, and the next is read.
    assert!(slow.send(MIB / 2).await);
    let (status, body, _) = slow.answer().await;
    assert_error(status, &body, 401, "unauthenticated");
    let (status, body) = crate::helpers::json(forged_call(&server, &path).await).await;
    assert_error(status, &body, 401, "unauthenticated");

    // A body that never ends is refused as it passes the limit, not read to its end.
    let mut endless = RawUpload::start(
        http,
        &path,
        &novo_headers("writeRuntimeArtifact", Some(forged())),
        None,
    )
    .await;
    assert!(!endless.send(200 * MIB).await, "refused before 200 MiB");
    let (status, body, sent) = endless.answer().await;
    assert_error(status, &body, 413, "file_too_large");
    assert_eq!(body["error"]["detail"]["max_bytes"], LIMIT);
    assert!(sent < LIMIT + 16 * MIB, "{} MiB sent", sent / MIB);
    // One that declares more than the limit is refused from its headers.
    let mut declared = RawUpload::start(
        http,
        &path,
        &novo_headers("writeRuntimeArtifact", Some(forged())),
        Some(LIMIT + 1),
    )
    .await;
    assert!(!declared.send(LIMIT + 1).await);
    let (status, body, sent) = declared.answer().await;
    assert_error(status, &body, 413, "file_too_large");
    assert!(sent < 16 * MIB, "{} MiB sent", sent / MIB);

    // One that stalls holds its place only until the request deadline.
    let mut stalled = RawUpload::start(
        http,
        &path,
        &novo_headers("listFiles", Some(forged())),
        Some(MIB),
    )
    .await;
    assert!(stalled.send(1024).await);
    let (status, body, _) = stalled.answer().await;
    assert_error(status, &body, 400, "workspace_invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("request_timeout_seconds")),
        "{body}"
    );
    let (status, body) = crate::helpers::json(forged_call(&server, &path).await).await;
    assert_error(status, &body, 401, "unauthenticated");

    // No such adapter: refused before the body, whatever it would have been.
    let mut unknown = RawUpload::start(
        http,
        "/v1/workspace-adapters/wadp_00000000000000000000000000000000/novo",
        &novo_headers("writeRuntimeArtifact", Some(forged())),
        Some(60 * MIB),
    )
    .await;
    assert!(!unknown.send(60 * MIB).await);
    let (status, body, sent) = unknown.answer().await;
    assert_error(status, &body, 404, "not_found");
    assert!(sent < 16 * MIB, "{} MiB sent", sent / MIB);
    server.stop().await;
}

#[tokio::test]
async fn a_captured_signed_call_cannot_be_sent_again() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (env, _) = environment(&server, "Replayed Studio", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_victim");

    // The victim's call, as an attacker on the path captured it.
    let body = serde_json::to_vec(&json!({
        "method": "editFile",
        "args": {"path": "notes.txt", "operation": "append", "contents": "first\n"},
        "options": {"callId": "call_1"},
    }))
    .expect("json");
    let t = now();
    let captured = format!("t={t},v1={}", sign(SECRET, t, &body));
    let (status, first) = novo
        .raw(
            "editFile",
            body.clone(),
            Some(captured.clone()),
            "req_victim",
        )
        .await;
    assert_eq!(status, 200, "{first}");
    // The victim goes on: the file changes again.
    assert_eq!(novo.sh("echo second > notes.txt").await, "");

    // Sent again with a new request id (it is not signed), to the same run or another: refused,
    // and nothing ran.
    for (run, key) in [
        ("run_victim", request_id()),
        ("run_other", "req_victim".to_owned()),
    ] {
        let replayer = Novo::new(&server, &adapter, run);
        let (status, answer) = replayer
            .raw("editFile", body.clone(), Some(captured.clone()), &key)
            .await;
        assert_error(status, &answer, 401, "unauthenticated");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("replay")),
            "{answer}"
        );
    }
    assert_eq!(novo.cat("notes.txt").await, "second\n");
    let other = Novo::new(&server, &adapter, "run_other");
    let listed = other.ok("listFiles", json!({})).await;
    assert_eq!(
        listed["entries"],
        json!([]),
        "the other run was not touched"
    );
    // The very same request again (its own request id, its own run) is the call retried:
    // answered from what it answered the first time, and not run again.
    let (status, again) = novo
        .raw(
            "editFile",
            body.clone(),
            Some(captured.clone()),
            "req_victim",
        )
        .await;
    assert_eq!((status, &again), (200, &first));
    assert_eq!(novo.cat("notes.txt").await, "second\n");
    // A read is no idempotent call, and needs none.
    let read = serde_json::to_vec(&json!({
        "method": "readFile", "args": {"path": "notes.txt"}, "options": {"callId": "call_2"},
    }))
    .expect("json");
    let signature = format!("t={t},v1={}", sign(SECRET, t, &read));
    let (status, shown) = novo
        .raw(
            "readFile",
            read.clone(),
            Some(signature.clone()),
            "req_read",
        )
        .await;
    assert_eq!(
        (status, &shown["content"]),
        (200, &json!("second\n")),
        "{shown}"
    );
    // Sent again, it is answered: a read changes nothing, and an agent reads a file twice in
    // one second with the same signature.
    let (status, again) = novo
        .raw("readFile", read, Some(signature), "req_read")
        .await;
    assert_eq!((status, &again), (200, &shown));
    server.stop().await;
}
