//! `/v1/environments/{id}/files`, `/directories` through real HTTP against `plinth serve`:
//! bytes exactly as sent, the path rules on every endpoint, files versus directories, and the
//! size limit decided by bytes received with nothing stored.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, assert_error_in, create_environment, send};

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
    let id = create_environment(&server, "Bytes").await;
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
    let id = create_environment(&server, "Tree").await;
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

    // A directory where a file is, and a file where a directory is: `409 conflict` (the
    // request is well formed; what is there is in the way), nothing changes.
    let (status, body) = put(&server, &id, "scripts", "not a dir").await;
    assert_error(status, &body, 409, "conflict");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("scripts"),
        "{body}"
    );
    for (case, request) in [
        (
            "a file beneath a file",
            server
                .client
                .put(files_url(&server, &id, "scripts/run.sh/inner"))
                .body("x"),
        ),
        (
            "a directory where a file is",
            server
                .client
                .post(server.url(&format!("/v1/environments/{id}/directories")))
                .json(&json!({"path": "scripts/run.sh"})),
        ),
        (
            "a directory read as a file",
            server.client.get(files_url(&server, &id, "scripts")),
        ),
    ] {
        let (status, body) = send(request).await;
        assert_error_in(case, status, &body, 409, "conflict");
    }

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
    let id = create_environment(&server, "Paths").await;
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
    let id = create_environment(&server, "Big").await;
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
    let id = create_environment(&server, "Corrupt").await;
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

/// The `ETag` header of an answer.
fn etag_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("etag")
        .and_then(|value| value.to_str().ok())
        .expect("an ETag")
        .to_owned()
}

#[tokio::test]
async fn conditional_reads_answer_304_and_stale_conditional_writes_change_nothing() {
    let server = Server::start().await;
    let id = create_environment(&server, "Conditional").await;
    let url = files_url(&server, &id, "notes.txt");

    // A write answers the new tag: the content digest in quotes.
    let written = server
        .client
        .put(&url)
        .body("one")
        .send()
        .await
        .expect("put");
    assert_eq!(written.status(), 200);
    let first = etag_of(&written);
    let body: Value = written.json().await.expect("json");
    assert_eq!(
        first,
        format!("\"{}\"", body["digest"].as_str().expect("digest"))
    );

    // A read whose tag the caller holds is 304 with the tag and no body, for the tag, a
    // weak form of it, a list naming it, and `*`.
    let weak = format!("W/{first}");
    let list = format!("\"sha256:{}\", {first}", "0".repeat(64));
    for held in [first.as_str(), weak.as_str(), list.as_str(), "*"] {
        let answer = server
            .client
            .get(&url)
            .header("if-none-match", held)
            .send()
            .await
            .expect("get");
        assert_eq!(answer.status(), 304, "{held}");
        assert_eq!(etag_of(&answer), first);
        assert!(answer.bytes().await.expect("body").is_empty());
    }
    let stale_tag = format!("\"sha256:{}\"", "0".repeat(64));
    let answer = server
        .client
        .get(&url)
        .header("if-none-match", &stale_tag)
        .send()
        .await
        .expect("get");
    assert_eq!(answer.status(), 200);
    assert_eq!(etag_of(&answer), first);
    assert_eq!(answer.text().await.expect("body"), "one");

    // A write with the tag read is written, and answers the new tag.
    let second = server
        .client
        .put(&url)
        .header("if-match", &first)
        .body("two")
        .send()
        .await
        .expect("put");
    assert_eq!(second.status(), 200);
    let second_tag = etag_of(&second);
    assert_ne!(second_tag, first);

    // A second writer still holding the first tag is refused, is told the tag now, and the
    // file is unchanged: no lost update.
    let refused = server
        .client
        .put(&url)
        .header("if-match", &first)
        .body("lost update")
        .send()
        .await
        .expect("put");
    assert_eq!(refused.status(), 412);
    assert_eq!(etag_of(&refused), second_tag);
    let (status, body) = crate::helpers::json(refused).await;
    assert_error(status, &body, 412, "precondition_failed");
    assert_eq!(
        body["error"]["detail"]["etag"],
        second_tag.as_str(),
        "{body}"
    );
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("changed since you read it") && message.contains(&second_tag),
        "{message}"
    );
    let now = server.client.get(&url).send().await.expect("get");
    assert_eq!(etag_of(&now), second_tag);
    assert_eq!(now.text().await.expect("body"), "two");

    // `If-Match` on a file that is not there is refused, and makes nothing.
    let absent = files_url(&server, &id, "absent.txt");
    let (status, body) = send(
        server
            .client
            .put(&absent)
            .header("if-match", &second_tag)
            .body("x"),
    )
    .await;
    assert_error(status, &body, 412, "precondition_failed");
    assert_eq!(body["error"]["detail"]["etag"], Value::Null, "{body}");
    let (status, _) = send(server.client.get(&absent)).await;
    assert_eq!(status, 404);

    // `If-None-Match: *` creates only.
    let (status, body) = send(
        server
            .client
            .put(&url)
            .header("if-none-match", "*")
            .body("clobber"),
    )
    .await;
    assert_error(status, &body, 412, "precondition_failed");
    assert_eq!(
        body["error"]["detail"]["etag"],
        second_tag.as_str(),
        "{body}"
    );
    let now = server.client.get(&url).send().await.expect("get");
    assert_eq!(now.text().await.expect("body"), "two");
    let fresh = files_url(&server, &id, "fresh.txt");
    let (status, body) = send(
        server
            .client
            .put(&fresh)
            .header("if-none-match", "*")
            .body("new"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(
        server
            .client
            .put(&fresh)
            .header("if-none-match", "*")
            .body("newer"),
    )
    .await;
    assert_error(status, &body, 412, "precondition_failed");
    let now = server.client.get(&fresh).send().await.expect("get");
    assert_eq!(now.text().await.expect("body"), "new");

    // A tag without its quotes is a mistake, said so, rather than a condition ignored.
    let (status, body) = send(
        server
            .client
            .put(&url)
            .header("if-match", second_tag.trim_matches('"'))
            .body("x"),
    )
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    let now = server.client.get(&url).send().await.expect("get");
    assert_eq!(now.text().await.expect("body"), "two");
}

#[tokio::test]
async fn ranged_reads_answer_206_with_the_bytes_asked_for_and_416_past_the_end() {
    let server = Server::start().await;
    let id = create_environment(&server, "Ranges").await;
    // Past the source's 1 MiB messages, so ranges cross their boundaries.
    let content: Vec<u8> = (0..3 * 1024 * 1024 + 17)
        .map(|i: u32| (i % 251) as u8)
        .collect();
    let size = content.len();
    let (status, body) = put(&server, &id, "data.bin", content.clone()).await;
    assert_eq!(status, 200, "{body}");
    let url = files_url(&server, &id, "data.bin");

    let whole = server.client.get(&url).send().await.expect("get");
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    let tag = etag_of(&whole);
    assert_eq!(whole.bytes().await.expect("body"), content);

    let mebibyte = 1024 * 1024;
    let cases = [
        ("bytes=10-19".to_owned(), 10, 19),
        (
            format!("bytes={}-{}", mebibyte - 5, mebibyte + 5),
            mebibyte - 5,
            mebibyte + 5,
        ),
        (format!("bytes={}-", size - 100), size - 100, size - 1),
        ("bytes=-7".to_owned(), size - 7, size - 1),
        (
            format!("bytes={}-{}", size - 3, size + 1000),
            size - 3,
            size - 1,
        ),
        ("bytes=0-0".to_owned(), 0, 0),
    ];
    for (range, first, last) in cases {
        let part = server
            .client
            .get(&url)
            .header("range", &range)
            .send()
            .await
            .expect("get");
        assert_eq!(part.status(), 206, "{range}");
        assert_eq!(
            part.headers()["content-range"],
            format!("bytes {first}-{last}/{size}").as_str(),
            "{range}"
        );
        assert_eq!(etag_of(&part), tag);
        assert_eq!(
            part.bytes().await.expect("body"),
            &content[first..=last],
            "{range}"
        );
    }

    // Past the end: 416, with the size.
    let past = server
        .client
        .get(&url)
        .header("range", format!("bytes={size}-"))
        .send()
        .await
        .expect("get");
    assert_eq!(past.status(), 416);
    assert_eq!(
        past.headers()["content-range"],
        format!("bytes */{size}").as_str()
    );
    let (status, body) = crate::helpers::json(past).await;
    assert_error(status, &body, 416, "range_not_satisfiable");

    // Several ranges, or an If-Range naming another version: the whole file.
    let stale = format!("\"sha256:{}\"", "0".repeat(64));
    for (range, if_range) in [
        ("bytes=0-1,5-6", None),
        ("bytes=100-", Some(stale.as_str())),
    ] {
        let mut request = server.client.get(&url).header("range", range);
        if let Some(if_range) = if_range {
            request = request.header("if-range", if_range);
        }
        let answer = request.send().await.expect("get");
        assert_eq!(answer.status(), 200, "{range}");
        assert_eq!(answer.bytes().await.expect("body").len(), size);
    }
    let fresh = server
        .client
        .get(&url)
        .header("range", "bytes=100-")
        .header("if-range", &tag)
        .send()
        .await
        .expect("get");
    assert_eq!(fresh.status(), 206);
    assert_eq!(fresh.bytes().await.expect("body"), &content[100..]);
}

#[tokio::test]
async fn curl_resumes_a_cut_off_download_of_a_5_mib_file_byte_for_byte() {
    let server = Server::start().await;
    let id = create_environment(&server, "Resume").await;
    let mut content = Vec::with_capacity(5 * 1024 * 1024);
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    while content.len() < 5 * 1024 * 1024 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        content.extend_from_slice(&state.to_le_bytes());
    }
    let (status, body) = put(&server, &id, "big/model.bin", content.clone()).await;
    assert_eq!(status, 200, "{body}");

    // A download cut off part way: the first 2,000,001 bytes are on disk.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("model.bin");
    std::fs::write(&file, &content[..2_000_001]).expect("partial file");
    // The server runs on this test's runtime: curl waits on a blocking thread.
    let url = files_url(&server, &id, "big/model.bin");
    let target = file.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "--silent",
                "--show-error",
                "--fail",
                "--continue-at",
                "-",
                "--output",
            ])
            .arg(&target)
            .arg(&url)
            .output()
    })
    .await
    .expect("curl's thread")
    .expect("curl runs");
    assert!(
        output.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let downloaded = std::fs::read(&file).expect("downloaded file");
    assert_eq!(downloaded.len(), content.len());
    assert!(downloaded == content, "the resumed file differs");
}
