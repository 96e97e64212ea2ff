//! Workspace adapters through real HTTP: registered on an environment of the caller's scope,
//! their secret (Novo) or token (Brain) shown once, rotated, deleted, and invisible to other
//! scopes.

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, assert_error_in, send, tokens_toml};

const ACME: &str = "tok-acme";
const GLOBEX: &str = "tok-globex";

async fn environment(server: &Server, token: &str, name: &str) -> String {
    let (status, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .bearer_auth(token)
            .json(&json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().expect("id").to_owned()
}

async fn create(server: &Server, token: &str, body: Value) -> (u16, Value) {
    send(creating(server, token, &body)).await
}

/// The request [`create`] sends, for tables of refusals.
fn creating(server: &Server, token: &str, body: &Value) -> reqwest::RequestBuilder {
    server
        .client
        .post(server.url("/v1/workspace-adapters"))
        .bearer_auth(token)
        .json(body)
}

#[tokio::test]
async fn adapters_show_their_credential_once_and_stay_in_their_scope() {
    let server =
        Server::start_with_tokens(&[("tok-acme", "acme"), ("tok-globex", "globex")], &[]).await;
    let env = environment(&server, ACME, "Adapter Studio").await;
    let other = environment(&server, GLOBEX, "Other Studio").await;

    // Novo, secret generated.
    let (status, novo) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env}),
    )
    .await;
    assert_eq!(status, 201, "{novo}");
    let id = novo["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("wadp_") && id.len() == 37, "{novo}");
    assert_eq!(novo["object"], "workspace_adapter");
    assert_eq!(novo["protocol"], "novo");
    assert_eq!(novo["environment"], env.as_str());
    assert_eq!(
        novo["url"],
        server
            .url(&format!("/v1/workspace-adapters/{id}/novo"))
            .as_str()
    );
    let secret = novo["secret"].as_str().expect("secret shown once");
    assert!(
        secret.starts_with("plinth_novo_") && secret.len() >= 64,
        "{novo}"
    );
    assert!(novo.get("token").is_none(), "{novo}");
    assert!(novo["createdAt"].as_i64().expect("createdAt") > 1_600_000_000_000);
    assert_eq!(novo["rotatedAt"], Value::Null);
    assert_eq!(novo["previousCredentialExpiresAt"], Value::Null);

    let (status, got) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert!(got.get("secret").is_none(), "never shown again: {got}");
    assert_eq!(got["url"], novo["url"]);
    assert_eq!(got["createdAt"], novo["createdAt"]);

    // Another scope sees nothing, and cannot name this scope's environment.
    let adapter_url = server.url(&format!("/v1/workspace-adapters/{id}"));
    for (case, request, status, code) in [
        (
            "another scope reads the adapter",
            server.client.get(&adapter_url).bearer_auth(GLOBEX),
            404,
            "not_found",
        ),
        (
            "another scope registers on this scope's environment",
            creating(
                &server,
                GLOBEX,
                &json!({"protocol": "novo", "environment": env}),
            ),
            404,
            "environment_not_found",
        ),
        (
            "an environment of another scope",
            creating(
                &server,
                ACME,
                &json!({"protocol": "novo", "environment": other}),
            ),
            404,
            "environment_not_found",
        ),
        (
            "an environment that does not exist",
            creating(
                &server,
                ACME,
                &json!({"protocol": "novo", "environment": "henv_nope"}),
            ),
            404,
            "environment_not_found",
        ),
    ] {
        let (got, body) = send(request).await;
        assert_error_in(case, got, &body, status, code);
    }

    // Chosen secrets follow the rules; unknown protocols and fields are refused.
    let (status, chosen) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env, "secret": "env_secret_0123456789abcdef"}),
    )
    .await;
    assert_eq!(status, 201, "{chosen}");
    assert_eq!(chosen["secret"], "env_secret_0123456789abcdef");
    for bad in [
        json!({"protocol": "novo", "environment": env, "secret": "short"}),
        json!({"protocol": "novo", "environment": env, "secret": "has spaces in the secret"}),
        json!({"protocol": "ftp", "environment": env}),
        json!({"protocol": "novo", "environment": env, "colour": "red"}),
        json!({"protocol": "brain", "environment": env, "secret": "chosen-brain-token-value"}),
    ] {
        let (status, body) = create(&server, ACME, bad.clone()).await;
        assert_error(status, &body, 400, "environment_invalid");
    }

    // Rotation: the new secret is shown once, the previous one has a grace window.
    let (status, rotated) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/rotate-secret")))
            .bearer_auth(ACME)
            .json(&json!({"secret": "the-next-secret-0123456789"})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(rotated["secret"], "the-next-secret-0123456789");
    let rotated_at = rotated["rotatedAt"].as_i64().expect("rotatedAt");
    let expires = rotated["previousCredentialExpiresAt"]
        .as_i64()
        .expect("grace window");
    assert_eq!(
        expires - rotated_at,
        3_600_000,
        "the default grace window is an hour"
    );
    let (status, generated) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/rotate-secret")))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(status, 200, "{generated}");
    assert!(
        generated["secret"]
            .as_str()
            .expect("generated")
            .starts_with("plinth_novo_")
    );
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/rotate-secret")))
            .bearer_auth(GLOBEX)
            .json(&json!({})),
    )
    .await;
    assert_error(status, &body, 404, "not_found");

    // Brain: a generated bearer token and a base URL.
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    let brain_id = brain["id"].as_str().expect("id");
    assert_eq!(
        brain["url"],
        server
            .url(&format!("/v1/workspace-adapters/{brain_id}/brain"))
            .as_str()
    );
    let token = brain["token"].as_str().expect("token shown once");
    assert!(token.starts_with("plinth_brain_"), "{brain}");
    assert!(brain.get("secret").is_none(), "{brain}");
    let (status, rotated) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{brain_id}/rotate-secret")))
            .bearer_auth(ACME)
            .json(&json!({})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    assert_ne!(rotated["token"], token);
    assert!(rotated["previousCredentialExpiresAt"].is_i64(), "{rotated}");
    // A secret of one's own is well formed, but a Brain adapter's token is always Plinth's:
    // `409 conflict`, and the token just made still stands.
    let (status, body) = rotate(&server, brain_id, json!({"secret": "my-own-secret-0123"})).await;
    assert_error(status, &body, 409, "conflict");
    let (status, shown) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{brain_id}")))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["createdAt"], brain["createdAt"], "{shown}");

    // Delete: once, in its own scope.
    let (status, body) = send(server.client.delete(&adapter_url).bearer_auth(GLOBEX)).await;
    assert_error(status, &body, 404, "not_found");
    let (status, deleted) = send(server.client.delete(&adapter_url).bearer_auth(ACME)).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": id, "object": "workspace_adapter", "deleted": true})
    );
    let (status, body) = send(server.client.get(&adapter_url).bearer_auth(ACME)).await;
    assert_error(status, &body, 404, "not_found");
    server.stop().await;
}

/// `POST …/rotate-secret` with `body`, in ACME's scope.
async fn rotate(server: &Server, id: &str, body: Value) -> (u16, Value) {
    send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/rotate-secret")))
            .bearer_auth(ACME)
            .json(&body),
    )
    .await
}

/// What a Brain runtime holding `token` is answered for an operation that needs nothing built
/// (cancelling a sequence never delivered): 200 with a receipt once the token is accepted,
/// 401 before anything runs otherwise.
async fn brain_status(server: &Server, id: &str, token: &str, sequence: u64) -> u16 {
    let (status, answer) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/brain/v1/operations")))
            .bearer_auth(token)
            .json(&json!({
                "contract": "environment/v1",
                "operation": {
                    "session_id": "ses_rotation",
                    "environment": "plinth",
                    "sequence": sequence,
                    "request": { "type": "cancel", "sequence": 1_000_000 },
                },
            })),
    )
    .await;
    match status {
        200 => assert_eq!(answer["receipt"]["code"], "not_found", "{answer}"),
        401 => assert_eq!(answer["error"]["code"], "unauthenticated", "{answer}"),
        other => panic!("{other}: {answer}"),
    }
    status
}

/// Whether a call Novo signs with `secret` gets past the signature check. The call can run
/// nothing (the environment has no build): past the check it is refused for that, before it
/// as `401 unauthenticated`.
async fn novo_accepts(server: &Server, id: &str, secret: &str) -> bool {
    // Each call its own body (a byte-identical signed call is a replay).
    let call = crate::novo::request_id();
    let body = serde_json::to_vec(
        &json!({"method": "listFiles", "args": {}, "options": {"callId": call}}),
    )
    .expect("json");
    let t = crate::novo::now();
    let (status, answer) = send(
        server
            .client
            .post(server.url(&format!("/v1/workspace-adapters/{id}/novo")))
            .header("Novo-Workspace-Method", "listFiles")
            .header("Novo-Run-Id", "run_rotation")
            .header("Novo-Request-Id", crate::novo::request_id())
            .header(
                "Novo-Signature",
                format!("t={t},v1={}", crate::novo::sign(secret, t, &body)),
            )
            .body(body),
    )
    .await;
    if status == 401 {
        assert_eq!(answer["error"]["code"], "unauthenticated", "{answer}");
        return false;
    }
    assert_eq!(answer["error"]["code"], "environment_not_ready", "{answer}");
    true
}

#[tokio::test]
async fn a_rotation_without_grace_revokes_the_old_credential_at_once() {
    let server = Server::start_with_tokens(&[("tok-acme", "acme")], &[]).await;
    let env = environment(&server, ACME, "Rotated Studio").await;

    // Brain: the old token works until the rotation, and not one call after it.
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    let id = brain["id"].as_str().expect("id").to_owned();
    let old = brain["token"].as_str().expect("token").to_owned();
    assert_eq!(brain_status(&server, &id, &old, 1).await, 200);
    let (status, rotated) = rotate(&server, &id, json!({"grace_ms": 0})).await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(
        rotated["previousCredentialExpiresAt"],
        Value::Null,
        "{rotated}"
    );
    let new = rotated["token"].as_str().expect("token").to_owned();
    assert_eq!(brain_status(&server, &id, &old, 2).await, 401);
    assert_eq!(brain_status(&server, &id, &new, 2).await, 200);

    // With a grace, both work until it ends, then only the new one.
    let (status, graced) = rotate(&server, &id, json!({"grace_ms": 2_000})).await;
    assert_eq!(status, 200, "{graced}");
    let newest = graced["token"].as_str().expect("token").to_owned();
    let rotated_at = graced["rotatedAt"].as_i64().expect("rotatedAt");
    let expires = graced["previousCredentialExpiresAt"]
        .as_i64()
        .expect("expires");
    assert_eq!(expires - rotated_at, 2_000, "{graced}");
    assert_eq!(brain_status(&server, &id, &new, 3).await, 200);
    assert_eq!(brain_status(&server, &id, &newest, 4).await, 200);
    assert_eq!(brain_status(&server, &id, &old, 5).await, 401);
    let (_, shown) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(shown["previousCredentialExpiresAt"], expires, "{shown}");
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms");
    tokio::time::sleep(std::time::Duration::from_millis(
        u64::try_from(expires - now_ms + 300).unwrap_or(0),
    ))
    .await;
    assert_eq!(brain_status(&server, &id, &new, 6).await, 401);
    assert_eq!(brain_status(&server, &id, &newest, 6).await, 200);

    // Novo the same: a signature with the rotated-out secret is refused at once.
    let (status, novo) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env, "secret": "env_secret_before_0123456789"}),
    )
    .await;
    assert_eq!(status, 201, "{novo}");
    let novo_id = novo["id"].as_str().expect("id").to_owned();
    assert!(novo_accepts(&server, &novo_id, "env_secret_before_0123456789").await);
    let (status, rotated) = rotate(
        &server,
        &novo_id,
        json!({"secret": "env_secret_after_0123456789", "grace_ms": 0}),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    assert!(!novo_accepts(&server, &novo_id, "env_secret_before_0123456789").await);
    assert!(novo_accepts(&server, &novo_id, "env_secret_after_0123456789").await);

    // The grace is checked; a refused rotation changes nothing.
    for bad in [
        json!({"grace_ms": -1}),
        json!({"grace_ms": 1.5}),
        json!({"grace_ms": "60000"}),
        json!({"grace_ms": 604_800_001}),
        json!({"grace": 60}),
    ] {
        let (status, body) = rotate(&server, &novo_id, bad.clone()).await;
        assert_error(status, &body, 400, "environment_invalid");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("grace"), "{bad}: {message}");
    }
    let (_, body) = rotate(&server, &novo_id, json!({"grace_ms": 604_800_001})).await;
    assert_eq!(body["error"]["detail"]["max"], 604_800_000u64, "{body}");
    assert!(novo_accepts(&server, &novo_id, "env_secret_after_0123456789").await);
    server.stop().await;
}

#[tokio::test]
async fn callback_origins_are_checked_normalised_shown_and_updated() {
    // Loopback origins need the operator's allowance.
    let config = format!(
        "[gateway]\ncallback_allow = [\"127.0.0.0/8\", \"::1\"]\n{}",
        tokens_toml(&[("tok-acme", "acme"), ("tok-globex", "globex")])
    );
    let server = Server::start_with_config(&config, &[]).await;
    let env = environment(&server, ACME, "Origins Studio").await;
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env,
               "callback_origins": ["HTTPS://Brain.Internal:8443/", "http://127.1:9000", "https://brain.example:443"]}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    let normalised = json!([
        "https://brain.internal:8443",
        "http://127.0.0.1:9000",
        "https://brain.example"
    ]);
    assert_eq!(brain["callback_origins"], normalised, "{brain}");
    let id = brain["id"].as_str().expect("id").to_owned();
    let url = server.url(&format!("/v1/workspace-adapters/{id}"));
    let (_, shown) = send(server.client.get(&url).bearer_auth(ACME)).await;
    assert_eq!(shown["callback_origins"], normalised, "{shown}");

    // What is not an origin is refused, saying which and how.
    for (bad, why) in [
        ("brain.internal:8443", "not an origin"),
        ("ftp://brain.internal", "http or https"),
        ("https://brain.internal/callback", "path"),
        ("https://user:pw@brain.internal", "user"),
    ] {
        let (status, body) = create(
            &server,
            ACME,
            json!({"protocol": "brain", "environment": env, "callback_origins": [bad]}),
        )
        .await;
        assert_error(status, &body, 400, "environment_invalid");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("callback_origins[0]") && message.contains(why),
            "{bad}: {message}"
        );
        let (status, body) = send(
            server
                .client
                .patch(&url)
                .bearer_auth(ACME)
                .json(&json!({"callback_origins": ["https://ok.example", bad]})),
        )
        .await;
        assert_error(status, &body, 400, "environment_invalid");
        assert!(
            body["error"]["message"]
                .as_str()
                .expect("message")
                .contains("callback_origins[1]"),
            "{body}"
        );
    }
    let (status, body) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env, "callback_origins": ["https://a.example"]}),
    )
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    let (_, shown) = send(server.client.get(&url).bearer_auth(ACME)).await;
    assert_eq!(
        shown["callback_origins"], normalised,
        "refusals changed nothing"
    );
    // Origins for an existing Novo adapter: the body is well formed, the adapter's protocol
    // takes none: `409 conflict`, and it still has none.
    let (status, novo) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env}),
    )
    .await;
    assert_eq!(status, 201, "{novo}");
    let novo_url = server.url(&format!(
        "/v1/workspace-adapters/{}",
        novo["id"].as_str().expect("id")
    ));
    let (status, body) = send(
        server
            .client
            .patch(&novo_url)
            .bearer_auth(ACME)
            .json(&json!({"callback_origins": ["https://a.example"]})),
    )
    .await;
    assert_error(status, &body, 409, "conflict");
    let (_, shown) = send(server.client.get(&novo_url).bearer_auth(ACME)).await;
    assert!(
        shown.get("callback_origins").is_none_or(Value::is_null),
        "{shown}"
    );

    // PATCH replaces them, in this scope only; nothing else can be changed there.
    for (case, token, patch, status, code) in [
        (
            "another scope",
            GLOBEX,
            json!({"callback_origins": []}),
            404,
            "not_found",
        ),
        (
            "the environment",
            ACME,
            json!({"environment": env}),
            400,
            "environment_invalid",
        ),
    ] {
        let (got, body) = send(server.client.patch(&url).bearer_auth(token).json(&patch)).await;
        assert_error_in(case, got, &body, status, code);
    }
    let (status, patched) = send(
        server
            .client
            .patch(&url)
            .bearer_auth(ACME)
            .json(&json!({"callback_origins": ["http://[::1]:7000"]})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["callback_origins"], json!(["http://[::1]:7000"]));
    assert_eq!(patched["createdAt"], brain["createdAt"]);
    let (status, cleared) = send(
        server
            .client
            .patch(&url)
            .bearer_auth(ACME)
            .json(&json!({"callback_origins": []})),
    )
    .await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(cleared["callback_origins"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn callback_origins_on_internal_addresses_are_refused_unless_the_operator_allows_them() {
    // A tenant registers origins where the gateway would post, with a bearer token of the
    // tenant's choosing, to itself, its network or the cloud's metadata service.
    let server = Server::start_with_tokens(&[("tok-acme", "acme")], &[]).await;
    let env = environment(&server, ACME, "Inward Studio").await;
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env, "callback_origins": ["https://brain.example"]}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    let url = server.url(&format!(
        "/v1/workspace-adapters/{}",
        brain["id"].as_str().expect("id")
    ));
    for (origin, why) in [
        ("http://127.0.0.1:8080", "loopback"),
        ("http://127.1:9000", "loopback"),
        ("http://localhost:8080", "loopback"),
        ("http://[::1]:7000", "loopback"),
        ("http://[::ffff:127.0.0.1]", "loopback"),
        ("http://10.0.0.1", "private"),
        ("https://192.168.1.20:8443", "private"),
        ("http://169.254.169.254", "metadata"),
        ("http://[fe80::1]", "link-local"),
        ("http://0.0.0.0:80", ""),
    ] {
        let (status, body) = create(
            &server,
            ACME,
            json!({"protocol": "brain", "environment": env, "callback_origins": ["https://brain.example", origin]}),
        )
        .await;
        assert_error_in(origin, status, &body, 400, "invalid_request");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("callback_origins[1]")
                && message.contains(why)
                && message.contains("public addresses only")
                && message.contains("gateway.callback_allow"),
            "{origin}: {message}"
        );
        let (status, body) = send(
            server
                .client
                .patch(&url)
                .bearer_auth(ACME)
                .json(&json!({"callback_origins": [origin]})),
        )
        .await;
        assert_error_in(origin, status, &body, 400, "invalid_request");
    }
    // Nothing was registered or changed.
    let (_, shown) = send(server.client.get(&url).bearer_auth(ACME)).await;
    assert_eq!(shown["callback_origins"], json!(["https://brain.example"]));
    server.stop().await;

    // The operator allows loopback (a Brain on the same host): loopback passes, nothing else.
    let config = format!(
        "[gateway]\ncallback_allow = [\"127.0.0.0/8\"]\n{}",
        tokens_toml(&[("tok-acme", "acme")])
    );
    let server = Server::start_with_config(&config, &[]).await;
    let env = environment(&server, ACME, "Loopback Studio").await;
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env, "callback_origins": ["http://127.0.0.1:8080"]}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    for origin in [
        "http://10.0.0.1",
        "http://169.254.169.254",
        "http://[::1]:7000",
    ] {
        let (status, body) = create(
            &server,
            ACME,
            json!({"protocol": "brain", "environment": env, "callback_origins": [origin]}),
        )
        .await;
        assert_error_in(origin, status, &body, 400, "invalid_request");
    }
    server.stop().await;
}

/// A signed Novo call to adapter `id`: its status, answer and `Retry-After`.
async fn novo_call(server: &Server, id: &str, secret: &str) -> (u16, Value, Option<String>) {
    let body = serde_json::to_vec(
        &json!({"method": "listFiles", "args": {}, "options": {"callId": crate::novo::request_id()}}),
    )
    .expect("json");
    let t = crate::novo::now();
    let response = server
        .client
        .post(server.url(&format!("/v1/workspace-adapters/{id}/novo")))
        .header("Novo-Workspace-Method", "listFiles")
        .header("Novo-Run-Id", "run_rate")
        .header(
            "Novo-Signature",
            format!("t={t},v1={}", crate::novo::sign(secret, t, &body)),
        )
        .body(body)
        .send()
        .await
        .expect("send");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let (status, answer) = crate::helpers::json(response).await;
    (status, answer, retry_after)
}

#[tokio::test]
async fn each_adapters_runtime_has_its_own_rate() {
    let config = format!(
        "[gateway]\nadapter_rate_limit_per_second = 1\nadapter_rate_limit_burst = 3\n{}",
        tokens_toml(&[("tok-acme", "acme"), ("tok-globex", "globex")])
    );
    let server = Server::start_with_config(&config, &[]).await;
    let secret = "env_secret_rate_0123456789";
    let mut ids = Vec::new();
    for (token, protocol) in [(ACME, "novo"), (GLOBEX, "novo"), (ACME, "brain")] {
        let env = environment(&server, token, &format!("Rate {protocol} {token}")).await;
        let body = match protocol {
            "novo" => json!({"protocol": "novo", "environment": env, "secret": secret}),
            _ => json!({"protocol": "brain", "environment": env}),
        };
        let (status, adapter) = create(&server, token, body).await;
        assert_eq!(status, 201, "{adapter}");
        ids.push((
            adapter["id"].as_str().expect("id").to_owned(),
            adapter["token"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    // One tenant's runtime calls past its burst: refused with when to retry, nothing ran.
    let mut refused = 0;
    for call in 0..8 {
        let (status, answer, retry_after) = novo_call(&server, &ids[0].0, secret).await;
        if call < 3 {
            // Past the rate check (the environment has no version to run on yet).
            assert_eq!(answer["error"]["code"], "environment_not_ready", "{answer}");
        } else if status == 429 {
            assert_error(status, &answer, 429, "rate_limited");
            assert!(retry_after.is_some(), "{answer}");
            let message = answer["error"]["message"].as_str().expect("message");
            assert!(
                message.contains("gateway.adapter_rate_limit_per_second"),
                "{message}"
            );
            refused += 1;
        }
    }
    assert!(
        refused >= 1,
        "8 calls at once passed a rate of 1/s with a burst of 3"
    );
    // Another tenant's adapter is not affected.
    let (_, answer, _) = novo_call(&server, &ids[1].0, secret).await;
    assert_eq!(answer["error"]["code"], "environment_not_ready", "{answer}");
    // A call that is not the adapter's (a wrong signature) spends nothing of its rate and is
    // refused as before.
    let (status, answer, _) = novo_call(&server, &ids[1].0, "env_secret_not_this_one_0123").await;
    assert_error(status, &answer, 401, "unauthenticated");
    // Brain's operations are counted the same way, per adapter.
    let (brain, token) = &ids[2];
    let mut statuses = Vec::new();
    for sequence in 1..=8 {
        let (status, answer) = send(
            server
                .client
                .post(server.url(&format!(
                    "/v1/workspace-adapters/{brain}/brain/v1/operations"
                )))
                .bearer_auth(token)
                .json(&json!({
                    "contract": "environment/v1",
                    "operation": {
                        "session_id": "ses_rate",
                        "environment": "plinth",
                        "sequence": sequence,
                        "request": { "type": "cancel", "sequence": 1_000_000 },
                    },
                })),
        )
        .await;
        if status == 429 {
            assert_error(status, &answer, 429, "rate_limited");
        }
        statuses.push(status);
    }
    assert_eq!(&statuses[..3], &[200, 200, 200], "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    server.stop().await;
}

/// Runs `plinth` with `args` and `env` until it exits (60 s at most); answers whether it
/// succeeded and what it wrote to stderr.
fn run_plinth(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(args)
        .env("PLINTH_LOG", "info")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .env_remove("PLINTH_SEAL_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = crate::processes::Process(command.spawn().expect("spawn plinth"));
    for _ in 0..600 {
        if let Some(status) = child.0.try_wait().expect("wait") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return (status.success(), stderr);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("plinth {args:?} was still running after 60 s");
}

/// The bytes of the catalog's SQLite files in `data`: the database and its write-ahead log.
fn catalog_files(data: &std::path::Path) -> Vec<u8> {
    ["catalog.db", "catalog.db-wal", "catalog.db-journal"]
        .iter()
        .filter_map(|name| std::fs::read(data.join(name)).ok())
        .flatten()
        .collect()
}

fn holds(bytes: &[u8], text: &str) -> bool {
    bytes
        .windows(text.len())
        .any(|window| window == text.as_bytes())
}

#[tokio::test]
async fn a_copy_of_the_database_holds_no_adapter_credential_and_another_key_opens_none() {
    let server = Server::start_with_tokens(&[("tok-acme", "acme")], &[]).await;
    let env = environment(&server, ACME, "Sealed Studio").await;
    let first = "env_secret_sealed_first_0123456789";
    let second = "env_secret_sealed_second_0123456789";
    let (status, novo) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": env, "secret": first}),
    )
    .await;
    assert_eq!(status, 201, "{novo}");
    let novo_id = novo["id"].as_str().expect("id").to_owned();
    let (status, rotated) = rotate(&server, &novo_id, json!({"secret": second})).await;
    assert_eq!(status, 200, "{rotated}");
    let (status, brain) = create(
        &server,
        ACME,
        json!({"protocol": "brain", "environment": env}),
    )
    .await;
    assert_eq!(status, 201, "{brain}");
    let token = brain["token"].as_str().expect("token").to_owned();
    assert!(
        novo_accepts(&server, &novo_id, first).await,
        "inside its grace"
    );
    assert!(novo_accepts(&server, &novo_id, second).await);

    // `plinth serve` made its key at first start: beside the database, private to its user.
    let data = server.stop_keeping_data().await;
    let key_file = data.path().join("seal.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file)
            .expect("seal.key")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let key = std::fs::read_to_string(&key_file).expect("key");
    let key = key.trim();

    // A copy of the database files: neither secret, nor the token or its digest, nor the key.
    let bytes = catalog_files(data.path());
    assert!(bytes.len() > 4096, "the database is there");
    let digest: String = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    for secret in [first, second, token.as_str(), digest.as_str(), key] {
        assert!(
            !holds(&bytes, secret),
            "{secret} is in the database's files"
        );
    }

    // Started with another key, the catalog opens none of them, and refuses to start saying
    // which adapter and which keys, and what to do.
    let dir = data.path().to_str().expect("utf-8").to_owned();
    let (started, stderr) = run_plinth(
        &["serve", "--data-dir", &dir, "--listen", "127.0.0.1:0"],
        &[(
            "PLINTH_SEAL_KEY",
            "YW5vdGhlciBzZWFsIGtleSwgbmV2ZXIgdGhlIHNhbWU=",
        )],
    );
    assert!(!started, "{stderr}");
    assert!(
        stderr.contains("was sealed with seal key")
            && stderr.contains("PLINTH_SEAL_KEY")
            && (stderr.contains(&novo_id) || stderr.contains(brain["id"].as_str().expect("id"))),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A catalog alone, with no key at all, says how to make one.
    let accept_file = crate::credentials::shared().accept_file();
    let (started, stderr) = run_plinth(
        &[
            "catalog",
            "--standalone",
            "--data-dir",
            &dir,
            "--listen",
            "127.0.0.1:0",
        ],
        &[(
            "PLINTH_INTERNAL_ACCEPT_FILE",
            accept_file.to_str().expect("utf-8"),
        )],
    );
    assert!(!started, "{stderr}");
    assert!(
        stderr.contains("head -c 32 /dev/urandom") && stderr.contains("seal_key_file"),
        "{stderr}"
    );

    // With its own key again, both signatures verify as before.
    let tokens = tempfile::tempdir().expect("dir");
    let config = tokens.path().join("plinth.toml");
    std::fs::write(
        &config,
        crate::helpers::tokens_toml(&[("tok-acme", "acme")]),
    )
    .expect("config");
    let server = Server::start_in(data, &["--config", config.to_str().expect("utf-8")]).await;
    assert!(novo_accepts(&server, &novo_id, first).await);
    assert!(novo_accepts(&server, &novo_id, second).await);
    assert!(!novo_accepts(&server, &novo_id, "env_secret_never_given_0123456789").await);
    server.stop().await;
}
