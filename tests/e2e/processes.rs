//! `plinth catalog`, `plinth source` and `plinth gateway` as real processes, talking gRPC to
//! each other over loopback, with the catalog and the source index sharing one PostgreSQL
//! database (`PLINTH_TEST_POSTGRES_URL`, required under CI) and each process proving its
//! role with its own internal credential.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use plinth_proto::catalog::v1::ListEnvironmentsRequest;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use serde_json::json;

use crate::cluster::{Cluster, Part};
use crate::credentials::Credentials;
use crate::helpers::{assert_error, send};
use crate::waiting::eventually;
use plinth_kit::auth::Role;

/// A child process killed when the test ends, however it ends.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The command `plinth <role> …` runs as, with the role's credential, a quiet log and the
/// tests' seal key, for a caller to add to before spawning it.
pub(crate) fn plinth_command(args: &[&str], credentials: &Credentials) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    crate::credentials::apply(&mut command, credentials, args[0]);
    command
        .args(args)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .env("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)
        .stdin(Stdio::null());
    command
}

/// Waits until `url` answers 200 (a `/readyz`), failing the test if `process` exits first.
pub(crate) async fn wait_until_ready(client: &reqwest::Client, url: &str, process: &mut Process) {
    eventually(Duration::from_secs(30), async || {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("{url}: the process exited early with {status}");
        }
        let response = client.get(url).send().await.map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            200 => Ok(()),
            status => Err(format!("{url}: {status}")),
        }
    })
    .await;
}

#[tokio::test]
async fn catalog_source_and_gateway_as_processes_over_grpc_on_postgres() {
    let Some(mut cluster) = Cluster::builder()
        .postgres()
        .tokens("tok-acme=acme")
        .start()
        .await
    else {
        return;
    };
    let client = cluster.client.clone();
    let (grpc, admin, http) = (
        cluster.get(Part::Catalog, 0).listen(),
        cluster.get(Part::Catalog, 0).admin(),
        cluster.get(Part::Gateway, 0).listen(),
    );
    let source = cluster.get(Part::Source, 0).listen();
    let base = format!("http://{http}");
    let (status, created) = send(
        client
            .post(format!("{base}/v1/environments"))
            .bearer_auth("tok-acme")
            .json(&json!({"name": "Two Processes", "entry": "make run"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["mount"], "/env/two-processes");
    let id = created["id"].as_str().expect("id");

    let (status, fetched) = send(
        client
            .get(format!("{base}/v1/environments/{id}"))
            .bearer_auth("tok-acme"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(fetched, created);

    let (status, clash) = send(
        client
            .post(format!("{base}/v1/environments"))
            .bearer_auth("tok-acme")
            .json(&json!({"name": "two processes"})),
    )
    .await;
    assert_error(status, &clash, 409, "environment_exists");

    // The catalog refuses callers without a credential, and callers whose role may not make
    // the call, but answers health probes.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let list = || ListEnvironmentsRequest {
        scope: "acme".into(),
        ..Default::default()
    };
    let refused = CatalogServiceClient::new(channel.clone())
        .list_environments(list())
        .await
        .expect_err("no credential, no answer");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    for role in [Role::Builder, Role::Node, Role::Observer] {
        let refused = CatalogServiceClient::with_interceptor(
            channel.clone(),
            cluster.credentials().interceptor(role),
        )
        .list_environments(list())
        .await
        .expect_err("only the gateway acts for a scope");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{role}");
    }
    let listed = CatalogServiceClient::with_interceptor(
        channel.clone(),
        cluster.credentials().interceptor(Role::Gateway),
    )
    .list_environments(list())
    .await
    .expect("the gateway's credential lists")
    .into_inner();
    assert_eq!(listed.environments.len(), 1);
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health is open");
    assert_eq!(
        health.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    // Every RPC of the split catalog and source service, as every role.
    crate::grpc_surface::assert_every_rpc_answers_only_its_roles(
        cluster.credentials(),
        &[("/plinth.catalog.", grpc), ("/plinth.source.", source)],
    )
    .await;

    // Each process serves its own metrics, to a caller with a credential; `/readyz` says
    // whether it is ready to anyone.
    for url in [format!("http://{admin}/metrics"), format!("{base}/metrics")] {
        let anonymous = client.get(&url).send().await.expect("request");
        assert_eq!(anonymous.status(), 401, "{url}");
    }
    let scrape = |url: String| {
        let request = client
            .get(url)
            .bearer_auth(cluster.credentials().token(Role::Observer));
        async move {
            let response = request.send().await.expect("request");
            assert_eq!(response.status(), 200);
            response.text().await.expect("body")
        }
    };
    let catalog_metrics = scrape(format!("http://{admin}/metrics")).await;
    assert!(
        catalog_metrics.contains("CreateEnvironment"),
        "{catalog_metrics}"
    );
    assert!(
        catalog_metrics.contains("code=\"UNAUTHENTICATED\""),
        "{catalog_metrics}"
    );
    assert!(
        catalog_metrics.contains("code=\"PERMISSION_DENIED\""),
        "{catalog_metrics}"
    );
    let gateway_metrics = scrape(format!("{base}/metrics")).await;
    assert!(
        gateway_metrics.contains("plinth_http_requests_total"),
        "{gateway_metrics}"
    );
    let ready = client
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .expect("request");
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.text().await.expect("body"), "ready\n");

    // The environment outlives the processes: it is in PostgreSQL.
    // A file goes through all three processes.
    let file_url = format!("{base}/v1/environments/{id}/files/bin/tool.sh");
    let (status, written) = send(
        client
            .put(&file_url)
            .bearer_auth("tok-acme")
            .body("#!/bin/sh\necho hi\n"),
    )
    .await;
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["size"], 18);

    for name in ["gateway-1", "source-1", "catalog-1"] {
        cluster.kill(name);
    }
    for name in ["catalog-1", "source-1", "gateway-1"] {
        cluster.restart(name).await;
    }
    let read = client
        .get(&file_url)
        .bearer_auth("tok-acme")
        .send()
        .await
        .expect("request");
    assert_eq!(read.status(), 200);
    assert_eq!(
        read.bytes().await.expect("body").as_ref(),
        b"#!/bin/sh\necho hi\n"
    );
    let (status, list) = send(
        client
            .get(format!("{base}/v1/environments"))
            .bearer_auth("tok-acme"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(list["data"][0]["id"], created["id"]);
    assert_eq!(list["data"][0]["files"], json!({"count": 1, "bytes": 18}));
}
