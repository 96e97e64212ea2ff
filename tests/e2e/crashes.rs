//! Crashes, with real processes: `plinth source` is killed (`SIGKILL`) in the middle of an
//! import and `plinth builder` in the middle of publishing a layer. After both are restarted
//! and one `plinth gc` pass has run, every file and version that was acknowledged reads back
//! byte for byte, and nothing that was not is left: no blob nothing names, no partial copy, no
//! file of the killed import, no second version.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use plinth_blobs::tree::Tree;
use plinth_blobs::{BlobStore, Digest};
use serde_json::json;

use crate::helpers::{send, tar_of};
use crate::processes::{Process, wait_until_ready};
use crate::waiting::eventually;

struct Cluster {
    data: tempfile::TempDir,
    config: PathBuf,
    blob_url: String,
    catalog_url: String,
    source: std::net::SocketAddr,
    source_admin: std::net::SocketAddr,
    base: String,
    client: reqwest::Client,
    services: Vec<Process>,
}

fn spawn(args: &[&str], config: &Path) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    crate::credentials::apply(&mut command, crate::credentials::shared(), args[0]);
    command
        .args(args)
        .env("PLINTH_CONFIG", config)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_TOKENS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Process(command.spawn().expect("spawn plinth"))
}

fn kill(process: &Process) {
    let status = Command::new("kill")
        .args(["-KILL", &process.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

impl Drop for Cluster {
    /// The services go first (builders the test started are gone by now), then what a
    /// builder killed mid-build left mounted.
    fn drop(&mut self) {
        self.services.clear();
        crate::helpers::unmount_under(self.data.path());
    }
}

impl Cluster {
    async fn start() -> Self {
        let data = tempfile::tempdir().expect("data");
        let config = data.path().join("plinth.toml");
        // Collection runs only when the test runs `plinth gc`; holds of a process that died
        // lapse 2 s after its last renewal; a builder that died loses its lease after 3 s.
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[catalog]\nbuild_lease_seconds = 3\nbuild_max_attempts = 5\n\
                 seal_key_file = \"{}\"\n[builder]\nnetwork = false\n\
                 [gc]\ninterval_seconds = 0\nhold_seconds = 2\n",
                data.path().display(),
                crate::helpers::seal_key_file(data.path()).display()
            ),
        )
        .expect("config");
        let client = crate::helpers::http_client();
        let (services, core, blob_url) =
            crate::node_restart::start_core_in(data.path(), &config).await;
        Cluster {
            blob_url,
            catalog_url: format!("http://{}", core.catalog),
            data,
            config,
            source: core.source,
            source_admin: core.source_admin,
            base: format!("http://{}", core.http),
            client,
            services,
        }
    }

    async fn start_source(&self) -> Process {
        let mut process = spawn(
            &[
                "source",
                "--standalone",
                "--listen",
                &self.source.to_string(),
                "--admin-listen",
                &self.source_admin.to_string(),
                "--blob-url",
                &self.blob_url,
                "--catalog-url",
                &self.catalog_url,
            ],
            &self.config,
        );
        wait_until_ready(
            &self.client,
            &format!("http://{}/readyz", self.source_admin),
            &mut process,
        )
        .await;
        process
    }

    fn builder(&self, name: &str) -> Process {
        spawn(
            &[
                "builder",
                "--standalone",
                "--name",
                name,
                "--catalog-url",
                &self.catalog_url,
                "--blob-url",
                &self.blob_url,
            ],
            &self.config,
        )
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Every object under the store's directory, by name relative to it.
    fn objects(&self) -> Vec<String> {
        let root = self.data.path().join("blobs");
        crate::helpers::files_under(&root)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    async fn layer(&self, id: &str) -> Digest {
        crate::helpers::layer_tree(
            &self.catalog_url,
            crate::credentials::shared().interceptor(plinth_kit::auth::Role::Gateway),
            id,
            1,
        )
        .await
        .parse()
        .expect("a layer")
    }
}

/// Waits (60 s at most) until more than `more` objects beyond `before`
/// are in the store.
async fn until_objects_grow(cluster: &Cluster, before: usize, more: usize, what: &str) {
    eventually(Duration::from_secs(60), async || {
        let objects = cluster.objects().len();
        if objects > before + more {
            Ok(())
        } else {
            Err(format!(
                "{what}: the store did not grow ({objects} objects)"
            ))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_source_and_a_builder_are_killed_mid_write_what_was_acknowledged_stays_and_nothing_else()
 {
    if !crate::helpers::can_build() {
        return;
    }
    let mut cluster = Cluster::start().await;
    let (status, created) = send(
        cluster
            .client
            .post(cluster.url("/v1/environments"))
            .json(&json!({"name": "Survivor"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    // Acknowledged: an upload and an import.
    let mut acknowledged: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let script = "mkdir -p out\nstamp=$(date +%s%N)\n\
                  for i in $(seq 1 4000); do echo \"$stamp $i\" > out/$i.txt; done\n";
    acknowledged.insert("setup.sh".to_owned(), script.as_bytes().to_vec());
    for (path, content) in &acknowledged {
        let (status, body) = send(
            cluster
                .client
                .put(cluster.url(&format!("/v1/environments/{id}/files/{path}")))
                .body(content.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let mut first = BTreeMap::new();
    for i in 0..50 {
        first.insert(
            format!("lib/{i}.py"),
            format!("# module {i}\n").into_bytes(),
        );
    }
    first.insert("README".to_owned(), b"acknowledged\n".to_vec());
    let (status, report) = send(
        cluster
            .client
            .post(cluster.url(&format!("/v1/environments/{id}/import")))
            .body(tar_of(&first)),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    acknowledged.extend(first);

    // The source service is killed while it stores an import's files: the import is never
    // acknowledged.
    let mut doomed = BTreeMap::new();
    for i in 0..20_000 {
        doomed.insert(
            format!("big/{i}.txt"),
            format!("never acknowledged {i}\n").into_bytes(),
        );
    }
    let before = cluster.objects().len();
    let import = {
        let request = cluster
            .client
            .post(cluster.url(&format!("/v1/environments/{id}/import")))
            .body(tar_of(&doomed));
        plinth_kit::tasks::spawn(
            async move { request.send().await.map(|response| response.status()) },
        )
    };
    until_objects_grow(&cluster, before, 200, "the import").await;
    let source = cluster.services.remove(1);
    kill(&source);
    drop(source);
    let answered = import.await.expect("joined");
    assert!(
        answered
            .as_ref()
            .map_or(true, |status| !status.is_success()),
        "the killed import was not acknowledged: {answered:?}"
    );
    let restarted = cluster.start_source().await;
    cluster.services.insert(1, restarted);

    // A builder is killed while it stores its layer; another finishes the build afresh.
    let (status, body) = send(
        cluster
            .client
            .post(cluster.url(&format!("/v1/environments/{id}/build"))),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let before = cluster.objects().len();
    let builder = cluster.builder("first");
    until_objects_grow(&cluster, before, 200, "the layer").await;
    kill(&builder);
    drop(builder);
    let work_dir = cluster.data.path().join("builder");
    assert!(
        build_scratch(&work_dir) > 0,
        "the killed builder left its scratch"
    );
    let _second = cluster.builder("second");
    let build = crate::helpers::wait_for_build_at(
        &cluster.client,
        &cluster.base,
        &id,
        1,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(build["status"], "ready", "{build}");
    assert!(build["attempt"].as_u64() >= Some(2), "{build}");

    // Past the holds' lifetime, one pass.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let output = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(["gc", "--gc-grace-seconds", "0"])
        .env("PLINTH_CONFIG", &cluster.config)
        .env("PLINTH_LOG", "warn")
        .output()
        .expect("plinth gc");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Every acknowledged file reads back, and there is no other.
    let (_, listed) = send(
        cluster
            .client
            .get(cluster.url(&format!("/v1/environments/{id}/files"))),
    )
    .await;
    let files: BTreeSet<String> = listed["data"]
        .as_array()
        .expect("files")
        .iter()
        .filter(|entry| entry["type"] != "directory")
        .map(|entry| entry["path"].as_str().expect("path").to_owned())
        .collect();
    assert_eq!(
        files,
        acknowledged.keys().cloned().collect::<BTreeSet<_>>(),
        "the killed import left no file"
    );
    for (path, content) in &acknowledged {
        let response = cluster
            .client
            .get(cluster.url(&format!("/v1/environments/{id}/files/{path}")))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(
            response.bytes().await.expect("body").as_ref(),
            content.as_slice()
        );
    }
    // Exactly one version, whose layer reads back whole: the source and 4000 outputs, each
    // verified against its digest as it is read.
    let (_, versions) = send(
        cluster
            .client
            .get(cluster.url(&format!("/v1/environments/{id}/versions"))),
    )
    .await;
    assert_eq!(
        versions["data"].as_array().map(Vec::len),
        Some(1),
        "{versions}"
    );
    let blobs =
        BlobStore::open(&cluster.blob_url, cluster.data.path().join("test-spool")).expect("store");
    let layer = cluster.layer(&id).await;
    let tree = Tree::decode(
        &blobs
            .get(&layer)
            .await
            .expect("the layer tree")
            .into_bytes()
            .await
            .expect("bytes"),
    )
    .expect("a tree");
    let mut kept: BTreeSet<Digest> = BTreeSet::from([layer]);
    let mut outputs = 0;
    for entry in &tree.entries {
        let Some(digest) = entry.file_digest() else {
            continue;
        };
        let bytes = blobs
            .get(&digest)
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", entry.path))
            .into_bytes()
            .await
            .expect("bytes");
        if let Some(content) = acknowledged.get(&entry.path) {
            assert_eq!(bytes.as_ref(), content.as_slice(), "{}", entry.path);
        } else {
            assert!(entry.path.starts_with("out/"), "{}", entry.path);
            outputs += 1;
        }
        kept.insert(digest);
    }
    assert_eq!(outputs, 4000);
    kept.extend(acknowledged.values().map(|content| Digest::of(content)));

    // And nothing else is in the store: no blob of the killed import or of the killed
    // builder's attempt, no partial copy, no staging object.
    let stored: BTreeSet<String> = cluster.objects().into_iter().collect();
    let expected: BTreeSet<String> = kept
        .iter()
        .map(|digest| {
            let hex = digest.to_hex();
            format!("blobs/sha256/{}/{hex}", &hex[..2])
        })
        .collect();
    let orphans: Vec<&String> = stored.difference(&expected).take(5).collect();
    assert!(
        orphans.is_empty(),
        "{} orphans, e.g. {orphans:?}",
        stored.len().saturating_sub(expected.len())
    );
    assert_eq!(stored, expected);
    // The restarted builder removed the killed one's scratch, and let go of its scope's disk.
    crate::helpers::until_unmounted(&work_dir).await;
    assert_eq!(build_scratch(&work_dir), 0, "no build scratch is left");
}

/// The builds' scratch directories in a builder's work directory: on the scopes' disks that
/// are mounted, and beside them (builds without a disk limit).
fn build_scratch(work_dir: &Path) -> usize {
    let count = |dir: PathBuf| std::fs::read_dir(dir).map_or(0, Iterator::count);
    let scopes = std::fs::read_dir(work_dir.join("scopes"))
        .map(|entries| {
            entries
                .flatten()
                .map(|scope| count(scope.path().join("work/builds")))
                .sum()
        })
        .unwrap_or(0);
    scopes + count(work_dir.join("builds"))
}
