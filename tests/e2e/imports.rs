//! `POST /v1/environments/{id}/import` through real HTTP against `plinth serve`: archives of
//! every kind, the wrapping directory, `replace`, what is skipped and why, refusals that
//! change nothing, and git repositories read through their objects.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, exec_in, files_under, send};

async fn environment(server: &Server) -> String {
    let (status, body) = send(
        server
            .client
            .post(server.url("/v1/environments"))
            .json(&json!({"name": "Imported"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

pub(crate) async fn import(
    server: &Server,
    id: &str,
    query: &str,
    archive: Vec<u8>,
) -> (u16, Value) {
    send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import{query}")))
            .header("content-type", "application/zip")
            .body(archive),
    )
    .await
}

async fn tree(server: &Server, id: &str) -> Vec<String> {
    let (_, body) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| {
            let kind = if entry["type"] == "directory" {
                "/"
            } else {
                ""
            };
            format!("{}{kind}", entry["path"].as_str().expect("path"))
        })
        .collect()
}

async fn read(server: &Server, id: &str, path: &str) -> Vec<u8> {
    let response = server
        .client
        .get(server.url(&format!("/v1/environments/{id}/files/{path}")))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "{path}");
    response.bytes().await.expect("body").to_vec()
}

/// A project wrapped in one directory, the shape of a repository archive.
fn project_tar_gz() -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut add = |path: &str, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, data)
            .expect("append");
    };
    add("studio-main/README.md", 0o644, b"# Studio\n");
    add("studio-main/run.py", 0o4755, b"print('run')\n");
    add("studio-main/assets/logo.bin", 0o666, &[0, 1, 2, 255]);
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    builder
        .append_link(&mut link, "studio-main/etc", "/etc")
        .expect("symlink");
    builder.into_inner().expect("tar").finish().expect("gz")
}

fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        writer
            .start_file(*name, zip::write::SimpleFileOptions::default())
            .expect("start");
        writer.write_all(data).expect("write");
    }
    writer.finish().expect("finish").into_inner()
}

#[tokio::test]
async fn a_wrapped_tar_gz_lands_stripped_with_links_skipped_and_modes_cleaned() {
    let server = Server::start().await;
    let id = environment(&server).await;
    let outside = tempfile::tempdir().expect("sentinel");
    let (status, report) = import(&server, &id, "", project_tar_gz()).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report,
        json!({
            "files": 3, "directories": 1, "bytes": 9 + 13 + 4, "skipped": 1,
            "skipped_by_reason": {"symlink": 1}, "stripped_wrapper": true
        })
    );
    assert_eq!(
        tree(&server, &id).await,
        ["README.md", "assets/", "assets/logo.bin", "run.py"]
    );
    assert_eq!(read(&server, &id, "assets/logo.bin").await, [0, 1, 2, 255]);
    let (_, listing) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    let run = listing["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|e| e["path"] == "run.py")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        run["executable"], true,
        "the executable bit is kept (setuid is not)"
    );
    let logo = listing["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|e| e["path"] == "assets/logo.bin")
        .cloned()
        .unwrap_or_default();
    assert_eq!(logo["executable"], false);
    assert!(files_under(outside.path()).is_empty());
    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    assert_eq!(environment["files"], json!({"count": 3, "bytes": 26}));
    server.stop().await;
}

#[tokio::test]
async fn imports_land_over_the_source_unless_replace_clears_it() {
    let server = Server::start().await;
    let id = environment(&server).await;
    let (status, _) = send(
        server
            .client
            .put(server.url(&format!("/v1/environments/{id}/files/notes.txt")))
            .body("mine"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, report) = import(
        &server,
        &id,
        "",
        zip_of(&[("a.txt", b"A"), ("dir/b.txt", b"B")]),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["stripped_wrapper"], false);
    assert_eq!(
        tree(&server, &id).await,
        ["a.txt", "dir/", "dir/b.txt", "notes.txt"]
    );
    let (status, report) =
        import(&server, &id, "?replace=true", zip_of(&[("only.txt", b"1")])).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(tree(&server, &id).await, ["only.txt"]);
    server.stop().await;
}

#[tokio::test]
async fn refused_archives_change_nothing() {
    let server = Server::start().await;
    let id = environment(&server).await;
    import(&server, &id, "", zip_of(&[("keep.txt", b"keep")])).await;
    let duplicate = {
        let mut builder = tar::Builder::new(Vec::new());
        for data in [&b"1"[..], b"2"] {
            let mut header = tar::Header::new_gnu();
            header.set_size(1);
            header.set_mode(0o644);
            builder
                .append_data(&mut header, "x.txt", data)
                .expect("append");
        }
        builder.into_inner().expect("tar")
    };
    let not_an_archive = b"just some text, not an archive".to_vec();
    let conflicting = zip_of(&[("keep.txt/inside", b"1"), ("other.txt", b"2")]);
    // A malformed archive is the request's fault (400); one whose file sits where the source
    // has a file it would need as a directory is well formed but in the way (409 conflict).
    for (archive, fragment, status, code) in [
        (duplicate, "more than once", 400, "environment_invalid"),
        (
            not_an_archive,
            "not a zip or tar",
            400,
            "environment_invalid",
        ),
        (conflicting, "keep.txt", 409, "conflict"),
    ] {
        let (got, body) = import(&server, &id, "", archive).await;
        assert_error(got, &body, status, code);
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_lowercase();
        assert!(
            message.contains(fragment),
            "{message:?} should mention {fragment:?}"
        );
        assert_eq!(tree(&server, &id).await, ["keep.txt"], "nothing changed");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_git_import_without_the_json_content_type_is_told_to_send_it() {
    let server = Server::start().await;
    let id = environment(&server).await;
    let body =
        r#"  {"git": {"url": "https://github.com/example/content-studio"}, "replace": true}"#;
    let url = server.url(&format!("/v1/environments/{id}/import"));
    // As `curl -d` sends it (form-encoded), and with no content type at all.
    for content_type in [Some("application/x-www-form-urlencoded"), None] {
        let mut request = server.client.post(&url).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let (status, answer) = send(request).await;
        assert_error(status, &answer, 400, "environment_invalid");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("Content-Type: application/json"),
            "{content_type:?}: {message}"
        );
    }
    assert_eq!(
        tree(&server, &id).await,
        Vec::<String>::new(),
        "nothing landed"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_member_past_the_file_limit_refuses_the_import() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("plinth.toml");
    std::fs::write(&config, "[source]\nmax_file_bytes = 1000\n").expect("config");
    let server = Server::start_with(&["--config", config.to_str().expect("utf-8")]).await;
    let id = environment(&server).await;
    // 1 MiB of zeros compresses to almost nothing: the limit counts what inflates.
    let (status, body) = import(
        &server,
        &id,
        "",
        zip_of(&[("small.txt", b"ok"), ("zeros.bin", &vec![0u8; 1 << 20])]),
    )
    .await;
    assert_error(status, &body, 413, "file_too_large");
    assert_eq!(body["error"]["detail"]["max_bytes"], 1000);
    assert!(tree(&server, &id).await.is_empty());
    server.stop().await;
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A repository with a file, an executable, a symlink and a submodule entry.
fn repository() -> tempfile::TempDir {
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    std::fs::write(dir.join("src/app.py"), "print('app')\n").expect("write");
    std::fs::write(dir.join("setup.sh"), "#!/bin/sh\n").expect("write");
    let mut permissions = std::fs::metadata(dir.join("setup.sh"))
        .expect("meta")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(dir.join("setup.sh"), permissions).expect("chmod");
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd")).expect("symlink");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "first"]);
    let commit = git(dir, &["rev-parse", "HEAD"]);
    git(
        dir,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{commit},vendor/lib"),
        ],
    );
    git(dir, &["commit", "--quiet", "-m", "submodule"]);
    git(dir, &["tag", "v1"]);
    repo
}

#[tokio::test]
async fn a_git_repository_imports_through_its_objects_dropping_links_and_submodules() {
    let repo = repository();
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
    ])
    .await;
    let id = environment(&server).await;
    let url = format!("file://{}", repo.path().display());
    for reference in ["main", "v1", ""] {
        let mut body = json!({"git": {"url": url}, "replace": true});
        if !reference.is_empty() {
            body["git"]["ref"] = json!(reference);
        }
        let (status, report) = send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{id}/import")))
                .json(&body),
        )
        .await;
        assert_eq!(status, 200, "{reference}: {report}");
        assert_eq!(report["files"], 2, "{report}");
        assert_eq!(report["skipped"], 2, "{report}");
        assert_eq!(
            report["skipped_by_reason"],
            json!({"submodule": 1, "symlink": 1})
        );
        // The submodule's directory stays, empty, as a checkout without submodules has it.
        assert_eq!(
            tree(&server, &id).await,
            ["setup.sh", "src/", "src/app.py", "vendor/"]
        );
    }
    assert_eq!(read(&server, &id, "src/app.py").await, b"print('app')\n");
    let (_, listing) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    assert_eq!(
        listing["data"][0]["executable"], true,
        "setup.sh keeps its executable bit"
    );
    server.stop().await;
}

#[tokio::test]
async fn git_urls_outside_the_policy_are_refused() {
    let repo = repository();
    let server = Server::start().await;
    let id = environment(&server).await;
    for url in [
        format!("file://{}", repo.path().display()),
        "http://127.0.0.1:1/repo.git".to_owned(),
        "https://127.0.0.1:1/repo.git".to_owned(),
        "ext::sh -c touch% /tmp/pwned".to_owned(),
        "ssh://git@127.0.0.1/repo.git".to_owned(),
    ] {
        let (status, body) = send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{id}/import")))
                .json(&json!({"git": {"url": url, "ref": "main"}})),
        )
        .await;
        assert_error(status, &body, 400, "environment_invalid");
    }
    assert!(tree(&server, &id).await.is_empty());
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import")))
            .json(&json!({"git": {"url": "https://example.com/x.git"}, "extra": 1})),
    )
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("extra")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_git_repository_larger_than_the_fetch_cap_is_refused_with_the_cap() {
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    // 1 MiB that does not compress, against a cap of 64 KiB.
    let noise = crate::helpers::incompressible(1 << 20);
    std::fs::write(dir.join("noise.bin"), noise).expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "big"]);
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
        "--git-max-fetch-bytes",
        "65536",
    ])
    .await;
    let id = environment(&server).await;
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import")))
            .json(&json!({"git": {"url": format!("file://{}", dir.display()), "ref": "main"}})),
    )
    .await;
    assert_error(status, &body, 413, "file_too_large");
    assert_eq!(body["error"]["detail"]["max_bytes"], 65536, "{body}");
    assert!(tree(&server, &id).await.is_empty(), "nothing was imported");
    let scratch = server.data_dir().join("spool/git");
    let left = std::fs::read_dir(&scratch).map_or(0, |entries| entries.count());
    assert_eq!(left, 0, "the fetch's directory is gone");
    server.stop().await;
}

#[tokio::test]
async fn hostile_member_names_are_dropped_and_nothing_lands_outside_the_root() {
    let server = Server::start().await;
    let id = environment(&server).await;
    let parent = server.data_dir();
    let before = files_under(&parent);
    let hostile: [&str; 7] = [
        "../evil.txt",
        "..\\evil.txt",
        "/abs-evil.txt",
        "C:/drive-evil.txt",
        "C:\\drive-evil2.txt",
        "ok/../../evil3.txt",
        "nul\0evil.txt",
    ];
    let mut entries: Vec<(&str, &[u8])> =
        hostile.iter().map(|name| (*name, &b"evil"[..])).collect();
    entries.push(("good.txt", b"good"));
    entries.push(("other/fine.txt", b"fine"));
    let (status, report) = import(&server, &id, "", zip_of(&entries)).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["files"], 2, "{report}");
    assert_eq!(report["skipped"], hostile.len(), "{report}");
    assert_eq!(
        report["skipped_by_reason"],
        json!({"unsafe_path": hostile.len()})
    );
    assert_eq!(
        tree(&server, &id).await,
        ["good.txt", "other/", "other/fine.txt"]
    );
    // Nothing was written anywhere as a file named by the archive: the data directory only
    // gained blobs and database pages, and no path outside it mentions "evil".
    let after = files_under(&parent);
    for (path, _) in after.iter().filter(|entry| !before.contains(entry)) {
        assert!(
            path.starts_with("blobs/")
                // The node keeps spare session directories ready, made in the background.
                || path.starts_with("node/sessions/.spare-")
                || path.ends_with(".db")
                || path.ends_with("-wal")
                || path.ends_with("-shm"),
            "unexpected file {path}"
        );
    }
    assert!(!after.iter().any(|(path, _)| path.contains("evil")));
    let grandparent = parent.parent().expect("temp root");
    assert!(!grandparent.join("evil.txt").exists() && !Path::new("/abs-evil.txt").exists());
    server.stop().await;
}

const BUILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

pub(crate) async fn git_import(
    server: &Server,
    id: &str,
    url: &str,
    reference: &str,
) -> (u16, Value) {
    send(
        server
            .client
            .post(server.url(&format!("/v1/environments/{id}/import")))
            .json(&json!({"git": {"url": url, "ref": reference}, "replace": true})),
    )
    .await
}

async fn session_exec(server: &Server, environment: &str, command: &str) -> Value {
    let session =
        crate::helpers::start_session_with(server, json!({"environment": environment})).await;
    let session_id = session["id"].as_str().expect("session id");

    exec_in(server, session_id, json!({ "command": command })).await
}

/// A PEP 517 backend inside the project (`backend-path = ["."]`), standing for
/// setuptools-scm offline: the wheel's version is `SETUPTOOLS_SCM_PRETEND_VERSION`, and a
/// build without it fails the way setuptools-scm does without `.git`.
const SCM_BACKEND: &str = r#"import os, zipfile

NAME = "scmpkg"

def _version():
    version = os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION")
    if not version:
        raise RuntimeError("unable to detect version: no .git and no SETUPTOOLS_SCM_PRETEND_VERSION")
    return version

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    info = f"{NAME}-{version}.dist-info"
    name = f"{NAME}-{version}-py3-none-any.whl"
    files = {
        f"{NAME}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n")
    return name

# A project with a pyproject.toml is installed editable (`uv sync`): the same wheel will do.
get_requires_for_build_editable = get_requires_for_build_wheel
build_editable = build_wheel
"#;

/// A setuptools-scm-style project in git: tagged `v1.4.0`, then one commit more.
pub(crate) fn scm_repository() -> tempfile::TempDir {
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    std::fs::write(
        dir.join("pyproject.toml"),
        "[build-system]\nrequires = []\nbuild-backend = \"scm_backend\"\nbackend-path = [\".\"]\n\n\
         [project]\nname = \"scmpkg\"\ndynamic = [\"version\"]\n",
    )
    .expect("write");
    std::fs::write(dir.join("scm_backend.py"), SCM_BACKEND).expect("write");
    std::fs::write(dir.join("requirements.txt"), "--no-index\n.\n").expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "release"]);
    git(dir, &["tag", "-a", "v1.4.0", "-m", "1.4.0"]);
    std::fs::write(dir.join("CHANGES.md"), "unreleased\n").expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "after the release"]);
    repo
}

#[tokio::test]
async fn a_git_import_reports_its_commit_and_a_build_installs_the_version_git_describes() {
    if !crate::helpers::can_build() {
        return;
    }
    let repo = scm_repository();
    let dir = repo.path();
    let head = git(dir, &["rev-parse", "HEAD"]);
    let short = git(dir, &["rev-parse", "--short=7", "HEAD"]);
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
        "--builder-network",
        "false",
    ])
    .await;
    let id = environment(&server).await;
    let url = format!("file://{}", dir.display());

    let (status, report) = git_import(&server, &id, &url, "v1.4.0").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["describe"], "v1.4.0", "{report}");
    assert_eq!(report["ref"], "v1.4.0", "{report}");
    assert_eq!(
        report["commit"],
        git(dir, &["rev-parse", "v1.4.0^{commit}"]),
        "{report}"
    );

    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["commit"], head.as_str(), "{report}");
    assert_eq!(report["ref"], "main");
    assert_eq!(
        report["describe"],
        format!("v1.4.0-1-g{short}"),
        "the history to the tag was fetched: {report}"
    );

    crate::helpers::build_ready(&server, &id, 1, BUILD_LIMIT).await;
    let ran = session_exec(
        &server,
        &id,
        "python3 -c 'import importlib.metadata as m; print(m.version(\"scmpkg\"))'",
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    // setuptools-scm's node: `g` and the commit's first 9 hex digits, whatever git's
    // description abbreviated.
    assert_eq!(
        ran["stdout"].as_str().unwrap_or("").trim(),
        format!("1.4.1.dev1+g{}", &head[..9]),
        "{ran}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_short_commit_id_imports_that_commit_or_asks_for_the_full_id() {
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    std::fs::write(dir.join("state.txt"), "first\n").expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "first"]);
    let first = git(dir, &["rev-parse", "HEAD"]);
    std::fs::write(dir.join("state.txt"), "second\n").expect("write");
    git(dir, &["commit", "--quiet", "-am", "second"]);
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
    ])
    .await;
    let id = environment(&server).await;
    let url = format!("file://{}", dir.display());

    for reference in [&first[..7], &first[..12], first.as_str()] {
        let (status, report) = git_import(&server, &id, &url, reference).await;
        assert_eq!(status, 200, "{reference}: {report}");
        assert_eq!(report["commit"], first.as_str(), "{report}");
        assert_eq!(read(&server, &id, "state.txt").await, b"first\n");
    }

    let (status, body) = git_import(&server, &id, &url, "deadbee").await;
    assert_error(status, &body, 400, "environment_invalid");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("full 40-character"), "{message}");
    assert_eq!(
        read(&server, &id, "state.txt").await,
        b"first\n",
        "nothing changed"
    );
    server.stop().await;
}

/// A project with links: two that stay inside (one up to the root), and three that would
/// leave it, one of them through a kept link.
pub(crate) fn linked_project_tar() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, path, data)
            .expect("append");
    };
    add("docs/guide.md", b"# the guide\n");
    add("tests/fixtures/data.txt", b"fixture\n");
    let mut link = |path: &str, target: &str| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        builder
            .append_link(&mut header, path, target)
            .expect("symlink");
    };
    link("README.md", "docs/guide.md");
    link("tests/fixtures/root", "../..");
    link("escape", "../../../etc");
    link("passwd", "/etc/passwd");
    link("tests/through", "fixtures/root/../etc");
    builder.into_inner().expect("tar")
}

#[tokio::test]
async fn links_in_the_root_are_kept_for_sessions_listed_on_request_never_served() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = environment(&server).await;
    let (status, report) = import(&server, &id, "", linked_project_tar()).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["symlinks"], 2, "{report}");
    assert_eq!(
        report["skipped_by_reason"],
        json!({"symlink": 3}),
        "{report}"
    );

    // The tree is files and directories (UHP §3); links are listed only when asked for.
    let (_, listing) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    let kinds: Vec<&str> = listing["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|entry| entry["type"].as_str().unwrap_or(""))
        .collect();
    assert!(
        kinds
            .iter()
            .all(|kind| ["file", "directory"].contains(kind)),
        "{listing}"
    );
    let (_, listing) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files?links=true"))),
    )
    .await;
    let entries = listing["data"].as_array().expect("data");
    let find = |path: &str| entries.iter().find(|e| e["path"] == path).cloned();
    let readme = find("README.md").expect("README.md listed");
    assert_eq!(readme["type"], "symlink", "{readme}");
    assert_eq!(readme["target"], "docs/guide.md", "{readme}");
    assert_eq!(
        find("tests/fixtures/root").expect("root link")["target"],
        "../.."
    );
    for dropped in ["escape", "passwd", "tests/through"] {
        assert!(find(dropped).is_none(), "{dropped} must not land");
    }
    // The files API serves no link, nor a path through one: builds and sessions keep them.
    for path in [
        "README.md",
        "tests/fixtures/root",
        "tests/fixtures/root/docs/guide.md",
    ] {
        let url = server.url(&format!("/v1/environments/{id}/files/{path}"));
        let (status, body) = send(server.client.get(&url)).await;
        assert_error(status, &body, 400, "environment_invalid");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("not served by the files API"),
            "{path}: {message}"
        );
        let head = server.client.head(&url).send().await.expect("HEAD");
        assert_eq!(head.status(), 400, "HEAD {path}");
    }
    assert_eq!(read(&server, &id, "docs/guide.md").await, b"# the guide\n");
    let (status, body) = send(server.client.delete(server.url(&format!(
        "/v1/environments/{id}/files/tests/fixtures/root/docs"
    ))))
    .await;
    assert_error(status, &body, 400, "environment_invalid");
    // Nothing is written over or through a link.
    for path in ["README.md", "tests/fixtures/root/planted.txt"] {
        let (status, body) = send(
            server
                .client
                .put(server.url(&format!("/v1/environments/{id}/files/{path}")))
                .body("planted"),
        )
        .await;
        assert_error(status, &body, 400, "environment_invalid");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("not served by the files API"),
            "{path}: {message}"
        );
    }

    crate::helpers::build_ready(&server, &id, 1, BUILD_LIMIT).await;
    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    let slug = environment["slug"].as_str().expect("slug").to_owned();
    let mount = format!("/env/{slug}");
    let ran = session_exec(
        &server,
        &id,
        &format!(
            "readlink {mount}/README.md; cat {mount}/README.md; \
             cat {mount}/tests/fixtures/root/tests/fixtures/data.txt; \
             ls -a {mount}; \
             echo planted > {mount}/tests/fixtures/root/planted.txt 2>/dev/null && echo WROTE; \
             ls {mount}/tests/fixtures/root/planted.txt 2>/dev/null || echo NOT-THERE"
        ),
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let stdout = ran["stdout"].as_str().unwrap_or("");
    assert!(
        stdout.starts_with("docs/guide.md\n# the guide\nfixture\n"),
        "{stdout}"
    );
    for dropped in ["escape", "passwd"] {
        assert!(!stdout.lines().any(|line| line == dropped), "{stdout}");
    }
    assert!(!stdout.contains("WROTE"), "{stdout}");
    assert!(stdout.contains("NOT-THERE"), "{stdout}");

    // DELETE of a link removes the link, and only it.
    let (status, body) = send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{id}/files/README.md"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, listing) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/files?links=true"))),
    )
    .await;
    let paths: Vec<&str> = listing["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|entry| entry["path"].as_str())
        .collect();
    assert!(!paths.contains(&"README.md"), "{listing}");
    assert!(paths.contains(&"docs/guide.md"), "{listing}");
    server.stop().await;
}
