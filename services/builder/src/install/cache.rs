//! The download cache (see the module documentation's heading of that name): lent to the
//! scratch directory for a build and put back, and the hard links that tie it to `.venv`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{BUILD_CACHE, chown_tree, remove_any};
use crate::beneath;
use crate::output::CappedLog;

/// How much of npm's debug log a failed build's log keeps.
const NPM_DEBUG_LOG_BYTES: u64 = 16 * 1024;

/// Writes the end of npm's newest debug log (in the download cache of the scratch directory
/// `root`) to the build log. The cache is the build's: the way to the logs is resolved beneath
/// `root` following no link, only a regular file is read, and only its end
/// ([`crate::beneath`]); a link, a FIFO or anything else planted there is ignored.
pub(super) fn npm_debug_log(root: &Path, log: &mut CappedLog<'_>) {
    let Ok(root) = beneath::open_root(root) else {
        return;
    };
    let Ok(logs) = beneath::open_dir(&root, Path::new(BUILD_CACHE).join("npm/_logs")) else {
        return;
    };
    let Ok(entries) = beneath::entries(&logs) else {
        return;
    };
    let newest = entries
        .into_iter()
        .filter(|(_, stat)| beneath::kind(stat) == rustix::fs::FileType::RegularFile)
        .max_by_key(|(_, stat)| (stat.st_mtime, stat.st_mtime_nsec));
    let Some((name, _)) = newest else {
        return;
    };
    let Ok((mut file, _)) = beneath::open_regular(&logs, &name) else {
        return;
    };
    let Ok((tail, cut)) = beneath::read_tail(&mut file, NPM_DEBUG_LOG_BYTES) else {
        return;
    };
    log.write(
        format!(
            "==> npm's debug log ({}), {}:\n",
            name.to_string_lossy(),
            if cut { "its end" } else { "whole" }
        )
        .as_bytes(),
    );
    log.write(&tail);
    if !tail.ends_with(b"\n") {
        log.write(b"\n");
    }
}

/// The directories the installers keep in the download cache. A cache that holds anything
/// but a directory (a link, a file) at one of them was tampered with by a build and is
/// discarded on reuse.
const CACHE_DIRS: [&str; 4] = ["npm", "npm/_logs", "uv", "pip"];

/// Whether the cache at `inside` holds only directories where [`CACHE_DIRS`] are (or nothing).
fn cache_is_sound(inside: &Path) -> bool {
    let Ok(cache) = beneath::open_root(inside) else {
        return false;
    };
    CACHE_DIRS
        .iter()
        .all(|rel| match beneath::lstat(&cache, rel) {
            Ok(None) => true,
            Ok(Some(stat)) => beneath::kind(&stat) == rustix::fs::FileType::Directory,
            Err(_) => false,
        })
}

/// The build's download cache, at [`super::BUILD_CACHE`] in the scratch directory while the
/// build runs.
pub(super) struct BuildCache {
    /// Its path in the scratch directory.
    pub(super) inside: PathBuf,
    /// Where it persists between builds, if anywhere.
    home: Option<PathBuf>,
    /// It came from its home, filled by earlier builds.
    pub(super) reused: bool,
    /// It has left the scratch directory.
    gone: bool,
}

impl BuildCache {
    /// Moves the persistent cache at `home` into the scratch directory `root` (a rename: both
    /// are on one file system), or makes an empty one there when there is none to move (no
    /// `home`, the first build of a scope, or another build of the scope holds it now).
    pub(super) fn lend(
        root: &Path,
        home: Option<&Path>,
        uid: u32,
        gid: u32,
    ) -> std::io::Result<BuildCache> {
        let inside = root.join(BUILD_CACHE);
        let mut moved = false;
        if let Some(home) = home {
            if let Some(parent) = home.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::rename(home, &inside) {
                Ok(()) => moved = true,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) if error.kind() == std::io::ErrorKind::CrossesDevices => {
                    tracing::warn!(cache = %home.display(), "the download cache is on another file system than the build's scratch directory; builds start from an empty cache");
                }
                Err(error) => return Err(error),
            }
        }
        if moved && !std::fs::symlink_metadata(&inside)?.is_dir() {
            // Only builder code writes there, and only directories; anything else is no cache.
            std::fs::remove_file(&inside)?;
            moved = false;
        }
        if moved && !cache_is_sound(&inside) {
            // A build planted a link (or a file) where an installer keeps a directory: the
            // cache is not reused, and nothing in it is followed.
            tracing::warn!(cache = ?home, "the download cache held a link or a file where a directory belongs; it is discarded");
            remove_any(&inside)?;
            moved = false;
        }
        if moved {
            // A cache filled by a build of another builder (another uid) is handed over whole;
            // one of this builder's own uid only at the top (a cache can be large).
            let metadata = std::fs::symlink_metadata(&inside)?;
            if std::os::unix::fs::MetadataExt::uid(&metadata) != uid {
                chown_tree(&inside, uid, gid)?;
            }
        } else {
            std::fs::create_dir(&inside)?;
        }
        std::os::unix::fs::lchown(&inside, Some(uid), Some(gid))?;
        Ok(BuildCache {
            inside,
            home: home.map(Path::to_owned),
            reused: moved,
            gone: false,
        })
    }

    /// Takes the cache out of the scratch directory: back to its home, unless `discard`, there
    /// is none, or another build's cache got there first; otherwise it is deleted. Whatever the
    /// build left at the reserved name that is not a directory is deleted too.
    pub(super) fn give_back(&mut self, discard: bool) -> std::io::Result<()> {
        self.gone = true;
        let metadata = match std::fs::symlink_metadata(&self.inside) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if metadata.is_dir()
            && !discard
            && let Some(home) = &self.home
            && std::fs::rename(&self.inside, home).is_ok()
        {
            return Ok(());
        }
        remove_any(&self.inside)
    }
}

impl Drop for BuildCache {
    /// An install abandoned midway (its future dropped) still puts the cache back; the build
    /// publishes nothing. Only a rename here: deleting can take long, and the scratch directory
    /// is deleted anyway.
    fn drop(&mut self) {
        if !self.gone
            && let Some(home) = &self.home
            && std::fs::symlink_metadata(&self.inside).is_ok_and(|metadata| metadata.is_dir())
        {
            let _ = std::fs::rename(&self.inside, home);
        }
    }
}

/// Every regular file under `.venv` in the scratch directory `root` (walked beneath it, following
/// no link) with more than one link, by inode: when its inode last changed (ctime, seconds and
/// nanoseconds). Unreadable parts (and a `.venv` that is a link) are skipped.
pub(super) fn linked_files(root: &Path) -> HashMap<(u64, u64), (i64, i64)> {
    let mut linked = HashMap::new();
    let Ok(root) = beneath::open_root(root) else {
        return linked;
    };
    let _ = beneath::walk(&root, ".venv", &mut |walked| {
        let stat = walked.stat;
        if beneath::kind(stat) == rustix::fs::FileType::RegularFile && stat.st_nlink > 1 {
            linked.insert(
                (stat.st_dev, stat.st_ino),
                (
                    stat.st_ctime,
                    i64::try_from(stat.st_ctime_nsec).unwrap_or(0),
                ),
            );
        }
        true
    });
    linked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> (u32, u32) {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    }

    #[test]
    fn the_cache_is_lent_to_the_scratch_directory_and_put_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("caches/scope"));
        std::fs::create_dir(&root).expect("mkdir");
        let (uid, gid) = me();

        // The first build of a scope: an empty cache, kept afterwards.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        std::fs::write(root.join(BUILD_CACHE).join("entry"), "x").expect("write");
        cache.give_back(false).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
        assert_eq!(
            std::fs::read_to_string(home.join("entry")).expect("kept"),
            "x"
        );

        // The next takes it in with a rename.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        assert!(!home.exists());
        assert!(root.join(BUILD_CACHE).join("entry").exists());
        // A concurrent build of the scope meanwhile starts from an empty one…
        let other_root = dir.path().join("other");
        std::fs::create_dir(&other_root).expect("mkdir");
        let mut other = BuildCache::lend(&other_root, Some(&home), uid, gid).expect("lend");
        assert!(!other_root.join(BUILD_CACHE).join("entry").exists());
        std::fs::write(other_root.join(BUILD_CACHE).join("other"), "y").expect("write");
        // …and whichever finishes first puts its cache back; the other's is dropped.
        cache.give_back(false).expect("give back");
        other.give_back(false).expect("give back");
        assert!(home.join("entry").exists());
        assert!(!home.join("other").exists());
        assert!(!other_root.join(BUILD_CACHE).exists());

        // A discarded cache is deleted.
        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        cache.give_back(true).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
        assert!(!home.exists());
    }

    #[test]
    fn what_a_build_leaves_at_the_reserved_name_is_removed_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("cache"));
        let outside = dir.path().join("outside");
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "x").expect("write");
        let (uid, gid) = me();

        let mut cache = BuildCache::lend(&root, Some(&home), uid, gid).expect("lend");
        std::fs::remove_dir_all(root.join(BUILD_CACHE)).expect("rm");
        std::os::unix::fs::symlink(&outside, root.join(BUILD_CACHE)).expect("symlink");
        cache.give_back(false).expect("give back");
        assert!(std::fs::symlink_metadata(root.join(BUILD_CACHE)).is_err());
        assert!(std::fs::symlink_metadata(&home).is_err());
        assert!(outside.join("keep").exists());

        // Without a home, the cache lasts one build.
        let mut cache = BuildCache::lend(&root, None, uid, gid).expect("lend");
        assert!(root.join(BUILD_CACHE).is_dir());
        cache.give_back(false).expect("give back");
        assert!(!root.join(BUILD_CACHE).exists());
    }

    #[test]
    fn an_abandoned_install_still_puts_the_cache_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, home) = (dir.path().join("scratch"), dir.path().join("cache"));
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::create_dir(&home).expect("mkdir");
        std::fs::write(home.join("entry"), "x").expect("write");
        let (uid, gid) = me();
        drop(BuildCache::lend(&root, Some(&home), uid, gid).expect("lend"));
        assert!(home.join("entry").exists());
        assert!(!root.join(BUILD_CACHE).exists());
    }
}
