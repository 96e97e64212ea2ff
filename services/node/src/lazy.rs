//! Versions served before they are fetched: a read-only FUSE file system that shows a version's
//! whole tree from its index at once and opens each file's blob from the cache, fetching it
//! (verified against its digest) on first open. Sessions see it read-only at `/env/<slug>`
//! exactly as they see a materialized version: the same names, kinds, modes, sizes and link
//! targets; see docs/design/lazy-versions.md for the decision and what it measured.
//!
//! The file system answers only from the tree it was given and from `blobs/<digest>` files
//! named by that tree: nothing a session does names another path for it to read. A blob that
//! cannot be fetched within the deadline fails the open with `EIO` and a log line; nothing
//! waits longer than the deadline.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use plinth_blobs::Digest;
use plinth_blobs::tree::{Tree, TreeEntryKind};

/// Paths a mount records as read, at most: the read order the first sessions leave.
pub const MAX_RECORDED: usize = 4096;

/// How long the kernel may keep names and attributes: a version never changes.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Fetches a blob into the cache's `blobs/` directory (verified), for a mount.
pub trait Fetch: Send + Sync + 'static {
    /// Fetches the blob unless it is present; answers once its file is in place.
    fn fetch(
        &self,
        digest: Digest,
        executable: bool,
    ) -> futures::future::BoxFuture<'static, Result<(), String>>;
}

/// One inode of the tree.
#[derive(Debug)]
enum Kind {
    Dir {
        /// Children by name, sorted.
        children: Vec<(Box<[u8]>, u64)>,
        /// Subdirectories, for the link count.
        subdirs: u32,
    },
    File {
        digest: Option<Digest>,
        size: u64,
        executable: bool,
    },
    Symlink {
        target: Box<[u8]>,
    },
}

#[derive(Debug)]
struct Inode {
    parent: u64,
    path: String,
    kind: Kind,
}

/// The paths opened first, in order, distinct, bounded.
#[derive(Debug, Default)]
pub struct ReadOrder {
    paths: Vec<String>,
    seen: std::collections::HashSet<u64>,
}

/// What a mount and its handlers share.
struct Inner {
    inodes: Vec<Inode>,
    blobs: PathBuf,
    fetch: Arc<dyn Fetch>,
    runtime: tokio::runtime::Handle,
    deadline: Duration,
    mounted_at: SystemTime,
    /// Open files, by handle.
    open: Mutex<HashMap<u64, Open>>,
    next_handle: AtomicU64,
    /// One backing file per inode while any handle of it is open (the kernel wants one).
    backings: Mutex<HashMap<u64, Weak<BackingId>>>,
    passthrough: AtomicBool,
    order: Mutex<ReadOrder>,
    /// Blob bytes in the tree, for `statfs`.
    bytes: u64,
    label: String,
}

struct Open {
    file: Option<std::fs::File>,
    _backing: Option<Arc<BackingId>>,
}

/// A version mounted lazily. Unmounted when dropped; every session that sees it holds it.
pub struct LazyVersion {
    mountpoint: PathBuf,
    inner: Arc<Inner>,
    session: Mutex<Option<fuser::BackgroundSession>>,
    /// Told the read order once, when the mount goes or its record is full.
    done: Mutex<Option<OnDone>>,
}

/// What is told a mount's read order.
pub type OnDone = Box<dyn FnOnce(Vec<String>) + Send>;

impl std::fmt::Debug for LazyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyVersion")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

/// Why a version could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The tree names a path twice, or a path under a file.
    #[error("the version's tree cannot be shown: {0}")]
    Tree(String),
    /// The kernel refused the mount (no FUSE, no privilege).
    #[error("cannot mount {path}: {source}")]
    Mount {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Where mounting is possible at all: `/dev/fuse` opens for reading and writing.
pub fn available() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

impl LazyVersion {
    /// Mounts `tree` at `mountpoint` (an empty directory), files read from `blobs` and
    /// fetched through `fetch` when missing, each within `deadline`. Called inside the
    /// runtime whose handle fetches run on.
    pub fn mount(
        tree: &Tree,
        mountpoint: &Path,
        blobs: &Path,
        fetch: Arc<dyn Fetch>,
        deadline: Duration,
        label: String,
    ) -> Result<Arc<Self>, MountError> {
        let (inodes, bytes) = index(tree).map_err(MountError::Tree)?;
        let inner = Arc::new(Inner {
            inodes,
            blobs: blobs.to_owned(),
            fetch,
            runtime: tokio::runtime::Handle::current(),
            deadline,
            mounted_at: SystemTime::now(),
            open: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            backings: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
            order: Mutex::new(ReadOrder::default()),
            bytes,
            label,
        });
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("plinth".to_owned()),
            fuser::MountOption::Subtype("plinth-version".to_owned()),
            fuser::MountOption::RO,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoDev,
            fuser::MountOption::DefaultPermissions,
        ];
        config.acl = fuser::SessionACL::All;
        config.n_threads = Some(4);
        config.clone_fd = true;
        let failed = |source| MountError::Mount {
            path: mountpoint.to_owned(),
            source,
        };
        let session = fuser::Session::new(VersionFs(inner.clone()), mountpoint, &config)
            .map_err(failed)?
            .spawn()
            .map_err(failed)?;
        Ok(Arc::new(LazyVersion {
            mountpoint: mountpoint.to_owned(),
            inner,
            session: Mutex::new(Some(session)),
            done: Mutex::new(None),
        }))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether `name` is a top-level entry of the version.
    pub fn has(&self, name: &str) -> bool {
        self.inner.child(1, name.as_bytes()).is_some()
    }

    /// The paths sessions opened so far, in order (at most [`MAX_RECORDED`]).
    pub fn read_order(&self) -> Vec<String> {
        self.inner
            .order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .paths
            .clone()
    }

    /// Tells `done` the read order when the mount goes.
    pub fn on_done(&self, done: OnDone) {
        *self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(done);
    }

    /// Whether files are handed to the kernel to read directly (FUSE passthrough).
    pub fn passthrough(&self) -> bool {
        self.inner.passthrough.load(Ordering::Relaxed)
    }
}

impl Drop for LazyVersion {
    fn drop(&mut self) {
        let done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(done) = done {
            let _entered = self.inner.runtime.enter();
            done(self.read_order());
        }
        let session = self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(session) = session {
            // Joins the handler threads; a detached unmount first, so a mount some process
            // still holds open does not keep them.
            let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
            drop(session);
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
        metrics::gauge!("plinth_node_lazy_mounts").decrement(1.0);
    }
}

/// The tree as inodes (1 is the root), with implied directories made, and its blob bytes.
fn index(tree: &Tree) -> Result<(Vec<Inode>, u64), String> {
    let mut inodes = vec![
        Inode {
            parent: 1,
            path: String::new(),
            kind: Kind::Dir {
                children: Vec::new(),
                subdirs: 0,
            },
        },
        // Index 0 is never an inode number; the root is 1.
        Inode {
            parent: 1,
            path: String::new(),
            kind: Kind::Dir {
                children: Vec::new(),
                subdirs: 0,
            },
        },
    ];
    let mut by_path: HashMap<String, u64> = HashMap::new();
    by_path.insert(String::new(), 1);
    let mut bytes = 0u64;
    // Directories first (and every parent of every entry), so children always find theirs.
    let mut entries: Vec<_> = tree.entries.iter().collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    fn dir_of(
        path: &str,
        inodes: &mut Vec<Inode>,
        by_path: &mut HashMap<String, u64>,
    ) -> Result<u64, String> {
        if let Some(ino) = by_path.get(path) {
            return match inodes[*ino as usize].kind {
                Kind::Dir { .. } => Ok(*ino),
                _ => Err(format!("{path:?} is both a file and a directory")),
            };
        }
        let (parent_path, _) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = dir_of(parent_path, inodes, by_path)?;
        let ino = inodes.len() as u64;
        inodes.push(Inode {
            parent,
            path: path.to_owned(),
            kind: Kind::Dir {
                children: Vec::new(),
                subdirs: 0,
            },
        });
        by_path.insert(path.to_owned(), ino);
        Ok(ino)
    }
    for entry in entries {
        if entry.path.is_empty() {
            continue;
        }
        if entry.kind == TreeEntryKind::Dir {
            dir_of(&entry.path, &mut inodes, &mut by_path)?;
            continue;
        }
        if by_path.contains_key(&entry.path) {
            return Err(format!("{:?} appears twice", entry.path));
        }
        let (parent_path, _) = entry.path.rsplit_once('/').unwrap_or(("", &entry.path));
        let parent = dir_of(parent_path, &mut inodes, &mut by_path)?;
        let kind = match entry.kind {
            TreeEntryKind::Symlink => Kind::Symlink {
                target: entry
                    .target
                    .clone()
                    .unwrap_or_default()
                    .into_bytes()
                    .into_boxed_slice(),
            },
            _ => {
                let size = entry.size.unwrap_or(0);
                bytes += size;
                Kind::File {
                    digest: entry.file_digest(),
                    size,
                    executable: entry.mode & 0o111 != 0,
                }
            }
        };
        let ino = inodes.len() as u64;
        inodes.push(Inode {
            parent,
            path: entry.path.clone(),
            kind,
        });
        by_path.insert(entry.path.clone(), ino);
    }
    // Each inode into its parent's sorted list of children.
    let mut children: Vec<Vec<(Box<[u8]>, u64)>> = vec![Vec::new(); inodes.len()];
    let mut subdirs = vec![0u32; inodes.len()];
    for (ino, inode) in inodes.iter().enumerate().skip(2) {
        let name = inode.path.rsplit('/').next().unwrap_or(&inode.path);
        children[inode.parent as usize].push((name.as_bytes().into(), ino as u64));
        if matches!(inode.kind, Kind::Dir { .. }) {
            subdirs[inode.parent as usize] += 1;
        }
    }
    for (ino, inode) in inodes.iter_mut().enumerate() {
        if let Kind::Dir {
            children: mine,
            subdirs: count,
        } = &mut inode.kind
        {
            *mine = std::mem::take(&mut children[ino]);
            mine.sort_by(|a, b| a.0.cmp(&b.0));
            *count = subdirs[ino];
        }
    }
    Ok((inodes, bytes))
}

impl Inner {
    fn inode(&self, ino: INodeNo) -> Option<&Inode> {
        let index = usize::try_from(ino.0).ok()?;
        if index == 0 {
            return None;
        }
        self.inodes.get(index)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        match &self.inodes.get(parent as usize)?.kind {
            Kind::Dir { children, .. } => children
                .binary_search_by(|(child, _)| (**child).cmp(name))
                .ok()
                .map(|at| children[at].1),
            _ => None,
        }
    }

    /// What `stat` shows, as a materialized version shows it: directories 0555, files 0444
    /// or 0555, links 0777, owned by root.
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let inode = self.inodes.get(ino as usize)?;
        let (kind, perm, size, nlink) = match &inode.kind {
            Kind::Dir { subdirs, .. } => (FileType::Directory, 0o555, 4096, 2 + subdirs),
            Kind::File {
                size, executable, ..
            } => (
                FileType::RegularFile,
                if *executable { 0o555 } else { 0o444 },
                *size,
                1,
            ),
            Kind::Symlink { target } => (FileType::Symlink, 0o777, target.len() as u64, 1),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(4096) * 8,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn record(&self, ino: u64, path: &str) {
        let mut order = self
            .order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if order.paths.len() < MAX_RECORDED && order.seen.insert(ino) {
            order.paths.push(path.to_owned());
        }
    }

    /// Opens a present blob file; `None` when it is not there.
    fn open_blob(
        &self,
        digest: &Digest,
        executable: bool,
        size: u64,
    ) -> Result<Option<std::fs::File>, std::io::Error> {
        let name = if executable {
            format!("{}.x", digest.to_hex())
        } else {
            digest.to_hex()
        };
        let file = match rustix::fs::open(
            self.blobs.join(name),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => std::fs::File::from(fd),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(errno) => return Err(errno.into()),
        };
        let metadata = file.metadata()?;
        if !metadata.is_file() || metadata.len() != size {
            return Err(std::io::Error::other(format!(
                "the cached blob {digest} holds {} bytes, not {size}",
                metadata.len()
            )));
        }
        Ok(Some(file))
    }

    /// Answers an open with `file` (passthrough when the kernel took it).
    fn opened(&self, ino: u64, file: Option<std::fs::File>, reply: ReplyOpen) {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let flags = FopenFlags::FOPEN_KEEP_CACHE;
        if let Some(file) = &file
            && self.passthrough.load(Ordering::Relaxed)
        {
            let mut backings = self
                .backings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let backing = match backings.get(&ino).and_then(Weak::upgrade) {
                Some(backing) => Some(backing),
                None => match reply.open_backing(file) {
                    Ok(backing) => {
                        let backing = Arc::new(backing);
                        backings.insert(ino, Arc::downgrade(&backing));
                        Some(backing)
                    }
                    Err(error) => {
                        tracing::debug!(%error, "passthrough refused; serving reads");
                        None
                    }
                },
            };
            if let Some(backing) = backing {
                drop(backings);
                reply.opened_passthrough(FileHandle(handle), FopenFlags::empty(), &backing);
                self.lock_open().insert(
                    handle,
                    Open {
                        file: None,
                        _backing: Some(backing),
                    },
                );
                return;
            }
        }
        self.lock_open().insert(
            handle,
            Open {
                file,
                _backing: None,
            },
        );
        reply.opened(FileHandle(handle), flags);
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The file system the kernel calls.
struct VersionFs(Arc<Inner>);

impl Filesystem for VersionFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.0.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .0
            .child(parent.0, name.as_bytes())
            .and_then(|ino| self.0.attr(ino))
        {
            Some(attr) => reply.entry(&FOREVER, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.inode(ino).and(self.0.attr(ino.0)) {
            Some(attr) => reply.attr(&FOREVER, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.inode(ino).map(|inode| &inode.kind) {
            Some(Kind::Symlink { target }) => reply.data(target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(inode) = self.0.inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Kind::File {
            digest,
            size,
            executable,
        } = &inode.kind
        else {
            return reply.error(Errno::EISDIR);
        };
        self.0.record(ino.0, &inode.path);
        if *size == 0 {
            return self.0.opened(ino.0, None, reply);
        }
        let Some(digest) = *digest else {
            return reply.error(Errno::EIO);
        };
        let (size, executable) = (*size, *executable);
        match self.0.open_blob(&digest, executable, size) {
            Ok(Some(file)) => return self.0.opened(ino.0, Some(file), reply),
            Ok(None) => {}
            Err(error) => {
                tracing::error!(version = %self.0.label, path = %inode.path, %error, "cannot open a cached blob");
                return reply.error(Errno::EIO);
            }
        }
        // Not here yet: fetched off this thread, answered when it is (or is not) in place.
        let inner = self.0.clone();
        let _entered = inner.runtime.enter();
        plinth_kit::tasks::spawn(async move {
            let path = inner.inodes[ino.0 as usize].path.clone();
            let begun = std::time::Instant::now();
            // Twice at most: a sweep may remove a blob between its fetch and this open.
            for _ in 0..2 {
                let fetched =
                    tokio::time::timeout(inner.deadline, inner.fetch.fetch(digest, executable))
                        .await;
                let failure = match fetched {
                    Ok(Ok(())) => match inner.open_blob(&digest, executable, size) {
                        Ok(Some(file)) => {
                            metrics::counter!("plinth_node_lazy_fetches_total", "outcome" => "fetched").increment(1);
                            metrics::histogram!("plinth_node_lazy_fetch_seconds")
                                .record(begun.elapsed().as_secs_f64());
                            return inner.opened(ino.0, Some(file), reply);
                        }
                        Ok(None) => continue,
                        Err(error) => error.to_string(),
                    },
                    Ok(Err(error)) => error,
                    Err(_) => format!("no answer within {} ms", inner.deadline.as_millis()),
                };
                metrics::counter!("plinth_node_lazy_fetches_total", "outcome" => "failed")
                    .increment(1);
                tracing::error!(version = %inner.label, %path, %digest, error = %failure, "cannot fetch a file of a lazily mounted version; its read fails with EIO");
                return reply.error(Errno::EIO);
            }
            reply.error(Errno::EIO);
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let open = self.0.lock_open();
        let Some(open) = open.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let Some(file) = &open.file else {
            // An empty file.
            return reply.data(&[]);
        };
        let mut buffer = vec![0u8; size as usize];
        let mut filled = 0;
        while filled < buffer.len() {
            match file.read_at(&mut buffer[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::error!(version = %self.0.label, %error, "cannot read a cached blob");
                    return reply.error(Errno::EIO);
                }
            }
        }
        reply.data(&buffer[..filled]);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let released = self.0.lock_open().remove(&fh.0);
        drop(released);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(inode) = self.0.inode(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Kind::Dir { children, .. } = &inode.kind else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [
            (ino.0, FileType::Directory, &b"."[..]),
            (inode.parent, FileType::Directory, &b".."[..]),
        ];
        let listed = dots.into_iter().chain(children.iter().map(|(name, child)| {
            let kind = match self.0.inodes[*child as usize].kind {
                Kind::Dir { .. } => FileType::Directory,
                Kind::File { .. } => FileType::RegularFile,
                Kind::Symlink { .. } => FileType::Symlink,
            };
            (*child, kind, &name[..])
        }));
        for (at, (child, kind, name)) in listed.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), at as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.0.bytes.div_ceil(4096);
        reply.statfs(blocks, 0, 0, self.0.inodes.len() as u64, 0, 4096, 255, 4096);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plinth_blobs::tree::TreeEntry;

    #[test]
    fn the_index_makes_implied_directories_and_refuses_a_path_under_a_file() {
        let digest: Digest = Digest::of(b"x");
        let tree = Tree::new(vec![
            TreeEntry::file("a/b/c.py", digest, 1, false),
            TreeEntry::symlink("a/link", "b/c.py"),
            TreeEntry::file("top", digest, 1, true),
        ]);
        let (inodes, bytes) = index(&tree).expect("a valid tree");
        assert_eq!(bytes, 2);
        let names: Vec<&str> = inodes
            .iter()
            .skip(2)
            .map(|inode| inode.path.as_str())
            .collect();
        assert!(names.contains(&"a") && names.contains(&"a/b"), "{names:?}");
        let bad = Tree::new(vec![
            TreeEntry::file("a", digest, 1, false),
            TreeEntry::file("a/b", digest, 1, false),
        ]);
        assert!(index(&bad).is_err());
    }
}
