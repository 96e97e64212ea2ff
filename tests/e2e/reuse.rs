//! A reused build equals a fresh one (UHP §4: a version is what a build of its source
//! installs). Real builds, with no network: the project carries its wheel, its npm lock has no
//! dependencies, and its `prepare` script writes into the tree from a file that is not part of
//! the reuse key. Each version's layer is read back from the blob store and compared entry by
//! entry; every reuse-key input, changed alone, makes the next build run from scratch.

use std::collections::BTreeMap;
use std::time::Duration;

use plinth_blobs::BlobStore;
use plinth_blobs::tree::Tree;
use serde_json::{Value, json};

use crate::builds::put_tiny_wheel;
use crate::helpers::{Server, create_environment, exec_in, put_file, send, wait_for_build};

const BUILD_LIMIT: Duration = Duration::from_secs(180);

/// The system Python's `major.minor`, as builds find it.
fn system_python() -> String {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("python3");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Starts the next build (with `body`, if any) and waits for it to end.
async fn build(server: &Server, id: &str, version: u64, body: Option<Value>) -> Value {
    let mut request = server
        .client
        .post(server.url(&format!("/v1/environments/{id}/build")));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let (status, queued) = send(request).await;
    assert_eq!(status, 202, "{queued}");
    assert!(queued["clean"].is_boolean(), "{queued}");
    wait_for_build(server, id, version, BUILD_LIMIT).await
}

fn log(build: &Value) -> &str {
    build["log"].as_str().unwrap_or("")
}

fn assert_ready(build: &Value) {
    assert_eq!(
        build["status"],
        "ready",
        "log:\n{}\nerror: {}",
        log(build),
        build["error"]
    );
}

/// A version's layer: path to (kind, content digest, executable).
async fn layer(server: &Server, id: &str, version: u32) -> BTreeMap<String, String> {
    let blobs = BlobStore::open(
        &format!("file://{}", server.data_dir().join("blobs").display()),
        server.data_dir().join("spool"),
    )
    .expect("open");
    let digest = server.layer(id, version).await;
    let bytes = blobs
        .get(&digest)
        .await
        .expect("layer tree")
        .into_bytes()
        .await
        .expect("bytes");
    Tree::decode(&bytes)
        .expect("tree")
        .entries
        .into_iter()
        .map(|entry| {
            let digest = entry
                .file_digest()
                .map(|digest| digest.to_string())
                .unwrap_or_default();
            let shown = format!(
                "{:?} {digest} {} {}",
                entry.kind,
                entry.mode & 0o111 != 0,
                entry.target.clone().unwrap_or_default()
            );
            (entry.path, shown)
        })
        .collect()
}

/// The differences between two layers, for a failure message.
fn differences(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, entry) in a {
        match b.get(path) {
            None => out.push(format!("only in the first: {path}")),
            Some(other) if other != entry => out.push(format!("{path}: {entry} / {other}")),
            Some(_) => {}
        }
    }
    for path in b.keys().filter(|path| !a.contains_key(*path)) {
        out.push(format!("only in the second: {path}"));
    }
    out
}

const BUILD_JS: &str = "const fs = require('fs');\n\
    fs.mkdirSync('lib', { recursive: true });\n\
    fs.writeFileSync('lib/out.js', 'module.exports = ' + JSON.stringify(fs.readFileSync('src/message.txt', 'utf8')) + ';\\n');\n";

/// A project with a Python requirement in an included file, a Python pin, and an npm package
/// whose `prepare` script builds `lib/` from `src/`.
async fn fixture(server: &Server, name: &str) -> String {
    let id = create_environment(server, name).await;
    let python = system_python();
    for (path, content) in [
        (
            "requirements.txt",
            "--no-index\n--find-links wheels\n-r requirements/base.txt\n".to_owned(),
        ),
        ("requirements/base.txt", "tinypkg==1.0\n".to_owned()),
        (".python-version", format!("{python}\n")),
        (
            "package.json",
            r#"{"name": "fixture", "version": "1.0.0", "scripts": {"prepare": "node build.js"}}"#
                .to_owned(),
        ),
        (
            "package-lock.json",
            r#"{"name": "fixture", "version": "1.0.0", "lockfileVersion": 3, "requires": true, "packages": {"": {"name": "fixture", "version": "1.0.0"}}}"#
                .to_owned(),
        ),
        (".npmrc", "fund=false\n".to_owned()),
        ("build.js", BUILD_JS.to_owned()),
        ("src/message.txt", "first".to_owned()),
    ] {
        put_file(server, &id, path, content).await;
    }
    put_tiny_wheel(server, &id).await;
    id
}

const REUSED: &str = "the installers run over them";
const FROM_SCRATCH: &str = "installing from scratch";

#[tokio::test]
async fn a_reused_build_holds_what_a_fresh_build_of_the_same_source_holds() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = fixture(&server, "Reuse").await;

    let first = build(&server, &id, 1, None).await;
    assert_ready(&first);
    assert!(log(&first).contains(FROM_SCRATCH), "{}", log(&first));
    // The version records the toolchains its installers ran with.
    let toolchains = first["toolchains"].as_array().expect("toolchains");
    let python = toolchains
        .iter()
        .find(|toolchain| toolchain["name"] == "python")
        .expect("python recorded");
    assert!(
        python["version"]
            .as_str()
            .is_some_and(|version| version.starts_with(&format!("{}.", system_python()))),
        "{toolchains:?}"
    );
    assert!(
        toolchains
            .iter()
            .any(|toolchain| toolchain["name"] == "node"),
        "{toolchains:?}"
    );
    let (_, versions) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}/versions"))),
    )
    .await;
    assert_eq!(versions["data"][0]["toolchains"], first["toolchains"]);

    // A change outside the reuse key: the dependencies are reused, and the prepare script
    // still runs over them.
    put_file(&server, &id, "src/message.txt", "second").await;
    let reused = build(&server, &id, 2, None).await;
    assert_ready(&reused);
    assert!(log(&reused).contains(REUSED), "{}", log(&reused));
    let reused_layer = layer(&server, &id, 2).await;
    assert!(reused_layer.contains_key("lib/out.js"), "{reused_layer:?}");
    assert!(reused_layer.contains_key(".venv/bin/tinytool"));

    // The same source built clean: nothing reused, and the same layer entry for entry.
    let clean = build(&server, &id, 3, Some(json!({"clean": true}))).await;
    assert_ready(&clean);
    assert_eq!(clean["clean"], true);
    assert!(
        log(&clean).contains("a clean build was asked for") && !log(&clean).contains(REUSED),
        "{}",
        log(&clean)
    );
    let clean_layer = layer(&server, &id, 3).await;
    let differ = differences(&reused_layer, &clean_layer);
    assert!(
        differ.is_empty(),
        "reused and fresh layers differ:\n{differ:#?}"
    );
    // …and the lib/ the prepare script wrote is the second message's, not the first's.
    assert_ne!(
        reused_layer.get("lib/out.js"),
        layer(&server, &id, 1).await.get("lib/out.js")
    );

    // Each reuse-key input, changed alone, makes the next build install from scratch.
    let mut version = 3;
    for (path, content) in [
        ("requirements/base.txt", "tinypkg==1.0\n# pinned\n".to_owned()),
        (".python-version", format!("{}\n# pinned\n", system_python())),
        (".npmrc", "fund=false\naudit=false\n".to_owned()),
        ("package-lock.json", r#"{"name": "fixture", "version": "1.0.0", "lockfileVersion": 3, "requires": true, "packages": {"": {"name": "fixture", "version": "1.0.0"}}}
"#.to_owned()),
    ] {
        put_file(&server, &id, path, content).await;
        version += 1;
        let next = build(&server, &id, version, None).await;
        assert_ready(&next);
        assert!(
            log(&next).contains(FROM_SCRATCH) && !log(&next).contains(REUSED),
            "after changing {path}:\n{}",
            log(&next)
        );
    }
}

#[tokio::test]
async fn a_pin_that_cannot_be_met_fails_naming_what_was_asked_and_what_there_is() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = fixture(&server, "Pinned").await;
    put_file(&server, &id, ".python-version", "3.99\n").await;
    let failed = build(&server, &id, 1, None).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or("");
    assert!(
        error.contains("Python 3.99 (.python-version)")
            && error.contains(&format!("python {}.", system_python())),
        "{error}"
    );

    put_file(
        &server,
        &id,
        ".python-version",
        format!("{}\n", system_python()),
    )
    .await;
    put_file(&server, &id, ".nvmrc", "99\n").await;
    let failed = build(&server, &id, 2, None).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or("");
    assert!(
        error.contains("Node 99 (.nvmrc)") && error.contains("node "),
        "{error}"
    );
    // A failed build changed nothing: the environment has no active version.
    let (_, environment) = send(
        server
            .client
            .get(server.url(&format!("/v1/environments/{id}"))),
    )
    .await;
    assert_eq!(environment["version"], Value::Null, "{environment}");
}

#[tokio::test]
async fn a_failed_npm_install_keeps_the_debug_log_its_error_points_to() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Npm fails").await;
    put_file(
        &server,
        &id,
        "package.json",
        r#"{"name": "fails", "version": "1.0.0", "dependencies": {"absent": "file:vendor/absent-1.0.0.tgz"}}"#,
    )
    .await;
    let failed = build(&server, &id, 1, None).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let log = log(&failed);
    // npm's own error names its debug log, which lived in the discarded download cache: the
    // build log carries it.
    assert!(
        log.contains("A complete log of this run can be found in"),
        "{log}"
    );
    let kept = log
        .split("==> npm's debug log (")
        .nth(1)
        .unwrap_or_else(|| panic!("no debug log in the build log:\n{log}"));
    assert!(kept.contains("verbose"), "{kept}");
}

#[tokio::test]
async fn a_git_project_with_links_builds_the_same_fresh_and_by_reuse_and_a_new_origin_rebuilds() {
    use crate::imports::{git, git_import, import, linked_project_tar, scm_repository};
    if !crate::helpers::can_build() {
        return;
    }
    let repo = scm_repository();
    let url = format!("file://{}", repo.path().display());
    // setuptools-scm's node: `g` and the commit's first 9 hex digits.
    let short = git(repo.path(), &["rev-parse", "HEAD"])[..9].to_owned();
    let server = Server::start_with(&[
        "--git-allowed-schemes",
        "file",
        "--git-allow-private-addresses",
        "true",
        "--builder-network",
        "false",
    ])
    .await;
    let id = create_environment(&server, "Scm").await;
    let (status, report) = git_import(&server, &id, &url, "main").await;
    assert_eq!(status, 200, "{report}");
    let first = build(&server, &id, 1, None).await;
    assert_ready(&first);

    // Links and files outside the reuse key land over the git tree: a rebuild reuses.
    let (status, report) = import(&server, &id, "", linked_project_tar()).await;
    assert_eq!(status, 200, "{report}");
    let reused = build(&server, &id, 2, None).await;
    assert_ready(&reused);
    assert!(log(&reused).contains(REUSED), "{}", log(&reused));
    let clean = build(&server, &id, 3, Some(json!({"clean": true}))).await;
    assert_ready(&clean);
    let again = build(&server, &id, 4, Some(json!({"clean": true}))).await;
    assert_ready(&again);
    let (reused_layer, clean_layer) = (layer(&server, &id, 2).await, layer(&server, &id, 3).await);
    // Two fresh builds of this project already differ where uv records when the local
    // project's files last changed (its `uv_cache.json`, from their ctime, which no one can
    // set, and the RECORD listing it): reuse may differ there too, and nowhere else.
    let inherent: Vec<String> = differences(&clean_layer, &layer(&server, &id, 4).await)
        .into_iter()
        .map(|difference| difference.split(": ").next().unwrap_or("").to_owned())
        .collect();
    assert!(
        inherent
            .iter()
            .all(|path| path.ends_with(".dist-info/uv_cache.json")
                || path.ends_with(".dist-info/RECORD")),
        "two fresh builds differ beyond uv's record of the project's times: {inherent:#?}"
    );
    let differ: Vec<String> = differences(&reused_layer, &clean_layer)
        .into_iter()
        .filter(|difference| {
            !inherent
                .iter()
                .any(|path| difference.starts_with(&format!("{path}: ")))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "reused and fresh layers differ beyond what two fresh builds do ({inherent:#?}):\n{differ:#?}"
    );
    // The in-root link is in the layer as a link; the escaping ones are not.
    assert!(
        reused_layer
            .get("README.md")
            .is_some_and(|entry| entry.starts_with("Symlink") && entry.ends_with("docs/guide.md")),
        "{reused_layer:?}"
    );
    assert!(!reused_layer.contains_key("escape") && !reused_layer.contains_key("passwd"));
    // The version git describes is installed, in both.
    let metadata = format!(
        ".venv/lib/python{}/site-packages/scmpkg-1.4.1.dev1+g{short}.dist-info/METADATA",
        system_python()
    );
    assert!(
        reused_layer.contains_key(&metadata) && clean_layer.contains_key(&metadata),
        "{metadata} missing: {:?}",
        reused_layer
            .keys()
            .filter(|path| path.contains("dist-info"))
            .collect::<Vec<_>>()
    );

    // The tag: another commit, another version from git, so the installers run afresh.
    let (status, report) = git_import(&server, &id, &url, "v1.4.0").await;
    assert_eq!(status, 200, "{report}");
    let tagged = build(&server, &id, 5, None).await;
    assert_ready(&tagged);
    assert!(
        log(&tagged).contains(FROM_SCRATCH) && !log(&tagged).contains(REUSED),
        "{}",
        log(&tagged)
    );
    let tagged_layer = layer(&server, &id, 5).await;
    assert!(
        tagged_layer.contains_key(&format!(
            ".venv/lib/python{}/site-packages/scmpkg-1.4.0.dist-info/METADATA",
            system_python()
        )),
        "{:?}",
        tagged_layer
            .keys()
            .filter(|path| path.contains("dist-info"))
            .collect::<Vec<_>>()
    );
}

/// An environment named `title` holding an npm package `name` with no dependencies whose
/// `engines.node` is `engines` and whose `prepare` script records the Node that ran it.
async fn node_project(server: &Server, title: &str, name: &str, engines: &str) -> String {
    let id = create_environment(server, title).await;
    let manifest = json!({
        "name": name,
        "version": "1.0.0",
        "engines": { "node": engines },
        "scripts": { "prepare": "node --version > ran-with.txt" },
    });
    let lock = json!({
        "name": name,
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": true,
        "packages": { "": { "name": name, "version": "1.0.0" } },
    });
    for (path, content) in [("package.json", manifest), ("package-lock.json", lock)] {
        put_file(server, &id, path, content.to_string()).await;
    }
    id
}

#[tokio::test]
async fn a_pinned_node_from_the_toolchain_dirs_builds_the_version_and_runs_its_sessions() {
    use std::os::unix::fs::PermissionsExt as _;
    if !crate::helpers::can_build() {
        return;
    }
    // A "Node 99" in a toolchain directory under /opt (where sessions see it): it answers its
    // version itself and runs the system's node for everything else.
    let toolchain = tempfile::Builder::new()
        .prefix("plinth-test-node-")
        .tempdir_in("/opt")
        .expect("toolchain dir");
    std::fs::set_permissions(toolchain.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let node = toolchain.path().join("node");
    std::fs::write(
        &node,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo v99.1.0; exit 0; fi\nexec /usr/bin/node \"$@\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let server = Server::start_with_config(
        &format!(
            "[builder]\ntoolchain_dirs = [\"{}\"]\n",
            toolchain.path().display()
        ),
        &["--builder-network", "false"],
    )
    .await;
    let id = node_project(&server, "Node pinned", "pinned", ">=99").await;
    let built = build(&server, &id, 1, None).await;
    assert_ready(&built);
    assert!(
        log(&built).contains(&format!("Node 99.1.0 ({})", node.display())),
        "{}",
        log(&built)
    );
    let toolchains = built["toolchains"].as_array().expect("toolchains");
    assert!(
        toolchains.contains(
            &json!({"name": "node", "version": "99.1.0", "path": node.to_string_lossy()})
        ),
        "{toolchains:?}"
    );
    let session = crate::helpers::start_session_with(&server, json!({ "environment": id })).await;
    let session_id = session["id"].as_str().expect("session id");
    let ran = exec_in(
        &server,
        session_id,
        json!({ "command": "node --version && cat $PROJECT_ROOT/ran-with.txt" }),
    )
    .await;
    assert_eq!(ran["stdout"], "v99.1.0\nv99.1.0\n", "{ran}");

    // A range no offered Node meets is npm's warning, not a failure: the build installs with
    // the Node on PATH and its log says so.
    let unmet = node_project(&server, "Node unmet", "unmet", ">=199").await;
    let built = build(&server, &unmet, 1, None).await;
    assert_ready(&built);
    assert!(
        log(&built).contains(
            "==> warning: the project asks for Node >=199 (engines.node in package.json)"
        ),
        "{}",
        log(&built)
    );
}

/// A project whose `.venv` takes more than half a MiB (a ballast file `setup.sh` writes, the
/// same each time), so that a budget of 1 MiB holds one environment's kept trees, not two.
/// It installs no package: uv records when it unpacked a wheel into its download cache
/// (`uv_cache.json`), and two builds of one scope running at once do not share that cache,
/// so a package would differ by that time between builds that unpacked it apart.
async fn heavy_fixture(server: &Server, name: &str) -> String {
    let id = create_environment(server, name).await;
    for (path, content) in [
        ("requirements.txt", "--no-index\n"),
        (
            "setup.sh",
            "python3 -c \"open('.venv/ballast', 'wb').write(b'x' * 700000)\"\n",
        ),
        ("app.py", "print(0)\n"),
    ] {
        put_file(server, &id, path, content).await;
    }
    id
}

/// Where a reusing build's trees came from, as its log says.
fn reused_from(build: &Value) -> &'static str {
    if log(build).contains("(kept on this builder)") {
        "kept"
    } else if log(build).contains("(written out of the blob store)") {
        "blobs"
    } else {
        "neither"
    }
}

#[tokio::test]
async fn rebuilds_racing_the_eviction_of_kept_trees_all_equal_clean_builds() {
    if !crate::helpers::can_build() {
        return;
    }
    // Two builders, so the two environments' builds run at once, and a budget of one tree:
    // every build that keeps its environment's trees evicts the other's, while the other's
    // rebuild may be taking them.
    let server = Server::start_with_config(
        "[builder]\ncount = 2\nkept_dependencies_mb = 1\n[builder.limits]\ndisk_mb = 0\n",
        &["--builder-network", "false"],
    )
    .await;
    let ids = [
        heavy_fixture(&server, "Race one").await,
        heavy_fixture(&server, "Race two").await,
    ];
    let rebuilds = |id: String| {
        let server = &server;
        async move {
            let first = build(server, &id, 1, None).await;
            assert_ready(&first);
            let mut builds = Vec::new();
            for version in 2..=11u64 {
                put_file(server, &id, "app.py", format!("print({version})\n")).await;
                let rebuilt = build(server, &id, version, None).await;
                assert_ready(&rebuilt);
                assert!(log(&rebuilt).contains(REUSED), "{}", log(&rebuilt));
                builds.push((version, reused_from(&rebuilt)));
            }
            builds
        }
    };
    let (one, two) = tokio::join!(rebuilds(ids[0].clone()), rebuilds(ids[1].clone()));
    let sources: Vec<&str> = one.iter().chain(&two).map(|(_, from)| *from).collect();
    assert!(!sources.contains(&"neither"), "{sources:?}");

    // The budget holds one tree: after the race, one entry is kept; a rebuild of one
    // environment evicts the other's trees, whose next rebuild writes them out of the blob
    // store, and the one after that finds its own kept.
    let kept = server.data_dir().join("builder/kept");
    let entries = || {
        std::fs::read_dir(&kept)
            .expect("kept directory")
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(entries().len(), 1, "{:?} after {sources:?}", entries());
    let mut next = [12u64, 12];
    for (which, expected) in [(0, None), (1, Some("blobs")), (1, Some("kept"))] {
        let version = next[which];
        put_file(
            &server,
            &ids[which],
            "app.py",
            format!("print('after {version}')\n"),
        )
        .await;
        let rebuilt = build(&server, &ids[which], version, None).await;
        next[which] += 1;
        assert_ready(&rebuilt);
        if let Some(expected) = expected {
            assert_eq!(reused_from(&rebuilt), expected, "{}", log(&rebuilt));
        }
    }

    // Each environment's last source built clean: every rebuild's layer is that clean build's
    // entry for entry, but for the one file that changed.
    for ((id, builds), version) in ids.iter().zip([one, two]).zip(next) {
        let clean = build(&server, id, version, Some(json!({"clean": true}))).await;
        assert_ready(&clean);
        let mut clean_layer = layer(&server, id, u32::try_from(version).expect("small")).await;
        clean_layer.remove("app.py");
        assert!(clean_layer.contains_key(".venv/ballast"), "{clean_layer:?}");
        for (version, from) in builds {
            let mut rebuilt = layer(&server, id, u32::try_from(version).expect("small")).await;
            rebuilt.remove("app.py");
            let differ = differences(&rebuilt, &clean_layer);
            assert!(
                differ.is_empty(),
                "version {version} (trees {from}) differs from a clean build:\n{differ:#?}"
            );
        }
    }
}

#[tokio::test]
async fn a_project_without_a_lock_rebuilds_from_its_earlier_resolution() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with(&["--builder-network", "false"]).await;
    let id = create_environment(&server, "Lockless").await;
    let pyproject = "[project]\nname = \"lockless\"\nversion = \"1.0\"\n\
        requires-python = \">=3.8\"\ndependencies = [\"tinypkg==1.0\"]\n\n\
        [tool.uv]\npackage = false\nno-index = true\nfind-links = [\"wheels\"]\n";
    put_file(&server, &id, "pyproject.toml", pyproject).await;
    put_file(&server, &id, "app.py", "print(1)\n").await;
    put_tiny_wheel(&server, &id).await;
    let first = build(&server, &id, 1, None).await;
    assert_ready(&first);
    let first_layer = layer(&server, &id, 1).await;
    assert!(first_layer.contains_key("uv.lock"), "{first_layer:?}");

    // One source file changed: the manifests are the same, so the resolution uv wrote is
    // taken along rather than made again against the index.
    put_file(&server, &id, "app.py", "print(2)\n").await;
    let second = build(&server, &id, 2, None).await;
    assert_ready(&second);
    assert!(
        log(&second).contains("reusing the resolution version 1's build wrote (uv.lock)"),
        "{}",
        log(&second)
    );
    let mut second_layer = layer(&server, &id, 2).await;
    assert_eq!(second_layer.get("uv.lock"), first_layer.get("uv.lock"));
    let clean = build(&server, &id, 3, Some(json!({"clean": true}))).await;
    assert_ready(&clean);
    assert!(
        !log(&clean).contains("reusing the resolution"),
        "{}",
        log(&clean)
    );
    let mut clean_layer = layer(&server, &id, 3).await;
    second_layer.remove("app.py");
    clean_layer.remove("app.py");
    let differ = differences(&second_layer, &clean_layer);
    assert!(
        differ.is_empty(),
        "rebuilt and clean layers differ:\n{differ:#?}"
    );

    // A changed manifest is a new resolution: nothing is taken along.
    put_file(
        &server,
        &id,
        "pyproject.toml",
        format!("{pyproject}# changed\n"),
    )
    .await;
    let changed = build(&server, &id, 4, None).await;
    assert_ready(&changed);
    assert!(
        log(&changed).contains(FROM_SCRATCH) && !log(&changed).contains("reusing the resolution"),
        "{}",
        log(&changed)
    );
}
