//! Builds are shared fairly between scopes, through a real `plinth serve` with one builder:
//! while one tenant has a backlog of slow builds queued, another tenant's build starts as soon
//! as the build running now ends, not after the whole backlog.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Server, can_build, queue_first_build, send};

const ACME: &str = "tok-acme";
const GLOBEX: &str = "tok-globex";

/// Longer than any build here takes, however slow the machine.
const BUILD_LIMIT: Duration = Duration::from_secs(300);

/// An environment whose `setup.sh` is `script`, as the tenant of `token`, its first build
/// queued; answers its id.
async fn queue_build(server: &Server, token: &str, name: &str, script: &str) -> String {
    queue_first_build(server, token, name, "setup.sh", script).await
}

/// The first build of `id`, as its tenant reads it; a failed build fails the test.
async fn build_of(server: &Server, token: &str, id: &str) -> Value {
    let (status, build) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/builds/1")))
            .bearer_auth(token),
    )
    .await;
    assert_eq!(status, 200, "{build}");
    assert_ne!(build["status"], "failed", "{build}");
    build
}

/// How many of these builds are ready now.
async fn ready(server: &Server, token: &str, ids: &[String]) -> usize {
    let mut count = 0;
    for id in ids {
        if build_of(server, token, id).await["status"] == "ready" {
            count += 1;
        }
    }
    count
}

/// Polls `id`'s first build until it is ready.
async fn wait_ready(server: &Server, token: &str, id: &str) {
    crate::waiting::eventually(BUILD_LIMIT, async || {
        let build = build_of(server, token, id).await;
        if build["status"] == "ready" {
            Ok(())
        } else {
            Err(format!("{id}'s build: {build}"))
        }
    })
    .await;
}

#[tokio::test]
async fn one_scopes_backlog_delays_another_scopes_build_by_at_most_one_build() {
    if !can_build() {
        return;
    }
    let server = Server::start_with_tokens(
        &[(ACME, "acme"), (GLOBEX, "globex")],
        &["--builders", "1", "--builder-network", "false"],
    )
    .await;
    // acme queues eight builds of two seconds each; the one builder takes the first at once.
    let mut backlog = Vec::new();
    for index in 0..8 {
        backlog.push(queue_build(&server, ACME, &format!("slow {index}"), "sleep 2\n").await);
    }
    // Then globex queues one quick build; acme's builds that end from then on are counted.
    let queued = Instant::now();
    let quick = queue_build(&server, GLOBEX, "quick", "echo quick\n").await;
    let before = ready(&server, ACME, &backlog).await;
    wait_ready(&server, GLOBEX, &quick).await;
    let after = ready(&server, ACME, &backlog).await;
    // For the record only (the assertion is about order, not time).
    eprintln!(
        "globex's build was ready {:?} after it was queued; acme's builds ready meanwhile: {}",
        queued.elapsed(),
        after - before
    );
    assert!(
        after - before <= 1,
        "globex's build waited for {} of acme's builds, not just the one running when it was queued",
        after - before
    );
    assert!(
        after < backlog.len(),
        "acme still had builds waiting when globex's was ready (else this proves nothing)"
    );
    // acme's backlog is not starved either: every build of it ends ready.
    for id in &backlog {
        wait_ready(&server, ACME, id).await;
    }
    server.stop().await;
}
