//! Real public projects through the whole path, as their registries serve them: a Python
//! sdist from PyPI (`pip download --no-binary :all: --no-deps`) and an npm tarball (`npm pack`) are imported as archives, built with the
//! installers reaching the real registries (through the builds' egress proxy), rebuilt after a
//! one-file change, and run from a session.
//!
//! The archives are fetched by a build too (its `setup.sh`), so that everything this test sends
//! beyond loopback goes through a build's egress proxy, as a tenant's would. This test needs
//! the public registries: under CI, which reaches them, it runs; it is never skipped there.

use std::time::Duration;

use plinth_blobs::BlobStore;
use plinth_blobs::tree::Tree;
use serde_json::{Value, json};

use crate::helpers::{Server, build_ready, create_environment, exec_in, put_file, send};

const LIMIT: Duration = Duration::from_secs(300);

/// Fetches the two archives from their registries into the fetching build's layer.
const FETCH: &str = r#"set -e
mkdir -p dl
python3 -m pip download --no-deps --no-binary :all: packaging==24.1 -d dl
npm pack picocolors@1.1.1 --pack-destination dl
ls -l dl
"#;

async fn build(server: &Server, id: &str, version: u64) -> Value {
    build_ready(server, id, version, LIMIT).await
}

/// A file of a version's layer, read from the blob store as a node reads it.
async fn layer_file(server: &Server, id: &str, version: u32, path: &str) -> Vec<u8> {
    let blobs = BlobStore::open(
        &format!("file://{}", server.data_dir().join("blobs").display()),
        server.data_dir().join("spool"),
    )
    .expect("open");
    let tree = blobs
        .get(&server.layer(id, version).await)
        .await
        .expect("tree")
        .into_bytes()
        .await
        .expect("bytes");
    let tree = Tree::decode(&tree).expect("decode");
    let entry = tree
        .entries
        .iter()
        .find(|entry| entry.path == path)
        .unwrap_or_else(|| panic!("{path} is not in the layer"));
    blobs
        .get(&entry.file_digest().expect("a file"))
        .await
        .expect("blob")
        .into_bytes()
        .await
        .expect("bytes")
        .to_vec()
}

/// Runs `command` in a new session of `id`; answers the exec's result.
async fn run(server: &Server, id: &str, command: &str) -> Value {
    let session = crate::helpers::start_session_with(server, json!({ "environment": id })).await;
    let session_id = session["id"].as_str().expect("session id");

    exec_in(
        server,
        session_id,
        json!({ "command": command, "timeout_ms": 60_000 }),
    )
    .await
}

/// Imports `archive`, builds it, changes one file, rebuilds, and runs `smoke` after each.
async fn project(server: &Server, name: &str, archive: Vec<u8>, changed: &str, smoke: &str) {
    let id = create_environment(server, name).await;
    let (status, imported) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import?replace=true")))
            .body(archive),
    )
    .await;
    assert_eq!(status, 200, "{imported}");
    assert_eq!(imported["stripped_wrapper"], true, "{imported}");
    build(server, &id, 1).await;
    let ran = run(server, &id, smoke).await;
    assert_eq!(ran["exit_code"], 0, "{name}: {ran}");

    put_file(server, &id, changed, "changed by the test\n").await;
    let rebuilt = build(server, &id, 2).await;
    assert!(
        rebuilt["log"]
            .as_str()
            .unwrap_or("")
            .contains("the installers run over them"),
        "{name} v2 reuses its dependencies: {}",
        rebuilt["log"]
    );
    let ran = run(
        server,
        &id,
        &format!("{smoke} && cat $PROJECT_ROOT/{changed}"),
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{name}: {ran}");
    assert!(
        ran["stdout"]
            .as_str()
            .unwrap_or("")
            .ends_with("changed by the test\n"),
        "{ran}"
    );
}

#[tokio::test]
async fn real_projects_from_their_registries_build_rebuild_and_run() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let fetch = create_environment(&server, "Fetch").await;
    put_file(&server, &fetch, "setup.sh", FETCH).await;
    build(&server, &fetch, 1).await;
    let sdist = layer_file(&server, &fetch, 1, "dl/packaging-24.1.tar.gz").await;
    let tarball = layer_file(&server, &fetch, 1, "dl/picocolors-1.1.1.tgz").await;

    // packaging: pyproject.toml with flit_core, no lock: `uv sync` resolves, builds the
    // project editable and installs it.
    project(
        &server,
        "Packaging",
        sdist,
        "README.rst",
        "cd && python -c 'from packaging.version import Version; assert Version(\"1.0rc1\").is_prerelease; print(\"ok\")'",
    )
    .await;
    // picocolors: package.json without a lock: `npm install`.
    project(
        &server,
        "Picocolors",
        tarball,
        "README.md",
        "cd && node -e 'const pc = require(process.env.PROJECT_ROOT); if (typeof pc.green !== \"function\") process.exit(1); console.log(\"ok\")'",
    )
    .await;
}
