//! Versions a node has not fetched, mounted lazily (a read-only FUSE file system in the node):
//! a session on one sees exactly what a session on the materialized version sees, cannot write
//! it, gets `EIO` (not a hang) for a file whose blob the store lost while the node stays
//! healthy, and reads correct bytes while the cache evicts under a small budget.

use std::time::Duration;

use serde_json::{Value, json};

use crate::builds::put_tiny_wheel;
use crate::helpers::{Server, build_ready, created_environment, put_file};
use crate::sessions::{exec, start_session};
use crate::waiting::eventually;

/// What `stat -f` names a FUSE file system (coreutils calls its magic number so).
const FUSE: &str = "fuseblk";

const BUILD_LIMIT: Duration = Duration::from_secs(120);

/// A node that mounts lazily and fetches nothing before a session asks.
const LAZY_NODE: &str = "[node]\nprewarm = []\n[builder]\nnetwork = false\n";

/// Every entry under the mount: kind, mode, size (files and links), link target, path; then
/// every file's SHA-256. Directories' sizes are the file system's own, not the version's.
const LISTING: &str = "cd \"$MOUNT\" && find . -mindepth 1 \\( -type d -printf '%y %m %p\\n' \\) -o -printf '%y %m %s %l %p\\n' | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum";

/// An environment with a virtual environment (links, executables), an empty file and nested
/// data, built: its id and slug.
async fn project(server: &Server, name: &str) -> (String, String) {
    let created = created_environment(server, json!({ "name": name })).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let slug = created["slug"].as_str().expect("slug").to_owned();
    put_tiny_wheel(server, &id).await;
    put_file(
        server,
        &id,
        "requirements.txt",
        "--no-index\n--find-links wheels\ntinypkg==1.0\n",
    )
    .await;
    put_file(server, &id, "run.py", "print('lazy one')\n").await;
    put_file(server, &id, "empty.txt", "").await;
    put_file(server, &id, "data/deep/nested/file.txt", "nested\n").await;
    build_ready(server, &id, 1, BUILD_LIMIT).await;
    (id, slug)
}

fn stdout(result: &Value) -> String {
    assert_eq!(result["exit_code"], 0, "{result}");
    result["stdout"].as_str().expect("stdout").to_owned()
}

async fn run(server: &Server, session: &Value, slug: &str, command: &str) -> Value {
    exec(server, session, &format!("MOUNT=/env/{slug}; {command}")).await
}

/// What file system a session sees at the mount.
async fn mount_type(server: &Server, session: &Value, slug: &str) -> String {
    stdout(&run(server, session, slug, "stat -f -c %T \"$MOUNT\"").await)
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_lazily_mounted_version_shows_exactly_what_the_materialized_one_shows() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with_config(LAZY_NODE, &[]).await;
    let (id, slug) = project(&server, "Lazy Studio").await;

    // The node never saw the version: the first session sees it through the lazy mount.
    let lazy = start_session(&server, &id).await;
    assert_eq!(mount_type(&server, &lazy, &slug).await, FUSE);
    // The host holds no mount of it: the session's namespace holds its own.
    assert_eq!(
        crate::helpers::mounts_under(&server.data_dir()),
        Vec::<String>::new()
    );
    let seen_lazily = stdout(&run(&server, &lazy, &slug, LISTING).await);
    for needle in [
        "l 777",
        ".venv/bin/python",
        "f 555",
        "f 444 0  ./empty.txt",
        "./data/deep/nested/file.txt",
        "d 555 ./.venv",
    ] {
        assert!(
            seen_lazily.contains(needle),
            "{needle:?} not in\n{seen_lazily}"
        );
    }
    // Its dependencies run from it.
    let ran = run(
        &server,
        &lazy,
        &slug,
        "tinytool && python -c 'import tinypkg; print(tinypkg.__file__)' && python3 \"$MOUNT/run.py\"",
    )
    .await;
    let printed = stdout(&ran);
    assert!(
        printed.contains("tinytool ran") && printed.contains("lazy one"),
        "{ran}"
    );

    // Read-only, whatever is tried, and says so like the materialized version does.
    let refused = run(
        &server,
        &lazy,
        &slug,
        "touch \"$MOUNT/new\"; echo x >> \"$MOUNT/run.py\"; mkdir \"$MOUNT/dir\"; rm \"$MOUNT/empty.txt\"; ln -s x \"$MOUNT/link\"; chmod 777 \"$MOUNT/run.py\"; python3 -c \"import os; print('rdonly', bool(os.statvfs('$MOUNT').f_flag & os.ST_RDONLY))\"",
    )
    .await;
    let stderr = refused["stderr"].as_str().expect("stderr");
    assert_eq!(
        stderr.matches("Read-only file system").count(),
        6,
        "{refused}"
    );
    assert!(
        refused["stdout"]
            .as_str()
            .expect("stdout")
            .contains("rdonly True"),
        "{refused}"
    );

    // Behind it the node fetched the whole version: a later session sees the cache's
    // directory, entry for entry the same.
    let whole = eventually(Duration::from_secs(60), async || {
        let session = start_session(&server, &id).await;
        let kind = mount_type(&server, &session, &slug).await;
        (kind != FUSE).then_some(session).ok_or(kind)
    })
    .await;
    let seen_whole = stdout(&run(&server, &whole, &slug, LISTING).await);
    assert_eq!(seen_lazily, seen_whole);
    // And the first session still reads its mount, unchanged.
    assert_eq!(
        stdout(&run(&server, &lazy, &slug, LISTING).await),
        seen_whole
    );
    assert_eq!(mount_type(&server, &lazy, &slug).await, FUSE);
}

#[tokio::test]
async fn a_blob_the_store_lost_fails_its_read_with_eio_and_the_node_stays_healthy() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with_config(LAZY_NODE, &[]).await;
    let (id, slug) = project(&server, "Lossy Studio").await;
    // The store loses run.py's blob (content addressed: its name is its bytes' digest).
    let hex = plinth_blobs::Digest::of(b"print('lazy one')\n").to_hex();
    let mut removed = 0;
    for entry in walkdir(&server.data_dir()) {
        if entry.file_name().is_some_and(|name| name == hex.as_str())
            && !entry.to_string_lossy().contains("/node/")
        {
            std::fs::remove_file(&entry).expect("remove the blob");
            removed += 1;
        }
    }
    assert!(
        removed > 0,
        "run.py's blob {hex} is not under the data directory"
    );

    let session = start_session(&server, &id).await;
    assert_eq!(mount_type(&server, &session, &slug).await, FUSE);
    let failed = run(&server, &session, &slug, "cat \"$MOUNT/run.py\"").await;
    assert_ne!(failed["exit_code"], 0, "{failed}");
    assert!(
        failed["stderr"]
            .as_str()
            .expect("stderr")
            .contains("Input/output error"),
        "{failed}"
    );
    // The rest of the version reads, the session runs commands, the node answers.
    let fine = run(
        &server,
        &session,
        &slug,
        "cat \"$MOUNT/data/deep/nested/file.txt\" && tinytool",
    )
    .await;
    assert_eq!(stdout(&fine), "nested\ntinytool ran\n");
    let ready = server
        .client
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    let another = start_session(&server, &id).await;
    assert_eq!(
        stdout(&run(&server, &another, &slug, "echo alive").await),
        "alive\n"
    );
}

#[tokio::test]
async fn sessions_read_correct_bytes_while_a_small_cache_evicts() {
    if !crate::helpers::can_build() {
        return;
    }
    let server = Server::start_with_config(
        "[node]\nprewarm = []\ncache_max_bytes = 1\n[builder]\nnetwork = false\n",
        &[],
    )
    .await;
    let (gone, _) = project(&server, "Evicted Studio").await;
    let (id, slug) = project(&server, "Reading Studio").await;
    let doomed = start_session(&server, &gone).await;
    let reader = start_session(&server, &id).await;
    assert_eq!(mount_type(&server, &reader, &slug).await, FUSE);
    let expected = stdout(&run(&server, &reader, &slug, LISTING).await);
    let cached = |environment: &str| {
        server
            .data_dir()
            .join("node/cache/versions")
            .join(environment)
            .join("1")
    };
    // The first environment's version is whole in the cache, then used by no session and
    // active nowhere: the cache is over its budget, so it goes.
    eventually(Duration::from_secs(60), async || {
        cached(&gone).exists().then_some(()).ok_or("not whole yet")
    })
    .await;
    let (status, _) = crate::helpers::send(server.client.delete(server.url(&format!(
        "/v1/sessions/{}",
        doomed["id"].as_str().expect("id")
    ))))
    .await;
    assert_eq!(status, 200);
    let (status, body) = crate::helpers::send(
        server
            .client
            .delete(server.url(&format!("/v1/environments/{gone}"))),
    )
    .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    // Meanwhile the session on the other version reads every byte right, again and again,
    // through its lazy mount (whose blobs the cache may sweep and fetch again).
    eventually(Duration::from_secs(60), async || {
        assert_eq!(
            stdout(&run(&server, &reader, &slug, LISTING).await),
            expected
        );
        (!cached(&gone).exists())
            .then_some(())
            .ok_or("the deleted environment's version is still cached")
    })
    .await;
    assert_eq!(
        stdout(&run(&server, &reader, &slug, LISTING).await),
        expected
    );
    assert_eq!(mount_type(&server, &reader, &slug).await, FUSE);
}

/// Every regular file under `dir`, recursively (none when it does not exist).
pub(crate) fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(kind) if kind.is_file() => found.push(path),
                _ => {}
            }
        }
    }
    found
}
