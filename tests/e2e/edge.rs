//! The gateway's own limits as a client meets them: one token past its rate is refused with
//! `429 rate_limited` and `Retry-After` while another token is served, and so is one holding
//! its most requests in flight; streamed answers and commands outlive the request deadline;
//! downloads a browser would run come as attachments, and none is sniffed; client tokens come
//! from the config file or the environment only, once each.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::build_rules::{Builder, ready};
use crate::helpers::{
    Server, assert_error, built_environment, create_environment, json as read_json, put_file, send,
    start_session_with, tokens_toml,
};
use crate::waiting::eventually;

const ACME: &str = "tok-acme-edge";
const GLOBEX: &str = "tok-globex-edge";

#[tokio::test]
async fn one_token_past_its_rate_is_refused_while_another_is_served() {
    let config = format!(
        "{}[gateway]\nrate_limit_per_second = 1\nrate_limit_burst = 3\n",
        tokens_toml(&[(ACME, "acme"), (GLOBEX, "globex")])
    );
    let server = Server::start_with_config(&config, &[]).await;
    let list = |token: &'static str| {
        server
            .client
            .get(server.url("/v1/environments"))
            .bearer_auth(token)
            .send()
    };

    // Acme spends its burst, all at once.
    let burst = futures::future::join_all((0..3).map(|_| list(ACME))).await;
    for response in burst {
        assert_eq!(response.expect("request").status(), 200);
    }
    // The next is refused, and in the same moment Globex is served.
    let (refused, served) = tokio::join!(list(ACME), list(GLOBEX));
    let refused = refused.expect("request");
    let retry_after = refused
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok())
        .expect("Retry-After in whole seconds");
    let (status, body) = read_json(refused).await;
    assert_error(status, &body, 429, "rate_limited");
    assert_eq!(
        body["error"]["detail"]["retry_after_ms"],
        retry_after * 1000,
        "{body}"
    );
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    let (status, listed) = read_json(served.expect("request")).await;
    assert_eq!(status, 200, "{listed}");
    // A request with no token, or an unknown one, is refused for that, not counted.
    let (status, body) = send(server.client.get(server.url("/v1/environments"))).await;
    assert_error(status, &body, 401, "unauthenticated");
    let (status, body) = send(
        server
            .client
            .get(server.url("/v1/environments"))
            .bearer_auth("tok-unknown"),
    )
    .await;
    assert_error(status, &body, 401, "unauthenticated");
    // After the wait it names, Acme is served again.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let (status, listed) = read_json(list(ACME).await.expect("request")).await;
    assert_eq!(status, 200, "{listed}");

    // The API's description says so, for every operation a token calls.
    let (status, doc) = send(server.client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    for (path, method) in [
        ("/v1/environments", "get"),
        ("/v1/environments/{id}/files/{path}", "put"),
        ("/v1/sessions/{id}/exec", "post"),
    ] {
        let refused = &doc["paths"][path][method]["responses"]["429"];
        assert!(
            refused["description"]
                .as_str()
                .is_some_and(|text| text.contains("rate_limited")),
            "{method} {path}: {refused}"
        );
        assert!(refused["headers"].get("Retry-After").is_some(), "{refused}");
    }
    // Novo calls with its signature, not a client token: the rate that applies is its
    // adapter's, and the description says which setting gives it.
    let novo = &doc["paths"]["/v1/workspace-adapters/{id}/novo"]["post"]["responses"]["429"];
    assert!(
        novo["description"]
            .as_str()
            .is_some_and(|text| text.contains("gateway.adapter_rate_limit_per_second")),
        "{novo}"
    );
    assert!(
        doc["components"]["schemas"]["ErrorObject"]["properties"]["code"]["description"]
            .as_str()
            .is_some_and(|text| text.contains("rate_limited")),
        "the error codes listed in the schema name it"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_followed_build_log_outlives_the_request_deadline() {
    let server = Server::start_with(&["--builders", "0", "--request-timeout-seconds", "1"]).await;
    let mut builder = Builder::connect(&server).await;
    let id = &create_environment(&server, "Slow Build").await;
    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let claim = builder.claim().await;
    builder.log(&claim, "resolving\n").await;
    let follower = {
        let (client, url) = (
            server.client.clone(),
            server.url(&format!("/v1/environments/{id}/builds/1/log?follow=true")),
        );
        plinth_kit::tasks::spawn(async move {
            let response = client.get(url).send().await.expect("request");
            (response.status().as_u16(), response.text().await)
        })
    };
    // Three times the deadline: the stream goes on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    builder.log(&claim, "installing\n").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    builder.log(&claim, "done\n").await;
    builder.finish(&claim, ready("sha256:slow")).await;
    let (status, text) = tokio::time::timeout(Duration::from_secs(20), follower)
        .await
        .expect("the stream ends with the build")
        .expect("task");
    assert_eq!(status, 200);
    assert_eq!(
        text.expect("the whole stream"),
        "resolving\ninstalling\ndone\n"
    );
    server.stop().await;
}

#[tokio::test]
async fn one_token_holding_its_places_in_flight_leaves_the_others_served() {
    let config = format!(
        "{}[gateway]\nmax_concurrent_requests_per_client = 2\n",
        tokens_toml(&[(ACME, "acme"), (GLOBEX, "globex")])
    );
    let server = Server::start_with_config(&config, &[]).await;
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .bearer_auth(ACME)
            .json(&json!({"name": "Slow uploads"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    // Acme starts two uploads whose bodies trickle in (half a body, then nothing): each holds
    // a place until answered.
    let address = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut uploads = Vec::new();
    for name in ["one.txt", "two.txt"] {
        let mut stream = tokio::net::TcpStream::connect(&address)
            .await
            .expect("connecting");
        let head = format!(
            "PUT /v1/environments/{id}/files/{name} HTTP/1.1\r\nHost: {address}\r\n\
             Authorization: Bearer {ACME}\r\nTransfer-Encoding: chunked\r\n\r\n\
             c\r\nfirst half, \r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("sending half an upload");
        uploads.push(stream);
    }
    let list = |token: &'static str| {
        server
            .client
            .get(server.url("/v1/environments"))
            .bearer_auth(token)
            .send()
    };
    // Once both are in flight, Acme's next request is refused, naming the setting, while
    // Globex is served. (The uploads reach the server in their own time: ask until refused.)
    let refused = eventually(Duration::from_secs(5), async || {
        let response = list(ACME).await.expect("request");
        match response.status().as_u16() {
            503 => Ok(response),
            status => Err(format!("Acme's third request in flight answered {status}")),
        }
    })
    .await;
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let (status, body) = read_json(refused).await;
    assert_error(status, &body, 503, "unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|text| text.contains("gateway.max_concurrent_requests_per_client")),
        "{body}"
    );
    let (status, listed) = read_json(list(GLOBEX).await.expect("request")).await;
    assert_eq!(status, 200, "{listed}");
    // The uploads finish whole; Acme's places are free again.
    for mut stream in uploads {
        stream
            .write_all(b"c\r\nsecond half\n\r\n0\r\n\r\n")
            .await
            .expect("sending the rest");
        let mut answer = vec![0u8; 12];
        stream
            .read_exact(&mut answer)
            .await
            .expect("the upload's answer");
        assert_eq!(
            &answer,
            b"HTTP/1.1 200",
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    let (status, listed) = read_json(list(ACME).await.expect("request")).await;
    assert_eq!(status, 200, "{listed}");
    let read = server
        .client
        .get(server.url(&format!("/v1/environments/{id}/files/two.txt")))
        .bearer_auth(ACME)
        .send()
        .await
        .expect("read");
    assert_eq!(
        read.text().await.expect("text"),
        "first half, second half\n"
    );
    server.stop().await;
}

#[tokio::test]
async fn commands_and_their_streams_outlive_the_request_deadline() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&[
        "--builder-network",
        "false",
        "--request-timeout-seconds",
        "1",
    ])
    .await;
    let id = built_environment(&server, "Deadline Studio", Duration::from_secs(180)).await;
    let session = start_session_with(&server, json!({"environment": id})).await;
    let session = session["id"].as_str().expect("id");
    let exec = |stream: bool| {
        server
            .client
            .post(server.url(&format!(
                "/v1/sessions/{session}/exec{}",
                if stream { "?stream=true" } else { "" }
            )))
            .json(&json!({"command": "sleep 2.5; echo finished", "timeout_ms": 30_000}))
            .send()
    };
    let (status, ran) = read_json(exec(false).await.expect("exec")).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "finished\n", "{ran}");
    let streamed = exec(true).await.expect("exec");
    assert_eq!(streamed.status(), 200);
    let text = streamed.text().await.expect("the whole stream");
    let events: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("an event"))
        .collect();
    assert!(
        events
            .iter()
            .any(|event| event["stdout"].as_str() == Some("finished\n")),
        "{text}"
    );
    assert_eq!(events.last().expect("a result")["exit_code"], 0, "{text}");
    server.stop().await;
}

/// The download headers of one answer: content type, `X-Content-Type-Options`,
/// `Content-Disposition`.
type DownloadHeaders = (String, String, Option<String>);

fn download_headers(response: &reqwest::Response) -> DownloadHeaders {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    (
        header("content-type").unwrap_or_default(),
        header("x-content-type-options").unwrap_or_default(),
        header("content-disposition"),
    )
}

/// What a browser would run, with script in it.
const PAGE: &str = "<html><body><script>fetch('/v1/environments')</script></body></html>\n";
const DRAWING: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>\n";
const NOTES: &str = "<script>not run: plain text</script>\n";

fn assert_downloads(answers: &[(&str, DownloadHeaders)]) {
    for (name, (content_type, nosniff, disposition)) in answers {
        assert_eq!(nosniff, "nosniff", "{name}");
        match *name {
            "index.html" | "logo.svg" => {
                let disposition = disposition.as_deref().unwrap_or_default();
                assert!(
                    disposition.starts_with("attachment")
                        && disposition.contains(&format!("filename=\"{name}\"")),
                    "{name}: {disposition:?}"
                );
            }
            _ => {
                assert_eq!(content_type, "text/plain", "{name}");
                assert_eq!(disposition, &None, "{name}: shown, as text");
            }
        }
    }
}

#[tokio::test]
async fn downloads_a_browser_would_run_are_attachments_and_none_is_sniffed() {
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Download Studio").await;
    let files = [
        ("index.html", PAGE),
        ("logo.svg", DRAWING),
        ("notes.txt", NOTES),
    ];
    for (name, content) in files {
        put_file(&server, &id, &format!("site/{name}"), content).await;
    }
    let mut answers = Vec::new();
    for (name, content) in files {
        let response = server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files/site/{name}")))
            .send()
            .await
            .expect("download");
        assert_eq!(response.status(), 200);
        let headers = download_headers(&response);
        assert_eq!(response.text().await.expect("bytes"), content, "unchanged");
        answers.push((name, headers));
    }
    assert_eq!(answers[0].1.0, "text/html");
    assert_eq!(answers[1].1.0, "image/svg+xml");
    assert_downloads(&answers);

    // The same from a session's working directory.
    if crate::helpers::can_build() {
        put_file(&server, &id, "run.py", "print('hi')\n").await;
        crate::helpers::build_ready(&server, &id, 1, Duration::from_secs(180)).await;
        let session = start_session_with(&server, json!({"environment": id})).await;
        let session = session["id"].as_str().expect("id");
        let mut answers = Vec::new();
        for (name, content) in files {
            let url = server.url(&format!("/v1/sessions/{session}/files/out/{name}"));
            let (status, wrote) = send(server.client.put(&url).body(content)).await;
            assert_eq!(status, 200, "{wrote}");
            let response = server.client.get(&url).send().await.expect("download");
            assert_eq!(response.status(), 200);
            let headers = download_headers(&response);
            assert_eq!(response.text().await.expect("bytes"), content);
            answers.push((name, headers));
        }
        assert_downloads(&answers);
    }
    server.stop().await;
}

/// `plinth serve` with these arguments and environment, expected to stop at start-up: its
/// exit status and what it said.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let data = tempfile::tempdir().expect("data dir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_TOKENS")
        .env("PLINTH_LOG", "warn")
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run plinth serve");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[tokio::test]
async fn client_tokens_come_from_the_config_file_or_the_environment_once_each() {
    // On the command line: refused, saying where tokens go instead, without echoing it.
    let (ok, said) = refused_start(&["--tokens", "tok-in-argv=acme", "--dump-config"], &[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("--tokens is refused")
            && said.contains("[[gateway.tokens]]")
            && said.contains("PLINTH_TOKENS"),
        "{said}"
    );
    assert!(!said.contains("tok-in-argv"), "{said}");

    // The same token twice in the file: start-up stops and names the entries, not the token.
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("plinth.toml");
    std::fs::write(
        &file,
        tokens_toml(&[
            ("tok-listed-twice", "acme"),
            ("tok-other", "initech"),
            ("tok-listed-twice", "globex"),
        ]),
    )
    .expect("config");
    let path = file.to_str().expect("utf-8");
    let (ok, said) = refused_start(&["--config", path, "--dump-config"], &[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("gateway.tokens: entries 1 (scope \"acme\") and 3 (scope \"globex\") have the same token"),
        "{said}"
    );
    assert!(!said.contains("tok-listed-twice"), "{said}");

    // From the environment, with the edge limits: taken, and shown (token redacted).
    let (ok, dumped) = refused_start(
        &["--dump-config"],
        &[
            ("PLINTH_TOKENS", "tok-from-env=acme"),
            ("PLINTH_RATE_LIMIT_PER_SECOND", "7"),
            ("PLINTH_RATE_LIMIT_BURST", "9"),
            ("PLINTH_REQUEST_TIMEOUT_SECONDS", "45"),
            ("PLINTH_MAX_CONCURRENT_REQUESTS", "64"),
            ("PLINTH_ADAPTER_MAX_UNVERIFIED_BODIES", "2"),
        ],
    );
    assert!(ok, "{dumped}");
    for line in [
        "scope = \"acme\"",
        "rate_limit_per_second = 7",
        "rate_limit_burst = 9",
        "request_timeout_seconds = 45",
        "max_concurrent_requests = 64",
        "adapter_max_unverified_bodies = 2",
    ] {
        assert!(dumped.contains(line), "{line} not in:\n{dumped}");
    }
    assert!(!dumped.contains("tok-from-env"), "{dumped}");
    let (ok, said) = refused_start(
        &["--dump-config"],
        &[("PLINTH_TOKENS", "tok-a=acme,tok-a=globex")],
    );
    assert!(!ok, "{said}");
    assert!(said.contains("PLINTH_TOKENS: entries 1"), "{said}");

    // And a server with tokens from its file serves them.
    let server = Server::start_with_tokens(&[(ACME, "acme")], &[]).await;
    let (status, listed) = send(
        server
            .client
            .get(server.url("/v1/environments"))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    server.stop().await;
}

/// Opens `count` connections to `address`, each sending half a request line and no more.
async fn slow_clients(address: &str, count: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt as _;
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
            continue;
        };
        // Refused ones are closed by the server at once; the write may fail then.
        let _ = stream.write_all(b"GET /v1/envi").await;
        open.push(stream);
    }
    open
}

/// Whether the server closed `stream` (end of stream, or a reset) before `deadline`; what it
/// sent before closing is read and dropped.
async fn closed_by_server(
    mut stream: tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn connections_that_never_finish_their_headers_are_closed_at_the_header_timeout() {
    let server = Server::start_with(&["--header-timeout-seconds", "2"]).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let slow = slow_clients(&address, 500).await;
    assert_eq!(slow.len(), 500, "every connection was accepted");
    // While they hang, a well-formed request is answered.
    let (status, listed) = send(server.client.get(server.url("/v1/environments"))).await;
    assert_eq!(status, 200, "{listed}");
    // Each is closed by the server; the deadline is generous, the timeout is 2 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let closed = futures::future::join_all(
        slow.into_iter()
            .map(|stream| closed_by_server(stream, deadline)),
    )
    .await;
    let open = closed.iter().filter(|closed| !**closed).count();
    assert_eq!(
        open, 0,
        "{open} of 500 slow connections were still open after 60 s"
    );
    // An idle keep-alive connection (one request answered, then silence) is closed too.
    let mut idle = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    {
        use tokio::io::AsyncWriteExt as _;
        idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .await
            .expect("request");
    }
    assert!(
        closed_by_server(idle, tokio::time::Instant::now() + Duration::from_secs(60)).await,
        "an idle keep-alive connection stayed open"
    );
    server.stop().await;
}

#[tokio::test]
async fn more_slow_connections_than_descriptors_leave_a_well_formed_request_answered() {
    let data = tempfile::tempdir().expect("data dir");
    let mut command = Command::new("prlimit");
    command
        .arg("--nofile=256")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_plinth"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0", "--header-timeout-seconds", "2"])
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_TOKENS")
        .env("PLINTH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let (mut process, http) = crate::cluster::spawn_serve(&mut command).await;
    let client = crate::helpers::http_client();
    let base = format!("http://{http}");

    // More connections than the process has descriptors, each stalled in its request line.
    let slow = slow_clients(&http.to_string(), 400).await;
    assert!(slow.len() > 256, "only {} connected", slow.len());
    // A well-formed request, on a connection of its own, is answered: at once, or once the
    // header timeout frees places.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let created = loop {
        let answer = fresh
            .post(format!("{base}/v1/environments"))
            .json(&json!({"name": "Still served"}))
            .send()
            .await;
        match answer {
            Ok(response) if response.status() == 201 => break true,
            _ if tokio::time::Instant::now() > deadline => break false,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert!(created, "no well-formed request was answered within 60 s");
    assert!(
        process.0.try_wait().expect("status").is_none(),
        "the server is still running"
    );
    let (status, listed) = send(client.get(format!("{base}/v1/environments"))).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["data"][0]["name"], "Still served", "{listed}");
    let ready = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "every service still serving");
    drop(slow);
}
