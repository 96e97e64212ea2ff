//! The tenant API over gRPC (`proto/plinth/v1`), as a user of another language meets it: a
//! Python client generated from the published `.proto` files with grpcio-tools (from PyPI;
//! `.ci/run` installs it) runs the walk-through against a real `plinth serve`, on the same
//! address as REST: streamed upload and archive import, paging, a build whose log it follows
//! as a stream, a session whose command's output it streams, and the errors a tenant gets
//! (another scope's environment is NOT_FOUND; no token or an unknown one is UNAUTHENTICATED).
//! Reflection on that address, v1 and v1alpha, lists `plinth.v1` and nothing internal; each
//! internal port lists only its own services. Nothing is fetched from the network.

use std::path::Path;
use std::process::Command;

use tonic::transport::Channel;

use crate::helpers::{Server, can_build, tar_of};

/// The walk-through, against the generated modules `plinth.v1.*_pb2(_grpc)`.
const WALK_THROUGH: &str = r#"
import io
import os
import sys

import grpc

from plinth.v1 import environments_pb2 as E
from plinth.v1 import environments_pb2_grpc as EG
from plinth.v1 import sessions_pb2 as S
from plinth.v1 import sessions_pb2_grpc as SG

channel = grpc.insecure_channel(os.environ["PLINTH_ADDRESS"])
me = [("authorization", "Bearer " + os.environ["PLINTH_TOKEN"])]
environments = EG.EnvironmentServiceStub(channel)
files = EG.FileServiceStub(channel)
builds = EG.BuildServiceStub(channel)
sessions = SG.SessionServiceStub(channel)


def refused(call, code):
    try:
        call()
    except grpc.RpcError as error:
        if error.code() != code:
            sys.exit(f"expected {code}, got {error.code()}: {error.details()}")
        return error.details()
    sys.exit(f"expected {code}, the call succeeded")


environment = environments.CreateEnvironment(
    E.CreateEnvironmentRequest(name="Content Studio", entry="python3 run.py --episode <id>"),
    metadata=me,
)
assert environment.status == E.ENVIRONMENT_STATUS_EMPTY, environment
assert environment.mount == "/env/content-studio", environment
assert environment.created_at_ms > 1_600_000_000_000, environment
print("environment", environment.id)

source = b"import sys\nprint('teaser-' + sys.argv[-1] + '.mp4')\n"


def pieces():
    yield E.WriteFileRequest(environment_id=environment.id, path="run.py", data=source[:7])
    yield E.WriteFileRequest(data=source[7:30])
    yield E.WriteFileRequest(data=source[30:])


written = files.WriteFile(pieces(), metadata=me)
assert written.type == E.FILE_TYPE_FILE and written.size == len(source), written
archive = open(os.environ["ARCHIVE"], "rb").read()
imported = files.ImportArchive(
    iter(
        [
            E.ImportArchiveRequest(environment_id=environment.id, data=archive[:100]),
            E.ImportArchiveRequest(data=archive[100:]),
        ]
    ),
    metadata=me,
)
assert imported.files == 2, imported
read = b"".join(c.data for c in files.ReadFile(E.ReadFileRequest(environment_id=environment.id, path="run.py"), metadata=me))
assert read == source, read
seen, after = [], ""
while True:
    page = files.ListFiles(E.ListFilesRequest(environment_id=environment.id, limit=2, after=after), metadata=me)
    seen += [entry.path for entry in page.data]
    if not page.has_more:
        break
    after = page.next
assert seen == ["README.md", "data", "data/notes.txt", "run.py"], seen
print("files", len(seen))

build = builds.StartBuild(E.StartBuildRequest(environment_id=environment.id), metadata=me)
assert build.version == 1, build
log = b"".join(
    c.data
    for c in builds.ReadBuildLog(
        E.ReadBuildLogRequest(environment_id=environment.id, version=1, follow=True), metadata=me
    )
)
record = builds.GetBuild(E.GetBuildRequest(environment_id=environment.id, version=1), metadata=me)
assert record.status == E.BUILD_STATUS_READY, record
assert record.finished_at_ms >= record.started_at_ms > 1_600_000_000_000, record
assert log == record.log.encode(), (log, record.log)
print("build", record.version, "log bytes", len(log))
versions = environments.ListVersions(E.ListVersionsRequest(environment_id=environment.id), metadata=me)
assert versions.HasField("active") and versions.active == 1, versions

session = sessions.CreateSession(
    S.CreateSessionRequest(environment=environment.id, limits=S.Limits(memory_mb=128, pids=64)),
    metadata=me,
)
assert session.status == S.SESSION_STATUS_ACTIVE and session.environment.version == 1, session
events = list(
    sessions.Exec(
        S.ExecRequest(
            session_id=session.id,
            command="python3 $PROJECT_ROOT/run.py --episode 12; echo late >&2; exit 3",
        ),
        metadata=me,
    )
)
kinds = [event.WhichOneof("event") for event in events]
assert kinds[-1] == "result" and "stdout" in kinds and "stderr" in kinds, kinds
stdout = "".join(event.stdout for event in events if event.WhichOneof("event") == "stdout")
assert events[-1].result.exit_code == 3, events[-1]
print("exec", stdout.strip(), "exit", events[-1].result.exit_code)
turns = sessions.ListTurns(S.ListTurnsRequest(session_id=session.id), metadata=me)
assert [t.kind for t in turns.data] == [S.TURN_KIND_EXEC], turns

other = [("authorization", "Bearer " + os.environ["OTHER_TOKEN"])]
refused(lambda: environments.GetEnvironment(E.GetEnvironmentRequest(environment_id=environment.id), metadata=other), grpc.StatusCode.NOT_FOUND)
refused(lambda: sessions.GetSession(S.GetSessionRequest(session_id=session.id), metadata=other), grpc.StatusCode.NOT_FOUND)
refused(lambda: environments.GetEnvironment(E.GetEnvironmentRequest(environment_id=environment.id)), grpc.StatusCode.UNAUTHENTICATED)
refused(lambda: environments.GetEnvironment(E.GetEnvironmentRequest(environment_id=environment.id), metadata=[("authorization", "Bearer nope")]), grpc.StatusCode.UNAUTHENTICATED)
said = refused(lambda: environments.CreateEnvironment(E.CreateEnvironmentRequest(name=""), metadata=me), grpc.StatusCode.INVALID_ARGUMENT)
print("invalid", said)
ended = sessions.EndSession(S.EndSessionRequest(session_id=session.id), metadata=me)
assert ended.status == S.SESSION_STATUS_ENDED and ended.ended_at_ms > 0, ended
deleted = environments.DeleteEnvironment(E.DeleteEnvironmentRequest(environment_id=environment.id), metadata=me)
assert deleted.deleted, deleted
refused(lambda: environments.GetEnvironment(E.GetEnvironmentRequest(environment_id=environment.id), metadata=me), grpc.StatusCode.NOT_FOUND)
print("done")
"#;

fn missing(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is not installed (python3 -m pip install grpcio grpcio-tools)"
    );
    eprintln!("{what} is not installed: skipping (CI runs it)");
}

/// Generates the Python client from the repository's `proto/` into `out`; false when
/// grpcio-tools is not installed.
fn generate(out: &Path) -> bool {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let mut args = vec![
        "-m".to_owned(),
        "grpc_tools.protoc".to_owned(),
        format!("-I{}", proto.display()),
        format!("--python_out={}", out.display()),
        format!("--grpc_python_out={}", out.display()),
    ];
    for file in [
        "plinth/v1/environments.proto",
        "plinth/v1/sessions.proto",
        "plinth/v1/harnesses.proto",
        "google/api/http.proto",
        "google/api/annotations.proto",
    ] {
        args.push(file.to_owned());
    }
    let generated = Command::new("python3")
        .args(&args)
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&generated.stderr);
    if said.contains("No module named grpc_tools") {
        return false;
    }
    assert!(
        generated.status.success(),
        "grpc_tools.protoc failed: {said}"
    );
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_the_protos_runs_the_walk_through() {
    if !can_build() {
        return;
    }
    let server =
        Server::start_with_tokens(&[("tok-grpc", "grpc"), ("tok-other", "other")], &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    if !generate(dir.path()) {
        missing("grpcio-tools");
        return;
    }
    let archive = tar_of(
        &[
            ("data/notes.txt".to_owned(), b"cut at 00:12\n".to_vec()),
            ("README.md".to_owned(), b"# Content Studio\n".to_vec()),
        ]
        .into_iter()
        .collect(),
    );
    std::fs::write(dir.path().join("project.tar"), archive).expect("write");
    std::fs::write(dir.path().join("walk_through.py"), WALK_THROUGH).expect("write");
    let address = server
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let walked = Command::new("python3")
        .arg("walk_through.py")
        .current_dir(dir.path())
        .env("PYTHONPATH", dir.path())
        .env("PLINTH_ADDRESS", address)
        .env("PLINTH_TOKEN", "tok-grpc")
        .env("OTHER_TOKEN", "tok-other")
        .env("ARCHIVE", dir.path().join("project.tar"))
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&walked.stdout);
    let complained = String::from_utf8_lossy(&walked.stderr);
    if complained.contains("No module named 'grpc'") {
        missing("grpcio");
        return;
    }
    assert!(
        walked.status.success(),
        "the walk-through failed:\n{said}{complained}"
    );
    assert!(said.contains("files 4"), "{said}");
    assert!(said.contains("exec teaser-12.mp4 exit 3"), "{said}");
    assert!(
        said.contains("invalid name"),
        "the error names the field: {said}"
    );
    assert!(said.contains("done"), "{said}");
    server.stop().await;
}

async fn channel(address: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// `async fn $name(address, token) -> Vec<String>`: the services reflection `$version`
/// lists at `address`, sorted. The two versions' clients are distinct generated types with
/// the same shape.
macro_rules! listed {
    ($name:ident, $version:ident) => {
        async fn $name(address: &str, token: Option<&str>) -> Vec<String> {
            use tonic_reflection::pb::$version::ServerReflectionRequest;
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            let mut request =
                tonic::Request::new(futures::stream::iter([ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(MessageRequest::ListServices(String::new())),
                }]));
            if let Some(token) = token {
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {token}").parse().expect("ascii"),
                );
            }
            let mut answers = ServerReflectionClient::new(channel(address).await)
                .server_reflection_info(request)
                .await
                .expect(concat!("reflection ", stringify!($version), " answers"))
                .into_inner();
            match answers
                .message()
                .await
                .expect("answer")
                .map(|a| a.message_response)
            {
                Some(Some(MessageResponse::ListServicesResponse(list))) => {
                    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
                    names.sort();
                    names
                }
                other => panic!("unexpected reflection answer: {other:?}"),
            }
        }
    };
}

listed!(listed_v1, v1);
listed!(listed_v1alpha, v1alpha);

#[tokio::test]
async fn reflection_lists_only_what_each_address_serves_in_both_versions() {
    let credentials = crate::credentials::Credentials::new();
    let config = credentials.serve_config();
    let server = Server::start_with(&["--config", config.to_str().expect("utf-8")]).await;
    let gateway = server
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let public = [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "plinth.v1.AdapterService",
        "plinth.v1.BuildService",
        "plinth.v1.EnvironmentService",
        "plinth.v1.FileService",
        "plinth.v1.HarnessService",
        "plinth.v1.SessionService",
        "plinth.v1.TaskService",
        "plinth.v1.UsageService",
    ];
    assert_eq!(listed_v1(&gateway, None).await, public);
    assert_eq!(listed_v1alpha(&gateway, None).await, public);
    // An internal service's method is not served on the gateway's address.
    let mut catalog = plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient::new(
        channel(&gateway).await,
    );
    let refused = catalog
        .list_environments(plinth_proto::catalog::v1::ListEnvironmentsRequest {
            scope: "default".into(),
            ..Default::default()
        })
        .await
        .expect_err("internal RPC on the public address");
    assert_eq!(refused.code(), tonic::Code::Unimplemented);

    let observer = credentials.token(plinth_kit::auth::Role::Observer);
    let node = server.node_addr().to_string();
    for listed in [
        listed_v1(&node, Some(observer)).await,
        listed_v1alpha(&node, Some(observer)).await,
    ] {
        assert!(
            listed
                .iter()
                .any(|name| name == "plinth.node.v1.NodeService"),
            "{listed:?}"
        );
        assert!(
            !listed
                .iter()
                .any(|name| name.starts_with("plinth.catalog.")
                    || name.starts_with("plinth.source.")),
            "the node's port lists services it does not serve: {listed:?}"
        );
    }
    let source = server.source_addr().to_string();
    let listed = listed_v1alpha(&source, Some(observer)).await;
    assert!(
        listed
            .iter()
            .any(|name| name == "plinth.source.v1.SourceService")
            && !listed
                .iter()
                .any(|name| name.starts_with("plinth.catalog.")),
        "{listed:?}"
    );
    server.stop().await;
}

/// The `buf` program: `PLINTH_TEST_BUF` (`.ci/run` installs `@bufbuild/buf` from npm and sets
/// it), else `buf` on `PATH`. `None` when neither runs; under CI that fails the test.
fn buf() -> Option<std::path::PathBuf> {
    crate::helpers::tool("PLINTH_TEST_BUF", "buf", "npm install @bufbuild/buf@1.75.0")
}

#[tokio::test]
async fn buf_curl_lists_the_plinth_methods_over_both_reflection_versions() {
    let Some(buf) = buf() else {
        return;
    };
    let server = Server::start().await;
    let base = server.base.trim_end_matches('/').to_owned();
    for version in ["grpc-v1", "grpc-v1alpha"] {
        // tokio's process: the server answers on this test's runtime, which must not block.
        let listed = async |what: &str| {
            let output = tokio::process::Command::new(&buf)
                .args([
                    "curl",
                    "--protocol",
                    "grpc",
                    "--http2-prior-knowledge",
                    "--reflect-protocol",
                    version,
                    what,
                    &base,
                ])
                .output()
                .await
                .expect("buf runs");
            assert!(
                output.status.success(),
                "buf curl {what} over {version} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).expect("utf-8")
        };
        let services = listed("--list-services").await;
        let services: Vec<&str> = services.lines().collect();
        for service in [
            "plinth.v1.EnvironmentService",
            "plinth.v1.FileService",
            "plinth.v1.SessionService",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(services.contains(&service), "{version}: {services:?}");
        }
        let methods = listed("--list-methods").await;
        let methods: Vec<&str> = methods.lines().collect();
        for method in [
            "plinth.v1.EnvironmentService/CreateEnvironment",
            "plinth.v1.FileService/ImportGit",
            "plinth.v1.BuildService/ReadBuildLog",
            "plinth.v1.SessionService/Exec",
            "plinth.v1.UsageService/GetUsage",
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(methods.contains(&method), "{version}: {methods:?}");
        }
        // Every listed service's methods are listed: each was described.
        for service in &services {
            assert!(
                methods
                    .iter()
                    .any(|method| method.starts_with(&format!("{service}/"))),
                "{version}: {service} is listed but not described: {methods:?}"
            );
        }
    }
    server.stop().await;
}

/// `async fn $name(address)`: on one reflection `$version` stream, a lookup of an unknown
/// symbol, then of a known one, then the list: the first is answered with an error response,
/// the others with their answers, and every listed service is then described on that stream.
macro_rules! lookups {
    ($name:ident, $version:ident) => {
        async fn $name(address: &str) {
            use tonic_reflection::pb::$version::ServerReflectionRequest;
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            let version = stringify!($version);
            let (requests, outgoing) = futures::channel::mpsc::unbounded();
            let ask = |request: MessageRequest| ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            };
            let mut answers = ServerReflectionClient::new(channel(address).await)
                .server_reflection_info(outgoing)
                .await
                .expect("reflection answers")
                .into_inner();
            let mut next = async |request: MessageRequest| {
                requests.unbounded_send(ask(request)).expect("stream open");
                answers
                    .message()
                    .await
                    .unwrap_or_else(|status| panic!("{version}: the stream ended: {status:?}"))
                    .unwrap_or_else(|| panic!("{version}: the stream ended"))
                    .message_response
            };
            match next(MessageRequest::FileContainingSymbol(
                "plinth.v1.NoSuchService".into(),
            ))
            .await
            {
                Some(MessageResponse::ErrorResponse(error)) => {
                    assert_eq!(error.error_code, tonic::Code::NotFound as i32, "{version}");
                    assert!(
                        error.error_message.contains("plinth.v1.NoSuchService"),
                        "{version}: {error:?}"
                    );
                }
                other => panic!("{version}: expected an error response, got {other:?}"),
            }
            match next(MessageRequest::FileContainingSymbol(
                "plinth.v1.FileService".into(),
            ))
            .await
            {
                Some(MessageResponse::FileDescriptorResponse(files)) => {
                    assert_eq!(files.file_descriptor_proto.len(), 1, "{version}");
                }
                other => panic!("{version}: expected a file descriptor, got {other:?}"),
            }
            match next(MessageRequest::FileByFilename("no/such.proto".into())).await {
                Some(MessageResponse::ErrorResponse(error)) => {
                    assert_eq!(error.error_code, tonic::Code::NotFound as i32, "{version}");
                }
                other => panic!("{version}: expected an error response, got {other:?}"),
            }
            let services = match next(MessageRequest::ListServices(String::new())).await {
                Some(MessageResponse::ListServicesResponse(list)) => list.service,
                other => panic!("{version}: expected the list, got {other:?}"),
            };
            assert!(services.len() > 3, "{version}: {services:?}");
            for service in services {
                match next(MessageRequest::FileContainingSymbol(service.name.clone())).await {
                    Some(MessageResponse::FileDescriptorResponse(_)) => {}
                    other => panic!(
                        "{version}: {} is listed, not described: {other:?}",
                        service.name
                    ),
                }
            }
        }
    };
}

lookups!(lookups_v1, v1);
lookups!(lookups_v1alpha, v1alpha);

#[tokio::test]
async fn a_failed_reflection_lookup_answers_that_request_and_the_stream_goes_on() {
    let server = Server::start().await;
    let gateway = server
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    lookups_v1(&gateway).await;
    lookups_v1alpha(&gateway).await;
    server.stop().await;
}
