//! One suite, every backend: each test runs against SQLite and PostgreSQL
//! (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use plinth_blobs::Digest;

use plinth_source::paths::SourcePath;
use plinth_source::persistence::{
    DigestSet, FailedCondition, IndexEntry, Kind, Origin, Stats, WriteCondition,
};
use plinth_source::{Index, IndexError};

macro_rules! index_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let index = super::open(&format!("sqlite://{}/source.db", dir.path().display())).await;
                    super::$test(index).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let plinth_catalog::testing::PostgresAvailability::Available(server) = plinth_catalog::testing::postgres() else { return };
                    let url = plinth_catalog::testing::fresh_postgres_database(&server).await;
                    let index = super::open(&url).await;
                    super::$test(index).await;
                }
            )*
        }
    };
}

index_suite!(
    files_make_their_directories_and_count_in_stats,
    a_file_cannot_become_a_directory_or_the_reverse,
    deleting_a_directory_removes_its_subtree_only,
    imports_land_whole_or_not_at_all,
    sources_are_separate_per_environment,
    conditional_writes_race_and_exactly_one_wins,
    an_origin_keeps_every_detail_until_an_archive_replaces_the_source,
);

async fn open(url: &str) -> Index {
    let index = Index::connect(url, 4).await.expect("connect");
    index.migrate().await.expect("migrate");
    index
}

fn path(text: &str) -> SourcePath {
    SourcePath::parse(text).expect("valid path")
}

fn paths(entries: &[IndexEntry]) -> Vec<(&str, Kind)> {
    entries
        .iter()
        .map(|entry| (entry.path.as_str(), entry.kind))
        .collect()
}

const ENV: &str = "henv_00000000000000000000000000000001";
const OTHER: &str = "henv_00000000000000000000000000000002";

async fn files_make_their_directories_and_count_in_stats(index: Index) {
    let digest = Digest::of(b"hello");
    index
        .write_file(ENV, &path("a/b/c.txt"), digest, 5, None)
        .await
        .expect("write");
    index
        .write_file(ENV, &path("a/top.sh"), digest, 5, Some(true))
        .await
        .expect("write");
    let listed = index.list(ENV).await.expect("list");
    assert_eq!(
        paths(&listed),
        [
            ("a", Kind::Directory),
            ("a/b", Kind::Directory),
            ("a/b/c.txt", Kind::File),
            ("a/top.sh", Kind::File)
        ]
    );
    let stats = index
        .stats(&[ENV.to_owned(), OTHER.to_owned()])
        .await
        .expect("stats");
    assert_eq!(
        stats.get(ENV),
        Some(&Stats {
            files: 2,
            bytes: 10
        })
    );
    assert_eq!(stats.get(OTHER), None);
    // Rewriting without saying keeps the executable bit.
    let rewritten = index
        .write_file(ENV, &path("a/top.sh"), Digest::of(b"x"), 1, None)
        .await
        .expect("rewrite");
    assert!(rewritten.executable);
    let stats = index.stats(&[ENV.to_owned()]).await.expect("stats");
    assert_eq!(stats.get(ENV), Some(&Stats { files: 2, bytes: 6 }));
}

async fn a_file_cannot_become_a_directory_or_the_reverse(index: Index) {
    let digest = Digest::of(b"x");
    index
        .write_file(ENV, &path("f"), digest, 1, None)
        .await
        .expect("write");
    index.make_directory(ENV, &path("d")).await.expect("mkdir");
    for result in [
        index
            .write_file(ENV, &path("f/inner"), digest, 1, None)
            .await,
        index.write_file(ENV, &path("d"), digest, 1, None).await,
    ] {
        assert!(
            matches!(result, Err(IndexError::Conflict { .. })),
            "{result:?}"
        );
    }
    let result = index.make_directory(ENV, &path("f")).await;
    assert!(
        matches!(result, Err(IndexError::Conflict { .. })),
        "{result:?}"
    );
    let result = index.make_directory(ENV, &path("f/sub")).await;
    assert!(
        matches!(result, Err(IndexError::Conflict { .. })),
        "{result:?}"
    );
    index
        .make_directory(ENV, &path("d"))
        .await
        .expect("an existing directory is fine");
    assert_eq!(
        paths(&index.list(ENV).await.expect("list")),
        [("d", Kind::Directory), ("f", Kind::File)]
    );
}

async fn deleting_a_directory_removes_its_subtree_only(index: Index) {
    let digest = Digest::of(b"x");
    for file in ["dir/a", "dir/sub/b", "dir0", "dir-x/c", "dirt"] {
        index
            .write_file(ENV, &path(file), digest, 1, None)
            .await
            .expect("write");
    }
    let removed = index.delete(ENV, &path("dir")).await.expect("delete");
    assert_eq!(removed, (2, 2));
    assert_eq!(
        paths(&index.list(ENV).await.expect("list")),
        [
            ("dir-x", Kind::Directory),
            ("dir-x/c", Kind::File),
            ("dir0", Kind::File),
            ("dirt", Kind::File)
        ]
    );
    assert!(matches!(
        index.delete(ENV, &path("dir")).await,
        Err(IndexError::NotFound(_))
    ));
    let stats = index.stats(&[ENV.to_owned()]).await.expect("stats");
    assert_eq!(stats.get(ENV), Some(&Stats { files: 3, bytes: 3 }));
}

async fn imports_land_whole_or_not_at_all(index: Index) {
    let digest = Digest::of(b"x");
    index
        .write_file(ENV, &path("keep.txt"), digest, 1, None)
        .await
        .expect("write");
    let file = |p: &str| IndexEntry {
        path: path(p),
        kind: Kind::File,
        digest: Some(digest),
        size: 1,
        executable: false,
        target: None,
    };
    // A conflict anywhere refuses everything.
    let bad = [file("new/one"), file("keep.txt/inside")];
    let result = index.apply_import(ENV, false, &bad).await;
    assert!(
        matches!(result, Err(IndexError::Conflict { .. })),
        "{result:?}"
    );
    assert_eq!(
        paths(&index.list(ENV).await.expect("list")),
        [("keep.txt", Kind::File)]
    );
    // Over what is there.
    index
        .apply_import(ENV, false, &[file("new/one")])
        .await
        .expect("import");
    assert_eq!(
        paths(&index.list(ENV).await.expect("list")),
        [
            ("keep.txt", Kind::File),
            ("new", Kind::Directory),
            ("new/one", Kind::File)
        ]
    );
    // Replacing clears first, so the same import that conflicted now lands.
    index
        .apply_import(ENV, true, &[file("keep.txt/inside")])
        .await
        .expect("replace");
    assert_eq!(
        paths(&index.list(ENV).await.expect("list")),
        [
            ("keep.txt", Kind::Directory),
            ("keep.txt/inside", Kind::File)
        ]
    );
    let stats = index.stats(&[ENV.to_owned()]).await.expect("stats");
    assert_eq!(stats.get(ENV), Some(&Stats { files: 1, bytes: 1 }));
}

async fn an_origin_keeps_every_detail_until_an_archive_replaces_the_source(index: Index) {
    let entry = |p: &str| IndexEntry {
        path: path(p),
        kind: Kind::File,
        digest: Some(Digest::of(b"x")),
        size: 1,
        executable: false,
        target: None,
    };
    let pushed = Origin {
        commit: "4f1c2d9e1b7a3c5d8e9f0a1b2c3d4e5f6a7b8c9d".to_owned(),
        reference: "main".to_owned(),
        describe: "v1.2.3-2-g4f1c2d9".to_owned(),
        dirty: true,
        history_incomplete: false,
        recorded_at: 1_772_600_767,
        commits: 42,
    };
    index
        .apply_git_import_held(ENV, true, &[entry("a.py")], None, &pushed)
        .await
        .expect("import");
    assert_eq!(
        index.origin(ENV).await.expect("origin"),
        Some(pushed.clone())
    );
    let imported = Origin {
        describe: "4f1c2d9".to_owned(),
        dirty: false,
        history_incomplete: true,
        commits: 0,
        ..pushed
    };
    index
        .apply_git_import_held(ENV, true, &[entry("a.py")], None, &imported)
        .await
        .expect("import");
    assert_eq!(
        index.origin(ENV).await.expect("origin"),
        Some(imported.clone()),
        "the last one wins, whole"
    );
    // Landed over the source, an archive keeps the origin; replacing it, forgets it.
    index
        .apply_import(ENV, false, &[entry("b.py")])
        .await
        .expect("import");
    assert_eq!(index.origin(ENV).await.expect("origin"), Some(imported));
    index
        .apply_import(ENV, true, &[entry("b.py")])
        .await
        .expect("import");
    assert_eq!(index.origin(ENV).await.expect("origin"), None);
}

async fn sources_are_separate_per_environment(index: Index) {
    let digest = Digest::of(b"x");
    index
        .write_file(ENV, &path("mine"), digest, 1, None)
        .await
        .expect("write");
    assert!(index.list(OTHER).await.expect("list").is_empty());
    assert!(
        index
            .get(OTHER, &path("mine"))
            .await
            .expect("get")
            .is_none()
    );
    index.drop_environment(ENV).await.expect("drop");
    assert!(index.list(ENV).await.expect("list").is_empty());
    assert!(
        index
            .stats(&[ENV.to_owned()])
            .await
            .expect("stats")
            .is_empty()
    );
}

/// Writers that read the same version and each write only if it is still that version
/// (HTTP `If-Match`): the check is in the write's transaction, so exactly one of them writes
/// and every other is refused with the winner's digest, whatever the interleaving.
async fn conditional_writes_race_and_exactly_one_wins(index: Index) {
    let read = Digest::of(b"read");
    index
        .write_file(ENV, &path("doc.txt"), read, 4, None)
        .await
        .expect("first version");
    let condition = WriteCondition {
        if_match: Some(DigestSet {
            any: false,
            digests: vec![read.to_string()],
        }),
        if_none_match: None,
    };
    let writers: Vec<_> = (0..8u8)
        .map(|n| {
            let index = index.clone();
            let condition = condition.clone();
            plinth_kit::tasks::spawn(async move {
                let digest = Digest::of(&[n]);
                let written = index
                    .write_file_checked(ENV, &path("doc.txt"), digest, 1, None, None, &condition)
                    .await;
                (digest, written)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut refused = Vec::new();
    for writer in writers {
        match writer.await.expect("writer") {
            (digest, Ok(_)) => winners.push(digest),
            (
                _,
                Err(IndexError::PreconditionFailed {
                    current, failed, ..
                }),
            ) => {
                assert_eq!(failed, FailedCondition::Match);
                refused.push(current);
            }
            (_, Err(other)) => panic!("unexpected: {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(refused.len(), 7);
    assert!(refused.iter().all(|current| *current == Some(winners[0])));
    let stored = index
        .get(ENV, &path("doc.txt"))
        .await
        .expect("get")
        .expect("the file");
    assert_eq!(stored.digest, Some(winners[0]));

    // Create-only: refused while a file is there, with nothing changed.
    let create_only = WriteCondition {
        if_match: None,
        if_none_match: Some(DigestSet {
            any: true,
            digests: Vec::new(),
        }),
    };
    let refused = index
        .write_file_checked(
            ENV,
            &path("doc.txt"),
            Digest::of(b"new"),
            3,
            None,
            None,
            &create_only,
        )
        .await;
    assert!(
        matches!(refused, Err(IndexError::PreconditionFailed { failed: FailedCondition::NoneMatch, current, .. }) if current == Some(winners[0]))
    );
    index
        .write_file_checked(
            ENV,
            &path("other.txt"),
            Digest::of(b"new"),
            3,
            None,
            None,
            &create_only,
        )
        .await
        .expect("a new file is created");
}
