//! Garbage collection of the blob store against real stores and databases: every test runs on
//! a directory store with SQLite, on the S3-protocol server (`PLINTH_TEST_S3_ENDPOINT`, e.g.
//! moto) with SQLite, and on a directory store with PostgreSQL (`PLINTH_TEST_POSTGRES_URL`);
//! under CI the servers are required. The catalog is the real catalog store, asked through its
//! database as `plinth gc` asks it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use plinth_blobs::tree::{Tree, TreeEntry};
use plinth_blobs::{BlobError, BlobStore, Digest};
use plinth_catalog::model::{EnvironmentId, NewEnvironment, Outcome, Scope};
use plinth_catalog::{LeasePolicy, Store};
use plinth_source::gc::{self, Catalog, CatalogRoots, GcError, GcOptions, Report, Work};
use plinth_source::paths::SourcePath;
use plinth_source::{Index, archive::Limits};

const S3_VAR: &str = "PLINTH_TEST_S3_ENDPOINT";

macro_rules! gc_suite {
    ($($test:ident),* $(,)?) => {
        mod file {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let world = super::World::open(super::Store_::File, super::Db::Sqlite).await;
                    super::$test(world).await;
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(url) = super::fresh_bucket().await else { return };
                    let world = super::World::open(super::Store_::S3(url), super::Db::Sqlite).await;
                    super::$test(world).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let plinth_catalog::testing::PostgresAvailability::Available(server) =
                        plinth_catalog::testing::postgres() else { return };
                    let world = super::World::open(super::Store_::File, super::Db::Postgres(server)).await;
                    super::$test(world).await;
                }
            )*
        }
    };
}

gc_suite!(
    a_deleted_environments_blobs_go_after_the_grace_period_and_a_live_ones_stay,
    work_in_flight_keeps_its_blobs_through_passes_with_no_grace,
    the_holds_of_a_holder_that_died_lapse_and_its_blobs_go,
    a_dry_run_changes_nothing_and_says_what_a_pass_reclaims,
    one_pass_runs_at_a_time,
    a_write_whose_holds_lapsed_commits_nothing,
    a_versions_pack_goes_with_its_tree,
);

#[allow(non_camel_case_types)]
enum Store_ {
    File,
    S3(String),
}

enum Db {
    Sqlite,
    Postgres(String),
}

/// A source index, a blob store and a catalog, each real.
struct World {
    dir: tempfile::TempDir,
    index: Index,
    blobs: BlobStore,
    catalog: Store,
    local: bool,
}

/// The catalog through its database.
struct Direct(Store);

impl Catalog for Direct {
    fn begin(&self, fence_ms: u32) -> BoxFuture<'_, Result<CatalogRoots, GcError>> {
        Box::pin(async move {
            let roots = self
                .0
                .begin_collection(i64::from(fence_ms))
                .await
                .map_err(|error| GcError::Catalog(error.to_string()))?;
            Ok(CatalogRoots {
                trees: roots.trees,
                blobs: roots.blobs,
                deleted_environments: roots.deleted_environments,
                fence_until_ms: roots.fence_until_ms,
            })
        })
    }

    fn end(&self) -> BoxFuture<'_, Result<(), GcError>> {
        Box::pin(async move {
            self.0
                .end_collection()
                .await
                .map_err(|error| GcError::Catalog(error.to_string()))
        })
    }
}

const LEASES: LeasePolicy = LeasePolicy {
    lease_ms: 60_000,
    max_attempts: 3,
    running_per_scope: plinth_catalog::DEFAULT_RUNNING_PER_SCOPE,
};

fn scope() -> Scope {
    Scope::parse("acme").expect("scope")
}

fn no_grace() -> GcOptions {
    GcOptions {
        grace: Duration::ZERO,
        hold_ttl: Duration::from_secs(60),
    }
}

impl World {
    async fn open(store: Store_, db: Db) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let (blob_url, local) = match store {
            Store_::File => (format!("file://{}/blobs", dir.path().display()), true),
            Store_::S3(url) => (url, false),
        };
        let (index_url, catalog_url) = match db {
            Db::Sqlite => (
                format!("sqlite://{}/source.db?mode=rwc", dir.path().display()),
                plinth_catalog::testing::sqlite_url(dir.path()),
            ),
            Db::Postgres(server) => (
                plinth_catalog::testing::fresh_postgres_database(&server).await,
                plinth_catalog::testing::fresh_postgres_database(&server).await,
            ),
        };
        let index = Index::connect(&index_url, 5).await.expect("index");
        index.migrate().await.expect("migrate index");
        let blobs = BlobStore::open(&blob_url, dir.path().join("spool")).expect("blobs");
        let catalog = Store::connect(
            &catalog_url,
            5,
            plinth_catalog::SealKey::from_bytes(&[7; 32]).expect("key"),
        )
        .await
        .expect("catalog");
        catalog.migrate().await.expect("migrate catalog");
        World {
            dir,
            index,
            blobs,
            catalog,
            local,
        }
    }

    async fn collect(&self, options: GcOptions) -> Report {
        gc::collect(
            &self.index,
            &self.blobs,
            &Direct(self.catalog.clone()),
            options,
            false,
        )
        .await
        .expect("a pass")
    }

    async fn environment(&self, name: &str) -> EnvironmentId {
        self.catalog
            .create_environment(
                NewEnvironment::new(scope(), name.to_owned(), String::new(), String::new())
                    .expect("valid"),
            )
            .await
            .expect("create")
            .id
    }

    /// Writes a file as the source service does: held, stored, indexed, released.
    async fn write(&self, environment: &EnvironmentId, path: &str, content: &[u8]) -> Digest {
        let work = Work::start(&self.index, Duration::from_secs(60));
        let blob = self
            .blobs
            .put_bytes_held(Bytes::copy_from_slice(content), &work)
            .await
            .expect("put");
        self.index
            .write_file(
                environment.as_str(),
                &SourcePath::parse(path).expect("path"),
                blob.digest,
                blob.size,
                None,
            )
            .await
            .expect("index");
        work.finish().await;
        blob.digest
    }

    /// Publishes a ready version of `environment` whose layer holds `files`, as a builder
    /// does: holds through the catalog, stores, completes. Answers the layer tree's digest.
    async fn publish(&self, environment: &EnvironmentId, files: &[(&str, &[u8])]) -> Digest {
        self.catalog
            .start_build(
                &scope(),
                environment,
                &Digest::of(b"no source").to_string(),
                false,
            )
            .await
            .expect("start");
        let token = self
            .catalog
            .claim_build("builder", LEASES)
            .await
            .expect("claim")
            .expect("work")
            .token;
        let entries: Vec<TreeEntry> = files
            .iter()
            .map(|(path, content)| {
                TreeEntry::file(*path, Digest::of(content), content.len() as u64, false)
            })
            .collect();
        let tree = Bytes::from(Tree::new(entries).encode().expect("tree"));
        let mut held: Vec<String> = files
            .iter()
            .map(|(_, content)| Digest::of(content).to_string())
            .collect();
        held.push(Digest::of(&tree).to_string());
        self.catalog
            .hold_blobs(&token, &held, &[])
            .await
            .expect("hold");
        for (_, content) in files {
            self.blobs
                .put_bytes(Bytes::copy_from_slice(content))
                .await
                .expect("put");
        }
        let layer = self.blobs.put_bytes(tree).await.expect("tree").digest;
        self.catalog
            .complete_build(
                &token,
                Outcome::Ready {
                    layer_tree: layer.to_string(),
                    packages: Vec::new(),
                    size: 1,
                    dependency_key: String::new(),
                    toolchains: Vec::new(),
                },
            )
            .await
            .expect("complete");
        layer
    }

    async fn bytes_of(&self, digest: &Digest) -> Result<Bytes, BlobError> {
        let blob = self.blobs.get(digest).await?;
        Ok(blob.into_bytes().await.expect("read"))
    }

    /// Every file of an environment's source reads back as `expected` says.
    async fn assert_source(
        &self,
        environment: &EnvironmentId,
        expected: &BTreeMap<String, Vec<u8>>,
    ) {
        let entries = self.index.list(environment.as_str()).await.expect("list");
        let files: BTreeMap<String, Digest> = entries
            .into_iter()
            .filter_map(|entry| Some((entry.path.to_string(), entry.digest?)))
            .collect();
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>()
        );
        for (path, digest) in &files {
            let read = self
                .bytes_of(digest)
                .await
                .unwrap_or_else(|error| panic!("{path}: {error}"));
            assert_eq!(read.as_ref(), expected[path].as_slice(), "{path}");
        }
    }

    /// Every file of a layer reads back byte for byte.
    async fn assert_layer(&self, layer: &Digest, files: &[(&str, &[u8])]) {
        let tree =
            Tree::decode(&self.bytes_of(layer).await.expect("the layer tree")).expect("decode");
        assert_eq!(tree.entries.len(), files.len());
        for (path, content) in files {
            let entry = tree
                .entries
                .iter()
                .find(|entry| entry.path == *path)
                .expect("in the tree");
            let digest = entry.file_digest().expect("a file");
            assert_eq!(
                self.bytes_of(&digest).await.expect("layer file").as_ref(),
                *content,
                "{path}"
            );
        }
    }
}

/// A new bucket on the S3 test server, or `None` when none is configured outside CI.
async fn fresh_bucket() -> Option<String> {
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
    let bucket = format!("plinth-gc-{}", uuid::Uuid::new_v4().simple());
    plinth_blobs::install_tls_provider();
    let response = reqwest::Client::new()
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
        "s3://{bucket}/gc?endpoint={endpoint}&allow_http=true&region=us-east-1&access_key_id=test&secret_access_key=test"
    ))
}

async fn a_deleted_environments_blobs_go_after_the_grace_period_and_a_live_ones_stay(world: World) {
    let live = world.environment("Live").await;
    let doomed = world.environment("Doomed").await;
    let mut expected = BTreeMap::new();
    for (path, content) in [
        ("app.py", &b"print('live')\n"[..]),
        ("shared.txt", b"shared by both"),
    ] {
        world.write(&live, path, content).await;
        expected.insert(path.to_owned(), content.to_vec());
    }
    world
        .write(&doomed, "secret.txt", b"only the doomed one")
        .await;
    world.write(&doomed, "shared.txt", b"shared by both").await;
    let live_files: [(&str, &[u8]); 2] = [("app.py", b"print('live')\n"), (".venv/lib.py", b"lib")];
    let live_layer = world.publish(&live, &live_files).await;
    let doomed_layer = world
        .publish(&doomed, &[("setup-output", b"made by setup.sh")])
        .await;
    // The catalog deletes it; the source is never told (the gateway died first, say).
    world
        .catalog
        .delete_environment(&scope(), &doomed)
        .await
        .expect("delete");

    // Within the grace period the source forgets the environment but no blob goes.
    let report = world.collect(GcOptions::default()).await;
    assert_eq!(report.forgotten_environments, 1, "{report:?}");
    assert_eq!(report.reclaimed_objects, 0, "{report:?}");
    assert!(report.young_objects >= 3, "{report:?}");
    assert!(
        world
            .index
            .list(doomed.as_str())
            .await
            .expect("list")
            .is_empty()
    );
    assert!(
        world
            .bytes_of(&Digest::of(b"only the doomed one"))
            .await
            .is_ok()
    );

    // Past it, exactly the deleted environment's own blobs go.
    let report = world.collect(no_grace()).await;
    let gone = [
        Digest::of(b"only the doomed one"),
        Digest::of(b"made by setup.sh"),
        doomed_layer,
    ];
    for digest in &gone {
        assert!(
            matches!(world.bytes_of(digest).await, Err(BlobError::NotFound(_))),
            "{digest} is gone"
        );
    }
    let files = (b"only the doomed one".len() + b"made by setup.sh".len()) as u64;
    assert_eq!(report.reclaimed_objects, 3, "{report:?}");
    assert!(
        report.reclaimed_bytes > files,
        "the files and the tree: {report:?}"
    );
    world.assert_source(&live, &expected).await;
    world.assert_layer(&live_layer, &live_files).await;
    // Nothing more to take.
    assert_eq!(world.collect(no_grace()).await.reclaimed_objects, 0);
}

async fn work_in_flight_keeps_its_blobs_through_passes_with_no_grace(world: World) {
    let world = Arc::new(world);
    let live = world.environment("Busy").await;
    // Garbage of identical content to what the work below writes: blobs nothing names, old
    // enough for any pass with no grace. Finding them stored must not save a writer from
    // holding them.
    let gone = world.environment("Gone").await;
    let contents: Vec<Vec<u8>> = (0..48)
        .map(|i| format!("content number {i}\n").repeat(i + 1).into_bytes())
        .collect();
    for (i, content) in contents.iter().enumerate() {
        world.write(&gone, &format!("old/{i}.txt"), content).await;
    }
    world
        .index
        .drop_environment(gone.as_str())
        .await
        .expect("drop");

    // Passes back to back, with no grace, for as long as the work runs.
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicU64::new(0));
    let collector = {
        let (world, stop, passes) = (world.clone(), stop.clone(), passes.clone());
        plinth_kit::tasks::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match gc::collect(
                    &world.index,
                    &world.blobs,
                    &Direct(world.catalog.clone()),
                    no_grace(),
                    false,
                )
                .await
                {
                    Ok(_) => {
                        passes.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(GcError::Busy) => {}
                    Err(error) => panic!("a pass failed: {error}"),
                }
            }
        })
    };

    // An import of an archive (the real import path) whose files are half old content.
    let mut archive = tar::Builder::new(Vec::new());
    let mut expected = BTreeMap::new();
    for (i, content) in contents.iter().enumerate() {
        let fresh = format!("fresh file {i}\n").into_bytes();
        for (path, content) in [
            (format!("same-{i}.txt"), content.clone()),
            (format!("new-{i}.txt"), fresh),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            archive
                .append_data(&mut header, &path, content.as_slice())
                .expect("append");
            expected.insert(path, content);
        }
    }
    let archive = Bytes::from(archive.into_inner().expect("archive"));
    let importer = {
        let world = world.clone();
        let live = live.clone();
        plinth_kit::tasks::spawn(async move {
            let work = Work::start(&world.index, Duration::from_secs(60));
            let chunks = futures::stream::iter(
                archive
                    .chunks(4096)
                    .map(|chunk| Ok::<_, std::io::Error>(Bytes::copy_from_slice(chunk)))
                    .collect::<Vec<_>>(),
            );
            let imported = plinth_source::import::import_archive(
                &world.blobs,
                &world.dir.path().join("spool"),
                Limits {
                    max_entries: 10_000,
                    max_total_bytes: 1 << 30,
                    max_file_bytes: 1 << 30,
                },
                chunks,
                Arc::new(work.clone()),
            )
            .await
            .expect("import");
            world
                .index
                .apply_import(live.as_str(), false, &imported.entries)
                .await
                .expect("land");
            work.finish().await;
        })
    };
    // Uploads, one file at a time, of old content again.
    let uploader = {
        let (world, live, contents) = (world.clone(), live.clone(), contents.clone());
        plinth_kit::tasks::spawn(async move {
            for (i, content) in contents.iter().enumerate().step_by(3) {
                world
                    .write(&live, &format!("uploaded/{i}.txt"), content)
                    .await;
            }
        })
    };
    // A build publishing a layer that reuses old content.
    let layer_files: Vec<(String, Vec<u8>)> = contents
        .iter()
        .enumerate()
        .step_by(2)
        .map(|(i, content)| (format!(".venv/f{i}"), content.clone()))
        .chain([("built.txt".to_owned(), b"built now".to_vec())])
        .collect();
    let builder = {
        let (world, live, files) = (world.clone(), live.clone(), layer_files.clone());
        plinth_kit::tasks::spawn(async move {
            let borrowed: Vec<(&str, &[u8])> = files
                .iter()
                .map(|(path, content)| (path.as_str(), content.as_slice()))
                .collect();
            world.publish(&live, &borrowed).await
        })
    };
    importer.await.expect("importer");
    uploader.await.expect("uploader");
    let layer = builder.await.expect("builder");
    stop.store(true, Ordering::SeqCst);
    collector.await.expect("collector");
    assert!(passes.load(Ordering::SeqCst) > 0, "passes ran meanwhile");
    for (i, content) in contents.iter().enumerate().step_by(3) {
        expected.insert(format!("uploaded/{i}.txt"), content.clone());
    }

    // And after one more pass everything acknowledged reads back byte for byte, while the
    // garbage no work took up is gone.
    world.collect(no_grace()).await;
    world.assert_source(&live, &expected).await;
    let borrowed: Vec<(&str, &[u8])> = layer_files
        .iter()
        .map(|(path, content)| (path.as_str(), content.as_slice()))
        .collect();
    world.assert_layer(&layer, &borrowed).await;
    let report = world.collect(no_grace()).await;
    assert_eq!(report.reclaimed_objects, 0, "{report:?}");
}

async fn the_holds_of_a_holder_that_died_lapse_and_its_blobs_go(world: World) {
    let work = Work::start(&world.index, Duration::from_millis(1500));
    let content = b"written by a process that then died";
    world
        .blobs
        .put_bytes_held(Bytes::from_static(content), &work)
        .await
        .expect("put");
    // It dies: nothing renews its holds any more, and nothing names the blob.
    work.leave();
    let report = world.collect(no_grace()).await;
    assert_eq!(report.reclaimed_objects, 0, "held: {report:?}");
    assert!(world.bytes_of(&Digest::of(content)).await.is_ok());
    // Past its lifetime, and the margin allowed for clocks that disagree.
    tokio::time::sleep(Duration::from_millis(1500 + 1200)).await;
    let report = world.collect(no_grace()).await;
    assert_eq!(report.reclaimed_objects, 1, "lapsed: {report:?}");
    assert!(matches!(
        world.bytes_of(&Digest::of(content)).await,
        Err(BlobError::NotFound(_))
    ));

    // A partial copy a killed writer left beside a blob's name goes too; one whose blob is
    // held stays (its writer may be writing it).
    if world.local {
        let root = world.dir.path().join("blobs");
        let write_partial = |content: &[u8]| {
            let hex = Digest::of(content).to_hex();
            let dir = root.join("blobs/sha256").join(&hex[..2]);
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join(format!("{hex}#1"));
            std::fs::write(&path, &content[..3]).expect("partial");
            path
        };
        let orphan = write_partial(b"nobody holds this one");
        let writing = write_partial(b"someone holds this one");
        let holder = Work::start(&world.index, Duration::from_secs(60));
        holder
            .hold_blobs(&[Digest::of(b"someone holds this one")])
            .await
            .expect("hold");
        let report = world.collect(no_grace()).await;
        assert_eq!(report.reclaimed_objects, 1, "{report:?}");
        assert!(!orphan.exists());
        assert!(writing.exists());
        holder.finish().await;
    }
}

async fn a_dry_run_changes_nothing_and_says_what_a_pass_reclaims(world: World) {
    let doomed = world.environment("Doomed").await;
    let content = b"a file of a deleted environment";
    let digest = world.write(&doomed, "file.txt", content).await;
    world.publish(&doomed, &[("out", b"layer output")]).await;
    world
        .catalog
        .delete_environment(&scope(), &doomed)
        .await
        .expect("delete");
    let dry = gc::collect(
        &world.index,
        &world.blobs,
        &Direct(world.catalog.clone()),
        no_grace(),
        true,
    )
    .await
    .expect("dry run");
    assert!(dry.dry_run);
    assert_eq!(dry.reclaimed_objects, 3, "{dry:?}");
    assert_eq!(dry.forgotten_environments, 1);
    assert!(world.bytes_of(&digest).await.is_ok(), "nothing removed");
    assert_eq!(
        world.index.list(doomed.as_str()).await.expect("list").len(),
        1,
        "nothing forgotten"
    );
    let real = world.collect(no_grace()).await;
    assert_eq!(
        (real.reclaimed_objects, real.reclaimed_bytes),
        (dry.reclaimed_objects, dry.reclaimed_bytes)
    );
    assert!(matches!(
        world.bytes_of(&digest).await,
        Err(BlobError::NotFound(_))
    ));
}

async fn one_pass_runs_at_a_time(world: World) {
    let deadline = plinth_kit::clock::now_ms() + 60_000;
    assert!(
        world
            .index
            .take_collection_pass("another-replica", deadline)
            .await
            .expect("lease")
    );
    let refused = gc::collect(
        &world.index,
        &world.blobs,
        &Direct(world.catalog.clone()),
        no_grace(),
        false,
    )
    .await;
    assert!(matches!(refused, Err(GcError::Busy)), "{refused:?}");
    world
        .index
        .end_collection_pass("another-replica")
        .await
        .expect("end");
    world.collect(no_grace()).await;
}

async fn a_write_whose_holds_lapsed_commits_nothing(world: World) {
    let environment = world.environment("Stalled").await;
    let path = SourcePath::parse("late.txt").expect("path");
    let work = Work::start(&world.index, Duration::from_millis(800));
    let blob = world
        .blobs
        .put_bytes_held(Bytes::from_static(b"stored, then stalled"), &work)
        .await
        .expect("put");
    // The process stalls past its holds' lifetime: nothing renews them.
    work.leave();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = world
        .index
        .write_file_held(
            environment.as_str(),
            &path,
            blob.digest,
            blob.size,
            None,
            work.fence(),
        )
        .await;
    assert!(
        matches!(refused, Err(plinth_source::IndexError::HoldsLapsed)),
        "{refused:?}"
    );
    assert!(
        world
            .index
            .get(environment.as_str(), &path)
            .await
            .expect("get")
            .is_none()
    );
    // Work whose holds live commits.
    let live = Work::start(&world.index, Duration::from_secs(60));
    live.hold_blobs(&[blob.digest]).await.expect("hold");
    world
        .index
        .write_file_held(
            environment.as_str(),
            &path,
            blob.digest,
            blob.size,
            None,
            live.fence(),
        )
        .await
        .expect("committed");
    live.finish().await;
}

/// Stores a pack for `layer` holding `files`, as a node does.
async fn pack(world: &World, layer: &Digest, files: &[&[u8]]) {
    let heads = files
        .iter()
        .map(|content| {
            (
                plinth_blobs::pack::PackHead {
                    digest: Digest::of(content),
                    executable: false,
                    size: content.len() as u64,
                },
                *content,
            )
        })
        .collect();
    let mut file = tempfile::tempfile().expect("a file");
    plinth_blobs::pack::write_pack(heads, &mut file).expect("written");
    std::io::Seek::rewind(&mut file).expect("rewound");
    world.blobs.put_pack(layer, file).await.expect("stored");
}

async fn a_versions_pack_goes_with_its_tree(world: World) {
    let live = world.environment("Live").await;
    let doomed = world.environment("Doomed").await;
    let live_layer = world
        .publish(&live, &[("app.py", b"print('live')\n")])
        .await;
    let doomed_layer = world.publish(&doomed, &[("lib.py", b"doomed")]).await;
    pack(&world, &live_layer, &[b"print('live')\n"]).await;
    pack(&world, &doomed_layer, &[b"doomed"]).await;
    // A pack of a tree nobody ever kept (a node's write for a version deleted meanwhile).
    let stray = Digest::of(b"a tree never stored");
    pack(&world, &stray, &[b"doomed"]).await;

    // Within the grace period nothing goes, packs included.
    let report = world.collect(GcOptions::default()).await;
    assert_eq!(report.reclaimed_objects, 0, "{report:?}");
    for layer in [&live_layer, &doomed_layer, &stray] {
        assert!(world.blobs.has_pack(layer).await.expect("asked"));
    }

    world
        .catalog
        .delete_environment(&scope(), &doomed)
        .await
        .expect("delete");
    let report = world.collect(no_grace()).await;
    assert!(
        world.blobs.has_pack(&live_layer).await.expect("asked"),
        "a kept version's pack stays"
    );
    assert!(!world.blobs.has_pack(&doomed_layer).await.expect("asked"));
    assert!(!world.blobs.has_pack(&stray).await.expect("asked"));
    // The doomed file, its tree, and two packs.
    assert_eq!(report.reclaimed_objects, 4, "{report:?}");
    let mut opened = world
        .blobs
        .open_pack(&live_layer)
        .await
        .expect("read")
        .expect("there");
    let (_, bytes) = opened.next_file().await.expect("a file").expect("there");
    assert_eq!(bytes.as_ref(), b"print('live')\n");
}
