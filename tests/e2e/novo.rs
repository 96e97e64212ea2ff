//! The Novo workspace adapter through real HTTP, signed exactly as novo-http-workspace
//! describes: a scripted agent run in a real session (isolated, the environment read-only at
//! /env/<slug>), and the signature rules.

use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, json as read_json};

fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

struct Novo<'a> {
    server: &'a Server,
    url: String,
    secret: String,
    run: String,
}

impl Novo<'_> {
    async fn raw(
        &self,
        method: &str,
        body: Vec<u8>,
        signature: String,
        request_id: &str,
    ) -> (u16, Value) {
        let response = self
            .server
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("Novo-Environment-Id", "env_test")
            .header("Novo-Workspace-Method", method)
            .header("Novo-Signature", signature)
            .header("Novo-Timestamp", now().to_string())
            .header("Novo-Request-Id", request_id)
            .header("Novo-Org-Id", "org_test")
            .header("Novo-Agent-Id", "agent_test")
            .header("Novo-Run-Id", &self.run)
            .body(body)
            .send()
            .await
            .expect("send");
        read_json(response).await
    }

    async fn call(&self, method: &str, args: Value) -> (u16, Value) {
        let body = serde_json::to_vec(&json!({"method": method, "args": args})).expect("json");
        let t = now();
        let signature = format!("t={t},v1={}", sign(&self.secret, t, &body));
        let id = format!("req_{}", uuid::Uuid::new_v4().simple());
        self.raw(method, body, signature, &id).await
    }

    async fn ok(&self, method: &str, args: Value) -> Value {
        let (status, body) = self.call(method, args).await;
        assert_eq!(status, 200, "{method}: {body}");
        body
    }
}

async fn environment(server: &Server) -> String {
    let (status, created) = crate::helpers::send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Novo Studio"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let (status, _) = crate::helpers::send(
        server
            .client
            .put(server.url(&format!("/v1/environments/{id}/files/studio/scale.py")))
            .body("def scale(x):\n    return x * 2\n"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = crate::helpers::send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202);
    for _ in 0..600 {
        let (_, build) = crate::helpers::send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{id}/builds/1"))),
        )
        .await;
        if build["status"] == "ready" {
            return id;
        }
        assert_ne!(build["status"], "failed", "{build}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("build did not end");
}

#[tokio::test]
async fn a_scripted_agent_run_through_the_adapter() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let env = environment(&server).await;
    let (status, adapter) = crate::helpers::send(
        server
            .client
            .post(server.url("/v1/workspace-adapters"))
            .json(&json!({"protocol": "novo", "environment": env, "secret": "env_secret_0123456789abcdef"})),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    let novo = Novo {
        server: &server,
        url: adapter["url"].as_str().expect("url").to_owned(),
        secret: "env_secret_0123456789abcdef".to_owned(),
        run: "run_scripted".to_owned(),
    };

    // Write a file, patch it, run its test with the environment's Python.
    let created = novo
        .ok(
            "editFile",
            json!({"path": "calc.py", "operation": "create", "contents": "from studio.scale import scale\n\ndef double(x):\n    return scale(x)\n"}),
        )
        .await;
    assert_eq!(created["created"], true, "{created}");
    assert_eq!(created["dry_run"], false);
    assert!(created["rollback_token"].is_string());
    let patched = novo
        .ok(
            "applyPatch",
            json!({"operations": [
                {"type": "update_file", "path": "calc.py", "diff": "@@ -3,2 +3,5 @@\n def double(x):\n     return scale(x)\n+\n+def triple(x):\n+    return x * 3\n"},
                {"type": "create_file", "path": "test_calc.py", "diff": "@@ -0,0 +1,3 @@\n+from calc import double, triple\n+assert double(4) == 8 and triple(2) == 6\n+print('tests pass')\n"}
            ]}),
        )
        .await;
    assert_eq!(patched["applied"], true, "{patched}");
    assert_eq!(patched["operations"][0]["status"], "ok");
    let token = patched["rollback_token"]
        .as_str()
        .expect("token")
        .to_owned();
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "python3 test_calc.py", "env": {"PYTHONDONTWRITEBYTECODE": "1"}}),
        )
        .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"], "tests pass\n");
    assert_eq!(ran["timed_out"], false);
    assert_eq!(ran["stdout_truncated"], false);

    // The environment is read-only; outside the root is invalid.
    let (status, body) = novo
        .call(
            "editFile",
            json!({"path": "/env/novo-studio/studio/scale.py", "operation": "append", "contents": "#"}),
        )
        .await;
    assert_error(status, &body, 403, "workspace_read_only");
    let (status, body) = novo
        .call("readFile", json!({"path": "../etc/passwd"}))
        .await;
    assert_error(status, &body, 400, "workspace_path_invalid");
    let read = novo
        .ok(
            "readFile",
            json!({"path": "/env/novo-studio/studio/scale.py"}),
        )
        .await;
    assert_eq!(read["encoding"], "utf8");
    assert_eq!(read["total_lines"], 2);

    // Restore: the patch's files go back (the created test file is removed).
    assert_eq!(novo.ok("restore", json!({"token": token})).await, json!({}));
    let artifacts = novo.ok("getRunArtifacts", json!({})).await;
    assert_eq!(
        artifacts,
        json!([{"path": "calc.py", "change": "created", "bytes": 67}]),
        "{artifacts}"
    );
    let read = novo.ok("readFile", json!({"path": "calc.py"})).await;
    assert!(!read["content"].as_str().expect("text").contains("triple"));

    // Signatures.
    let body = serde_json::to_vec(&json!({"method": "listFiles", "args": {}})).expect("json");
    let t = now();
    let good = sign(&novo.secret, t, &body);
    let cases = [
        (
            body.clone(),
            format!("t={t},v1={}", sign("wrong-secret-0123456789", t, &body)),
        ),
        (
            br#"{"method": "listFiles", "args": {}}"#.to_vec(),
            format!("t={t},v1={good}"),
        ),
        (
            [body.clone(), b"\n".to_vec()].concat(),
            format!("t={t},v1={good}"),
        ),
        (
            body.clone(),
            format!("t={},v1={}", t - 301, sign(&novo.secret, t - 301, &body)),
        ),
        (
            body.clone(),
            format!("t={},v1={}", t + 301, sign(&novo.secret, t + 301, &body)),
        ),
        (body.clone(), format!("t={t},v0={good}")),
    ];
    for (sent, signature) in cases {
        let (status, answer) = novo.raw("listFiles", sent, signature, "req_x").await;
        assert_error(status, &answer, 401, "unauthenticated");
    }
    let (status, listed) = novo
        .raw(
            "listFiles",
            body.clone(),
            format!("t={t},v1=deadbeef,v1={good}"),
            "req_y",
        )
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["root"], ".");
    server.stop().await;
}
