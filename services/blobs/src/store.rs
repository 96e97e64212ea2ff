//! The blob store over `object_store`.

use std::io::SeekFrom;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload, WriteMultipart};
use sha2::Digest as _;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::Digest;

/// Blobs up to this size are buffered in memory, written with one create-only put, and
/// verified in memory on read; larger ones stream through a multipart upload and are
/// verified into a spool file on read, so memory stays bounded whatever the size.
const IN_MEMORY_MAX: usize = 8 * 1024 * 1024;
/// Part size of multipart uploads (S3 needs at least 5 MiB).
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts in flight at once per upload.
const PARTS_IN_FLIGHT: usize = 2;
/// Threads writing [`BlobStore::put_files`] into a directory store (more than cores: much of
/// the time goes to file-system calls, not CPU).
const LOCAL_WRITERS: usize = 4;

/// A stored blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blob {
    /// Its name.
    pub digest: Digest,
    /// Its length in bytes.
    pub size: u64,
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The URL names no supported backend.
    #[error(
        "blob store URL {0:?} is not supported: use file://<dir>, s3://<bucket>[/<prefix>] or memory://"
    )]
    UnsupportedUrl(String),
    /// No blob with this digest.
    #[error("blob {0} does not exist")]
    NotFound(Digest),
    /// The stored bytes do not hash to their name: corruption, refused.
    #[error("blob {0} is corrupt: its content does not match its digest")]
    Corrupt(Digest),
    /// The content passed the size limit; nothing was stored.
    #[error("content exceeds the limit of {max_bytes} bytes")]
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// The content's own stream failed; nothing was stored.
    #[error("reading the content failed: {0}")]
    Source(Box<dyn std::error::Error + Send + Sync>),
    /// The object store failed.
    #[error("object store: {0}")]
    Storage(#[from] object_store::Error),
    /// Local spooling failed.
    #[error("spooling a blob locally failed: {0}")]
    Io(#[from] std::io::Error),
    /// A file given to [`BlobStore::put_files`] no longer hashes to its digest; it was not stored.
    #[error("{path} changed after it was hashed; it was not stored")]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// Holding a blob against garbage collection failed; nothing was stored under its name.
    #[error("holding the blob against garbage collection failed: {0}")]
    Hold(String),
    /// Reading a file given to [`BlobStore::put_files`], or writing it into a directory store,
    /// failed.
    #[error("storing {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Keeps blobs from garbage collection from before they are named until whatever names them
/// is committed. The blob store calls it with a blob's digest before it gives the blob its
/// name or finds it already named, so a collection either sees the hold or runs its deletes
/// before the blob is written (again).
pub trait Holder: Send + Sync {
    /// Holds `digests`; returns once no collection can take them.
    fn hold<'a>(
        &'a self,
        digests: &'a [Digest],
    ) -> futures::future::BoxFuture<'a, Result<(), BlobError>>;
}

/// A content-addressed store of blobs.
#[derive(Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    spool_dir: PathBuf,
    /// The directory of a `file://` store, which [`BlobStore::put_files`] writes directly.
    local: Option<PathBuf>,
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStore")
            .field("store", &self.store.to_string())
            .finish()
    }
}

impl BlobStore {
    /// Opens the store a URL names:
    /// * `file:///abs/dir` or `file://./rel/dir`: a directory, created if missing;
    /// * `s3://bucket[/prefix]?key=value…`: a bucket; keys are `object_store`'s S3 options
    ///   (`endpoint`, `region`, `allow_http`, …), and credentials come from the standard
    ///   `AWS_*` environment variables;
    /// * `memory://`: a store that lives as long as the process, for tests.
    ///
    /// Reads of large blobs are verified into temporary files under `spool_dir`.
    pub fn open(url: &str, spool_dir: PathBuf) -> Result<Self, BlobError> {
        let mut local = None;
        let store: Arc<dyn ObjectStore> = if url == "memory://" {
            Arc::new(object_store::memory::InMemory::new())
        } else if let Some(dir) = url.strip_prefix("file://") {
            if dir.is_empty() {
                return Err(BlobError::UnsupportedUrl(url.to_owned()));
            }
            std::fs::create_dir_all(dir)?;
            // The same directory `LocalFileSystem` resolves its paths against.
            local = Some(std::fs::canonicalize(dir)?);
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?)
        } else if let Some(rest) = url.strip_prefix("s3://") {
            open_s3(url, rest)?
        } else {
            return Err(BlobError::UnsupportedUrl(url.to_owned()));
        };
        Ok(BlobStore {
            store,
            spool_dir,
            local,
        })
    }

    /// The object-store path of a blob.
    pub fn location(digest: &Digest) -> Path {
        let hex = digest.to_hex();
        Path::from(format!("blobs/sha256/{}/{hex}", &hex[..2]))
    }

    /// The underlying object store, for maintenance (garbage collection) and tests.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The directory of a `file://` store.
    pub(crate) fn local_root(&self) -> Option<&std::path::Path> {
        self.local.as_deref()
    }

    /// Stores content that is already in memory, after `holder` holds its digest (see
    /// [`Holder`]).
    pub async fn put_bytes_held(
        &self,
        bytes: Bytes,
        holder: &dyn Holder,
    ) -> Result<Blob, BlobError> {
        holder.hold(&[Digest::of(&bytes)]).await?;
        self.put_bytes(bytes).await
    }

    /// Stores content that is already in memory.
    pub async fn put_bytes(&self, bytes: Bytes) -> Result<Blob, BlobError> {
        let blob = Blob {
            digest: Digest::of(&bytes),
            size: bytes.len() as u64,
        };
        self.put_final(&blob.digest, PutPayload::from(bytes))
            .await?;
        Ok(blob)
    }

    /// Streams content in, hashing it as it comes, and stores it under its digest. More than
    /// `max_bytes` is refused with [`BlobError::TooLarge`] as soon as the limit is passed; on
    /// any error nothing is stored under a final name.
    pub async fn put_stream<S, E>(&self, content: S, max_bytes: u64) -> Result<Blob, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.put_stream_inner(content, max_bytes, None).await
    }

    /// [`BlobStore::put_stream`], with `holder` holding the digest once it is known and before
    /// the blob gets its name: a blob of the same content already stored (and perhaps no
    /// longer referenced) cannot be collected between being found and being referenced.
    pub async fn put_stream_held<S, E>(
        &self,
        content: S,
        max_bytes: u64,
        holder: &dyn Holder,
    ) -> Result<Blob, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.put_stream_inner(content, max_bytes, Some(holder))
            .await
    }

    async fn put_stream_inner<S, E>(
        &self,
        content: S,
        max_bytes: u64,
        holder: Option<&dyn Holder>,
    ) -> Result<Blob, BlobError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut content = std::pin::pin!(content);
        let mut hasher = sha2::Sha256::new();
        let mut size: u64 = 0;
        let mut buffered: Vec<Bytes> = Vec::new();
        let mut buffered_len = 0usize;
        let mut upload: Option<(Path, WriteMultipart)> = None;

        let outcome: Result<(), BlobError> = async {
            while let Some(chunk) = content.next().await {
                let chunk = chunk.map_err(|error| BlobError::Source(error.into()))?;
                size += chunk.len() as u64;
                if size > max_bytes {
                    return Err(BlobError::TooLarge { max_bytes });
                }
                hasher.update(&chunk);
                match &mut upload {
                    Some((_, writer)) => {
                        writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                        writer.put(chunk);
                    }
                    None => {
                        buffered_len += chunk.len();
                        buffered.push(chunk);
                        if buffered_len > IN_MEMORY_MAX {
                            let staging =
                                Path::from(format!("staging/{}", uuid::Uuid::new_v4().simple()));
                            let multipart = self.store.put_multipart(&staging).await?;
                            let mut writer =
                                WriteMultipart::new_with_chunk_size(multipart, PART_SIZE);
                            for part in buffered.drain(..) {
                                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                                writer.put(part);
                            }
                            upload = Some((staging, writer));
                        }
                    }
                }
            }
            Ok(())
        }
        .await;

        if let Err(error) = outcome {
            if let Some((staging, writer)) = upload
                && let Err(abort) = writer.abort().await
            {
                tracing::warn!(%staging, error = %abort, "aborting a multipart upload failed; the staging object is left for garbage collection");
            }
            return Err(error);
        }

        let digest = Digest::from_bytes(hasher.finalize().into());
        let blob = Blob { digest, size };
        if let Some(holder) = holder
            && let Err(error) = holder.hold(&[digest]).await
        {
            if let Some((staging, writer)) = upload {
                let _ = writer.abort().await;
                let _ = self.store.delete(&staging).await;
            }
            return Err(error);
        }
        match upload {
            None => {
                self.put_final(&digest, buffered.into_iter().collect())
                    .await?
            }
            Some((staging, writer)) => {
                writer.finish().await?;
                let promoted = self.promote(&staging, &digest).await;
                if let Err(error) = self.store.delete(&staging).await {
                    tracing::warn!(%staging, %error, "removing a staging object failed; it is left for garbage collection");
                }
                promoted?;
            }
        }
        Ok(blob)
    }

    /// Writes a small blob create-only. An existing blob of the same digest is the same
    /// content, so "already exists" is success.
    async fn put_final(&self, digest: &Digest, payload: PutPayload) -> Result<(), BlobError> {
        let location = Self::location(digest);
        match self
            .store
            .put_opts(&location, payload.clone(), PutMode::Create.into())
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(
                object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. },
            ) => {
                // The backend cannot put create-only; the content is the digest's, so an
                // atomic overwrite stores the same bytes.
                self.store.put(&location, payload).await?;
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Moves a completed staging object to its final name without ever exposing a partial one.
    async fn promote(&self, staging: &Path, digest: &Digest) -> Result<(), BlobError> {
        let location = Self::location(digest);
        match self.store.copy_if_not_exists(staging, &location).await {
            Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(
                object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. },
            ) => {
                // Server-side copy is atomic; a blob already there holds the same bytes.
                self.store.copy(staging, &location).await?;
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Stores the blobs of local files that the store lacks, `parallel` at a time, and returns
    /// how many it wrote. Each file was hashed by the caller and must still hash to the digest
    /// given with it: one that does not is [`BlobError::Changed`] and is not stored. A file
    /// listed twice, or two files with one digest, is stored once.
    ///
    /// A directory store (`file://`) is written on a few threads of its own, in the layout its
    /// object store uses, each blob written unnamed and linked into place create-only (see
    /// `put_local_file`): thousands of small files, each one object-store call of several
    /// hand-offs between tasks and threads, would otherwise spend more time handing off than
    /// writing. Other stores check for each blob, then stream it in.
    pub async fn put_files(
        &self,
        files: Vec<(PathBuf, Digest)>,
        parallel: usize,
    ) -> Result<u64, BlobError> {
        let mut seen = std::collections::HashSet::new();
        let files: Vec<(PathBuf, Digest)> = files
            .into_iter()
            .filter(|(_, digest)| seen.insert(*digest))
            .collect();
        if let Some(root) = &self.local {
            let root = root.clone();
            return tokio::task::spawn_blocking(move || put_local_files(&root, &files))
                .await
                .map_err(|join| BlobError::Io(std::io::Error::other(join.to_string())))?;
        }
        let written: Vec<bool> = futures::stream::iter(files)
            .map(|(path, digest)| async move {
                if self.contains(&digest).await? {
                    return Ok(false);
                }
                let file =
                    tokio::fs::File::open(&path)
                        .await
                        .map_err(|source| BlobError::File {
                            path: path.clone(),
                            source,
                        })?;
                let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
                let stored = self.put_stream(stream, u64::MAX).await?;
                if stored.digest != digest {
                    // What was stored is a blob of other content under its own name: harmless.
                    return Err(BlobError::Changed { path });
                }
                Ok(true)
            })
            .buffer_unordered(parallel.max(1))
            .try_collect()
            .await?;
        Ok(written.into_iter().filter(|&written| written).count() as u64)
    }

    /// Whether a blob exists.
    pub async fn contains(&self, digest: &Digest) -> Result<bool, BlobError> {
        match self.store.head(&Self::location(digest)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Reads a blob and verifies it against its digest before handing out any byte.
    pub async fn get(&self, digest: &Digest) -> Result<VerifiedBlob, BlobError> {
        let result = match self.store.get(&Self::location(digest)).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Err(BlobError::NotFound(*digest)),
            Err(error) => return Err(error.into()),
        };
        let declared = result.meta.size;
        let mut stream = result.into_stream();
        let mut hasher = sha2::Sha256::new();
        let mut size: u64 = 0;
        let verified = if declared <= IN_MEMORY_MAX as u64 {
            let mut chunks = Vec::new();
            while let Some(chunk) = stream.try_next().await? {
                size += chunk.len() as u64;
                hasher.update(&chunk);
                chunks.push(chunk);
            }
            VerifiedBlob::Memory(concat(chunks))
        } else {
            std::fs::create_dir_all(&self.spool_dir)?;
            let file = tempfile::tempfile_in(&self.spool_dir)?;
            let mut file = tokio::fs::File::from_std(file);
            while let Some(chunk) = stream.try_next().await? {
                size += chunk.len() as u64;
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
            }
            file.flush().await?;
            file.seek(SeekFrom::Start(0)).await?;
            VerifiedBlob::Spooled { file, size }
        };
        let actual = Digest::from_bytes(hasher.finalize().into());
        if actual != *digest || size != declared {
            tracing::error!(%digest, %actual, "corrupt blob refused");
            return Err(BlobError::Corrupt(*digest));
        }
        Ok(verified)
    }
}

/// [`BlobStore::put_files`] for a directory store rooted at `root`: [`LOCAL_WRITERS`] threads
/// take files in turn; the first error stops them all.
fn put_local_files(root: &std::path::Path, files: &[(PathBuf, Digest)]) -> Result<u64, BlobError> {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let (next, written, failed) = (
        AtomicUsize::new(0),
        AtomicU64::new(0),
        AtomicBool::new(false),
    );
    // Cleared by the first writer that finds unnamed files refused here.
    let unnamed = AtomicBool::new(true);
    let threads = LOCAL_WRITERS.min(files.len() / 16 + 1);
    let errors: Vec<BlobError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut buffer = vec![0u8; 256 * 1024];
                    while !failed.load(Ordering::Relaxed) {
                        let (path, digest) = files.get(next.fetch_add(1, Ordering::Relaxed))?;
                        match put_local_file(root, path, digest, &mut buffer, &unnamed) {
                            Ok(true) => {
                                written.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(false) => {}
                            Err(error) => {
                                failed.store(true, Ordering::Relaxed);
                                return Some(error);
                            }
                        }
                    }
                    None
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|worker| {
                worker.join().unwrap_or_else(|_| {
                    Some(BlobError::Io(std::io::Error::other(
                        "a writer thread panicked",
                    )))
                })
            })
            .collect()
    });
    match errors.into_iter().next() {
        Some(error) => Err(error),
        None => Ok(written.into_inner()),
    }
}

/// Writes one file's blob into the directory store at `root` unless it is there, and returns
/// whether it wrote it.
///
/// The bytes go, hashed as they are copied, into an unnamed file (`O_TMPFILE`) in the blob's
/// directory, which is linked to its final name only once it matches the digest: no name ever
/// shows a partial blob, and a blob already under that name (another writer won) holds the
/// same bytes, so the link failing with "exists" is success and the unnamed file vanishes
/// when closed. A blob thus costs one directory entry where a named staging file costs three
/// operations (create it, link it, unlink it), and a writer that dies leaves nothing behind.
/// Where the file system refuses unnamed files or the kernel refuses to link one, `unnamed`
/// is cleared and this blob and every later one take [`put_local_staged`]'s path.
fn put_local_file(
    root: &std::path::Path,
    path: &std::path::Path,
    digest: &Digest,
    buffer: &mut [u8],
    unnamed: &std::sync::atomic::AtomicBool,
) -> Result<bool, BlobError> {
    use std::io::Seek;
    use std::sync::atomic::Ordering;
    let target = root.join(BlobStore::location(digest).as_ref());
    if std::fs::symlink_metadata(&target).is_ok() {
        return Ok(false);
    }
    let io = |source| BlobError::File {
        path: path.to_owned(),
        source,
    };
    let mut input = std::fs::File::open(path).map_err(io)?;
    if unnamed.load(Ordering::Relaxed) {
        let directory = target.parent().unwrap_or(root);
        let open = || {
            rustix::fs::open(
                directory,
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::TMPFILE
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(0o666),
            )
        };
        let opened = match open() {
            Err(rustix::io::Errno::NOENT) => {
                std::fs::create_dir_all(directory).map_err(io)?;
                open()
            }
            opened => opened,
        };
        // Any other refusal (no O_TMPFILE support: EOPNOTSUPP, EISDIR, EINVAL) falls back;
        // an error that is not about unnamed files repeats there and is reported.
        if let Ok(output) = opened {
            let mut output = std::fs::File::from(output);
            copy_verified(&mut input, &mut output, path, digest, buffer)?;
            match link_unnamed(&output, &target) {
                Ok(()) => return Ok(true),
                Err(rustix::io::Errno::EXIST) => return Ok(false),
                Err(_) => input.rewind().map_err(io)?,
            }
        }
        unnamed.store(false, Ordering::Relaxed);
    }
    put_local_staged(&target, input, path, digest, buffer)
}

/// Gives an unnamed file (opened with `O_TMPFILE`) the name `target`, create-only: EEXIST when
/// the name is taken. `AT_EMPTY_PATH` links the descriptor itself but needs
/// `CAP_DAC_READ_SEARCH` (refused with ENOENT or EPERM without it); the descriptor's
/// `/proc/self/fd` entry works for any user where `/proc` is mounted.
pub fn link_unnamed(file: &std::fs::File, target: &std::path::Path) -> rustix::io::Result<()> {
    use rustix::fs::{AtFlags, CWD, linkat};
    match linkat(file, "", CWD, target, AtFlags::EMPTY_PATH) {
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::PERM) => {
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
            linkat(CWD, proc.as_str(), CWD, target, AtFlags::SYMLINK_FOLLOW)
        }
        linked => linked,
    }
}

/// [`put_local_file`] where unnamed files are refused: the blob is copied to a staging name
/// beside its final one (ending in `#<digits>`, which listing ignores), linked to the final
/// name (create-only: an existing blob of that name holds the same bytes), and the staging
/// name removed.
fn put_local_staged(
    target: &std::path::Path,
    mut input: std::fs::File,
    path: &std::path::Path,
    digest: &Digest,
    buffer: &mut [u8],
) -> Result<bool, BlobError> {
    let io = |source| BlobError::File {
        path: path.to_owned(),
        source,
    };
    let mut attempt = 1u32;
    let (staging, mut output) = loop {
        let mut staging = target.as_os_str().to_owned();
        staging.push(format!("#{attempt}"));
        let staging = PathBuf::from(staging);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staging)
        {
            Ok(output) => break (staging, output),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => attempt += 1,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
            }
            Err(error) => return Err(io(error)),
        }
    };
    let copied = copy_verified(&mut input, &mut output, path, digest, buffer).and_then(|()| {
        drop(output);
        match std::fs::hard_link(&staging, target) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(io(error)),
        }
    });
    let removed = std::fs::remove_file(&staging);
    let written = copied?;
    removed.map_err(io)?;
    Ok(written)
}

/// Copies `input` (the file at `path`) to `output` through `buffer` while hashing it;
/// [`BlobError::Changed`] if the bytes do not hash to `digest`.
fn copy_verified(
    input: &mut std::fs::File,
    output: &mut std::fs::File,
    path: &std::path::Path,
    digest: &Digest,
    buffer: &mut [u8],
) -> Result<(), BlobError> {
    use std::io::{Read, Write};
    let io = |source| BlobError::File {
        path: path.to_owned(),
        source,
    };
    let mut hasher = sha2::Sha256::new();
    loop {
        let read = match input.read(buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(io(error)),
        };
        hasher.update(&buffer[..read]);
        output.write_all(&buffer[..read]).map_err(io)?;
    }
    if Digest::from_bytes(hasher.finalize().into()) != *digest {
        return Err(BlobError::Changed {
            path: path.to_owned(),
        });
    }
    Ok(())
}

fn open_s3(url: &str, rest: &str) -> Result<Arc<dyn ObjectStore>, BlobError> {
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    if bucket.is_empty() {
        return Err(BlobError::UnsupportedUrl(url.to_owned()));
    }
    crate::install_tls_provider();
    let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        let key = key
            .parse()
            .map_err(|_| BlobError::UnsupportedUrl(format!("{url}: unknown S3 option {key:?}")))?;
        builder = builder.with_config(key, value);
    }
    let store = builder.build()?;
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        Ok(Arc::new(store))
    } else {
        Ok(Arc::new(object_store::prefix::PrefixStore::new(
            store, prefix,
        )))
    }
}

fn concat(chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.into_iter().next().unwrap_or_default(),
        _ => {
            let mut joined = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
            for chunk in chunks {
                joined.extend_from_slice(&chunk);
            }
            Bytes::from(joined)
        }
    }
}

/// A blob whose bytes were checked against its digest.
#[derive(Debug)]
pub enum VerifiedBlob {
    /// Small blobs, held in memory.
    Memory(Bytes),
    /// Large blobs, in an unnamed temporary file that vanishes when dropped.
    Spooled {
        /// Positioned at the start.
        file: tokio::fs::File,
        /// Its length.
        size: u64,
    },
}

impl VerifiedBlob {
    /// Its length in bytes.
    pub fn size(&self) -> u64 {
        match self {
            VerifiedBlob::Memory(bytes) => bytes.len() as u64,
            VerifiedBlob::Spooled { size, .. } => *size,
        }
    }

    /// Its bytes as a stream of chunks.
    pub fn into_stream(self) -> BoxStream<'static, std::io::Result<Bytes>> {
        match self {
            VerifiedBlob::Memory(bytes) => futures::stream::once(async move { Ok(bytes) }).boxed(),
            VerifiedBlob::Spooled { file, .. } => {
                tokio_util::io::ReaderStream::with_capacity(file, 64 * 1024).boxed()
            }
        }
    }

    /// All its bytes in memory; for callers that know blobs are small (trees, manifests).
    pub async fn into_bytes(self) -> std::io::Result<Bytes> {
        match self {
            VerifiedBlob::Memory(bytes) => Ok(bytes),
            spooled => {
                let chunks: Vec<Bytes> = spooled.into_stream().try_collect().await?;
                Ok(concat(chunks))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// Where unnamed files are refused, the staged path keeps the same guarantees: the blob is
    /// stored whole under its final name, storing it again is success without a write, changed
    /// content is refused, and no staging name is left.
    #[test]
    fn the_staged_fallback_stores_once_and_leaves_no_staging_name() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().join("store");
        let (path, content) = (dir.path().join("file"), b"bytes copied in several reads");
        std::fs::write(&path, content).expect("write");
        let digest = Digest::of(content);
        let target = root.join(BlobStore::location(&digest).as_ref());
        let mut buffer = [0u8; 4];
        let refused = AtomicBool::new(false);

        let put = |buffer: &mut [u8]| put_local_file(&root, &path, &digest, buffer, &refused);
        assert!(put(&mut buffer).expect("first put writes"));
        assert!(!put(&mut buffer).expect("second put finds it"));
        let input = std::fs::File::open(&path).expect("open");
        let raced = put_local_staged(&target, input, &path, &digest, &mut buffer);
        assert!(
            !raced.expect("losing the link is success"),
            "nothing written"
        );
        assert_eq!(std::fs::read(&target).expect("read"), content);

        let other = Digest::of(b"other content");
        let error = put_local_file(&root, &path, &other, &mut buffer, &refused)
            .expect_err("content that does not match is refused");
        assert!(matches!(error, BlobError::Changed { .. }), "{error}");
        let other_target = root.join(BlobStore::location(&other).as_ref());
        assert!(!other_target.exists(), "nothing stored for a changed file");
        for directory in [&target, &other_target].map(|file| file.parent().expect("parent")) {
            let names: Vec<_> = std::fs::read_dir(directory)
                .into_iter()
                .flatten()
                .map(|entry| entry.expect("entry").file_name())
                .collect();
            assert!(names.len() <= 1, "only final names: {names:?}");
        }
    }
}
