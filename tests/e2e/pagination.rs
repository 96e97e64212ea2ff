//! Every list answers in pages: `?limit=` (default 100, at most 1000) and `?after=` (the
//! previous page's `next`) over REST, `limit`/`after` → `has_more`/`next` over gRPC. A scope
//! with more environments than one 4 MiB gRPC message holds (about 1,500 did not fit) is
//! listed whole, each environment once, in order; a session's turns and an environment's files
//! page the same way, the files through the source service itself.

use std::collections::HashSet;

use futures::StreamExt as _;
use plinth_kit::auth::Role;
use plinth_proto::catalog::v1 as pb;
use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, exec_in, send};

const ENVIRONMENTS: usize = 2500;

async fn get(server: &Server, path: &str) -> (u16, Value) {
    send(server.client.get(server.url(path))).await
}

fn catalog(
    server: &Server,
) -> pb::catalog_service_client::CatalogServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        plinth_kit::grpc::ClientInterceptor,
    >,
> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
            .expect("url")
            .connect_lazy();
    pb::catalog_service_client::CatalogServiceClient::with_interceptor(
        channel,
        server.interceptor(Role::Gateway),
    )
}

/// 2,500 environments with long descriptions: the whole list is ~8 MiB of protobuf, twice
/// what one gRPC message may carry, so only pages can list it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_five_hundred_environments_list_in_pages_over_rest_and_grpc() {
    let config = "[quotas]\nenvironments = 3000\n";
    let server = Server::start_with_config(
        config,
        &[
            "--builders",
            "0",
            "--rate-limit-per-second",
            "0",
            "--rate-limit-burst",
            "0",
        ],
    )
    .await;
    let description = "d".repeat(3000);
    let created: HashSet<String> = futures::stream::iter(0..ENVIRONMENTS)
        .map(|n| {
            let mut client = catalog(&server);
            let description = description.clone();
            async move {
                client
                    .create_environment(pb::CreateEnvironmentRequest {
                        scope: "default".into(),
                        name: format!("env {n:04}"),
                        description,
                        entry: String::new(),
                        install: None,
                    })
                    .await
                    .expect("create")
                    .into_inner()
                    .id
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(created.len(), ENVIRONMENTS);

    // REST, at the largest page: every environment once, oldest first.
    let mut seen: Vec<(i64, String)> = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            None => "/v1/environments?limit=1000".to_owned(),
            Some(next) => format!("/v1/environments?limit=1000&after={next}"),
        };
        let (status, body) = get(&server, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        pages += 1;
        let data = body["data"].as_array().expect("data");
        assert!(data.len() <= 1000);
        for environment in data {
            seen.push((
                environment["createdAt"].as_i64().expect("createdAt"),
                environment["id"].as_str().expect("id").to_owned(),
            ));
        }
        let has_more = body["has_more"].as_bool().expect("has_more");
        assert_eq!(has_more, !body["next"].is_null(), "{}", body["next"]);
        if !has_more {
            break;
        }
        after = Some(body["next"].as_str().expect("next").to_owned());
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), ENVIRONMENTS, "each environment once");
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "oldest first, ties by id"
    );
    let ids: HashSet<String> = seen.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(ids, created);

    // The default page is 100, and it says there is more.
    let (status, body) = get(&server, "/v1/environments").await;
    assert_eq!(status, 200);
    assert_eq!(body["data"].as_array().map(Vec::len), Some(100));
    assert_eq!(body["has_more"], true);
    let (_, second) = get(
        &server,
        &format!(
            "/v1/environments?after={}",
            body["next"].as_str().expect("next")
        ),
    )
    .await;
    assert_eq!(second["data"][0]["id"].as_str(), Some(seen[100].1.as_str()));

    // Limits outside 1–1000 and cursors the list never gave are refused, naming the parameter.
    for (path, field) in [
        ("/v1/environments?limit=0", "limit:"),
        ("/v1/environments?limit=1001", "limit:"),
        ("/v1/environments?limit=many", "query:"),
        ("/v1/environments?after=bm90LWEtY3Vyc29y", "after:"),
        ("/v1/environments?after=%00", "after:"),
    ] {
        let (status, body) = get(&server, path).await;
        assert_error(status, &body, 400, "environment_invalid");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{path}: {message}");
    }

    // gRPC: the same pages, and the old unpaged call no longer has to fit everything.
    let mut client = catalog(&server);
    let mut grpc_seen = Vec::new();
    let mut request = pb::ListEnvironmentsRequest {
        scope: "default".into(),
        limit: 1000,
        after: String::new(),
    };
    loop {
        let page = client
            .list_environments(request.clone())
            .await
            .expect("a page fits one message")
            .into_inner();
        grpc_seen.extend(page.environments.into_iter().map(|e| e.id));
        if !page.has_more {
            assert!(page.next.is_empty());
            break;
        }
        request.after = page.next;
    }
    let rest_order: Vec<String> = seen.into_iter().map(|(_, id)| id).collect();
    assert_eq!(grpc_seen, rest_order);
    let first = client
        .list_environments(pb::ListEnvironmentsRequest {
            scope: "default".into(),
            ..Default::default()
        })
        .await
        .expect("default page")
        .into_inner();
    assert_eq!(first.environments.len(), 100, "0 asks for the default");
    assert!(first.has_more);
    let refused = client
        .list_environments(pb::ListEnvironmentsRequest {
            scope: "default".into(),
            limit: 1001,
            after: String::new(),
        })
        .await
        .expect_err("over the maximum");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

/// Harnesses, an environment's harnesses, its files and its versions page the same way.
#[tokio::test]
async fn harnesses_files_and_versions_are_paged_too() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let (status, environment) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Paged"})),
    )
    .await;
    assert_eq!(status, 201, "{environment}");
    let id = environment["id"].as_str().expect("id").to_owned();
    let mut harnesses = Vec::new();
    for n in 0..5 {
        let (status, harness) = send(
            server
                .client
                .post(server.url("/v1/harnesses"))
                .json(&json!({"name": format!("h{n}"), "base": "codex", "environment": id})),
        )
        .await;
        assert_eq!(status, 201, "{harness}");
        harnesses.push(harness["id"].as_str().expect("id").to_owned());
    }
    for list in [
        "/v1/harnesses".to_owned(),
        format!("/v1/environments/{id}/harnesses"),
    ] {
        let mut seen = Vec::new();
        let mut path = format!("{list}?limit=2");
        loop {
            let (status, body) = get(&server, &path).await;
            assert_eq!(status, 200, "{path}: {body}");
            seen.extend(
                body["data"]
                    .as_array()
                    .expect("data")
                    .iter()
                    .map(|h| h["id"].as_str().expect("id").to_owned()),
            );
            if body["has_more"] == false {
                assert!(body["next"].is_null());
                break;
            }
            path = format!(
                "{list}?limit=2&after={}",
                body["next"].as_str().expect("next")
            );
        }
        assert_eq!(seen, harnesses, "{list}");
    }

    // The source tree: by path, in pages.
    for path in ["b.txt", "a/one.txt", "c.txt"] {
        crate::helpers::put_file(&server, &id, path, "x").await;
    }
    let mut seen = Vec::new();
    let mut path = format!("/v1/environments/{id}/files?limit=2");
    loop {
        let (status, body) = get(&server, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        seen.extend(
            body["data"]
                .as_array()
                .expect("data")
                .iter()
                .map(|entry| entry["path"].as_str().expect("path").to_owned()),
        );
        if body["has_more"] == false {
            break;
        }
        path = format!(
            "/v1/environments/{id}/files?limit=2&after={}",
            body["next"].as_str().expect("next")
        );
    }
    assert_eq!(seen, ["a", "a/one.txt", "b.txt", "c.txt"]);

    // One version (queued: no builder runs); a page of it says there is no more.
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build")))
            .json(&json!({})),
    )
    .await;
    assert!(status == 201 || status == 202, "{status} {body}");
    let (status, body) = get(&server, &format!("/v1/environments/{id}/versions?limit=1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(body["has_more"], false);
    assert!(body["next"].is_null());
    let (status, body) = get(
        &server,
        &format!("/v1/environments/{id}/versions?after=garbage"),
    )
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    server.stop().await;
}

/// Reads every page of a REST list from `list` (which has no query yet) at `limit` items a
/// page, following `next`: the items in the order seen, and how many pages there were.
async fn every_rest_page(server: &Server, list: &str, limit: u32) -> (Vec<Value>, usize) {
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut path = format!("{list}?limit={limit}");
    loop {
        let (status, body) = get(server, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        pages += 1;
        let data = body["data"].as_array().expect("data");
        assert!(data.len() <= limit as usize, "{path}: {body}");
        seen.extend(data.iter().cloned());
        let has_more = body["has_more"].as_bool().expect("has_more");
        assert_eq!(has_more, !body["next"].is_null(), "{path}: {body}");
        if !has_more {
            break;
        }
        let next = body["next"].as_str().expect("next");
        path = format!("{list}?limit={limit}&after={next}");
    }
    (seen, pages)
}

/// A session's turns page over REST and gRPC: 30 turns in pages of 7, every turn once, in
/// order; a cursor from another session's turns is refused.
#[tokio::test]
async fn a_sessions_turns_are_paged_over_rest_and_grpc() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let environment = crate::helpers::built_environment(
        &server,
        "Turned Pages",
        std::time::Duration::from_secs(60),
    )
    .await;
    let session =
        crate::helpers::start_session_with(&server, json!({ "environment": environment })).await;
    let id = session["id"].as_str().expect("id").to_owned();
    let other =
        crate::helpers::start_session_with(&server, json!({ "environment": environment })).await;
    let other = other["id"].as_str().expect("id").to_owned();
    for n in 1..=30 {
        exec_in(&server, &id, json!({ "command": format!("echo {n}") })).await;
    }
    exec_in(&server, &other, json!({ "command": "true" })).await;

    let turns_of = format!("/v1/sessions/{id}/turns");
    let (turns, pages) = every_rest_page(&server, &turns_of, 7).await;
    assert_eq!(pages, 5, "30 turns in pages of 7");
    assert_eq!(
        turns
            .iter()
            .map(|turn| turn["sequence"].as_u64().expect("sequence"))
            .collect::<Vec<_>>(),
        (1..=30).collect::<Vec<_>>(),
        "every turn once, oldest first"
    );
    for (n, turn) in turns.iter().enumerate() {
        assert_eq!(turn["detail"], format!("echo {}", n + 1), "{turn}");
    }
    let (status, whole) = get(&server, &turns_of).await;
    assert_eq!(status, 200);
    assert_eq!(whole["data"].as_array().map(Vec::len), Some(30));
    assert_eq!(whole["has_more"], false, "the default page holds them all");

    // A cursor this list did not hand out: another session's, forged, or a limit out of range.
    let (_, first) = get(&server, &format!("{turns_of}?limit=1")).await;
    let cursor = first["next"].as_str().expect("next").to_owned();
    for path in [
        format!("/v1/sessions/{other}/turns?after={cursor}"),
        format!("{turns_of}?after=bm90LWEtY3Vyc29y"),
        format!("{turns_of}?limit=0"),
        format!("{turns_of}?limit=1001"),
    ] {
        let (status, body) = get(&server, &path).await;
        assert_error(status, &body, 400, "environment_invalid");
    }
    let (status, body) = get(&server, &format!("{turns_of}?offset=3")).await;
    assert_error(status, &body, 400, "environment_invalid");

    // gRPC, as the gateway asks.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.catalog_addr()))
            .expect("url")
            .connect_lazy();
    let mut sessions = pb::session_service_client::SessionServiceClient::with_interceptor(
        channel,
        server.interceptor(Role::Gateway),
    );
    let mut request = pb::ListTurnsRequest {
        scope: "default".into(),
        id: id.clone(),
        limit: 7,
        after: String::new(),
    };
    let mut sequences = Vec::new();
    loop {
        let page = sessions
            .list_turns(request.clone())
            .await
            .expect("page")
            .into_inner();
        assert!(page.turns.len() <= 7);
        sequences.extend(page.turns.iter().map(|turn| turn.sequence));
        if !page.has_more {
            assert!(page.next.is_empty());
            break;
        }
        request.after = page.next;
    }
    assert_eq!(sequences, (1..=30).collect::<Vec<_>>());
    let refused = sessions
        .list_turns(pb::ListTurnsRequest {
            scope: "default".into(),
            id: other,
            limit: 7,
            after: cursor,
        })
        .await
        .expect_err("another session's cursor");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

/// An environment's files page through the source service itself: every file and directory
/// once, in byte order of their paths, and a directory's size counts every file beneath it,
/// those on later pages too.
#[tokio::test]
async fn a_source_tree_is_paged_by_the_source_service() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let id = crate::helpers::create_environment(&server, "Paged Tree").await;
    let mut files = std::collections::BTreeMap::new();
    for n in 0..12 {
        files.insert(format!("src/module_{n:02}.py"), vec![b'x'; n + 1]);
        files.insert(format!("Docs/page {n}.md"), b"# page\n".to_vec());
    }
    files.insert("run.py".to_owned(), b"print('hi')\n".to_vec());
    files.insert("é.txt".to_owned(), b"accent".to_vec());
    let (status, report) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import")))
            .body(crate::helpers::tar_of(&files)),
    )
    .await;
    assert_eq!(status, 200, "{report}");

    let (entries, pages) =
        every_rest_page(&server, &format!("/v1/environments/{id}/files"), 7).await;
    let mut expected: Vec<String> = files.keys().cloned().collect();
    expected.extend(["Docs".to_owned(), "src".to_owned()]);
    expected.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let paths: Vec<String> = entries
        .iter()
        .map(|entry| entry["path"].as_str().expect("path").to_owned())
        .collect();
    assert_eq!(paths, expected, "every entry once, in byte order");
    assert_eq!(pages, expected.len().div_ceil(7));
    let src = entries
        .iter()
        .find(|entry| entry["path"] == "src")
        .expect("src listed");
    assert_eq!(src["size"], (1..=12).sum::<u64>(), "{src}");

    // Over gRPC the same pages; a cursor the tree never gave is refused.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.source_addr()))
            .expect("url")
            .connect_lazy();
    let mut source =
        plinth_proto::source::v1::source_service_client::SourceServiceClient::with_interceptor(
            channel,
            server.interceptor(Role::Gateway),
        );
    let mut request = plinth_proto::source::v1::ListTreeRequest {
        environment_id: id.clone(),
        limit: 7,
        after: String::new(),
        links: false,
        tree: String::new(),
    };
    let mut grpc_paths = Vec::new();
    loop {
        let page = source
            .list_tree(request.clone())
            .await
            .expect("page")
            .into_inner();
        assert!(page.entries.len() <= 7);
        grpc_paths.extend(page.entries.into_iter().map(|entry| entry.path));
        if !page.has_more {
            break;
        }
        request.after = page.next;
    }
    assert_eq!(grpc_paths, expected);
    for (limit, after) in [(1001, ""), (7, "bm90LWEtY3Vyc29y")] {
        let refused = source
            .list_tree(plinth_proto::source::v1::ListTreeRequest {
                environment_id: id.clone(),
                limit,
                after: after.to_owned(),
                links: false,
                tree: String::new(),
            })
            .await
            .expect_err("refused");
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{limit} {after}"
        );
    }
    server.stop().await;
}

/// Every REST list the API document describes (a `GET` answering `{object, data: [...]}`)
/// takes `limit` and `after` and answers `has_more` and `next`: a list added without paging
/// fails here.
#[tokio::test]
async fn every_rest_list_in_the_api_document_is_paged() {
    let server = Server::start_with(&["--builders", "0"]).await;
    let (status, doc) = get(&server, "/openapi.json").await;
    assert_eq!(status, 200);
    let schemas = &doc["components"]["schemas"];
    let mut lists = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let Some(operation) = item.get("get") else {
            continue;
        };
        let reference =
            operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .unwrap_or_default();
        let Some(name) = reference.strip_prefix("#/components/schemas/") else {
            continue;
        };
        let properties = &schemas[name]["properties"];
        if properties["data"]["type"] != "array" || properties["object"].is_null() {
            continue;
        }
        lists.push(path.clone());
        for answered in ["has_more", "next"] {
            assert!(
                properties[answered].is_object(),
                "{path}: {name} lacks {answered}"
            );
        }
        let parameters: Vec<&str> = operation["parameters"]
            .as_array()
            .map(|parameters| {
                parameters
                    .iter()
                    .filter(|p| p["in"] == "query")
                    .filter_map(|p| p["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        for taken in ["limit", "after"] {
            assert!(parameters.contains(&taken), "{path} does not take {taken}");
        }
    }
    for expected in [
        "/v1/environments",
        "/v1/harnesses",
        "/v1/environments/{id}/harnesses",
        "/v1/environments/{id}/files",
        "/v1/environments/{id}/versions",
        "/v1/sessions/{id}/turns",
    ] {
        assert!(
            lists.iter().any(|path| path == expected),
            "{expected} not found among {lists:?}"
        );
    }
    server.stop().await;
}
