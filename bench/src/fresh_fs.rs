//! Where a benchmark keeps its files, and `--fresh-fs`: those files on a new ext4 file system
//! rather than on the disk as earlier runs left it. Every run creates and deletes tens of thousands of files, and on a
//! disk whose ext4 has no journal (as on the machine the figures come from) file creation
//! skips inodes freed in the last few seconds to minutes, so each run slows the next.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// A fresh ext4 file system mounted from a sparse image; unmounted and deleted when dropped.
pub struct FreshFs {
    image: PathBuf,
    mount: tempfile::TempDir,
    journal: bool,
}

impl FreshFs {
    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// What it is, for the report.
    pub fn describe(&self) -> &'static str {
        if self.journal {
            "a fresh ext4 file system with a journal (loop device)"
        } else {
            "a fresh ext4 file system without a journal (loop device)"
        }
    }

    /// Makes and mounts one under `parent`; with a journal (mkfs's default) or without (as the
    /// disk the figures in bench/README.md come from).
    pub fn make(parent: &Path, journal: bool) -> anyhow::Result<FreshFs> {
        let image = parent.join(format!("plinth-bench-{}.ext4", std::process::id()));
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(8 << 30))
            .with_context(|| format!("cannot create {}", image.display()))?;
        let mut mkfs = Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F", "-E", "nodiscard"]);
        if !journal {
            mkfs.args(["-O", "^has_journal"]);
        }
        let made = mkfs.arg(&image).status();
        if !made.is_ok_and(|status| status.success()) {
            let _ = std::fs::remove_file(&image);
            anyhow::bail!("mkfs.ext4 failed on {}", image.display());
        }
        let mount = tempfile::tempdir_in(parent)?;
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(mount.path())
            .status();
        if !mounted.is_ok_and(|status| status.success()) {
            let _ = std::fs::remove_file(&image);
            anyhow::bail!(
                "cannot mount {} (needs root and a loop device)",
                image.display()
            );
        }
        Ok(FreshFs {
            image,
            mount,
            journal,
        })
    }
}

impl Drop for FreshFs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(self.mount.path())
            .status()
            .is_ok_and(|status| status.success());
        if unmounted {
            let _ = std::fs::remove_file(&self.image);
        } else {
            eprintln!(
                "could not unmount {}; remove {} after unmounting it",
                self.mount.path().display(),
                self.image.display()
            );
        }
    }
}

/// Where a benchmark keeps its files: a temporary directory under `PLINTH_BENCH_DIR` (the
/// system's temporary directory when unset), on a fresh file system when asked. Dropped, the
/// directory goes first, then the file system.
pub struct WorkDir {
    dir: tempfile::TempDir,
    fresh: Option<FreshFs>,
    parent: PathBuf,
}

impl WorkDir {
    /// Makes one; `fresh` (and `journal`) as `--fresh-fs` (and `--journal`) say.
    pub fn make(fresh: bool, journal: bool) -> anyhow::Result<WorkDir> {
        let parent = std::env::var_os("PLINTH_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let fresh = if fresh {
            Some(FreshFs::make(&parent, journal)?)
        } else {
            None
        };
        let dir = match &fresh {
            Some(fresh) => tempfile::tempdir_in(fresh.path())?,
            None => tempfile::tempdir_in(&parent)?,
        };
        Ok(WorkDir { dir, fresh, parent })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What disk it is on, for the report.
    pub fn describe(&self) -> String {
        let disk = self
            .fresh
            .as_ref()
            .map_or("the disk as it is", FreshFs::describe);
        format!("{disk} under {}", self.parent.display())
    }
}
