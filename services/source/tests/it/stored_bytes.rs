//! Stored bytes per scope, every backend: a blob counts once per scope however many files,
//! environments and layers hold it; a change past the scope's quota is refused and changes
//! nothing; concurrent writes at the last bytes let exactly one through; layers are counted
//! and let go; a source written before scopes were recorded is counted when first bound.

use std::collections::BTreeMap;

use plinth_blobs::Digest;
use plinth_kit::quota::{QuotaLimits, QuotaOverride, Quotas};
use plinth_source::paths::SourcePath;
use plinth_source::persistence::{IndexEntry, Kind};
use plinth_source::{Index, IndexError};

index_suite!(
    a_blob_counts_once_per_scope_however_many_files_hold_it,
    a_change_past_the_quota_is_refused_and_changes_nothing,
    concurrent_writes_at_the_last_bytes_let_exactly_one_through,
    layers_count_what_the_scope_holds_nowhere_else_and_let_go,
    a_source_written_before_scopes_is_counted_when_first_bound,
);

const ONE: &str = "henv_00000000000000000000000000000011";
const TWO: &str = "henv_00000000000000000000000000000012";
const THEIRS: &str = "henv_00000000000000000000000000000013";

async fn open(url: &str) -> Index {
    let index = Index::connect(url, 4).await.expect("connect");
    index.migrate().await.expect("migrate");
    index
}

fn path(text: &str) -> SourcePath {
    SourcePath::parse(text).expect("valid path")
}

/// `size` bytes of content unique to `seed`, and its digest.
fn blob(seed: &str, size: usize) -> (Digest, u64) {
    let mut bytes = seed.as_bytes().to_vec();
    bytes.resize(size.max(seed.len()), b'.');
    (Digest::of(&bytes), bytes.len() as u64)
}

async fn write(index: &Index, environment: &str, at: &str, (digest, size): (Digest, u64)) {
    index
        .write_file(environment, &path(at), digest, size, None)
        .await
        .expect("write");
}

/// 100 stored bytes for every scope but `big`, which has 1000.
fn limited(index: Index) -> Index {
    index.with_quotas(
        Quotas::new(QuotaLimits {
            stored_bytes: 100,
            ..QuotaLimits::DEFAULT
        })
        .with_scope(
            "big",
            QuotaOverride {
                stored_bytes: Some(1000),
                ..QuotaOverride::default()
            },
        ),
    )
}

async fn a_blob_counts_once_per_scope_however_many_files_hold_it(index: Index) {
    for environment in [ONE, TWO] {
        index.bind_scope(environment, "acme").await.expect("bind");
    }
    index.bind_scope(THEIRS, "globex").await.expect("bind");
    let shared = blob("shared", 40);
    // The same file in two environments of the scope, and twice in one: 40 bytes.
    write(&index, ONE, "a.bin", shared).await;
    write(&index, ONE, "copy/a.bin", shared).await;
    write(&index, TWO, "a.bin", shared).await;
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 40);
    // Another scope holding the same blob has its own 40.
    write(&index, THEIRS, "a.bin", shared).await;
    assert_eq!(index.stored_bytes("globex").await.expect("usage"), 40);
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 40);
    // Another blob adds its size.
    write(&index, TWO, "b.bin", blob("other", 7)).await;
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 47);
    // While any file holds it, the blob counts; after the last, it does not.
    index.delete(ONE, &path("copy")).await.expect("delete");
    index.delete(TWO, &path("a.bin")).await.expect("delete");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 47);
    index.delete(ONE, &path("a.bin")).await.expect("delete");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 7);
    // Overwriting a file lets go of what it held.
    write(&index, TWO, "b.bin", blob("s", 3)).await;
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 3);
    // An import replacing a source moves the count by what changed, once per blob.
    let entries = vec![
        IndexEntry {
            path: path("x/one"),
            kind: Kind::File,
            digest: Some(shared.0),
            size: shared.1,
            executable: false,
            target: None,
        },
        IndexEntry {
            path: path("x/two"),
            kind: Kind::File,
            digest: Some(shared.0),
            size: shared.1,
            executable: false,
            target: None,
        },
    ];
    index
        .apply_import(TWO, true, &entries)
        .await
        .expect("import");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 40);
    // Dropping a source lets go of everything it held; the other scope keeps its count.
    index.drop_environment(TWO).await.expect("drop");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 0);
    assert_eq!(index.stored_bytes("globex").await.expect("usage"), 40);
}

async fn a_change_past_the_quota_is_refused_and_changes_nothing(index: Index) {
    let index = limited(index);
    index.bind_scope(ONE, "acme").await.expect("bind");
    index.bind_scope(TWO, "acme").await.expect("bind");
    index.bind_scope(THEIRS, "big").await.expect("bind");
    let sixty = blob("sixty", 60);
    write(&index, ONE, "sixty.bin", sixty).await;
    let refused = index
        .write_file(ONE, &path("more.bin"), blob("more", 60).0, 60, None)
        .await;
    assert!(
        matches!(
            refused,
            Err(IndexError::QuotaExceeded {
                limit: 100,
                used: 60,
                adding: 60
            })
        ),
        "{refused:?}"
    );
    assert!(
        index
            .get(ONE, &path("more.bin"))
            .await
            .expect("get")
            .is_none()
    );
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 60);
    // The same blob again adds nothing, so it is taken even at the limit's edge.
    write(&index, TWO, "again.bin", sixty).await;
    // An import that would pass the quota is refused whole.
    let entries = vec![
        IndexEntry {
            path: path("small"),
            kind: Kind::File,
            digest: Some(blob("small", 10).0),
            size: 10,
            executable: false,
            target: None,
        },
        IndexEntry {
            path: path("big"),
            kind: Kind::File,
            digest: Some(blob("big", 50).0),
            size: 50,
            executable: false,
            target: None,
        },
    ];
    let refused = index.apply_import(TWO, false, &entries).await;
    assert!(
        matches!(refused, Err(IndexError::QuotaExceeded { .. })),
        "{refused:?}"
    );
    assert!(index.get(TWO, &path("small")).await.expect("get").is_none());
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 60);
    // The scope with a raised limit is served.
    write(&index, THEIRS, "sixty.bin", sixty).await;
    write(&index, THEIRS, "more.bin", blob("more", 60)).await;
    assert_eq!(index.stored_bytes("big").await.expect("usage"), 120);
    // Deleting always works, and frees room.
    index.delete(ONE, &path("sixty.bin")).await.expect("delete");
    index.delete(TWO, &path("again.bin")).await.expect("delete");
    write(&index, ONE, "more.bin", blob("more", 60)).await;
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 60);
}

async fn concurrent_writes_at_the_last_bytes_let_exactly_one_through(index: Index) {
    let index = limited(index);
    index.bind_scope(ONE, "acme").await.expect("bind");
    index.bind_scope(TWO, "acme").await.expect("bind");
    write(&index, ONE, "half.bin", blob("half", 50)).await;
    // Eight writes of 40 new bytes each race for the 50 left, on two environments.
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let index = index.clone();
            plinth_kit::tasks::spawn(async move {
                let environment = if n % 2 == 0 { ONE } else { TWO };
                let (digest, size) = blob(&format!("racer {n}"), 40);
                index
                    .write_file(environment, &path(&format!("r{n}")), digest, size, None)
                    .await
            })
        })
        .collect();
    let mut through = 0;
    for racer in racers {
        match racer.await.expect("join") {
            Ok(_) => through += 1,
            Err(IndexError::QuotaExceeded { limit: 100, .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(through, 1);
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 90);
}

fn layer(blobs: &[(Digest, u64)]) -> BTreeMap<String, u64> {
    blobs
        .iter()
        .map(|(digest, size)| (digest.to_string(), *size))
        .collect()
}

async fn layers_count_what_the_scope_holds_nowhere_else_and_let_go(index: Index) {
    let index = limited(index);
    index.bind_scope(ONE, "acme").await.expect("bind");
    let source = blob("run.py", 30);
    write(&index, ONE, "run.py", source).await;
    // The layer holds the source file and an installed one: only the latter is new.
    let installed = blob("site-packages", 20);
    let first = layer(&[source, installed]);
    assert!(
        index
            .record_layer("acme", ONE, 1, 0, "sha256:layer-one", &first)
            .await
            .expect("record")
    );
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 50);
    // Another version with the same layer adds nothing.
    index
        .record_layer("acme", ONE, 2, 0, "sha256:layer-one", &first)
        .await
        .expect("record");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 50);
    // A layer that would pass the quota is refused, and nothing of it is recorded.
    let bloated = layer(&[source, blob("wheelhouse", 80)]);
    let refused = index
        .record_layer("acme", ONE, 3, 0, "sha256:layer-bloated", &bloated)
        .await;
    assert!(
        matches!(
            refused,
            Err(IndexError::QuotaExceeded {
                limit: 100,
                used: 50,
                adding: 80
            })
        ),
        "{refused:?}"
    );
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 50);
    // A later attempt of version 3 replaces an earlier one's record; the earlier one, late,
    // changes nothing.
    let small = layer(&[source, blob("tiny", 5)]);
    index
        .record_layer("acme", ONE, 3, 1, "sha256:layer-small", &small)
        .await
        .expect("record");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 55);
    let retried = layer(&[source, blob("retried", 9)]);
    index
        .record_layer("acme", ONE, 3, 2, "sha256:layer-retried", &retried)
        .await
        .expect("record");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 59);
    assert!(
        !index
            .record_layer("acme", ONE, 3, 1, "sha256:layer-small", &small)
            .await
            .expect("late")
    );
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 59);
    // Forgetting an attempt's record lets go of what only it held; another attempt's stays.
    assert!(
        !index
            .forget_layer(ONE, 3, Some(1))
            .await
            .expect("another attempt's")
    );
    assert!(index.forget_layer(ONE, 3, Some(2)).await.expect("forget"));
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 50);
    // The source file leaves the source, but a layer still holds it.
    index.delete(ONE, &path("run.py")).await.expect("delete");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 50);
    // Dropping the environment lets go of its layers too.
    index.drop_environment(ONE).await.expect("drop");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 0);
}

async fn a_source_written_before_scopes_is_counted_when_first_bound(index: Index) {
    // Written as an earlier version wrote: no scope named.
    write(&index, ONE, "old.bin", blob("old", 25)).await;
    write(&index, ONE, "again.bin", blob("old", 25)).await;
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 0);
    index.bind_scope(ONE, "acme").await.expect("bind");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 25);
    // Binding again changes nothing; another scope cannot take the source.
    index.bind_scope(ONE, "acme").await.expect("bind");
    assert_eq!(index.stored_bytes("acme").await.expect("usage"), 25);
    let taken = index.bind_scope(ONE, "globex").await;
    assert!(
        matches!(taken, Err(IndexError::OtherScope { .. })),
        "{taken:?}"
    );
    assert_eq!(index.stored_bytes("globex").await.expect("usage"), 0);
}
