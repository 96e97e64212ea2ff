//! A client generated from the served OpenAPI document, by a generator people use
//! (`openapi-python-client`, from PyPI; `.ci/run` installs it with the client's runtime
//! dependencies), runs the walk-through (`docs/guide/walkthrough.md`) against a real server:
//! create an environment, write its files, build, wait until ready, start a session, run a
//! command, read a file, end the session. The generated client parses every answer with the
//! document's schemas, so a field the document gets wrong (a type, a nullability, a missing status)
//! fails here as it would for a user. Nothing is fetched from the network during the test.

use std::path::Path;
use std::process::Command;

use crate::helpers::{Server, can_build, send};

/// The walk-through, written against the generated package `plinth_client`.
const WALK_THROUGH: &str = r#"
import io
import os
import sys
import time

import httpx

from plinth_client import AuthenticatedClient
from plinth_client.api.builds import get_build, start_build
from plinth_client.api.environments import create_environment, list_environments
from plinth_client.api.files import read_file, write_file
from plinth_client.api.sessions import create_session, end_session, exec_, read_session_file
from plinth_client.models import (
    BuildRecord,
    CreateEnvironment,
    CreateSession,
    EnvironmentBody,
    EnvironmentList,
    ExecBody,
    ExecResultBody,
    SessionBody,
    StartBuild,
)
from plinth_client.types import File


def expect(answer, kind, status):
    if answer.status_code != status or not isinstance(answer.parsed, kind):
        sys.exit(f"expected {status} {kind.__name__}, got {answer.status_code}: {answer.content!r}")
    return answer.parsed


client = AuthenticatedClient(
    base_url=os.environ["PLINTH_URL"],
    token=os.environ["PLINTH_TOKEN"],
    raise_on_unexpected_status=True,
    timeout=httpx.Timeout(120.0),
)

environment = expect(
    create_environment.sync_detailed(
        client=client,
        body=CreateEnvironment(name="Content Studio", entry="python3 run.py --episode <id>"),
    ),
    EnvironmentBody,
    201,
)
print("environment", environment.id, environment.mount)
listed = expect(list_environments.sync_detailed(client=client, limit=10), EnvironmentList, 200)
assert [e.id for e in listed.data] == [environment.id], listed
assert listed.has_more is False and listed.next_ is None, listed

source = b"import sys\nprint('teaser-' + sys.argv[-1] + '.mp4')\n"
written = write_file.sync_detailed(
    environment.id,
    "run.py",
    client=client,
    body=File(payload=io.BytesIO(source), mime_type="application/octet-stream"),
)
assert written.status_code == 200, written.content
read_back = read_file.sync_detailed(environment.id, "run.py", client=client)
assert read_back.status_code == 200 and read_back.content == source, read_back.content
assert read_back.headers["etag"].startswith('"sha256:'), read_back.headers

build = expect(
    start_build.sync_detailed(environment.id, client=client, body=StartBuild()),
    BuildRecord,
    202,
)
deadline = time.monotonic() + 300
while build.status == "building":
    if time.monotonic() > deadline:
        sys.exit(f"build {build.version} still {build.status}")
    time.sleep(0.5)
    build = expect(get_build.sync_detailed(environment.id, build.version, client=client), BuildRecord, 200)
if build.status != "ready":
    sys.exit(f"build {build.version} ended {build.status}: {build.error}\n{build.log}")
print("built", build.version)

session = expect(
    create_session.sync_detailed(client=client, body=CreateSession(environment=environment.id)),
    SessionBody,
    201,
)
result = expect(
    exec_.sync_detailed(
        session.id,
        client=client,
        body=ExecBody(command="python3 $PROJECT_ROOT/run.py --episode 12 > out.txt && cat out.txt"),
    ),
    ExecResultBody,
    200,
)
assert result.exit_code == 0, result
print("exec", result.stdout.strip())
out = read_session_file.sync_detailed(session.id, "out.txt", client=client)
assert out.status_code == 200, out.content
print("read", out.content.decode().strip())
ended = expect(end_session.sync_detailed(session.id, client=client), SessionBody, 200)
print("ended", ended.status)
"#;

/// Runs `program` with `args`; `None` when it is not installed (a failure under CI).
fn run(
    program: &str,
    args: &[&str],
    dir: &Path,
    envs: &[(&str, &str)],
) -> Option<std::process::Output> {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(envs.iter().copied())
        .output();
    match output {
        Ok(output) => Some(output),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => panic!("{program}: {error}"),
    }
}

fn missing(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is not installed (python3 -m pip install openapi-python-client httpx attrs python-dateutil)"
    );
    eprintln!("{what} is not installed: skipping (CI runs it)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_client_runs_the_walk_through() {
    if !can_build() {
        return;
    }
    let server = Server::start_with_tokens(&[("tok-python", "python")], &[]).await;
    let (status, doc) = send(server.client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("openapi.json"), doc.to_string()).expect("write");
    // A file read answers whatever type its name suggests, documented as `*/*`; the generator
    // is told to treat that as bytes.
    std::fs::write(
        dir.path().join("generator.yaml"),
        "content_type_overrides:\n  \"*/*\": application/octet-stream\n",
    )
    .expect("write");

    let Some(generated) = run(
        "openapi-python-client",
        &[
            "generate",
            "--path",
            "openapi.json",
            "--config",
            "generator.yaml",
            "--meta",
            "none",
            "--output-path",
            "plinth_client",
        ],
        dir.path(),
        &[],
    ) else {
        missing("openapi-python-client");
        return;
    };
    assert!(
        generated.status.success() && dir.path().join("plinth_client/client.py").exists(),
        "generation failed:\n{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );
    let warnings = String::from_utf8_lossy(&generated.stdout).into_owned()
        + &String::from_utf8_lossy(&generated.stderr);
    assert!(
        !warnings.contains("Warning") && !warnings.contains("Error"),
        "the generator could not read every part of the document:\n{warnings}"
    );
    std::fs::write(dir.path().join("walk_through.py"), WALK_THROUGH).expect("write");

    let base = server.url("");
    let walked = run(
        "python3",
        &["walk_through.py"],
        dir.path(),
        &[
            ("PYTHONPATH", &dir.path().display().to_string()),
            ("PLINTH_URL", base.trim_end_matches('/')),
            ("PLINTH_TOKEN", "tok-python"),
        ],
    )
    .expect("python3 runs");
    let said = String::from_utf8_lossy(&walked.stdout);
    let complained = String::from_utf8_lossy(&walked.stderr);
    if complained.contains("No module named 'httpx'")
        || complained.contains("No module named 'attrs'")
    {
        missing("the generated client's dependencies (httpx, attrs, python-dateutil)");
        return;
    }
    assert!(
        walked.status.success(),
        "the walk-through failed:\n{said}{complained}"
    );
    assert!(said.contains("exec teaser-12.mp4"), "{said}");
    assert!(said.contains("read teaser-12.mp4"), "{said}");
    assert!(said.contains("ended ended"), "{said}");
    server.stop().await;
}

/// What generated clients and Schemathesis rely on, checked on the served document: bytes are
/// binary strings, the streamed exec answer has its event schema, the adapters' credentials are
/// their own schemes, and every operation names the answers the edge can give before its
/// handler runs (400, 401 with `WWW-Authenticate`, 500, 503 with `Retry-After`).
#[tokio::test]
async fn the_document_describes_bytes_streams_credentials_and_edge_answers() {
    let server = Server::start().await;
    let (status, doc) = send(server.client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    let paths = &doc["paths"];
    let write = &paths["/v1/environments/{id}/files/{path}"]["put"]["requestBody"]["content"]["application/octet-stream"]
        ["schema"];
    assert_eq!(write["type"], "string", "{write}");
    assert_eq!(write["format"], "binary", "{write}");
    let read = &paths["/v1/environments/{id}/files/{path}"]["get"]["responses"]["200"];
    assert_eq!(
        read["content"]["*/*"]["schema"]["format"], "binary",
        "{read}"
    );
    assert!(read["headers"].get("ETag").is_some(), "{read}");
    let import = &paths["/v1/environments/{id}/import"]["post"]["requestBody"]["content"];
    assert!(
        import.get("application/json").is_some()
            && import.get("application/octet-stream").is_some(),
        "{import}"
    );
    let exec = &paths["/v1/sessions/{id}/exec"]["post"]["responses"]["200"]["content"];
    assert_eq!(
        exec["application/x-ndjson"]["schema"]["$ref"], "#/components/schemas/ExecEvent",
        "{exec}"
    );
    assert!(doc["components"]["schemas"]["ExecEvent"]["oneOf"].is_array());
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["novoSignature"]["in"], "header", "{schemes}");
    assert_eq!(
        schemes["novoSignature"]["name"], "Novo-Signature",
        "{schemes}"
    );
    assert_eq!(schemes["adapterBearer"]["scheme"], "bearer", "{schemes}");
    assert!(
        paths["/v1/workspace-adapters/{id}/novo"]["post"]["security"][0]
            .get("novoSignature")
            .is_some()
    );
    let mut operations = 0;
    for (path, item) in paths.as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("item") {
            let Some(responses) = operation.get("responses") else {
                continue;
            };
            operations += 1;
            for status in ["400", "500", "503"] {
                assert!(
                    responses.get(status).is_some(),
                    "{method} {path} documents {status}"
                );
            }
            assert!(
                responses["503"]["headers"].get("Retry-After").is_some(),
                "{method} {path}: 503 names Retry-After"
            );
            let bearer = operation["security"]
                .as_array()
                .is_some_and(|security| security.iter().any(|s| s.get("bearer").is_some()));
            if bearer {
                assert!(
                    responses["401"]["headers"]
                        .get("WWW-Authenticate")
                        .is_some(),
                    "{method} {path}: 401 names WWW-Authenticate"
                );
                assert!(
                    responses.get("429").is_some(),
                    "{method} {path} documents 429"
                );
            }
            if path.contains('{') {
                assert!(
                    responses.get("404").is_some(),
                    "{method} {path} documents 404"
                );
            }
        }
    }
    assert!(operations >= 40, "{operations} operations");
    server.stop().await;
}
