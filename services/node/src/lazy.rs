//! Versions served before they are fetched: a read-only FUSE file system that shows a version's
//! whole tree from its index at once and opens each file's blob from the cache, fetching it
//! (verified against its digest) on first open. Sessions see it read-only at `/env/<slug>`
//! exactly as they see a materialized version: the same names, kinds, modes, sizes and link
//! targets; see docs/design/lazy-versions.md for the decision and what it measured.
//!
//! Each session gets a FUSE connection of its own, mounted on the host only until the
//! session's mount namespace has bound it, then detached there: the host holds no mount of a
//! version, and a node that dies leaves none behind (the sessions' namespaces, which hold them,
//! die with it). The connections of one version share its index and the node's blob cache.
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
    /// Fetches the blob unless it is present; answers once its file is in place under its
    /// name (`None`), or once it is written and verified but not yet on disk: its file, to
    /// read from.
    fn fetch(
        &self,
        digest: Digest,
        executable: bool,
    ) -> futures::future::BoxFuture<'static, Result<Option<Arc<std::fs::File>>, String>>;
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

/// What every connection of a version shares.
struct Inner {
    inodes: Vec<Inode>,
    /// Inodes by path, for the node's own reads.
    by_path: HashMap<String, u64>,
    blobs: PathBuf,
    mounts: PathBuf,
    fetch: Arc<dyn Fetch>,
    runtime: tokio::runtime::Handle,
    deadline: Duration,
    mounted_at: SystemTime,
    order: Mutex<ReadOrder>,
    /// Blob bytes in the tree, for `statfs`.
    bytes: u64,
    label: String,
}

/// One session's connection: its open files.
struct Conn {
    inner: Arc<Inner>,
    /// Open files, by handle.
    open: Mutex<HashMap<u64, Open>>,
    next_handle: AtomicU64,
    /// One backing file per inode while any handle of it is open (the kernel wants one).
    backings: Mutex<HashMap<u64, Weak<BackingId>>>,
    passthrough: AtomicBool,
}

struct Open {
    file: Option<Arc<std::fs::File>>,
    _backing: Option<Arc<BackingId>>,
}

/// A version served lazily: its index, from which each session gets a mount
/// ([`LazyVersion::mount_for_session`]). Every session that sees it holds it.
pub struct LazyVersion {
    inner: Arc<Inner>,
    /// Told the read order once, when the version's last session goes.
    done: Mutex<Option<OnDone>>,
}

/// One session's mount of a lazily served version; the connection is served while it lives.
pub struct SessionMount {
    mountpoint: PathBuf,
    session: Mutex<Option<fuser::BackgroundSession>>,
    conn: Arc<Conn>,
    _version: Arc<LazyVersion>,
}

impl std::fmt::Debug for SessionMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMount")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

/// What is told a mount's read order.
pub type OnDone = Box<dyn FnOnce(Vec<String>) + Send>;

impl std::fmt::Debug for LazyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyVersion")
            .field("version", &self.inner.label)
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
    /// Serves `tree`: files read from `blobs` and fetched through `fetch` when missing, each
    /// within `deadline`; sessions' mounts made under `mounts`. Called inside the runtime
    /// whose handle fetches run on.
    pub fn new(
        tree: &Tree,
        blobs: &Path,
        mounts: &Path,
        fetch: Arc<dyn Fetch>,
        deadline: Duration,
        label: String,
    ) -> Result<Arc<Self>, MountError> {
        let (inodes, bytes) = index(tree).map_err(MountError::Tree)?;
        let by_path = inodes
            .iter()
            .enumerate()
            .skip(2)
            .map(|(ino, inode)| (inode.path.clone(), ino as u64))
            .collect();
        Ok(Arc::new(LazyVersion {
            inner: Arc::new(Inner {
                inodes,
                by_path,
                blobs: blobs.to_owned(),
                mounts: mounts.to_owned(),
                fetch,
                runtime: tokio::runtime::Handle::current(),
                deadline,
                mounted_at: SystemTime::now(),
                order: Mutex::new(ReadOrder::default()),
                bytes,
                label,
            }),
            done: Mutex::new(None),
        }))
    }

    /// A mount of the version for one session, on the host at [`SessionMount::path`] until
    /// [`SessionMount::detach`]. Blocks for the mount system call.
    pub fn mount_for_session(self: &Arc<Self>) -> Result<Arc<SessionMount>, MountError> {
        let mountpoint = self
            .inner
            .mounts
            .join(uuid::Uuid::new_v4().simple().to_string());
        let failed = |source| MountError::Mount {
            path: mountpoint.clone(),
            source,
        };
        std::fs::create_dir(&mountpoint).map_err(failed)?;
        let conn = Arc::new(Conn {
            inner: self.inner.clone(),
            open: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            backings: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
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
        config.n_threads = Some(2);
        config.clone_fd = true;
        let session = fuser::Session::new(VersionFs(conn.clone()), &mountpoint, &config)
            .and_then(fuser::Session::spawn);
        let session = match session {
            Ok(session) => session,
            Err(source) => {
                let _ = std::fs::remove_dir(&mountpoint);
                return Err(MountError::Mount {
                    path: mountpoint,
                    source,
                });
            }
        };
        metrics::gauge!("plinth_node_lazy_mounts").increment(1.0);
        Ok(Arc::new(SessionMount {
            mountpoint,
            session: Mutex::new(Some(session)),
            conn,
            _version: self.clone(),
        }))
    }

    /// A small file of the version (at most `limit` bytes), for the node's own checks; its
    /// blob fetched when missing. Blocks; not on a runtime thread.
    pub fn read(&self, path: &str, limit: u64) -> Option<Vec<u8>> {
        use std::io::Read as _;
        let ino = *self.inner.by_path.get(path)?;
        let Kind::File {
            digest,
            size,
            executable,
        } = &self.inner.inodes[ino as usize].kind
        else {
            return None;
        };
        if *size == 0 {
            return Some(Vec::new());
        }
        let digest = (*digest)?;
        let file = match self.inner.open_blob(&digest, *executable, *size).ok()? {
            Some(file) => file,
            None => {
                let fetched = self.inner.runtime.block_on(tokio::time::timeout(
                    self.inner.deadline,
                    self.inner.fetch.fetch(digest, *executable),
                ));
                match fetched {
                    Ok(Ok(Some(file))) => reader(&file, *size).ok()?,
                    Ok(Ok(None)) => self.inner.open_blob(&digest, *executable, *size).ok()??,
                    _ => return None,
                }
            }
        };
        let mut bytes = Vec::new();
        file.take(limit).read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// A symbolic link's target in the version.
    pub fn read_link(&self, path: &str) -> Option<PathBuf> {
        let ino = *self.inner.by_path.get(path)?;
        match &self.inner.inodes[ino as usize].kind {
            Kind::Symlink { target } => Some(PathBuf::from(OsStr::from_bytes(target))),
            _ => None,
        }
    }

    /// Whether `name` is a top-level entry of the version.
    pub fn has(&self, name: &str) -> bool {
        self.inner.child(1, name.as_bytes()).is_some()
    }

    /// Tells the read order now, once: when its sessions stopped opening new files for a
    /// while, or when the version's last session goes, whichever is first.
    pub fn tell_done(&self) {
        let done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(done) = done {
            let _entered = self.inner.runtime.enter();
            done(self.read_order());
        }
    }

    /// How many paths are recorded so far.
    pub fn recorded(&self) -> usize {
        self.inner
            .order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .paths
            .len()
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
}

impl SessionMount {
    /// Where it is mounted on the host, until [`SessionMount::detach`].
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Takes the mount off the host, once the session's namespace holds its own: the
    /// connection lives on in the session's namespace, and goes with it.
    pub fn detach(&self) {
        let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.mountpoint);
    }

    /// Whether files are handed to the kernel to read directly (FUSE passthrough).
    pub fn passthrough(&self) -> bool {
        self.conn.passthrough.load(Ordering::Relaxed)
    }
}

impl Drop for SessionMount {
    fn drop(&mut self) {
        self.detach();
        drop(
            self.session
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        metrics::gauge!("plinth_node_lazy_mounts").decrement(1.0);
    }
}

impl Drop for LazyVersion {
    fn drop(&mut self) {
        self.tell_done();
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
        whole(file, size, format_args!("the cached blob {digest}")).map(Some)
    }
}

impl Conn {
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
                file: file.map(Arc::new),
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

/// A read-only handle of its own on a fetched blob's `file` (unnamed, or not): the session's
/// reads never share the writer's handle.
pub(crate) fn reader(file: &std::fs::File, size: u64) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let reader = rustix::fs::open(
        format!("/proc/self/fd/{}", file.as_raw_fd()).as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map(std::fs::File::from)?;
    whole(reader, size, format_args!("the fetched blob"))
}

/// `file` when it is a regular file of `size` bytes (`what` names it otherwise).
fn whole(
    file: std::fs::File,
    size: u64,
    what: std::fmt::Arguments<'_>,
) -> std::io::Result<std::fs::File> {
    let metadata = file.metadata()?;
    if !metadata.is_file() || metadata.len() != size {
        return Err(std::io::Error::other(format!(
            "{what} holds {} bytes, not {size}",
            metadata.len()
        )));
    }
    Ok(file)
}

/// The file system the kernel calls.
struct VersionFs(Arc<Conn>);

impl Filesystem for VersionFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.0.passthrough.store(true, Ordering::Relaxed);
        }
        tracing::info!(
            version = %self.0.inner.label,
            passthrough = self.0.passthrough.load(Ordering::Relaxed),
            "a version is mounted lazily: its files are fetched as sessions open them"
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .0
            .inner
            .child(parent.0, name.as_bytes())
            .and_then(|ino| self.0.inner.attr(ino))
        {
            Some(attr) => reply.entry(&FOREVER, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.inner.inode(ino).and(self.0.inner.attr(ino.0)) {
            Some(attr) => reply.attr(&FOREVER, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.inner.inode(ino).map(|inode| &inode.kind) {
            Some(Kind::Symlink { target }) => reply.data(target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(inode) = self.0.inner.inode(ino) else {
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
        self.0.inner.record(ino.0, &inode.path);
        if *size == 0 {
            return self.0.opened(ino.0, None, reply);
        }
        let Some(digest) = *digest else {
            return reply.error(Errno::EIO);
        };
        let (size, executable) = (*size, *executable);
        match self.0.inner.open_blob(&digest, executable, size) {
            Ok(Some(file)) => return self.0.opened(ino.0, Some(file), reply),
            Ok(None) => {}
            Err(error) => {
                tracing::error!(version = %self.0.inner.label, path = %inode.path, %error, "cannot open a cached blob");
                return reply.error(Errno::EIO);
            }
        }
        // Not here yet: fetched off this thread, answered when it is (or is not) in place.
        let (conn, inner) = (self.0.clone(), self.0.inner.clone());
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
                    Ok(Ok(Some(file))) => match reader(&file, size) {
                        Ok(file) => {
                            metrics::counter!("plinth_node_lazy_fetches_total", "outcome" => "fetched").increment(1);
                            metrics::histogram!("plinth_node_lazy_fetch_seconds")
                                .record(begun.elapsed().as_secs_f64());
                            return conn.opened(ino.0, Some(file), reply);
                        }
                        Err(error) => error.to_string(),
                    },
                    Ok(Ok(None)) => match inner.open_blob(&digest, executable, size) {
                        Ok(Some(file)) => {
                            metrics::counter!("plinth_node_lazy_fetches_total", "outcome" => "fetched").increment(1);
                            metrics::histogram!("plinth_node_lazy_fetch_seconds")
                                .record(begun.elapsed().as_secs_f64());
                            return conn.opened(ino.0, Some(file), reply);
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
        // Read outside the lock: other handles' reads go on meanwhile.
        let file = match self.0.lock_open().get(&fh.0) {
            Some(open) => open.file.clone(),
            None => return reply.error(Errno::EBADF),
        };
        let Some(file) = file else {
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
                    tracing::error!(version = %self.0.inner.label, %error, "cannot read a cached blob");
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
        let Some(inode) = self.0.inner.inode(ino) else {
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
            let kind = match self.0.inner.inodes[*child as usize].kind {
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

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Files here are not terminals (`isatty` asks with TCGETS), nor anything else.
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.0.inner.bytes.div_ceil(4096);
        reply.statfs(
            blocks,
            0,
            0,
            self.0.inner.inodes.len() as u64,
            0,
            4096,
            255,
            4096,
        );
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
