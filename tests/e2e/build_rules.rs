//! The rules of UHP §4 through real HTTP, with the test itself acting as the builder over the
//! catalog's real builder protocol (`plinth serve --builders 0` runs no builder of its own):
//! one build at a time, a failed build changes nothing, activation and rollback,
//! `environment_not_ready`, status transitions, and the log, followed and resumed.

use std::time::Duration;

use plinth_proto::catalog::v1 as pb;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, send};

/// The test as a builder, over the catalog's builder protocol.
pub(crate) struct Builder(Catalog);

type Catalog = CatalogServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        plinth_kit::grpc::ClientInterceptor,
    >,
>;

impl Builder {
    pub(crate) async fn connect(server: &Server) -> Self {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
                .expect("url")
                .connect()
                .await
                .expect("connect");
        Builder(CatalogServiceClient::with_interceptor(
            channel,
            server.interceptor(plinth_kit::auth::Role::Builder),
        ))
    }

    pub(crate) async fn claim(&mut self) -> pb::BuildClaim {
        self.0
            .claim_build(pb::ClaimBuildRequest {
                builder: "test".into(),
            })
            .await
            .expect("claim")
            .into_inner()
            .claim
            .expect("a queued build")
    }

    pub(crate) async fn log(&mut self, claim: &pb::BuildClaim, text: &str) {
        self.0
            .append_build_log(pb::AppendBuildLogRequest {
                lease_token: claim.lease_token.clone(),
                chunk: text.into(),
            })
            .await
            .expect("log");
    }

    pub(crate) async fn finish(
        &mut self,
        claim: &pb::BuildClaim,
        outcome: pb::complete_build_request::Outcome,
    ) {
        self.0
            .complete_build(pb::CompleteBuildRequest {
                lease_token: claim.lease_token.clone(),
                outcome: Some(outcome),
            })
            .await
            .expect("complete");
    }
}

pub(crate) fn ready(layer: &str) -> pb::complete_build_request::Outcome {
    pb::complete_build_request::Outcome::Ready(pb::BuildReady {
        layer_tree: layer.into(),
        packages: vec![pb::Package {
            manager: pb::PackageManager::Pip.into(),
            name: "tinypkg".into(),
            version: "1.0".into(),
        }],
        size: 42,
        dependency_key: String::new(),
        toolchains: Vec::new(),
    })
}

async fn environment(server: &Server) -> String {
    let (status, body) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Rules"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

async fn post(server: &Server, path: &str) -> (u16, Value) {
    send(server.client.post(server.url(path))).await
}

async fn get(server: &Server, path: &str) -> (u16, Value) {
    send(server.client.get(server.url(path))).await
}

#[tokio::test]
async fn builds_queue_run_fail_activate_and_roll_back_by_the_rules() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let mut builder = Builder::connect(&server).await;
    let id = environment(&server).await;
    let env = format!("/v1/environments/{id}");

    let (status, queued) = post(&server, &format!("{env}/build")).await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(queued["version"], 1);
    assert_eq!(queued["status"], "building", "{queued}");
    assert_eq!(queued["phase"], "queued", "{queued}");
    let (status, busy) = post(&server, &format!("{env}/build")).await;
    assert_error(status, &busy, 409, "environment_busy");
    let (status, busy) = send(server.client.delete(server.url(&env))).await;
    assert_error(status, &busy, 409, "environment_busy");
    let (_, environment) = get(&server, &env).await;
    assert_eq!(environment["status"], "building");
    assert_eq!(environment["latestVersion"], 1);
    assert_eq!(environment["version"], Value::Null);
    assert_eq!(environment["build"]["status"], "building");
    assert_eq!(environment["build"]["phase"], "queued");

    let first = builder.claim().await;
    builder.log(&first, "Collecting tinypkg\n").await;
    let (_, building) = get(&server, &format!("{env}/builds/1")).await;
    assert_eq!(building["status"], "building");
    assert_eq!(building["phase"], "running");
    assert_eq!(building["log"], "Collecting tinypkg\n");
    let (status, not_ready) = post(&server, &format!("{env}/versions/1/activate")).await;
    assert_error(status, &not_ready, 409, "environment_not_ready");
    builder.finish(&first, ready("sha256:layer-one")).await;

    let (_, environment) = get(&server, &env).await;
    assert_eq!(environment["status"], "ready");
    assert_eq!(environment["version"], 1);
    assert_eq!(
        environment["packages"],
        json!([{"manager": "pip", "name": "tinypkg", "version": "1.0"}])
    );
    assert_eq!(environment["versions"][0]["status"], "ready");
    assert_eq!(environment["versions"][0]["packages"], 1);

    // A failed build changes nothing else.
    let (status, second) = post(&server, &format!("{env}/build")).await;
    assert_eq!((status, second["version"].as_u64()), (202, Some(2)));
    let claim = builder.claim().await;
    builder.log(&claim, "boom\n").await;
    builder
        .finish(
            &claim,
            pb::complete_build_request::Outcome::Failed(
                "setup.sh exited with status 3: boom".into(),
            ),
        )
        .await;
    let (_, failed) = get(&server, &format!("{env}/builds/2")).await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"], "setup.sh exited with status 3: boom");
    assert_eq!(failed["log"], "boom\n");
    let (_, environment) = get(&server, &env).await;
    assert_eq!(
        environment["version"], 1,
        "the previous version stays active"
    );
    assert_eq!(environment["status"], "ready");
    assert_eq!(environment["build"]["status"], "failed");
    let (status, body) = post(&server, &format!("{env}/versions/2/activate")).await;
    assert_error(status, &body, 409, "environment_not_ready");

    // A third build, then roll back to the first.
    post(&server, &format!("{env}/build")).await;
    let third = builder.claim().await;
    builder.finish(&third, ready("sha256:layer-three")).await;
    let (_, versions) = get(&server, &format!("{env}/versions")).await;
    assert_eq!(versions["active"], 3);
    let listed: Vec<(u64, &str, bool)> = versions["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| {
            (
                v["version"].as_u64().unwrap_or(0),
                v["status"].as_str().unwrap_or(""),
                v["active"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (3, "ready", true),
            (2, "failed", false),
            (1, "ready", false)
        ]
    );
    let (status, rolled_back) = post(&server, &format!("{env}/versions/1/activate")).await;
    assert_eq!(status, 200, "{rolled_back}");
    assert_eq!(rolled_back["version"], 1);
    for missing in ["9", "0", "abc", "99999999999"] {
        let (status, body) = post(&server, &format!("{env}/versions/{missing}/activate")).await;
        assert_error(status, &body, 404, "environment_not_found");
        let (status, body) = get(&server, &format!("{env}/builds/{missing}")).await;
        assert_error(status, &body, 404, "environment_not_found");
    }
    // Deleting is allowed again once nothing is in flight.
    let (status, _) = send(server.client.delete(server.url(&env))).await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_waiting_claim_is_handed_a_build_queued_meanwhile() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let builder = Builder::connect(&server).await;
    let ask = |mut client: Catalog| async move {
        client
            .claim_build(pb::ClaimBuildRequest {
                builder: "test".into(),
            })
            .await
            .expect("claim")
            .into_inner()
            .claim
    };

    // Nothing queued: after its short wait, the answer is empty.
    assert!(ask(builder.0.clone()).await.is_none());

    // A build queued while a claim waits is handed to that claim.
    let id = environment(&server).await;
    let waiting = plinth_kit::tasks::spawn(ask(builder.0.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, queued) = post(&server, &format!("/v1/environments/{id}/build")).await;
    assert_eq!(status, 202, "{queued}");
    let claim = waiting
        .await
        .expect("join")
        .expect("the build queued meanwhile");
    let build = claim.build.expect("build");
    assert_eq!(
        (build.environment_id.as_str(), build.version),
        (id.as_str(), 1)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_followed_log_streams_as_written_ends_with_the_build_and_resumes_at_an_offset() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let mut builder = Builder::connect(&server).await;
    let id = environment(&server).await;
    let env = format!("/v1/environments/{id}");
    post(&server, &format!("{env}/build")).await;
    let claim = builder.claim().await;
    builder.log(&claim, "line one\n").await;

    let follower = {
        let (client, url) = (
            server.client.clone(),
            server.url(&format!("{env}/builds/1/log?follow=true")),
        );
        plinth_kit::tasks::spawn(async move {
            let response = client.get(url).send().await.expect("request");
            assert_eq!(response.status(), 200);
            response.text().await.expect("body")
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    builder.log(&claim, "line two\n").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    builder.log(&claim, "line three\n").await;
    builder.finish(&claim, ready("sha256:l")).await;
    let followed = tokio::time::timeout(Duration::from_secs(10), follower)
        .await
        .expect("the stream ends when the build ends")
        .expect("task");
    assert_eq!(followed, "line one\nline two\nline three\n");

    let resumed = server
        .client
        .get(server.url(&format!("{env}/builds/1/log?offset=9")))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert_eq!(
        resumed, "line two\nline three\n",
        "a client that reconnects gets only what it missed"
    );
    let (status, body) = get(&server, &format!("{env}/builds/1/log?follow=maybe")).await;
    assert_error(status, &body, 400, "environment_invalid");
    server.stop().await;
}
