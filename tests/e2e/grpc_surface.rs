//! Who may call what on Plinth's gRPC servers, tried as callers on the host would: health is
//! open to probes; reflection needs a credential; every RPC of every service refuses a caller
//! without a credential (`UNAUTHENTICATED`) and a caller whose role may not make it
//! (`PERMISSION_DENIED`); a node's credential acts only for that node.

use std::str::FromStr as _;
use std::time::Duration;

use plinth_kit::auth::Role;
use plinth_proto::catalog::v1 as pb;
use prost::Message as _;
use serde_json::json;
use tonic::transport::Channel;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::credentials::Credentials;
use crate::helpers::{Server, exec_in};

async fn channel(address: std::net::SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// The services reflection lists, or the status it was refused with.
async fn services(
    address: std::net::SocketAddr,
    credential: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    let mut client = ServerReflectionClient::new(channel(address).await);
    let mut request = tonic::Request::new(futures::stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]));
    if let Some(token) = credential {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    let mut answers = client.server_reflection_info(request).await?.into_inner();
    let answer = answers.message().await?.expect("one answer");
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            Ok(names)
        }
        other => panic!("unexpected reflection answer: {other:?}"),
    }
}

/// `plinth serve` that also accepts the test's own credentials.
async fn serve(credentials: &Credentials) -> Server {
    let config = credentials.serve_config();
    Server::start_with(&["--config", config.to_str().expect("utf-8")]).await
}

#[tokio::test]
async fn health_is_open_and_reflection_needs_a_credential() {
    let credentials = Credentials::new();
    let server = serve(&credentials).await;
    let observer = credentials.token(Role::Observer);
    for (address, expected) in [
        (server.catalog_addr(), "plinth.catalog.v1.CatalogService"),
        (server.source_addr(), "plinth.source.v1.SourceService"),
        (server.node_addr(), "plinth.node.v1.NodeService"),
    ] {
        let refused = services(address, None).await.expect_err("no credential");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{expected}");
        let refused = services(address, Some("plinth_not-a-credential-anyone-has"))
            .await
            .expect_err("an unknown credential");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{expected}");
        let listed = services(address, Some(observer)).await.expect("listed");
        assert!(
            listed.iter().any(|name| name == expected)
                && listed.iter().any(|name| name == "grpc.health.v1.Health"),
            "{expected}: {listed:?}"
        );
        let status = tonic_health::pb::health_client::HealthClient::new(channel(address).await)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health answers without a credential")
            .into_inner()
            .status();
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    // The gateway, whose credential serve made itself, still works.
    let response = server
        .client
        .get(server.url("/v1/environments"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    server.stop().await;
}

/// The RPCs only builders may make (each about a build the builder leases).
const BUILDER_RPCS: [&str; 10] = [
    "/plinth.catalog.v1.CatalogService/ClaimBuild",
    "/plinth.catalog.v1.CatalogService/RenewLease",
    "/plinth.catalog.v1.CatalogService/ReleaseBuild",
    "/plinth.catalog.v1.CatalogService/AppendBuildLog",
    "/plinth.catalog.v1.CatalogService/FindReusable",
    "/plinth.catalog.v1.CatalogService/CompleteBuild",
    "/plinth.source.v1.SourceService/RecordLayer",
    "/plinth.source.v1.SourceService/ForgetLayer",
    "/plinth.source.v1.SourceService/GetOrigin",
    "/plinth.catalog.v1.CollectionService/HoldBlobs",
];
/// The RPCs only the source service may make (garbage collection asking the catalog).
const SOURCE_RPCS: [&str; 2] = [
    "/plinth.catalog.v1.CollectionService/BeginCollection",
    "/plinth.catalog.v1.CollectionService/EndCollection",
];
/// The RPCs only nodes may make (each about the node itself).
const NODE_RPCS: [&str; 6] = [
    "/plinth.catalog.v1.SessionService/RegisterNode",
    "/plinth.catalog.v1.SessionService/NodeHeartbeat",
    "/plinth.catalog.v1.SessionService/ListNodeSessions",
    "/plinth.catalog.v1.SessionService/DeregisterNode",
    "/plinth.catalog.v1.SessionService/RecordReadOrder",
    "/plinth.catalog.v1.SessionService/GetReadOrder",
];

/// Every RPC path of Plinth's internal services, from the descriptor set they are built from,
/// so an RPC added later is covered without touching this test.
fn every_rpc() -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(plinth_proto::FILE_DESCRIPTOR_SET)
        .expect("descriptor set");
    let mut paths = Vec::new();
    for file in set.file {
        let package = file.package().to_owned();
        for service in &file.service {
            for method in &service.method {
                paths.push(format!("/{package}.{}/{}", service.name(), method.name()));
            }
        }
    }
    paths
}

/// The code one call of `path` with an empty message ends in: the refusal, the handler's
/// answer, or `DeadlineExceeded` for a call the handler holds (a builder's claim waits for a
/// build).
async fn call(channel: Channel, path: &str, credential: Option<&str>) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return tonic::Code::Unavailable;
    }
    let mut request = tonic::Request::new(());
    request.set_timeout(Duration::from_secs(2));
    if let Some(token) = credential {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    let path = http::uri::PathAndQuery::from_str(path).expect("a path");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    match tokio::time::timeout(Duration::from_secs(5), grpc.unary(request, path, codec)).await {
        Ok(Ok(_)) => tonic::Code::Ok,
        Ok(Err(status)) => status.code(),
        Err(_) => tonic::Code::DeadlineExceeded,
    }
}

/// Calls every RPC of the services at `services` (`(package prefix, address)`, e.g.
/// `("/plinth.source.", …)`) with no credential, then as each role, and asserts only the
/// RPC's own role gets past the check.
pub(crate) async fn assert_every_rpc_answers_only_its_roles(
    credentials: &Credentials,
    services: &[(&str, std::net::SocketAddr)],
) {
    let rpcs = every_rpc();
    assert!(rpcs.len() > 60, "{rpcs:?}");
    let mut checked = 0;
    for path in &rpcs {
        let Some((_, address)) = services.iter().find(|(prefix, _)| path.starts_with(prefix))
        else {
            continue;
        };
        let allowed = if BUILDER_RPCS.contains(&path.as_str()) {
            Role::Builder
        } else if NODE_RPCS.contains(&path.as_str()) {
            Role::Node
        } else if SOURCE_RPCS.contains(&path.as_str()) {
            Role::Source
        } else {
            Role::Gateway
        };
        let channel = channel(*address).await;
        assert_eq!(
            call(channel.clone(), path, None).await,
            tonic::Code::Unauthenticated,
            "{path} without a credential"
        );
        for role in [
            Role::Gateway,
            Role::Builder,
            Role::Node,
            Role::Source,
            Role::Observer,
        ] {
            let code = call(channel.clone(), path, Some(credentials.token(role))).await;
            if role == allowed {
                assert!(
                    !matches!(
                        code,
                        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                    ),
                    "{path} refused its own role {role}: {code:?}"
                );
            } else {
                assert_eq!(code, tonic::Code::PermissionDenied, "{path} as {role}");
            }
        }
        checked += 1;
    }
    assert!(checked > 0, "no RPC of {services:?}");
}

#[tokio::test]
async fn every_rpc_answers_only_the_roles_that_may_make_it() {
    let credentials = Credentials::new();
    let server = serve(&credentials).await;
    let services = [
        ("/plinth.catalog.", server.catalog_addr()),
        ("/plinth.source.", server.source_addr()),
        ("/plinth.node.", server.node_addr()),
    ];
    assert!(
        every_rpc()
            .iter()
            .all(|path| services.iter().any(|(prefix, _)| path.starts_with(prefix))),
        "an RPC of a service this test does not know"
    );
    assert_every_rpc_answers_only_its_roles(&credentials, &services).await;
    server.stop().await;
}

#[tokio::test]
async fn a_node_credential_acts_only_for_its_own_node() {
    if !crate::helpers::can_build() {
        return;
    }
    let intruder = plinth_kit::auth::new_token().expect("random");
    let credentials = Credentials::with_extra(&[(Role::Node, Some("intruder"), intruder.expose())]);
    let server = serve(&credentials).await;
    let environment =
        crate::helpers::built_environment(&server, "Victim", Duration::from_secs(120)).await;
    let session =
        crate::helpers::start_session_with(&server, json!({ "environment": environment })).await;
    let session_id = session["id"].as_str().expect("id").to_owned();

    let catalog = channel(server.catalog_addr()).await;
    let as_gateway = credentials.interceptor(Role::Gateway);
    let get_session = || async {
        pb::session_service_client::SessionServiceClient::with_interceptor(
            catalog.clone(),
            as_gateway.clone(),
        )
        .get_session(pb::GetSessionRequest {
            scope: "default".into(),
            id: session_id.clone(),
        })
        .await
        .expect("the session")
        .into_inner()
    };
    let before = get_session().await;
    assert!(!before.node_id.is_empty());

    let intruder_interceptor =
        plinth_kit::grpc::ClientInterceptor::new(&intruder).expect("printable");
    let mut as_intruder = pb::session_service_client::SessionServiceClient::with_interceptor(
        catalog.clone(),
        intruder_interceptor,
    );
    // Take over the victim's name, pointing its sessions at an address the intruder holds.
    let refused = as_intruder
        .register_node(pb::RegisterNodeRequest {
            name: "node".into(),
            address: "http://127.0.0.1:9".into(),
            isolated: true,
            ..Default::default()
        })
        .await
        .expect_err("another node's name");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    // Learn the victim's sessions, or keep it alive in the catalog's eyes.
    let refused = as_intruder
        .list_node_sessions(pb::ListNodeSessionsRequest {
            node_id: before.node_id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("another node's sessions");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let refused = as_intruder
        .node_heartbeat(pb::NodeHeartbeatRequest {
            node_id: before.node_id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("another node's heartbeat");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    // Nor record what the victim's sessions read, which every node would fetch first.
    let refused = as_intruder
        .record_read_order(pb::RecordReadOrderRequest {
            node_id: before.node_id.clone(),
            environment_id: before.environment_id.clone(),
            version: before.version,
            paths: vec!["bin/sh".into()],
        })
        .await
        .expect_err("another node's read order");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    // Nor make it leave, so that it gets no sessions.
    let refused = as_intruder
        .deregister_node(pb::DeregisterNodeRequest {
            name: "node".into(),
        })
        .await
        .expect_err("another node's leaving");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // The victim is as it was: same node, same address, and its session still runs commands.
    let after = get_session().await;
    assert_eq!(
        (&after.node_id, &after.node_address),
        (&before.node_id, &before.node_address)
    );
    let result = exec_in(
        &server,
        &session_id,
        json!({ "command": "echo still-mine" }),
    )
    .await;
    assert_eq!(result["stdout"], "still-mine\n");

    // A node credential for any name (what a deployment may choose) may list the sessions,
    // which shows the refusals above were about the name, not the call.
    // (A read order at its bounds is an answer of more than tonic's default 4 MiB.)
    let mut as_node = pb::session_service_client::SessionServiceClient::with_interceptor(
        catalog,
        credentials.interceptor(Role::Node),
    )
    .max_decoding_message_size(8 << 20);
    let listed = as_node
        .list_node_sessions(pb::ListNodeSessionsRequest {
            node_id: before.node_id.clone(),
            ..Default::default()
        })
        .await
        .expect("listed")
        .into_inner();
    assert!(listed.sessions.iter().any(|s| s.id == session_id));

    // So may it record the version's read order: one at its bounds (4,096 paths of 1,024
    // bytes, more than 4 MiB on the wire) is taken whole, and kept over a later one.
    let paths: Vec<String> = (0..4096)
        .map(|index| format!("{index:04}/{}", "x".repeat(1019)))
        .collect();
    let record = |paths: Vec<String>| pb::RecordReadOrderRequest {
        node_id: before.node_id.clone(),
        environment_id: before.environment_id.clone(),
        version: before.version,
        paths,
    };
    let first = as_node
        .record_read_order(record(paths.clone()))
        .await
        .expect("recorded")
        .into_inner();
    assert!(first.stored);
    let later = as_node
        .record_read_order(record(vec!["bin/sh".into()]))
        .await
        .expect("answered")
        .into_inner();
    assert!(!later.stored);
    let kept = as_node
        .get_read_order(pb::GetReadOrderRequest {
            environment_id: before.environment_id.clone(),
            version: before.version,
        })
        .await
        .expect("read")
        .into_inner();
    assert!(kept.paths == paths, "the first read order, whole");
    server.stop().await;
}
