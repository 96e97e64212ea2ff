//! Where a git fetch writes: a directory of its own under `<spool_dir>/git/`, holding the bare
//! repository, removed when the import ends.
//!
//! A service killed in the middle of an import leaves its directory behind, and possibly the
//! fetch's `git` processes too (they run in a process group of their own, so that a fetch can
//! be stopped whole, and a `SIGKILL` to the service does not reach them). The next start
//! removes both ([`remove_leftovers`]). Each directory is locked (`flock`) by the import using
//! it, and the lock dies with the process that held it, so a start never takes the directory
//! of a service still running beside it on the same spool directory.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use rustix::process::{Pid, Signal};

/// The folder of `spool_dir` that holds fetches' directories.
const FOLDER: &str = "git";

/// One fetch's directory, locked while it lives and removed on drop.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    _lock: File,
}

impl Scratch {
    /// A new directory under `<spool_dir>/git/`.
    pub fn new(spool_dir: &Path) -> io::Result<Scratch> {
        let root = spool_dir.join(FOLDER);
        std::fs::create_dir_all(&root)?;
        let dir = tempfile::Builder::new()
            .prefix("fetch-")
            .tempdir_in(&root)?;
        let lock = File::open(dir.path())?;
        rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive)?;
        Ok(Scratch { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes of the regular files beneath it, as written so far.
    pub fn bytes(&self) -> u64 {
        bytes_beneath(self.dir.path())
    }
}

fn bytes_beneath(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                total = total.saturating_add(entry.metadata().map_or(0, |meta| meta.len()));
            }
        }
    }
    total
}

/// Removes the fetch directories under `<spool_dir>/git/` that no running import holds,
/// first stopping any process still working in one (a fetch that outlived its service).
/// Returns how many were removed.
pub fn remove_leftovers(spool_dir: &Path) -> io::Result<usize> {
    let root = spool_dir.join(FOLDER);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let mut removed = 0;
    for entry in entries {
        let path = entry?.path();
        if !path.is_dir() || path.is_symlink() {
            std::fs::remove_file(&path)?;
            continue;
        }
        let lock = File::open(&path)?;
        match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            // Another service on the same spool directory is fetching into it.
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(errno) => return Err(errno.into()),
        }
        stop_processes_within(&path.canonicalize()?);
        std::fs::remove_dir_all(&path)?;
        removed += 1;
    }
    Ok(removed)
}

/// Kills every process whose working directory is `dir` or beneath it: a fetch's `git`
/// processes all run there.
fn stop_processes_within(dir: &Path) {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return;
    };
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        let cwd: Option<PathBuf> = std::fs::read_link(process.path().join("cwd")).ok();
        if cwd.is_some_and(|cwd| cwd.starts_with(dir)) {
            tracing::warn!(pid = pid.as_raw_nonzero().get(), dir = %dir.display(), "stopping a git fetch left by an earlier run");
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_directory_counts_its_bytes_and_goes_when_dropped() {
        let spool = tempfile::tempdir().expect("spool");
        let scratch = Scratch::new(spool.path()).expect("scratch");
        let path = scratch.path().to_path_buf();
        assert!(path.starts_with(spool.path().join(FOLDER)));
        std::fs::create_dir_all(path.join("objects/pack")).expect("mkdir");
        std::fs::write(path.join("objects/pack/tmp_pack_x"), vec![0u8; 3000]).expect("write");
        std::fs::write(path.join("HEAD"), b"ref: refs/heads/main\n").expect("write");
        assert_eq!(scratch.bytes(), 3000 + 21);
        drop(scratch);
        assert!(!path.exists());
    }

    #[test]
    fn leftovers_go_but_a_directory_in_use_stays() {
        let spool = tempfile::tempdir().expect("spool");
        let live = Scratch::new(spool.path()).expect("scratch");
        let left = spool.path().join(FOLDER).join("fetch-left");
        std::fs::create_dir_all(left.join("objects/pack")).expect("mkdir");
        std::fs::write(left.join("objects/pack/tmp_pack_y"), b"half a pack").expect("write");
        let beside = spool.path().join("not-a-fetch");
        std::fs::write(&beside, b"kept").expect("write");
        assert_eq!(remove_leftovers(spool.path()).expect("cleanup"), 1);
        assert!(!left.exists());
        assert!(live.path().is_dir());
        assert_eq!(std::fs::read(&beside).expect("read"), b"kept");
        assert_eq!(
            remove_leftovers(tempfile::tempdir().expect("empty").path()).expect("no folder"),
            0
        );
    }
}
