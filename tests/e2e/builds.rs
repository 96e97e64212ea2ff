//! Real builds through HTTP against `plinth serve` with its in-process builder: a project
//! with `requirements.txt`, `package.json` and `setup.sh` becomes a ready version whose layer
//! holds a working `.venv` and `node_modules` at `/env/<slug>`, with no network: the wheel and
//! the npm package ship inside the project.

use std::io::Write as _;
use std::time::Duration;

use plinth_blobs::tree::{Tree, TreeEntryKind};
use plinth_blobs::{BlobStore, Digest};
use serde_json::{Value, json};

use crate::helpers::{Server, create_environment, put_file, send, wait_for_build};

/// Puts [`tiny_wheel`] at `wheels/` in the source of environment `id`, where a requirement
/// with `--find-links wheels` (or uv's `find-links`) finds it offline.
pub async fn put_tiny_wheel(server: &Server, id: &str) {
    put_file(
        server,
        id,
        "wheels/tinypkg-1.0-py3-none-any.whl",
        tiny_wheel(),
    )
    .await;
}

/// A wheel: `tinypkg` 1.0 with a console script `tinytool`.
pub fn tiny_wheel() -> Vec<u8> {
    let files: [(&str, &str); 5] = [
        (
            "tinypkg/__init__.py",
            "def main():\n    print('tinytool ran')\n",
        ),
        (
            "tinypkg-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        ),
        (
            "tinypkg-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        (
            "tinypkg-1.0.dist-info/entry_points.txt",
            "[console_scripts]\ntinytool = tinypkg:main\n",
        ),
        ("tinypkg-1.0.dist-info/RECORD", ""),
    ];
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let mut record = String::new();
    for (name, content) in &files[..4] {
        writer
            .start_file(*name, zip::write::SimpleFileOptions::default())
            .expect("start");
        writer.write_all(content.as_bytes()).expect("write");
        record.push_str(&format!("{name},,\n"));
    }
    record.push_str("tinypkg-1.0.dist-info/RECORD,,\n");
    writer
        .start_file(files[4].0, zip::write::SimpleFileOptions::default())
        .expect("start");
    writer.write_all(record.as_bytes()).expect("write");
    writer.finish().expect("finish").into_inner()
}

/// An npm package tarball, as `npm pack` makes it: `tinynpm` 1.2.3 with a bin `tinynpm`.
pub fn tiny_npm_package() -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, mode, content) in [
        (
            "package/package.json",
            0o644,
            &br#"{"name": "tinynpm", "version": "1.2.3", "bin": {"tinynpm": "cli.js"}}"#[..],
        ),
        (
            "package/cli.js",
            0o755,
            b"#!/usr/bin/env node\nconsole.log('tinynpm ran');\n",
        ),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(mode);
        builder
            .append_data(&mut header, path, content)
            .expect("append");
    }
    builder.into_inner().expect("tar").finish().expect("gz")
}

/// How long a build of these small projects may take.
const BUILD_LIMIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_python_and_node_project_builds_to_a_working_layer_at_its_mount_path() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Studio").await;
    put_tiny_wheel(&server, &id).await;
    put_file(
        &server,
        &id,
        "requirements.txt",
        "--no-index\n--find-links wheels\ntinypkg==1.0\n",
    )
    .await;
    put_file(&server, &id, "vendor/tinynpm-1.2.3.tgz", tiny_npm_package()).await;
    put_file(&server,
        &id,
        "package.json",
        r#"{"name": "studio", "version": "0.0.0", "dependencies": {"tinynpm": "file:vendor/tinynpm-1.2.3.tgz"}}"#,
    )
    .await;
    put_file(
        &server,
        &id,
        "setup.sh",
        "set -e\ntinytool > made-by-setup.txt\ntinynpm >> made-by-setup.txt\n",
    )
    .await;
    put_file(&server, &id, "run.py", "print('hello')\n").await;

    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let build = wait_for_build(&server, &id, 1, BUILD_LIMIT).await;
    assert_eq!(
        build["status"],
        "ready",
        "log:\n{}\nerror: {}",
        build["log"].as_str().unwrap_or(""),
        build["error"]
    );
    let packages = build["packages"].as_array().expect("packages");
    assert!(
        packages.contains(&json!({"manager": "pip", "name": "tinypkg", "version": "1.0"})),
        "{packages:?}"
    );
    assert!(
        packages.contains(&json!({"manager": "npm", "name": "tinynpm", "version": "1.2.3"})),
        "{packages:?}\nlog:\n{}",
        build["log"].as_str().unwrap_or("")
    );
    assert!(build["size"].as_u64().unwrap_or(0) > 0);

    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    assert_eq!(environment["status"], "ready");
    assert_eq!(environment["version"], 1);

    // The layer, read back from the blob store as a node will read it.
    let blobs = BlobStore::open(
        &format!("file://{}", server.data_dir().join("blobs").display()),
        server.data_dir().join("spool"),
    )
    .expect("open");
    let layer = server.layer(&id, 1).await;
    let tree_bytes = blobs
        .get(&layer)
        .await
        .expect("layer tree")
        .into_bytes()
        .await
        .expect("bytes");
    let tree = Tree::decode(&tree_bytes).expect("tree");
    let find = |path: &str| {
        tree.entries
            .iter()
            .find(|entry| entry.path == path)
            .cloned()
    };
    let tinytool = find(".venv/bin/tinytool").expect("the console script is in the layer");
    let script = blobs
        .get(&tinytool.file_digest().expect("digest"))
        .await
        .expect("blob")
        .into_bytes()
        .await
        .expect("bytes");
    let shebang = String::from_utf8_lossy(&script)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    assert!(
        shebang.starts_with("#!/env/studio/.venv/bin/python"),
        "shebang points under the mount path: {shebang}"
    );
    assert!(
        find("node_modules/.bin/tinynpm").is_some(),
        "npm linked the bin"
    );
    assert!(
        tree.entries
            .iter()
            .any(|e| e.path.starts_with(".venv/lib/") && e.path.ends_with(".pyc")),
        "bytecode was compiled"
    );
    let made = find("made-by-setup.txt").expect("setup.sh ran with the installed tools on PATH");
    let made = blobs
        .get(&made.file_digest().expect("digest"))
        .await
        .expect("blob")
        .into_bytes()
        .await
        .expect("bytes");
    assert_eq!(
        String::from_utf8_lossy(&made),
        "tinytool ran\ntinynpm ran\n"
    );
    assert!(find("run.py").is_some_and(|e| e.kind == TreeEntryKind::File
        && e.file_digest() == Some(Digest::of(b"print('hello')\n"))));

    // Changing a source file reuses the installed dependencies as the installers' start: they
    // run over them (finding everything installed), so the version holds what a fresh build's
    // would.
    put_file(&server, &id, "run.py", "print('hello again')\n").await;
    send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    let second = wait_for_build(&server, &id, 2, BUILD_LIMIT).await;
    assert_eq!(second["status"], "ready", "{second}");
    let log = second["log"].as_str().unwrap_or("");
    assert!(
        log.contains("starting from its .venv and node_modules"),
        "{log}"
    );
    // The npm project has no lock: the rebuild takes the one the first build's `npm install`
    // wrote, and `npm ci` over the reused tree runs only the root's lifecycle scripts (none).
    assert!(
        log.contains("pip install")
            && log.contains("reusing the resolution version 1's build wrote (package-lock.json)"),
        "{log}"
    );
    assert!(log.contains("setup.sh"), "setup.sh still runs: {log}");
    assert_eq!(second["packages"], build["packages"]);
    // Nothing changed: the whole layer is reused.
    send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    let third = wait_for_build(&server, &id, 3, BUILD_LIMIT).await;
    assert_eq!(third["status"], "ready", "{third}");
    assert!(
        third["log"]
            .as_str()
            .unwrap_or("")
            .contains("reusing its layer"),
        "{third}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_failing_setup_sh_fails_the_build_with_its_output_and_changes_nothing() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Failing").await;
    put_file(
        &server,
        &id,
        "setup.sh",
        "echo working\necho boom >&2\nexit 3\n",
    )
    .await;
    send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    let build = wait_for_build(&server, &id, 1, BUILD_LIMIT).await;
    assert_eq!(build["status"], "failed");
    assert!(
        build["error"].as_str().unwrap_or("").contains('3'),
        "{}",
        build["error"]
    );
    assert!(
        build["error"].as_str().unwrap_or("").contains("boom"),
        "{}",
        build["error"]
    );
    assert!(
        build["log"].as_str().unwrap_or("").contains("working"),
        "{}",
        build["log"]
    );
    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    assert_eq!(environment["status"], "failed");
    assert_eq!(environment["version"], Value::Null);
    server.stop().await;
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970");
    i64::try_from(since.as_millis()).expect("a time in range")
}

/// Every time field anywhere in `value` (`*_at` and `*At` keys), with its value.
fn time_fields(value: &Value, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                if key.ends_with("_at") || key.ends_with("At") {
                    out.push((key.clone(), value.clone()));
                }
                time_fields(value, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| time_fields(item, out)),
        _ => {}
    }
}

/// Where a build's answer says it is, in the order a build goes: waiting, running, ended.
fn stage(build: &Value) -> u8 {
    match (
        build["status"].as_str(),
        build.get("phase").and_then(Value::as_str),
    ) {
        (Some("building"), Some("queued")) => 0,
        (Some("building"), Some("running")) => 1,
        (Some("ready" | "failed"), None) => 2,
        _ => panic!("a build says building (phase queued or running), ready or failed: {build}"),
    }
}

#[tokio::test]
async fn a_build_says_building_then_ready_with_its_phase_and_every_time_in_milliseconds() {
    if !crate::helpers::can_build() {
        return;
    }
    let window_start = now_ms();
    let server = Server::start_with(&["--builder-network", "false", "--builders", "1"]).await;
    // The one builder is busy with this build while the next one waits for it.
    let busy = create_environment(&server, "Busy").await;
    put_file(&server, &busy, "setup.sh", "sleep 6\n").await;
    let waiting = create_environment(&server, "Waiting").await;
    put_file(&server, &waiting, "setup.sh", "echo done\n").await;
    let build_url = |id: &str| server.url(&format!("/v1/environments/{id}/build"));
    let record_url = |id: &str| server.url(&format!("/v1/environments/{id}/builds/1"));

    let (status, accepted) = send(server.client.post(build_url(&busy))).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(stage(&accepted), 0, "accepted, it waits: {accepted}");
    crate::waiting::eventually(Duration::from_secs(120), async || {
        let (_, record) = send(server.client.get(record_url(&busy))).await;
        if stage(&record) == 1 {
            return Ok(());
        }
        assert_eq!(stage(&record), 0, "{record}");
        Err(format!(
            "the builder has not taken the first build: {record}"
        ))
    })
    .await;

    let (status, accepted) = send(server.client.post(build_url(&waiting))).await;
    assert_eq!(status, 202, "{accepted}");
    // Every answer that shows the waiting build: its record, the environment's `build` and
    // `versions`, and the versions listing, polled from acceptance until it ends.
    let mut answers = vec![accepted.clone()];
    let mut records = vec![accepted];
    let mut summaries = Vec::new();
    let mut ended = false;
    for _ in 0..1200 {
        let (_, record) = send(server.client.get(record_url(&waiting))).await;
        let (_, environment) = send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{waiting}"))),
        )
        .await;
        let (_, versions) = send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{waiting}/versions"))),
        )
        .await;
        summaries.push(environment["build"].clone());
        summaries.extend(
            environment["versions"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        summaries.extend(versions["data"].as_array().cloned().unwrap_or_default());
        answers.extend([record.clone(), environment, versions]);
        records.push(record.clone());
        if stage(&record) == 2 {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the second build never ended");
    let window_end = now_ms();

    let stages: Vec<u8> = records.iter().map(stage).collect();
    assert!(
        stages.windows(2).all(|pair| pair[0] <= pair[1]),
        "a build never goes back: {stages:?}"
    );
    assert!(
        stages.iter().filter(|stage| **stage == 0).count() >= 2,
        "polled while the builder was busy, the build said building, phase queued: {stages:?}"
    );
    let last = records.last().expect("a record");
    assert_eq!(last["status"], "ready", "{last}");
    for summary in &summaries {
        stage(summary);
    }
    assert!(
        summaries.iter().any(|summary| stage(summary) == 0),
        "the environment and versions showed the waiting build too"
    );

    // Every time is milliseconds since the epoch: inside the test's own window.
    let mut times = Vec::new();
    for answer in &answers {
        time_fields(answer, &mut times);
    }
    assert!(times.iter().any(|(key, _)| key == "queued_at"), "{times:?}");
    for (key, value) in &times {
        if value.is_null() {
            continue;
        }
        let ms = value.as_i64().unwrap_or_else(|| panic!("{key}: {value}"));
        assert!(
            (window_start..=window_end).contains(&ms),
            "{key} = {ms}, not between {window_start} and {window_end}"
        );
    }
    let (queued, started, finished) = (
        last["queued_at"].as_i64().expect("queued_at"),
        last["started_at"].as_i64().expect("started_at"),
        last["finished_at"].as_i64().expect("finished_at"),
    );
    assert!(queued <= started && started <= finished, "{last}");
    server.stop().await;
}

#[tokio::test]
async fn each_version_lists_the_source_files_it_was_built_from() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let id = crate::helpers::create_environment(&server, "Two Versions").await;
    crate::helpers::put_file(&server, &id, "main.py", "print(1)\n").await;
    crate::helpers::put_file(&server, &id, "gone.txt", "soon removed\n").await;
    crate::helpers::build_ready(&server, &id, 1, std::time::Duration::from_secs(120)).await;
    crate::helpers::put_file(&server, &id, "main.py", "print(2)\n").await;
    crate::helpers::put_file(&server, &id, "lib/new.py", "X = 1\n").await;
    let (status, body) = crate::helpers::send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{id}/files/gone.txt"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    crate::helpers::build_ready(&server, &id, 2, std::time::Duration::from_secs(120)).await;
    // A third edit after the last build: no version holds it.
    crate::helpers::put_file(&server, &id, "main.py", "print(3)\n").await;

    let files = async |version: u32| -> Vec<(String, String)> {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = server.url(&format!(
                "/v1/environments/{id}/versions/{version}/files?limit=2"
            ));
            if let Some(after) = &after {
                url.push_str(&format!("&after={after}"));
            }
            let (status, page) = crate::helpers::send(server.client.get(url)).await;
            assert_eq!(status, 200, "{page}");
            for entry in page["data"].as_array().expect("data") {
                seen.push((
                    entry["path"].as_str().expect("path").to_owned(),
                    entry["digest"].as_str().unwrap_or("").to_owned(),
                ));
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return seen,
            }
        }
    };
    let digest = |text: &str| plinth_blobs::Digest::of(text.as_bytes()).to_string();
    assert_eq!(
        files(1).await,
        [
            ("gone.txt".to_owned(), digest("soon removed\n")),
            ("main.py".to_owned(), digest("print(1)\n")),
        ]
    );
    assert_eq!(
        files(2).await,
        [
            ("lib".to_owned(), String::new()),
            ("lib/new.py".to_owned(), digest("X = 1\n")),
            ("main.py".to_owned(), digest("print(2)\n")),
        ]
    );
    let (status, body) = crate::helpers::send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/versions/3/files"))),
    )
    .await;
    crate::helpers::assert_error(status, &body, 404, "environment_not_found");
    let (status, body) = crate::helpers::send(
        server
            .client
            .get(server.url("/v1/environments/env_nope/versions/1/files")),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}
