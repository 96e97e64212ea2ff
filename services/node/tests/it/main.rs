//! The node's version cache against a real blob store: what a materialized version holds,
//! what a one-file change costs, what survives a restart, and what eviction removes.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use plinth_blobs::tree::{Tree, TreeEntry};
use plinth_blobs::{BlobStore, Digest};
use plinth_node::VersionCache;

struct Store {
    blobs: BlobStore,
    _dir: tempfile::TempDir,
}

fn store() -> Store {
    let dir = tempfile::tempdir().expect("tempdir");
    let blobs = BlobStore::open(
        &format!("file://{}", dir.path().join("blobs").display()),
        dir.path().join("spool"),
    )
    .expect("blob store");
    Store { blobs, _dir: dir }
}

/// Stores files (path, content, executable) and a tree naming them (plus `extra` entries).
async fn layer(blobs: &BlobStore, files: &[(&str, &str, bool)], extra: Vec<TreeEntry>) -> String {
    let mut entries = extra;
    for (path, content, executable) in files {
        let stored = blobs
            .put_bytes(content.as_bytes().to_vec().into())
            .await
            .expect("put");
        entries.push(TreeEntry::file(
            *path,
            stored.digest,
            content.len() as u64,
            *executable,
        ));
    }
    let tree = Tree::new(entries).encode().expect("encode");
    blobs
        .put_bytes(tree.into())
        .await
        .expect("tree")
        .digest
        .to_string()
}

const ENV: &str = "henv_0123456789abcdef0123456789abcdef";

fn files_of(version: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![version.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            let kind = entry.file_type().expect("type");
            let relative = path
                .strip_prefix(version)
                .expect("beneath")
                .to_string_lossy()
                .into_owned();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("link");
                found.push((relative, format!("-> {}", target.display())));
            } else {
                found.push((relative, std::fs::read_to_string(&path).expect("read")));
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn a_version_is_linked_from_verified_blobs_and_a_one_file_change_costs_one_fetch() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    let cache = VersionCache::open(root.path(), store.blobs.clone(), u64::MAX).expect("open");
    let files = [
        ("run.py", "print('one')\n", false),
        ("bin/tool", "#!/bin/sh\necho tool\n", true),
        ("lib/a.py", "A = 1\n", false),
        ("lib/same.py", "A = 1\n", false),
        ("lib/empty/__init__.py", "", false),
    ];
    let v1 = layer(
        &store.blobs,
        &files,
        vec![
            TreeEntry::dir("data/empty"),
            TreeEntry::symlink("bin/python", "/usr/bin/python3"),
        ],
    )
    .await;
    let first = cache.materialize(ENV, 1, &v1).await.expect("materialize");
    // Distinct contents: run.py, the tool, A = 1 (shared by two files); the empty file needs
    // no blob.
    assert_eq!(first.fetched, 3);
    assert_eq!(
        files_of(&first.path),
        vec![
            ("bin/python".to_owned(), "-> /usr/bin/python3".to_owned()),
            ("bin/tool".to_owned(), "#!/bin/sh\necho tool\n".to_owned()),
            ("lib/a.py".to_owned(), "A = 1\n".to_owned()),
            ("lib/empty/__init__.py".to_owned(), String::new()),
            ("lib/same.py".to_owned(), "A = 1\n".to_owned()),
            ("run.py".to_owned(), "print('one')\n".to_owned()),
        ]
    );
    assert!(first.path.join("data/empty").is_dir());
    let tool = std::fs::metadata(first.path.join("bin/tool")).expect("tool");
    assert_eq!(tool.permissions().mode() & 0o777, 0o555);
    let script = std::fs::metadata(first.path.join("run.py")).expect("run.py");
    assert_eq!(script.permissions().mode() & 0o777, 0o444);
    assert_eq!(
        std::fs::metadata(first.path.join("lib"))
            .expect("lib")
            .permissions()
            .mode()
            & 0o777,
        0o555
    );
    // Equal contents share one inode (hard links into the blob cache).
    let a = std::fs::metadata(first.path.join("lib/a.py")).expect("a");
    let same = std::fs::metadata(first.path.join("lib/same.py")).expect("same");
    assert_eq!(a.ino(), same.ino());

    // Cached: nothing fetched.
    let again = cache.materialize(ENV, 1, &v1).await.expect("again");
    assert_eq!(again.fetched, 0);

    // Version 2 changes one file: one fetch; unchanged files are the same inodes.
    let mut changed = files;
    changed[0] = ("run.py", "print('two')\n", false);
    let v2 = layer(&store.blobs, &changed, vec![]).await;
    let second = cache.materialize(ENV, 2, &v2).await.expect("v2");
    assert_eq!(second.fetched, 1);
    assert_eq!(
        std::fs::metadata(second.path.join("lib/a.py"))
            .expect("a")
            .ino(),
        a.ino()
    );
    assert_eq!(
        std::fs::read_to_string(first.path.join("run.py")).expect("v1 intact"),
        "print('one')\n"
    );
}

#[tokio::test]
async fn concurrent_attaches_materialize_a_version_once() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    let cache = VersionCache::open(root.path(), store.blobs.clone(), u64::MAX).expect("open");
    let files: Vec<(String, String)> = (0..200)
        .map(|i| (format!("pkg/m{i}.py"), format!("X = {i}\n")))
        .collect();
    let borrowed: Vec<(&str, &str, bool)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str(), false))
        .collect();
    let tree = layer(&store.blobs, &borrowed, vec![]).await;
    let attempts =
        futures::future::join_all((0..8).map(|_| cache.materialize(ENV, 1, &tree))).await;
    let fetched: u64 = attempts
        .into_iter()
        .map(|attempt| attempt.expect("materialize").fetched)
        .sum();
    assert_eq!(fetched, 200);
}

#[tokio::test]
async fn a_reopened_cache_finds_its_versions_and_drops_half_made_ones() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    let tree = layer(&store.blobs, &[("a.txt", "a", false)], vec![]).await;
    {
        let cache = VersionCache::open(root.path(), store.blobs.clone(), u64::MAX).expect("open");
        cache.materialize(ENV, 1, &tree).await.expect("materialize");
    }
    // A materialization cut short by a crash leaves only staging; and a blob half written.
    std::fs::create_dir_all(root.path().join("staging/abc/x")).expect("staging");
    std::fs::write(root.path().join("blobs/.tmp-partial"), "part").expect("tmp");
    let cache = VersionCache::open(root.path(), store.blobs.clone(), u64::MAX).expect("reopen");
    let cached: Vec<_> = cache
        .cached_versions()
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(cached, vec![(ENV.to_owned(), 1)]);
    assert_eq!(
        std::fs::read_dir(root.path().join("staging"))
            .expect("staging")
            .count(),
        0
    );
    assert!(!root.path().join("blobs/.tmp-partial").exists());
    assert_eq!(cache.blob_bytes(), 1);
    assert_eq!(
        cache
            .materialize(ENV, 1, &tree)
            .await
            .expect("cached")
            .fetched,
        0
    );
}

#[tokio::test]
async fn eviction_removes_least_recently_used_versions_that_nothing_keeps() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    // Room for about two versions' unique bytes.
    let cache = VersionCache::open(root.path(), store.blobs.clone(), 2500).expect("open");
    let shared = "s".repeat(500);
    let mut trees = Vec::new();
    for version in 1..=4u32 {
        let own = format!("{version}").repeat(1000);
        trees.push(
            layer(
                &store.blobs,
                &[("shared.txt", &shared, false), ("own.txt", &own, false)],
                vec![],
            )
            .await,
        );
    }
    for (index, tree) in trees.iter().enumerate() {
        let version = u32::try_from(index).expect("small") + 1;
        cache
            .materialize(ENV, version, tree)
            .await
            .expect("materialize");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Version 1 is used again (most recent now); version 2 is kept by a live session.
    cache.materialize(ENV, 1, &trees[0]).await.expect("touch");
    let keep: HashSet<(String, u32)> = [(ENV.to_owned(), 2)].into();
    let removed = cache.evict(&keep);
    assert_eq!(removed, vec![(ENV.to_owned(), 3), (ENV.to_owned(), 4)]);
    let mut left: Vec<u32> = cache
        .cached_versions()
        .into_iter()
        .map(|((_, v), _)| v)
        .collect();
    left.sort();
    assert_eq!(left, vec![1, 2]);
    // The blobs only versions 3 and 4 used are gone; the shared one stays.
    assert_eq!(cache.blob_bytes(), 2500);
    let shared_digest = Digest::of(shared.as_bytes()).to_hex();
    assert!(root.path().join("blobs").join(shared_digest).exists());
    assert_eq!(
        std::fs::read_to_string(cache.version_dir(ENV, 2).join("own.txt")).expect("kept"),
        "2".repeat(1000)
    );
}

#[tokio::test]
async fn a_tree_with_an_unsafe_path_is_refused_and_leaves_nothing() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    let cache = VersionCache::open(root.path(), store.blobs.clone(), u64::MAX).expect("open");
    let stored = store
        .blobs
        .put_bytes(b"x".to_vec().into())
        .await
        .expect("put");
    for bad in ["../escape", "/etc/x", "a/./b", "a//b"] {
        let entries = vec![TreeEntry::file(bad, stored.digest, 1, false)];
        let tree = Tree::new(entries).encode().expect("encode");
        let tree = store.blobs.put_bytes(tree.into()).await.expect("tree");
        let refused = cache.materialize(ENV, 9, &tree.digest.to_string()).await;
        assert!(refused.is_err(), "{bad}");
    }
    assert!(cache.cached_versions().is_empty());
    assert!(!root.path().join("escape").exists());
}

/// Where the node isolates sessions, a version that differs from a cached one by a few entries
/// is a layer over it: its directory holds what changed and a whiteout for what went, it
/// survives a restart with its base, its base is not evicted while it stays, and it goes when
/// its base is lost.
#[tokio::test]
async fn a_one_file_version_is_a_layer_over_its_base() {
    let store = store();
    let root = tempfile::tempdir().expect("tempdir");
    let open = |cap: u64| {
        VersionCache::open(root.path(), store.blobs.clone(), cap)
            .expect("open")
            .with_layers(true)
    };
    let cache = open(u64::MAX);
    let unchanged: Vec<(String, String)> = (0..8)
        .map(|n| (format!("lib/pkg/m{n}.py"), format!("x = {n}\n")))
        .collect();
    let mut files: Vec<(&str, &str, bool)> = unchanged
        .iter()
        .map(|(path, content)| (path.as_str(), content.as_str(), false))
        .collect();
    let mut first = files.clone();
    first.push(("run.py", "print(1)\n", false));
    first.push(("lib/old.txt", "old\n", false));
    let v1 = layer(&store.blobs, &first, vec![]).await;
    files.push(("run.py", "print(2)\n", false));
    let v2 = layer(&store.blobs, &files, vec![]).await;

    let whole = cache.materialize(ENV, 1, &v1).await.expect("version 1");
    assert!(whole.lower.is_empty());
    let layered = cache.materialize(ENV, 2, &v2).await.expect("version 2");
    assert_eq!(layered.fetched, 1);
    assert_eq!(layered.lower, vec![cache.version_dir(ENV, 1)]);
    // The layer holds run.py, the whiteout of lib/old.txt, and lib (its parent); nothing else.
    let mut held: Vec<String> = Vec::new();
    for top in std::fs::read_dir(&layered.path).expect("layer").flatten() {
        held.push(top.file_name().to_string_lossy().into_owned());
    }
    held.sort();
    assert_eq!(held, ["lib", "run.py"]);
    let lib: Vec<String> = std::fs::read_dir(layered.path.join("lib"))
        .expect("lib")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(lib, ["old.txt"]);
    assert_eq!(
        std::fs::read_to_string(layered.path.join("run.py")).expect("run.py"),
        "print(2)\n"
    );
    let whiteout = std::fs::symlink_metadata(layered.path.join("lib/old.txt")).expect("whiteout");
    assert_eq!((whiteout.mode() & 0o170000, whiteout.rdev()), (0o020000, 0));
    assert!(layered.has("run.py") && layered.has("lib"));
    assert_eq!(
        std::fs::read_to_string(cache.version_dir(ENV, 2).with_extension("base")).expect("base"),
        "1"
    );

    // A restart finds the layer and its base; nothing is fetched again.
    drop(cache);
    let cache = open(0);
    let again = cache.materialize(ENV, 2, &v2).await.expect("cached");
    assert_eq!(
        (again.fetched, again.lower.clone()),
        (0, vec![cache.version_dir(ENV, 1)])
    );

    // Over its cap, the cache keeps version 2 (a session reads it) and so its base too.
    let keep: HashSet<(String, u32)> = [(ENV.to_owned(), 2)].into();
    assert_eq!(cache.evict(&keep), vec![]);
    // Nothing kept: the layer goes first, then its base.
    assert_eq!(cache.evict(&HashSet::new()), vec![(ENV.to_owned(), 2)]);
    assert_eq!(cache.evict(&HashSet::new()), vec![(ENV.to_owned(), 1)]);
    assert!(!cache.version_dir(ENV, 2).with_extension("base").exists());

    // A layer whose base is gone is removed at start.
    let cache = open(u64::MAX);
    cache
        .materialize(ENV, 1, &v1)
        .await
        .expect("version 1 again");
    let layered = cache
        .materialize(ENV, 2, &v2)
        .await
        .expect("version 2 again");
    assert_eq!(layered.lower.len(), 1);
    drop(cache);
    std::fs::remove_dir_all(root.path().join("versions").join(ENV).join("1"))
        .or_else(|_| {
            std::process::Command::new("chmod")
                .args(["-R", "u+w"])
                .arg(root.path().join("versions").join(ENV).join("1"))
                .status()
                .map(|_| ())
                .and_then(|()| {
                    std::fs::remove_dir_all(root.path().join("versions").join(ENV).join("1"))
                })
        })
        .expect("lose version 1");
    let cache = open(u64::MAX);
    assert!(cache.cached_versions().is_empty());
    assert!(!cache.version_dir(ENV, 2).exists());
}
