//! What an input may cost, measured on real processes: a flood of long archive member names
//! and a write over a huge sparse file leave `plinth serve`'s peak memory (`VmHWM` of the
//! child process) bounded; oversized listings and searches through Novo and Brain are
//! clamped and say so; and a blob damaged on disk is repaired by uploading the same file
//! again through the API.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, create_environment, create_environment_at, send};
use crate::novo::{Novo, SECRET};
use crate::processes::Process;

/// Peak memory `plinth serve` may reach importing [`long_names_archive`]; `docs/design/measured.md`
/// states it. Idle it holds ~40 MB; the import itself streams and keeps 32 bytes per member.
const IMPORT_PEAK_MAX_MB: u64 = 128;
/// Peak memory `plinth serve` may reach while writes over a 1 GiB file are refused.
const SPARSE_WRITE_PEAK_MAX_MB: u64 = 128;
/// Peak memory `plinth serve` may reach importing 50,000 files of 1,000-byte paths.
const VALID_NAMES_PEAK_MAX_MB: u64 = 200;
/// Peak memory `plinth serve` may reach answering oversized listings and searches. Unclamped,
/// the search with a million lines of context reached 4 GB. Clamped, a search may still hold
/// the file it reads (up to 64 MiB) beside its answer (4 MiB, and its JSON) and the process's
/// ~90 MB at rest: measured 144-164 MB on 2 cores, depending on how many allocator arenas
/// the threads that served it had made, so 160 failed now and then on a busy machine.
const SEARCH_PEAK_MAX_MB: u64 = 256;

/// `plinth serve` as a child process on `http`, with `extra` TOML appended to its config.
async fn serve(data: &std::path::Path, extra: &str) -> (Process, std::net::SocketAddr) {
    let config = data.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[gateway]\nlisten = \"127.0.0.1:0\"\n{extra}",
            data.display()
        ),
    )
    .expect("config");
    let log = std::fs::File::create(data.join("serve.log")).expect("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    crate::cluster::spawn_serve(&mut command).await
}

/// A Novo adapter registered on `environment` through the gateway at `base`, and a run of it.
async fn novo_run(client: &reqwest::Client, base: &str, environment: &str, run: &str) -> Novo {
    let (status, adapter) = send(
        client
            .post(format!("{base}/v1/workspace-adapters"))
            .json(&json!({ "protocol": "novo", "environment": environment, "secret": SECRET })),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    Novo {
        client: client.clone(),
        url: format!(
            "{base}/v1/workspace-adapters/{}/novo",
            adapter["id"].as_str().expect("id")
        ),
        secret: SECRET.to_owned(),
        run: run.to_owned(),
    }
}

/// A process's peak resident memory (`VmHWM`), in MB.
/// What [`import_into_a_new_environment`] leaves: the server, the environment, the import's
/// report, and the server's peak memory (MB) before the import.
struct Imported {
    client: reqwest::Client,
    base: String,
    id: String,
    process: Process,
    before: u64,
    report: serde_json::Value,
}

/// Starts `plinth serve` with no node and no builder on a data directory under `dir`, creates
/// an environment called `name`, notes the server's peak memory, and imports `archive` into it
/// (answered 200, or the test fails).
async fn import_into_a_new_environment(
    dir: &std::path::Path,
    name: &str,
    archive: Vec<u8>,
) -> Imported {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data");
    let client = crate::helpers::http_client();
    let (process, http) = serve(&data, "[node]\nenabled = false\n[builder]\ncount = 0\n").await;
    let base = format!("http://{http}");
    let id = create_environment_at(&client, &base, name).await;
    let before = peak_mb(&process);
    let (status, report) = send(
        client
            .post(format!("{base}/v1/environments/{id}/import"))
            .timeout(Duration::from_secs(600))
            .body(archive),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    Imported {
        client,
        base,
        id,
        process,
        before,
        report,
    }
}

fn peak_mb(process: &Process) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", process.0.id())).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024
}

/// A `.tar.gz` of `members` empty files, each named by ~15 KB (GNU long names), then one
/// ordinary file: a few MB compressed, 1.6 GB of headers inflated.
fn long_names_archive(path: &std::path::Path, members: usize) {
    let file = std::fs::File::create(path).expect("archive");
    let encoder = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    let mut builder = tar::Builder::new(encoder);
    let stem = "n".repeat(15_000);
    for n in 0..members {
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, format!("{n:06}-{stem}"), std::io::empty())
            .expect("member");
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "kept.txt", &b"kept\n"[..])
        .expect("member");
    builder
        .into_inner()
        .expect("tar")
        .finish()
        .expect("gzip")
        .flush()
        .expect("flush");
}

#[tokio::test]
async fn a_flood_of_long_member_names_is_skipped_and_the_import_stays_small() {
    let dir = tempfile::tempdir().expect("dir");
    let archive = dir.path().join("names.tar.gz");
    let members = 100_000;
    long_names_archive(&archive, members);
    let bytes = std::fs::read(&archive).expect("read");
    eprintln!("{members} long names: {} bytes compressed", bytes.len());
    assert!(bytes.len() < 8 << 20, "{} bytes compressed", bytes.len());

    let Imported {
        client,
        base,
        id,
        process,
        before,
        report,
    } = import_into_a_new_environment(dir.path(), "Names", bytes).await;
    assert_eq!(report["files"], 1, "{report}");
    assert_eq!(report["skipped"], members, "{report}");
    assert_eq!(
        report["skipped_by_reason"],
        json!({ "unsafe_path": members }),
        "{report}"
    );
    let (status, kept) = send(client.get(format!("{base}/v1/environments/{id}/files"))).await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["data"].as_array().map(Vec::len), Some(1), "{kept}");

    let after = peak_mb(&process);
    eprintln!("plinth serve peak memory: {before} MB before the import, {after} MB after");
    assert!(
        after <= IMPORT_PEAK_MAX_MB,
        "the import raised peak memory from {before} MB to {after} MB"
    );
}

/// The largest names an import lands (paths of 1,000 bytes, four components each, all
/// different), by the tens of thousands from a few MB: they are held once (the entries the
/// import lands), not once per step that looks at them.
#[tokio::test]
async fn an_import_of_many_long_valid_names_holds_each_name_once() {
    let dir = tempfile::tempdir().expect("dir");
    let members = 50_000;
    let archive = {
        let file = std::fs::File::create(dir.path().join("valid.tar.gz")).expect("archive");
        let encoder = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut builder = tar::Builder::new(encoder);
        for n in 0..members {
            let name = format!(
                "{n:07}{}/{}/{}/{}",
                "a".repeat(240),
                "b".repeat(250),
                "c".repeat(250),
                "d".repeat(250)
            );
            assert_eq!(name.len(), 1000);
            let mut header = tar::Header::new_gnu();
            header.set_size(0);
            header.set_mode(0o644);
            builder
                .append_data(&mut header, &name, std::io::empty())
                .expect("member");
        }
        builder.into_inner().expect("tar").finish().expect("gzip");
        std::fs::read(dir.path().join("valid.tar.gz")).expect("read")
    };
    eprintln!(
        "{members} valid 1,000-byte names: {} bytes compressed",
        archive.len()
    );

    let Imported {
        process,
        before,
        report,
        ..
    } = import_into_a_new_environment(dir.path(), "Valid names", archive).await;
    assert_eq!(report["files"], members, "{report}");
    assert_eq!(report["directories"], 3 * members, "{report}");
    let after = peak_mb(&process);
    eprintln!("plinth serve peak memory: {before} MB before the import, {after} MB after");
    // 50 MB of names landed, with their directories' 100 MB more.
    assert!(
        after <= VALID_NAMES_PEAK_MAX_MB,
        "the import raised peak memory from {before} MB to {after} MB"
    );
}

/// A Brain adapter's endpoint and token, on `base`.
async fn brain_adapter(
    client: &reqwest::Client,
    base: &str,
    environment: &str,
) -> (String, String) {
    let (status, adapter) = send(
        client
            .post(format!("{base}/v1/workspace-adapters"))
            .json(&json!({ "protocol": "brain", "environment": environment })),
    )
    .await;
    assert_eq!(status, 201, "{adapter}");
    (
        format!("{}/v1/operations", adapter["url"].as_str().expect("url")),
        adapter["token"].as_str().expect("token").to_owned(),
    )
}

/// One Brain operation of session `ses_bounds`; answers its receipt.
async fn brain(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    sequence: u64,
    request: Value,
) -> Value {
    let body = json!({
        "contract": "environment/v1",
        "operation": {
            "session_id": "ses_bounds",
            "environment": "plinth",
            "sequence": sequence,
            "request": request,
            "configuration": { "lifetime": "workspace" },
            "binding": {}, "template": {}, "context": {}, "reporter": {},
        }
    });
    let (status, answer) = send(client.post(url).bearer_auth(token).json(&body)).await;
    assert_eq!(status, 200, "{answer}");
    answer["receipt"].clone()
}

async fn brain_tool(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    sequence: u64,
    name: &str,
    input: Value,
) -> Value {
    let request = json!({ "type": "execute", "descriptor": { "kind": "tool", "name": name }, "input": input });
    brain(client, url, token, sequence, request).await
}

/// Builds an environment of one script on `base` (no network); its id.
async fn built(client: &reqwest::Client, base: &str, name: &str) -> String {
    let id = create_environment_at(client, base, name).await;
    let (status, put) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/run.py"))
            .body("print('hi')\n"),
    )
    .await;
    assert_eq!(status, 200, "{put}");
    let (status, queued) = send(client.post(format!("{base}/v1/environments/{id}/build"))).await;
    assert_eq!(status, 202, "{queued}");
    let build =
        crate::helpers::wait_for_build_at(client, base, &id, 1, Duration::from_secs(180)).await;
    assert_eq!(build["status"], "ready", "the build failed: {build}");
    id
}

/// Every file's bytes (apparent) and blocks on disk beneath the node's workspaces: the
/// snapshots and records writes keep.
fn workspace_state_bytes(data: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    let mut totals = (0, 0);
    let mut directories = vec![data.join("node").join("sessions")];
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(&directory)
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if metadata.is_dir() {
                // A session's own files (`work`) are not what the node keeps.
                if path.file_name().is_some_and(|name| name != "work") {
                    directories.push(path);
                }
            } else {
                totals.0 += metadata.len();
                totals.1 += metadata.blocks() * 512;
            }
        }
    }
    totals
}

/// A 1 GiB sparse file in a session's working directory, then a Brain `write_file`, a Novo
/// `editFile` and a Novo `writeRuntimeArtifact` over such files: each is refused with
/// `file_too_large` (the limit in its details) before the old content is read, the files are
/// unchanged, no snapshot of them is written, and the node's peak memory stays bounded.
#[tokio::test]
async fn writes_over_a_huge_sparse_file_are_refused_without_reading_it() {
    if !crate::helpers::can_build() {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().to_owned();
    let client = crate::helpers::http_client();
    let (process, http) = serve(&data, "[builder]\nnetwork = false\n").await;
    let base = format!("http://{http}");
    let environment = built(&client, &base, "Sparse").await;

    // Brain: a session, and a 1 GiB sparse file in its working directory.
    let (url, token) = brain_adapter(&client, &base, &environment).await;
    let setup = brain(&client, &url, &token, 1, json!({ "type": "setup" })).await;
    assert_eq!(setup["type"], "accepted", "{setup}");
    let ran = brain_tool(
        &client,
        &url,
        &token,
        2,
        "run_command",
        json!({ "command": "echo -n $PLINTH_SESSION_ID" }),
    )
    .await;
    let session = ran["output"]["stdout"]
        .as_str()
        .expect("session id")
        .to_owned();
    let workdir = crate::helpers::host_workdir(&data, &session);
    let big = workdir.join("big.bin");
    std::fs::File::create(&big)
        .and_then(|file| file.set_len(1 << 30))
        .expect("sparse file");
    let before = peak_mb(&process);

    let refused = brain_tool(
        &client,
        &url,
        &token,
        3,
        "write_file",
        json!({ "path": "big.bin", "contents": "small" }),
    )
    .await;
    assert_eq!(refused["type"], "failure", "{refused}");
    assert_eq!(refused["code"], "file_too_large", "{refused}");
    assert_eq!(refused["details"]["max_bytes"], 64 << 20, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|message| message.contains("big.bin")),
        "{refused}"
    );
    assert_eq!(std::fs::metadata(&big).expect("big").len(), 1 << 30);

    // Novo: its run's session, the same file, and an artifact path holding one.
    let novo = novo_run(&client, &base, &environment, "run_sparse").await;
    let session = novo.sh("echo -n $PLINTH_SESSION_ID").await;
    let workdir = crate::helpers::host_workdir(&data, &session);
    let novo_big = workdir.join("big.bin");
    std::fs::File::create(&novo_big)
        .and_then(|file| file.set_len(1 << 30))
        .expect("sparse file");
    let (status, body) = novo
        .call(
            "editFile",
            json!({ "path": "big.bin", "operation": "create", "contents": "small" }),
        )
        .await;
    assert_error(status, &body, 413, "file_too_large");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("67108864")),
        "the limit is named: {body}"
    );
    let tool_call = "call_sparse";
    let digest: String = sha2::Digest::finalize(sha2::Digest::chain_update(
        <sha2::Sha256 as sha2::Digest>::new(),
        tool_call.as_bytes(),
    ))
    .iter()
    .map(|byte| format!("{byte:02x}"))
    .collect();
    let artifacts = workdir.join(".novo/artifacts/run_sparse");
    std::fs::create_dir_all(&artifacts).expect("artifacts");
    let artifact = artifacts.join(format!("1-{}.txt", &digest[..16]));
    std::fs::File::create(&artifact)
        .and_then(|file| file.set_len(1 << 30))
        .expect("sparse artifact");
    let (status, body) = novo
        .call(
            "writeRuntimeArtifact",
            json!({ "runId": "run_sparse", "stepNumber": 1, "toolCallId": tool_call, "mediaType": "text/plain", "contents": "spill" }),
        )
        .await;
    assert_error(status, &body, 413, "file_too_large");

    for file in [&novo_big, &artifact] {
        assert_eq!(std::fs::metadata(file).expect("unchanged").len(), 1 << 30);
    }
    let (bytes, blocks) = workspace_state_bytes(&data);
    assert!(
        bytes < 1 << 20 && blocks < 1 << 20,
        "the node keeps {bytes} bytes ({blocks} on disk) of snapshots and records"
    );
    let after = peak_mb(&process);
    eprintln!("plinth serve peak memory: {before} MB before the writes, {after} MB after");
    assert!(
        after <= SPARSE_WRITE_PEAK_MAX_MB,
        "the writes raised peak memory from {before} MB to {after} MB"
    );

    // A small file is still written, and undone, as ever.
    let wrote = novo
        .ok(
            "editFile",
            json!({ "path": "small.txt", "operation": "create", "contents": "one\n" }),
        )
        .await;
    assert_eq!(wrote["created"], true, "{wrote}");
}

/// Counts past every maximum, through Novo and Brain, on a `plinth serve` child process:
/// listings hold at most 10,000 entries, searches at most 1,000 matches with lines of at most
/// 4 KiB and 20 lines of context each side, each answer says it was cut (`truncated`), and
/// the process's peak memory stays bounded (a search asking for a million lines of context
/// around each of a thousand 9 KB lines would otherwise answer gigabytes).
#[tokio::test]
async fn oversized_listings_and_searches_are_clamped_and_say_so() {
    if !crate::helpers::can_build() {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().to_owned();
    let client = crate::helpers::http_client();
    let (process, http) = serve(&data, "[builder]\nnetwork = false\n").await;
    let base = format!("http://{http}");
    let environment = built(&client, &base, "Clamped").await;
    let novo = novo_run(&client, &base, &environment, "run_clamped").await;
    novo.sh(
        "mkdir many && cd many && seq -w 1 10050 | xargs touch && cd .. && \
         python3 -c \"import sys; sys.stdout.write(('needle ' + 'x' * 9000 + '\\n') * 1200)\" > hay.txt",
    )
    .await;
    let before = peak_mb(&process);

    let listed = novo
        .ok(
            "listFiles",
            json!({ "path": "many", "max_entries": 1_000_000_000u64 }),
        )
        .await;
    assert_eq!(listed["entries"].as_array().map(Vec::len), Some(10_000));
    assert_eq!(listed["truncated"], true);
    let found = novo
        .ok(
            "findFiles",
            json!({ "pattern": "*", "path": "many", "max_entries": 1_000_000_000u64 }),
        )
        .await;
    assert_eq!(found["entries"].as_array().map(Vec::len), Some(10_000));
    assert_eq!(found["truncated"], true);
    let searched = novo
        .ok(
            "searchFiles",
            json!({ "pattern": "needle", "path": "hay.txt", "limit": 1_000_000_000u64, "max_results": 1_000_000_000u64, "max_bytes_per_match": 1_000_000_000u64 }),
        )
        .await;
    let matches = searched["matches"].as_array().expect("matches");
    assert_eq!(matches.len(), 1_000);
    assert_eq!(searched["truncated"], true);
    assert!(
        matches.iter().all(|found| found["preview"]
            .as_str()
            .is_some_and(|line| line.len() <= 4096)),
        "lines cut to 4 KiB"
    );
    let with_context = novo
        .ok(
            "searchFiles",
            json!({ "pattern": "needle", "path": "hay.txt", "context": 1_000_000u64, "limit": 1_000_000_000u64, "max_results": 1_000_000_000u64, "max_bytes_per_match": 1_000_000_000u64 }),
        )
        .await;
    assert_eq!(with_context["truncated"], true);
    let matches = with_context["matches"].as_array().expect("matches");
    assert!(
        !matches.is_empty() && matches.len() < 1_000,
        "{}",
        matches.len()
    );
    assert!(
        matches.iter().all(|found| {
            found["before"]
                .as_array()
                .is_some_and(|lines| lines.len() <= 20)
                && found["after"]
                    .as_array()
                    .is_some_and(|lines| lines.len() <= 20)
        }),
        "at most 20 lines of context each side"
    );

    // Brain's tools run on the same service, with the same bounds.
    let (url, token) = brain_adapter(&client, &base, &environment).await;
    assert_eq!(
        brain(&client, &url, &token, 1, json!({ "type": "setup" })).await["type"],
        "accepted"
    );
    brain_tool(
        &client,
        &url,
        &token,
        2,
        "run_command",
        json!({ "command": "mkdir many && cd many && seq -w 1 10050 | xargs touch" }),
    )
    .await;
    let listed = brain_tool(
        &client,
        &url,
        &token,
        3,
        "list_files",
        json!({ "path": "many", "max_entries": 1_000_000_000u64 }),
    )
    .await;
    assert_eq!(listed["type"], "result", "{listed}");
    assert_eq!(
        listed["output"]["entries"].as_array().map(Vec::len),
        Some(10_000)
    );
    assert_eq!(listed["output"]["truncated"], true);

    let after = peak_mb(&process);
    eprintln!(
        "plinth serve peak memory: {before} MB before the listings and searches, {after} MB after"
    );
    assert!(
        after <= SEARCH_PEAK_MAX_MB,
        "listings and searches raised peak memory from {before} MB to {after} MB"
    );
}

/// A stored blob damaged on disk (cut short, as a power cut can leave it): reading its file
/// fails closed, uploading the same file again through the API repairs it, and it reads
/// back byte for byte.
#[tokio::test]
async fn a_damaged_blob_is_repaired_by_uploading_the_same_file_again() {
    let server = Server::start().await;
    let id = &create_environment(&server, "Durable").await;
    for size in [100_000usize, 9 << 20] {
        let content: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let url = server.url(&format!("/v1/environments/{id}/files/data-{size}.bin"));
        let (status, stored) = send(server.client.put(&url).body(content.clone())).await;
        assert_eq!(status, 200, "{stored}");
        let digest = stored["digest"].as_str().expect("digest");
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        let blob = server
            .data_dir()
            .join("blobs/blobs/sha256")
            .join(&hex[..2])
            .join(hex);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&blob)
            .expect("the stored blob");
        file.set_len(size as u64 / 3).expect("cut it short");
        drop(file);

        let response = server.client.get(&url).send().await.expect("get");
        assert_ne!(response.status(), 200, "a damaged blob is never served");

        let (status, again) = send(server.client.put(&url).body(content.clone())).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["digest"], digest);
        let response = server.client.get(&url).send().await.expect("get");
        assert_eq!(response.status(), 200);
        let read = response.bytes().await.expect("bytes");
        assert!(read == content[..], "{size} bytes read back differ");
        assert_eq!(std::fs::metadata(&blob).expect("blob").len(), size as u64);
    }
    server.stop().await;
}
