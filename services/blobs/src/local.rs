//! Durable writes into a directory store (`file://`). Every blob is written in this order,
//! so that nothing may name it (an index row, a tree, a version) before its bytes and its
//! name would survive a power cut:
//!
//! 1. its bytes go into an unnamed file (`O_TMPFILE`) in the store's root, hashed as they
//!    come (or, where the file system refuses unnamed files, a staging name ending in
//!    `#<digits>`, which listings skip);
//! 2. the file is synced (`fsync`);
//! 3. its directory (`blobs/sha256/<2 hex>/`) is made if missing, and every directory made is
//!    synced through its parent;
//! 4. the file is linked to its final name, create-only (a name never shows part of a blob);
//! 5. that directory is synced, so the name is on disk before the write returns.
//!
//! An existing name is not taken on trust: a blob whose size (and, where the caller's bytes
//! allow it cheaply, digest) does not match is replaced, by renaming a complete, synced copy
//! over it. A blob left empty or cut short by a crash is thus repaired by storing the same
//! content again, instead of standing for ever because its name exists.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::Digest as _;

use crate::{BlobError, BlobStore, Digest};

/// How much of an existing blob is checked before it counts as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Its size: what a crash damages (an empty or short file). For callers that store many
    /// files and would otherwise read every unchanged one again (a build's layer).
    Size,
    /// Its size and its digest, read back.
    Content,
}

/// A directory store's root, and whether its file system takes unnamed files.
#[derive(Debug)]
pub(crate) struct Directory {
    root: PathBuf,
    /// Cleared by the first write that finds unnamed files refused here.
    unnamed: AtomicBool,
}

/// A blob being written: an unnamed file, or a staging name where unnamed files are refused
/// (removed when dropped unless it became the blob).
#[derive(Debug)]
pub(crate) struct Pending {
    file: std::fs::File,
    staged: Option<PathBuf>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(staged) = self.staged.take() {
            let _ = std::fs::remove_file(staged);
        }
    }
}

impl Pending {
    /// The file, to write the blob's bytes into.
    pub(crate) fn file(&mut self) -> &mut std::fs::File {
        &mut self.file
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::File {
        path: path.to_owned(),
        source,
    }
}

/// Records each step of a write, per store root, so tests can check their order.
#[cfg(test)]
pub(crate) static STEPS: std::sync::Mutex<Vec<(PathBuf, &'static str)>> =
    std::sync::Mutex::new(Vec::new());

fn step(_root: &Path, _what: &'static str) {
    #[cfg(test)]
    STEPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((_root.to_owned(), _what));
}

/// Syncs a directory, so the names in it are on disk.
fn sync_directory(path: &Path) -> Result<(), BlobError> {
    std::fs::File::open(path)
        .and_then(|directory| directory.sync_all())
        .map_err(io(path))
}

impl Directory {
    /// The store rooted at `root` (a directory that exists).
    pub(crate) fn new(root: PathBuf) -> Self {
        Directory {
            root,
            unnamed: AtomicBool::new(true),
        }
    }

    /// The store's directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// Where a blob's file is (whether or not it exists).
    pub(crate) fn target(&self, digest: &Digest) -> PathBuf {
        self.root.join(BlobStore::location(digest).as_ref())
    }

    /// Whether the blob is stored whole: a regular file of `size` bytes, and with
    /// [`Check::Content`] bytes that hash to `digest`.
    pub(crate) fn holds(&self, digest: &Digest, size: u64, check: Check) -> bool {
        let target = self.target(digest);
        let Ok(mut file) = std::fs::File::open(&target) else {
            return false;
        };
        match file.metadata() {
            Ok(metadata) if metadata.is_file() && metadata.len() == size => {}
            _ => return false,
        }
        if check == Check::Size {
            return true;
        }
        let mut hasher = sha2::Sha256::new();
        let mut buffer = vec![0u8; 256 * 1024];
        let mut read_total = 0u64;
        loop {
            match file.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => {
                    read_total += read as u64;
                    hasher.update(&buffer[..read]);
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        read_total == size && Digest::from_bytes(hasher.finalize().into()) == *digest
    }

    /// Opens a file for a new blob's bytes.
    pub(crate) fn begin(&self) -> Result<Pending, BlobError> {
        if self.unnamed.load(Ordering::Relaxed) {
            match rustix::fs::open(
                &self.root,
                rustix::fs::OFlags::RDWR
                    | rustix::fs::OFlags::TMPFILE
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(0o644),
            ) {
                Ok(fd) => {
                    return Ok(Pending {
                        file: std::fs::File::from(fd),
                        staged: None,
                    });
                }
                // No O_TMPFILE here (EOPNOTSUPP, EISDIR, EINVAL): named staging from now on.
                // Any other error repeats below and is reported.
                Err(_) => self.unnamed.store(false, Ordering::Relaxed),
            }
        }
        let mut attempt = 1u32;
        loop {
            let staged = self.root.join(format!(
                "staging-{}#{attempt}",
                uuid::Uuid::new_v4().simple()
            ));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&staged)
            {
                Ok(file) => {
                    return Ok(Pending {
                        file,
                        staged: Some(staged),
                    });
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => attempt += 1,
                Err(error) => return Err(io(&staged)(error)),
            }
        }
    }

    /// Stores bytes already in memory (and hashed) unless the blob is there whole. Answers
    /// whether it wrote them.
    pub(crate) fn put_bytes(&self, digest: &Digest, bytes: &[u8]) -> Result<bool, BlobError> {
        let size = bytes.len() as u64;
        if self.holds(digest, size, Check::Content) {
            return Ok(false);
        }
        let mut pending = self.begin()?;
        pending.file.write_all(bytes).map_err(io(&self.root))?;
        step(&self.root, "write");
        self.commit(pending, digest, size, Check::Content)
    }

    /// Makes `pending`, which holds exactly the `size` bytes of `digest`, the blob: synced,
    /// then linked under its name create-only, then its directory synced. A blob already
    /// there that passes `check` is kept (answers false); one that does not is replaced.
    pub(crate) fn commit(
        &self,
        pending: Pending,
        digest: &Digest,
        size: u64,
        check: Check,
    ) -> Result<bool, BlobError> {
        let target = self.target(digest);
        pending.file.sync_all().map_err(io(&target))?;
        step(&self.root, "sync file");
        let directory = target.parent().unwrap_or(&self.root).to_owned();
        self.make_directory(&directory)?;
        match self.link(&pending, &target) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                if self.holds(digest, size, check) {
                    return Ok(false);
                }
                tracing::warn!(%digest, path = %target.display(), "a stored blob is damaged (wrong size or content); replacing it with the bytes just written");
                self.replace(pending, &target)?;
            }
            Err(error) => return Err(io(&target)(error)),
        }
        step(&self.root, "link");
        sync_directory(&directory)?;
        step(&self.root, "sync directory");
        Ok(true)
    }

    /// Gives the pending file the name `target`, create-only.
    fn link(&self, pending: &Pending, target: &Path) -> std::io::Result<()> {
        match &pending.staged {
            Some(staged) => std::fs::hard_link(staged, target),
            None => link_unnamed(&pending.file, target).map_err(std::io::Error::from),
        }
    }

    /// Puts the pending file in place of a damaged blob at `target`, atomically.
    fn replace(&self, mut pending: Pending, target: &Path) -> Result<(), BlobError> {
        let staged = match pending.staged.take() {
            Some(staged) => staged,
            None => {
                let mut attempt = 1u32;
                loop {
                    let mut name = target.as_os_str().to_owned();
                    name.push(format!("#{attempt}"));
                    let name = PathBuf::from(name);
                    match link_unnamed(&pending.file, &name) {
                        Ok(()) => break name,
                        Err(rustix::io::Errno::EXIST) => attempt += 1,
                        Err(errno) => return Err(io(&name)(errno.into())),
                    }
                }
            }
        };
        let renamed = std::fs::rename(&staged, target).map_err(io(target));
        if renamed.is_err() {
            let _ = std::fs::remove_file(&staged);
        }
        renamed?;
        step(&self.root, "rename over the damaged blob");
        Ok(())
    }

    /// Makes `directory` (beneath the root) if missing, syncing the parent of every directory
    /// made, so the blob's path survives a crash as well as its name.
    fn make_directory(&self, directory: &Path) -> Result<(), BlobError> {
        if directory.is_dir() {
            return Ok(());
        }
        let mut missing = Vec::new();
        let mut next = Some(directory);
        while let Some(path) = next {
            if path == self.root || path.is_dir() {
                break;
            }
            missing.push(path.to_owned());
            next = path.parent();
        }
        std::fs::create_dir_all(directory).map_err(io(directory))?;
        for made in missing.iter().rev() {
            if let Some(parent) = made.parent() {
                sync_directory(parent)?;
            }
        }
        step(&self.root, "sync new directory");
        Ok(())
    }

    /// Stores a local file's blob unless it is there whole (by size: see [`Check::Size`]).
    /// The bytes are hashed as they are copied and must hash to `digest`
    /// ([`BlobError::Changed`] otherwise; nothing is stored). Answers whether it wrote them.
    pub(crate) fn put_file(
        &self,
        path: &Path,
        digest: &Digest,
        buffer: &mut [u8],
    ) -> Result<bool, BlobError> {
        let mut input = std::fs::File::open(path).map_err(io(path))?;
        let size = input.metadata().map_err(io(path))?.len();
        if self.holds(digest, size, Check::Size) {
            return Ok(false);
        }
        let mut pending = self.begin()?;
        let copied = copy_verified(&mut input, pending.file(), path, digest, buffer)?;
        step(&self.root, "write");
        self.commit(pending, digest, copied, Check::Size)
    }
}

/// Gives an unnamed file (opened with `O_TMPFILE`) the name `target`, create-only: EEXIST when
/// the name is taken. `AT_EMPTY_PATH` links the descriptor itself but needs
/// `CAP_DAC_READ_SEARCH` (refused with ENOENT or EPERM without it); the descriptor's
/// `/proc/self/fd` entry works for any user where `/proc` is mounted.
pub fn link_unnamed(file: &std::fs::File, target: &Path) -> rustix::io::Result<()> {
    use rustix::fs::{AtFlags, CWD, linkat};
    match linkat(file, "", CWD, target, AtFlags::EMPTY_PATH) {
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::PERM) => {
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
            linkat(CWD, proc.as_str(), CWD, target, AtFlags::SYMLINK_FOLLOW)
        }
        linked => linked,
    }
}

/// Copies `input` (the file at `path`) to `output` through `buffer` while hashing it, and
/// answers the bytes copied; [`BlobError::Changed`] if they do not hash to `digest`.
fn copy_verified(
    input: &mut std::fs::File,
    output: &mut std::fs::File,
    path: &Path,
    digest: &Digest,
    buffer: &mut [u8],
) -> Result<u64, BlobError> {
    let mut hasher = sha2::Sha256::new();
    let mut copied = 0u64;
    loop {
        let read = match input.read(buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(io(path)(error)),
        };
        hasher.update(&buffer[..read]);
        output.write_all(&buffer[..read]).map_err(io(path))?;
        copied += read as u64;
    }
    if Digest::from_bytes(hasher.finalize().into()) != *digest {
        return Err(BlobError::Changed {
            path: path.to_owned(),
        });
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(root: &Path) -> Vec<&'static str> {
        STEPS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(at, _)| at == root)
            .map(|(_, what)| *what)
            .collect()
    }

    fn names_under(root: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut directories = vec![root.to_owned()];
        while let Some(directory) = directories.pop() {
            for entry in std::fs::read_dir(&directory).expect("read dir").flatten() {
                if entry.file_type().expect("type").is_dir() {
                    directories.push(entry.path());
                } else {
                    found.push(entry.path());
                }
            }
        }
        found
    }

    /// The order that makes a blob durable before anything can name it: the bytes are
    /// written, the file synced, its new directory made and synced, the name linked, and the
    /// directory holding the name synced; only then does the write return.
    #[test]
    fn a_blob_is_synced_before_it_is_named_and_its_name_synced_before_the_write_returns() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().to_owned();
        let store = Directory::new(root.clone());
        let content = b"durable bytes";
        let digest = Digest::of(content);
        assert!(store.put_bytes(&digest, content).expect("put"));
        assert_eq!(
            steps(&root),
            [
                "write",
                "sync file",
                "sync new directory",
                "link",
                "sync directory"
            ]
        );
        assert_eq!(
            std::fs::read(store.target(&digest)).expect("stored"),
            content
        );
        assert!(
            !store.put_bytes(&digest, content).expect("again"),
            "a whole blob is not written again"
        );
    }

    /// A blob a crash left empty or cut short, or whose bytes rotted, is replaced by storing
    /// the same content again, through the same synced steps; nothing else is left behind.
    #[test]
    fn a_damaged_blob_is_replaced_by_the_same_bytes_stored_again() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().to_owned();
        let store = Directory::new(root.clone());
        let content = b"the bytes a crash damaged";
        let digest = Digest::of(content);
        let target = store.target(&digest);
        for damage in [
            &b""[..],
            &b"the bytes"[..],
            &b"THE bytes a crash damaged"[..],
        ] {
            store.put_bytes(&digest, content).expect("put");
            std::fs::write(&target, damage).expect("damage");
            assert!(store.put_bytes(&digest, content).expect("repair"));
            assert_eq!(std::fs::read(&target).expect("read"), content);
        }
        // A damaged blob written through `put_file` (size check) is replaced too.
        let source = dir.path().join("source");
        std::fs::write(&source, content).expect("source");
        std::fs::write(&target, b"").expect("empty it");
        let mut buffer = [0u8; 7];
        assert!(
            store
                .put_file(&source, &digest, &mut buffer)
                .expect("put file")
        );
        assert_eq!(std::fs::read(&target).expect("read"), content);
        assert!(
            steps(&root).contains(&"rename over the damaged blob"),
            "{:?}",
            steps(&root)
        );
        let left: Vec<PathBuf> = names_under(&root)
            .into_iter()
            .filter(|path| path != &source)
            .collect();
        assert_eq!(left, [target], "only the blob's own name");
    }

    /// Where unnamed files are refused, a staging name carries the same guarantees: the blob
    /// lands whole under its final name, again is success without a write, changed content is
    /// refused, and no staging name is left.
    #[test]
    fn the_staged_fallback_stores_once_and_leaves_no_staging_name() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().join("store");
        std::fs::create_dir_all(&root).expect("root");
        let store = Directory::new(root.clone());
        store.unnamed.store(false, Ordering::Relaxed);
        let (path, content) = (dir.path().join("file"), b"bytes copied in several reads");
        std::fs::write(&path, content).expect("write");
        let digest = Digest::of(content);
        let mut buffer = [0u8; 4];
        assert!(store.put_file(&path, &digest, &mut buffer).expect("first"));
        assert!(!store.put_file(&path, &digest, &mut buffer).expect("second"));
        assert_eq!(std::fs::read(store.target(&digest)).expect("read"), content);
        std::fs::write(store.target(&digest), b"").expect("damage");
        assert!(store.put_file(&path, &digest, &mut buffer).expect("repair"));
        assert_eq!(std::fs::read(store.target(&digest)).expect("read"), content);

        let other = Digest::of(b"other content");
        let error = store
            .put_file(&path, &other, &mut buffer)
            .expect_err("content that does not match is refused");
        assert!(matches!(error, BlobError::Changed { .. }), "{error}");
        assert!(!store.target(&other).exists(), "nothing stored");
        assert_eq!(
            names_under(&root),
            [store.target(&digest)],
            "only final names"
        );
    }
}
