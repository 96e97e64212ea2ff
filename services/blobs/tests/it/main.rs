//! The blob store conformance suite: every test runs against memory, local files and a real
//! S3-protocol server (`PLINTH_TEST_S3_ENDPOINT`, e.g. moto; required under CI).

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use plinth_blobs::{BlobError, BlobStore, Digest};

const S3_VAR: &str = "PLINTH_TEST_S3_ENDPOINT";

macro_rules! blob_suite {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let spool = tempfile::tempdir().expect("spool");
                    let store = plinth_blobs::BlobStore::open("memory://", spool.path().to_owned()).expect("open");
                    super::$test(store).await;
                }
            )*
        }
        mod file {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = tempfile::tempdir().expect("dir");
                    let url = format!("file://{}/blobs", dir.path().display());
                    let store = plinth_blobs::BlobStore::open(&url, dir.path().join("spool")).expect("open");
                    super::$test(store).await;
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = super::fresh_bucket().await else { return };
                    let spool = tempfile::tempdir().expect("spool");
                    let store = plinth_blobs::BlobStore::open(&url, spool.path().to_owned()).expect("open");
                    super::$test(store).await;
                }
            )*
        }
    };
}

blob_suite!(
    small_content_round_trips_under_its_digest,
    the_same_content_is_one_blob,
    large_content_streams_through_and_verifies,
    content_past_the_limit_is_refused_and_nothing_is_stored,
    a_failing_source_stores_nothing,
    a_corrupt_blob_is_refused_on_read,
    a_missing_blob_is_not_found,
    local_files_are_stored_once_each_and_only_when_missing,
    a_file_that_changed_after_hashing_is_not_stored,
    a_damaged_blob_is_replaced_by_storing_the_same_content_again,
    the_inventory_lists_every_blob_and_removes_what_it_is_told,
);

/// A new bucket on the S3 test server, or `None` when none is configured outside CI.
async fn fresh_bucket() -> Option<String> {
    let endpoint = match std::env::var(S3_VAR) {
        Ok(endpoint) if !endpoint.is_empty() => endpoint,
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "{S3_VAR} is not set under CI: the S3 conformance suite must run there (.ci/run starts the server)"
            )
        }
        _ => {
            eprintln!("{S3_VAR} is not set: skipping an S3 test (CI runs it)");
            return None;
        }
    };
    let bucket = format!("plinth-test-{}", uuid::Uuid::new_v4().simple());
    // The test server accepts unsigned bucket creation.
    plinth_blobs::install_tls_provider();
    let response = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .unwrap_or_else(|error| panic!("cannot reach the S3 test server at {endpoint}: {error}"));
    assert!(
        response.status().is_success(),
        "creating bucket: {}",
        response.status()
    );
    Some(format!(
        "s3://{bucket}/some/prefix?endpoint={endpoint}&allow_http=true&region=us-east-1&access_key_id=test&secret_access_key=test"
    ))
}

/// Every object under a prefix, so tests can see what was (not) stored.
async fn objects(store: &BlobStore) -> Vec<String> {
    store
        .object_store()
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list")
}

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i * 31 % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn small_content_round_trips_under_its_digest(store: BlobStore) {
    let every_byte: Bytes = (0..=255u8).collect::<Vec<u8>>().into();
    let blob = store.put_bytes(every_byte.clone()).await.expect("put");
    assert_eq!(blob.size, 256);
    assert_eq!(
        blob.digest.to_hex(),
        "40aff2e9d2d8922e47afd4648e6967497158785fbd1da870e7110266bf944880",
        "sha256 of bytes 0..=255"
    );
    assert!(store.contains(&blob.digest).await.expect("contains"));
    let read = store
        .get(&blob.digest)
        .await
        .expect("get")
        .into_bytes()
        .await
        .expect("bytes");
    assert_eq!(read, every_byte);
    assert_eq!(
        objects(&store).await,
        vec![BlobStore::location(&blob.digest).to_string()],
        "one object, under blobs/sha256/<2>/<64>"
    );
}

async fn the_same_content_is_one_blob(store: BlobStore) {
    let first = store
        .put_bytes(Bytes::from_static(b"hello"))
        .await
        .expect("put");
    let chunks = futures::stream::iter(
        ["he", "l", "lo"].map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()))),
    );
    let second = store.put_stream(chunks, 1024).await.expect("put again");
    assert_eq!(first, second);
    assert_eq!(objects(&store).await.len(), 1);
    let empty = store.put_bytes(Bytes::new()).await.expect("empty");
    assert_eq!(empty.size, 0);
    assert_eq!(store.get(&empty.digest).await.expect("get").size(), 0);
}

async fn large_content_streams_through_and_verifies(store: BlobStore) {
    // 20 MiB + a bit, in 64 KiB chunks: past the in-memory limit, through a multipart upload.
    let content = pattern(20 * 1024 * 1024 + 12_345);
    let expected = Digest::of(&content);
    let chunks: Vec<Bytes> = content
        .chunks(64 * 1024)
        .map(Bytes::copy_from_slice)
        .collect();
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
    let blob = store
        .put_stream(stream, 64 * 1024 * 1024)
        .await
        .expect("put");
    assert_eq!(blob.digest, expected);
    assert_eq!(blob.size, content.len() as u64);
    assert_eq!(
        objects(&store).await,
        vec![BlobStore::location(&expected).to_string()],
        "no staging left behind"
    );
    let verified = store.get(&expected).await.expect("get");
    assert_eq!(verified.size(), content.len() as u64);
    let read: Vec<Bytes> = verified.into_stream().try_collect().await.expect("read");
    let read: Vec<u8> = read.concat();
    assert!(read == content[..], "bytes differ");
}

async fn content_past_the_limit_is_refused_and_nothing_is_stored(store: BlobStore) {
    for (total, limit) in [(1000usize, 999u64), (12 * 1024 * 1024, 10 * 1024 * 1024)] {
        let content = pattern(total);
        let chunks: Vec<Bytes> = content
            .chunks(64 * 1024)
            .map(Bytes::copy_from_slice)
            .collect();
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        let error = store
            .put_stream(stream, limit)
            .await
            .expect_err("too large");
        assert!(
            matches!(error, BlobError::TooLarge { max_bytes } if max_bytes == limit),
            "{error}"
        );
        assert!(
            !store
                .contains(&Digest::of(&content))
                .await
                .expect("contains")
        );
    }
    assert_eq!(
        objects(&store).await,
        Vec::<String>::new(),
        "nothing stored, nothing staged"
    );
    // Exactly at the limit is fine.
    let content = pattern(999);
    let stream = futures::stream::iter([Ok::<_, std::io::Error>(content.clone())]);
    store.put_stream(stream, 999).await.expect("at the limit");
}

async fn a_failing_source_stores_nothing(store: BlobStore) {
    for good_bytes in [100usize, 10 * 1024 * 1024] {
        let first = pattern(good_bytes);
        let stream =
            futures::stream::iter([Ok(first), Err(std::io::Error::other("client went away"))]);
        let error = store
            .put_stream(stream, u64::MAX)
            .await
            .expect_err("source failed");
        assert!(matches!(error, BlobError::Source(_)), "{error}");
    }
    assert_eq!(objects(&store).await, Vec::<String>::new());
}

async fn a_corrupt_blob_is_refused_on_read(store: BlobStore) {
    for size in [10usize, 9 * 1024 * 1024] {
        let content = pattern(size);
        let blob = store.put_bytes(content.clone()).await.expect("put");
        let mut tampered = content.to_vec();
        tampered[size / 2] ^= 0xff;
        store
            .object_store()
            .put(
                &BlobStore::location(&blob.digest),
                PutPayload::from(tampered),
            )
            .await
            .expect("tamper");
        let error = store.get(&blob.digest).await.expect_err("corrupt");
        assert!(
            matches!(error, BlobError::Corrupt(digest) if digest == blob.digest),
            "{error}"
        );
    }
}

async fn a_missing_blob_is_not_found(store: BlobStore) {
    let digest = Digest::of(b"never stored");
    assert!(!store.contains(&digest).await.expect("contains"));
    let error = store.get(&digest).await.expect_err("missing");
    assert!(
        matches!(error, BlobError::NotFound(d) if d == digest),
        "{error}"
    );
}

async fn local_files_are_stored_once_each_and_only_when_missing(store: BlobStore) {
    let dir = tempfile::tempdir().expect("dir");
    let (same, other, large) = (pattern(100), pattern(200), pattern(3 * 1024 * 1024 + 7));
    let mut files = Vec::new();
    for (name, content) in [
        ("a", &same),
        ("b", &same),
        ("c", &other),
        ("d", &large),
        ("e", &Bytes::new()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        files.push((path, Digest::of(content)));
    }
    // Many files, to keep several writers busy.
    for n in 0..200 {
        let content = pattern(n * 7);
        let path = dir.path().join(format!("many-{n}"));
        std::fs::write(&path, &content).expect("write");
        files.push((path, Digest::of(&content)));
    }
    let unique: std::collections::HashSet<Digest> = files.iter().map(|(_, d)| *d).collect();
    store.put_bytes(other.clone()).await.expect("put");

    let written = store.put_files(files.clone(), 8).await.expect("put files");
    assert_eq!(
        written,
        unique.len() as u64 - 1,
        "all but the one already stored"
    );
    let mut stored = objects(&store).await;
    stored.sort();
    let mut expected: Vec<String> = unique
        .iter()
        .map(|digest| BlobStore::location(digest).to_string())
        .collect();
    expected.sort();
    assert_eq!(stored, expected, "each content once, nothing staged");
    for content in [&same, &large] {
        let read = store
            .get(&Digest::of(content))
            .await
            .expect("get")
            .into_bytes()
            .await
            .expect("bytes");
        assert!(read == content, "bytes differ");
    }
    assert_eq!(store.put_files(files, 8).await.expect("again"), 0);
}

async fn a_file_that_changed_after_hashing_is_not_stored(store: BlobStore) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("file");
    std::fs::write(&path, b"what it is now").expect("write");
    let hashed = Digest::of(b"what it was");
    let error = store
        .put_files(vec![(path.clone(), hashed)], 4)
        .await
        .expect_err("changed");
    assert!(
        matches!(&error, BlobError::Changed { path: changed } if *changed == path),
        "{error}"
    );
    assert!(!store.contains(&hashed).await.expect("contains"));
    let stored = objects(&store).await;
    assert!(
        !stored.contains(&BlobStore::location(&hashed).to_string()),
        "{stored:?}"
    );
}

/// What a crash or a bad disk leaves (an empty object, one cut short, one with other bytes of
/// the same length) under a blob's name does not count as stored: putting the same content
/// again, in memory, streamed past the in-memory size, or as a local file, replaces it, and
/// the blob reads back whole.
async fn a_damaged_blob_is_replaced_by_storing_the_same_content_again(store: BlobStore) {
    let dir = tempfile::tempdir().expect("dir");
    for size in [100usize, 9 * 1024 * 1024 + 5] {
        let content = pattern(size);
        let digest = Digest::of(&content);
        let mut flipped = content.to_vec();
        flipped[size / 2] ^= 0xff;
        let damages = [Vec::new(), content[..size / 3].to_vec(), flipped];
        for (damage, how) in damages.iter().zip(["empty", "cut short", "other bytes"]) {
            for put in ["bytes", "stream", "file"] {
                store.put_bytes(content.clone()).await.expect("put");
                store
                    .object_store()
                    .put(
                        &BlobStore::location(&digest),
                        PutPayload::from(damage.clone()),
                    )
                    .await
                    .expect("damage");
                assert!(store.get(&digest).await.is_err(), "{how}: damaged");
                match put {
                    "bytes" => {
                        store.put_bytes(content.clone()).await.expect("put again");
                    }
                    "stream" => {
                        let chunks: Vec<Bytes> = content
                            .chunks(64 * 1024)
                            .map(Bytes::copy_from_slice)
                            .collect();
                        let stream =
                            futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
                        store.put_stream(stream, u64::MAX).await.expect("put again");
                    }
                    _ if how == "other bytes" => {
                        // Local files are checked by size (see `put_files`): same-size damage is
                        // what reads refuse, and storing through another path repairs it.
                        continue;
                    }
                    _ => {
                        let path = dir.path().join("file");
                        std::fs::write(&path, &content).expect("write");
                        let written = store
                            .put_files(vec![(path, digest)], 2)
                            .await
                            .expect("put again");
                        assert_eq!(written, 1, "{how}: the damaged blob was replaced");
                    }
                }
                let read = store
                    .get(&digest)
                    .await
                    .unwrap_or_else(|error| panic!("{how}, put as {put}: {error}"))
                    .into_bytes()
                    .await
                    .expect("bytes");
                assert!(read == content, "{how}, put as {put}: bytes differ");
            }
        }
    }
    let mut names = objects(&store).await;
    names.retain(|name| !name.starts_with("blobs/"));
    assert_eq!(names, Vec::<String>::new(), "no staging left behind");
}

/// Two writers storing the same files into one directory store at once (two builds publishing
/// the same dependency) link each blob exactly once; the other finds it there, which is
/// success. What is left is each blob under its final name and nothing else, whole, and read
/// back verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_store_takes_the_same_files_from_two_writers_once_each() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("file://{}/blobs", dir.path().display());
    let first = BlobStore::open(&url, dir.path().join("spool")).expect("open");
    let second = BlobStore::open(&url, dir.path().join("spool")).expect("open");
    let sources = tempfile::tempdir().expect("sources");
    let mut files = Vec::new();
    // Distinct lengths make distinct contents; one spans several copy buffers.
    for len in (0..300).map(|n| n * 13 + 1).chain([1_000_003]) {
        let content = pattern(len);
        let path = sources.path().join(format!("file-{len}"));
        std::fs::write(&path, &content).expect("write");
        files.push((path, Digest::of(&content)));
    }

    let (by_first, by_second) = tokio::join!(
        first.put_files(files.clone(), 4),
        second.put_files(files.clone(), 4)
    );
    let written = by_first.expect("first writer") + by_second.expect("second writer");
    assert_eq!(
        written,
        files.len() as u64,
        "each blob linked by one writer"
    );

    let mut on_disk = Vec::new();
    let mut directories = vec![dir.path().join("blobs")];
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(&directory).expect("read dir") {
            let entry = entry.expect("entry");
            if entry.file_type().expect("type").is_dir() {
                directories.push(entry.path());
            } else {
                on_disk.push(entry.path());
            }
        }
    }
    assert_eq!(on_disk.len(), files.len(), "only final names: {on_disk:?}");
    for (path, digest) in &files {
        let stored = dir
            .path()
            .join("blobs")
            .join(BlobStore::location(digest).as_ref());
        let bytes = std::fs::read(&stored).expect("stored under its final name");
        assert_eq!(Digest::of(&bytes), *digest, "{} is whole", path.display());
        let read = first
            .get(digest)
            .await
            .expect("get")
            .into_bytes()
            .await
            .expect("bytes");
        assert_eq!(Digest::of(&read), *digest);
    }
    assert_eq!(second.put_files(files, 4).await.expect("again"), 0);
}

async fn the_inventory_lists_every_blob_and_removes_what_it_is_told(store: BlobStore) {
    use plinth_blobs::inventory::ObjectKind;
    let before = now_ms();
    let kept = store
        .put_bytes(Bytes::from_static(b"kept"))
        .await
        .expect("put");
    let doomed = store
        .put_bytes(Bytes::from_static(b"doomed, longer content"))
        .await
        .expect("put");
    // An object of someone else's under the store's prefix is listed as foreign and never
    // removed.
    let foreign = object_store::path::Path::from("blobs/sha256/zz/not-a-blob");
    store
        .object_store()
        .put(&foreign, PutPayload::from_static(b"other"))
        .await
        .expect("foreign");
    let mut listed = store.inventory().await.expect("inventory");
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    let kinds: Vec<ObjectKind> = listed.iter().map(|object| object.kind).collect();
    assert!(kinds.contains(&ObjectKind::Blob(kept.digest)), "{listed:?}");
    assert!(
        kinds.contains(&ObjectKind::Blob(doomed.digest)),
        "{listed:?}"
    );
    assert!(kinds.contains(&ObjectKind::Foreign), "{listed:?}");
    for object in &listed {
        if let ObjectKind::Blob(digest) = object.kind {
            let size = if digest == kept.digest {
                kept.size
            } else {
                doomed.size
            };
            assert_eq!(object.size, size);
            // Clocks of the store and of this process agree within a minute.
            assert!(object.modified_ms >= before - 60_000, "{object:?}");
        }
    }
    let removed = store
        .remove(
            &listed
                .into_iter()
                .filter(|object| {
                    object.kind == ObjectKind::Blob(doomed.digest)
                        || object.kind == ObjectKind::Foreign
                })
                .collect::<Vec<_>>(),
        )
        .await
        .expect("remove");
    assert_eq!(removed, 1, "the foreign object is passed over");
    assert!(matches!(
        store.get(&doomed.digest).await,
        Err(BlobError::NotFound(_))
    ));
    assert!(store.get(&kept.digest).await.is_ok());
    assert!(store.object_store().head(&foreign).await.is_ok());
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
