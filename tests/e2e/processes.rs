//! `plinth catalog` and `plinth gateway` as two real processes, talking gRPC to each other
//! over loopback, with the catalog on PostgreSQL (`PLINTH_TEST_POSTGRES_URL`, required under
//! CI) and the internal token between them.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use plinth_catalog::testing::{self, PostgresAvailability};
use plinth_proto::catalog::v1::ListEnvironmentsRequest;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use serde_json::json;

use crate::helpers::{assert_error, send};

/// A child process killed when the test ends, however it ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
}

fn plinth(args: &[&str], internal_token: &str) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(args)
        .env("PLINTH_INTERNAL_TOKEN", internal_token)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn plinth");
    Process(child)
}

async fn wait_until_ready(client: &reqwest::Client, url: &str, process: &mut Process) {
    for _ in 0..300 {
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("{url}: the process exited early with {status}");
        }
        if let Ok(response) = client.get(url).send().await
            && response.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not become ready within 30 s");
}

/// `plinth catalog` on PostgreSQL and `plinth gateway` in front of it.
struct Pair<'a> {
    database_url: String,
    token: &'a str,
    grpc: SocketAddr,
    admin: SocketAddr,
    http: SocketAddr,
}

impl Pair<'_> {
    /// Starts both and waits until each says it is ready.
    async fn start(&self, client: &reqwest::Client) -> (Process, Process) {
        let (grpc, admin, http) = (
            self.grpc.to_string(),
            self.admin.to_string(),
            self.http.to_string(),
        );
        let catalog_url = format!("http://{grpc}");
        let mut catalog = plinth(
            &[
                "catalog",
                "--listen",
                &grpc,
                "--admin-listen",
                &admin,
                "--database-url",
                &self.database_url,
            ],
            self.token,
        );
        wait_until_ready(client, &format!("http://{admin}/readyz"), &mut catalog).await;
        let mut gateway = plinth(
            &[
                "gateway",
                "--listen",
                &http,
                "--catalog-url",
                &catalog_url,
                "--tokens",
                "tok-acme=acme",
            ],
            self.token,
        );
        wait_until_ready(client, &format!("http://{http}/readyz"), &mut gateway).await;
        (catalog, gateway)
    }
}

#[tokio::test]
async fn catalog_and_gateway_as_two_processes_over_grpc_on_postgres() {
    let PostgresAvailability::Available(server) = testing::postgres() else {
        return;
    };
    let database_url = testing::fresh_postgres_database(&server).await;
    let token = "internal-secret-for-this-test";
    let (grpc, admin, http) = (free_port(), free_port(), free_port());

    let client = crate::helpers::http_client();
    let pair = Pair {
        database_url: database_url.clone(),
        token,
        grpc,
        admin,
        http,
    };
    let (catalog, gateway) = pair.start(&client).await;

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

    // The catalog refuses callers without the internal token, but answers health probes.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let refused = CatalogServiceClient::new(channel.clone())
        .list_environments(ListEnvironmentsRequest {
            scope: "acme".into(),
        })
        .await
        .expect_err("no token, no answer");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
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

    // Each process serves its own metrics.
    let catalog_metrics = client
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert!(
        catalog_metrics.contains("CreateEnvironment"),
        "{catalog_metrics}"
    );
    assert!(
        catalog_metrics.contains("code=\"Unauthenticated\""),
        "{catalog_metrics}"
    );
    let gateway_metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert!(
        gateway_metrics.contains("plinth_http_requests_total"),
        "{gateway_metrics}"
    );

    // The environment outlives the processes: it is in PostgreSQL.
    drop(gateway);
    drop(catalog);
    let (_catalog, _gateway) = pair.start(&client).await;
    let (status, list) = send(
        client
            .get(format!("{base}/v1/environments"))
            .bearer_auth("tok-acme"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(list["data"], json!([created]));
}
