//! Garbage collection and retention end to end, through `plinth serve` and the `plinth gc`
//! binary: a deleted environment's blobs are reclaimed while an import and a build run, and
//! nothing of a live environment or of the work in flight is; a dry run changes nothing.
//! Runs on a directory store and on the S3-protocol server (`PLINTH_TEST_S3_ENDPOINT`, e.g.
//! moto; required under CI).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser as _;
use plinth_blobs::tree::Tree;
use plinth_blobs::{BlobError, BlobStore, Digest};

use crate::helpers::{Server, create_environment, put_file, send, tar_of, wait_for_build};
use crate::waiting::eventually;

const S3_VAR: &str = "PLINTH_TEST_S3_ENDPOINT";

/// A new bucket on the S3 test server, as a blob URL; `None` when none is configured outside
/// CI.
pub(crate) async fn fresh_bucket() -> Option<String> {
    let endpoint = match std::env::var(S3_VAR) {
        Ok(endpoint) if !endpoint.is_empty() => endpoint,
        _ if std::env::var_os("CI").is_some() => {
            panic!("{S3_VAR} is not set under CI: the S3 collection tests must run there")
        }
        _ => {
            eprintln!("{S3_VAR} is not set: skipping an S3 test (CI runs it)");
            return None;
        }
    };
    let bucket = format!("plinth-e2e-{}", uuid::Uuid::new_v4().simple());
    let response = crate::helpers::http_client()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .unwrap_or_else(|error| panic!("cannot reach the S3 test server at {endpoint}: {error}"));
    assert!(
        response.status().is_success(),
        "bucket: {}",
        response.status()
    );
    Some(format!(
        "s3://{bucket}/plinth?endpoint={endpoint}&allow_http=true&region=us-east-1&access_key_id=test&secret_access_key=test"
    ))
}

/// `plinth gc` configuration for the data directory of a `serve` (and its blob store).
pub(crate) fn gc_config(
    data_dir: &std::path::Path,
    blob_url: Option<&str>,
) -> plinth::config::Config {
    let dir = data_dir.to_str().expect("utf-8");
    let mut argv = vec!["plinth", "gc", "--data-dir", dir, "--gc-grace-seconds", "0"];
    if let Some(url) = blob_url {
        argv.extend(["--blob-url", url]);
    }
    let cli = plinth::args::Cli::try_parse_from(argv).expect("flags parse");
    let plinth::args::Command::Gc(args) = &cli.command else {
        unreachable!("parsed gc")
    };
    plinth::config::Config::for_gc(args).expect("config")
}

/// One pass, run as soon as no other pass (the server's own) runs.
pub(crate) async fn pass_now(config: &plinth::config::Config) -> plinth::gc::GcOutcome {
    eventually(
        Duration::from_secs(10),
        async || match plinth::gc::run_once(config, false).await {
            Ok(outcome) => Ok(outcome),
            Err(error) if format!("{error:#}").contains("another garbage collection pass") => {
                Err(format!("{error:#}"))
            }
            Err(error) => panic!("a pass failed: {error:#}"),
        },
    )
    .await
}

async fn bytes_of(blobs: &BlobStore, digest: &Digest) -> Result<bytes::Bytes, BlobError> {
    Ok(blobs.get(digest).await?.into_bytes().await.expect("read"))
}

/// Every file of a layer reads back from the store as `expected` says.
async fn assert_layer(blobs: &BlobStore, layer: &Digest, expected: &BTreeMap<String, Vec<u8>>) {
    let tree = Tree::decode(&bytes_of(blobs, layer).await.expect("the layer tree")).expect("tree");
    for (path, content) in expected {
        let entry = tree
            .entries
            .iter()
            .find(|entry| &entry.path == path)
            .unwrap_or_else(|| panic!("{path} is in the layer"));
        let digest = entry.file_digest().expect("a file");
        let read = bytes_of(blobs, &digest)
            .await
            .unwrap_or_else(|error| panic!("{path}: {error}"));
        assert_eq!(read.as_ref(), content.as_slice(), "{path}");
    }
}

/// Every file of an environment's source reads back through the API as `expected` says.
async fn assert_source(server: &Server, id: &str, expected: &BTreeMap<String, Vec<u8>>) {
    for (path, content) in expected {
        let response = server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files/{path}")))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(
            response.bytes().await.expect("body").as_ref(),
            content.as_slice(),
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_during_an_import_and_a_build_takes_only_a_deleted_environments_blobs_on_files()
{
    collection_during_an_import_and_a_build(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_during_an_import_and_a_build_takes_only_a_deleted_environments_blobs_on_s3() {
    let Some(url) = fresh_bucket().await else {
        return;
    };
    collection_during_an_import_and_a_build(Some(url)).await;
}

async fn collection_during_an_import_and_a_build(blob_url: Option<String>) {
    if !crate::helpers::can_build() {
        return;
    }
    // Passes every second, with no grace: only holds keep work in flight. Holds outlive
    // their last renewal by 2 s (a snapshot's, which nothing releases, last that long).
    let mut flags = vec![
        "--builder-network",
        "false",
        "--gc-interval-seconds",
        "1",
        "--gc-grace-seconds",
        "0",
        "--gc-hold-seconds",
        "2",
    ];
    if let Some(url) = &blob_url {
        flags.extend(["--blob-url", url.as_str()]);
    }
    let server = Server::start_with(&flags).await;
    let data_dir = server.data_dir();
    let blobs = BlobStore::open(
        &blob_url
            .clone()
            .unwrap_or_else(|| format!("file://{}/blobs", data_dir.display())),
        data_dir.join("test-spool"),
    )
    .expect("the store");
    let run = uuid::Uuid::new_v4().simple().to_string();
    let content = |name: &str| format!("{name} of run {run}\n").into_bytes();

    // An environment with files and a built version, then deleted. Two of its contents come
    // back in the work below (an import and a build write the same bytes again); the rest
    // is its own.
    let doomed = create_environment(&server, "Doomed").await;
    put_file(&server, &doomed, "own.txt", content("doomed's own file")).await;
    put_file(
        &server,
        &doomed,
        "again-by-import.txt",
        content("imported again"),
    )
    .await;
    put_file(
        &server,
        &doomed,
        "again-by-build.txt",
        content("built again"),
    )
    .await;
    put_file(
        &server,
        &doomed,
        "setup.sh",
        format!("printf 'doomed output of run {run}\\n' > out.txt\n"),
    )
    .await;
    let (status, _) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{doomed}/build"))),
    )
    .await;
    assert_eq!(status, 202);
    let built = wait_for_build(&server, &doomed, 1, Duration::from_secs(120)).await;
    assert_eq!(built["status"], "ready", "{built}");
    let doomed_layer = server.layer(&doomed, 1).await;
    let (status, _) = send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{doomed}"))),
    )
    .await;
    assert_eq!(status, 200);

    // More passes from this test besides the server's own, back to back.
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicU64::new(0));
    let collector = {
        let (stop, passes) = (stop.clone(), passes.clone());
        let config = gc_config(&data_dir, blob_url.as_deref());
        plinth_kit::tasks::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if plinth::gc::run_once(&config, false).await.is_ok() {
                    passes.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    // A live environment: a build that writes its layer while passes run, and an import.
    let live = create_environment(&server, "Live").await;
    let mut source = BTreeMap::new();
    source.insert("app.py".to_owned(), content("the live app"));
    let mut setup = String::from("sleep 2\nmkdir -p generated\n");
    let mut layer = BTreeMap::new();
    // Enough files that the layer takes a while to store: passes run while it does (fewer on
    // S3, where each costs a round trip).
    let generated = if blob_url.is_some() { 400 } else { 2000 };
    for i in 0..generated {
        setup.push_str(&format!(
            "printf 'generated {i} of run {run}\\n' > generated/{i}.txt\n"
        ));
        layer.insert(
            format!("generated/{i}.txt"),
            format!("generated {i} of run {run}\n").into_bytes(),
        );
    }
    setup.push_str(&format!(
        "printf 'built again of run {run}\\n' > again.txt\n"
    ));
    layer.insert("again.txt".to_owned(), content("built again"));
    source.insert("setup.sh".to_owned(), setup.into_bytes());
    for (path, bytes) in &source {
        put_file(&server, &live, path, bytes.clone()).await;
    }
    let (status, queued) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{live}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{queued}");
    let mut imported = BTreeMap::new();
    imported.insert("data/again.txt".to_owned(), content("imported again"));
    for i in 0..300 {
        imported.insert(format!("data/{i}.txt"), content(&format!("imported {i}")));
    }
    imported.insert("README".to_owned(), content("the readme"));
    let (status, report) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{live}/import")))
            .body(tar_of(&imported)),
    )
    .await;
    assert_eq!(status, 200, "the import completes: {report}");
    let built = wait_for_build(&server, &live, 1, Duration::from_secs(120)).await;
    assert_eq!(built["status"], "ready", "the build completes: {built}");
    stop.store(true, Ordering::SeqCst);
    collector.await.expect("collector");
    assert!(passes.load(Ordering::SeqCst) > 0, "passes ran meanwhile");

    // One more pass once the holds of the work have lapsed: everything acknowledged reads
    // back byte for byte.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    pass_now(&gc_config(&data_dir, blob_url.as_deref())).await;
    source.extend(imported);
    assert_source(&server, &live, &source).await;
    let live_layer = server.layer(&live, 1).await;
    assert_layer(&blobs, &live_layer, &layer).await;
    // The deleted environment's own blobs are gone; what the work wrote again is not.
    for gone in [
        Digest::of(&content("doomed's own file")),
        Digest::of(format!("doomed output of run {run}\n").as_bytes()),
        doomed_layer,
    ] {
        assert!(
            matches!(bytes_of(&blobs, &gone).await, Err(BlobError::NotFound(_))),
            "{gone} was reclaimed"
        );
    }
    for kept in ["imported again", "built again"] {
        assert!(bytes_of(&blobs, &Digest::of(&content(kept))).await.is_ok());
    }
    // What the passes reclaimed is counted, and how long they took.
    let metrics = server
        .client
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    let counted = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert!(
        counted("plinth_gc_reclaimed_objects_total") >= 3.0,
        "{metrics}"
    );
    assert!(
        counted("plinth_gc_reclaimed_bytes_total") > 0.0,
        "{metrics}"
    );
    assert!(
        counted("plinth_gc_pass_duration_seconds_count") >= 1.0,
        "{metrics}"
    );
    server.stop().await;
}

/// Runs the `plinth` binary with `args`; answers its standard output, failing the test on
/// anything but success.
fn plinth(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(args)
        .env_remove("PLINTH_CONFIG")
        .env("PLINTH_LOG", "warn")
        .output()
        .expect("run plinth");
    assert!(
        output.status.success(),
        "plinth {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plinth_gc_dry_run_prints_what_it_would_reclaim_and_reclaims_nothing() {
    // The server collects nothing by itself; `plinth gc` runs beside it.
    let server = Server::start_with(&["--gc-interval-seconds", "0"]).await;
    let data_dir = server.data_dir();
    let dir = data_dir.to_str().expect("utf-8").to_owned();
    let blobs = BlobStore::open(
        &format!("file://{}/blobs", data_dir.display()),
        data_dir.join("test-spool"),
    )
    .expect("store");
    let live = create_environment(&server, "Kept").await;
    put_file(&server, &live, "kept.txt", "kept\n").await;
    let doomed = create_environment(&server, "Dropped").await;
    let files: [&[u8]; 3] = [
        b"first dropped file\n",
        b"second\n",
        b"and a third, longer one\n",
    ];
    for (i, bytes) in files.iter().enumerate() {
        put_file(&server, &doomed, &format!("{i}.txt"), bytes.to_vec()).await;
    }
    let (status, _) = send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{doomed}"))),
    )
    .await;
    assert_eq!(status, 200);
    let bytes: usize = files.iter().map(|file| file.len()).sum();
    let line = format!("3 objects, {bytes} bytes");

    let dry = plinth(&[
        "gc",
        "--data-dir",
        &dir,
        "--dry-run",
        "--gc-grace-seconds",
        "0",
    ]);
    assert!(dry.contains(&format!("would reclaim {line}")), "{dry}");
    assert!(dry.contains("dry run: nothing was changed"), "{dry}");
    for file in files {
        assert!(
            bytes_of(&blobs, &Digest::of(file)).await.is_ok(),
            "a dry run removes nothing"
        );
    }
    // Within the grace period nothing goes either.
    let young = plinth(&["gc", "--data-dir", &dir]);
    assert!(young.contains("reclaimed 0 objects, 0 bytes"), "{young}");

    let real = plinth(&["gc", "--data-dir", &dir, "--gc-grace-seconds", "0"]);
    assert!(real.contains(&format!("reclaimed {line}")), "{real}");
    for file in files {
        assert!(matches!(
            bytes_of(&blobs, &Digest::of(file)).await,
            Err(BlobError::NotFound(_))
        ));
    }
    let again = plinth(&[
        "gc",
        "--data-dir",
        &dir,
        "--gc-grace-seconds",
        "0",
        "--dry-run",
    ]);
    assert!(
        again.contains("would reclaim 0 objects, 0 bytes"),
        "{again}"
    );
    let mut expected = BTreeMap::new();
    expected.insert("kept.txt".to_owned(), b"kept\n".to_vec());
    assert_source(&server, &live, &expected).await;
    let (_, listed) = send(server.client.get(server.url("/v1/environments"))).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1), "{listed}");
    server.stop().await;
}

/// Retention retires the versions past the newest `keep_versions`, and the same pass stops
/// counting their layers in their scope's stored bytes, as `GET /v1/usage` shows.
#[tokio::test]
async fn a_retired_versions_layer_leaves_its_scopes_stored_bytes() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&[
        "--builder-network",
        "false",
        "--gc-interval-seconds",
        "0",
        "--keep-versions",
        "1",
    ])
    .await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let id = create_environment(&server, "Retired").await;
    // Each version's layer holds 50,000 bytes of its own.
    for version in 1..=3u64 {
        put_file(
            &server,
            &id,
            "setup.sh",
            format!(
                "printf 'version {version} of run {run}\\n' > out.txt\nhead -c 50000 /dev/zero >> out.txt\n"
            ),
        )
        .await;
        let (status, body) = send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{id}/build"))),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        let built = wait_for_build(&server, &id, version, Duration::from_secs(120)).await;
        assert_eq!(built["status"], "ready", "{built}");
    }
    let used = |usage: &serde_json::Value| {
        usage["quotas"]["stored_bytes"]["used"]
            .as_u64()
            .unwrap_or_else(|| panic!("no stored bytes in {usage}"))
    };
    let (status, before) = send(server.client.get(server.url("/v1/usage"))).await;
    assert_eq!(status, 200, "{before}");

    // `plinth gc` runs retention with its own configuration, as an operator would give it.
    let mut config = gc_config(&server.data_dir(), None);
    config.catalog.keep_versions = 1;
    let outcome = pass_now(&config).await;
    let said = outcome.to_string();
    assert!(
        said.contains("retention removed 2 versions") && said.contains("stopped counting 2 layers"),
        "the pass retires versions 1 and 2 and lets their layers go: {said}"
    );
    let (status, after) = send(server.client.get(server.url("/v1/usage"))).await;
    assert_eq!(status, 200, "{after}");
    assert!(
        used(&after) + 100_000 <= used(&before),
        "the layers of versions 1 and 2 no longer count: {before} then {after}"
    );
    for version in [1, 2] {
        let (status, _) = send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{id}/builds/{version}"))),
        )
        .await;
        assert_eq!(status, 404, "version {version} was retired");
    }
    let (status, _) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/builds/3"))),
    )
    .await;
    assert_eq!(status, 200, "the active version stays");
    server.stop().await;
}

#[test]
fn gc_settings_come_from_the_file_the_environment_and_flags_and_show_in_dump_config() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("plinth.toml");
    std::fs::write(
        &file,
        "[gc]\ninterval_seconds = 5\ngrace_seconds = 6\nhold_seconds = 7\n[catalog]\nkeep_versions = 8\n",
    )
    .expect("config");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
        command
            .args(args)
            .env("PLINTH_CONFIG", &file)
            .env("PLINTH_DATA_DIR", dir.path());
        for name in [
            "PLINTH_GC_INTERVAL_SECONDS",
            "PLINTH_GC_GRACE_SECONDS",
            "PLINTH_GC_HOLD_SECONDS",
            "PLINTH_KEEP_VERSIONS",
            "PLINTH_RETENTION_DAYS",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let output = command.output().expect("run plinth");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    let env = [
        ("PLINTH_GC_GRACE_SECONDS", "60"),
        ("PLINTH_RETENTION_DAYS", "9"),
        ("PLINTH_KEEP_VERSIONS", "4"),
        // The split services' own files are fine here: the dump is what is asked for.
        ("PLINTH_STANDALONE", "true"),
    ];
    for command in ["serve", "source", "catalog", "gc"] {
        let (ok, dumped) = run(
            &[command, "--dump-config", "--gc-interval-seconds", "11"],
            &env,
        );
        assert!(ok, "{command}: {dumped}");
        let config: toml::Value = toml::from_str(&dumped).expect("the dump is TOML");
        assert_eq!(
            config["gc"]["interval_seconds"].as_integer(),
            Some(11),
            "the flag wins"
        );
        assert_eq!(
            config["gc"]["grace_seconds"].as_integer(),
            Some(60),
            "the variable wins"
        );
        assert_eq!(
            config["gc"]["hold_seconds"].as_integer(),
            Some(7),
            "the file"
        );
        assert_eq!(config["catalog"]["keep_versions"].as_integer(), Some(4));
        assert_eq!(config["catalog"]["retention_days"].as_integer(), Some(9));
    }
    let (ok, said) = run(&["serve", "--dump-config", "--keep-versions", "0"], &[]);
    assert!(!ok && said.contains("keep_versions"), "{said}");
}
