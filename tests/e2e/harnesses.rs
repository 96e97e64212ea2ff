//! Harnesses (UHP Environments §5) through real HTTP against `plinth serve`: the documented
//! answers, scopes, the environment a harness must name, the reference it keeps when that
//! environment is deleted, bad input of every kind, and the catalog's `HarnessService` that
//! other services call.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::catalog::v1::harness_service_client::HarnessServiceClient;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, assert_error_in, send};

/// A caller of one server, with or without a bearer token.
struct Client<'a> {
    server: &'a Server,
    token: Option<&'a str>,
}

impl<'a> Client<'a> {
    fn open(server: &'a Server) -> Self {
        Client {
            server,
            token: None,
        }
    }

    fn with_token(server: &'a Server, token: &'a str) -> Self {
        Client {
            server,
            token: Some(token),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.server.client.request(method, self.server.url(path));
        match self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        send(self.request(reqwest::Method::GET, path)).await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        send(self.request(reqwest::Method::DELETE, path)).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        send(self.request(reqwest::Method::POST, path).json(&body)).await
    }

    async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        send(self.request(reqwest::Method::PUT, path).json(&body)).await
    }

    async fn raw(&self, method: reqwest::Method, path: &str, body: &'static str) -> (u16, Value) {
        send(
            self.request(method, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// Creates an environment and returns its id.
    async fn environment(&self, name: &str) -> String {
        let (status, body) = self.post("/v1/environments", json!({"name": name})).await;
        assert_eq!(status, 201, "{body}");
        id_of(&body)
    }

    /// Creates a harness on `environment` and returns it.
    async fn harness(&self, name: &str, environment: &str) -> Value {
        let (status, body) = self
            .post(
                "/v1/harnesses",
                json!({"name": name, "base": "codex", "environment": environment}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body
    }
}

/// Acme's and Globex's environment "Studio" (the same name in two scopes), and Acme's harness
/// "Cutter" on its own.
async fn studios_and_a_harness(acme: &Client<'_>, globex: &Client<'_>) -> (String, String, Value) {
    let mine = acme.environment("Studio").await;
    let theirs = globex.environment("Studio").await;
    let harness = acme.harness("Cutter", &mine).await;
    (mine, theirs, harness)
}

fn id_of(body: &Value) -> String {
    body["id"].as_str().expect("id").to_owned()
}

fn is_harness_id(value: &Value) -> bool {
    value.as_str().is_some_and(|id| {
        id.len() == 37
            && id.starts_with("chrn_")
            && id[5..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The ids of a list answer, sorted, for comparisons that do not depend on creation order
/// (two creations may share a millisecond).
fn ids(list: &Value) -> Vec<String> {
    assert_eq!(list["object"], "list", "{list}");
    let mut ids: Vec<String> = list["data"]
        .as_array()
        .expect("data is an array")
        .iter()
        .map(id_of)
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&Value]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|body| id_of(body)).collect();
    ids.sort();
    ids
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn the_harness_lifecycle_gives_the_documented_answers() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let studio = client.environment("Content Studio").await;

    let (status, created) = client
        .post(
            "/v1/harnesses",
            json!({"name": "Teaser cutter", "base": "codex", "environment": studio}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert!(is_harness_id(&created["id"]), "{created}");
    assert_eq!(created["object"], "harness");
    assert_eq!(created["name"], "Teaser cutter");
    assert_eq!(created["base"], "codex");
    assert_eq!(created["environment"], studio.as_str());
    let created_at = created["createdAt"]
        .as_i64()
        .expect("createdAt is an integer");
    assert!(created_at > 1_700_000_000_000, "milliseconds: {created_at}");
    assert_eq!(created["updatedAt"], created["createdAt"]);
    let mut keys: Vec<&str> = created
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "base",
            "createdAt",
            "environment",
            "id",
            "name",
            "object",
            "updatedAt"
        ],
        "exactly the harness object's fields"
    );

    let id = id_of(&created);
    let path = format!("/v1/harnesses/{id}");
    let (status, one) = client.get(&path).await;
    assert_eq!(status, 200);
    assert_eq!(one, created);

    let (status, list) = client.get("/v1/harnesses").await;
    assert_eq!(status, 200);
    assert_eq!(
        list,
        json!({"object": "list", "data": [created], "has_more": false, "next": null})
    );

    let (status, reached) = client
        .get(&format!("/v1/environments/{studio}/harnesses"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        reached,
        json!({"object": "list", "data": [created], "has_more": false, "next": null})
    );

    let other = client.environment("Thumbnail Studio").await;
    let (status, replaced) = client
        .put(
            &path,
            json!({"name": "Thumbnailer", "base": "claude", "environment": other}),
        )
        .await;
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["id"], id.as_str());
    assert_eq!(replaced["name"], "Thumbnailer");
    assert_eq!(replaced["base"], "claude");
    assert_eq!(replaced["environment"], other.as_str());
    assert_eq!(replaced["createdAt"], created["createdAt"]);
    assert!(replaced["updatedAt"].as_i64() >= created["updatedAt"].as_i64());
    let (_, one) = client.get(&path).await;
    assert_eq!(one, replaced);
    let (_, reached) = client
        .get(&format!("/v1/environments/{studio}/harnesses"))
        .await;
    assert_eq!(reached["data"], json!([]), "it no longer names the first");

    let (status, deleted) = client.delete(&path).await;
    assert_eq!(status, 200);
    assert_eq!(
        deleted,
        json!({"id": id, "object": "harness", "deleted": true})
    );
    let (status, gone) = client.get(&path).await;
    assert_error(status, &gone, 404, "not_found");
    let (status, again) = client.delete(&path).await;
    assert_error(status, &again, 404, "not_found");
    let (_, list) = client.get("/v1/harnesses").await;
    assert_eq!(list["data"], json!([]));
    let (status, _) = client.get(&format!("/v1/environments/{other}")).await;
    assert_eq!(status, 200, "deleting a harness leaves its environment");
    server.stop().await;
}

#[tokio::test]
async fn a_harness_write_must_name_an_environment_of_the_callers_scope() {
    let server =
        Server::start_with_tokens(&[("tok-acme", "acme"), ("tok-globex", "globex")], &[]).await;
    let acme = Client::with_token(&server, "tok-acme");
    let globex = Client::with_token(&server, "tok-globex");
    let (_, theirs, harness) = studios_and_a_harness(&acme, &globex).await;
    let path = format!("/v1/harnesses/{}", id_of(&harness));

    let refusals = [
        json!({"name": "x", "base": "codex"}),
        json!({"name": "x", "base": "codex", "environment": null}),
        json!({"name": "x", "base": "codex", "environment": ""}),
        json!({"name": "x", "base": "codex", "environment": theirs}),
        json!({"name": "x", "base": "codex", "environment": "henv_00000000000000000000000000000000"}),
        json!({"name": "x", "base": "codex", "environment": "henv_XYZ"}),
        json!({"name": "x", "base": "codex", "environment": id_of(&harness)}),
    ];
    for body in refusals {
        let (status, answer) = acme.post("/v1/harnesses", body.clone()).await;
        assert_error(status, &answer, 404, "environment_not_found");
        assert!(message(&answer).contains("environment"), "{answer}");
        let (status, answer) = acme.put(&path, body.clone()).await;
        assert_error(status, &answer, 404, "environment_not_found");
    }
    let (_, list) = acme.get("/v1/harnesses").await;
    assert_eq!(
        list["data"],
        json!([harness]),
        "nothing created, nothing changed"
    );
    let (_, list) = globex.get("/v1/harnesses").await;
    assert_eq!(list["data"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn another_scopes_harness_is_not_found() {
    let server =
        Server::start_with_tokens(&[("tok-acme", "acme"), ("tok-globex", "globex")], &[]).await;
    let acme = Client::with_token(&server, "tok-acme");
    let globex = Client::with_token(&server, "tok-globex");
    let (mine, theirs, harness) = studios_and_a_harness(&acme, &globex).await;
    let their_harness = globex.harness("Cutter", &theirs).await;
    let path = format!("/v1/harnesses/{}", id_of(&harness));

    let stolen = json!({"name": "Stolen", "base": "codex", "environment": theirs});
    for (case, request, status, code) in [
        ("read", globex.request(Method::GET, &path), 404, "not_found"),
        (
            "replace",
            globex.request(Method::PUT, &path).json(&stolen),
            404,
            "not_found",
        ),
        (
            "delete",
            globex.request(Method::DELETE, &path),
            404,
            "not_found",
        ),
        (
            "list the harnesses of its environment",
            globex.request(Method::GET, &format!("/v1/environments/{mine}/harnesses")),
            404,
            "environment_not_found",
        ),
    ] {
        let (got, body) = send(request).await;
        assert_error_in(case, got, &body, status, code);
    }

    let (_, list) = globex.get("/v1/harnesses").await;
    assert_eq!(list["data"], json!([their_harness]));
    let (_, list) = acme.get("/v1/harnesses").await;
    assert_eq!(list["data"], json!([harness]));
    let (status, still) = acme.get(&path).await;
    assert_eq!(status, 200);
    assert_eq!(still, harness, "the other scope changed nothing");

    // Without a token, or with an unknown one: 401 before anything else.
    let anonymous = Client::open(&server);
    for (status, body) in [
        anonymous.get("/v1/harnesses").await,
        anonymous.get(&path).await,
        Client::with_token(&server, "tok-nope")
            .post(
                "/v1/harnesses",
                json!({"name": "x", "base": "codex", "environment": mine}),
            )
            .await,
    ] {
        assert_error(status, &body, 401, "unauthenticated");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_harness_keeps_its_reference_after_the_environment_is_deleted() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let studio = client.environment("Studio").await;
    let harness = client.harness("Cutter", &studio).await;
    let path = format!("/v1/harnesses/{}", id_of(&harness));

    let (status, body) = client.delete(&format!("/v1/environments/{studio}")).await;
    assert_eq!(
        status, 200,
        "a harness does not block its environment's delete: {body}"
    );

    let (status, kept) = client.get(&path).await;
    assert_eq!(status, 200);
    assert_eq!(kept, harness, "the old environment id is kept as it was");
    let (_, list) = client.get("/v1/harnesses").await;
    assert_eq!(list["data"], json!([harness]));

    // The deleted environment is not there, for its harness list as for everything else.
    let (status, body) = client
        .get(&format!("/v1/environments/{studio}/harnesses"))
        .await;
    assert_error(status, &body, 404, "environment_not_found");

    // A write may not name it again, but may point the harness somewhere that exists.
    let (status, body) = client
        .put(
            &path,
            json!({"name": "Cutter", "base": "codex", "environment": studio}),
        )
        .await;
    assert_error(status, &body, 404, "environment_not_found");
    let replacement = client.environment("Studio Two").await;
    let (status, repaired) = client
        .put(
            &path,
            json!({"name": "Cutter", "base": "codex", "environment": replacement}),
        )
        .await;
    assert_eq!(status, 200, "{repaired}");
    assert_eq!(repaired["environment"], replacement.as_str());
    server.stop().await;
}

#[tokio::test]
async fn an_environment_lists_exactly_the_harnesses_that_name_it() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let studio = client.environment("Studio").await;
    let other = client.environment("Other").await;
    let unused = client.environment("Unused").await;
    let first = client.harness("First", &studio).await;
    let elsewhere = client.harness("Elsewhere", &other).await;
    let second = client.harness("Second", &studio).await;

    let (status, reached) = client
        .get(&format!("/v1/environments/{studio}/harnesses"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(ids(&reached), sorted(&[&first, &second]));
    let (_, reached) = client
        .get(&format!("/v1/environments/{other}/harnesses"))
        .await;
    assert_eq!(reached["data"], json!([elsewhere]));
    let (status, reached) = client
        .get(&format!("/v1/environments/{unused}/harnesses"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        reached,
        json!({"object": "list", "data": [], "has_more": false, "next": null})
    );
    let (_, all) = client.get("/v1/harnesses").await;
    assert_eq!(ids(&all), sorted(&[&first, &elsewhere, &second]));
    let created: Vec<(i64, String)> = all["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|h| (h["createdAt"].as_i64().expect("createdAt"), id_of(h)))
        .collect();
    assert!(
        created.windows(2).all(|pair| pair[0] <= pair[1]),
        "oldest first: {created:?}"
    );

    for id in [
        "henv_00000000000000000000000000000000",
        "henv_XYZ",
        "%FF%FE",
    ] {
        let (status, body) = client
            .get(&format!("/v1/environments/{id}/harnesses"))
            .await;
        assert_error(status, &body, 404, "environment_not_found");
    }
    server.stop().await;
}

#[tokio::test]
async fn harness_bodies_are_parsed_strictly_and_name_the_field() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let studio = client.environment("Studio").await;
    let harness = client.harness("Cutter", &studio).await;
    let path = format!("/v1/harnesses/{}", id_of(&harness));

    let cases: [(&'static str, &str); 12] = [
        (r#"{"name": "a""#, "request body: not valid JSON"),
        ("not json at all", "request body: expected a JSON object"),
        ("", "request body: expected a JSON object"),
        (r#"[1, 2]"#, "expected a JSON object"),
        (r#"{"name": 42, "base": "codex"}"#, "name: invalid type"),
        (r#"{"name": null, "base": "codex"}"#, "name: invalid type"),
        (r#"{"name": "a", "base": ["codex"]}"#, "base: invalid type"),
        (
            r#"{"name": "a", "base": "codex", "environment": 7}"#,
            "environment: invalid type",
        ),
        (
            r#"{"name": "a", "base": "codex", "colour": "red"}"#,
            "unknown field `colour`",
        ),
        (r#"{"base": "codex"}"#, "missing field `name`"),
        (r#"{"name": "a"}"#, "missing field `base`"),
        (
            r#"{"name": "a", "base": "codex"} trailing"#,
            "request body: not valid JSON",
        ),
    ];
    for (body, expected) in cases {
        for (method, target) in [
            (reqwest::Method::POST, "/v1/harnesses"),
            (reqwest::Method::PUT, path.as_str()),
        ] {
            let (status, answer) = client.raw(method.clone(), target, body).await;
            assert_error(status, &answer, 400, "environment_invalid");
            assert!(
                message(&answer).contains(expected),
                "{method} {body:?} → {answer}, wanted {expected:?}"
            );
        }
    }

    // The catalog's rules: not blank, limited, no control characters; fields before the
    // environment, so a bad name is reported even when the environment is missing too.
    let rules = [
        (
            json!({"name": "", "base": "codex", "environment": studio}),
            "name:",
        ),
        (
            json!({"name": "   ", "base": "codex", "environment": studio}),
            "name:",
        ),
        (
            json!({"name": "a\u{0}b", "base": "codex", "environment": studio}),
            "name:",
        ),
        (
            json!({"name": "ok", "base": "", "environment": studio}),
            "base:",
        ),
        (
            json!({"name": "ok", "base": "co\ndex", "environment": studio}),
            "base:",
        ),
        (json!({"name": "", "base": "codex"}), "name:"),
    ];
    for (body, field) in rules {
        let (status, answer) = client.post("/v1/harnesses", body.clone()).await;
        assert_error(status, &answer, 400, "environment_invalid");
        assert!(message(&answer).starts_with(field), "{body} → {answer}");
        let (status, answer) = client.put(&path, body.clone()).await;
        assert_error(status, &answer, 400, "environment_invalid");
    }
    for field in ["name", "base"] {
        let mut body = json!({"name": "ok", "base": "codex", "environment": studio});
        body[field] = json!("x".repeat(201));
        let (status, answer) = client.post("/v1/harnesses", body).await;
        assert_error(status, &answer, 400, "environment_invalid");
        assert!(
            message(&answer).starts_with(&format!("{field}:")),
            "{answer}"
        );
        assert_eq!(answer["error"]["detail"]["max_chars"], 200);
    }
    let (status, long) = client
        .post(
            "/v1/harnesses",
            json!({"name": "é".repeat(200), "base": "b".repeat(200), "environment": studio}),
        )
        .await;
    assert_eq!(status, 201, "the limits are characters, inclusive: {long}");

    let (_, unchanged) = client.get(&path).await;
    assert_eq!(unchanged, harness, "refused updates change nothing");
    let (_, list) = client.get("/v1/harnesses").await;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(2));
    server.stop().await;
}

#[tokio::test]
async fn harness_ids_that_cannot_exist_are_not_found() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let studio = client.environment("Studio").await;
    for id in [
        "chrn_00000000000000000000000000000000",
        "chrn_XYZ",
        "chrn_2F1C9D4E8A7B4C3D9E6F5A4B3C2D1E0F",
        studio.as_str(),
        "..%2F..%2Fetc%2Fpasswd",
        "%FF%FE",
    ] {
        let path = format!("/v1/harnesses/{id}");
        let (status, body) = client.get(&path).await;
        assert_error(status, &body, 404, "not_found");
        let (status, body) = client.delete(&path).await;
        assert_error(status, &body, 404, "not_found");
        let (status, body) = client
            .put(
                &path,
                json!({"name": "x", "base": "codex", "environment": studio}),
            )
            .await;
        assert_error(status, &body, 404, "not_found");
    }
    server.stop().await;
}

#[tokio::test]
async fn openapi_documents_the_harness_endpoints_and_switched_off_means_404() {
    let server = Server::start().await;
    let client = Client::open(&server);
    let (status, doc) = client.get("/openapi.json").await;
    assert_eq!(status, 200);
    let expected: [(&str, &str, &[&str]); 6] = [
        (
            "/v1/harnesses",
            "post",
            &["201", "400", "401", "404", "503"],
        ),
        ("/v1/harnesses", "get", &["200", "401", "503"]),
        ("/v1/harnesses/{id}", "get", &["200", "401", "404", "503"]),
        (
            "/v1/harnesses/{id}",
            "put",
            &["200", "400", "401", "404", "503"],
        ),
        (
            "/v1/harnesses/{id}",
            "delete",
            &["200", "401", "404", "503"],
        ),
        (
            "/v1/environments/{id}/harnesses",
            "get",
            &["200", "401", "404", "503"],
        ),
    ];
    for (path, method, statuses) in expected {
        let responses = &doc["paths"][path][method]["responses"];
        for status in statuses {
            assert!(
                responses.get(*status).is_some(),
                "{method} {path} documents {status}: {responses}"
            );
        }
    }
    assert!(doc["components"]["schemas"].get("HarnessBody").is_some());
    let (status, body) = send(client.request(reqwest::Method::PATCH, "/v1/harnesses")).await;
    assert_error(status, &body, 405, "method_not_allowed");
    server.stop().await;

    let server = Server::start_with(&["--environments", "false"]).await;
    let client = Client::open(&server);
    let id = "chrn_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f";
    for (status, body) in [
        client.get("/v1/harnesses").await,
        client
            .post("/v1/harnesses", json!({"name": "x", "base": "codex"}))
            .await,
        client.get(&format!("/v1/harnesses/{id}")).await,
        client
            .get("/v1/environments/henv_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f/harnesses")
            .await,
    ] {
        assert_error(status, &body, 404, "not_found");
    }
    let (_, doc) = client.get("/openapi.json").await;
    assert!(doc["paths"].get("/v1/harnesses").is_none());
    server.stop().await;
}

/// Other services (tasks, sessions) reach harnesses through the catalog's `HarnessService`:
/// it is listed by reflection, healthy with the catalog, open only to the gateway's role, and
/// `GetHarness(scope, id)` answers the environment the harness names.
#[tokio::test]
async fn the_catalog_serves_harnesses_over_grpc() {
    let credentials = crate::credentials::Credentials::new();
    let config = credentials.serve_config();
    let server = Server::start_with(&["--config", config.to_str().expect("utf-8")]).await;
    let client = Client::open(&server);
    let studio = client.environment("Studio").await;
    let harness = client.harness("Cutter", &studio).await;

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
            .expect("url")
            .connect()
            .await
            .expect("connect");
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: plinth_catalog::HARNESS_SERVICE_NAME.to_owned(),
        })
        .await
        .expect("health answers without the token")
        .into_inner()
        .status();
    assert_eq!(
        health,
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    let get = |scope: &str, id: &str| pb::GetHarnessRequest {
        scope: scope.to_owned(),
        id: id.to_owned(),
    };
    let refused = HarnessServiceClient::new(channel.clone())
        .get_harness(get("default", &id_of(&harness)))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    let interceptor = credentials.interceptor(plinth_kit::auth::Role::Gateway);
    let mut harnesses = HarnessServiceClient::with_interceptor(channel, interceptor);
    let found = harnesses
        .get_harness(get("default", &id_of(&harness)))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(found.environment_id, studio);
    assert_eq!(found.scope, "default");
    assert_eq!(found.name, "Cutter");

    let elsewhere = harnesses
        .get_harness(get("globex", &id_of(&harness)))
        .await
        .expect_err("another scope");
    assert_eq!(elsewhere.code(), tonic::Code::NotFound);
    assert_eq!(
        PlinthError::from_status(&elsewhere).code,
        ErrorCode::NotFound
    );

    let refused = harnesses
        .create_harness(pb::CreateHarnessRequest {
            scope: "globex".into(),
            name: "Thief".into(),
            base: "codex".into(),
            environment_id: studio.clone(),
        })
        .await
        .expect_err("another scope's environment");
    assert_eq!(
        PlinthError::from_status(&refused).code,
        ErrorCode::EnvironmentNotFound
    );
    server.stop().await;
}
