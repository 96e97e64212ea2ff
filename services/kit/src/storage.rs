//! Which of the process's stores is full. A write that finds its disk full marks the store
//! ([`mark_full`], from [`crate::PlinthError::storage_full`]); the `plinth_store_full` gauge
//! and a `/readyz` detail line say so until space returns. A store with a known directory
//! ([`watch`]) is checked every few seconds and marked free once its file system has room
//! again; one without is marked free when no write has found it full for a minute. Reads go on
//! meanwhile, so a full store does not make the process not ready: that would take its reads
//! away too.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a watched store's file system is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Free bytes past which a watched store counts as having room again.
const ROOM_BYTES: u64 = 8 << 20;
/// How long an unwatched store stays marked after its last failed write.
const UNWATCHED_FOR: Duration = Duration::from_secs(60);

/// A store a Plinth process writes to, named by `insufficient_storage` when its disk is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Store {
    /// The catalog's or the index's database (SQLite in the data directory by default).
    Database,
    /// The blob store (a `file://` directory in the data directory by default).
    Blobs,
    /// A node's version cache and session state.
    NodeCache,
    /// Where uploads are spooled and large blobs verified before they are stored.
    Spool,
    /// A disk the process writes to that the failing call did not name.
    Unnamed,
}

impl Store {
    /// Every store, for the `plinth_store_full` gauge.
    pub const ALL: [Store; 5] = [
        Store::Database,
        Store::Blobs,
        Store::NodeCache,
        Store::Spool,
        Store::Unnamed,
    ];

    /// The store's name in `detail.store` and the gauge's `store` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Store::Database => "database",
            Store::Blobs => "blobs",
            Store::NodeCache => "node_cache",
            Store::Spool => "spool",
            Store::Unnamed => "other",
        }
    }

    /// The store for a person, with the setting that places it.
    pub fn description(self) -> &'static str {
        match self {
            Store::Database => {
                "the database's disk (the data directory's, or the database server's)"
            }
            Store::Blobs => {
                "the blob store's directory (source.blob_url, in the data directory by default)"
            }
            Store::NodeCache => {
                "the node's state directory (node.state_dir: its version cache and sessions)"
            }
            Store::Spool => {
                "the spool directory (source.spool_dir, in the data directory by default)"
            }
            Store::Unnamed => "a disk this server writes to",
        }
    }
}

/// When each full store last failed a write.
static FULL: Mutex<Vec<(Store, Instant)>> = Mutex::new(Vec::new());

/// The gauge's name.
pub const GAUGE: &str = "plinth_store_full";

/// Sets the gauge of every store (0 for each not marked full), so a scrape sees each from the
/// start; called when the metrics recorder is installed.
pub(crate) fn register() {
    let full = FULL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    set_gauges(&full);
}

fn set_gauges(full: &[(Store, Instant)]) {
    for store in Store::ALL {
        let marked = full.iter().any(|(marked, _)| *marked == store);
        metrics::gauge!(GAUGE, "store" => store.as_str()).set(if marked { 1.0 } else { 0.0 });
    }
}

/// Records that a write to `store` found its disk full.
pub fn mark_full(store: Store) {
    let mut full = FULL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    full.retain(|(marked, _)| *marked != store);
    full.push((store, Instant::now()));
    publish(&full);
}

/// Whether `store` is marked full.
pub fn is_full(store: Store) -> bool {
    FULL.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .any(|(marked, _)| *marked == store)
}

fn mark_free(store: Store) {
    let mut full = FULL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = full.len();
    full.retain(|(marked, _)| *marked != store);
    if full.len() != before {
        tracing::info!(store = store.as_str(), "the store has room again");
        publish(&full);
    }
}

fn publish(full: &[(Store, Instant)]) {
    set_gauges(full);
    let line = if full.is_empty() {
        "every store has room".to_owned()
    } else {
        let names: Vec<String> = full
            .iter()
            .map(|(store, _)| format!("{} ({})", store.as_str(), store.description()))
            .collect();
        format!("FULL, writes refused with 507: {}", names.join("; "))
    };
    crate::details::describe("storage", line);
}

/// Free bytes on the file system holding `dir`, as this process may use them (root may use
/// the blocks reserved for it).
/// A directory made only when first written to (a spool) counts by its nearest existing
/// parent: the same file system, as it will be.
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let existing = dir
        .ancestors()
        .find(|dir| dir.exists())
        .unwrap_or(std::path::Path::new("/"));
    let stat = rustix::fs::statvfs(existing)?;
    let blocks = if rustix::process::geteuid().is_root() {
        stat.f_bfree
    } else {
        stat.f_bavail
    };
    Ok(blocks.saturating_mul(stat.f_frsize))
}

/// Checks `dir`, `store`'s directory, in the background: marks the store free once its file
/// system has room again. Also sweeps unwatched stores whose last failure is old.
/// A store is watched once per process: the first directory given is the one checked.
pub fn watch(store: Store, dir: PathBuf) {
    static WATCHED: Mutex<Vec<Store>> = Mutex::new(Vec::new());
    {
        let mut dirs = DIRS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !dirs.iter().any(|(known, _)| *known == store) {
            dirs.push((store, dir.clone()));
        }
    }
    {
        let mut watched = WATCHED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if watched.contains(&store) || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        watched.push(store);
    }
    crate::tasks::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if is_full(store) {
                let dir = dir.clone();
                let room = tokio::task::spawn_blocking(move || free_bytes(&dir))
                    .await
                    .ok()
                    .and_then(Result::ok);
                if room.is_some_and(|free| free >= ROOM_BYTES) {
                    mark_free(store);
                }
            }
            sweep_unwatched(store);
        }
    });
}

/// The directory of each watched store (the first given).
static DIRS: Mutex<Vec<(Store, PathBuf)>> = Mutex::new(Vec::new());

/// Refuses new content (`insufficient_storage`, the store marked full) while one of `stores`
/// that is watched has less than 8 MiB free on its file system: that room is kept
/// for what frees space (deletes, collection) and for the small writes sessions and builds
/// make, which a disk filled to its last block by new content would refuse too. The store
/// reads as having room again at the same mark. Stores not watched (on a server of their
/// own) are not looked at.
pub fn keep_room(stores: &[Store]) -> Result<(), crate::PlinthError> {
    let dirs: Vec<(Store, PathBuf)> = DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(store, _)| stores.contains(store))
        .cloned()
        .collect();
    for (store, dir) in dirs {
        if free_bytes(&dir).is_ok_and(|free| free < ROOM_BYTES) {
            return Err(crate::PlinthError::storage_full(store));
        }
    }
    Ok(())
}

/// Watches the directory of a SQLite database URL (`sqlite://path?…`); a database on a
/// server has its own disk, which its own monitoring watches.
pub fn watch_database(url: &str) {
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return;
    };
    let path = rest.split('?').next().unwrap_or_default();
    let dir = std::path::Path::new(path)
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    watch(Store::Database, dir.to_path_buf());
}

/// Marks free every store but `watched` whose last failed write is older than
/// [`UNWATCHED_FOR`].
fn sweep_unwatched(watched: Store) {
    let stale: Vec<Store> = FULL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(store, at)| *store != watched && at.elapsed() >= UNWATCHED_FOR)
        .map(|(store, _)| *store)
        .collect();
    for store in stale {
        mark_free(store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_store_shows_in_the_gauge_and_readiness_until_it_is_free() {
        mark_full(Store::Spool);
        assert!(is_full(Store::Spool));
        let rendered = crate::telemetry::render_metrics();
        assert!(
            rendered.contains("plinth_store_full{store=\"spool\"} 1"),
            "{rendered}"
        );
        assert!(
            rendered.contains("plinth_store_full{store=\"blobs\"} 0"),
            "{rendered}"
        );
        mark_free(Store::Spool);
        assert!(!is_full(Store::Spool));
        let rendered = crate::telemetry::render_metrics();
        assert!(
            rendered.contains("plinth_store_full{store=\"spool\"} 0"),
            "{rendered}"
        );
    }
}
