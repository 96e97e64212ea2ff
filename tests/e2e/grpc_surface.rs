//! What every gRPC server of Plinth offers operators: health and reflection, open without the
//! internal token.

use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::helpers::Server;

async fn channel(address: std::net::SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

async fn services(address: std::net::SocketAddr) -> Vec<String> {
    let mut client = ServerReflectionClient::new(channel(address).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("answer")
        .expect("one answer");
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            names
        }
        other => panic!("unexpected reflection answer: {other:?}"),
    }
}

#[tokio::test]
async fn every_grpc_server_answers_reflection_and_health() {
    let server = Server::start_with(&["--internal-token", "only-services-know-this"]).await;
    let catalog = services(server.catalog_addr()).await;
    for expected in ["grpc.health.v1.Health", "plinth.catalog.v1.CatalogService"] {
        assert!(
            catalog.iter().any(|name| name == expected),
            "catalog lists {catalog:?}"
        );
    }
    let source = services(server.source_addr()).await;
    for expected in ["grpc.health.v1.Health", "plinth.source.v1.SourceService"] {
        assert!(
            source.iter().any(|name| name == expected),
            "source lists {source:?}"
        );
    }
    for address in [server.catalog_addr(), server.source_addr()] {
        let status = tonic_health::pb::health_client::HealthClient::new(channel(address).await)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health answers without the token")
            .into_inner()
            .status();
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    // The gateway, which has the token, still works.
    let response = server
        .client
        .get(server.url("/v1/environments"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    server.stop().await;
}
