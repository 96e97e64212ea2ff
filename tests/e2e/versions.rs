//! Versions from git as the project computes them: a `plinth push` of a hatch-vcs checkout and
//! a git import of a setuptools-scm project, built with the real build backends (from PyPI,
//! through the builds' egress proxy), install the version setuptools-scm computes by hand in
//! the checkout, by the project's own schemes; a git import whose history could not be
//! fetched says so in its answer and in the build log.
//!
//! setuptools-scm "by hand" is the real one, run on this host in the checkout: its wheels are
//! fetched by a build (its `setup.sh`), so that everything this file sends beyond loopback goes
//! through a build's egress proxy, as a tenant's would. These tests need PyPI: under CI,
//! which reaches it, they run; they are never skipped there.

use std::path::Path;
use std::time::Duration;

use plinth_blobs::BlobStore;
use plinth_blobs::tree::Tree;
use serde_json::{Value, json};

use crate::cli::Shell;
use crate::helpers::{Server, build_ready, create_environment, exec_in, put_file, send};
use crate::imports::{git, git_import};

const LIMIT: Duration = Duration::from_secs(300);

/// The setuptools-scm release computed by hand with, and what it needs, as wheels.
const FETCH_SETUPTOOLS_SCM: &str = r#"set -e
mkdir -p dl
python3 -m pip download --only-binary :all: setuptools-scm==10.3.4 -d dl
ls -l dl
"#;

/// Starts the next build of `id` and waits for it to be ready; answers its record.
async fn build(server: &Server, id: &str, version: u64) -> Value {
    build_ready(server, id, version, LIMIT).await
}

/// The version of the distribution `name` installed in `id`'s active version, as a session
/// reads it.
async fn installed_version(server: &Server, id: &str, name: &str) -> String {
    let session = crate::helpers::start_session_with(server, json!({ "environment": id })).await;
    let ran = exec_in(
        server,
        session["id"].as_str().expect("session id"),
        json!({
            "command": format!(
                "python3 -c 'import importlib.metadata as m; print(m.version(\"{name}\"))'"
            ),
            "timeout_ms": 60_000,
        }),
    )
    .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    ran["stdout"].as_str().unwrap_or("").trim().to_owned()
}

/// setuptools-scm's wheels, fetched by a build of their own and read from its layer as a node
/// reads it, written into `into`; answers their paths.
async fn setuptools_scm_wheels(server: &Server, into: &Path) -> Vec<std::path::PathBuf> {
    let id = create_environment(server, "Setuptools scm").await;
    put_file(server, &id, "setup.sh", FETCH_SETUPTOOLS_SCM).await;
    build(server, &id, 1).await;
    let blobs = BlobStore::open(
        &format!("file://{}", server.data_dir().join("blobs").display()),
        server.data_dir().join("spool"),
    )
    .expect("open");
    let tree = blobs
        .get(&server.layer(&id, 1).await)
        .await
        .expect("tree")
        .into_bytes()
        .await
        .expect("bytes");
    let tree = Tree::decode(&tree).expect("decode");
    let mut wheels = Vec::new();
    for entry in &tree.entries {
        let Some(name) = entry.path.strip_prefix("dl/") else {
            continue;
        };
        if !name.ends_with(".whl") {
            continue;
        }
        let bytes = blobs
            .get(&entry.file_digest().expect("a file"))
            .await
            .expect("blob")
            .into_bytes()
            .await
            .expect("bytes");
        let path = into.join(name);
        std::fs::write(&path, &bytes).expect("write wheel");
        wheels.push(path);
    }
    assert!(
        wheels
            .iter()
            .any(|wheel| wheel.to_string_lossy().contains("setuptools_scm-10.3.4")),
        "{wheels:?}"
    );
    wheels
}

/// `python3 -m setuptools_scm` in `checkout`, with the wheels on its path and the builds'
/// Python: the version the project computes by hand.
fn by_hand(checkout: &Path, wheels: &[std::path::PathBuf]) -> String {
    let path = std::env::join_paths(wheels).expect("a path list");
    let output = std::process::Command::new("python3")
        .args(["-m", "setuptools_scm"])
        .current_dir(checkout)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", checkout)
        .env("PYTHONPATH", path)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "setuptools-scm by hand: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn write(root: &Path, path: &str, content: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    std::fs::write(path, content).expect("write");
}

/// A setuptools project whose version comes from setuptools-scm, with `settings` in its
/// `[tool.setuptools_scm]`.
fn setuptools_scm_pyproject(settings: &str) -> String {
    format!(
        "[build-system]\nrequires = [\"setuptools>=64\", \"setuptools-scm>=8\"]\n\
         build-backend = \"setuptools.build_meta\"\n\n\
         [project]\nname = \"scmdemo\"\ndynamic = [\"version\"]\nrequires-python = \">=3.8\"\n\n\
         [tool.setuptools]\npackages = [\"scmdemo\"]\n\n\
         [tool.setuptools_scm]\n{settings}"
    )
}

#[tokio::test]
async fn a_git_import_builds_the_version_setuptools_scm_computes_by_hand_with_the_projects_schemes()
{
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
    ])
    .await;
    let tools = tempfile::tempdir().expect("tools");
    let wheels = setuptools_scm_wheels(&server, tools.path()).await;

    // Tagged v1.2.3, then two commits: setuptools-scm's defaults.
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    write(dir, "pyproject.toml", &setuptools_scm_pyproject(""));
    write(dir, "scmdemo/__init__.py", "");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "release"]);
    git(dir, &["tag", "v1.2.3"]);
    for change in ["one", "two"] {
        write(dir, "CHANGES.md", change);
        git(dir, &["add", "."]);
        git(dir, &["commit", "--quiet", "-m", change]);
    }
    let head = git(dir, &["rev-parse", "HEAD"]);
    let url = format!("file://{}", dir.display());
    let id = create_environment(&server, "Scm demo").await;

    let expected = by_hand(dir, &wheels);
    assert_eq!(
        expected,
        format!("1.2.4.dev2+g{}", &head[..9]),
        "setuptools-scm writes the node as the commit's first 9 hex digits"
    );
    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "{report}");
    assert!(report.get("warnings").is_none(), "{report}");
    let built = build(&server, &id, 1).await;
    assert_eq!(installed_version(&server, &id, "scmdemo").await, expected);
    assert!(
        built["log"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("==> version from git: {expected} (")),
        "{}",
        built["log"]
    );

    // The project's own local scheme: no node.
    write(
        dir,
        "pyproject.toml",
        &setuptools_scm_pyproject("local_scheme = \"no-local-version\"\n"),
    );
    git(dir, &["commit", "--quiet", "-am", "no local version"]);
    let expected = by_hand(dir, &wheels);
    assert_eq!(expected, "1.2.4.dev3");
    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "{report}");
    build(&server, &id, 2).await;
    assert_eq!(installed_version(&server, &id, "scmdemo").await, expected);
    server.stop().await;
}

/// A hatchling project whose version comes from hatch-vcs, with `raw_options` for
/// setuptools-scm.
fn hatch_vcs_pyproject(raw_options: &str) -> String {
    format!(
        "[build-system]\nrequires = [\"hatchling\", \"hatch-vcs\"]\nbuild-backend = \"hatchling.build\"\n\n\
         [project]\nname = \"vcsdemo\"\ndynamic = [\"version\"]\nrequires-python = \">=3.8\"\n\n\
         [tool.hatch.version]\nsource = \"vcs\"\nraw-options = {raw_options}\n\n\
         [tool.hatch.build.targets.wheel]\npackages = [\"vcsdemo\"]\n"
    )
}

#[tokio::test]
async fn a_pushed_hatch_vcs_checkout_builds_its_tag_and_its_uncommitted_changes() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start().await;
    let shell = Shell::new(&server);
    let id = create_environment(&server, "Vcs demo").await;
    let project = tempfile::tempdir().expect("project");
    let dir = project.path();
    git(dir, &["init", "--quiet"]);
    write(
        dir,
        "pyproject.toml",
        &hatch_vcs_pyproject("{ local_scheme = \"no-local-version\" }"),
    );
    write(dir, "vcsdemo/__init__.py", "");
    write(dir, ".gitignore", "*.log\n");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "release"]);
    git(dir, &["tag", "v1.2.3"]);
    let head = git(dir, &["rev-parse", "HEAD"]);
    let checkout = dir.to_str().expect("utf-8");

    // On the tag: the tag's version.
    let report = shell.json(&["push", &id, checkout]).await;
    assert_eq!(report["commit"], head.as_str(), "{report}");
    assert_eq!(report["describe"], "v1.2.3", "{report}");
    assert_eq!(report["ref"], "main", "{report}");
    assert_eq!(report["dirty"], false, "{report}");
    let built = build(&server, &id, 1).await;
    assert_eq!(installed_version(&server, &id, "vcsdemo").await, "1.2.3");
    assert!(
        built["log"].as_str().unwrap_or("").contains(
            "==> version from git: 1.2.3 (v1.2.3; the schemes of [tool.hatch.version.raw-options])"
        ),
        "{}",
        built["log"]
    );

    // A tracked file changed and not committed: setuptools-scm's next version (no local part,
    // by the project's scheme). An ignored or untracked file is no change.
    write(dir, "build.log", "noise\n");
    write(dir, "vcsdemo/__init__.py", "CHANGED = True\n");
    let pushed = shell.ok(&["push", &id, checkout]).await;
    assert!(
        pushed.contains("from git v1.2.3 with uncommitted changes"),
        "{pushed}"
    );
    build(&server, &id, 2).await;
    assert_eq!(
        installed_version(&server, &id, "vcsdemo").await,
        "1.2.4.dev0"
    );

    // Committed: one past the tag.
    git(dir, &["commit", "--quiet", "-am", "change"]);
    let report = shell.json(&["push", &id, checkout]).await;
    assert_eq!(report["dirty"], false, "{report}");
    build(&server, &id, 3).await;
    assert_eq!(
        installed_version(&server, &id, "vcsdemo").await,
        "1.2.4.dev1"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_git_import_without_its_history_says_so_in_its_answer_and_the_build_log() {
    if !crate::helpers::can_build() {
        return;
    }
    // A release tagged where the history holds 1 MiB that does not compress, and a tip
    // without it: the commit alone fits a 256 KiB fetch cap, its history and tags do not.
    let repo = tempfile::tempdir().expect("repo");
    let dir = repo.path();
    git(dir, &["init", "--quiet"]);
    // Filters would leave the history's files out of the fetch; this server allows none.
    git(dir, &["config", "uploadpack.allowFilter", "false"]);
    let noise = crate::helpers::incompressible(1 << 20);
    std::fs::write(dir.join("noise.bin"), noise).expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "release"]);
    git(dir, &["tag", "v1.0.0"]);
    git(dir, &["rm", "--quiet", "noise.bin"]);
    write(dir, "setup.sh", "echo built\n");
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "small again"]);
    let head = git(dir, &["rev-parse", "HEAD"]);
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
        "--git-max-fetch-bytes",
        "262144",
        "--builder-network",
        "false",
    ])
    .await;
    let id = create_environment(&server, "Shallow").await;
    let url = format!("file://{}", dir.display());

    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "the import lands: {report}");
    assert_eq!(report["files"], 1, "{report}");
    assert_eq!(report["describe"], &head[..7], "the commit alone: {report}");
    let warnings = report["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warnings.len(), 1, "{report}");
    let warning = warnings[0].as_str().unwrap_or("");
    assert!(
        warning.contains("history and tags")
            && warning.contains("could not be fetched")
            && warning.contains("source.git_max_fetch_bytes"),
        "{warning}"
    );

    let built = build(&server, &id, 1).await;
    let log = built["log"].as_str().unwrap_or("");
    assert!(
        log.contains(&format!(
            "==> warning: the git import's history/tags were not fetched; the version from git is 0.1.dev0+g{}",
            &head[..9]
        )),
        "{log}"
    );

    // The same repository under the default cap, which it fits: the tag is found and the
    // warning is gone.
    let server = server
        .restart(&[
            "--git-allowed-schemes",
            "file",
            "--git-allow-private-addresses",
            "true",
            "--builder-network",
            "false",
        ])
        .await;
    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["describe"],
        format!("v1.0.0-1-g{}", &head[..7]),
        "{report}"
    );
    assert!(report.get("warnings").is_none(), "{report}");
    let built = build(&server, &id, 2).await;
    let log = built["log"].as_str().unwrap_or("");
    assert!(!log.contains("history/tags were not fetched"), "{log}");
    assert!(
        log.contains(&format!(
            "==> version from git: 1.0.1.dev1+g{} (",
            &head[..9]
        )),
        "{log}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_checkouts_origin_in_the_query_is_checked_and_recorded_as_an_imports() {
    let server = Server::start().await;
    let id = create_environment(&server, "Pushed").await;
    let archive = crate::helpers::tar_of(
        &[("run.py".to_owned(), b"print('hi')\n".to_vec())]
            .into_iter()
            .collect(),
    );
    let commit = "4f1c2d9e1b7a3c5d8e9f0a1b2c3d4e5f6a7b8c9d";
    let import = |query: String| {
        let archive = archive.clone();
        let server = &server;
        let id = &id;
        async move {
            send(
                server
                    .client
                    .post(server.url(&format!("/v1/environments/{id}/import{query}")))
                    .body(archive),
            )
            .await
        }
    };
    for (query, why) in [
        (
            format!("?commit={commit}"),
            "a commit without its description",
        ),
        (
            "?describe=v1.0&dirty=true".to_owned(),
            "a description without its commit",
        ),
        (
            format!("?commit={}&describe=v1.0", &commit[..12]),
            "an abbreviated commit",
        ),
        (
            format!("?commit={commit}&describe=v1.0%0Aevil"),
            "a control character",
        ),
    ] {
        let (status, body) = import(query).await;
        crate::helpers::assert_error_in(why, status, &body, 400, "environment_invalid");
    }
    let (status, body) = send(
        server
            .client
            .post(server.url(&format!(
                "/v1/environments/{id}/import?commit={commit}&describe=v1.0"
            )))
            .json(&json!({"git": {"url": "https://example.com/x.git"}})),
    )
    .await;
    crate::helpers::assert_error_in(
        "with a git import",
        status,
        &body,
        400,
        "environment_invalid",
    );

    let (status, report) = import(format!(
        "?replace=true&commit={}&describe=v1.0-2-g4f1c2d9&ref=main&dirty=true&commits=7",
        commit.to_ascii_uppercase()
    ))
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["commit"], commit, "{report}");
    assert_eq!(report["describe"], "v1.0-2-g4f1c2d9", "{report}");
    assert_eq!(report["ref"], "main", "{report}");
    assert_eq!(report["dirty"], true, "{report}");
    // An archive without one that replaces the source answers none.
    let (status, report) = import("?replace=true".to_owned()).await;
    assert_eq!(status, 200, "{report}");
    assert!(report.get("commit").is_none(), "{report}");
    server.stop().await;
}
