//! Workspace adapters through real HTTP: registered on an environment of the caller's scope,
//! their secret (Novo) or token (Brain) shown once, rotated, deleted, and invisible to other
//! scopes.

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, send};

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
    send(
        server
            .client
            .post(server.url("/v1/workspace-adapters"))
            .bearer_auth(token)
            .json(&body),
    )
    .await
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
    let (status, body) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(GLOBEX),
    )
    .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = create(
        &server,
        GLOBEX,
        json!({"protocol": "novo", "environment": env}),
    )
    .await;
    assert_error(status, &body, 404, "environment_not_found");
    let (status, body) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": other}),
    )
    .await;
    assert_error(status, &body, 404, "environment_not_found");
    let (status, body) = create(
        &server,
        ACME,
        json!({"protocol": "novo", "environment": "henv_nope"}),
    )
    .await;
    assert_error(status, &body, 404, "environment_not_found");

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

    // Delete: once, in its own scope.
    let (status, body) = send(
        server
            .client
            .delete(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(GLOBEX),
    )
    .await;
    assert_error(status, &body, 404, "not_found");
    let (status, deleted) = send(
        server
            .client
            .delete(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(ACME),
    )
    .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": id, "object": "workspace_adapter", "deleted": true})
    );
    let (status, body) = send(
        server
            .client
            .get(server.url(&format!("/v1/workspace-adapters/{id}")))
            .bearer_auth(ACME),
    )
    .await;
    assert_error(status, &body, 404, "not_found");
    server.stop().await;
}
