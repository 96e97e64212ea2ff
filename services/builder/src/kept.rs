//! Kept dependency trees: after a build is published, its `.venv` and `node_modules` are moved
//! aside (renames), so the environment's next rebuild with the same dependencies starts from
//! them instead of writing thousands of files back out of the blob store.
//!
//! A kept directory (the builder's `<work_dir>/kept`, or `kept/` on a scope's build disk)
//! holds entries named `<scope prefix><environment key>-<layer>`, each the trees of the build
//! that produced `<layer>` and a small file recording their bytes. The rules:
//!
//! - **A tree belongs to one build at a time.** A build takes its trees out of the kept
//!   directory with renames into its scratch directory: from then on no one else can reach
//!   them, and nothing deletes them under it. Nothing is ever deleted at a name a build could
//!   take: an entry to delete is first renamed to a name no build looks for
//!   (`PARTIAL_KEPT``doomed-…`, removed at the next start if the builder dies meanwhile), and
//!   only then deleted, off the build's path.
//! - **Each environment keeps its newest trees.** Keeping an environment's trees makes its
//!   older entries go.
//! - **A byte budget** (`builder.kept_dependencies_mb`) bounds each kept directory: the entries
//!   kept least recently go first until the rest fit; a tree larger than the whole budget is
//!   not kept.
//!
//! Every change to a kept directory's names (take, keep, forget) happens under one lock of
//! the process, so a take never meets an eviction half done. Work directories are one
//! process's each ([`crate::worker::lock_work_dir`]), so a process lock is enough. The renames
//! are all on one file system and take microseconds; the lock is never held while deleting.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::scope_disk::PARTIAL_KEPT;

/// The dependency trees a build makes, by their names in the scratch directory.
pub const TREES: [&str; 2] = [".venv", "node_modules"];

/// The file in an entry recording its trees' bytes on disk.
const BYTES_FILE: &str = ".plinth-kept-bytes";

/// Held for every change of a kept directory's names.
static NAMES: Mutex<()> = Mutex::new(());

/// What a caller deletes after a change, outside the lock (and off the build's path).
#[must_use]
#[derive(Debug, Default)]
pub struct Doomed(Vec<PathBuf>);

impl Doomed {
    /// Deletes what was set aside. Blocking.
    pub fn delete(self) {
        for path in self.0 {
            if let Err(error) = std::fs::remove_dir_all(&path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %path.display(), %error, "removing a kept dependency tree failed");
            }
        }
    }

    /// How many entries were set aside.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Moves the trees kept at `dir/name` into `scratch` (which holds none); false when there are
/// none (never kept, evicted, or a rename failed: then nothing of them is left in `scratch`).
/// Blocking.
pub fn take(dir: &Path, name: &str, scratch: &Path) -> bool {
    let entry = dir.join(name);
    let _names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if !std::fs::symlink_metadata(&entry).is_ok_and(|metadata| metadata.is_dir()) {
        return false;
    }
    let mut moved = Vec::new();
    let mut whole = true;
    for tree in TREES {
        let from = entry.join(tree);
        match std::fs::symlink_metadata(&from) {
            Ok(metadata) if metadata.is_dir() => {
                if std::fs::rename(&from, scratch.join(tree)).is_ok() {
                    moved.push(tree);
                } else {
                    whole = false;
                }
            }
            // Only directories are ever kept: anything else there is no tree to reuse.
            Ok(_) => whole = false,
            Err(_) => {}
        }
    }
    if !whole {
        // Put back what moved: the entry stays as it was, and its eviction deletes it whole.
        for tree in moved.drain(..) {
            let _ = std::fs::rename(scratch.join(tree), entry.join(tree));
        }
        return false;
    }
    // The entry is empty now but for its bytes file.
    let _ = std::fs::remove_file(entry.join(BYTES_FILE));
    let _ = std::fs::remove_dir(&entry);
    !moved.is_empty()
}

/// Keeps `scratch`'s trees (after its build was published) at `dir/name`, where `name` starts
/// with `environment` (the prefix all of the environment's entries share): the environment's
/// older entries go, then the least recently kept others until everything fits in `budget`
/// bytes. Answers what to delete; nothing is kept when the trees are missing, larger than the
/// budget, or already kept. Blocking.
pub fn keep(dir: &Path, environment: &str, name: &str, scratch: &Path, budget: u64) -> Doomed {
    let present: Vec<&str> = TREES
        .into_iter()
        .filter(|tree| {
            std::fs::symlink_metadata(scratch.join(tree)).is_ok_and(|metadata| metadata.is_dir())
        })
        .collect();
    let bytes: u64 = present
        .iter()
        .map(|tree| disk_bytes(&scratch.join(tree)))
        .sum();
    let fits = !present.is_empty() && bytes <= budget;
    // Set aside under a partial name (outside the lock: no build looks for it) and renamed into
    // place whole: a builder killed halfway leaves a partial directory, removed at its next
    // start, never an entry that lacks one of its trees.
    let partial = dir.join(format!("{PARTIAL_KEPT}{}", uuid::Uuid::new_v4().simple()));
    let set_aside = fits && set_aside(&partial, scratch, &present, bytes);
    let _names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut doomed = Doomed::default();
    let entry = dir.join(name);
    let kept = set_aside
        && std::fs::symlink_metadata(&entry).is_err()
        && std::fs::rename(&partial, &entry).is_ok();
    if set_aside && !kept {
        doomed.0.push(partial);
    }
    let mut others: Vec<(std::time::SystemTime, u64, String)> = Vec::new();
    for (other, modified, other_bytes) in entries(dir) {
        if other == name {
            continue;
        }
        if other.starts_with(environment) {
            doom(dir, &other, &mut doomed);
        } else {
            others.push((modified, other_bytes, other));
        }
    }
    // Least recently kept first.
    others.sort();
    let mut total: u64 =
        others.iter().map(|(_, bytes, _)| bytes).sum::<u64>() + if kept { bytes } else { 0 };
    for (_, other_bytes, other) in others {
        if total <= budget {
            break;
        }
        doom(dir, &other, &mut doomed);
        total = total.saturating_sub(other_bytes);
    }
    doomed
}

/// Forgets every entry in `dir` whose name starts with `prefix` (a scope's, when its download
/// cache was discarded: its trees may share changed files with it). Blocking.
pub fn forget(dir: &Path, prefix: &str) -> Doomed {
    let _names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut doomed = Doomed::default();
    for (name, _, _) in entries(dir) {
        if name.starts_with(prefix) {
            doom(dir, &name, &mut doomed);
        }
    }
    doomed
}

/// Moves `scratch`'s `trees` into `partial` with their byte count; false (and nothing left in
/// `partial`'s place) when a step fails.
fn set_aside(partial: &Path, scratch: &Path, trees: &[&str], bytes: u64) -> bool {
    if std::fs::create_dir_all(partial).is_err() {
        return false;
    }
    let moved = trees
        .iter()
        .all(|tree| std::fs::rename(scratch.join(tree), partial.join(tree)).is_ok())
        && std::fs::write(partial.join(BYTES_FILE), bytes.to_string()).is_ok();
    if !moved {
        let _ = std::fs::remove_dir_all(partial);
    }
    moved
}

/// Renames `dir/name` to a name no build takes, for deleting later.
fn doom(dir: &Path, name: &str, doomed: &mut Doomed) {
    let to = dir.join(format!(
        "{PARTIAL_KEPT}doomed-{}",
        uuid::Uuid::new_v4().simple()
    ));
    if std::fs::rename(dir.join(name), &to).is_ok() {
        doomed.0.push(to);
    }
}

/// The kept entries of `dir` (not those set aside): name, when kept, bytes.
fn entries(dir: &Path) -> Vec<(String, std::time::SystemTime, u64)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            if name.starts_with(PARTIAL_KEPT) {
                return None;
            }
            let metadata = entry.path().symlink_metadata().ok()?;
            let modified = metadata.modified().ok()?;
            // An entry without a readable count (an older builder's) counts as over any budget
            // share: it is the first to go when room is needed.
            let bytes = std::fs::read_to_string(entry.path().join(BYTES_FILE))
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(u64::MAX / 4);
            Some((name, modified, bytes))
        })
        .collect()
}

/// The bytes `path`'s files take on disk (blocks allocated), links not followed.
fn disk_bytes(path: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read.flatten() {
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(std::os::unix::fs::MetadataExt::blocks(&metadata) * 512);
            if metadata.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(scratch: &Path, bytes: usize) {
        std::fs::create_dir_all(scratch.join(".venv/lib")).expect("mkdir");
        std::fs::write(scratch.join(".venv/lib/data"), vec![7u8; bytes]).expect("write");
    }

    #[test]
    fn a_taken_tree_is_the_builds_alone_and_the_budget_evicts_the_least_recent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).expect("mkdir");
        let scratch = |name: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).expect("mkdir");
            path
        };
        let budget = 300 * 1024;

        // Two environments keep a tree each; both fit.
        let a = scratch("a1");
        tree(&a, 100 * 1024);
        keep(&kept, "s-envA-", "s-envA-1", &a, budget).delete();
        let b = scratch("b1");
        tree(&b, 100 * 1024);
        keep(&kept, "s-envB-", "s-envB-1", &b, budget).delete();
        assert!(kept.join("s-envA-1/.venv/lib/data").exists());
        assert!(kept.join("s-envB-1/.venv/lib/data").exists());
        assert!(!a.join(".venv").exists());

        // A's newer tree replaces its older one.
        let a2 = scratch("a2");
        tree(&a2, 100 * 1024);
        let doomed = keep(&kept, "s-envA-", "s-envA-2", &a2, budget);
        assert_eq!(doomed.len(), 1);
        assert!(!kept.join("s-envA-1").exists());
        doomed.delete();

        // A third environment's large tree evicts the least recently kept (B's), not A's.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c = scratch("c1");
        tree(&c, 150 * 1024);
        keep(&kept, "s-envC-", "s-envC-1", &c, budget).delete();
        assert!(!kept.join("s-envB-1").exists());
        assert!(kept.join("s-envA-2").exists() && kept.join("s-envC-1").exists());

        // Taking moves the trees into the build's scratch directory; the entry is gone, so
        // nothing else can take or evict them.
        let build = scratch("build");
        assert!(take(&kept, "s-envA-2", &build));
        assert!(build.join(".venv/lib/data").exists());
        assert!(!kept.join("s-envA-2").exists());
        assert!(!take(&kept, "s-envA-2", &scratch("again")));
        let forgotten = forget(&kept, "s-");
        assert_eq!(forgotten.len(), 1);
        forgotten.delete();

        // A tree over the whole budget is not kept, and stays in its scratch directory.
        let huge = scratch("huge");
        tree(&huge, 400 * 1024);
        keep(&kept, "s-envD-", "s-envD-1", &huge, budget).delete();
        assert!(!kept.join("s-envD-1").exists());
        assert!(huge.join(".venv/lib/data").exists());
        assert!(std::fs::read_dir(&kept).expect("read").next().is_none());
    }

    #[test]
    fn a_kept_entry_holding_a_link_is_not_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = dir.path().join("kept");
        std::fs::create_dir_all(kept.join("e-1/.venv")).expect("mkdir");
        std::os::unix::fs::symlink("/", kept.join("e-1/node_modules")).expect("symlink");
        let build = dir.path().join("build");
        std::fs::create_dir(&build).expect("mkdir");
        assert!(!take(&kept, "e-1", &build));
        assert!(!build.join(".venv").exists() && !build.join("node_modules").exists());
        assert!(kept.join("e-1/.venv").exists());
    }
}
