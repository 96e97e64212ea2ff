//! Git imports that fail for the repository server's reasons, through real HTTP against
//! `plinth serve` and the real `git`: a connection refused and a host name that does not
//! resolve are `502 remote_unreachable`, a server that accepts and never answers is
//! `504 remote_timeout` at the configured fetch deadline; each with `Retry-After`, a message
//! that says what to do, and the environment's source as it was. Every address is on this
//! machine: the refused and silent servers are loopback listeners the test binds, and the
//! unresolvable name is under `.invalid`, which no resolver answers (RFC 6761).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, put_file};

const KEPT: &str = "kept.txt";

/// A server that takes git imports from loopback over http, with `timeout` seconds to fetch.
async fn server(timeout: &str) -> Server {
    Server::start_with(&[
        "--git-allowed-schemes",
        "http,https",
        "--git-allow-private-addresses",
        "true",
        "--git-fetch-timeout-seconds",
        timeout,
    ])
    .await
}

/// An environment holding one file, `KEPT`.
async fn environment_with_a_file(server: &Server) -> String {
    let id = crate::helpers::create_environment(server, "Git faults").await;
    put_file(server, &id, KEPT, "still here\n").await;
    id
}

/// Imports `url` with `replace`, so that an import that went through would drop `KEPT`;
/// answers the status, the `Retry-After` header and the body.
async fn import(server: &Server, id: &str, url: &str) -> (u16, Option<String>, Value) {
    let response = server
        .client
        .post(server.url(&format!("/v1/environments/{id}/import")))
        .json(&json!({"git": {"url": url, "ref": "main"}, "replace": true}))
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().expect("ascii").to_owned());
    let body: Value = response.json().await.expect("JSON body");
    (status, retry_after, body)
}

/// The paths of the environment's source.
async fn source(server: &Server, id: &str) -> Vec<String> {
    let response = server
        .client
        .get(server.url(&format!("/v1/environments/{id}/files")))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON body");
    body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| entry["path"].as_str().expect("path").to_owned())
        .collect()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_refused_connection_and_an_unresolvable_host_are_502_and_change_nothing() {
    let server = server("120").await;
    let id = environment_with_a_file(&server).await;
    // A port that was just bound and closed: nothing listens there.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    for (case, url, says) in [
        (
            "refused",
            format!("http://127.0.0.1:{closed}/repo.git"),
            "127.0.0.1",
        ),
        (
            "unresolvable",
            "https://nothing.invalid/x.git".to_owned(),
            "nothing.invalid",
        ),
    ] {
        let (status, retry_after, body) = import(&server, &id, &url).await;
        assert_error(status, &body, 502, "remote_unreachable");
        assert_eq!(retry_after.as_deref(), Some("30"), "{case}: {body}");
        assert_eq!(body["error"]["detail"]["retry_after_ms"], 30_000, "{case}");
        let said = message(&body);
        assert!(
            said.contains(says),
            "{case}: the message names the server: {said}"
        );
        assert!(
            said.contains("retry later") && said.contains("nothing was imported"),
            "{case}: the message says what to do: {said}"
        );
        assert_eq!(
            source(&server, &id).await,
            [KEPT],
            "{case}: nothing changed"
        );
    }
    server.stop().await;
}

/// A loopback listener that accepts connections and never answers on them, until dropped.
struct Silent {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Silent {
    fn start() -> Silent {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((connection, _)) => held.push(connection),
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        });
        Silent {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test]
async fn a_server_that_never_answers_is_504_at_the_fetch_deadline_and_changes_nothing() {
    let server = server("2").await;
    let id = environment_with_a_file(&server).await;
    let silent = Silent::start();
    let url = format!("http://127.0.0.1:{}/repo.git", silent.port);
    let (status, retry_after, body) = import(&server, &id, &url).await;
    assert_error(status, &body, 504, "remote_timeout");
    assert_eq!(retry_after.as_deref(), Some("30"), "{body}");
    assert_eq!(body["error"]["detail"]["timeout_seconds"], 2, "{body}");
    let said = message(&body);
    assert!(
        said.contains("within 2 s") && said.contains("source.git_fetch_timeout_seconds"),
        "the message names the deadline and its setting: {said}"
    );
    assert!(said.contains("Retry later"), "{said}");
    assert_eq!(source(&server, &id).await, [KEPT], "nothing changed");
    drop(silent);
    server.stop().await;
}
