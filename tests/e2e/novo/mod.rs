//! The Novo workspace adapter through real HTTP, signed exactly as novo-http-workspace
//! describes, against real sessions (isolated, the environment read-only at /env/<slug>): a
//! scripted agent run, the signature rules, every method's shape, defaults and errors
//! (`methods`), and idempotency and secret rotation, across a restart (`idempotency`).

mod faults;
mod idempotency;
mod methods;
mod replay;
mod verification;

use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use crate::builds::tiny_wheel;
use crate::helpers::{Server, assert_error, build_ready, json as read_json, put_file, send};

pub const SECRET: &str = "env_secret_0123456789abcdef";

pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

pub fn request_id() -> String {
    format!("req_{}", uuid::Uuid::new_v4().simple())
}

/// Novo, as far as one run of one adapter goes.
#[derive(Clone)]
pub struct Novo {
    pub client: reqwest::Client,
    pub url: String,
    pub secret: String,
    pub run: String,
}

impl Novo {
    /// A run of this adapter on this server, signing with `SECRET`.
    pub fn new(server: &Server, adapter: &str, run: &str) -> Self {
        Novo {
            client: server.client.clone(),
            url: server.url(&format!("/v1/workspace-adapters/{adapter}/novo")),
            secret: SECRET.to_owned(),
            run: run.to_owned(),
        }
    }

    /// Sends exactly these bytes with these headers.
    pub async fn raw(
        &self,
        method: &str,
        body: Vec<u8>,
        signature: Option<String>,
        request_id: &str,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("Novo-Environment-Id", "env_test")
            .header("Novo-Workspace-Method", method)
            .header("Novo-Timestamp", now().to_string())
            .header("Novo-Request-Id", request_id)
            .header("Novo-Org-Id", "org_test")
            .header("Novo-Agent-Id", "agent_test")
            .header("Novo-Run-Id", &self.run);
        if let Some(signature) = signature {
            request = request.header("Novo-Signature", signature);
        }
        read_json(request.body(body).send().await.expect("send")).await
    }

    /// `Novo-Signature` for `body`, now, with `secret`.
    pub fn signature(secret: &str, body: &[u8]) -> String {
        let t = now();
        format!("t={t},v1={}", sign(secret, t, body))
    }

    /// A signed call with this request id. Each tool call is its own signed request (the
    /// gateway refuses the same one twice), so the body names the call; a retry with the same
    /// id is the same request again.
    pub async fn keyed(&self, method: &str, args: Value, key: &str) -> (u16, Value) {
        let body = serde_json::to_vec(
            &json!({"method": method, "args": args, "options": {"callId": key}}),
        )
        .expect("json");
        let signature = Self::signature(&self.secret, &body);
        self.raw(method, body, Some(signature), key).await
    }

    /// A signed call with a fresh request id.
    pub async fn call(&self, method: &str, args: Value) -> (u16, Value) {
        self.keyed(method, args, &request_id()).await
    }

    /// A signed call that must succeed.
    pub async fn ok(&self, method: &str, args: Value) -> Value {
        let (status, body) = self.call(method, args).await;
        assert_eq!(status, 200, "{method}: {body}");
        body
    }

    /// A command that must exit 0; its stdout.
    pub async fn sh(&self, command: &str) -> String {
        let ran = self.ok("runCommand", json!({"command": command})).await;
        assert_eq!(ran["exit_code"], 0, "{command}: {ran}");
        ran["stdout"].as_str().expect("stdout").to_owned()
    }

    /// A workspace file's text (through `cat` in the session, not the adapter's own reads).
    pub async fn cat(&self, path: &str) -> String {
        self.sh(&format!("cat {path}")).await
    }
}

/// An environment with these files, built (no network) and ready; its id and slug.
pub async fn environment(
    server: &Server,
    name: &str,
    files: &[(&str, Vec<u8>)],
) -> (String, String) {
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let slug = created["slug"].as_str().expect("slug").to_owned();
    for (path, content) in files {
        put_file(server, &id, path, content.clone()).await;
    }
    build_ready(server, &id, 1, Duration::from_secs(180)).await;
    (id, slug)
}

/// A Novo adapter for `environment` with `SECRET`; its id.
pub async fn adapter(server: &Server, environment: &str) -> String {
    let (status, adapter) = send(
        server
            .client
            .post(server.url("/v1/workspace-adapters"))
            .json(&json!({"protocol": "novo", "environment": environment, "secret": SECRET})),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    adapter["id"].as_str().expect("id").to_owned()
}

/// The small project most tests read through the mount.
pub fn studio_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "studio/scale.py",
            b"def scale(x):\n    return x * 2\n".to_vec(),
        ),
        (
            "studio/notes.txt",
            b"Scale by two.\nNot by three.\n".to_vec(),
        ),
        (
            "assets/logo.bin",
            vec![0x89, b'P', b'N', b'G', 0, 1, 2, 0xff],
        ),
    ]
}

#[tokio::test]
async fn a_scripted_agent_run_through_the_adapter() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let mut files = studio_files();
    files.push(("wheels/tinypkg-1.0-py3-none-any.whl", tiny_wheel()));
    files.push((
        "requirements.txt",
        b"--no-index\n--find-links wheels\ntinypkg==1.0\n".to_vec(),
    ));
    let (env, slug) = environment(&server, "Novo Studio", &files).await;
    assert_eq!(slug, "novo-studio");
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_scripted");

    // The environment's own Python, with what its requirements installed.
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "command -v python && python -c 'import sys, tinypkg; print(sys.prefix); print(tinypkg.__file__)'"}),
        )
        .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let lines: Vec<&str> = ran["stdout"].as_str().expect("stdout").lines().collect();
    assert_eq!(lines[0], "/env/novo-studio/.venv/bin/python", "{ran}");
    assert_eq!(lines[1], "/env/novo-studio/.venv", "{ran}");
    assert!(
        lines[2].starts_with("/env/novo-studio/.venv/lib/")
            && lines[2].ends_with("/site-packages/tinypkg/__init__.py"),
        "{ran}"
    );

    // Write a file, patch it, run its tests with the environment's Python.
    let created = novo
        .ok(
            "editFile",
            json!({"path": "calc.py", "operation": "create", "contents": "from studio.scale import scale\n\ndef double(x):\n    return scale(x)\n"}),
        )
        .await;
    assert_eq!(created["created"], true, "{created}");
    assert_eq!(created["dry_run"], false);
    assert_eq!(created["bytes_written"], 67);
    assert!(created["rollback_token"].is_string());
    let patched = novo
        .ok(
            "applyPatch",
            json!({"operations": [
                {"type": "update_file", "path": "calc.py", "diff": "@@ -3,2 +3,5 @@\n def double(x):\n     return scale(x)\n+\n+def triple(x):\n+    return x * 3\n"},
                {"type": "create_file", "path": "test_calc.py", "diff": "@@ -0,0 +1,6 @@\n+import sys, tinypkg\n+from calc import double, triple\n+assert double(4) == 8 and triple(2) == 6\n+assert sys.executable == '/env/novo-studio/.venv/bin/python', sys.executable\n+tinypkg.main()\n+print('tests pass')\n"}
            ]}),
        )
        .await;
    assert_eq!(patched["applied"], true, "{patched}");
    assert_eq!(patched["dry_run"], false, "{patched}");
    assert_eq!(
        patched["operations"],
        json!([
            {"type": "update_file", "path": "calc.py", "status": "ok"},
            {"type": "create_file", "path": "test_calc.py", "status": "ok"}
        ])
    );
    let token = patched["rollback_token"]
        .as_str()
        .expect("token")
        .to_owned();
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "python test_calc.py", "env": {"PYTHONDONTWRITEBYTECODE": "1"}}),
        )
        .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"], "tinytool ran\ntests pass\n", "{ran}");
    assert_eq!(ran["stderr"], "");
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
    // The final workspace, as the session's own shell sees it.
    assert_eq!(
        novo.cat("calc.py").await,
        "from studio.scale import scale\n\ndef double(x):\n    return scale(x)\n"
    );
    assert_eq!(novo.sh("ls -A").await, "calc.py\n");
    let ran = novo
        .ok("runCommand", json!({"command": "python test_calc.py"}))
        .await;
    assert_eq!(ran["exit_code"], 2, "the test file is gone: {ran}");
    server.stop().await;
}

#[tokio::test]
async fn signatures_are_checked_before_anything_runs() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (env, _) = environment(&server, "Signed Studio", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_signed");

    let body = serde_json::to_vec(
        &json!({"method": "runCommand", "args": {"command": "echo ran >> proof.txt"}}),
    )
    .expect("json");
    let t = now();
    let good = sign(&novo.secret, t, &body);
    let cases = [
        None,
        Some(format!(
            "t={t},v1={}",
            sign("wrong-secret-0123456789", t, &body)
        )),
        Some(format!("v1={good}")),
        Some(format!("t=soon,v1={good}")),
        Some(format!(
            "t={},v1={}",
            t - 301,
            sign(&novo.secret, t - 301, &body)
        )),
        // Ahead by more than the tolerance with room to spare: the server reads its clock
        // after this test did, so a second ticking over in between must not bring a `t + 301`
        // back within the ±300 s (the exact bounds are unit-tested in the signature module).
        Some(format!(
            "t={},v1={}",
            t + 310,
            sign(&novo.secret, t + 310, &body)
        )),
        Some(format!("t={t},v0={good}")),
        Some(String::new()),
    ];
    for signature in cases {
        let (status, answer) = novo
            .raw("runCommand", body.clone(), signature.clone(), &request_id())
            .await;
        assert_error(status, &answer, 401, "unauthenticated");
        assert!(answer.get("exit_code").is_none(), "{signature:?}: {answer}");
    }
    // The body is signed as sent: the same JSON respaced, or with a byte added, is refused.
    for sent in [
        br#"{"method": "runCommand", "args": {"command": "echo ran >> proof.txt"}}"#.to_vec(),
        [body.clone(), b"\n".to_vec()].concat(),
    ] {
        let (status, answer) = novo
            .raw(
                "runCommand",
                sent,
                Some(format!("t={t},v1={good}")),
                &request_id(),
            )
            .await;
        assert_error(status, &answer, 401, "unauthenticated");
    }
    // Nothing ran: the first call that does run is the run's first turn, and finds no proof.
    let listed = novo.ok("listFiles", json!({})).await;
    assert_eq!(
        listed,
        json!({"root": ".", "entries": [], "truncated": false})
    );

    // Any v1 may match; other schemes are ignored.
    let (status, ran) = novo
        .raw(
            "runCommand",
            body.clone(),
            Some(format!("t={t},v0=zz,v1=deadbeef,v1={good}")),
            &request_id(),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(novo.cat("proof.txt").await, "ran\n");

    // The method header must agree with the body.
    let body = serde_json::to_vec(&json!({"method": "listFiles", "args": {}})).expect("json");
    let (status, answer) = novo
        .raw(
            "readFile",
            body.clone(),
            Some(Novo::signature(SECRET, &body)),
            &request_id(),
        )
        .await;
    assert_error(status, &answer, 400, "workspace_invalid_request");
    let body = serde_json::to_vec(
        &json!({"method": "runCommand", "args": {"command": "echo again >> proof.txt"}}),
    )
    .expect("json");
    let (status, answer) = novo
        .raw(
            "readFile",
            body.clone(),
            Some(Novo::signature(SECRET, &body)),
            &request_id(),
        )
        .await;
    assert_error(status, &answer, 400, "workspace_invalid_request");
    assert_eq!(
        novo.cat("proof.txt").await,
        "ran\n",
        "a disagreeing call ran nothing"
    );
    // A method Novo does not dispatch, and a call with no run.
    let (status, answer) = novo.call("deleteEverything", json!({})).await;
    assert_error(status, &answer, 400, "workspace_invalid_request");
    let no_run = Novo {
        run: String::new(),
        ..Novo::new(&server, &adapter, "")
    };
    let (status, answer) = no_run.call("listFiles", json!({})).await;
    assert_error(status, &answer, 400, "workspace_invalid_request");
    // An unknown adapter.
    let unknown = Novo::new(&server, "wadp_00000000000000000000000000000000", "run_x");
    let (status, answer) = unknown.call("listFiles", json!({})).await;
    assert_error(status, &answer, 404, "not_found");
    server.stop().await;
}

#[tokio::test]
async fn reads_under_the_mount_see_a_layered_version_as_its_commands_do() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let (env, slug) = environment(&server, "Layered", &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    // A run on version 1 puts it in the node's cache, so version 2, which changes one file,
    // is cached as a layer over it.
    let first = Novo::new(&server, &adapter, "run_layered_1");
    let scale = format!("/env/{slug}/studio/scale.py");
    assert_eq!(first.cat(&scale).await, "def scale(x):\n    return x * 2\n");
    put_file(&server, &env, "studio/notes.txt", "Scale by three.\n").await;
    build_ready(&server, &env, 2, Duration::from_secs(180)).await;

    let second = Novo::new(&server, &adapter, "run_layered_2");
    assert_eq!(
        second.cat(&format!("/env/{slug}/studio/notes.txt")).await,
        "Scale by three.\n",
        "the run is on version 2"
    );
    // A file version 2 did not change lives only in the layer below: it reads as the
    // session's commands see it.
    let read = second.ok("readFile", json!({ "path": scale })).await;
    let listed = second
        .ok(
            "listFiles",
            json!({ "path": format!("/env/{slug}/studio") }),
        )
        .await;
    let found = second
        .ok(
            "searchFiles",
            json!({ "pattern": "return x", "path": format!("/env/{slug}") }),
        )
        .await;
    assert_reads_see_the_layer_below(&slug, &read, &listed, &found);
}

/// What a read, a listing of `studio/` and a search for `return x` under the mount of a
/// version 2 (notes changed, `scale.py` only in version 1's layer) answer through either
/// adapter: the file from the layer below, both files, and the match in it.
pub fn assert_reads_see_the_layer_below(slug: &str, read: &Value, listed: &Value, found: &Value) {
    assert_eq!(
        read["content"], "def scale(x):\n    return x * 2\n",
        "{read}"
    );
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|entry| entry["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            format!("/env/{slug}/studio/notes.txt"),
            format!("/env/{slug}/studio/scale.py")
        ],
        "{listed}"
    );
    assert!(found.to_string().contains("scale.py"), "{found}");
}
