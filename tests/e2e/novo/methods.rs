//! Every method Novo dispatches, through the signed endpoint: each answer's fields against
//! the shapes of novo-http-workspace, the documented defaults and the error codes. What a
//! call did is checked through the session's own shell where it matters.

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::Digest as _;

use super::{Novo, adapter, environment, studio_files};
use crate::helpers::{Server, assert_error_in};

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A server with the studio environment built, and a run of a Novo adapter for it.
async fn run(name: &str, flags: &[&str]) -> Option<(Server, Novo, String)> {
    if !crate::helpers::can_build() {
        return None;
    }
    let mut all = vec!["--builder-network", "false"];
    all.extend_from_slice(flags);
    let server = Server::start_with(&all).await;
    let (env, slug) = environment(&server, name, &studio_files()).await;
    let adapter = adapter(&server, &env).await;
    let novo = Novo::new(&server, &adapter, "run_methods");
    Some((server, novo, slug))
}

async fn error(novo: &Novo, method: &str, args: Value, status: u16, code: &str) {
    let (got, body) = novo.call(method, args.clone()).await;
    assert_error_in(&format!("{method} {args}"), got, &body, status, code);
    assert_eq!(keys(&body), ["error"], "{method} {args}: {body}");
}

#[tokio::test]
async fn read_file_answers_line_ranges_text_or_base64() {
    let Some((server, novo, slug)) = run("Read Studio", &[]).await else {
        return;
    };
    let before = now_ms() - 2_000;
    novo.ok(
        "editFile",
        json!({"path": "lines.txt", "operation": "create", "contents": "one\ntwo\nthree\nfour\n"}),
    )
    .await;
    let read = novo.ok("readFile", json!({"path": "lines.txt"})).await;
    let mtime = read["mtimeMs"].as_i64().expect("mtimeMs");
    assert!(mtime >= before && mtime <= now_ms() + 2_000, "{read}");
    assert_eq!(
        read,
        json!({"path": "lines.txt", "content": "one\ntwo\nthree\nfour\n", "encoding": "utf8",
               "bytes": 19, "truncated": false, "mtimeMs": mtime,
               "start_line": 1, "end_line": 4, "total_lines": 4})
    );
    let part = |args: Value| {
        let novo = &novo;
        async move {
            let read = novo.ok("readFile", args).await;
            (
                read["content"].as_str().expect("content").to_owned(),
                read["start_line"].clone(),
                read["end_line"].clone(),
                read["truncated"].clone(),
                read["total_lines"].clone(),
                read["bytes"].clone(),
            )
        }
    };
    assert_eq!(
        part(json!({"path": "lines.txt", "start_line": 2, "end_line": 3})).await,
        (
            "two\nthree\n".into(),
            json!(2),
            json!(3),
            json!(false),
            json!(4),
            json!(19)
        )
    );
    assert_eq!(
        part(json!({"path": "lines.txt", "start_line": 3})).await,
        (
            "three\nfour\n".into(),
            json!(3),
            json!(4),
            json!(false),
            json!(4),
            json!(19)
        )
    );
    assert_eq!(
        part(json!({"path": "lines.txt", "end_line": 1})).await,
        (
            "one\n".into(),
            json!(1),
            json!(1),
            json!(false),
            json!(4),
            json!(19)
        )
    );
    // A byte budget answers whole lines and says the content stops early.
    assert_eq!(
        part(json!({"path": "lines.txt", "max_bytes": 9})).await,
        (
            "one\ntwo\n".into(),
            json!(1),
            json!(2),
            json!(true),
            json!(4),
            json!(19)
        )
    );
    assert_eq!(
        part(json!({"path": "lines.txt", "lines_threshold": 3})).await,
        (
            "one\ntwo\nthree\n".into(),
            json!(1),
            json!(3),
            json!(true),
            json!(4),
            json!(19)
        )
    );
    for args in [
        json!({"path": "lines.txt", "start_line": 9}),
        json!({"path": "lines.txt", "start_line": 3, "end_line": 2}),
        json!({"path": "lines.txt", "max_bytes": "9"}),
        json!({}),
    ] {
        error(&novo, "readFile", args, 400, "workspace_invalid_request").await;
    }

    // UTF-8 text stays text.
    novo.ok(
        "editFile",
        json!({"path": "utf8.txt", "operation": "create", "contents": "héllo wörld\n"}),
    )
    .await;
    let read = novo.ok("readFile", json!({"path": "utf8.txt"})).await;
    assert_eq!(
        (
            read["content"].as_str(),
            read["encoding"].as_str(),
            read["bytes"].as_u64()
        ),
        (Some("héllo wörld\n"), Some("utf8"), Some(14))
    );

    // Binary (a NUL byte, or not UTF-8) is base64 from the first byte, without line fields.
    novo.sh("printf 'GIF\\000\\001\\377' > pic.bin; printf 'caf\\351\\n' > latin1.txt")
        .await;
    let mtime_fields = |read: &Value| read["mtimeMs"].as_i64().expect("mtimeMs");
    let read = novo.ok("readFile", json!({"path": "pic.bin"})).await;
    assert_eq!(
        read,
        json!({"path": "pic.bin", "content": b64(b"GIF\0\x01\xff"), "encoding": "base64",
               "bytes": 6, "truncated": false, "mtimeMs": mtime_fields(&read)})
    );
    let read = novo
        .ok("readFile", json!({"path": "pic.bin", "max_bytes": 2}))
        .await;
    assert_eq!(
        (&read["content"], &read["truncated"], &read["bytes"]),
        (&json!(b64(b"GI")), &json!(true), &json!(6))
    );
    let read = novo.ok("readFile", json!({"path": "latin1.txt"})).await;
    assert_eq!(
        (&read["content"], &read["encoding"]),
        (&json!(b64(b"caf\xe9\n")), &json!("base64"))
    );
    let read = novo
        .ok(
            "readFile",
            json!({"path": format!("/env/{slug}/assets/logo.bin")}),
        )
        .await;
    assert_eq!(read["path"], format!("/env/{slug}/assets/logo.bin"));
    assert_eq!(
        read["content"],
        b64(&[0x89, b'P', b'N', b'G', 0, 1, 2, 0xff])
    );
    assert_eq!(read["encoding"], "base64");

    // A large file: 256 KiB of whole lines by default; the next page starts after end_line.
    novo.sh("seq 1 100000 > big.txt").await;
    let size: usize = (1..=100_000).map(|n: u32| n.to_string().len() + 1).sum();
    let first = novo.ok("readFile", json!({"path": "big.txt"})).await;
    let content = first["content"].as_str().expect("content");
    assert!(
        content.len() <= 256 * 1024 && content.len() > 255 * 1024,
        "{}",
        content.len()
    );
    assert!(content.ends_with('\n'));
    let end = first["end_line"].as_u64().expect("end_line");
    assert_eq!(content.lines().count() as u64, end);
    assert_eq!(
        (
            first["truncated"].clone(),
            first["total_lines"].clone(),
            first["bytes"].clone()
        ),
        (json!(true), json!(100_000), json!(size))
    );
    let next = novo
        .ok(
            "readFile",
            json!({"path": "big.txt", "start_line": end + 1, "end_line": end + 2}),
        )
        .await;
    assert_eq!(next["content"], format!("{}\n{}\n", end + 1, end + 2));

    // Absolute paths beneath the workspace root answer relative paths.
    let root = novo.sh("pwd").await.trim_end().to_owned();
    let read = novo
        .ok("readFile", json!({"path": format!("{root}/lines.txt")}))
        .await;
    assert_eq!(read["path"], "lines.txt");
    let read = novo.ok("readFile", json!({"path": ".//./lines.txt"})).await;
    assert_eq!(read["path"], "lines.txt");
    for (args, status, code) in [
        (
            json!({"path": "./sub/../lines.txt"}),
            400,
            "workspace_path_invalid",
        ),
        (json!({"path": "missing.txt"}), 404, "workspace_not_found"),
    ] {
        error(&novo, "readFile", args, status, code).await;
    }
    novo.sh("mkdir -p dir").await;
    error(
        &novo,
        "readFile",
        json!({"path": "dir"}),
        400,
        "workspace_path_invalid",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn list_and_find_files() {
    let Some((server, novo, slug)) = run("List Studio", &[]).await else {
        return;
    };
    novo.sh("mkdir -p ls/sub src/deep && printf 'aa\\n' > ls/a.txt && printf 'bbb\\n' > ls/sub/b.txt && touch ls/.hidden && ln -s a.txt ls/link").await;
    let listed = novo.ok("listFiles", json!({"path": "ls"})).await;
    assert_eq!(
        listed,
        json!({"root": "ls", "entries": [
            {"path": "ls/a.txt", "type": "file", "bytes": 3},
            {"path": "ls/link", "type": "symlink"},
            {"path": "ls/sub", "type": "directory"}
        ], "truncated": false})
    );
    let listed = novo
        .ok(
            "listFiles",
            json!({"path": "ls", "recursive": true, "include_hidden": true}),
        )
        .await;
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect();
    assert_eq!(
        paths,
        [
            "ls/.hidden",
            "ls/a.txt",
            "ls/link",
            "ls/sub",
            "ls/sub/b.txt"
        ]
    );
    let listed = novo
        .ok("listFiles", json!({"path": "ls", "recursive": true}))
        .await;
    assert_eq!(
        listed["entries"].as_array().expect("entries").len(),
        4,
        "{listed}"
    );
    let listed = novo
        .ok("listFiles", json!({"path": "ls", "max_entries": 2}))
        .await;
    assert_eq!(
        (
            listed["entries"].as_array().map(Vec::len),
            &listed["truncated"]
        ),
        (Some(2), &json!(true))
    );
    // Defaults: the root, not recursive, no hidden names.
    let listed = novo.ok("listFiles", json!({})).await;
    assert_eq!(
        listed,
        json!({"root": ".", "entries": [
            {"path": "ls", "type": "directory"}, {"path": "src", "type": "directory"}
        ], "truncated": false})
    );
    // The environment, by its absolute path.
    let listed = novo
        .ok("listFiles", json!({"path": format!("/env/{slug}")}))
        .await;
    assert_eq!(
        listed,
        json!({"root": format!("/env/{slug}"), "entries": [
            {"path": format!("/env/{slug}/assets"), "type": "directory"},
            {"path": format!("/env/{slug}/studio"), "type": "directory"}
        ], "truncated": false})
    );
    for (args, status, code) in [
        (json!({"path": "ls/a.txt"}), 400, "workspace_path_invalid"),
        (json!({"path": "nowhere"}), 404, "workspace_not_found"),
        (json!({"path": "/etc"}), 400, "workspace_path_invalid"),
    ] {
        error(&novo, "listFiles", args, status, code).await;
    }

    // findFiles: a glob without / matches names at any depth, with / the path below `path`.
    novo.sh("printf 'x = 1\\n' > src/a.py && printf 'y\\n' > src/deep/c.py && printf 'z\\n' > src/b.txt && printf 'ignored.py\\n' > src/.gitignore && touch src/ignored.py").await;
    let found = novo.ok("findFiles", json!({"pattern": "*.py"})).await;
    assert_eq!(keys(&found), ["entries", "pattern", "truncated"]);
    assert_eq!(found["pattern"], "*.py");
    assert_eq!(found["truncated"], false);
    let entries = found["entries"].as_array().expect("entries");
    assert_eq!(
        entries
            .iter()
            .map(|e| e["path"].as_str().expect("path"))
            .collect::<Vec<_>>(),
        ["src/a.py", "src/deep/c.py"]
    );
    assert_eq!(keys(&entries[0]), ["bytes", "mtimeMs", "path"]);
    assert_eq!(entries[0]["bytes"], 6);
    assert!((entries[0]["mtimeMs"].as_i64().expect("mtime") - now_ms()).abs() < 60_000);
    let found = novo
        .ok("findFiles", json!({"pattern": "deep/*.py", "path": "src"}))
        .await;
    assert_eq!(found["entries"][0]["path"], "src/deep/c.py");
    assert_eq!(found["entries"].as_array().map(Vec::len), Some(1));
    let found = novo
        .ok("findFiles", json!({"pattern": "*.py", "max_entries": 1}))
        .await;
    assert_eq!(
        (
            found["entries"].as_array().map(Vec::len),
            &found["truncated"]
        ),
        (Some(1), &json!(true))
    );
    let found = novo
        .ok(
            "findFiles",
            json!({"pattern": "*.py", "path": format!("/env/{slug}")}),
        )
        .await;
    assert_eq!(
        found["entries"][0]["path"],
        format!("/env/{slug}/studio/scale.py")
    );
    assert_eq!(found["entries"].as_array().map(Vec::len), Some(1));
    for args in [json!({"pattern": "a["}), json!({})] {
        error(&novo, "findFiles", args, 400, "workspace_invalid_request").await;
    }
    server.stop().await;
}

#[tokio::test]
async fn search_files_in_a_directory_or_a_single_file() {
    let Some((server, novo, slug)) = run("Search Studio", &[]).await else {
        return;
    };
    novo.ok(
        "editFile",
        json!({"path": "src/a.py", "operation": "create",
        "contents": "import os\ndef alpha():\n    return 'a.b'\ndef beta():\n    return 'axb'\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "src/b.txt", "operation": "create",
        "contents": "Alpha and alpha\nnothing\nALPHA\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "src/deep/c.py", "operation": "create",
        "contents": "def gamma():\n    pass\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "src/.gitignore", "operation": "create", "contents": "ignored.py\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "src/ignored.py", "operation": "create", "contents": "def ignored():\n"}),
    )
    .await;

    let found = novo
        .ok("searchFiles", json!({"pattern": "def \\w+", "path": "src"}))
        .await;
    assert_eq!(
        found,
        json!({"matches": [
            {"path": "src/a.py", "line": 2, "preview": "def alpha():"},
            {"path": "src/a.py", "line": 4, "preview": "def beta():"},
            {"path": "src/deep/c.py", "line": 1, "preview": "def gamma():"}
        ], "truncated": false, "files_searched": 3})
    );
    let lines = |found: &Value| -> Vec<(String, u64)> {
        found["matches"]
            .as_array()
            .expect("matches")
            .iter()
            .map(|m| {
                (
                    m["path"].as_str().expect("path").to_owned(),
                    m["line"].as_u64().expect("line"),
                )
            })
            .collect()
    };
    let a = |line: u64| ("src/a.py".to_owned(), line);
    // Regular expression unless literal.
    let found = novo
        .ok("searchFiles", json!({"pattern": "a.b", "path": "src/a.py"}))
        .await;
    assert_eq!(lines(&found), [a(3), a(5)]);
    assert_eq!(found["files_searched"], 1);
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "a.b", "path": "src/a.py", "literal": true}),
        )
        .await;
    assert_eq!(lines(&found), [a(3)]);
    // A single file, case-insensitive or not.
    let b = |line: u64| ("src/b.txt".to_owned(), line);
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "alpha", "path": "src/b.txt"}),
        )
        .await;
    assert_eq!(lines(&found), [b(1)]);
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "alpha", "path": "src/b.txt", "ignore_case": true}),
        )
        .await;
    assert_eq!(lines(&found), [b(1), b(3)]);
    // Globs.
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "a", "path": "src", "glob": "*.py"}),
        )
        .await;
    assert_eq!(found["files_searched"], 2, "{found}");
    assert!(
        lines(&found).iter().all(|(p, _)| p.ends_with(".py")),
        "{found}"
    );
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "def", "path": "src", "glob": "deep/*.py"}),
        )
        .await;
    assert_eq!(lines(&found), [("src/deep/c.py".to_owned(), 1)]);
    // Context lines, each side.
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "beta", "path": "src/a.py", "context": 1}),
        )
        .await;
    assert_eq!(
        found["matches"],
        json!([{"path": "src/a.py", "line": 4, "preview": "def beta():",
                "before": ["    return 'a.b'"], "after": ["    return 'axb'"]}])
    );
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "import", "path": "src/a.py", "context": 2}),
        )
        .await;
    assert_eq!(found["matches"][0]["before"], json!([]));
    assert_eq!(
        found["matches"][0]["after"],
        json!(["def alpha():", "    return 'a.b'"])
    );
    // limit is per file; max_results across the walk; both say truncated.
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "def", "path": "src", "limit": 1}),
        )
        .await;
    assert_eq!(lines(&found), [a(2), ("src/deep/c.py".to_owned(), 1)]);
    assert_eq!(found["truncated"], true);
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "def", "path": "src", "max_results": 2}),
        )
        .await;
    assert_eq!(lines(&found), [a(2), a(4)]);
    assert_eq!(found["truncated"], true);
    // A match's preview is cut at max_bytes_per_match (500 by default).
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "alpha", "path": "src/b.txt", "max_bytes_per_match": 5}),
        )
        .await;
    assert_eq!(found["matches"][0]["preview"], "Alpha");
    novo.ok("editFile", json!({"path": "long.txt", "operation": "create", "contents": format!("needle{}\n", "x".repeat(1000))})).await;
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "needle", "path": "long.txt"}),
        )
        .await;
    assert_eq!(
        found["matches"][0]["preview"].as_str().map(str::len),
        Some(500)
    );
    // Every default: the whole workspace.
    let found = novo.ok("searchFiles", json!({"pattern": "gamma"})).await;
    assert_eq!(lines(&found), [("src/deep/c.py".to_owned(), 1)]);
    // The environment, by absolute path, answered with absolute paths.
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "scale", "path": format!("/env/{slug}")}),
        )
        .await;
    assert_eq!(lines(&found), [(format!("/env/{slug}/studio/scale.py"), 1)]);
    let found = novo.ok("searchFiles", json!({"pattern": "scale", "path": format!("/env/{slug}/studio/notes.txt"), "ignore_case": true})).await;
    assert_eq!(
        lines(&found),
        [(format!("/env/{slug}/studio/notes.txt"), 1)]
    );
    let found = novo
        .ok("searchFiles", json!({"pattern": "nothing matches this"}))
        .await;
    assert_eq!(
        found,
        json!({"matches": [], "truncated": false, "files_searched": 4})
    );

    for (args, status, code) in [
        (json!({"pattern": "("}), 400, "workspace_invalid_request"),
        (
            json!({"pattern": "a", "glob": "a["}),
            400,
            "workspace_invalid_request",
        ),
        (
            json!({"pattern": "a", "path": "missing"}),
            404,
            "workspace_not_found",
        ),
        (
            json!({"pattern": "a", "path": "/etc"}),
            400,
            "workspace_path_invalid",
        ),
    ] {
        error(&novo, "searchFiles", args, status, code).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn edit_file_operations_and_their_errors() {
    let Some((server, novo, slug)) = run("Edit Studio", &[]).await else {
        return;
    };
    let created = novo
        .ok(
            "editFile",
            json!({"path": "e.txt", "operation": "create", "contents": "alpha\nbeta\nalpha\n"}),
        )
        .await;
    let token = created["rollback_token"]
        .as_str()
        .expect("token")
        .to_owned();
    assert!(token.starts_with("rb_"), "{created}");
    assert_eq!(
        created,
        json!({"path": "e.txt", "dry_run": false, "bytes_written": 17, "created": true, "rollback_token": token})
    );
    let edit = |args: Value| novo.ok("editFile", args);
    let replaced =
        edit(json!({"path": "e.txt", "operation": "replace", "find": "beta", "contents": "BETA"}))
            .await;
    assert_eq!(
        keys(&replaced),
        ["bytes_written", "dry_run", "path", "rollback_token"],
        "modified in place: no created"
    );
    assert_eq!(novo.cat("e.txt").await, "alpha\nBETA\nalpha\n");
    for (args, code) in [
        (
            json!({"path": "e.txt", "operation": "replace", "find": "alpha", "contents": "x"}),
            "workspace_find_not_unique",
        ),
        (
            json!({"path": "e.txt", "operation": "replace", "find": "alpha", "contents": "x", "replace_all": false}),
            "workspace_find_not_unique",
        ),
        (
            json!({"path": "e.txt", "operation": "replace", "find": "zzz", "contents": "x"}),
            "workspace_find_not_found",
        ),
    ] {
        error(&novo, "editFile", args, 409, code).await;
    }
    assert_eq!(novo.cat("e.txt").await, "alpha\nBETA\nalpha\n");
    // replace_all replaces every exact occurrence, and only with replace and a find.
    let all = edit(json!({"path": "e.txt", "operation": "replace", "find": "alpha", "contents": "ALPHA", "replace_all": true})).await;
    assert_eq!(all["bytes_written"], 17);
    assert_eq!(novo.cat("e.txt").await, "ALPHA\nBETA\nALPHA\n");
    for args in [
        json!({"path": "e.txt", "operation": "insert_after", "find": "BETA", "contents": "x", "replace_all": true}),
        json!({"path": "e.txt", "operation": "replace", "contents": "x", "replace_all": true}),
    ] {
        error(&novo, "editFile", args, 400, "workspace_invalid_request").await;
    }
    edit(json!({"path": "e.txt", "operation": "insert_after", "find": "BETA\n", "contents": "gamma\n"})).await;
    edit(
        json!({"path": "e.txt", "operation": "insert_before", "find": "gamma", "contents": "pre-"}),
    )
    .await;
    let appended = edit(json!({"path": "e.txt", "operation": "append", "contents": "end\n"})).await;
    assert_eq!(
        novo.cat("e.txt").await,
        "ALPHA\nBETA\npre-gamma\nALPHA\nend\n"
    );
    assert_eq!(appended["bytes_written"], 31);
    // Without contents, a mutating operation is refused and nothing changes.
    for operation in ["replace", "insert_after", "insert_before", "append"] {
        for args in [
            json!({"path": "e.txt", "operation": operation, "find": "BETA"}),
            json!({"path": "e.txt", "operation": operation, "find": "BETA", "contents": null}),
        ] {
            error(&novo, "editFile", args, 400, "workspace_contents_required").await;
        }
    }
    assert_eq!(
        novo.cat("e.txt").await,
        "ALPHA\nBETA\npre-gamma\nALPHA\nend\n"
    );
    // An explicit "" is a deliberate deletion.
    let deleted =
        edit(json!({"path": "e.txt", "operation": "replace", "find": "pre-", "contents": ""}))
            .await;
    assert!(
        deleted["warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty()),
        "{deleted}"
    );
    assert_eq!(novo.cat("e.txt").await, "ALPHA\nBETA\ngamma\nALPHA\nend\n");
    // dry_run answers what would be written and writes nothing.
    let dry = edit(json!({"path": "e.txt", "operation": "replace", "find": "end", "contents": "THE END", "dry_run": true})).await;
    assert_eq!(
        dry,
        json!({"path": "e.txt", "dry_run": true, "bytes_written": 31})
    );
    let dry =
        edit(json!({"path": "new.txt", "operation": "create", "contents": "n\n", "dry_run": true}))
            .await;
    assert_eq!(
        dry,
        json!({"path": "new.txt", "dry_run": true, "bytes_written": 2, "created": true})
    );
    assert_eq!(novo.cat("e.txt").await, "ALPHA\nBETA\ngamma\nALPHA\nend\n");
    assert_eq!(novo.sh("ls").await, "e.txt\n");
    // create over an existing file overwrites it, says so, and is not "created".
    let over = edit(json!({"path": "e.txt", "operation": "create", "contents": "fresh\n"})).await;
    assert_eq!(
        keys(&over),
        [
            "bytes_written",
            "dry_run",
            "path",
            "rollback_token",
            "warnings"
        ]
    );
    let over_token = over["rollback_token"].as_str().expect("token").to_owned();
    assert_eq!(novo.cat("e.txt").await, "fresh\n");
    // append makes a missing file; create without contents makes an empty one.
    let made =
        edit(json!({"path": "dir/log.txt", "operation": "append", "contents": "first\n"})).await;
    assert_eq!(made["created"], true);
    let empty = edit(json!({"path": "empty.txt", "operation": "create"})).await;
    assert_eq!(
        (&empty["created"], &empty["bytes_written"]),
        (&json!(true), &json!(0))
    );
    // Rollback tokens restore what was there before that edit.
    assert_eq!(
        novo.ok("restore", json!({"token": over_token})).await,
        json!({})
    );
    assert_eq!(novo.cat("e.txt").await, "ALPHA\nBETA\ngamma\nALPHA\nend\n");
    assert_eq!(novo.ok("restore", json!({"token": token})).await, json!({}));
    assert_eq!(
        novo.sh("ls e.txt || echo gone").await,
        "gone\n",
        "restoring a create removes the file"
    );
    for (method, args, status, code) in [
        (
            "restore",
            json!({"token": "rb_00000000000000000000000000000000"}),
            404,
            "workspace_not_found",
        ),
        (
            "restore",
            json!({"token": "../../etc"}),
            404,
            "workspace_not_found",
        ),
        ("restore", json!({}), 400, "workspace_invalid_request"),
        (
            "editFile",
            json!({"path": "missing.txt", "operation": "replace", "find": "a", "contents": "b"}),
            404,
            "workspace_not_found",
        ),
        (
            "editFile",
            json!({"path": "dir/log.txt", "operation": "rename", "contents": "b"}),
            400,
            "workspace_invalid_request",
        ),
        (
            "editFile",
            json!({"path": format!("/env/{slug}/studio/scale.py"), "operation": "replace", "find": "2", "contents": "3"}),
            403,
            "workspace_read_only",
        ),
        (
            "editFile",
            json!({"path": format!("/env/{slug}/new.py"), "operation": "create", "contents": "x"}),
            403,
            "workspace_read_only",
        ),
        (
            "editFile",
            json!({"path": "/tmp/x.txt", "operation": "create", "contents": "x"}),
            400,
            "workspace_path_invalid",
        ),
        (
            "editFile",
            json!({"path": "../x.txt", "operation": "create", "contents": "x"}),
            400,
            "workspace_path_invalid",
        ),
    ] {
        error(&novo, method, args, status, code).await;
    }
    novo.sh("printf 'caf\\351\\n' > latin1.txt").await;
    error(
        &novo,
        "editFile",
        json!({"path": "latin1.txt", "operation": "append", "contents": "x"}),
        400,
        "workspace_invalid_request",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn apply_patch_is_all_or_nothing() {
    let Some((server, novo, slug)) = run("Patch Studio", &[]).await else {
        return;
    };
    novo.ok(
        "editFile",
        json!({"path": "keep.txt", "operation": "create", "contents": "one\ntwo\nthree\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "gone.txt", "operation": "create", "contents": "bye\n"}),
    )
    .await;
    let operations = json!([
        {"type": "create_file", "path": "new/made.txt", "diff": "@@ -0,0 +1,2 @@\n+made\n+here\n"},
        {"type": "update_file", "path": "keep.txt", "diff": "--- a/keep.txt\n+++ b/keep.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"},
        {"type": "delete_file", "path": "gone.txt"}
    ]);
    // dry_run: whether it would apply, and nothing written.
    let dry = novo
        .ok(
            "applyPatch",
            json!({"operations": operations, "dry_run": true}),
        )
        .await;
    assert_eq!(
        dry,
        json!({"applied": true, "dry_run": true, "operations": [
            {"type": "create_file", "path": "new/made.txt", "status": "ok"},
            {"type": "update_file", "path": "keep.txt", "status": "ok"},
            {"type": "delete_file", "path": "gone.txt", "status": "ok"}
        ]})
    );
    assert_eq!(novo.sh("ls").await, "gone.txt\nkeep.txt\n");
    let applied = novo
        .ok("applyPatch", json!({"operations": operations}))
        .await;
    let token = applied["rollback_token"]
        .as_str()
        .expect("token")
        .to_owned();
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["dry_run"], false);
    assert_eq!(applied["operations"], dry["operations"]);
    assert_eq!(novo.cat("new/made.txt").await, "made\nhere\n");
    assert_eq!(novo.cat("keep.txt").await, "one\nTWO\nthree\n");
    assert_eq!(novo.sh("ls").await, "keep.txt\nnew\n");

    // One failing operation: it is `error` with a message, the others `skipped`, nothing written.
    let failing = novo
        .ok("applyPatch", json!({"operations": [
            {"type": "update_file", "path": "keep.txt", "diff": "@@ -1,3 +1,3 @@\n one\n-TWO\n+2\n three\n"},
            {"type": "update_file", "path": "keep.txt", "diff": "@@ -1,1 +1,1 @@\n-not there\n+x\n"},
            {"type": "delete_file", "path": "new/made.txt"}
        ]}))
        .await;
    assert_eq!(failing["applied"], false, "{failing}");
    assert_eq!(failing["dry_run"], false);
    assert!(failing.get("rollback_token").is_none(), "{failing}");
    let statuses: Vec<&str> = failing["operations"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["status"].as_str().expect("status"))
        .collect();
    assert_eq!(statuses, ["skipped", "error", "skipped"]);
    assert!(
        failing["operations"][1]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty())
    );
    assert!(failing["operations"][0].get("error").is_none());
    assert_eq!(novo.cat("keep.txt").await, "one\nTWO\nthree\n");
    assert_eq!(novo.cat("new/made.txt").await, "made\nhere\n");
    for bad in [
        json!({"type": "create_file", "path": "keep.txt", "diff": "@@ -0,0 +1 @@\n+x\n"}),
        json!({"type": "update_file", "path": "missing.txt", "diff": "@@ -1 +1 @@\n-a\n+b\n"}),
        json!({"type": "delete_file", "path": "missing.txt"}),
        json!({"type": "rename_file", "path": "keep.txt"}),
        json!({"type": "update_file", "path": format!("/env/{slug}/studio/scale.py"), "diff": "@@ -1,2 +1,2 @@\n def scale(x):\n-    return x * 2\n+    return x * 3\n"}),
        json!({"type": "create_file", "path": "../escape.txt", "diff": "@@ -0,0 +1 @@\n+x\n"}),
    ] {
        let failed = novo.ok("applyPatch", json!({"operations": [bad]})).await;
        assert_eq!(failed["applied"], false, "{failed}");
        assert_eq!(failed["operations"][0]["status"], "error", "{failed}");
    }
    let read_only = novo.ok("applyPatch", json!({"operations": [{"type": "delete_file", "path": format!("/env/{slug}/studio/scale.py")}]})).await;
    assert!(
        read_only["operations"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("read-only")),
        "{read_only}"
    );
    let dry = novo.ok("applyPatch", json!({"operations": [{"type": "delete_file", "path": "missing.txt"}], "dry_run": true})).await;
    assert_eq!(
        (&dry["applied"], &dry["dry_run"]),
        (&json!(false), &json!(true))
    );
    assert_eq!(novo.sh("ls").await, "keep.txt\nnew\n");
    for args in [json!({"operations": []}), json!({})] {
        error(&novo, "applyPatch", args, 400, "workspace_invalid_request").await;
    }

    // The rollback token puts every file back: the created one goes, the deleted one returns.
    assert_eq!(novo.ok("restore", json!({"token": token})).await, json!({}));
    assert_eq!(
        novo.sh("find . -type f | sort").await,
        "./gone.txt\n./keep.txt\n"
    );
    assert_eq!(novo.cat("keep.txt").await, "one\ntwo\nthree\n");
    assert_eq!(novo.cat("gone.txt").await, "bye\n");
    server.stop().await;
}

#[tokio::test]
async fn run_command_caps_output_and_pages_the_rest() {
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        "[gateway]\nadapter_command_inline_bytes = 1024\n",
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let Some((server, novo, slug)) = run("Command Studio", &["--config", &path]).await else {
        return;
    };
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "echo out; echo err >&2; pwd; exit 3"}),
        )
        .await;
    let cwd = ran["cwd"].as_str().expect("cwd").to_owned();
    assert_eq!(cwd, "/home/session", "{ran}");
    let duration = ran["duration_ms"].as_u64().expect("duration");
    let session = ran["metadata"]["session_id"].clone();
    assert!(
        session.as_str().is_some_and(|s| s.starts_with("sess_")),
        "{ran}"
    );
    assert_eq!(
        ran,
        json!({"command": "echo out; echo err >&2; pwd; exit 3", "cwd": cwd, "exit_code": 3,
               "stdout": format!("out\n{cwd}\n"), "stderr": "err\n",
               "stdout_truncated": false, "stderr_truncated": false,
               "duration_ms": duration, "timed_out": false,
               "metadata": {"session_id": session, "environment_version": 1}})
    );
    // cwd: relative to the root, or the environment; env is added.
    novo.sh("mkdir -p sub").await;
    let ran = novo
        .ok("runCommand", json!({"command": "pwd", "cwd": "sub"}))
        .await;
    assert_eq!(ran["cwd"], format!("{cwd}/sub"));
    assert_eq!(ran["stdout"], format!("{cwd}/sub\n"));
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "pwd; ls", "cwd": format!("/env/{slug}")}),
        )
        .await;
    assert_eq!(ran["stdout"], format!("/env/{slug}\nassets\nstudio\n"));
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "echo $GREETING", "env": {"GREETING": "hi there"}}),
        )
        .await;
    assert_eq!(ran["stdout"], "hi there\n");
    for (args, status, code) in [
        (
            json!({"command": "pwd", "cwd": "/etc"}),
            400,
            "workspace_path_invalid",
        ),
        (
            json!({"command": "pwd", "cwd": "missing"}),
            404,
            "workspace_not_found",
        ),
    ] {
        error(&novo, "runCommand", args, status, code).await;
    }
    novo.sh("touch plain.txt").await;
    error(
        &novo,
        "runCommand",
        json!({"command": "pwd", "cwd": "plain.txt"}),
        400,
        "workspace_path_invalid",
    )
    .await;
    novo.sh("rm plain.txt").await;
    for args in [
        json!({"command": ""}),
        json!({"command": "true", "env": {"A": 1}}),
    ] {
        error(&novo, "runCommand", args, 400, "workspace_invalid_request").await;
    }
    // A time limit.
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "echo started; sleep 30", "timeout_ms": 700}),
        )
        .await;
    assert_eq!(
        (
            &ran["timed_out"],
            &ran["signal"],
            &ran["exit_code"],
            &ran["stdout"]
        ),
        (
            &json!(true),
            &json!("SIGKILL"),
            &json!(137),
            &json!("started\n")
        ),
        "{ran}"
    );
    assert!(
        ran["duration_ms"]
            .as_u64()
            .is_some_and(|d| (700..10_000).contains(&d)),
        "{ran}"
    );
    // A writes to the environment fails in the command itself.
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": format!("touch /env/{slug}/x")}),
        )
        .await;
    assert_ne!(ran["exit_code"], 0);

    // Past the cap: the head inline (cut at a line end), the whole of it paged.
    let ran = novo
        .ok(
            "runCommand",
            json!({"command": "seq 1 200000; seq 1 3000 >&2"}),
        )
        .await;
    let stdout = ran["stdout"].as_str().expect("stdout");
    assert!(
        stdout.len() <= 1024 && stdout.len() > 700 && stdout.ends_with('\n'),
        "{}",
        stdout.len()
    );
    let shown = stdout.lines().count() as u64;
    assert_eq!(ran["stdout_truncated"], true);
    assert_eq!(
        ran["stdout_lines_truncated"],
        200_000 - shown,
        "{}",
        ran["stdout_lines_truncated"]
    );
    let stderr = ran["stderr"].as_str().expect("stderr");
    assert!(stderr.len() <= 1024 && stderr.ends_with('\n'));
    assert_eq!(ran["stderr_truncated"], true);
    assert_eq!(
        ran["stderr_lines_truncated"],
        3000 - stderr.lines().count() as u64
    );
    assert_eq!(
        ran["output_truncated"], false,
        "the whole output is kept: {}",
        ran["output_truncated"]
    );
    let output = ran["output_file_path"]
        .as_str()
        .expect("output_file_path")
        .to_owned();
    let bytes: usize = (1..=200_000)
        .map(|n: u32| n.to_string().len() + 1)
        .sum::<usize>()
        + (1..=3000)
            .map(|n: u32| n.to_string().len() + 1)
            .sum::<usize>();

    let page = novo.ok("readCommandOutput", json!({"path": output})).await;
    assert_eq!(
        keys(&page),
        [
            "bytes",
            "content",
            "encoding",
            "end_line",
            "path",
            "start_line",
            "total_lines",
            "truncated"
        ]
    );
    assert_eq!(
        (
            &page["path"],
            &page["encoding"],
            &page["bytes"],
            &page["total_lines"],
            &page["start_line"],
            &page["truncated"]
        ),
        (
            &json!(output),
            &json!("utf8"),
            &json!(bytes),
            &json!(203_000),
            &json!(1),
            &json!(true)
        )
    );
    let content = page["content"].as_str().expect("content");
    assert!(content.len() <= 256 * 1024 && content.ends_with('\n'));
    assert_eq!(
        content.lines().count() as u64,
        page["end_line"].as_u64().expect("end")
    );
    let page = novo
        .ok(
            "readCommandOutput",
            json!({"path": output, "start_line": 150_000, "end_line": 150_002}),
        )
        .await;
    assert_eq!(
        (
            &page["content"],
            &page["start_line"],
            &page["end_line"],
            &page["truncated"]
        ),
        (
            &json!("150000\n150001\n150002\n"),
            &json!(150_000),
            &json!(150_002),
            &json!(false)
        )
    );
    let page = novo
        .ok(
            "readCommandOutput",
            json!({"path": output, "start_line": 10, "max_bytes": 14}),
        )
        .await;
    assert_eq!(
        (&page["content"], &page["end_line"], &page["truncated"]),
        (&json!("10\n11\n12\n13\n"), &json!(13), &json!(true))
    );
    for args in [
        json!({"path": "out_00000000000000000000000000000000"}),
        json!({"path": "../../etc/passwd"}),
    ] {
        error(&novo, "readCommandOutput", args, 404, "workspace_not_found").await;
    }
    // The output is kept beside the session, out of its sight.
    assert_eq!(novo.sh("ls -A").await, "sub\n");
    // Under the cap, nothing is spilled.
    let ran = novo.ok("runCommand", json!({"command": "seq 1 10"})).await;
    assert!(
        ran.get("output_file_path").is_none() && ran.get("stdout_lines_truncated").is_none(),
        "{ran}"
    );
    server.stop().await;
}

#[tokio::test]
async fn artifacts_and_external_changes() {
    let Some((server, novo, _slug)) = run("Artifact Studio", &[]).await else {
        return;
    };
    assert_eq!(novo.ok("getRunArtifacts", json!({})).await, json!([]));
    assert_eq!(
        novo.ok("listExternalFileChanges", json!({})).await,
        json!([])
    );

    // writeRuntimeArtifact: the derived path, readable and greppable as a single file.
    let contents = "{\"rows\": [{\"id\": 7, \"status\": \"late\"}]}";
    let written = novo
        .ok("writeRuntimeArtifact", json!({"runId": "run_abc", "stepNumber": 3, "toolCallId": "call_42", "mediaType": "application/json", "contents": contents}))
        .await;
    let digest: String = sha2::Sha256::digest(b"call_42")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = format!("./.novo/artifacts/run_abc/3-{}.json", &digest[..16]);
    assert_eq!(
        written,
        json!({"path": path, "bytes_written": contents.len()})
    );
    assert_eq!(novo.cat(&path).await, contents);
    let found = novo
        .ok(
            "searchFiles",
            json!({"pattern": "\"status\": \"\\w+\"", "path": path}),
        )
        .await;
    assert_eq!(found["matches"][0]["line"], 1, "{found}");
    let read = novo.ok("readFile", json!({"path": path})).await;
    assert_eq!(read["content"], contents);
    let written = novo
        .ok("writeRuntimeArtifact", json!({"runId": "run_abc", "stepNumber": 0, "toolCallId": "call_é", "mediaType": "text/plain", "contents": "plain\n"}))
        .await;
    let digest: String = sha2::Sha256::digest("call_é".as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        written,
        json!({"path": format!("./.novo/artifacts/run_abc/0-{}.txt", &digest[..16]), "bytes_written": 6})
    );
    for bad in [
        json!({"runId": "run_abc", "stepNumber": 1, "toolCallId": "c", "mediaType": "image/png", "contents": "x"}),
        json!({"runId": "../up", "stepNumber": 1, "toolCallId": "c", "mediaType": "text/plain", "contents": "x"}),
        json!({"runId": "run_abc", "stepNumber": -1, "toolCallId": "c", "mediaType": "text/plain", "contents": "x"}),
        json!({"runId": "run_abc", "stepNumber": 1, "toolCallId": "c", "mediaType": "text/plain"}),
    ] {
        error(
            &novo,
            "writeRuntimeArtifact",
            bad,
            400,
            "workspace_invalid_request",
        )
        .await;
    }

    // The run's own edits, and changes by something else (its commands).
    novo.ok(
        "editFile",
        json!({"path": "a.txt", "operation": "create", "contents": "one\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "b.txt", "operation": "create", "contents": "bee\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "c.txt", "operation": "create", "contents": "sea\n"}),
    )
    .await;
    novo.ok(
        "editFile",
        json!({"path": "mine.txt", "operation": "create", "contents": "untouched\n"}),
    )
    .await;
    let big = "x".repeat(1024 * 1024 + 10);
    novo.ok(
        "editFile",
        json!({"path": "d.txt", "operation": "create", "contents": big}),
    )
    .await;
    novo.sh("echo two >> a.txt; rm b.txt; seq 1 5000 >> c.txt; echo more >> d.txt; printf '\\000\\001' > bin.dat; echo hello > cmd.txt").await;
    let artifacts = novo.ok("getRunArtifacts", json!({})).await;
    assert_eq!(
        artifacts,
        json!([
            {"path": "a.txt", "change": "created", "bytes": 8},
            {"path": "bin.dat", "change": "created", "bytes": 2},
            {"path": "c.txt", "change": "created", "bytes": 4 + (1..=5000).map(|n: u32| n.to_string().len() + 1).sum::<usize>()},
            {"path": "cmd.txt", "change": "created", "bytes": 6},
            {"path": "d.txt", "change": "created", "bytes": big.len() + 5},
            {"path": "mine.txt", "change": "created", "bytes": 10}
        ])
    );
    let changes = novo.ok("listExternalFileChanges", json!({})).await;
    assert_eq!(
        changes,
        json!([
            {"kind": "changed-with-diff", "path": "a.txt", "snippet": "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n one\n+two\n"},
            {"kind": "changed-no-diff", "path": "b.txt", "reason": "deleted"},
            {"kind": "changed-no-diff", "path": "bin.dat", "reason": "binary"},
            {"kind": "changed-no-diff", "path": "c.txt", "reason": "snippet-too-large"},
            {"kind": "changed-with-diff", "path": "cmd.txt", "snippet": "--- a/cmd.txt\n+++ b/cmd.txt\n@@ -0,0 +1 @@\n+hello\n"},
            {"kind": "changed-no-diff", "path": "d.txt", "reason": "partial-prior-read"}
        ])
    );
    // An edit of the run makes the file its own again.
    novo.ok(
        "editFile",
        json!({"path": "a.txt", "operation": "append", "contents": "three\n"}),
    )
    .await;
    let changes = novo.ok("listExternalFileChanges", json!({})).await;
    assert!(
        changes
            .as_array()
            .expect("list")
            .iter()
            .all(|c| c["path"] != "a.txt"),
        "{changes}"
    );
    server.stop().await;
}

#[tokio::test]
async fn links_out_of_the_workspace_are_refused() {
    let Some((server, novo, slug)) = run("Link Studio", &[]).await else {
        return;
    };
    // A host file outside the workspace that the links below point at.
    let outside = tempfile::tempdir().expect("dir");
    let target = outside.path().join("target.txt");
    std::fs::write(&target, "host file\n").expect("write");
    let target = target.to_str().expect("utf-8").to_owned();
    let dir = outside.path().to_str().expect("utf-8").to_owned();
    novo.sh(&format!("ln -s {target} file-link; ln -s {dir} dir-link; ln -s /env/{slug} env-link; mkdir -p real; echo inside > real/in.txt")).await;

    for (method, args) in [
        ("readFile", json!({"path": "file-link"})),
        ("readFile", json!({"path": "dir-link/target.txt"})),
        ("listFiles", json!({"path": "dir-link"})),
        (
            "searchFiles",
            json!({"pattern": "host", "path": "dir-link"}),
        ),
        (
            "searchFiles",
            json!({"pattern": "host", "path": "file-link"}),
        ),
        ("readFile", json!({"path": "env-link/studio/scale.py"})),
        (
            "editFile",
            json!({"path": "dir-link/target.txt", "operation": "append", "contents": "x"}),
        ),
        (
            "editFile",
            json!({"path": "dir-link/new.txt", "operation": "create", "contents": "x"}),
        ),
        ("runCommand", json!({"command": "pwd", "cwd": "dir-link"})),
    ] {
        error(&novo, method, args, 400, "workspace_path_invalid").await;
    }
    // A walk does not follow links either.
    let found = novo
        .ok("searchFiles", json!({"pattern": "host|inside"}))
        .await;
    assert_eq!(
        found["matches"].as_array().map(Vec::len),
        Some(1),
        "{found}"
    );
    assert_eq!(found["matches"][0]["path"], "real/in.txt");
    // Editing the link's own name never writes through it.
    let (status, body) = novo
        .call(
            "editFile",
            json!({"path": "file-link", "operation": "append", "contents": "x"}),
        )
        .await;
    assert!(status == 400 || status == 200, "{body}");
    let (status, body) = novo.call("applyPatch", json!({"operations": [{"type": "update_file", "path": "file-link", "diff": "@@ -1 +1 @@\n-host file\n+changed\n"}]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["applied"], false, "{body}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "host file\n"
    );
    assert_eq!(std::fs::read_dir(outside.path()).expect("dir").count(), 1);
    server.stop().await;
}

/// Every file below `dir` whose name is `ledger` or starts with `pack-`, with its bytes.
fn snapshot_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if kind.is_dir() {
            found.extend(snapshot_files(&path));
        } else if kind.is_file() && (name == "ledger" || name.starts_with("pack-")) {
            let bytes = std::fs::read(&path).expect("read");
            found.push((path, bytes));
        }
    }
    found.sort();
    found
}

/// What undoes an edit is kept beside the working directory, out of the session's reach: a
/// command in the session looks for the snapshot packs and the ledger that lists them, and
/// tries to overwrite them by every path it can think of; it finds nothing, writes nothing,
/// and the rollback token still puts back what the edit replaced.
#[tokio::test]
async fn a_session_cannot_reach_the_snapshots_that_undo_its_edits() {
    let Some((server, novo, _slug)) = run("Snapshot Reach", &[]).await else {
        return;
    };
    novo.ok(
        "editFile",
        json!({"path": "notes.txt", "operation": "create", "contents": "original\n"}),
    )
    .await;
    let edited = novo
        .ok(
            "editFile",
            json!({"path": "notes.txt", "operation": "create", "contents": "second\n"}),
        )
        .await;
    let token = edited["rollback_token"]
        .as_str()
        .unwrap_or_else(|| panic!("a rollback token: {edited}"))
        .to_owned();
    let data_dir = server.data_dir();
    let before = snapshot_files(&data_dir);
    assert!(
        before
            .iter()
            .any(|(path, _)| path.to_string_lossy().contains("pack-")),
        "the node keeps a pack: {before:?}"
    );

    let found = novo
        .sh(&format!(
            "find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name 'pack-*' -o -name ledger \
               -o -name expected.log \\) -print 2>/dev/null; \
             ls -a .. ../workspace ../workspace/snapshots {data} 2>/dev/null; \
             for target in ../workspace/snapshots/ledger ../workspace/snapshots/pack-0 \
               {data}/node/sessions; do \
               printf 'tampered\\n' > \"$target\" 2>/dev/null && echo \"WROTE $target\"; done; \
             grep -c workspace /proc/self/mountinfo; true",
            data = data_dir.display()
        ))
        .await;
    assert!(!found.contains("pack-"), "a pack is visible: {found}");
    assert!(!found.contains("ledger"), "the ledger is visible: {found}");
    assert!(
        !found.contains("expected.log"),
        "the records are visible: {found}"
    );
    assert!(!found.contains("WROTE"), "a write landed: {found}");
    assert_eq!(found.lines().last(), Some("0"), "{found}");

    assert_eq!(
        snapshot_files(&data_dir),
        before,
        "the snapshots are unchanged"
    );
    assert_eq!(novo.ok("restore", json!({"token": token})).await, json!({}));
    assert_eq!(novo.cat("notes.txt").await, "original\n");
    server.stop().await;
}
