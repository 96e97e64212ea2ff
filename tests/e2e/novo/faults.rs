//! An idempotent Novo call is never run twice, whatever fails while it runs: a call longer
//! than its claim's lease keeps its claim (a retry waits for its answer); a gateway killed
//! mid-call leaves a claim that answers `409 idempotency_in_progress` until its lease runs
//! out, then a definite `outcome_unknown`; a node killed mid-call makes the call's answer
//! `outcome_unknown`, stored; a catalog killed mid-call (so the answer cannot be stored) does
//! not turn the answer into an error, and a retry once it is back gets that same answer. Each
//! call appends a line to a file: the file has one line every time. The faults are real:
//! `plinth gateway`, `node` and `catalog` processes killed with SIGKILL.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Novo, SECRET, request_id};
use crate::cluster::{Cluster, Part};
use crate::helpers::{Server, assert_error, send};
use crate::waiting::eventually;

#[tokio::test]
async fn a_call_longer_than_its_lease_keeps_its_claim_and_a_retry_does_not_run_it_again() {
    if !crate::helpers::can_build() {
        return;
    }
    // A one-second lease: without renewals, a retry two seconds in would find it run out.
    let server = Server::start_with_config(
        "[builder]\nnetwork = false\n[gateway]\nnovo_call_lease_seconds = 1\n",
        &[],
    )
    .await;
    let (env, _) = super::environment(&server, "Long Studio", &super::studio_files()).await;
    let adapter = super::adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_long");
    let long = json!({"command": "echo x >> long.txt; sleep 4; echo done", "timeout_ms": 30000});
    let first = plinth_kit::tasks::spawn({
        let novo = novo.clone();
        let long = long.clone();
        async move { novo.keyed("runCommand", long, "req_long").await }
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let retried = novo.keyed("runCommand", long.clone(), "req_long").await;
    let first = first.await.expect("first call");
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(first.1["stdout"], "done\n", "{}", first.1);
    assert_eq!(
        retried, first,
        "the retry waited for the first call's answer"
    );
    assert_eq!(novo.cat("long.txt").await, "x\n", "it ran once");
    server.stop().await;
}

/// Kills a process with SIGKILL and reaps it.
/// A signed keyed call that may get no answer at all (its server is killed under it).
async fn try_keyed(novo: &Novo, args: Value, key: &str) -> Option<(u16, Value)> {
    let body = serde_json::to_vec(
        &json!({"method": "runCommand", "args": args, "options": {"callId": key}}),
    )
    .expect("json");
    let signature = Novo::signature(&novo.secret, &body);
    let response = novo
        .client
        .post(&novo.url)
        .header("content-type", "application/json")
        .header("Novo-Workspace-Method", "runCommand")
        .header("Novo-Request-Id", key)
        .header("Novo-Run-Id", &novo.run)
        .header("Novo-Signature", signature)
        .body(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    let body = response.json().await.ok()?;
    Some((status, body))
}

/// A file of the run's workspace, or "" when it is not there.
async fn workspace_file(novo: &Novo, path: &str) -> String {
    novo.sh(&format!("cat {path} 2>/dev/null || true")).await
}

#[tokio::test]
async fn a_killed_gateway_node_or_catalog_never_makes_a_call_run_twice() {
    if !crate::helpers::can_build() {
        return;
    }
    // A 20 s lease: long enough that a retry's 10 s wait ends while a dead gateway's claim
    // still holds it.
    let mut cluster = Cluster::builder()
        .config("[gateway]\nnovo_call_lease_seconds = 20\n")
        .with(Part::Builder, 1)
        .with(Part::Node, 1)
        .start()
        .await
        .expect("SQLite and a blob directory need nothing");
    let base = cluster.base();
    let client = cluster.client.clone();
    let client = &client;

    // An environment, built, and a Novo adapter on it.
    let (_, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .json(&json!({"name": "Faults"})),
    )
    .await;
    let env = created["id"].as_str().expect("id").to_owned();
    let (status, _) = send(
        client
            .put(format!("{base}/v1/environments/{env}/files/run.py"))
            .body("print('hi')\n"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = send(client.post(format!("{base}/v1/environments/{env}/build"))).await;
    assert_eq!(status, 202);
    let build =
        crate::helpers::wait_for_build_at(client, &base, &env, 1, Duration::from_secs(180)).await;
    assert_eq!(build["status"], "ready", "{build}");
    let (status, adapter) = send(
        client
            .post(format!("{base}/v1/workspace-adapters"))
            .json(&json!({"protocol": "novo", "environment": env, "secret": SECRET})),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    let adapter = adapter["id"].as_str().expect("id").to_owned();
    let novo_at = |base: &str| Novo {
        client: client.clone(),
        url: format!("{base}/v1/workspace-adapters/{adapter}/novo"),
        secret: SECRET.to_owned(),
        run: "run_faults".to_owned(),
    };
    // The run's session exists before anything is killed (a node registers just after it
    // is ready: retry briefly until the session is placed).
    let novo = novo_at(&base);
    crate::waiting::eventually(Duration::from_secs(5), async || {
        let (status, body) = novo.call("readFile", json!({"path": "nothing"})).await;
        if status != 503 { Ok(()) } else { Err(body) }
    })
    .await;
    assert_eq!(novo.sh("echo ready").await, "ready\n");

    // 1. The gateway running the call is killed after the command has appended its line.
    let command = json!({"command": "echo a >> a.txt; sleep 4", "timeout_ms": 30000});
    let started = Instant::now();
    let cut = plinth_kit::tasks::spawn({
        let novo = novo_at(&base);
        let command = command.clone();
        async move { try_keyed(&novo, command, "req_gateway").await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill("gateway-1");
    assert_eq!(
        cut.await.expect("join"),
        None,
        "the killed gateway answered"
    );
    let base = cluster.add(Part::Gateway, &[]).await.url();
    let novo = novo_at(&base);
    // While the dead gateway's claim holds, a retry is told the first is in progress...
    let (status, body) = novo
        .keyed("runCommand", command.clone(), "req_gateway")
        .await;
    assert_error(status, &body, 409, "idempotency_in_progress");
    assert_eq!(workspace_file(&novo, "a.txt").await, "a\n");
    // ...and once it has run out, that the outcome is unknown: definite, stored, not run.
    let lease_end = Duration::from_secs(21);
    if let Some(left) = lease_end.checked_sub(started.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let (status, unknown) = novo
        .keyed("runCommand", command.clone(), "req_gateway")
        .await;
    assert_error(status, &unknown, 409, "outcome_unknown");
    assert_eq!(
        novo.keyed("runCommand", command.clone(), "req_gateway")
            .await,
        (409, unknown.clone())
    );
    assert_eq!(workspace_file(&novo, "a.txt").await, "a\n", "it ran once");

    // 2. The node running the call is killed after the command has appended its line.
    let command = json!({"command": "echo b >> b.txt; sleep 5", "timeout_ms": 30000});
    let cut = plinth_kit::tasks::spawn({
        let novo = novo_at(&base);
        let command = command.clone();
        async move { novo.keyed("runCommand", command, "req_node").await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill("node-1");
    let (status, unknown) = cut.await.expect("join");
    assert_error(status, &unknown, 409, "outcome_unknown");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("may or may not have taken effect")),
        "{unknown}"
    );
    // The retry gets the stored answer; nothing runs, also once the node is back.
    assert_eq!(
        novo.keyed("runCommand", command.clone(), "req_node").await,
        (409, unknown.clone())
    );
    cluster.restart("node-1").await;
    assert_eq!(
        novo.keyed("runCommand", command.clone(), "req_node").await,
        (409, unknown.clone())
    );
    assert_eq!(workspace_file(&novo, "b.txt").await, "b\n", "it ran once");

    // 3. The catalog is killed while the call runs: its answer cannot be stored then.
    let command = json!({"command": "echo c >> c.txt; sleep 3; echo ran", "timeout_ms": 30000});
    let first = plinth_kit::tasks::spawn({
        let novo = novo_at(&base);
        let command = command.clone();
        async move { novo.keyed("runCommand", command, "req_catalog").await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.kill("catalog-1");
    let first = first.await.expect("join");
    assert_eq!(
        first.0, 200,
        "the call ran: its answer is its own: {}",
        first.1
    );
    assert_eq!(first.1["stdout"], "ran\n", "{}", first.1);
    cluster.restart("catalog-1").await;
    // Stored once the catalog is back: the retry gets the same answer, and nothing runs.
    // (503 while the catalog comes back.)
    let retried = eventually(Duration::from_secs(10), async || {
        let retried = novo
            .keyed("runCommand", command.clone(), "req_catalog")
            .await;
        if retried.0 == 503 {
            Err(retried)
        } else {
            Ok(retried)
        }
    })
    .await;
    assert_eq!(retried, first);
    assert_eq!(workspace_file(&novo, "c.txt").await, "c\n", "it ran once");
    // A new request id runs.
    let (status, ran) = novo
        .keyed(
            "runCommand",
            json!({"command": "echo c >> c.txt"}),
            &request_id(),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(workspace_file(&novo, "c.txt").await, "c\nc\n");
}
