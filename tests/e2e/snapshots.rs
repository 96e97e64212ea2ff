//! The source service's `Snapshot` RPC, as builds will call it: a tree frozen into a blob
//! whose digest names it, deterministic, and untouched by later writes.

use plinth_blobs::{BlobStore, Digest};
use plinth_proto::source::v1::SnapshotRequest;
use plinth_proto::source::v1::source_service_client::SourceServiceClient;
use serde_json::Value;

use crate::helpers::{Server, create_environment, send};

#[tokio::test]
async fn a_snapshot_freezes_the_source_and_later_writes_do_not_change_it() {
    let server = Server::start().await;
    let id = create_environment(&server, "Snap").await;
    let put = |path: &str, body: &'static str| {
        server
            .client
            .put(server.url(&format!(
                "/v1/environments/{id}/files/{path}?executable=true"
            )))
            .body(body)
    };
    send(put("bin/run.sh", "#!/bin/sh\n")).await;
    send(put("data/a.txt", "a")).await;

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.source_addr()))
            .expect("url")
            .connect()
            .await
            .expect("connect");
    let mut source = SourceServiceClient::with_interceptor(
        channel,
        server.interceptor(plinth_kit::auth::Role::Gateway),
    );
    let first = source
        .snapshot(SnapshotRequest {
            environment_id: id.clone(),
        })
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!((first.files, first.bytes), (2, 11));
    let again = source
        .snapshot(SnapshotRequest {
            environment_id: id.clone(),
        })
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(
        again.tree_digest, first.tree_digest,
        "the same source gives the same tree"
    );

    send(put("data/a.txt", "changed")).await;
    let second = source
        .snapshot(SnapshotRequest {
            environment_id: id.clone(),
        })
        .await
        .expect("snapshot")
        .into_inner();
    assert_ne!(second.tree_digest, first.tree_digest);

    // The first tree still reads back exactly as it was frozen.
    let blobs = BlobStore::open(
        &format!("file://{}", server.data_dir().join("blobs").display()),
        server.data_dir().join("spool"),
    )
    .expect("open");
    let digest: Digest = first.tree_digest.parse().expect("digest");
    let bytes = blobs
        .get(&digest)
        .await
        .expect("tree blob")
        .into_bytes()
        .await
        .expect("bytes");
    let tree: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(tree["format"], 1);
    let entries = tree["entries"].as_array().expect("entries");
    let paths: Vec<&str> = entries
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect();
    assert_eq!(paths, ["bin", "bin/run.sh", "data", "data/a.txt"]);
    assert_eq!(entries[1]["mode"], 0o755);
    assert_eq!(entries[3]["size"], 1);
    assert_eq!(entries[3]["digest"], Digest::of(b"a").to_string());
    assert!(
        blobs.contains(&Digest::of(b"a")).await.expect("contains"),
        "the frozen file's blob is kept"
    );
    server.stop().await;
}
