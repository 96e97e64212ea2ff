//! Disk limits: a session's working directory that cannot grow past `disk_mb`. Writes past
//! it fail inside the session with `ENOSPC`, and the directory survives node restarts.
//!
//! Each limited directory is an ext4 image (`<session_dir>/work.ext4`, sparse, root's) on a
//! loop device, mounted at `<session_dir>/work`. This module makes, reopens and removes them and
//! cleans up what a killed node left ([`DiskLimits::check`], [`DiskLimits::prepare`],
//! [`DiskLimits::create`], [`DiskLimits::open`], [`DiskLimits::remove_leftovers`],
//! [`LimitedDir::remove`]); which sessions get a limit, their records and how many spares to
//! keep belong to the node. It holds that an image is attached to at most one device (two would
//! be two ext4 drivers writing the same blocks), that no device outlives its mount, and that
//! sessions never see the image or its device.
//!
//! Why an image and not project quotas, the system calls, and the lifecycle through restarts and
//! crashes: `docs/design/SANDBOX.md#session-disks`; timings: `docs/design/measured.md#session-disks`.

mod loop_device;
#[cfg(test)]
mod tests;

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::mount::{MountFlags, UnmountFlags};

/// The smallest limit: ext4's journal alone takes 4 MiB.
pub const MIN_SIZE_MB: u64 = 16;
/// The largest limit, 16 TiB (ext4 with 4 KiB blocks goes further; no session needs it).
pub const MAX_SIZE_MB: u64 = 16 << 20;

/// The working directory in a session's directory, the mount point.
const WORK: &str = "work";
/// The session's image, beside [`WORK`].
const IMAGE: &str = "work.ext4";
/// An image formatted ahead of need ([`DiskLimits::prepare`]); [`DiskLimits::create`] renames
/// it to [`IMAGE`].
const SPARE: &str = "work.ext4.spare";
/// An image being formatted; never used, removed when found.
const DRAFT: &str = "work.ext4.draft";
const MIB: u64 = 1 << 20;

/// How working directories are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mechanism {
    /// An ext4 image per session (`<session_dir>/work.ext4`, as large as the limit, sparse)
    /// mounted through a loop device at `<session_dir>/work`.
    LoopImage,
}

/// Why a working directory could not be limited, made, reopened or removed. Each message says
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// No loop devices.
    #[error(
        "disk limits need loop devices and {path} cannot be used ({source}): run the node as \
         root with the host's /dev/loop-control (in Kubernetes a privileged pod; `modprobe \
         loop` on the host if the file is missing), or configure no disk_mb"
    )]
    NoLoopDevices {
        /// `/dev/loop-control`.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// No `mkfs.ext4`.
    #[error(
        "disk limits format ext4 images with mkfs.ext4, which is not on PATH, in /usr/sbin or \
         in /sbin: install e2fsprogs in the node's image, or configure no disk_mb"
    )]
    NoMkfs,
    /// `mkfs.ext4` failed.
    #[error(
        "mkfs.ext4 could not format {image} ({status}): {stderr}; check that the state \
         directory's file system has room"
    )]
    Format {
        /// The image.
        image: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// The kernel would not attach the image.
    #[error(
        "cannot attach {image} to a loop device ({source}): disk limits need Linux 5.8 or newer \
         (LOOP_CONFIGURE) and the node running as root"
    )]
    Attach {
        /// The image.
        image: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The kernel would not mount the image.
    #[error(
        "cannot mount {image} at {work} ({source}): the node must run as root in the host's user \
         namespace (in Kubernetes a privileged pod), on a kernel with ext4 that knows the \
         features the node's mkfs.ext4 turns on (`dmesg` names a missing one)"
    )]
    Mount {
        /// The image.
        image: PathBuf,
        /// The mount point.
        work: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A limit out of range.
    #[error("disk_mb = {size_mb} is out of range: use {MIN_SIZE_MB} to {MAX_SIZE_MB} (MiB)")]
    InvalidSize {
        /// The limit asked for.
        size_mb: u64,
    },
    /// `create` on a directory that has its image.
    #[error("{session_dir} has a disk image already: open it instead of creating it")]
    AlreadyCreated {
        /// The session's directory.
        session_dir: PathBuf,
    },
    /// `open` on a directory without an image.
    #[error(
        "{session_dir} has no disk image (made without a disk limit, or its image was deleted): \
         end the session, or configure no disk_mb to serve it unlimited"
    )]
    NoImage {
        /// The session's directory.
        session_dir: PathBuf,
    },
    /// Something other than the session's image is mounted on its working directory.
    #[error("{work} has something other than its image mounted on it: unmount it")]
    ForeignMount {
        /// The mount point.
        work: PathBuf,
    },
    /// Local disk.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// To what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DiskError {
    let path = path.to_owned();
    move |source| DiskError::Io { what, path, source }
}

/// Limited working directories on this node. [`DiskLimits::check`] answers this rather than just
/// a [`Mechanism`], so nothing can make a limited directory on a node whose check failed.
#[derive(Debug, Clone)]
pub struct DiskLimits {
    mkfs: PathBuf,
}

/// What [`DiskLimits::remove_leftovers`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftovers {
    /// Working directories unmounted.
    pub unmounted: usize,
    /// Images (and spares, drafts) deleted.
    pub images: usize,
    /// Loop devices detached that no unmount here released (held elsewhere, or attached by
    /// hand without autoclear).
    pub detached: usize,
}

impl DiskLimits {
    /// Checks, at node start, that working directories under `dir` (the sessions' directory,
    /// made if missing) can be limited, by making, writing, reopening and removing a small
    /// one; the error says what to do.
    pub fn check(dir: &Path) -> Result<DiskLimits, DiskError> {
        fs::create_dir_all(dir).map_err(io_error("creating", dir))?;
        let mkfs = find_mkfs().ok_or(DiskError::NoMkfs)?;
        drop(loop_device::open_control()?);
        let limits = DiskLimits { mkfs };
        let probe = dir.join(format!(".disk-check-{}", std::process::id()));
        // Left by a node killed in its check, with the same pid.
        if probe.exists() {
            remove_at(&probe)?;
            fs::remove_dir_all(&probe).map_err(io_error("removing", &probe))?;
        }
        let probed = limits.probe(&probe);
        let removed = remove_at(&probe)
            .and_then(|()| fs::remove_dir_all(&probe).map_err(io_error("removing", &probe)));
        probed?;
        removed?;
        Ok(limits)
    }

    fn probe(&self, probe: &Path) -> Result<(), DiskError> {
        make_dir(probe, 0o700)?;
        make_dir(&probe.join(WORK), 0o700)?;
        self.prepare(probe, MIN_SIZE_MB)?;
        let euid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        let work = self.create(probe, MIN_SIZE_MB, euid, egid)?;
        let written = work.path().join("check");
        fs::write(&written, b"plinth").map_err(io_error("writing", &written))?;
        drop(work);
        let work = self.open(probe)?;
        let read = fs::read(&written).map_err(io_error("reading", &written))?;
        if read != b"plinth" {
            return Err(io_error("reading back", &written)(io::Error::new(
                io::ErrorKind::InvalidData,
                "a file read back differs from what was written",
            )));
        }
        if let Some(index) = fs::metadata(work.path())
            .ok()
            .and_then(|meta| loop_device::index_of(meta.dev()))
        {
            let dio = fs::read_to_string(format!("/sys/block/loop{index}/loop/dio"));
            tracing::info!(
                direct_io = dio.is_ok_and(|dio| dio.trim() == "1"),
                "disk limits: ext4 images on loop devices"
            );
        }
        work.remove()
    }

    /// How directories are limited.
    pub fn mechanism(&self) -> Mechanism {
        Mechanism::LoopImage
    }

    /// The part of making a limited directory that can be done ahead of need: formats an
    /// image of `size_mb` MiB in `session_dir` (a spare session directory), for
    /// [`DiskLimits::create`] to use.
    pub fn prepare(&self, session_dir: &Path, size_mb: u64) -> Result<(), DiskError> {
        self.format(session_dir, size_mb, &session_dir.join(SPARE))
    }

    /// Makes `<session_dir>/work` a limited directory of `size_mb` MiB, owned by `uid`:`gid`,
    /// mode 0700 and empty. Uses the image [`DiskLimits::prepare`] made when there is one of
    /// that size, else formats one first. The working directory is made if missing. On error
    /// nothing of it is left.
    pub fn create(
        &self,
        session_dir: &Path,
        size_mb: u64,
        uid: u32,
        gid: u32,
    ) -> Result<LimitedDir, DiskError> {
        let image = session_dir.join(IMAGE);
        if fs::symlink_metadata(&image).is_ok() {
            return Err(DiskError::AlreadyCreated {
                session_dir: session_dir.to_owned(),
            });
        }
        let made = (|| {
            let spare = session_dir.join(SPARE);
            match fs::metadata(&spare) {
                Ok(meta) if Some(meta.len()) == size_mb.checked_mul(MIB) => {
                    fs::rename(&spare, &image).map_err(io_error("using the spare image", &spare))?
                }
                Ok(_) => {
                    fs::remove_file(&spare).map_err(io_error("removing", &spare))?;
                    self.format(session_dir, size_mb, &image)?;
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    self.format(session_dir, size_mb, &image)?;
                }
                Err(error) => return Err(io_error("reading", &spare)(error)),
            }
            let work = session_dir.join(WORK);
            match fs::DirBuilder::new().mode(0o700).create(&work) {
                Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io_error("creating", &work)(error));
                }
                _ => {}
            }
            // The device's descriptor is held until the mount holds the device too.
            let attached = loop_device::attach(&image)?;
            mount(&image, &work, attached.index)?;
            drop(attached);
            // The root of a fresh ext4 is root's, 0755, with a lost+found the session has no
            // use for (e2fsck makes it again if it ever needs it).
            std::os::unix::fs::chown(&work, Some(uid), Some(gid))
                .map_err(io_error("giving to the session's uid", &work))?;
            fs::set_permissions(&work, fs::Permissions::from_mode(0o700))
                .map_err(io_error("securing", &work))?;
            let lost = work.join("lost+found");
            match fs::remove_dir(&lost) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error("removing", &lost)(error));
                }
                _ => {}
            }
            Ok(LimitedDir {
                session_dir: session_dir.to_owned(),
                work,
            })
        })();
        if made.is_err()
            && let Err(error) = remove_at(session_dir)
        {
            tracing::warn!(
                %error,
                session_dir = %session_dir.display(),
                "cannot remove a half-made limited directory"
            );
        }
        made
    }

    /// Re-establishes `<session_dir>/work` after a node restart: keeps the mount when it is
    /// still there, else mounts the image again (through the loop device it is still attached
    /// to, if any).
    pub fn open(&self, session_dir: &Path) -> Result<LimitedDir, DiskError> {
        let image = session_dir.join(IMAGE);
        let image_meta = match fs::metadata(&image) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(DiskError::NoImage {
                    session_dir: session_dir.to_owned(),
                });
            }
            Err(error) => return Err(io_error("reading", &image)(error)),
        };
        let work = session_dir.join(WORK);
        let opened = LimitedDir {
            session_dir: session_dir.to_owned(),
            work: work.clone(),
        };
        if let Some(dev) = mounted_device(session_dir, &work)? {
            let ours = loop_device::index_of(dev)
                .map(loop_device::open_device)
                .transpose()
                .map_err(io_error("reading the device mounted on", &work))?
                .map(|device| loop_device::backs(&device, &image_meta))
                .transpose()
                .map_err(io_error("reading the device mounted on", &work))?;
            return match ours {
                Some(true) => Ok(opened),
                _ => Err(DiskError::ForeignMount { work }),
            };
        }
        match fs::DirBuilder::new().mode(0o700).create(&work) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io_error("creating", &work)(error));
            }
            _ => {}
        }
        // Each device's descriptor is held until the mount holds the device too.
        let attached = match loop_device::find(&image, &image_meta)
            .map_err(io_error("looking for the loop device of", &image))?
        {
            Some(attached) => attached,
            None => loop_device::attach(&image)?,
        };
        mount(&image, &work, attached.index)?;
        drop(attached);
        Ok(opened)
    }

    /// Unmounts `<session_dir>/work` if it is mounted and deletes it and the images, whether
    /// or not this process opened it: an image that will not mount again is given up this way.
    pub fn remove(&self, session_dir: &Path) -> Result<(), DiskError> {
        remove_at(session_dir)
    }

    /// Removes what a killed node left of limited directories under `sessions_dir`, in every
    /// directory in it whose name `keep` refuses: unmounts its working directory, detaches loop
    /// devices still attached to its image, and deletes its images and (when it had one) its
    /// working directory; the rest of the directory is left to its owner. Call it at node
    /// start, before anything else removes session directories (one still mounted cannot be
    /// removed) and before spares are prepared (they are not kept).
    pub fn remove_leftovers(
        &self,
        sessions_dir: &Path,
        keep: impl Fn(&OsStr) -> bool,
    ) -> Result<Leftovers, DiskError> {
        let mut left = Leftovers::default();
        let entries = match fs::read_dir(sessions_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(left),
            Err(error) => return Err(io_error("reading", sessions_dir)(error)),
        };
        let mut gone = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error("reading", sessions_dir))?;
            let is_dir = entry
                .file_type()
                .map_err(io_error("reading", &entry.path()))?
                .is_dir();
            if is_dir && !keep(&entry.file_name()) {
                gone.push(entry.path());
            }
        }
        // Unmounted first, so a device a mount here held goes by autoclear; then what is still
        // attached (while the image's path still names it); then the files.
        for dir in &gone {
            left.unmounted += unmount_at(dir)?;
        }
        let root = fs::canonicalize(sessions_dir).map_err(io_error("resolving", sessions_dir))?;
        let attached =
            loop_device::attached().map_err(io_error("listing", Path::new("/sys/block")))?;
        for (index, backing) in attached {
            let Ok(inside) = backing.strip_prefix(&root) else {
                continue;
            };
            let session = inside.components().next().map(|name| name.as_os_str());
            if session.is_none_or(&keep) {
                continue;
            }
            loop_device::detach(index)
                .map_err(io_error("detaching", &loop_device::device_path(index)))?;
            left.detached += 1;
        }
        for dir in &gone {
            let has_image = [IMAGE, SPARE, DRAFT]
                .iter()
                .any(|name| fs::symlink_metadata(dir.join(name)).is_ok());
            if has_image {
                left.images += delete_at(dir)?;
            }
        }
        if left != Leftovers::default() {
            tracing::info!(
                unmounted = left.unmounted,
                images = left.images,
                detached = left.detached,
                "removed limited working directories of sessions that are gone"
            );
        }
        Ok(left)
    }

    /// Writes a formatted image of `size_mb` MiB at `to`, through a draft, so a half-formatted
    /// image never has the name of a usable one.
    fn format(&self, session_dir: &Path, size_mb: u64, to: &Path) -> Result<(), DiskError> {
        let bytes = size_mb
            .checked_mul(MIB)
            .filter(|_| (MIN_SIZE_MB..=MAX_SIZE_MB).contains(&size_mb))
            .ok_or(DiskError::InvalidSize { size_mb })?;
        let draft = session_dir.join(DRAFT);
        remove_if_there(&draft)?;
        let formatted = (|| {
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&draft)
                .map_err(io_error("creating", &draft))?;
            // Sparse: the host's disk holds what the session wrote, not the limit.
            file.set_len(bytes).map_err(io_error("sizing", &draft))?;
            drop(file);
            let output = Command::new(&self.mkfs)
                .args(MKFS_ARGS)
                .arg(&draft)
                .stdin(Stdio::null())
                .output()
                .map_err(io_error("running", &self.mkfs))?;
            if !output.status.success() {
                return Err(DiskError::Format {
                    image: to.to_owned(),
                    status: output.status,
                    stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
                });
            }
            fs::rename(&draft, to).map_err(io_error("renaming", &draft))
        })();
        if formatted.is_err() {
            let _ = fs::remove_file(&draft);
        }
        formatted
    }
}

/// `mkfs.ext4`'s arguments before the image: quiet, 4 KiB blocks and 256-byte inodes whatever
/// the size (for small file systems mke2fs would pick 1 KiB blocks and 128-byte inodes, whose
/// timestamps end in 2038), no blocks reserved for root (the session is not root), the inode
/// tables written now rather than by the kernel in the background after each mount, and
/// read-only on errors rather than going on with a damaged file system. The journal is not
/// zeroed: the image is a new sparse file, whose unwritten blocks read as zeros anyway, so
/// zeroing it would only make the host allocate it (64 MiB of a 10 GiB image).
const MKFS_ARGS: &[&str] = &[
    "-q",
    "-F",
    "-T",
    "default",
    "-b",
    "4096",
    "-I",
    "256",
    "-m",
    "0",
    "-e",
    "remount-ro",
    "-E",
    "lazy_itable_init=0,lazy_journal_init=1",
];

/// A limited working directory. Dropping the handle keeps the directory and its mount (the
/// node drops its handles when it stops); [`LimitedDir::remove`] ends it.
#[derive(Debug)]
pub struct LimitedDir {
    session_dir: PathBuf,
    work: PathBuf,
}

impl LimitedDir {
    /// The working directory, `<session_dir>/work`.
    pub fn path(&self) -> &Path {
        &self.work
    }

    /// Unmounts the working directory (its loop device goes with its last mount, which a
    /// session's mount namespace may hold until its processes are gone) and deletes it and its
    /// image.
    pub fn remove(self) -> Result<(), DiskError> {
        remove_at(&self.session_dir)
    }

    /// Unmounts the working directory and keeps the image, for [`DiskLimits::open`] to mount
    /// again later (the builder's disk of a scope, between its builds). First every free
    /// block of the file system is given back to the host (`give_back_free_blocks`), so a
    /// kept image takes only what its files hold.
    pub fn unmount(self) -> Result<(), DiskError> {
        if let Err(error) = give_back_free_blocks(&self.work) {
            tracing::warn!(%error, disk = %self.work.display(), "could not give a disk's free blocks back to the host; its image keeps them until they are written again");
        }
        unmount_at(&self.session_dir).map(drop)
    }
}

/// `struct fstrim_range` of `<linux/fs.h>`.
#[repr(C)]
struct TrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// `FITRIM`: `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: rustix::ioctl::Opcode = rustix::ioctl::opcode::read_write::<TrimRange>(b'X', 121);

/// Gives every free block of the file system mounted at `root` back to its image's host file:
/// commits the journal (blocks freed since the last commit become free) and asks ext4 to
/// discard all its free space (`FITRIM`, what `fstrim` does), which the loop device turns
/// into holes in the image. The mount's `discard` option already does so as files are
/// deleted, but not reliably: ext4 issues those discards later, from a background queue, and
/// a build that filled a 64 MiB disk and was removed just before the unmount left 17 MiB
/// allocated in the image for good in most runs (Linux 6.18). Takes a few milliseconds,
/// 10 GiB or 64 MiB alike (7 ms for a freshly mounted 10 GiB image; groups already trimmed
/// since the mount are skipped).
fn give_back_free_blocks(root: &Path) -> io::Result<()> {
    let dir = fs::File::open(root)?;
    rustix::fs::syncfs(&dir)?;
    let mut range = TrimRange {
        start: 0,
        len: u64::MAX,
        minlen: 0,
    };
    // SAFETY: FITRIM reads and writes a `struct fstrim_range`, which `TrimRange` is.
    #[allow(unsafe_code)]
    unsafe {
        rustix::ioctl::ioctl(
            &dir,
            rustix::ioctl::Updater::<FITRIM, TrimRange>::new(&mut range),
        )
    }?;
    Ok(())
}

/// Unmounts `<session_dir>/work` and deletes it and the images.
fn remove_at(session_dir: &Path) -> Result<(), DiskError> {
    unmount_at(session_dir)?;
    delete_at(session_dir)?;
    Ok(())
}

/// Unmounts `<session_dir>/work`, every mount stacked on it (ours only by mistake, but each
/// needs its own unmount); how many.
fn unmount_at(session_dir: &Path) -> Result<usize, DiskError> {
    let work = session_dir.join(WORK);
    let mut unmounted = 0;
    while mounted_device(session_dir, &work)?.is_some() {
        if unmounted == 8 {
            return Err(io_error("unmounting", &work)(io::Error::other(
                "still a mount point after 8 unmounts",
            )));
        }
        // A plain unmount releases the device before it returns; one busy (a process of the
        // node inside it) is detached lazily instead.
        match rustix::mount::unmount(&work, UnmountFlags::empty()) {
            Err(rustix::io::Errno::BUSY) => {
                rustix::mount::unmount(&work, UnmountFlags::DETACH)
                    .map_err(|errno| io_error("unmounting", &work)(errno.into()))?;
            }
            other => other.map_err(|errno| io_error("unmounting", &work)(errno.into()))?,
        }
        unmounted += 1;
    }
    Ok(unmounted)
}

/// Deletes the images in `session_dir` and its (unmounted) working directory; how many images.
fn delete_at(session_dir: &Path) -> Result<usize, DiskError> {
    let mut images = 0;
    for name in [IMAGE, SPARE, DRAFT] {
        if remove_if_there(&session_dir.join(name))? {
            images += 1;
        }
    }
    let work = session_dir.join(WORK);
    match fs::remove_dir_all(&work) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            return Err(io_error("removing", &work)(error));
        }
        _ => {}
    }
    Ok(images)
}

/// The device mounted on `work`, if `work` is a mount point (its device differs from its
/// parent's, `session_dir`).
fn mounted_device(session_dir: &Path, work: &Path) -> Result<Option<u64>, DiskError> {
    let work_dev = match fs::symlink_metadata(work) {
        Ok(meta) => meta.dev(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error("reading", work)(error)),
    };
    let parent_dev = fs::symlink_metadata(session_dir)
        .map_err(io_error("reading", session_dir))?
        .dev();
    Ok((work_dev != parent_dev).then_some(work_dev))
}

/// Mounts the image attached to loop device `index` at `work`. `nosuid` and `nodev` although
/// the session cannot make such files: nothing on a session's disk is trusted. `discard`, so a
/// file the session deletes frees its blocks in the sparse image too.
fn mount(image: &Path, work: &Path, index: u32) -> Result<(), DiskError> {
    rustix::mount::mount(
        loop_device::device_path(index),
        work,
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"discard",
    )
    .map_err(|errno| DiskError::Mount {
        image: image.to_owned(),
        work: work.to_owned(),
        source: errno.into(),
    })
}

fn make_dir(path: &Path, mode: u32) -> Result<(), DiskError> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(io_error("creating", path))
}

/// Deletes a file; whether it was there.
fn remove_if_there(path: &Path) -> Result<bool, DiskError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(io_error("removing", path)(error)),
    }
}

/// `mkfs.ext4` on `PATH`, else where e2fsprogs puts it (a node started without `/usr/sbin` on
/// its `PATH` still finds it).
fn find_mkfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join("mkfs.ext4"))
        .find(|candidate| {
            fs::metadata(candidate).is_ok_and(|meta| meta.is_file() && meta.mode() & 0o111 != 0)
        })
}
