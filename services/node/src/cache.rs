//! The node's version cache. Layout under its root:
//!
//! - `blobs/<sha256 hex>` and `blobs/<sha256 hex>.x` (the same bytes, executable): one verified
//!   copy of every file content any cached version holds, read-only. Mode lives on the inode,
//!   which hard links share, so executable and plain copies are separate files.
//! - `versions/<environment id>/<version>/`: one directory per materialized version, every
//!   file a hard link into `blobs/`, directories read-only. A version directory exists only
//!   once complete: it is built under `staging/` and renamed into place.
//! - `versions/<environment id>/<version>.tree`: the version's layer tree digest, so a later
//!   version can be compared with it.
//! - `versions/<environment id>/<version>.base`: present when the version is a *layer* over
//!   the cached version it names: its directory then holds only what differs (changed and new
//!   entries, and overlay whiteouts for removed ones), and sessions see it through a
//!   read-only overlay mount of it over its base (and the base's bases), made in their mount
//!   namespace. Layers are made only where sessions are isolated (the node mounts), at most
//!   [`MAX_LAYERS`] deep, and only when less than half the entries differ.
//! - `staging/`: partial materializations; emptied at start.
//!
//! Materializing a version fetches only the blobs the cache lacks (many at a time: a venv's median
//! file is ~2 KB, so per-object round trips dominate) and then links; a version that differs from a
//! cached one by one file costs one fetch. A node that lacks a version first reads the version's
//! pack, if the store has one: the files its first sessions read, as one object
//! (`plinth_blobs::pack`). Eviction removes whole versions, least recently used first, never one a
//! live session uses or an environment's active one, nor one a layer is being made over, then the
//! blobs no version links any more, except those a materialization in progress has pinned (fetched
//! or found, about to be linked); it runs in the background, never inside attach or materialize.
//!
//! What a name promises survives a power cut: a blob file is synced before it is linked to
//! its name (later versions trust a present name without reading it), the blobs directory is
//! synced before a version links to new blobs, and a version's tree is synced (`syncfs`)
//! before it is renamed into place, and its directory after. A blob is written first as an
//! unnamed file (`O_TMPFILE`), which a session waiting on it reads at once (a lazily mounted
//! version) and which gets its name only once synced: a batch at a time (one `syncfs` for a
//! materialization's batch; a task settles what sessions fetched), so neither a session's
//! open nor a materialization waits for a sync per blob. A node that stops before a blob is
//! settled loses the unnamed file and nothing else.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd as _, BorrowedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use plinth_blobs::tree::{Tree, TreeEntry, TreeEntryKind};
use plinth_blobs::{BlobStore, Digest};

use crate::lazy::LazyVersion;

mod limit;
mod pack;

/// Blobs fetched at once on a cold node.
const PARALLEL_FETCHES: usize = 64;

/// Blobs fetched at once for sessions waiting on a lazily mounted version's files, beside
/// what materializations fetch.
const DEMAND_FETCHES: usize = 64;

/// Blobs written before they are synced and named together (one batch of a materialization).
const SETTLE_BATCH: usize = 256;

/// From this many blobs in a batch on, one sync of the file system rather than one per file.
const SYNC_WHOLE_FILE_SYSTEM: usize = 16;

/// Blobs pending (written, not yet synced) at most; past it fetches sync as they go. Each
/// holds a descriptor.
const MAX_PENDING: usize = 1024;

/// How long background fetches keep making way after what sessions waited on is done: a
/// session's start is a chain (its version's tree, then its pack, then its first files), and a
/// burst of background fetches let in between two links would be in the store's queue ahead
/// of the next.
const CALM: Duration = Duration::from_millis(250);

/// The longest a background fetch (a materialization's, a pre-warm's) waits for what sessions
/// wait on to be done before it starts: one store serves both, and a session's fetch queued
/// behind sixty-four background ones waits for all of them.
const YIELD_AT_MOST: Duration = Duration::from_secs(2);

/// A lazily served version's read order is told once its sessions opened no new file for
/// this long.
const READ_ORDER_QUIET: Duration = Duration::from_secs(3);

/// Most layers one version's view stacks (itself and its bases).
pub const MAX_LAYERS: usize = 8;

/// Decoded trees kept to compare a new version with its base without fetching it again.
const KEPT_TREES: usize = 2;

/// A version in the cache: its environment and number.
pub type VersionKey = (String, u32);

/// Why materializing failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The blob store failed or holds bad bytes.
    #[error("blob store: {0}")]
    Blobs(String),
    /// The layer tree is not a valid tree.
    #[error("the layer tree {digest} is not valid: {reason}")]
    BadTree {
        /// The tree's digest.
        digest: String,
        /// What is wrong.
        reason: String,
    },
    /// Local disk.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CacheError {
    let what = what.into();
    move |source| CacheError::Io { what, source }
}

/// What materializing did.
#[derive(Debug, Clone)]
pub struct Materialized {
    /// The version's directory.
    pub path: PathBuf,
    /// When the version is a layer: the directories under it, nearest first. Its files are
    /// what an overlay of `path` over these shows.
    pub lower: Vec<PathBuf>,
    /// Blobs fetched from the store (0 when the version was cached).
    pub fetched: u64,
    /// Time taken.
    pub took: Duration,
    /// When the version is mounted lazily (not yet in the cache): the mount, which `path`
    /// is. Whoever shows the version to a session holds it as long as the session lives.
    pub lazy: Option<Arc<LazyVersion>>,
}

/// How a node mounts versions it has not fetched (see [`crate::lazy`]).
#[derive(Debug, Clone, Copy)]
pub struct LazySettings {
    /// How long a session's open of a file waits for its blob before it fails with `EIO`.
    pub fetch_deadline: Duration,
}

/// Where the read order of a version (the paths its first sessions read, in order) is kept,
/// so that every node fetches those first.
pub trait ReadOrders: Send + Sync + 'static {
    /// The order recorded for the version; empty when none is.
    fn get(
        &self,
        environment: &str,
        version: u32,
    ) -> futures::future::BoxFuture<'static, Vec<String>>;
    /// Records the order the version's sessions read on this node (kept only if it is the
    /// first recorded).
    fn record(
        &self,
        environment: &str,
        version: u32,
        paths: Vec<String>,
    ) -> futures::future::BoxFuture<'static, ()>;
}

/// The cache.
pub struct VersionCache {
    root: PathBuf,
    blobs: BlobStore,
    /// One materialization per version at a time; later callers wait and find it done.
    in_flight: Mutex<HashMap<VersionKey, Arc<tokio::sync::Mutex<()>>>>,
    last_used: Mutex<HashMap<VersionKey, SystemTime>>,
    blob_bytes: AtomicU64,
    cap_bytes: u64,
    /// Names of the blob files present, so deciding what to fetch costs no `stat` per file.
    present: Mutex<HashSet<String>>,
    /// Whether new versions may be layers over cached ones.
    layered: bool,
    /// Each layered version's base version (of the same environment).
    bases: Mutex<HashMap<VersionKey, u32>>,
    /// The last trees decoded, by digest.
    trees: Mutex<Vec<(String, Arc<Tree>)>>,
    /// Blob files materializations in progress are about to link, with how many want each:
    /// the sweep passes them over, even unlinked (see [`VersionCache::pin_blobs`]).
    pinned: Mutex<HashMap<String, usize>>,
    /// Versions materializations in progress make layers over: eviction passes them over.
    pinned_bases: Mutex<HashMap<VersionKey, usize>>,
    /// Mounting versions before they are fetched; `None`: sessions wait for the whole version.
    lazy: Mutex<Option<LazySettings>>,
    /// The lazily mounted versions, while anything holds them.
    mounts: Mutex<HashMap<VersionKey, Weak<LazyVersion>>>,
    /// One mount made at a time.
    mounting: tokio::sync::Mutex<()>,
    /// Fetches of blobs sessions wait for, at once at most.
    demand: tokio::sync::Semaphore,
    /// Fetches of materializations (whole versions, pre-warm), at once at most, node-wide:
    /// as many as the store answers without slowing (see [`limit`]).
    background: limit::Limit,
    /// One fetch per blob at a time: a second asker waits for the first.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Blobs fetched and verified but not yet on disk: unnamed files, read through these
    /// handles, that get their names once synced (see [`VersionCache::settle`]). A session
    /// waiting on a file is answered from here rather than after a sync per file.
    pending: Mutex<HashMap<String, Arc<std::fs::File>>>,
    /// Pending blobs sessions fetched, waiting to be settled, and whether a task settles them.
    unsettled: Mutex<(Vec<(Digest, bool)>, bool)>,
    /// Read orders by layer tree, for the materializations to fetch in.
    orders: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// Where read orders are kept.
    read_orders: Mutex<Option<Arc<dyn ReadOrders>>>,
    /// Blobs a version's pack is bringing (see [`pack`]).
    coming: Mutex<pack::Coming>,
    /// Packs whose heads are being read.
    opening: tokio::sync::watch::Sender<usize>,
    /// Tasks telling a lazily mounted version's read order and storing its pack, for a node
    /// that stops to wait for ([`VersionCache::tell_before_stopping`]).
    telling: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// What sessions wait on in flight (their fetches, their versions' trees and packs): the
    /// background fetches make way for it (see [`YIELD_AT_MOST`]).
    urgent: tokio::sync::watch::Sender<usize>,
    /// When the last of that was done.
    calm_since: Mutex<tokio::time::Instant>,
}

/// Whose turn a fetch takes: a session's (waiting on it) or a materialization's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slots {
    Demand,
    Background,
}

/// One thing in flight, counted in a watch while it lives.
struct Counted<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> Counted<'a> {
    fn new(count: &'a tokio::sync::watch::Sender<usize>) -> Self {
        count.send_modify(|count| *count += 1);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count -= 1);
    }
}

/// Something a session waits on, in flight: background fetches make way while it lives and for
/// [`CALM`] after.
struct Urgent<'a> {
    cache: &'a VersionCache,
    _counted: Counted<'a>,
}

impl Drop for Urgent<'_> {
    fn drop(&mut self) {
        // Before the count falls: a background fetch that sees it at zero sees this too.
        *self
            .cache
            .calm_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }
}

/// Blob files (or a base version) kept from eviction while a materialization uses them;
/// released when dropped.
struct Pins<'a, K: std::hash::Hash + Eq + Clone> {
    table: &'a Mutex<HashMap<K, usize>>,
    keys: Vec<K>,
}

impl<'a, K: std::hash::Hash + Eq + Clone> Pins<'a, K> {
    /// Pins `keys` in `table`, under its lock.
    fn take(table: &'a Mutex<HashMap<K, usize>>, keys: Vec<K>) -> Self {
        let mut pinned = table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for key in &keys {
            *pinned.entry(key.clone()).or_default() += 1;
        }
        drop(pinned);
        Pins { table, keys }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Pins<'_, K> {
    fn drop(&mut self) {
        let mut pinned = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for key in &self.keys {
            if let Some(count) = pinned.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    pinned.remove(key);
                }
            }
        }
    }
}

impl Materialized {
    /// Whether `name` (a top-level entry) is in the version, looking through its layers.
    pub fn has(&self, name: &str) -> bool {
        if let Some(lazy) = &self.lazy {
            return lazy.has(name);
        }
        for layer in std::iter::once(&self.path).chain(&self.lower) {
            match std::fs::symlink_metadata(layer.join(name)) {
                Ok(metadata) => return !is_whiteout(&metadata),
                Err(_) => continue,
            }
        }
        false
    }
}

/// An overlay whiteout: a character device 0/0 hiding the name in the layers below.
fn is_whiteout(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    metadata.file_type().is_char_device() && metadata.rdev() == 0
}

impl std::fmt::Debug for VersionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionCache")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl VersionCache {
    /// Opens the cache at `root`, rebuilding its state from disk: partial materializations
    /// are removed, versions found, blob bytes counted.
    pub fn open(root: &Path, blobs: BlobStore, cap_bytes: u64) -> Result<Self, CacheError> {
        for dir in ["blobs", "versions", "staging", "mounts"] {
            std::fs::create_dir_all(root.join(dir))
                .map_err(io(format!("creating {}", root.join(dir).display())))?;
        }
        let staging = root.join("staging");
        for entry in std::fs::read_dir(&staging).map_err(io("reading staging"))? {
            let path = entry.map_err(io("reading staging"))?.path();
            remove_tree(&path);
        }
        // Mounts of a node that died: nothing serves them any more.
        for entry in std::fs::read_dir(root.join("mounts")).map_err(io("reading mounts"))? {
            let path = entry.map_err(io("reading mounts"))?.path();
            let _ = rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH);
            let _ = std::fs::remove_dir(&path);
        }
        let mut bytes = 0;
        let mut present = HashSet::new();
        for entry in std::fs::read_dir(root.join("blobs")).map_err(io("reading blobs"))? {
            let entry = entry.map_err(io("reading blobs"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            present.insert(name);
        }
        let cache = VersionCache {
            root: root.to_owned(),
            blobs,
            in_flight: Mutex::new(HashMap::new()),
            last_used: Mutex::new(HashMap::new()),
            blob_bytes: AtomicU64::new(bytes),
            cap_bytes,
            present: Mutex::new(present),
            layered: false,
            bases: Mutex::new(HashMap::new()),
            trees: Mutex::new(Vec::new()),
            pinned: Mutex::new(HashMap::new()),
            pinned_bases: Mutex::new(HashMap::new()),
            lazy: Mutex::new(None),
            mounts: Mutex::new(HashMap::new()),
            mounting: tokio::sync::Mutex::new(()),
            demand: tokio::sync::Semaphore::new(DEMAND_FETCHES),
            background: limit::Limit::new(PARALLEL_FETCHES),
            fetching: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            unsettled: Mutex::new((Vec::new(), false)),
            orders: Mutex::new(HashMap::new()),
            read_orders: Mutex::new(None),
            coming: Mutex::new(HashMap::new()),
            opening: tokio::sync::watch::Sender::new(0),
            urgent: tokio::sync::watch::Sender::new(0),
            calm_since: Mutex::new(tokio::time::Instant::now()),
            telling: Mutex::new(Vec::new()),
        };
        cache.load_layers();
        for (key, path) in cache.cached_versions() {
            let used = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            cache.lock_used().insert(key, used);
        }
        Ok(cache)
    }

    /// Lets new versions be layers over cached ones (see the module notes): for nodes whose
    /// sessions see versions through mounts they make. Refused (left off) when the cache's
    /// path holds a character an overlay mount's options cannot carry.
    pub fn with_layers(mut self, layered: bool) -> Self {
        let path = self.root.to_string_lossy();
        self.layered = layered && !path.contains([':', ',', '\\']);
        self
    }

    /// Finds the layered versions on disk and their bases; removes a layer whose base is gone
    /// (with whatever stacks on it), and sidecar files without their version.
    fn load_layers(&self) {
        let versions = self.root.join("versions");
        let Ok(environments) = std::fs::read_dir(&versions) else {
            return;
        };
        let mut bases = HashMap::new();
        for environment in environments.flatten() {
            let name = environment.file_name().to_string_lossy().into_owned();
            let Ok(entries) = std::fs::read_dir(environment.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                let Some((number, kind)) = file.split_once('.') else {
                    continue;
                };
                let Ok(number) = number.parse::<u32>() else {
                    continue;
                };
                if std::fs::symlink_metadata(environment.path().join(number.to_string())).is_err() {
                    let _ = std::fs::remove_file(entry.path());
                    continue;
                }
                if kind == "base" {
                    let base = std::fs::read_to_string(entry.path())
                        .ok()
                        .and_then(|text| text.trim().parse::<u32>().ok());
                    match base {
                        Some(base) => {
                            bases.insert((name.clone(), number), base);
                        }
                        // Unreadable: the layer cannot be shown; it goes below.
                        None => {
                            bases.insert((name.clone(), number), u32::MAX);
                        }
                    }
                }
            }
        }
        // A layer stands when its chain of bases ends in a whole version, within the limit.
        let stands = |key: &VersionKey| -> bool {
            let mut current = key.clone();
            for _ in 0..MAX_LAYERS {
                match bases.get(&current) {
                    None => {
                        return std::fs::symlink_metadata(self.version_dir(&current.0, current.1))
                            .is_ok();
                    }
                    Some(base) => current = (current.0.clone(), *base),
                }
            }
            false
        };
        let fallen: Vec<VersionKey> = bases.keys().filter(|key| !stands(key)).cloned().collect();
        for key in &fallen {
            tracing::warn!(environment = %key.0, version = key.1, "removing a cached layer whose base is gone");
            self.remove_version(key);
            bases.remove(key);
        }
        *self.lock_bases() = bases;
    }

    fn lock_bases(&self) -> std::sync::MutexGuard<'_, HashMap<VersionKey, u32>> {
        self.bases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The directories under a version, nearest first (empty for a whole version).
    fn lower_of(&self, key: &VersionKey) -> Vec<PathBuf> {
        let bases = self.lock_bases();
        let mut lower = Vec::new();
        let mut current = key.clone();
        while let Some(base) = bases.get(&current) {
            current = (current.0.clone(), *base);
            lower.push(self.version_dir(&current.0, current.1));
            if lower.len() >= MAX_LAYERS {
                break;
            }
        }
        lower
    }

    /// Removes a version's directory and sidecars (renamed out of `versions/` first, so it
    /// never looks whole while half deleted). False when it was not there.
    fn remove_version(&self, key: &VersionKey) -> bool {
        let path = self.version_dir(&key.0, key.1);
        let doomed = self
            .root
            .join("staging")
            .join(format!("evicted-{}", uuid::Uuid::new_v4().simple()));
        let moved = std::fs::rename(&path, &doomed).is_ok();
        if moved {
            remove_tree(&doomed);
        }
        for sidecar in ["tree", "base"] {
            let _ = std::fs::remove_file(path.with_extension(sidecar));
        }
        moved
    }

    fn lock_present(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.present
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_used(&self) -> std::sync::MutexGuard<'_, HashMap<VersionKey, SystemTime>> {
        self.last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where a version's directory is (whether or not it exists).
    pub fn version_dir(&self, environment: &str, version: u32) -> PathBuf {
        self.root
            .join("versions")
            .join(environment)
            .join(version.to_string())
    }

    /// Blob bytes the cache may hold before it evicts.
    pub fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    /// Bytes of blobs held.
    pub fn blob_bytes(&self) -> u64 {
        self.blob_bytes.load(Ordering::Relaxed)
    }

    /// Every complete version on disk.
    pub fn cached_versions(&self) -> Vec<(VersionKey, PathBuf)> {
        let mut found = Vec::new();
        let Ok(environments) = std::fs::read_dir(self.root.join("versions")) else {
            return found;
        };
        for environment in environments.flatten() {
            let name = environment.file_name().to_string_lossy().into_owned();
            let Ok(versions) = std::fs::read_dir(environment.path()) else {
                continue;
            };
            for version in versions.flatten() {
                if let Ok(number) = version.file_name().to_string_lossy().parse::<u32>() {
                    found.push(((name.clone(), number), version.path()));
                }
            }
        }
        found
    }

    /// Makes sure the version is in the cache; answers its directory.
    pub async fn materialize(
        &self,
        environment: &str,
        version: u32,
        layer_tree: &str,
    ) -> Result<Materialized, CacheError> {
        let begun = Instant::now();
        let key: VersionKey = (environment.to_owned(), version);
        let path = self.version_dir(environment, version);
        if !valid_component(environment) {
            return Err(CacheError::BadTree {
                digest: layer_tree.to_owned(),
                reason: format!("environment id {environment:?}"),
            });
        }
        // A cached version's directory is a hot dentry: one stat, not worth a thread hop.
        if std::fs::symlink_metadata(&path).is_ok() {
            let lower = self.lower_of(&key);
            self.lock_used().insert(key, SystemTime::now());
            return Ok(Materialized {
                path,
                lower,
                fetched: 0,
                took: begun.elapsed(),
                lazy: None,
            });
        }
        let gate = {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            in_flight.entry(key.clone()).or_default().clone()
        };
        let _turn = gate.lock().await;
        let result = if tokio::fs::metadata(&path).await.is_ok() {
            Ok(0)
        } else {
            self.build_version(&key, layer_tree, &path).await
        };
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&key);
        let fetched = result?;
        let lower = self.lower_of(&key);
        self.lock_used().insert(key, SystemTime::now());
        Ok(Materialized {
            path,
            lower,
            fetched,
            took: begun.elapsed(),
            lazy: None,
        })
    }

    /// Fetches what is missing, links the version together under `staging/` (as a layer over
    /// a cached version when it may be one), and renames it into place. Answers how many blobs
    /// were fetched.
    async fn build_version(
        &self,
        key: &VersionKey,
        layer_tree: &str,
        path: &Path,
    ) -> Result<u64, CacheError> {
        let tree = self.tree(layer_tree).await?;
        if self.layered
            && let Some((base, delta)) = self.base_for(key, &tree).await
        {
            // The base stays while the layer is made over it; one evicted before the pin is
            // no base any more, and the version is made whole.
            let _base = Pins::take(&self.pinned_bases, vec![(key.0.clone(), base)]);
            if std::fs::symlink_metadata(self.version_dir(&key.0, base)).is_err() {
                return self.place(layer_tree, &tree.entries, &[], None, path).await;
            }
            match self
                .place(layer_tree, &delta.put, &delta.removed, Some(base), path)
                .await
            {
                Ok(fetched) => {
                    self.lock_bases().insert(key.clone(), base);
                    return Ok(fetched);
                }
                Err(error) => {
                    tracing::warn!(environment = %key.0, version = key.1, base, %error, "cannot make the version as a layer; making it whole");
                }
            }
        }
        self.place(layer_tree, &tree.entries, &[], None, path).await
    }

    /// Fetches the blobs `entries` need and the cache lacks, then links `entries` (and
    /// whiteouts for `removed`) under `staging/` and renames them to `path`, with the sidecars.
    async fn place(
        &self,
        layer_tree: &str,
        entries: &[TreeEntry],
        removed: &[String],
        base: Option<u32>,
        path: &Path,
    ) -> Result<u64, CacheError> {
        // Every blob the version needs and the cache lacks, fetched many at a time.
        let mut wanted: HashSet<(Digest, bool)> = HashSet::new();
        for entry in entries {
            if let (TreeEntryKind::File, Some(digest)) = (entry.kind, entry.file_digest())
                && entry.size.unwrap_or(0) > 0
            {
                wanted.insert((digest, entry.mode & 0o111 != 0));
            }
        }
        // Pinned before asking what is present: a blob the sweep removes from here on is
        // skipped by it, and one it removed before is missing below and fetched again. Either
        // way every blob is there when linked.
        let _pins = Pins::take(
            &self.pinned,
            wanted
                .iter()
                .map(|(digest, executable)| blob_name(digest, *executable))
                .collect(),
        );
        let missing: Vec<(Digest, bool)> = {
            let present = self.lock_present();
            wanted
                .into_iter()
                .filter(|(digest, executable)| !present.contains(&blob_name(digest, *executable)))
                .collect()
        };
        let mut missing = missing;
        let order = self.lock_orders().get(layer_tree).cloned();
        if let Some(order) = order {
            // What the version's first sessions read, first, in the order they read it.
            let rank: HashMap<&str, usize> = order
                .iter()
                .enumerate()
                .map(|(at, path)| (path.as_str(), at))
                .collect();
            let mut first: HashMap<(Digest, bool), usize> = HashMap::new();
            for entry in entries {
                if let (Some(at), Some(digest)) =
                    (rank.get(entry.path.as_str()), entry.file_digest())
                {
                    let slot = first
                        .entry((digest, entry.mode & 0o111 != 0))
                        .or_insert(usize::MAX);
                    *slot = (*slot).min(*at);
                }
            }
            missing.sort_by_key(|key| first.get(key).copied().unwrap_or(usize::MAX));
        }
        let fetched = missing.len() as u64;
        // Written unsynced many at a time, then made durable and named a batch at a time: one
        // sync of the file system instead of one per blob.
        for batch in missing.chunks(SETTLE_BATCH) {
            futures::stream::iter(batch.iter().copied().map(|(digest, executable)| {
                self.fetch_once(digest, executable, Slots::Background, true)
            }))
            .buffer_unordered(PARALLEL_FETCHES)
            .try_collect::<Vec<_>>()
            .await?;
            self.settle(batch).await?;
        }
        if fetched > 0 {
            // The new blobs' names on disk before a version links to them.
            let blobs = self.root.join("blobs");
            tokio::task::spawn_blocking(move || sync_directory(&blobs))
                .await
                .map_err(|error| io("syncing the blobs")(std::io::Error::other(error)))??;
        }

        // Linking is thousands of small system calls: off the runtime.
        let staging = self
            .root
            .join("staging")
            .join(uuid::Uuid::new_v4().simple().to_string());
        let root = self.root.clone();
        let final_path = path.to_owned();
        let entries = entries.to_vec();
        let removed = removed.to_vec();
        let layer_tree = layer_tree.to_owned();
        tokio::task::spawn_blocking(move || {
            link_version(
                &root,
                &entries,
                &removed,
                &staging,
                &final_path,
                &layer_tree,
                base,
            )
        })
        .await
        .map_err(|error| io("linking a version")(std::io::Error::other(error.to_string())))??;
        Ok(fetched)
    }

    /// A layer tree, fetched, verified, decoded and checked (the last few are kept).
    async fn tree(&self, layer_tree: &str) -> Result<Arc<Tree>, CacheError> {
        let kept = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|(digest, _)| digest == layer_tree)
            .map(|(_, tree)| tree.clone());
        if let Some(tree) = kept {
            return Ok(tree);
        }
        let digest: Digest = layer_tree.parse().map_err(|_| CacheError::BadTree {
            digest: layer_tree.to_owned(),
            reason: "not a sha256 digest".to_owned(),
        })?;
        let bytes = self
            .blobs
            .get(&digest)
            .await
            .map_err(|error| CacheError::Blobs(error.to_string()))?
            .into_bytes()
            .await
            .map_err(|error| CacheError::Blobs(error.to_string()))?;
        let tree = Tree::decode(&bytes).map_err(|error| CacheError::BadTree {
            digest: layer_tree.to_owned(),
            reason: error.to_string(),
        })?;
        for entry in &tree.entries {
            if !safe_relative(&entry.path) {
                return Err(CacheError::BadTree {
                    digest: layer_tree.to_owned(),
                    reason: format!("unsafe path {:?}", entry.path),
                });
            }
        }
        let tree = Arc::new(tree);
        let mut trees = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        trees.insert(0, (layer_tree.to_owned(), tree.clone()));
        trees.truncate(KEPT_TREES);
        Ok(tree)
    }

    /// The cached version of the same environment to make `key` a layer over (the newest
    /// with room for one more layer), and what differs; none when every candidate differs in
    /// half its entries or more, or a name changes kind.
    async fn base_for(&self, key: &VersionKey, tree: &Tree) -> Option<(u32, Delta)> {
        let dir = self.root.join("versions").join(&key.0);
        let mut candidates: Vec<u32> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|version| *version != key.1)
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        for candidate in candidates.into_iter().take(2) {
            let candidate_key = (key.0.clone(), candidate);
            if self.lower_of(&candidate_key).len() + 2 > MAX_LAYERS {
                continue;
            }
            let Ok(digest) = std::fs::read_to_string(dir.join(format!("{candidate}.tree"))) else {
                continue;
            };
            let Ok(base) = self.tree(digest.trim()).await else {
                continue;
            };
            if let Some(delta) = delta(&base, tree)
                && (delta.put.len() + delta.removed.len()) * 2 < tree.entries.len().max(1)
            {
                return Some((candidate, delta));
            }
        }
        None
    }

    fn blob_path(&self, digest: &Digest, executable: bool) -> PathBuf {
        blob_path(&self.root, digest, executable)
    }

    fn lock_orders(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Vec<String>>>> {
        self.orders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<std::fs::File>>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fetches one blob unless it is present, taking one of `slots` while it does; a fetch of
    /// the same blob already under way is waited for, not repeated. With `unsynced`, the blob
    /// may be left pending (written, not yet on disk): its file is answered, to read from,
    /// and [`VersionCache::settle`] names it later. Otherwise the blob is named on return.
    async fn fetch_once(
        &self,
        digest: Digest,
        executable: bool,
        slots: Slots,
        unsynced: bool,
    ) -> Result<Option<Arc<std::fs::File>>, CacheError> {
        if slots == Slots::Background {
            self.make_way().await;
        }
        let name = blob_name(&digest, executable);
        // A pack bringing it is waited for; one that counts it as coming only after this looks
        // finds it fetched here, and passes it over.
        self.await_pack(&name).await;
        let gate = self.gate(&name);
        let turn = gate.lock().await;
        let pending = self.lock_pending().get(&name).cloned();
        let result = if self.lock_present().contains(&name) {
            Ok(None)
        } else if let Some(file) = pending {
            if unsynced {
                Ok(Some(file))
            } else {
                self.settle(&[(digest, executable)]).await.map(|()| None)
            }
        } else {
            match slots {
                Slots::Demand => match self.demand.acquire().await {
                    Ok(_slot) => self.fetch(digest, executable, unsynced).await,
                    Err(_) => Err(CacheError::Blobs("the node is stopping".to_owned())),
                },
                Slots::Background => {
                    let _slot = self.background.slot().await;
                    self.fetch(digest, executable, unsynced).await
                }
            }
        };
        drop(turn);
        self.release(&name, gate);
        result
    }

    /// Counts something a session waits on as in flight while the answer lives.
    fn urgent(&self) -> Urgent<'_> {
        Urgent {
            cache: self,
            _counted: Counted::new(&self.urgent),
        }
    }

    /// Waits while sessions wait on fetches, trees or packs, and for [`CALM`] after (at most
    /// [`YIELD_AT_MOST`] in all).
    async fn make_way(&self) {
        let until = tokio::time::Instant::now() + YIELD_AT_MOST;
        let mut urgent = self.urgent.subscribe();
        loop {
            if *urgent.borrow_and_update() > 0 {
                if tokio::time::timeout_at(until, urgent.wait_for(|count| *count == 0))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            let calm = self
                .calm_since
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .elapsed();
            let Some(left) = CALM.checked_sub(calm).filter(|left| !left.is_zero()) else {
                return;
            };
            // Woken early by something new to make way for, or when calm long enough.
            if tokio::time::timeout_at(
                until.min(tokio::time::Instant::now() + left),
                urgent.changed(),
            )
            .await
            .is_ok_and(|changed| changed.is_err())
                || tokio::time::Instant::now() >= until
            {
                return;
            }
        }
    }

    /// The turn to fetch or write the blob `name`: one at a time.
    fn gate(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Gives back a [`VersionCache::gate`] (its turn dropped).
    fn release(&self, name: &str, gate: Arc<tokio::sync::Mutex<()>>) {
        let mut fetching = self
            .fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The last one out removes the gate (the map's own and this one are the rest).
        if Arc::strong_count(&gate) <= 2 {
            fetching.remove(name);
        }
    }

    /// Fetches a blob a session waits for (a lazily mounted version's file), beside whatever
    /// materializations fetch. Answers the blob's file when it is pending (not yet synced and
    /// named; a task settles it soon), `None` when it is in place under its name.
    pub async fn fetch_for_session(
        self: &Arc<Self>,
        digest: Digest,
        executable: bool,
    ) -> Result<Option<Arc<std::fs::File>>, CacheError> {
        let urgent = self.urgent();
        let file = self
            .fetch_once(digest, executable, Slots::Demand, true)
            .await?;
        drop(urgent);
        if file.is_some() {
            self.settle_soon(digest, executable);
        }
        Ok(file)
    }

    /// Has a pending blob settled by a task (with whatever else is pending by then).
    fn settle_soon(self: &Arc<Self>, digest: Digest, executable: bool) {
        let start = {
            let mut unsettled = self
                .unsettled
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            unsettled.0.push((digest, executable));
            !std::mem::replace(&mut unsettled.1, true)
        };
        if !start {
            return;
        }
        let cache = Arc::downgrade(self);
        plinth_kit::tasks::spawn(async move {
            // Batches: what was fetched while the last batch synced.
            loop {
                let Some(cache) = cache.upgrade() else { return };
                let batch = {
                    let mut unsettled = cache
                        .unsettled
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if unsettled.0.is_empty() {
                        unsettled.1 = false;
                        return;
                    }
                    std::mem::take(&mut unsettled.0)
                };
                for chunk in batch.chunks(SETTLE_BATCH) {
                    if let Err(error) = cache.settle(chunk).await {
                        // Still pending: read from their files, settled by the next
                        // materialization that needs them, or fetched again later.
                        tracing::warn!(%error, "cannot put blobs sessions fetched on disk");
                    }
                }
            }
        });
    }

    /// Puts the pending blobs among `keys` on disk and gives them their names (present from
    /// then on). Those not pending are left as they are.
    async fn settle(&self, keys: &[(Digest, bool)]) -> Result<(), CacheError> {
        let files: Vec<(String, PathBuf, Arc<std::fs::File>)> = {
            let pending = self.lock_pending();
            keys.iter()
                .filter_map(|(digest, executable)| {
                    let name = blob_name(digest, *executable);
                    let file = pending.get(&name)?.clone();
                    Some((name, self.blob_path(digest, *executable), file))
                })
                .collect()
        };
        if files.is_empty() {
            return Ok(());
        }
        // Kept from the sweep between getting a name and being marked present (a name with
        // one link is one no version uses).
        let _pins = Pins::take(
            &self.pinned,
            files.iter().map(|(name, _, _)| name.clone()).collect(),
        );
        let directory = self.root.join("blobs");
        let linking: Vec<(PathBuf, Arc<std::fs::File>)> = files
            .iter()
            .map(|(_, target, file)| (target.clone(), file.clone()))
            .collect();
        tokio::task::spawn_blocking(move || -> Result<(), CacheError> {
            if linking.len() >= SYNC_WHOLE_FILE_SYSTEM {
                let directory = std::fs::File::open(&directory).map_err(io("opening the blobs"))?;
                rustix::fs::syncfs(&directory)
                    .map_err(|errno| io("syncing the blobs")(errno.into()))?;
            } else {
                for (_, file) in &linking {
                    file.sync_all().map_err(io("syncing a blob file"))?;
                }
            }
            for (target, file) in &linking {
                match plinth_blobs::link_unnamed(file, target) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(errno) => return Err(io("naming a blob file")(errno.into())),
                }
            }
            Ok(())
        })
        .await
        .map_err(|error| io("naming blob files")(std::io::Error::other(error)))??;
        // Present before no longer pending: whoever looks sees one or the other.
        let mut present = self.lock_present();
        for (name, _, _) in &files {
            present.insert(name.clone());
        }
        drop(present);
        let mut pending = self.lock_pending();
        for (name, _, file) in &files {
            if pending
                .get(name)
                .is_some_and(|held| Arc::ptr_eq(held, file))
            {
                pending.remove(name);
            }
        }
        Ok(())
    }

    /// Sets how many blobs the node fetches at once: at most this many for materializations
    /// and pre-warm (fewer while the store answers more slowly under them), and as many again
    /// for sessions waiting on a file (at least 1 each).
    pub fn with_fetch_concurrency(mut self, fetches: usize) -> Self {
        let fetches = fetches.max(1);
        self.demand = tokio::sync::Semaphore::new(fetches);
        self.background = limit::Limit::new(fetches);
        self
    }

    /// Blobs materializations and pre-warm may fetch at once now: at most the configured
    /// concurrency, fewer while the store answers more slowly under them.
    pub fn fetch_limit(&self) -> usize {
        self.background.current()
    }

    /// Lets sessions see versions before they are fetched (see [`crate::lazy`]); `None`
    /// turns it off.
    pub fn set_lazy(&self, settings: Option<LazySettings>) {
        *self
            .lazy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = settings;
    }

    /// Where read orders are kept (the catalog).
    pub fn set_read_orders(&self, orders: Arc<dyn ReadOrders>) {
        *self
            .read_orders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(orders);
    }

    fn read_orders(&self) -> Option<Arc<dyn ReadOrders>> {
        self.read_orders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the version is whole in the cache.
    pub fn holds(&self, environment: &str, version: u32) -> bool {
        valid_component(environment)
            && std::fs::symlink_metadata(self.version_dir(environment, version)).is_ok()
    }

    /// Materializes a version with the blobs its read order names first (the order asked of
    /// the catalog when there is one), after what its pack brings (see
    /// [`plinth_blobs::pack`]). What pre-warm and a lazy mount's background fetch run.
    pub async fn materialize_in_order(
        self: &Arc<Self>,
        environment: &str,
        version: u32,
        layer_tree: &str,
    ) -> Result<Materialized, CacheError> {
        if !self.holds(environment, version) {
            let order = async {
                match self.read_orders() {
                    Some(orders) => orders.get(environment, version).await,
                    None => Vec::new(),
                }
            };
            let packed = async {
                let tree = self.tree(layer_tree).await?;
                self.unpack(layer_tree, &tree).await
            };
            let (order, packed) = tokio::join!(order, packed);
            if let Err(error) = packed {
                tracing::warn!(environment, version, %error, "cannot read a version's pack; fetching its files one by one");
            }
            if !order.is_empty() {
                self.lock_orders()
                    .insert(layer_tree.to_owned(), Arc::new(order));
            }
        }
        let materialized = self.materialize(environment, version, layer_tree).await;
        self.lock_orders().remove(layer_tree);
        materialized
    }

    /// The version for a session: its directory when it is cached; otherwise, where the node
    /// mounts lazily, a mount that shows it at once (fetching each file on first open) while
    /// the whole version is fetched in the background, read order first; otherwise the whole
    /// version, fetched first.
    pub async fn open_version(
        self: &Arc<Self>,
        environment: &str,
        version: u32,
        layer_tree: &str,
    ) -> Result<Materialized, CacheError> {
        let settings = *self
            .lazy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(settings) = settings else {
            return self.materialize(environment, version, layer_tree).await;
        };
        if self.holds(environment, version) {
            return self.materialize(environment, version, layer_tree).await;
        }
        let begun = Instant::now();
        let key: VersionKey = (environment.to_owned(), version);
        let mounted = self.mounted(&key);
        let mount = match mounted {
            Some(mount) => mount,
            None => {
                let _turn = self.mounting.lock().await;
                match self.mounted(&key) {
                    Some(mount) => mount,
                    None => {
                        if !valid_component(environment) {
                            return Err(CacheError::BadTree {
                                digest: layer_tree.to_owned(),
                                reason: format!("environment id {environment:?}"),
                            });
                        }
                        let urgent = self.urgent();
                        let tree = self.tree(layer_tree).await?;
                        drop(urgent);
                        tracing::debug!(%environment, version, took_ms = begun.elapsed().as_millis() as u64, fetch_limit = self.background.current(), "a lazily mounted version's tree is at hand");
                        // Whole by now (a pre-warm finished while the tree was fetched).
                        if self.holds(environment, version) {
                            return self.materialize(environment, version, layer_tree).await;
                        }
                        match self.mount(&key, &tree, layer_tree, settings).await {
                            Ok(mount) => mount,
                            Err(error) => {
                                tracing::warn!(%error, "cannot mount versions lazily on this node; sessions wait for whole versions");
                                self.set_lazy(None);
                                return self.materialize(environment, version, layer_tree).await;
                            }
                        }
                    }
                }
            }
        };
        Ok(Materialized {
            // Each session mounts it for itself (see `crate::lazy`).
            path: PathBuf::new(),
            lower: Vec::new(),
            fetched: 0,
            took: begun.elapsed(),
            lazy: Some(mount),
        })
    }

    /// Tells what the sessions of every version still mounted lazily read and stores those
    /// versions' packs, waiting for that (and for what is being told already) at most
    /// `within`: what a node that stops would otherwise take with it, however soon after a
    /// version's first session it stops.
    pub async fn tell_before_stopping(&self, within: Duration) {
        let mounts: Vec<Arc<LazyVersion>> = self
            .mounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for mount in mounts {
            mount.tell_done();
        }
        let tasks = std::mem::take(
            &mut *self
                .telling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if tasks.is_empty() {
            return;
        }
        if tokio::time::timeout(within, futures::future::join_all(tasks))
            .await
            .is_err()
        {
            tracing::warn!(
                within_ms = within.as_millis() as u64,
                "stopping before a version's read order was told or its pack stored"
            );
        }
    }

    fn mounted(&self, key: &VersionKey) -> Option<Arc<LazyVersion>> {
        self.mounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .and_then(Weak::upgrade)
    }

    /// Serves `tree` for `key` lazily, and starts fetching the whole version behind it. The
    /// cache holds it until the version is whole; sessions that see it hold it after.
    async fn mount(
        self: &Arc<Self>,
        key: &VersionKey,
        tree: &Arc<Tree>,
        layer_tree: &str,
        settings: LazySettings,
    ) -> Result<Arc<LazyVersion>, crate::lazy::MountError> {
        let fetch: Arc<dyn crate::lazy::Fetch> = Arc::new(SessionFetch(Arc::downgrade(self)));
        let mount = LazyVersion::new(
            tree,
            &self.root.join("blobs"),
            &self.root.join("mounts"),
            fetch,
            settings.fetch_deadline,
            format!("{}/{}", key.0, key.1),
        )?;
        // What the sessions on this mount read, recorded for every node once they are done
        // with it (or its record is full).
        if let Some(orders) = self.read_orders() {
            let (environment, version) = key.clone();
            let (cache, tree, layer_tree) =
                (Arc::downgrade(self), tree.clone(), layer_tree.to_owned());
            mount.on_done(Box::new(move |paths| {
                if paths.is_empty() {
                    return;
                }
                let record = orders.record(&environment, version, paths.clone());
                let Some(cache) = cache.upgrade() else { return };
                let weak = Arc::downgrade(&cache);
                let telling = plinth_kit::tasks::spawn(async move {
                    record.await;
                    // And the files themselves, for the next node that lacks the version.
                    let Some(cache) = weak.upgrade() else { return };
                    match cache.write_pack(&layer_tree, &tree, &paths).await {
                        Ok(0) => {}
                        Ok(files) => {
                            tracing::info!(%environment, version, files, "stored the version's pack of what its first sessions read")
                        }
                        Err(error) => {
                            tracing::warn!(%environment, version, %error, "cannot store the version's pack; nodes that lack it fetch its files one by one")
                        }
                    }
                });
                let mut tasks = cache
                    .telling
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                tasks.retain(|task| !task.is_finished());
                tasks.push(telling);
            }));
            // Told once its first sessions stop opening new files for a while (they may live
            // for hours), or when it goes.
            let watched = Arc::downgrade(&mount);
            plinth_kit::tasks::spawn(async move {
                let mut seen = 0;
                loop {
                    tokio::time::sleep(READ_ORDER_QUIET).await;
                    let Some(mount) = watched.upgrade() else {
                        return;
                    };
                    let now = mount.recorded();
                    if now > 0 && (now == seen || now >= crate::lazy::MAX_RECORDED) {
                        mount.tell_done();
                        return;
                    }
                    seen = now;
                }
            });
        }
        self.mounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.clone(), Arc::downgrade(&mount));
        // The whole version behind it, read order first; the cache holds the mount until then.
        let (cache, held, key, layer_tree) = (
            self.clone(),
            mount.clone(),
            key.clone(),
            layer_tree.to_owned(),
        );
        plinth_kit::tasks::spawn(async move {
            match cache.materialize_in_order(&key.0, key.1, &layer_tree).await {
                Ok(done) => {
                    tracing::info!(environment = %key.0, version = key.1, blobs = done.fetched, took_ms = done.took.as_millis() as u64, "a lazily mounted version is whole in the cache")
                }
                Err(error) => {
                    tracing::warn!(environment = %key.0, version = key.1, %error, "cannot fetch a lazily mounted version whole; its sessions go on fetching file by file")
                }
            }
            drop(held);
        });
        Ok(mount)
    }

    /// Fetches one blob (verified by the store while it streams) into the cache: named and on
    /// disk, or with `unsynced` (while few are) pending, its file answered.
    async fn fetch(
        &self,
        digest: Digest,
        executable: bool,
        unsynced: bool,
    ) -> Result<Option<Arc<std::fs::File>>, CacheError> {
        let asking = self.background.asking();
        let blob = self
            .blobs
            .get(&digest)
            .await
            .map_err(|error| CacheError::Blobs(error.to_string()))?;
        let size = blob.size();
        asking.answered(size);
        // In memory (most blobs of a version are small) or in a spooled file: either way one
        // hand-off writes it.
        let source: Box<dyn BlobSource> = match blob {
            plinth_blobs::VerifiedBlob::Memory(bytes) => Box::new(std::io::Cursor::new(bytes)),
            plinth_blobs::VerifiedBlob::Spooled { file, .. } => Box::new(file.into_std().await),
        };
        self.keep(digest, executable, source, size, unsynced).await
    }

    /// Writes a verified blob of `size` bytes into the cache: named and on disk, or with
    /// `unsynced` (while few are) pending, its file answered.
    async fn keep(
        &self,
        digest: Digest,
        executable: bool,
        source: Box<dyn BlobSource>,
        size: u64,
        unsynced: bool,
    ) -> Result<Option<Arc<std::fs::File>>, CacheError> {
        let mode = if executable { 0o555 } else { 0o444 };
        let directory = self.root.join("blobs");
        let target = self.blob_path(&digest, executable);
        let unsynced = unsynced && self.lock_pending().len() < MAX_PENDING;
        let written = tokio::task::spawn_blocking(move || {
            if unsynced {
                write_blob_unsynced(&directory, &target, source, mode)
            } else {
                write_blob(&directory, &target, source, mode).map(|()| None)
            }
        })
        .await
        .map_err(|error| io("writing a blob file")(std::io::Error::other(error)))??;
        self.blob_bytes.fetch_add(size, Ordering::Relaxed);
        let name = blob_name(&digest, executable);
        match written {
            Some(file) => {
                let file = Arc::new(file);
                self.lock_pending().insert(name, file.clone());
                Ok(Some(file))
            }
            None => {
                self.lock_present().insert(name);
                Ok(None)
            }
        }
    }

    /// Removes least recently used versions not in `keep` until the blobs fit under the cap,
    /// then the blobs no version links. Answers the versions removed.
    pub fn evict(&self, keep: &HashSet<VersionKey>) -> Vec<VersionKey> {
        let mut removed = Vec::new();
        if self.blob_bytes() <= self.cap_bytes {
            return removed;
        }
        // Blobs no whole version links (fetched for lazily mounted versions, or left by one
        // removed) go before any version: a mount fetches one again when a session opens it.
        self.sweep_blobs();
        if self.blob_bytes() <= self.cap_bytes {
            return removed;
        }
        let in_flight: HashSet<VersionKey> = self
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        // A layer's base goes only after the layer: a base whose layers were all removed is a
        // candidate on the next pass.
        let mut bases: HashSet<VersionKey> = self
            .lock_bases()
            .iter()
            .map(|((environment, _), base)| (environment.clone(), *base))
            .collect();
        let mut candidates: Vec<(SystemTime, VersionKey, PathBuf)> = self
            .cached_versions()
            .into_iter()
            .filter(|(key, _)| {
                !keep.contains(key) && !in_flight.contains(key) && !bases.contains(key)
            })
            .map(|(key, path)| {
                let used = self
                    .lock_used()
                    .get(&key)
                    .copied()
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                (used, key, path)
            })
            .collect();
        candidates.sort();
        for (_, key, _) in candidates {
            if self.blob_bytes() <= self.cap_bytes {
                break;
            }
            // A layer being made over it now: checked under the pin's lock, so the maker
            // either pinned it first (it stays) or finds it gone.
            {
                let pinned = self
                    .pinned_bases
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if pinned.contains_key(&key) {
                    bases.insert(key.clone());
                    continue;
                }
                if !self.remove_version(&key) {
                    continue;
                }
            }
            self.lock_bases().remove(&key);
            self.lock_used().remove(&key);
            removed.push(key);
            self.sweep_blobs();
        }
        removed
    }

    /// Removes blobs that no version links any more (link count 1: only the cache's own),
    /// except those a materialization in progress has pinned: it fetched them, or found them
    /// present, and is about to link them.
    fn sweep_blobs(&self) {
        let Ok(entries) = std::fs::read_dir(self.root.join("blobs")) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if metadata.nlink() != 1 || name.starts_with(".tmp") {
                continue;
            }
            // Under the pins' lock: a materialization pins, then reads what is present, so it
            // sees this removal (and fetches the blob again) or this sees its pin.
            let pinned = self
                .pinned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if pinned.contains_key(&name) {
                continue;
            }
            if std::fs::remove_file(entry.path()).is_ok() {
                self.lock_present().remove(&name);
                self.blob_bytes
                    .fetch_sub(metadata.len().min(self.blob_bytes()), Ordering::Relaxed);
            }
            drop(pinned);
        }
    }
}

/// A lazily mounted version's fetches: through the cache while it lives.
struct SessionFetch(Weak<VersionCache>);

impl crate::lazy::Fetch for SessionFetch {
    fn fetch(
        &self,
        digest: Digest,
        executable: bool,
    ) -> futures::future::BoxFuture<'static, Result<Option<Arc<std::fs::File>>, String>> {
        let cache = self.0.clone();
        Box::pin(async move {
            let cache = cache
                .upgrade()
                .ok_or_else(|| "the node is stopping".to_owned())?;
            cache
                .fetch_for_session(digest, executable)
                .await
                .map_err(|error| error.to_string())
        })
    }
}

fn blob_name(digest: &Digest, executable: bool) -> String {
    if executable {
        format!("{}.x", digest.to_hex())
    } else {
        digest.to_hex()
    }
}

/// A verified blob's bytes, to be read once more if the first way of writing them fails.
trait BlobSource: std::io::Read + std::io::Seek + Send {}
impl<T: std::io::Read + std::io::Seek + Send> BlobSource for T {}

/// Writes a blob into the cache's `directory` as `target` (mode `mode`): an unnamed file
/// (`O_TMPFILE`) linked to its name once written, so no name shows part of a blob and a node
/// that dies mid-write leaves nothing; one directory entry per blob. Where unnamed files are
/// refused, a staging name beside it, renamed into place.
fn write_blob(
    directory: &Path,
    target: &Path,
    mut source: Box<dyn BlobSource>,
    mode: u32,
) -> Result<(), CacheError> {
    let permissions = std::fs::Permissions::from_mode(mode);
    if let Ok(unnamed) = rustix::fs::open(
        directory,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(mode),
    ) {
        let mut file = std::fs::File::from(unnamed);
        std::io::copy(&mut source, &mut file).map_err(io("writing a blob file"))?;
        // The umask may have narrowed the mode asked for at open.
        file.set_permissions(permissions.clone())
            .map_err(io("setting a blob's mode"))?;
        // On disk before it has a name: a name is what later versions trust without reading.
        file.sync_all().map_err(io("syncing a blob file"))?;
        match plinth_blobs::link_unnamed(&file, target) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => return Ok(()),
            Err(_) => source.rewind().map_err(io("reading a blob again"))?,
        }
    }
    write_blob_staged(directory, target, &mut source, permissions)
}

/// Writes a blob as an unnamed file, neither synced nor named (see [`VersionCache::settle`]),
/// and answers it; where unnamed files are refused, writes it as [`write_blob`] does and
/// answers `None`.
fn write_blob_unsynced(
    directory: &Path,
    target: &Path,
    mut source: Box<dyn BlobSource>,
    mode: u32,
) -> Result<Option<std::fs::File>, CacheError> {
    let permissions = std::fs::Permissions::from_mode(mode);
    match rustix::fs::open(
        directory,
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(mode),
    ) {
        Ok(unnamed) => {
            let mut file = std::fs::File::from(unnamed);
            std::io::copy(&mut source, &mut file).map_err(io("writing a blob file"))?;
            file.set_permissions(permissions)
                .map_err(io("setting a blob's mode"))?;
            Ok(Some(file))
        }
        Err(_) => {
            write_blob_staged(directory, target, &mut source, permissions)?;
            Ok(None)
        }
    }
}

/// [`write_blob`] where unnamed files are refused.
fn write_blob_staged(
    directory: &Path,
    target: &Path,
    source: &mut dyn std::io::Read,
    permissions: std::fs::Permissions,
) -> Result<(), CacheError> {
    let staging = directory.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::File::create(&staging).map_err(io("writing a blob file"))?;
        std::io::copy(source, &mut file).map_err(io("writing a blob file"))?;
        file.set_permissions(permissions)
            .map_err(io("setting a blob's mode"))?;
        file.sync_all().map_err(io("syncing a blob file"))?;
        drop(file);
        std::fs::rename(&staging, target).map_err(io("placing a blob"))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    written
}

/// Syncs a directory, so the names made in it are on disk.
fn sync_directory(path: &Path) -> Result<(), CacheError> {
    std::fs::File::open(path)
        .and_then(|directory| directory.sync_all())
        .map_err(io(format!("syncing {}", path.display())))
}

fn blob_path(root: &Path, digest: &Digest, executable: bool) -> PathBuf {
    root.join("blobs").join(blob_name(digest, executable))
}

/// A single safe path component (environment ids are checked before they get here; this is
/// the last line).
fn valid_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Relative, no empty, `.` or `..` components: a tree is only bytes in a bucket.
fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// What a version holds that its base does not.
#[derive(Debug, Default, PartialEq, Eq)]
struct Delta {
    /// Entries new or changed (a file's content or executable bit, a link's target).
    put: Vec<TreeEntry>,
    /// Names the base has and the version does not; only the topmost of a removed subtree.
    removed: Vec<String>,
}

/// Every name in a tree: its entries and the directories above them.
fn names(tree: &Tree) -> HashSet<&str> {
    let mut names = HashSet::with_capacity(tree.entries.len());
    for entry in &tree.entries {
        let mut next = Some(entry.path.as_str());
        while let Some(name) = next {
            if !names.insert(name) {
                break;
            }
            next = name.rsplit_once('/').map(|(parent, _)| parent);
        }
    }
    names
}

/// How `new` differs from `base`; none when an entry of both changes kind (a layer would need
/// an opaque directory for it).
fn delta(base: &Tree, new: &Tree) -> Option<Delta> {
    let by_path: HashMap<&str, &TreeEntry> = base
        .entries
        .iter()
        .map(|entry| (entry.path.as_str(), entry))
        .collect();
    let mut delta = Delta::default();
    for entry in &new.entries {
        match by_path.get(entry.path.as_str()) {
            None => delta.put.push(entry.clone()),
            Some(old) if old.kind != entry.kind => return None,
            Some(old) => {
                let same = match entry.kind {
                    TreeEntryKind::Dir => true,
                    TreeEntryKind::File => {
                        old.digest == entry.digest && (old.mode & 0o111) == (entry.mode & 0o111)
                    }
                    TreeEntryKind::Symlink => old.target == entry.target,
                };
                if !same {
                    delta.put.push(entry.clone());
                }
            }
        }
    }
    let (old_names, new_names) = (names(base), names(new));
    let mut removed: Vec<String> = old_names
        .iter()
        .filter(|name| !new_names.contains(*name))
        .filter(|name| match name.rsplit_once('/') {
            None => true,
            Some((parent, _)) => new_names.contains(parent),
        })
        .map(|name| (*name).to_owned())
        .collect();
    removed.sort();
    delta.removed = removed;
    Some(delta)
}

/// Threads linking one version: link and mkdir are cheap system calls, so a few threads
/// keep the disk busy.
const LINK_THREADS: usize = 4;

/// Builds a version's directory under `staging/` from cached blobs (with an overlay whiteout
/// for each of `removed` when it is a layer over `base`), makes it read-only, writes its
/// sidecars and renames it to `final_path`. Directories are known from the tree (no `stat`
/// per file) and made parents first; files and links are then made by a few threads at once.
fn link_version(
    root: &Path,
    entries: &[TreeEntry],
    removed: &[String],
    staging: &Path,
    final_path: &Path,
    layer_tree: &str,
    base: Option<u32>,
) -> Result<(), CacheError> {
    let built = (|| {
        std::fs::create_dir_all(staging).map_err(io("creating a staging directory"))?;
        let mut directories: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        let parents = removed
            .iter()
            .filter_map(|path| path.rsplit_once('/').map(|(parent, _)| parent));
        for dir in entries
            .iter()
            .map(|entry| {
                if entry.kind == TreeEntryKind::Dir {
                    Some(entry.path.as_str())
                } else {
                    entry.path.rsplit_once('/').map(|(parent, _)| parent)
                }
            })
            .chain(parents.map(Some))
        {
            let mut next = dir;
            while let Some(dir) = next {
                if !directories.insert(dir) {
                    break;
                }
                next = dir.rsplit_once('/').map(|(parent, _)| parent);
            }
        }
        // Sorted, so every parent comes before its children.
        for dir in &directories {
            std::fs::create_dir(staging.join(dir)).map_err(io(format!("creating {dir}")))?;
        }
        let leaves: Vec<&TreeEntry> = entries
            .iter()
            .filter(|entry| entry.kind != TreeEntryKind::Dir)
            .collect();
        // Links are made relative to the two directories, held open: the kernel walks only
        // each entry's own path, not the cache's and the staging directory's as well.
        let directory = |path: &Path| {
            rustix::fs::open(
                path,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|errno| io(format!("opening {}", path.display()))(errno.into()))
        };
        let (blobs, staged) = (directory(&root.join("blobs"))?, directory(staging)?);
        let (blobs, staged) = (blobs.as_fd(), staged.as_fd());
        let chunk = leaves.len().div_ceil(LINK_THREADS).max(1);
        std::thread::scope(|scope| {
            let workers: Vec<_> = leaves
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .try_for_each(|entry| place(blobs, staged, entry))
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|worker| {
                worker.join().unwrap_or_else(|_| {
                    Err(io("linking")(std::io::Error::other(
                        "a linking thread panicked",
                    )))
                })
            })
        })?;
        for path in removed {
            rustix::fs::mknodat(
                staged,
                path.as_str(),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::empty(),
                0,
            )
            .map_err(|errno| io(format!("hiding {path} from the base version"))(errno.into()))?;
        }
        // Directories read-only, deepest first (the read-only mount is what enforces it for
        // sessions; this keeps the node's own tools from writing by mistake).
        for dir in directories.iter().rev() {
            std::fs::set_permissions(staging.join(dir), std::fs::Permissions::from_mode(0o555))
                .map_err(io(format!("making {dir} read-only")))?;
        }
        std::fs::set_permissions(staging, std::fs::Permissions::from_mode(0o555))
            .map_err(io("making the version read-only"))?;
        if let Some(parent) = final_path.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating the versions directory"))?;
        }
        // The sidecars first: a version directory is only ever seen with them.
        std::fs::write(final_path.with_extension("tree"), layer_tree)
            .map_err(io("recording the version's tree"))?;
        match base {
            Some(base) => std::fs::write(final_path.with_extension("base"), base.to_string())
                .map_err(io("recording the version's base"))?,
            None => {
                let _ = std::fs::remove_file(final_path.with_extension("base"));
            }
        }
        // Everything the version holds (its links, whiteouts, directories and sidecars) on
        // disk before its name says it is whole: one `syncfs` rather than a sync per directory.
        let staged = std::fs::File::open(staging).map_err(io("opening the staged version"))?;
        rustix::fs::syncfs(&staged)
            .map_err(|errno| io("syncing the staged version")(errno.into()))?;
        drop(staged);
        std::fs::rename(staging, final_path).map_err(io("placing the version"))?;
        match final_path.parent() {
            Some(parent) => sync_directory(parent),
            None => Ok(()),
        }
    })();
    if built.is_err() {
        remove_tree(staging);
    }
    built
}

/// Makes one file (a hard link to its blob in `blobs`) or symlink of a version, at its path
/// beneath `staging`.
fn place(
    blobs: BorrowedFd<'_>,
    staging: BorrowedFd<'_>,
    entry: &TreeEntry,
) -> Result<(), CacheError> {
    let failed = |what: &str| {
        let what = format!("{what} {}", entry.path);
        move |errno: rustix::io::Errno| io(what)(errno.into())
    };
    if entry.kind == TreeEntryKind::Symlink {
        let link = entry.target.clone().unwrap_or_default();
        return rustix::fs::symlinkat(link.as_str(), staging, entry.path.as_str())
            .map_err(failed("linking"));
    }
    let executable = entry.mode & 0o111 != 0;
    let mode = if executable { 0o555 } else { 0o444 };
    let Some(digest) = entry.file_digest() else {
        return Err(CacheError::BadTree {
            digest: String::new(),
            reason: format!("{} has no digest", entry.path),
        });
    };
    // A file of its own: empty, or its blob has too many links already.
    let own_copy = |source: Option<&str>| -> Result<(), CacheError> {
        let created = rustix::fs::openat(
            staging,
            entry.path.as_str(),
            rustix::fs::OFlags::WRONLY
                | rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::EXCL
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(mode),
        )
        .map_err(failed("creating"))?;
        let mut output = std::fs::File::from(created);
        if let Some(source) = source {
            let input = rustix::fs::openat(
                blobs,
                source,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(failed("reading the blob of"))?;
            std::io::copy(&mut std::fs::File::from(input), &mut output)
                .map_err(io(format!("creating {}", entry.path)))?;
        }
        output
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("setting the mode of {}", entry.path)))
    };
    if entry.size.unwrap_or(0) == 0 {
        return own_copy(None);
    }
    let source = blob_name(&digest, executable);
    match rustix::fs::linkat(
        blobs,
        source.as_str(),
        staging,
        entry.path.as_str(),
        rustix::fs::AtFlags::empty(),
    ) {
        Ok(()) => Ok(()),
        // Too many links to one inode (a file repeated across many versions): this one gets
        // its own copy.
        Err(rustix::io::Errno::MLINK) => own_copy(Some(&source)),
        Err(errno) => Err(failed("linking")(errno)),
    }
}

/// Removes a tree whose directories may be read-only.
pub fn remove_tree(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() {
        return;
    }
    // Not root (or a read-only directory in the way): open every directory up, then retry.
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        if let Ok(metadata) = std::fs::symlink_metadata(&dir)
            && metadata.is_dir()
        {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                pending.extend(entries.flatten().map(|entry| entry.path()));
            }
        }
    }
    let _ = std::fs::remove_dir_all(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    fn file(path: &str, content: &str, executable: bool) -> TreeEntry {
        TreeEntry::file(
            path,
            Digest::of(content.as_bytes()),
            content.len() as u64,
            executable,
        )
    }

    fn paths(entries: &[TreeEntry]) -> Vec<&str> {
        entries.iter().map(|entry| entry.path.as_str()).collect()
    }

    #[test]
    fn a_delta_holds_what_changed_and_the_topmost_removed_names() {
        let base = Tree::new(vec![
            TreeEntry::dir("a"),
            file("a/same.txt", "same", false),
            file("a/changed.txt", "before", false),
            file("a/mode.sh", "echo", false),
            TreeEntry::symlink("a/link", "same.txt"),
            file("gone/deep/file.txt", "x", false),
            file("gone/other.txt", "y", false),
            file("kept/removed.txt", "z", false),
            file("kept/stays.txt", "w", false),
        ]);
        let new = Tree::new(vec![
            TreeEntry::dir("a"),
            file("a/same.txt", "same", false),
            file("a/changed.txt", "after", false),
            file("a/mode.sh", "echo", true),
            TreeEntry::symlink("a/link", "changed.txt"),
            file("kept/stays.txt", "w", false),
            file("new/file.txt", "n", false),
        ]);
        let found = delta(&base, &new).expect("a layer can hold it");
        assert_eq!(
            paths(&found.put),
            ["a/changed.txt", "a/link", "a/mode.sh", "new/file.txt"]
        );
        assert_eq!(found.removed, ["gone", "kept/removed.txt"]);
        assert_eq!(delta(&new, &new), Some(Delta::default()));
    }

    #[test]
    fn a_name_that_changes_kind_needs_a_whole_version() {
        let base = Tree::new(vec![TreeEntry::dir("thing"), file("thing/x", "x", false)]);
        let new = Tree::new(vec![file("thing", "now a file", false)]);
        assert_eq!(delta(&base, &new), None);
    }

    async fn cache_with(files: &[(&str, &str)]) -> (tempfile::TempDir, VersionCache, String) {
        let dir = tempfile::tempdir().expect("dir");
        let store = BlobStore::open("memory://", dir.path().join("spool")).expect("memory store");
        let mut entries = Vec::new();
        for (path, content) in files {
            store
                .put_bytes(bytes::Bytes::copy_from_slice(content.as_bytes()))
                .await
                .expect("put");
            entries.push(file(path, content, false));
        }
        let tree = Tree::new(entries).encode().expect("encode");
        let layer = store.put_bytes(tree.into()).await.expect("tree").digest;
        let cache = VersionCache::open(&dir.path().join("cache"), store, 0).expect("open");
        (dir, cache, layer.to_string())
    }

    /// Background fetches wait while a session waits on something, and a moment after, so the
    /// next link of a session's start (its pack after its tree) does not queue behind them;
    /// never longer than [`YIELD_AT_MOST`]. On the runtime's own clock, paused.
    #[tokio::test(start_paused = true)]
    async fn background_fetches_make_way_while_a_session_waits_and_a_moment_after() {
        // Lets the spawned tasks run as far as they can.
        async fn others() {
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
        }
        let (_dir, cache, _layer) = cache_with(&[("a", "alpha")]).await;
        let cache = Arc::new(cache);
        // Calm since long before.
        tokio::time::advance(CALM * 2).await;
        let quick = cache.make_way();
        tokio::pin!(quick);
        assert!(
            futures::poll!(quick.as_mut()).is_ready(),
            "a background fetch waited with nothing in flight"
        );

        // A background fetch about to start, on its own task.
        let background = || {
            let cache = cache.clone();
            plinth_kit::tasks::spawn(async move { cache.make_way().await })
        };
        let tree = cache.urgent();
        let waiting = background();
        others().await;
        tokio::time::advance(Duration::from_millis(500)).await;
        others().await;
        assert!(
            !waiting.is_finished(),
            "a background fetch started while a session waited"
        );
        drop(tree);
        tokio::time::advance(CALM / 2).await;
        others().await;
        assert!(
            !waiting.is_finished(),
            "a background fetch started the moment the session's wait ended"
        );
        // The pack, the chain's next link: the calm starts over after it.
        let pack = cache.urgent();
        tokio::time::advance(CALM).await;
        others().await;
        assert!(
            !waiting.is_finished(),
            "a background fetch started while the pack was read"
        );
        drop(pack);
        tokio::time::advance(CALM).await;
        others().await;
        assert!(
            waiting.is_finished(),
            "a background fetch still waits, calm long enough"
        );

        // A session that never stops waiting holds background fetches back at most so long.
        let _forever = cache.urgent();
        let held = background();
        others().await;
        tokio::time::advance(YIELD_AT_MOST - Duration::from_millis(1)).await;
        others().await;
        assert!(
            !held.is_finished(),
            "a background fetch started while a session waited"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        others().await;
        assert!(
            held.is_finished(),
            "a background fetch waited past the longest wait"
        );
    }

    /// The sweep removes unlinked blobs, but never one a materialization has pinned: it found
    /// it present, or fetched it, and links it next.

    #[tokio::test]
    async fn a_blob_a_session_fetched_is_read_at_once_and_named_once_on_disk() {
        let (_dir, cache, _layer) = cache_with(&[("a.txt", "alpha"), ("b.txt", "beta")]).await;
        let cache = Arc::new(cache);
        let alpha = Digest::of(b"alpha");
        let target = cache.blob_path(&alpha, false);
        let file = cache
            .fetch_for_session(alpha, false)
            .await
            .expect("fetched")
            .expect("answered before it is on disk");
        let mut read = String::new();
        std::io::Read::read_to_string(
            &mut crate::lazy::reader(&file, 5).expect("a reader"),
            &mut read,
        )
        .expect("read");
        assert_eq!(read, "alpha");
        // A second asker while it is pending gets the same bytes, not a second fetch.
        let again = cache.fetch_once(alpha, false, Slots::Demand, true).await;
        assert!(matches!(again, Ok(Some(ref held)) if Arc::ptr_eq(held, &file)));
        // A materialization needs names: asking for it synced settles it.
        cache
            .fetch_once(alpha, false, Slots::Background, false)
            .await
            .expect("settled");
        assert!(target.exists(), "named once synced");
        assert!(cache.lock_present().contains(&blob_name(&alpha, false)));
        assert!(cache.lock_pending().is_empty());
        let named = std::fs::read_to_string(&target).expect("named blob");
        assert_eq!(named, "alpha");
        assert_eq!(
            std::fs::metadata(&target)
                .expect("stat")
                .permissions()
                .mode()
                & 0o777,
            0o444
        );

        // Left to the settling task, a session's blob gets its name too.
        let beta = Digest::of(b"beta");
        cache
            .fetch_for_session(beta, false)
            .await
            .expect("fetched")
            .expect("pending");
        let named = cache.blob_path(&beta, false);
        for _ in 0..500 {
            if named.exists() && cache.lock_pending().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(std::fs::read_to_string(&named).expect("named"), "beta");
        assert!(cache.lock_pending().is_empty());
    }

    #[tokio::test]
    async fn a_node_that_stops_before_a_blob_is_settled_leaves_no_name() {
        let (dir, cache, layer) = cache_with(&[("a.txt", "alpha")]).await;
        let cache = Arc::new(cache);
        let alpha = Digest::of(b"alpha");
        let pending = cache
            .fetch_once(alpha, false, Slots::Demand, true)
            .await
            .expect("fetched")
            .expect("pending");
        drop(pending);
        drop(cache);
        let store = BlobStore::open("memory://", dir.path().join("spool2")).expect("store");
        let reopened = VersionCache::open(&dir.path().join("cache"), store, 0).expect("reopen");
        assert!(
            reopened.lock_present().is_empty(),
            "no name without its bytes on disk"
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("cache/blobs"))
                .expect("blobs")
                .count(),
            0
        );
        drop(layer);
    }
    #[tokio::test]
    async fn the_sweep_passes_over_blobs_a_materialization_is_about_to_link() {
        let (_dir, cache, layer) = cache_with(&[("a.txt", "alpha"), ("b.txt", "beta")]).await;
        cache.materialize("henv_a", 1, &layer).await.expect("made");
        assert_eq!(cache.evict(&HashSet::new()), [("henv_a".to_owned(), 1)]);
        // Both blobs are unlinked now; put one back as a materialization would find it.
        cache
            .materialize("henv_a", 2, &layer)
            .await
            .expect("made again");
        cache.remove_version(&("henv_a".to_owned(), 2));
        let (alpha, beta) = (
            blob_name(&Digest::of(b"alpha"), false),
            blob_name(&Digest::of(b"beta"), false),
        );
        let pinned = Pins::take(&cache.pinned, vec![beta.clone()]);
        cache.sweep_blobs();
        let blobs = cache.root.join("blobs");
        assert!(
            !blobs.join(&alpha).exists(),
            "an unpinned, unlinked blob goes"
        );
        assert!(blobs.join(&beta).exists(), "a pinned one stays");
        assert!(cache.lock_present().contains(&beta));
        drop(pinned);
        cache.sweep_blobs();
        assert!(!blobs.join(&beta).exists(), "and goes once unpinned");
        assert!(cache.lock_present().is_empty());
    }

    /// Versions made while eviction runs without pause (the cache's cap is 0) are all whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn materializing_while_eviction_sweeps_always_links_every_file() {
        let files: Vec<(String, String)> = (0..40)
            .map(|i| (format!("f{i}.txt"), format!("content {i}")))
            .collect();
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, content)| (path.as_str(), content.as_str()))
            .collect();
        let (_dir, cache, layer) = cache_with(&borrowed).await;
        let cache = Arc::new(cache);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let evictor = {
            let (cache, stop) = (cache.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    cache.evict(&HashSet::new());
                }
            })
        };
        for version in 1..=60 {
            let made = cache
                .materialize("henv_b", version, &layer)
                .await
                .expect("every materialization succeeds");
            for (path, content) in &files {
                // The evictor may already have taken the version; if it is there, it is whole.
                if let Ok(read) = std::fs::read_to_string(made.path.join(path)) {
                    assert_eq!(&read, content);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        evictor.join().expect("evictor");
    }

    /// Both ways of writing a blob leave it whole, under its name only, with its mode.
    #[test]
    fn a_blob_is_written_whole_with_its_mode_either_way() {
        let dir = tempfile::tempdir().expect("dir");
        let unnamed = dir.path().join("abc");
        let bytes = |content: &'static [u8]| -> Box<dyn BlobSource> {
            Box::new(std::io::Cursor::new(content))
        };
        write_blob(dir.path(), &unnamed, bytes(b"blob bytes"), 0o555).expect("unnamed write");
        let staged = dir.path().join("def");
        write_blob_staged(
            dir.path(),
            &staged,
            &mut &b"other bytes"[..],
            std::fs::Permissions::from_mode(0o444),
        )
        .expect("staged write");
        assert_eq!(names(dir.path()), ["abc", "def"]);
        assert_eq!(std::fs::read(&unnamed).expect("read"), b"blob bytes");
        assert_eq!(std::fs::read(&staged).expect("read"), b"other bytes");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&unnamed), 0o555);
        assert_eq!(mode(&staged), 0o444);
        // Written again (another fetch won the race): the first stays, nothing is left over.
        write_blob(dir.path(), &unnamed, bytes(b"blob bytes"), 0o555).expect("second write");
        assert_eq!(names(dir.path()), ["abc", "def"]);
        // A large blob comes from the file the store spooled it to.
        std::fs::write(dir.path().join("spool"), b"spooled bytes").expect("spool");
        let source = std::fs::File::open(dir.path().join("spool")).expect("open");
        let large = dir.path().join("ghi");
        write_blob(dir.path(), &large, Box::new(source), 0o444).expect("from a file");
        assert_eq!(std::fs::read(&large).expect("read"), b"spooled bytes");
        assert_eq!(mode(&large), 0o444);
    }
}
