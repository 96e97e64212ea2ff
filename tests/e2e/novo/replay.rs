//! Replay protection as an attacker who captured signed calls tries it: a read sent twice in
//! the same second (Novo signs with a one-second `t`) is answered both times, a captured
//! mutating call sent again with a new `Novo-Request-Id` is refused and does not run, through
//! a second gateway on the same catalog and after `plinth serve` restarts on its data
//! directory; and one adapter's flood of signed calls fills only its own replay memory.

use serde_json::{Value, json};

use super::{Novo, SECRET, adapter, environment, now, request_id, sign, studio_files};
use crate::helpers::{Server, assert_error, json as read_json};

const FLAGS: [&str; 2] = ["--builder-network", "false"];

/// A call body and its signature at `t`.
fn signed(method: &str, args: Value, call_id: &str, t: i64) -> (Vec<u8>, String) {
    let body = serde_json::to_vec(
        &json!({"method": method, "args": args, "options": {"callId": call_id}}),
    )
    .expect("json");
    let signature = format!("t={t},v1={}", sign(SECRET, t, &body));
    (body, signature)
}

fn says_replay(status: u16, answer: &Value) {
    assert_error(status, answer, 401, "unauthenticated");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("replay")),
        "{answer}"
    );
}

#[tokio::test]
async fn reads_may_repeat_and_a_replayed_write_is_refused_on_every_replica_and_after_a_restart() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&FLAGS).await;
    let (env, _) = environment(&server, "Replay Studio", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_victim");

    // An agent reads the same file twice within one second: the same t, the same bytes, the
    // same signature. Both are answered.
    let t = now();
    let (read, read_signature) = signed("readFile", json!({"path": "notes.txt"}), "call_read", t);
    assert_eq!(novo.sh("echo first > notes.txt").await, "");
    for attempt in 0..2 {
        let (status, shown) = novo
            .raw(
                "readFile",
                read.clone(),
                Some(read_signature.clone()),
                "req_read",
            )
            .await;
        assert_eq!(
            (status, &shown["content"]),
            (200, &json!("first\n")),
            "read {attempt}: {shown}"
        );
    }

    // The victim's write, as an attacker on the path captured it.
    let (write, captured) = signed(
        "editFile",
        json!({"path": "notes.txt", "operation": "create", "contents": "written\n"}),
        "call_write",
        t,
    );
    let (status, first) = novo
        .raw(
            "editFile",
            write.clone(),
            Some(captured.clone()),
            "req_victim",
        )
        .await;
    assert_eq!(status, 200, "{first}");
    // The victim goes on: the file changes again.
    assert_eq!(novo.sh("echo second > notes.txt").await, "");

    // Sent again with a new request id (it is not signed), or with none: refused, nothing ran.
    for key in [request_id(), String::new()] {
        let (status, answer) = novo
            .raw("editFile", write.clone(), Some(captured.clone()), &key)
            .await;
        says_replay(status, &answer);
    }
    assert_eq!(novo.cat("notes.txt").await, "second\n");
    // The very call retried (same request id, same run) is answered from its first answer.
    let (status, again) = novo
        .raw(
            "editFile",
            write.clone(),
            Some(captured.clone()),
            "req_victim",
        )
        .await;
    assert_eq!((status, &again), (200, &first));
    assert_eq!(novo.cat("notes.txt").await, "second\n");

    // Through a second gateway on the same catalog: it never saw the call, and refuses it.
    let replica = server.another_gateway(&[]).await;
    let through_replica = Novo {
        url: format!(
            "http://{}/v1/workspace-adapters/{adapter}/novo",
            replica.http_addr
        ),
        ..Novo::new(&server, &adapter, "run_victim")
    };
    let (status, answer) = through_replica
        .raw(
            "editFile",
            write.clone(),
            Some(captured.clone()),
            &request_id(),
        )
        .await;
    says_replay(status, &answer);
    // The replica serves the run otherwise: a new call works there.
    assert_eq!(through_replica.cat("notes.txt").await, "second\n");
    replica.shutdown.cancel();

    // `plinth serve` stopped and started on the same data directory remembers it too.
    let server = server.restart(&FLAGS).await;
    let novo = Novo::new(&server, &adapter, "run_victim");
    let (status, answer) = novo
        .raw(
            "editFile",
            write.clone(),
            Some(captured.clone()),
            &request_id(),
        )
        .await;
    says_replay(status, &answer);
    assert_eq!(novo.cat("notes.txt").await, "second\n");
    // The read is still answered, as often as it is sent.
    let (status, shown) = novo
        .raw("readFile", read, Some(read_signature), "req_read")
        .await;
    assert_eq!(
        (status, &shown["content"]),
        (200, &json!("second\n")),
        "{shown}"
    );
    server.stop().await;
}

#[tokio::test]
async fn one_adapters_flood_fills_only_its_own_replay_memory() {
    if !crate::helpers::can_build() {
        return;
    }
    // A small bound keeps the flood short; the rule is the same at the default.
    const BOUND: usize = 1000;
    let config = format!(
        "[gateway]\nnovo_replay_memory_per_adapter = {BOUND}\nadapter_rate_limit_per_second = 0\n\
         adapter_max_unverified_bodies = 64\n"
    );
    let server = Server::start_with_config(&config, &FLAGS).await;
    let (env, _) = environment(&server, "Flood Studio", &studio_files()).await;
    let attacker = adapter(&server, &env).await;
    let victim = adapter(&server, &env).await;

    // Signed junk from the attacker's adapter: each a distinct, well-formed mutating call (so
    // it is remembered) that changes nothing (a dry run).
    let flooder = Novo::new(&server, &attacker, "run_flood");
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut sent = 0usize;
    while sent < BOUND + BOUND / 2 {
        let batch: Vec<_> = (sent..(sent + 16).min(BOUND + BOUND / 2))
            .map(|n| {
                let (body, signature) = signed(
                    "editFile",
                    json!({"path": format!("junk_{n}.txt"), "operation": "create", "contents": "x", "dry_run": true}),
                    &format!("junk_{n}"),
                    now(),
                );
                flooder.raw("editFile", body, Some(signature), "")
            })
            .collect();
        sent += batch.len();
        for (status, _) in futures::future::join_all(batch).await {
            *statuses.entry(status).or_default() += 1;
        }
    }
    assert_eq!(
        statuses,
        [(200, BOUND), (503, BOUND / 2)].into_iter().collect(),
        "every junk call up to the bound was remembered (and ran, changing nothing); the rest \
         found the attacker's memory full"
    );
    // The attacker's own next write waits, told when to retry.
    let (body, signature) = signed(
        "editFile",
        json!({"path": "a.txt", "operation": "create", "contents": "a\n"}),
        "attacker_write",
        now(),
    );
    let response = server
        .client
        .post(server.url(&format!("/v1/workspace-adapters/{attacker}/novo")))
        .header("content-type", "application/json")
        .header("Novo-Workspace-Method", "editFile")
        .header("Novo-Request-Id", request_id())
        .header("Novo-Run-Id", "run_flood")
        .header("Novo-Signature", signature)
        .body(body)
        .send()
        .await
        .expect("send");
    assert!(response.headers().contains_key("retry-after"));
    let (status, answer) = read_json(response).await;
    assert_error(status, &answer, 503, "unavailable");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("gateway.novo_replay_memory_per_adapter")),
        "{answer}"
    );
    // Reads need no memory: the attacker's reads still work; the dry runs wrote nothing.
    let listed = flooder.ok("listFiles", json!({})).await;
    assert_eq!(listed["entries"], json!([]), "{listed}");
    // A malformed call is refused before it is remembered (it would take no room either way).
    let (body, signature) = signed("editFile", json!({"path": 7}), "malformed", now());
    let (status, answer) = flooder.raw("editFile", body, Some(signature), "").await;
    assert_error(status, &answer, 400, "workspace_invalid_request");

    // The other tenant's adapter is untouched: its writes run.
    let novo = Novo::new(&server, &victim, "run_victim");
    let written = novo
        .ok(
            "editFile",
            json!({"path": "b.txt", "operation": "create", "contents": "b\n"}),
        )
        .await;
    assert_eq!(written["created"], true, "{written}");
    assert_eq!(novo.cat("b.txt").await, "b\n");
    server.stop().await;
}
