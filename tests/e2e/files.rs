//! `/v1/environments/{id}/files`, `/directories` through real HTTP against `plinth serve`:
//! bytes exactly as sent, the path rules on every endpoint, files versus directories, and the
//! size limit decided by bytes received with nothing stored.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, send};

async fn environment(server: &Server, name: &str) -> String {
    let (status, body) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({ "name": name })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

fn files_url(server: &Server, id: &str, path: &str) -> String {
    server.url(&format!("/v1/environments/{id}/files/{path}"))
}

async fn tree(server: &Server, id: &str) -> Vec<(String, String, u64)> {
    let (status, body) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| {
            (
                entry["path"].as_str().expect("path").to_owned(),
                entry["type"].as_str().expect("type").to_owned(),
                entry["size"].as_u64().expect("size"),
            )
        })
        .collect()
}

async fn put(
    server: &Server,
    id: &str,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, Value) {
    send(server.client.put(files_url(server, id, path)).body(body)).await
}

async fn stats(server: &Server, id: &str) -> Value {
    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    environment["files"].clone()
}

#[tokio::test]
async fn every_byte_value_round_trips_exactly_with_a_guessed_type() {
    let server = Server::start().await;
    let id = environment(&server, "Bytes").await;
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(256 * 40).collect();
    let (status, written) = put(&server, &id, "data/all-bytes.bin", every_byte.clone()).await;
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["type"], "file");
    assert_eq!(written["size"], every_byte.len());
    assert_eq!(written["executable"], false);
    assert!(
        written["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:") && d.len() == 71)
    );

    let response = server
        .client
        .get(files_url(&server, &id, "data/all-bytes.bin"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    assert_eq!(
        response.headers()["content-length"],
        every_byte.len().to_string().as_str()
    );
    let etag = response.headers()["etag"]
        .to_str()
        .expect("etag")
        .to_owned();
    assert_eq!(
        etag,
        format!("\"{}\"", written["digest"].as_str().expect("digest"))
    );
    assert_eq!(
        response.bytes().await.expect("body"),
        Bytes::from(every_byte)
    );

    put(&server, &id, "config.json", "{\"a\": 1}").await;
    put(&server, &id, "README.md", "# hi").await;
    put(&server, &id, "empty", Vec::new()).await;
    for (path, content_type, body) in [
        ("config.json", "application/json", &b"{\"a\": 1}"[..]),
        ("README.md", "text/markdown", b"# hi"),
        ("empty", "application/octet-stream", b""),
    ] {
        let response = server
            .client
            .get(files_url(&server, &id, path))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["content-type"], content_type, "{path}");
        assert_eq!(
            response.bytes().await.expect("body").as_ref(),
            body,
            "{path}"
        );
    }
    assert_eq!(
        stats(&server, &id).await,
        json!({"count": 4, "bytes": 10240 + 8 + 4})
    );
    server.stop().await;
}

#[tokio::test]
async fn the_tree_directories_executables_and_deletes_behave_as_documented() {
    let server = Server::start().await;
    let id = environment(&server, "Tree").await;
    let (status, _) = put(&server, &id, "scripts/run.sh", "#!/bin/sh\n").await;
    assert_eq!(status, 200);
    let (status, made_executable) = send(
        server
            .client
            .put(format!(
                "{}?executable=true",
                files_url(&server, &id, "scripts/run.sh")
            ))
            .body("#!/bin/sh\necho\n"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(made_executable["executable"], true);
    let (_, rewritten) = put(&server, &id, "scripts/run.sh", "#!/bin/sh\necho hi\n").await;
    assert_eq!(
        rewritten["executable"], true,
        "a rewrite without the flag keeps the bit"
    );
    put(&server, &id, "scripts/lib/util.py", "x = 1\n").await;

    let (status, dir) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/directories")))
            .json(&json!({"path": "assets/brand"})),
    )
    .await;
    assert_eq!(status, 201, "{dir}");
    assert_eq!(
        dir,
        json!({"path": "assets/brand", "type": "directory", "size": 0})
    );

    assert_eq!(
        tree(&server, &id).await,
        [
            ("assets".to_owned(), "directory".to_owned(), 0),
            ("assets/brand".to_owned(), "directory".to_owned(), 0),
            ("scripts".to_owned(), "directory".to_owned(), 24),
            ("scripts/lib".to_owned(), "directory".to_owned(), 6),
            ("scripts/lib/util.py".to_owned(), "file".to_owned(), 6),
            ("scripts/run.sh".to_owned(), "file".to_owned(), 18),
        ]
    );

    // A directory where a file is, and a file where a directory is: refused, nothing changes.
    let (status, body) = put(&server, &id, "scripts", "not a dir").await;
    assert_error(status, &body, 400, "environment_invalid");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("scripts"),
        "{body}"
    );
    let (status, body) = put(&server, &id, "scripts/run.sh/inner", "x").await;
    assert_error(status, &body, 400, "environment_invalid");
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/directories")))
            .json(&json!({"path": "scripts/run.sh"})),
    )
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    let response = server
        .client
        .get(files_url(&server, &id, "scripts"))
        .send()
        .await
        .expect("request");
    let (status, body) = crate::helpers::json(response).await;
    assert_error(status, &body, 400, "environment_invalid");

    let (status, deleted) = send(server.client.delete(files_url(&server, &id, "scripts"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        deleted,
        json!({"path": "scripts", "deleted": true, "files": 2, "directories": 2})
    );
    let (status, body) = send(server.client.delete(files_url(&server, &id, "scripts"))).await;
    assert_error(status, &body, 404, "environment_not_found");
    let (status, body) = send(server.client.get(files_url(&server, &id, "scripts/run.sh"))).await;
    assert_error(status, &body, 404, "environment_not_found");
    assert_eq!(stats(&server, &id).await, json!({"count": 0, "bytes": 0}));
    server.stop().await;
}

#[tokio::test]
async fn paths_that_escape_or_are_malformed_are_refused_on_every_endpoint() {
    let server = Server::start().await;
    let id = environment(&server, "Paths").await;
    put(&server, &id, "ok.txt", "fine").await;
    let bad = [
        "..%2Fescape",
        "a%2F..%2F..%2Fetc%2Fpasswd",
        "%2Fetc%2Fpasswd",
        "C:%5Cwindows",
        "C:x",
        "a%5C..%5Cb",
        "nul%00byte",
        "a%2F%2Fb",
        "trailing%2F",
        ".%2Fok.txt",
        "line%0Abreak",
    ];
    for path in bad {
        let (status, body) = put(&server, &id, path, "evil").await;
        assert_error(status, &body, 400, "environment_invalid");
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let (status, body) = send(
                server
                    .client
                    .request(method.clone(), files_url(&server, &id, path)),
            )
            .await;
            assert_error(status, &body, 400, "environment_invalid");
        }
    }
    let long = "x/".repeat(600) + "y";
    let (status, body) = put(&server, &id, &long, "deep").await;
    assert_error(status, &body, 400, "environment_invalid");
    for path in ["../up", "/abs", "a\\b", ""] {
        let (status, body) = send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{id}/directories")))
                .json(&json!({ "path": path })),
        )
        .await;
        assert_error(status, &body, 400, "environment_invalid");
    }
    assert_eq!(
        tree(&server, &id).await,
        [("ok.txt".to_owned(), "file".to_owned(), 4)],
        "nothing else landed"
    );
    server.stop().await;
}

#[tokio::test]
async fn files_of_another_scope_or_a_missing_environment_do_not_exist() {
    let server = Server::start_with_tokens(&[("tok-a", "acme"), ("tok-b", "globex")], &[]).await;
    let (_, created) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .bearer_auth("tok-a")
            .json(&json!({"name": "Private"})),
    )
    .await;
    let id = created["id"].as_str().expect("id");
    let (status, _) = send(
        server
            .client
            .put(files_url(&server, id, "secret.txt"))
            .bearer_auth("tok-a")
            .body("mine"),
    )
    .await;
    assert_eq!(status, 200);
    for (method, path) in [
        (reqwest::Method::GET, format!("/v1/environments/{id}/files")),
        (
            reqwest::Method::GET,
            format!("/v1/environments/{id}/files/secret.txt"),
        ),
        (
            reqwest::Method::PUT,
            format!("/v1/environments/{id}/files/secret.txt"),
        ),
        (
            reqwest::Method::DELETE,
            format!("/v1/environments/{id}/files/secret.txt"),
        ),
        (
            reqwest::Method::POST,
            format!("/v1/environments/{id}/import"),
        ),
    ] {
        let (status, body) = send(
            server
                .client
                .request(method.clone(), server.url(&path))
                .bearer_auth("tok-b")
                .body("x"),
        )
        .await;
        assert_error(status, &body, 404, "environment_not_found");
    }
    let response = server
        .client
        .get(files_url(&server, id, "secret.txt"))
        .bearer_auth("tok-a")
        .send()
        .await
        .expect("request");
    assert_eq!(
        response.bytes().await.expect("body").as_ref(),
        b"mine",
        "untouched by the other scope"
    );
    let missing = "henv_0123456789abcdef0123456789abcdef";
    let (status, body) = send(
        server
            .client
            .put(files_url(&server, missing, "a"))
            .bearer_auth("tok-a")
            .body("x"),
    )
    .await;
    assert_error(status, &body, 404, "environment_not_found");
    server.stop().await;
}

#[tokio::test]
async fn a_200_mib_upload_is_refused_at_the_limit_with_nothing_stored() {
    let server = Server::start().await;
    let id = environment(&server, "Big").await;
    put(&server, &id, "small.txt", "kept").await;
    let blobs_before = crate::helpers::files_under(&server.data_dir().join("blobs"));

    const MIB: usize = 1024 * 1024;
    let chunk = Bytes::from(vec![7u8; MIB]);
    let stream =
        futures::stream::iter((0..200).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let outcome = server
        .client
        .put(files_url(&server, &id, "big.bin"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    // The server answers as soon as byte 64 MiB + 1 arrives; the client may still be sending
    // and see the connection close instead of reading the answer. Either way, nothing lands.
    if let Ok(response) = outcome {
        let (status, body) = crate::helpers::json(response).await;
        assert_error(status, &body, 413, "file_too_large");
        assert_eq!(body["error"]["detail"]["max_bytes"], 64 * MIB);
    }
    assert_eq!(
        tree(&server, &id).await,
        [("small.txt".to_owned(), "file".to_owned(), 4)]
    );
    let (status, body) = send(server.client.get(files_url(&server, &id, "big.bin"))).await;
    assert_error(status, &body, 404, "environment_not_found");
    assert_eq!(
        crate::helpers::files_under(&server.data_dir().join("blobs")),
        blobs_before,
        "no blob, no staging left"
    );

    // Exactly at the limit is accepted.
    let exact = vec![1u8; 64 * MIB];
    let (status, body) = put(&server, &id, "exact.bin", exact).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["size"], 64 * MIB);
    server.stop().await;
}

#[tokio::test]
async fn a_corrupted_blob_is_never_served() {
    let server = Server::start().await;
    let id = environment(&server, "Corrupt").await;
    let (_, written) = put(&server, &id, "data.txt", "the real content").await;
    let hex = written["digest"]
        .as_str()
        .expect("digest")
        .trim_start_matches("sha256:")
        .to_owned();
    let blob = server
        .data_dir()
        .join(format!("blobs/blobs/sha256/{}/{hex}", &hex[..2]));
    assert!(blob.exists(), "{} holds the content", blob.display());
    std::fs::write(&blob, "tampered content").expect("tamper");
    let response = server
        .client
        .get(files_url(&server, &id, "data.txt"))
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, 500, "{body}");
    assert!(
        !body.contains("tampered"),
        "corrupt bytes must not be served: {body}"
    );
    assert!(body.contains("\"internal\""), "{body}");
    server.stop().await;
}
