//! A scope's build disk: with `builder.limits.disk_mb`, everything the builds of one scope
//! write on a builder, and everything the builder keeps for that scope between its builds
//! (its download cache, kept `.venv` and `node_modules`, builds' scratch, HOME and `/tmp`),
//! lives on one ext4 image of that size under `<work_dir>/scopes/<scope key>/`
//! ([`plinth_sandbox::disk`], the sessions' mechanism). So the limit bounds what a scope takes
//! of the builder's disk, caches included, and scopes cannot take each other's space.
//!
//! The image is mounted while builds of the scope run in this process and shared by them (one
//! loop device per image, ever); the caches give way to builds when the disk runs low; what a
//! killed builder left is tidied by [`remove_leftovers`] or at the next mount.
//!
//! The layout, why one image per scope, and the mount, full-disk and crash rules:
//! `docs/design/builds.md#a-scopes-build-disk`.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use plinth_sandbox::disk::{DiskError, DiskLimits, LimitedDir};

/// Why a scope's disk could not be had for a build ([`ScopeDisks::acquire`]).
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The scope's directory, or the disk's own directories, could not be made, looked at or
    /// tidied.
    #[error("{0}")]
    Io(std::io::Error),
    /// The disk's image could not be made, removed or mounted.
    #[error("{0}")]
    Disk(DiskError),
}

/// The scopes' disks, in the work directory.
pub const SCOPES: &str = "scopes";
/// A scope's image and where it is mounted, in its directory (the names
/// [`plinth_sandbox::disk`] gives them).
const IMAGE: &str = "work.ext4";
const MOUNT: &str = "work";
/// On a scope's disk: its download cache, its kept dependency trees, its builds' directories.
const CACHE: &str = "cache";
const KEPT: &str = "kept";
const BUILDS: &str = "builds";
/// What is set aside in `kept` before its rename into place (see the worker).
pub(crate) const PARTIAL_KEPT: &str = ".partial-";
/// Below one part in this many of the disk free with no build running, the caches go.
const FREE_FLOOR: u64 = 4;
const MIB: u64 = 1 << 20;

/// A scope's disk as this process uses it: how many builds hold it, and its mount.
#[derive(Default)]
struct Scope {
    state: Mutex<ScopeState>,
}

#[derive(Default)]
struct ScopeState {
    users: usize,
    mounted: Option<LimitedDir>,
    /// A build ran out of the disk: the caches go when the last build ends.
    full: bool,
}

/// Every scope disk this process has used, by its directory: the builders of one work
/// directory in this process share them (one process per work directory, by its lock).
static SCOPES_IN_USE: Mutex<BTreeMap<PathBuf, Arc<Scope>>> = Mutex::new(BTreeMap::new());

/// The scopes' disks of one work directory, `size_mb` MiB each.
#[derive(Debug, Clone)]
pub struct ScopeDisks {
    limits: DiskLimits,
    dir: PathBuf,
    size_mb: u64,
}

impl ScopeDisks {
    /// The disks under `<work_dir>/scopes`, made with `limits` (checked on that directory).
    pub fn new(limits: DiskLimits, work_dir: &Path, size_mb: u64) -> ScopeDisks {
        ScopeDisks {
            limits,
            dir: work_dir.join(SCOPES),
            size_mb,
        }
    }

    /// Where the disks of a work directory are; [`DiskLimits::check`] is run there.
    pub fn dir_of(work_dir: &Path) -> PathBuf {
        work_dir.join(SCOPES)
    }

    /// Holds the disk of the scope named `key` for a build: mounts it (making it first if
    /// need be) unless another build holds it. Blocking. The error says what failed.
    pub fn acquire(&self, key: &str) -> Result<ScopeDisk, AcquireError> {
        let dir = self.dir.join(key);
        let scope = SCOPES_IN_USE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(dir.clone())
            .or_default()
            .clone();
        let mut state = scope.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.mounted.is_none() {
            state.mounted = Some(self.mount(&dir)?);
            state.full = false;
        }
        state.users += 1;
        drop(state);
        Ok(ScopeDisk {
            scope: Some(scope),
            root: dir.join(MOUNT),
        })
    }

    /// Mounts the scope's disk at `<dir>/work`, tidied and with room, making it anew when the
    /// one there is not usable.
    fn mount(&self, dir: &Path) -> Result<LimitedDir, AcquireError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(AcquireError::Io)?;
        let image = dir.join(IMAGE);
        let size = self.size_mb.saturating_mul(MIB);
        let opened = match std::fs::symlink_metadata(&image) {
            Ok(meta) if meta.len() != size => {
                tracing::info!(image = %image.display(), size_mb = self.size_mb, "the limit (builder.limits.disk_mb) changed: the scope's build disk is made anew, without its caches");
                None
            }
            Ok(_) => match self.limits.open(dir) {
                Ok(opened) if writable(opened.path()) => Some(opened),
                Ok(_) => {
                    tracing::warn!(image = %image.display(), "the scope's build disk went read-only after an error: it is made anew, without its caches");
                    None
                }
                Err(error) => {
                    tracing::warn!(image = %image.display(), %error, "the scope's build disk does not mount: it is made anew, without its caches");
                    None
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(AcquireError::Io(error)),
        };
        let mounted = match opened {
            Some(opened) => opened,
            None => {
                self.limits.remove(dir).map_err(AcquireError::Disk)?;
                self.limits
                    .create(dir, self.size_mb, 0, 0)
                    .map_err(AcquireError::Disk)?
            }
        };
        let root = mounted.path().to_owned();
        let tidied = (|| {
            tidy(&root)?;
            for name in [BUILDS, KEPT] {
                match std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(root.join(name))
                {
                    Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(error);
                    }
                    _ => {}
                }
            }
            Ok(())
        })();
        if let Err(error) = tidied {
            if let Err(error) = mounted.unmount() {
                tracing::warn!(%error, "could not unmount a scope's build disk");
            }
            return Err(AcquireError::Io(error));
        }
        if short_of_room(&root) {
            discard_caches(&root, "less than a quarter of it was free");
        }
        Ok(mounted)
    }
}

/// One build's hold on its scope's disk; the disk is unmounted when the last hold of the
/// process is [released](ScopeDisk::release) (or dropped).
pub struct ScopeDisk {
    scope: Option<Arc<Scope>>,
    root: PathBuf,
}

impl std::fmt::Debug for ScopeDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeDisk")
            .field("root", &self.root)
            .finish()
    }
}

impl ScopeDisk {
    /// Where the disk is mounted.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of the build named `name` (its scratch directory).
    pub fn build_dir(&self, name: &str) -> PathBuf {
        self.root.join(BUILDS).join(name)
    }

    /// Where the scope's download cache persists between builds.
    pub fn cache(&self) -> PathBuf {
        self.root.join(CACHE)
    }

    /// Where the scope's dependency trees are kept between builds.
    pub fn kept(&self) -> PathBuf {
        self.root.join(KEPT)
    }

    /// A build ran out of the disk: the scope's caches go when its last build ends, so the
    /// next one has the whole limit.
    pub fn mark_full(&self) {
        if let Some(scope) = &self.scope {
            scope
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .full = true;
        }
    }

    /// Lets go of the disk: the last hold discards the caches if the disk is short of room
    /// (see the module documentation) and unmounts it. Blocking.
    pub fn release(mut self) {
        self.let_go();
    }

    fn let_go(&mut self) {
        let Some(scope) = self.scope.take() else {
            return;
        };
        let mut state = scope.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.users = state.users.saturating_sub(1);
        if state.users > 0 {
            return;
        }
        let Some(mounted) = state.mounted.take() else {
            return;
        };
        if std::mem::take(&mut state.full) {
            discard_caches(&self.root, "a build ran out of it");
        } else if short_of_room(&self.root) {
            discard_caches(&self.root, "less than a quarter of it was free");
        }
        if let Err(error) = mounted.unmount() {
            tracing::warn!(%error, disk = %self.root.display(), "could not unmount a scope's build disk; the builder unmounts it at its next start");
        }
    }
}

impl Drop for ScopeDisk {
    /// A build abandoned midway (its future dropped) still lets go of the disk, off the
    /// runtime when there is one.
    fn drop(&mut self) {
        if self.scope.is_none() {
            return;
        }
        let mut rest = ScopeDisk {
            scope: self.scope.take(),
            root: self.root.clone(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || rest.let_go());
            }
            Err(_) => rest.let_go(),
        }
    }
}

/// Whether the file system at `root` takes writes (ext4 turns read-only on an error).
fn writable(root: &Path) -> bool {
    rustix::fs::statvfs(root)
        .is_ok_and(|fs| !fs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// Whether less than a quarter of the disk's blocks or inodes is free.
fn short_of_room(root: &Path) -> bool {
    rustix::fs::statvfs(root).is_ok_and(|fs| {
        fs.f_bavail < fs.f_blocks / FREE_FLOOR || fs.f_favail < fs.f_files / FREE_FLOOR
    })
}

/// Removes the scope's download cache and kept dependency trees (no build of the scope runs).
fn discard_caches(root: &Path, why: &str) {
    let mut failed = None;
    for path in [root.join(CACHE), root.join(KEPT)] {
        match std::fs::remove_dir_all(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => failed = Some(error),
            _ => {}
        }
    }
    if let Err(error) = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(root.join(KEPT))
        && error.kind() != std::io::ErrorKind::AlreadyExists
    {
        failed = Some(error);
    }
    match failed {
        None => {
            tracing::info!(disk = %root.display(), why, "discarded a scope's download cache and kept dependencies to make room on its build disk (builder.limits.disk_mb)")
        }
        Some(error) => {
            tracing::warn!(disk = %root.display(), %error, "could not discard a scope's caches from its build disk")
        }
    }
}

/// Removes what builds that are no longer running left on a scope's disk mounted at `root`:
/// their directories, and dependency trees half set aside. Nothing there is followed.
fn tidy(root: &Path) -> std::io::Result<usize> {
    Ok(remove_entries(&root.join(BUILDS), false)? + remove_entries(&root.join(KEPT), true)?)
}

/// Removes the entries of `parent` (only those set aside half-made, named [`PARTIAL_KEPT`]…,
/// when `only_partial`), directories whole; links are removed, never followed. A missing
/// `parent` or entry is nothing to remove. Answers how many were removed.
pub(crate) fn remove_entries(parent: &Path, only_partial: bool) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        if only_partial
            && !entry
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_KEPT)
        {
            continue;
        }
        let path = entry.path();
        let result = if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed += 1,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(removed)
}

/// What a killed builder of `work_dir` left of the scopes' disks, removed before any builder
/// of the work directory starts: each disk still mounted has its builds' directories removed
/// and is unmounted (its loop device goes with the mount), and a half-made disk check is
/// removed whole. The images and their caches stay. Answers how many builds' directories and
/// checks were removed.
pub fn remove_leftovers(work_dir: &Path) -> std::io::Result<usize> {
    let scopes = work_dir.join(SCOPES);
    let entries = match std::fs::read_dir(&scopes) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let dir = entry.path();
        let mount = dir.join(MOUNT);
        let check = entry
            .file_name()
            .to_string_lossy()
            .starts_with(".disk-check-");
        if is_mount_point(&dir, &mount)? && !check {
            removed += tidy(&mount)?;
        }
        unmount_all(&mount)?;
        if check {
            std::fs::remove_dir_all(&dir)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Whether `mount` is a mount point: its device differs from its parent's, `dir`.
fn is_mount_point(dir: &Path, mount: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt as _;
    let mount = match std::fs::symlink_metadata(mount) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    Ok(mount.dev() != std::fs::symlink_metadata(dir)?.dev())
}

/// Unmounts every mount stacked on `path` (none: nothing to do); a busy one lazily.
pub(crate) fn unmount_all(path: &Path) -> std::io::Result<()> {
    use rustix::mount::UnmountFlags;
    for _ in 0..8 {
        match rustix::mount::unmount(path, UnmountFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::BUSY) => {
                rustix::mount::unmount(path, UnmountFlags::DETACH)?;
            }
            // Not (or no longer) a mount point.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    }
    Err(std::io::Error::other(format!(
        "{} is still a mount point after 8 unmounts",
        path.display()
    )))
}
