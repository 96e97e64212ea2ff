//! A web page against a default `plinth serve` (loopback, no tokens), in a real headless
//! Chromium (Debian's `chromium`, driven by Playwright for Python): the page, served by this
//! test from another loopback origin, tries what any page its owner opens could try: JSON
//! sent as `text/plain` (no preflight), JSON as JSON (a preflight, never granted), a form
//! post, and the terminal's WebSocket; and the browser is pointed at the server under a name
//! that resolves to it (DNS rebinding). Each is refused, nothing is created or run, and a
//! client that is not a browser still works.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::helpers::{Server, assert_error, built_environment, exec_in, send, start_session_with};

/// The browser as Debian installs it.
const CHROMIUM: &str = "/usr/bin/chromium";

/// What the page does, run by Playwright in the page's own origin. Every attempt reports
/// what the page could see of it.
const ATTACK: &str = r#"
import json, sys, tempfile
from playwright.sync_api import sync_playwright

api, page_url, session, rebound = sys.argv[1:5]
script = """async ({api, session}) => {
  const out = {};
  const attempt = async (name, run) => {
    try { out[name] = await run(); } catch (error) { out[name] = "error: " + error; }
  };
  await attempt("text_plain", async () => {
    const answer = await fetch(api + "/v1/environments", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: '{"name": "pwned-text"}'});
    return "sent: " + answer.type;
  });
  await attempt("text_plain_exec", async () => {
    const answer = await fetch(api + "/v1/sessions/" + session + "/exec", {method: "POST",
      mode: "no-cors", headers: {"Content-Type": "text/plain"},
      body: '{"command": "touch pwned-exec"}'});
    return "sent: " + answer.type;
  });
  await attempt("json", async () => {
    const answer = await fetch(api + "/v1/environments", {method: "POST",
      headers: {"Content-Type": "application/json"}, body: '{"name": "pwned-json"}'});
    return "answered: " + answer.status;
  });
  await attempt("form", () => new Promise((resolve) => {
    const sink = document.createElement("iframe");
    sink.name = "sink";
    document.body.appendChild(sink);
    const form = document.createElement("form");
    form.method = "POST";
    form.action = api + "/v1/environments";
    form.enctype = "text/plain";
    form.target = "sink";
    const field = document.createElement("input");
    field.name = '{"name": "pwned-form", "x": "';
    field.value = '"}';
    form.appendChild(field);
    document.body.appendChild(form);
    sink.onload = () => resolve("submitted");
    form.submit();
    setTimeout(() => resolve("no answer"), 15000);
  }));
  await attempt("websocket", () => new Promise((resolve) => {
    const socket = new WebSocket(api.replace("http:", "ws:") + "/v1/sessions/" + session +
      "/exec?pty=true&command=" + encodeURIComponent("touch pwned-terminal"));
    socket.onopen = () => resolve("opened");
    socket.onerror = () => resolve("refused");
    socket.onclose = () => resolve("refused");
    setTimeout(() => resolve("no answer"), 15000);
  }));
  return out;
}"""
args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--host-resolver-rules=MAP evil.example 127.0.0.1"]
with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
    browser = playwright.chromium.launch_persistent_context(
        profile, executable_path="/usr/bin/chromium", headless=True, args=args)
    page = browser.new_page()
    page.goto(page_url)
    results = page.evaluate(script, {"api": api, "session": session})
    answer = page.goto(rebound)
    results["rebound_status"] = answer.status if answer else None
    results["rebound_text"] = page.inner_text("body")
    browser.close()
print(json.dumps(results))
"#;

/// Whether Chromium and Playwright for Python are here. Under CI their absence is a failure
/// (`.ci/run` installs both); elsewhere the test says so and is skipped.
pub(crate) fn have_browser() -> bool {
    let driver = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if Path::new(CHROMIUM).exists() && driver {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the browser test needs Debian's chromium ({CHROMIUM}) and Playwright for Python under CI"
    );
    eprintln!("no {CHROMIUM} or no Playwright for Python: skipping the browser test");
    false
}

/// A web server on another loopback address (another origin) answering every request with
/// an empty page; it serves until the test ends.
async fn attacker_page() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let address = listener.local_addr().expect("address");
    plinth_kit::tasks::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            plinth_kit::tasks::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let page = "<!doctype html><html><body><p>a page</p></body></html>";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    format!("http://{address}/")
}

/// `plinth_gateway_refused_total{reason}` as `/metrics` says (open without tokens).
async fn refused(server: &Server, reason: &str) -> u64 {
    let text = server
        .client
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let series = format!("plinth_gateway_refused_total{{reason=\"{reason}\"}}");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_web_page_cannot_drive_a_default_serve() {
    if !crate::helpers::can_build() || !have_browser() {
        return;
    }
    let server = Server::start().await;
    let environment = built_environment(&server, "Victim", Duration::from_secs(120)).await;
    let session = start_session_with(&server, json!({"environment": environment})).await;
    let session = session["id"].as_str().expect("session id").to_owned();
    let page = attacker_page().await;
    let port = server.base.rsplit(':').next().expect("port").to_owned();
    let rebound = format!("http://evil.example:{port}/v1/environments");

    let mut script = tempfile::NamedTempFile::new().expect("script file");
    script.write_all(ATTACK.as_bytes()).expect("script");
    let base = server.base.clone();
    let script_path = script.path().to_owned();
    let session_id = session.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script_path)
            .args([
                base.as_str(),
                page.as_str(),
                session_id.as_str(),
                rebound.as_str(),
            ])
            .output()
            .expect("run python3")
    })
    .await
    .expect("browser");
    assert!(
        output.status.success(),
        "the browser script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "the browser's report is not JSON ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });

    eprintln!("the page saw: {seen}");
    // What the page could see: its JSON request died at the preflight, the terminal never
    // opened, the rebound name was refused.
    assert!(
        seen["json"]
            .as_str()
            .is_some_and(|s| s.starts_with("error:")),
        "a JSON request from another origin needs a preflight, which is not granted: {seen}"
    );
    assert_eq!(seen["websocket"], "refused", "{seen}");
    assert_eq!(
        seen["form"], "submitted",
        "the form's answer arrived: {seen}"
    );
    assert_eq!(seen["rebound_status"], 421, "{seen}");
    assert!(
        seen["rebound_text"]
            .as_str()
            .is_some_and(|text| text.contains("host_not_allowed") && text.contains("allowed_hosts")),
        "{seen}"
    );

    // The server refused them at its edge: the text/plain fetches, the form and the
    // terminal for their origin.
    assert!(
        refused(&server, "origin_not_allowed").await >= 4,
        "four requests carried the page's origin"
    );
    assert!(refused(&server, "host_not_allowed").await >= 1);

    // Nothing was created or run.
    let (status, listed) = send(server.client.get(server.url("/v1/environments"))).await;
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["data"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|environment| environment["name"].as_str())
        .collect();
    assert_eq!(names, ["Victim"], "{listed}");
    let (status, usage) = send(server.client.get(server.url("/v1/usage"))).await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(usage["quotas"]["sessions"]["used"], 1, "{usage}");
    let listing = exec_in(&server, &session, json!({"command": "ls -A"})).await;
    assert_eq!(listing["exit_code"], 0, "{listing}");
    assert!(
        !listing["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("pwned"),
        "{listing}"
    );

    // A client that is not a browser, under the server's own name, is answered as before;
    // under another name it is refused however it asks.
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "From curl"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, answer) = send(
        server
            .client
            .get(server.url("/v1/environments"))
            .header("host", format!("evil.example:{port}")),
    )
    .await;
    assert_error(status, &answer, 421, "host_not_allowed");
    let (status, answer) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .body(r#"{"name": "Plain"}"#),
    )
    .await;
    assert_error(status, &answer, 415, "unsupported_media_type");
    server.stop().await;
}
