//! Idempotency by `Novo-Request-Id` (a retry gets the stored answer and nothing runs again,
//! another body is refused, a retry during the first call waits or is told to retry), the
//! same after `plinth serve` is stopped and started on its data directory, and a rotated-out
//! secret accepted only inside its grace window.

use std::time::Duration;

use serde_json::json;

use super::{Novo, adapter, environment, request_id, studio_files};
use crate::helpers::{Server, assert_error, send};

const FLAGS: [&str; 2] = ["--builder-network", "false"];

#[tokio::test]
async fn retries_get_the_stored_answer_and_nothing_runs_twice_even_across_a_restart() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&FLAGS).await;
    let (env, _) = environment(&server, "Retry Studio", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_retry");

    // runCommand: the observable effect is one appended line, however often it is retried.
    let append = json!({"command": "echo x >> count.txt; wc -l < count.txt"});
    let (status, appended) = novo.keyed("runCommand", append.clone(), "req_append").await;
    assert_eq!(
        (status, &appended["stdout"]),
        (200, &json!("1\n")),
        "{appended}"
    );
    let (status, again) = novo.keyed("runCommand", append.clone(), "req_append").await;
    assert_eq!(
        (status, &again),
        (200, &appended),
        "the stored answer, duration included"
    );
    assert_eq!(novo.cat("count.txt").await, "x\n");
    // The same key with another body is refused, and does not run either.
    let (status, body) = novo
        .keyed(
            "runCommand",
            json!({"command": "echo y >> count.txt"}),
            "req_append",
        )
        .await;
    assert_error(status, &body, 422, "idempotency_key_reused");
    let (status, body) = novo
        .keyed(
            "editFile",
            json!({"path": "count.txt", "operation": "append", "contents": "y\n"}),
            "req_append",
        )
        .await;
    assert_error(status, &body, 422, "idempotency_key_reused");
    assert_eq!(novo.cat("count.txt").await, "x\n");

    // editFile: re-applying this replace would fail (the find text is gone); the retry gets
    // the first answer, rollback token included.
    novo.ok(
        "editFile",
        json!({"path": "e.txt", "operation": "create", "contents": "old\n"}),
    )
    .await;
    let replace =
        json!({"path": "e.txt", "operation": "replace", "find": "old", "contents": "new"});
    let (status, edited) = novo.keyed("editFile", replace.clone(), "req_replace").await;
    assert_eq!(status, 200, "{edited}");
    let (status, again) = novo.keyed("editFile", replace.clone(), "req_replace").await;
    assert_eq!((status, &again), (200, &edited));
    // Errors are answers too: stored, and answered again even once the call would succeed.
    let missing =
        json!({"path": "e.txt", "operation": "replace", "find": "later", "contents": "now"});
    let (status, refused) = novo.keyed("editFile", missing.clone(), "req_later").await;
    assert_error(status, &refused, 409, "workspace_find_not_found");
    novo.ok(
        "editFile",
        json!({"path": "e.txt", "operation": "append", "contents": "later\n"}),
    )
    .await;
    let (status, again) = novo.keyed("editFile", missing.clone(), "req_later").await;
    assert_eq!((status, &again), (409, &refused));
    assert_eq!(novo.cat("e.txt").await, "new\nlater\n");

    // applyPatch (creating twice would fail), writeRuntimeArtifact, restore.
    let create = json!({"operations": [{"type": "create_file", "path": "p.txt", "diff": "@@ -0,0 +1 @@\n+p\n"}]});
    let (_, patched) = novo.keyed("applyPatch", create.clone(), "req_patch").await;
    assert_eq!(patched["applied"], true, "{patched}");
    assert_eq!(
        novo.keyed("applyPatch", create.clone(), "req_patch").await,
        (200, patched.clone())
    );
    let artifact = json!({"runId": "run_retry", "stepNumber": 1, "toolCallId": "call_1", "mediaType": "text/plain", "contents": "spilled\n"});
    let (_, written) = novo
        .keyed("writeRuntimeArtifact", artifact.clone(), "req_artifact")
        .await;
    assert_eq!(
        novo.keyed("writeRuntimeArtifact", artifact.clone(), "req_artifact")
            .await,
        (200, written.clone())
    );
    let restore = json!({"token": patched["rollback_token"]});
    assert_eq!(
        novo.keyed("restore", restore.clone(), "req_restore").await,
        (200, json!({}))
    );
    novo.ok(
        "editFile",
        json!({"path": "p.txt", "operation": "create", "contents": "made again\n"}),
    )
    .await;
    assert_eq!(
        novo.keyed("restore", restore.clone(), "req_restore").await,
        (200, json!({}))
    );
    assert_eq!(
        novo.cat("p.txt").await,
        "made again\n",
        "the restore did not run again"
    );

    // Reads are not idempotent calls: a key reused with another body is simply run.
    let (status, _) = novo
        .keyed("readFile", json!({"path": "e.txt"}), "req_read")
        .await;
    assert_eq!(status, 200);
    let (status, read) = novo
        .keyed("readFile", json!({"path": "count.txt"}), "req_read")
        .await;
    assert_eq!((status, &read["content"]), (200, &json!("x\n")));

    // A retry while the first call runs waits for its answer...
    let slow = json!({"command": "sleep 3; echo slow >> slow.txt; echo done", "timeout_ms": 30000});
    let first = plinth_kit::tasks::spawn({
        let novo = novo.clone();
        let slow = slow.clone();
        async move { novo.keyed("runCommand", slow, "req_slow").await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let retried = novo.keyed("runCommand", slow.clone(), "req_slow").await;
    let first = first.await.expect("first call");
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(retried, first);
    assert_eq!(novo.cat("slow.txt").await, "slow\n");
    // ...for a while; past that it is told the first is still in progress.
    let slower = json!({"command": "sleep 14; echo slower >> slower.txt", "timeout_ms": 30000});
    let first = plinth_kit::tasks::spawn({
        let novo = novo.clone();
        let slower = slower.clone();
        async move { novo.keyed("runCommand", slower, "req_slower").await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let started = std::time::Instant::now();
    let (status, body) = novo.keyed("runCommand", slower.clone(), "req_slower").await;
    assert_error(status, &body, 409, "idempotency_in_progress");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "it waited first"
    );
    let (status, body) = novo
        .keyed("runCommand", json!({"command": "true"}), "req_slower")
        .await;
    assert_error(status, &body, 422, "idempotency_key_reused");
    let first = first.await.expect("first call");
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(
        novo.keyed("runCommand", slower.clone(), "req_slower").await,
        first
    );
    assert_eq!(novo.cat("slower.txt").await, "slower\n");

    // Stop `plinth serve` and start it again on the same data directory.
    let server = server.restart(&FLAGS).await;
    let novo = Novo::new(&server, &adapter, "run_retry");
    assert_eq!(
        novo.keyed("runCommand", append.clone(), "req_append").await,
        (200, appended)
    );
    assert_eq!(
        novo.cat("count.txt").await,
        "x\n",
        "the same run's session, nothing run again"
    );
    let (status, body) = novo
        .keyed(
            "runCommand",
            json!({"command": "echo y >> count.txt"}),
            "req_append",
        )
        .await;
    assert_error(status, &body, 422, "idempotency_key_reused");
    assert_eq!(
        novo.keyed("editFile", replace.clone(), "req_replace").await,
        (200, edited)
    );
    assert_eq!(
        novo.keyed("editFile", missing.clone(), "req_later").await,
        (409, refused)
    );
    assert_eq!(
        novo.keyed("applyPatch", create.clone(), "req_patch").await,
        (200, patched)
    );
    assert_eq!(
        novo.keyed("writeRuntimeArtifact", artifact.clone(), "req_artifact")
            .await,
        (200, written)
    );
    assert_eq!(
        novo.keyed("runCommand", slower.clone(), "req_slower").await,
        first
    );
    assert_eq!(novo.cat("count.txt").await, "x\n");
    assert_eq!(novo.cat("slower.txt").await, "slower\n");
    assert_eq!(novo.cat("e.txt").await, "new\nlater\n");
    // New keys run.
    let (status, ran) = novo
        .keyed("runCommand", append.clone(), &request_id())
        .await;
    assert_eq!((status, &ran["stdout"]), (200, &json!("2\n")), "{ran}");
    server.stop().await;
}

#[tokio::test]
async fn a_rotated_out_secret_is_accepted_inside_its_grace_window_only() {
    if !crate::helpers::can_build() {
        return;
    }
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        "[catalog]\nadapter_credential_grace_seconds = 4\n",
    )
    .expect("write");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = Server::start_with(&["--builder-network", "false", "--config", &path]).await;
    let (env, _) = environment(&server, "Rotating Studio", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let old = Novo::new(&server, &adapter, "run_rotate");
    assert_eq!(old.sh("echo 1 >> log.txt").await, "");

    let new_secret = "env_secret_rotated_fedcba9876543210";
    let (status, rotated) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{adapter}/rotate-secret")))
            .json(&json!({"secret": new_secret})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(rotated["secret"], new_secret);
    let rotated_at = rotated["rotatedAt"].as_i64().expect("rotatedAt");
    let expires = rotated["previousCredentialExpiresAt"]
        .as_i64()
        .expect("expires");
    assert_eq!(expires - rotated_at, 4_000, "{rotated}");
    let new = Novo {
        secret: new_secret.to_owned(),
        ..Novo::new(&server, &adapter, "run_rotate")
    };

    // Inside the window both secrets are accepted, in the same run.
    assert_eq!(old.sh("echo 2 >> log.txt").await, "");
    assert_eq!(new.sh("echo 3 >> log.txt").await, "");
    // After it, only the new one; a call signed with the old one runs nothing.
    let wait = expires - super::now() * 1000 + 500;
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(wait.max(0)).unwrap_or(0) + 500,
    ))
    .await;
    let (status, body) = old
        .call("runCommand", json!({"command": "echo 4 >> log.txt"}))
        .await;
    assert_error(status, &body, 401, "unauthenticated");
    let (status, body) = old.call("readFile", json!({"path": "log.txt"})).await;
    assert_error(status, &body, 401, "unauthenticated");
    assert_eq!(new.cat("log.txt").await, "1\n2\n3\n");
    let (_, shown) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{adapter}"))),
    )
    .await;
    assert!(shown.get("secret").is_none(), "{shown}");
    server.stop().await;
}
