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
use crate::local::{Check, Directory};

/// Blobs up to this size are verified in memory on read, and (to an object store) buffered
/// in memory and written with one create-only put; larger ones stream through a multipart
/// upload and are verified into a spool file on read, so memory stays bounded whatever the
/// size. A directory store streams every blob into a file of its own (see `local`).
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
    /// A `file://` store's directory, which every write goes to directly (see `local`): synced
    /// before it is named, and checked before an existing name counts as stored.
    local: Option<Arc<Directory>>,
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
            local = Some(Arc::new(Directory::new(std::fs::canonicalize(dir)?)));
            // Blobs are written by `local`; whatever else writes through the object store
            // (maintenance) is synced too.
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?.with_fsync(true))
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

    /// Watches the disks this store writes to (its directory, for a `file://` store, and its
    /// spool) for room again after one is found full; see [`plinth_kit::storage::watch`].
    pub fn watch_disks(&self) {
        use plinth_kit::error::Store;
        if let Some(local) = &self.local {
            plinth_kit::storage::watch(Store::Blobs, local.root().to_path_buf());
        }
        plinth_kit::storage::watch(Store::Spool, self.spool_dir.clone());
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
        self.local.as_deref().map(Directory::root)
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

    /// Stores content that is already in memory. A blob of that digest already stored is
    /// checked (size and digest) and replaced when it does not hold this content.
    pub async fn put_bytes(&self, bytes: Bytes) -> Result<Blob, BlobError> {
        let blob = Blob {
            digest: Digest::of(&bytes),
            size: bytes.len() as u64,
        };
        if let Some(local) = &self.local {
            let local = local.clone();
            tokio::task::spawn_blocking(move || local.put_bytes(&blob.digest, &bytes))
                .await
                .map_err(|join| BlobError::Io(std::io::Error::other(join.to_string())))??;
            return Ok(blob);
        }
        self.put_final(&blob.digest, blob.size, PutPayload::from(bytes))
            .await?;
        Ok(blob)
    }

    /// Streams content in, hashing it as it comes, and stores it under its digest. More than
    /// `max_bytes` is refused with [`BlobError::TooLarge`] as soon as the limit is passed; on
    /// any error nothing is stored under a final name. A blob of that digest already stored
    /// is checked (size and digest) and replaced when it does not hold this content.
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
        if let Some(local) = &self.local {
            return put_stream_local(local, content, max_bytes, holder).await;
        }
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
                self.put_final(&digest, size, buffered.into_iter().collect())
                    .await?
            }
            Some((staging, writer)) => {
                writer.finish().await?;
                let promoted = self.promote(&staging, &digest, size).await;
                if let Err(error) = self.store.delete(&staging).await {
                    tracing::warn!(%staging, %error, "removing a staging object failed; it is left for garbage collection");
                }
                promoted?;
            }
        }
        Ok(blob)
    }

    /// Writes a small blob create-only. An existing blob of the same name is kept when it
    /// holds this content (size and digest checked), and overwritten when it does not: a
    /// name alone does not prove the bytes (an object damaged by whatever wrote it).
    async fn put_final(
        &self,
        digest: &Digest,
        size: u64,
        payload: PutPayload,
    ) -> Result<(), BlobError> {
        let location = Self::location(digest);
        match self
            .store
            .put_opts(&location, payload.clone(), PutMode::Create.into())
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                if self.holds(digest, size).await? {
                    return Ok(());
                }
                tracing::warn!(%digest, "a stored blob is damaged (wrong size or content); overwriting it with the bytes just received");
                self.store.put(&location, payload).await?;
                Ok(())
            }
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

    /// Moves a completed staging object to its final name without ever exposing a partial one;
    /// a damaged object already under that name is overwritten (see [`BlobStore::put_final`]).
    async fn promote(&self, staging: &Path, digest: &Digest, size: u64) -> Result<(), BlobError> {
        let location = Self::location(digest);
        match self.store.copy_if_not_exists(staging, &location).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                if self.holds(digest, size).await? {
                    return Ok(());
                }
                tracing::warn!(%digest, "a stored blob is damaged (wrong size or content); overwriting it with the bytes just received");
                self.store.copy(staging, &location).await?;
                Ok(())
            }
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

    /// Whether the object store holds the blob whole: `size` bytes (a HEAD) that hash to
    /// `digest` (read back as a stream, never held whole).
    async fn holds(&self, digest: &Digest, size: u64) -> Result<bool, BlobError> {
        if !self.sized(digest, size).await? {
            return Ok(false);
        }
        let mut stream = match self.store.get(&Self::location(digest)).await {
            Ok(result) => result.into_stream(),
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(error) => return Err(error.into()),
        };
        let mut hasher = sha2::Sha256::new();
        let mut read = 0u64;
        while let Some(chunk) = stream.try_next().await? {
            read += chunk.len() as u64;
            hasher.update(&chunk);
        }
        Ok(read == size && Digest::from_bytes(hasher.finalize().into()) == *digest)
    }

    /// Whether the object store has the blob with `size` bytes (a HEAD): what a crash or a
    /// cut-short write gets wrong.
    async fn sized(&self, digest: &Digest, size: u64) -> Result<bool, BlobError> {
        match self.store.head(&Self::location(digest)).await {
            Ok(meta) => Ok(meta.size == size),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Stores the blobs of local files that the store lacks, `parallel` at a time, and returns
    /// how many it wrote. Each file was hashed by the caller and must still hash to the digest
    /// given with it: one that does not is [`BlobError::Changed`] and is not stored. A file
    /// listed twice, or two files with one digest, is stored once.
    ///
    /// A blob already stored counts when its size matches the file's (a stored blob damaged
    /// by a crash is empty or short, and is replaced); its bytes are not read back, since
    /// unchanged files are most of a rebuild's layer and reads verify every blob anyway.
    ///
    /// A directory store (`file://`) is written on a few threads of its own (see `local`):
    /// thousands of small files, each one object-store call of several hand-offs between
    /// tasks and threads, would otherwise spend more time handing off than writing. Other
    /// stores check for each blob, then stream it in.
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
        if let Some(local) = &self.local {
            let local = local.clone();
            return tokio::task::spawn_blocking(move || put_local_files(&local, &files))
                .await
                .map_err(|join| BlobError::Io(std::io::Error::other(join.to_string())))?;
        }
        let written: Vec<bool> = futures::stream::iter(files)
            .map(|(path, digest)| async move {
                let file =
                    tokio::fs::File::open(&path)
                        .await
                        .map_err(|source| BlobError::File {
                            path: path.clone(),
                            source,
                        })?;
                let size = file
                    .metadata()
                    .await
                    .map_err(|source| BlobError::File {
                        path: path.clone(),
                        source,
                    })?
                    .len();
                if self.sized(&digest, size).await? {
                    return Ok(false);
                }
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

    /// Whether the store answers at all (for readiness): one metadata request, present or not.
    pub async fn ping(&self) -> Result<(), BlobError> {
        self.contains(&Digest::of(b"")).await.map(|_| ())
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

/// [`BlobStore::put_files`] for a directory store: [`LOCAL_WRITERS`] threads take files in
/// turn; the first error stops them all.
fn put_local_files(local: &Directory, files: &[(PathBuf, Digest)]) -> Result<u64, BlobError> {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let (next, written, failed) = (
        AtomicUsize::new(0),
        AtomicU64::new(0),
        AtomicBool::new(false),
    );
    let threads = LOCAL_WRITERS.min(files.len() / 16 + 1);
    let errors: Vec<BlobError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut buffer = vec![0u8; 256 * 1024];
                    while !failed.load(Ordering::Relaxed) {
                        let (path, digest) = files.get(next.fetch_add(1, Ordering::Relaxed))?;
                        match local.put_file(path, digest, &mut buffer) {
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

/// [`BlobStore::put_stream`] for a directory store: the content streams into an unnamed file
/// (no size is held in memory), hashed as it comes, then is committed durably under its
/// digest (see `local`).
async fn put_stream_local<S, E>(
    local: &Arc<Directory>,
    content: S,
    max_bytes: u64,
    holder: Option<&dyn Holder>,
) -> Result<Blob, BlobError>
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let join =
        |error: tokio::task::JoinError| BlobError::Io(std::io::Error::other(error.to_string()));
    let opener = local.clone();
    let mut pending = tokio::task::spawn_blocking(move || opener.begin())
        .await
        .map_err(join)??;
    let mut file = tokio::fs::File::from_std(pending.file().try_clone()?);
    let mut content = std::pin::pin!(content);
    let mut hasher = sha2::Sha256::new();
    let mut size: u64 = 0;
    while let Some(chunk) = content.next().await {
        let chunk = chunk.map_err(|error| BlobError::Source(error.into()))?;
        size += chunk.len() as u64;
        if size > max_bytes {
            return Err(BlobError::TooLarge { max_bytes });
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await?;
    }
    file.flush().await?;
    drop(file);
    let digest = Digest::from_bytes(hasher.finalize().into());
    if let Some(holder) = holder {
        // On failure the unnamed file goes with `pending`.
        holder.hold(&[digest]).await?;
    }
    let committer = local.clone();
    tokio::task::spawn_blocking(move || committer.commit(pending, &digest, size, Check::Content))
        .await
        .map_err(join)??;
    Ok(Blob { digest, size })
}

/// How many times the S3 client retries a request that failed in a way that may pass.
const S3_RETRIES: usize = 4;
/// How long after a request's first attempt the S3 client stops retrying it.
const S3_RETRY_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

fn open_s3(url: &str, rest: &str) -> Result<Arc<dyn ObjectStore>, BlobError> {
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    if bucket.is_empty() {
        return Err(BlobError::UnsupportedUrl(url.to_owned()));
    }
    crate::install_tls_provider();
    // The client's own retries end within seconds, not its default minutes: a request
    // answers `unavailable` (retry shortly) rather than hanging past the gateway's deadline,
    // and a build waits an outage out with its own retries, its lease renewed meanwhile.
    let retry = object_store::RetryConfig {
        max_retries: S3_RETRIES,
        retry_timeout: S3_RETRY_WITHIN,
        ..object_store::RetryConfig::default()
    };
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry);
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

impl BlobError {
    /// Whether the failure may pass: the object store did not answer (refused, reset, timed
    /// out) or answered that it is overloaded or down (429, 5xx). Retrying later may succeed.
    pub fn may_pass(&self) -> bool {
        let BlobError::Storage(error) = self else {
            return false;
        };
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(error) = next {
            if let Some(http) = error.downcast_ref::<object_store::client::HttpError>() {
                use object_store::client::HttpErrorKind;
                return matches!(
                    http.kind(),
                    HttpErrorKind::Connect
                        | HttpErrorKind::Request
                        | HttpErrorKind::Timeout
                        | HttpErrorKind::Interrupted
                );
            }
            if let Some(io) = error.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind;
                if matches!(
                    io.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::TimedOut
                        | ErrorKind::BrokenPipe
                ) {
                    return true;
                }
            }
            // The client's answer to a status after its own retries; its type is private,
            // its text is `Server returned non-2xx status code: <status>`. A request that
            // could not be sent (a connection the store closed at once, as one going away
            // does) is reported in text only, in the same way.
            let text = error.to_string();
            if text.contains("HTTP error: error sending request") {
                return true;
            }
            if let Some((_, status)) = text.split_once("status code: ")
                && (status.starts_with('5') || status.starts_with("429"))
            {
                return true;
            }
            next = error.source();
        }
        false
    }

    /// The store a failure to write was in: the spool for local spooling, else the blob store.
    pub fn store(&self) -> plinth_kit::error::Store {
        match self {
            BlobError::Io(_) => plinth_kit::error::Store::Spool,
            _ => plinth_kit::error::Store::Blobs,
        }
    }

    /// The error a caller sees for a failure it does not handle itself: `unavailable` when
    /// it may pass, `insufficient_storage` naming the store when a disk is full, else
    /// `internal`.
    pub fn to_plinth(&self) -> plinth_kit::PlinthError {
        if self.may_pass() {
            plinth_kit::PlinthError::unavailable("the blob store did not answer", self)
        } else {
            plinth_kit::PlinthError::internal_in(self.store(), self)
        }
    }
}
