//! Terminal tickets, as a web page (the console) uses them and as an attacker would try
//! them: a browser cannot send an `Authorization` header on a WebSocket, so a page asks for a
//! ticket with its bearer token and names it in the terminal's URL. A ticket opens one
//! terminal of its session, from the origin that asked, within its lifetime, once; every
//! other use is refused before anything runs, and the session is left as it was.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::helpers::{Server, assert_error, built_environment, exec_in, send, start_session_with};
use crate::terminal::read_socket;

/// `url` with `pairs` as its query.
fn with_query(url: &str, pairs: &[(&str, &str)]) -> String {
    url::Url::parse_with_params(url, pairs)
        .expect("a URL")
        .to_string()
}

/// Asks for a ticket for `session` with `token`, from a page at `origin` (none: not a page).
async fn ticket(server: &Server, token: &str, session: &str, origin: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(server.url(&format!("/v1/sessions/{session}/terminal-tickets")))
        .bearer_auth(token);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    send(request).await
}

/// Opens `session`'s terminal with `ticket` and no Authorization header, as a page at
/// `origin` (none: not a page) would, running `command`.
async fn open(
    server: &Server,
    session: &str,
    ticket: &str,
    origin: Option<&str>,
    command: &str,
) -> Result<WebSocketStream<reqwest::Upgraded>, (u16, Value)> {
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let client = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client");
    let mut request = client
        .get(with_query(
            &server.url(&format!("/v1/sessions/{session}/exec")),
            &[("pty", "true"), ("command", command), ("ticket", ticket)],
        ))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", &key);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.expect("request");
    if response.status() != 101 {
        return Err(crate::helpers::json(response).await);
    }
    let upgraded = response.upgrade().await.expect("upgraded");
    Ok(WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await)
}

/// Whether `name` exists in `session`'s working directory (asked with `token`).
async fn exists(server: &Server, session: &str, name: &str) -> bool {
    let ran = exec_in(
        server,
        session,
        json!({ "command": format!("test -e {name} && echo yes || echo no") }),
    )
    .await;
    ran["stdout"].as_str().expect("stdout").trim() == "yes"
}

#[tokio::test]
async fn a_terminal_ticket_opens_one_terminal_of_its_session_from_its_origin_once() {
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
    let env = built_environment(&server, "Ticket Studio", Duration::from_secs(120)).await;
    let victim = start_session_with(&server, json!({ "environment": env })).await;
    let victim = victim["id"].as_str().expect("id").to_owned();
    let other = start_session_with(&server, json!({ "environment": env })).await;
    let other = other["id"].as_str().expect("id").to_owned();
    // The server's own origin: where its console is served from.
    let own = server.base.clone();

    // Issued to the console's origin; it opens that session's terminal with no token at all.
    let (status, issued) = ticket(&server, "tok-acme", &victim, Some(&own)).await;
    assert_eq!(status, 201, "{issued}");
    assert_eq!(issued["session"], victim.as_str());
    let first = issued["ticket"].as_str().expect("ticket").to_owned();
    assert!(issued["expires_at"].as_i64().is_some(), "{issued}");
    let mut socket = open(
        &server,
        &victim,
        &first,
        Some(&own),
        "echo ticketed-$((6*7)); touch opened",
    )
    .await
    .expect("the ticket opens the terminal");
    let (shown, exit, _) = read_socket(&mut socket, |_| false).await;
    assert!(shown.contains("ticketed-42"), "{shown:?}");
    assert_eq!(exit, Some(0));
    assert!(exists(&server, &victim, "opened").await);

    // Once: the same ticket again is refused, and nothing runs.
    let refused = open(&server, &victim, &first, Some(&own), "touch again")
        .await
        .expect_err("used");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");

    // Another session: a ticket for one session does not open another (and is spent trying).
    let (_, issued) = ticket(&server, "tok-acme", &victim, Some(&own)).await;
    let stolen = issued["ticket"].as_str().expect("ticket").to_owned();
    let refused = open(&server, &other, &stolen, Some(&own), "touch wrong-session")
        .await
        .expect_err("another session");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    let refused = open(&server, &victim, &stolen, Some(&own), "touch wrong-session")
        .await
        .expect_err("spent by the try");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    assert!(!exists(&server, &other, "wrong-session").await);
    assert!(!exists(&server, &victim, "wrong-session").await);

    // Another scope: globex cannot have a ticket for acme's session, nor use its own on it.
    let (status, body) = ticket(&server, "tok-globex", &victim, Some(&own)).await;
    assert_error(status, &body, 404, "not_found");
    let mut globex = server.client.clone();
    std::mem::swap(&mut server.client, &mut globex);
    server.client = reqwest::Client::builder()
        .default_headers({
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                reqwest::header::AUTHORIZATION,
                "Bearer tok-globex".parse().expect("header"),
            );
            headers
        })
        .build()
        .expect("client");
    let theirs = start_session_with(&server, json!({ "environment": built_environment(&server, "Globex Ticket", Duration::from_secs(120)).await })).await;
    std::mem::swap(&mut server.client, &mut globex);
    let theirs = theirs["id"].as_str().expect("id").to_owned();
    let (status, issued) = ticket(&server, "tok-globex", &theirs, Some(&own)).await;
    assert_eq!(status, 201, "{issued}");
    let refused = open(
        &server,
        &victim,
        issued["ticket"].as_str().expect("ticket"),
        Some(&own),
        "touch cross-scope",
    )
    .await
    .expect_err("another scope's session");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    assert!(!exists(&server, &victim, "cross-scope").await);

    // Another origin: a ticket asked for by a client that is no page does not open a page's
    // terminal, nor the reverse; and another site's page cannot even ask for one.
    let (_, issued) = ticket(&server, "tok-acme", &victim, None).await;
    let refused = open(
        &server,
        &victim,
        issued["ticket"].as_str().expect("ticket"),
        Some(&own),
        "touch no-origin",
    )
    .await
    .expect_err("issued without an origin");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    let (_, issued) = ticket(&server, "tok-acme", &victim, Some(&own)).await;
    let refused = open(
        &server,
        &victim,
        issued["ticket"].as_str().expect("ticket"),
        None,
        "touch no-origin",
    )
    .await
    .expect_err("used without its origin");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    let (status, body) = ticket(&server, "tok-acme", &victim, Some("http://127.0.0.1:1")).await;
    assert_error(status, &body, 403, "origin_not_allowed");
    let (_, issued) = ticket(&server, "tok-acme", &victim, Some(&own)).await;
    let refused = open(
        &server,
        &victim,
        issued["ticket"].as_str().expect("ticket"),
        Some("http://127.0.0.1:1"),
        "touch other-origin",
    )
    .await
    .expect_err("another site's page");
    assert_error(refused.0, &refused.1, 403, "origin_not_allowed");
    assert!(!exists(&server, &victim, "no-origin").await);
    assert!(!exists(&server, &victim, "other-origin").await);

    // A ticket is no token: it authenticates nothing but its terminal's GET.
    let (_, issued) = ticket(&server, "tok-acme", &victim, None).await;
    let kept = issued["ticket"].as_str().expect("ticket").to_owned();
    let (status, body) = send(reqwest::Client::new().get(with_query(
        &server.url(&format!("/v1/sessions/{victim}")),
        &[("ticket", kept.as_str())],
    )))
    .await;
    assert!(status == 400 || status == 401, "{status} {body}");
    // A request that is no WebSocket upgrade leaves the ticket unspent...
    let (status, body) = send(reqwest::Client::new().get(with_query(
        &server.url(&format!("/v1/sessions/{victim}/exec")),
        &[("pty", "true"), ("ticket", kept.as_str())],
    )))
    .await;
    assert_error(status, &body, 426, "upgrade_required");
    let mut socket = open(&server, &victim, &kept, None, "echo still-$((1+1))")
        .await
        .expect("...for the upgrade that follows");
    let (shown, _, _) = read_socket(&mut socket, |_| false).await;
    assert!(shown.contains("still-2"), "{shown:?}");

    // Within its lifetime: one left past it opens nothing.
    let (_, issued) = ticket(&server, "tok-acme", &victim, Some(&own)).await;
    let expires_at = issued["expires_at"].as_i64().expect("expiry");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    assert!(expires_at > now && expires_at <= now + 60_000, "{issued}");
    tokio::time::sleep(Duration::from_millis((expires_at - now + 500) as u64)).await;
    let refused = open(
        &server,
        &victim,
        issued["ticket"].as_str().expect("ticket"),
        Some(&own),
        "touch late",
    )
    .await
    .expect_err("expired");
    assert_error(refused.0, &refused.1, 401, "unauthenticated");
    assert!(!exists(&server, &victim, "late").await);
    assert!(!exists(&server, &victim, "again").await);
    server.stop().await;
}
