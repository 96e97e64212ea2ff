//! Imports: an archive streamed in, or a git repository read (see `git`), turned into index
//! entries whose contents are already in the blob store. Nothing touches the index here; the
//! caller lands the entries in one transaction, so an import that fails anywhere changes
//! nothing (its blobs are unreferenced and left for garbage collection). Each blob is held
//! against collection (a [`Holder`], `gc::Work` in the service) before it is stored, until
//! the caller's entries land.
//!
//! Memory stays bounded whatever the archive's size: the archive is spooled to disk, members
//! are read on a blocking thread, small files travel to the uploaders under a byte budget,
//! and large files stream through a channel.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use plinth_blobs::{Blob, BlobError, BlobStore, Digest, Holder};
use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::archive::{self, ArchiveError, Entry, Limits};
use crate::links;
use crate::persistence::{IndexEntry, Kind};

/// Files up to this size are read whole and uploaded concurrently; larger ones stream.
const SMALL_FILE: usize = 4 * 1024 * 1024;
/// Bytes of small files in flight between the reader and the uploaders at once.
const IN_FLIGHT_BYTES: usize = 32 * 1024 * 1024;
/// Concurrent uploads of small files (object stores reward parallelism on small objects).
const UPLOADERS: usize = 16;
/// Chunk size when streaming a large member.
const CHUNK: usize = 1024 * 1024;
/// Small files held against garbage collection in one transaction, at most (each such
/// transaction is a commit, an fsync on SQLite: a few large ones cost far less than many).
const HOLD_BATCH: usize = 256;
/// How long the uploaders wait for more small files to hold with those they have.
const HOLD_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// What an import produced, before it lands.
#[derive(Debug, Default)]
pub struct Imported {
    /// Files, directories and symlinks, paths relative to the environment root.
    pub entries: Vec<IndexEntry>,
    /// Members dropped, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Whether a single wrapping directory was stripped.
    pub stripped_wrapper: bool,
    /// Where a git import's files came from; `None` for archives.
    pub origin: Option<crate::persistence::Origin>,
    /// What the caller should know although the import lands (history or tags not fetched).
    pub warnings: Vec<String>,
}

impl Imported {
    /// Files, directories (named or implied by a path beneath them) and bytes of the files.
    /// Directories are counted by borrowed prefixes of the entries' paths, never copies.
    pub fn counts(&self) -> (u64, u64, u64) {
        let mut files = 0;
        let mut bytes = 0;
        let mut directories: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for entry in &self.entries {
            let path = entry.path.as_str();
            directories.extend(path.match_indices('/').map(|(at, _)| &path[..at]));
            match entry.kind {
                Kind::File => {
                    files += 1;
                    bytes += entry.size;
                }
                Kind::Directory => {
                    directories.insert(path);
                }
                Kind::Symlink => {}
            }
        }
        (files, directories.len() as u64, bytes)
    }

    /// Symlinks kept.
    pub fn links(&self) -> u64 {
        self.entries
            .iter()
            .filter(|entry| entry.kind == Kind::Symlink)
            .count() as u64
    }

    /// Drops, and counts as `symlink`, every link whose target could leave the root from
    /// where the link finally lands (see `links`). Readers check as they go; this is the
    /// check on final paths, after a wrapping directory was stripped.
    pub fn drop_escaping_links(&mut self) {
        let before = self.entries.len();
        self.entries.retain(|entry| {
            entry.kind != Kind::Symlink
                || entry.target.as_deref().is_some_and(|target| {
                    links::kept_target(&entry.path, target.as_bytes()).is_some()
                })
        });
        for _ in self.entries.len()..before {
            self.skip(archive::SkipReason::Symlink.as_str());
        }
    }

    /// Strips one directory that wraps everything (the shape of a repository archive), so
    /// the project's root is the environment's root.
    pub fn strip_wrapper(&mut self) {
        let Some(first) = self.entries.first() else {
            return;
        };
        let top = first.path.first_component().to_owned();
        let mut nested = false;
        for entry in &self.entries {
            if entry.path.as_str() == top {
                if entry.kind != Kind::Directory {
                    return;
                }
            } else if entry.path.first_component() == top {
                nested = true;
            } else {
                return;
            }
        }
        if !nested {
            return;
        }
        self.entries = std::mem::take(&mut self.entries)
            .into_iter()
            .filter_map(|entry| {
                let path = entry.path.strip_first_component()?;
                Some(IndexEntry { path, ..entry })
            })
            .collect();
        self.stripped_wrapper = true;
    }

    /// Counts a dropped member.
    pub fn skip(&mut self, reason: &str) {
        *self.skipped.entry(reason.to_owned()).or_default() += 1;
    }
}

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The archive was refused.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The archive itself is larger than the import limit.
    #[error("the archive is larger than the import limit of {max} bytes")]
    ArchiveTooLarge {
        /// The limit.
        max: u64,
    },
    /// The upload stream failed.
    #[error("the upload ended early: {0}")]
    Upload(String),
    /// Storing a blob failed.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// Spooling failed.
    #[error("spooling the archive failed: {0}")]
    Io(#[from] std::io::Error),
    /// A git import was refused or failed.
    #[error(transparent)]
    Git(#[from] GitError),
    /// A worker died.
    #[error("an import worker failed: {0}")]
    Worker(String),
}

/// Why a git import was refused (`crate::git` fetches; the error is an import's, so it
/// lives beside `ImportError`).
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The URL is not allowed.
    #[error("{0}")]
    Refused(String),
    /// The server answered with a redirect, which is never followed.
    #[error(
        "the server answered with a redirect (HTTP {status}), which git imports do not follow; give the repository's final URL"
    )]
    Redirected {
        /// The HTTP status.
        status: u16,
    },
    /// The fetch wrote more than the policy allows; it was stopped.
    #[error(
        "the repository's fetch passed the limit of {max} bytes (source.git_max_fetch_bytes) and was stopped; nothing was imported"
    )]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// The repository's server could not be reached for reasons of its own: its name does
    /// not resolve, its address refuses or drops the connection, or it answered with a server
    /// error. Not the caller's fault; a retry may pass.
    #[error("{0}")]
    Unreachable(String),
    /// The repository's server did not finish answering within the fetch deadline
    /// (`source.git_fetch_timeout_seconds`); the fetch was stopped.
    #[error(
        "the repository's server did not finish answering within {seconds} s (source.git_fetch_timeout_seconds) and the fetch was stopped; nothing was imported"
    )]
    TimedOut {
        /// The deadline, in seconds.
        seconds: u64,
    },
    /// `git` failed.
    #[error("git failed: {0}")]
    Failed(String),
}

/// Spools `body` (at most `limits.max_total_bytes`) and reads it as an archive. Every blob
/// is held by `holder` before it is stored (see `gc`).
pub async fn import_archive<S, E>(
    blobs: &BlobStore,
    spool_dir: &Path,
    limits: Limits,
    body: S,
    holder: Arc<dyn Holder>,
) -> Result<Imported, ImportError>
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: std::fmt::Display,
{
    std::fs::create_dir_all(spool_dir)?;
    let spool = tempfile::tempfile_in(spool_dir)?;
    let mut writer = tokio::fs::File::from_std(spool.try_clone()?);
    let mut body = std::pin::pin!(body);
    let mut received: u64 = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|error| ImportError::Upload(error.to_string()))?;
        received += chunk.len() as u64;
        if received > limits.max_total_bytes {
            return Err(ImportError::ArchiveTooLarge {
                max: limits.max_total_bytes,
            });
        }
        writer.write_all(&chunk).await?;
    }
    writer.flush().await?;
    drop(writer);
    let mut spool = spool;
    std::io::Seek::rewind(&mut spool)?;
    read_spooled(blobs, limits, spool, holder).await
}

enum Upload {
    Small {
        digest: Digest,
        bytes: Bytes,
        _budget: OwnedSemaphorePermit,
    },
    Large {
        chunks: mpsc::Receiver<Result<Bytes, std::io::Error>>,
        done: oneshot::Sender<Result<Blob, BlobError>>,
        max_bytes: u64,
    },
}

async fn read_spooled(
    blobs: &BlobStore,
    limits: Limits,
    spool: std::fs::File,
    holder: Arc<dyn Holder>,
) -> Result<Imported, ImportError> {
    // Room for a whole batch of holds; memory is bounded by the byte budget, not by this.
    let (uploads, mut queue) = mpsc::channel::<Upload>(HOLD_BATCH);
    let budget = Arc::new(Semaphore::new(IN_FLIGHT_BYTES / 1024));
    let runtime = tokio::runtime::Handle::current();

    let uploader_blobs = blobs.clone();
    let uploader = plinth_kit::tasks::spawn(async move {
        let slots = Arc::new(Semaphore::new(UPLOADERS));
        let mut running = tokio::task::JoinSet::new();
        let mut batch = Vec::with_capacity(HOLD_BATCH);
        while queue.recv_many(&mut batch, HOLD_BATCH).await > 0 {
            // Small files that arrive within a moment of each other are held together; a
            // large one goes at once (the reader is feeding it).
            let deadline = tokio::time::Instant::now() + HOLD_WAIT;
            while batch.len() < HOLD_BATCH
                && !batch
                    .iter()
                    .any(|upload| matches!(upload, Upload::Large { .. }))
            {
                let more = batch.len();
                match tokio::time::timeout_at(
                    deadline,
                    queue.recv_many(&mut batch, HOLD_BATCH - more),
                )
                .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            // The small files that arrived together are held in one transaction.
            let small: Vec<Digest> = batch
                .iter()
                .filter_map(|upload| match upload {
                    Upload::Small { digest, .. } => Some(*digest),
                    Upload::Large { .. } => None,
                })
                .collect();
            if !small.is_empty() {
                holder.hold(&small).await?;
            }
            for upload in batch.drain(..) {
                let blobs = uploader_blobs.clone();
                match upload {
                    Upload::Small { bytes, _budget, .. } => {
                        let slot = slots
                            .clone()
                            .acquire_owned()
                            .await
                            .map_err(|e| BlobError::Source(e.into()))?;
                        running.spawn(async move {
                            let result = blobs.put_bytes(bytes).await.map(|_| ());
                            drop((slot, _budget));
                            result
                        });
                    }
                    Upload::Large {
                        chunks,
                        done,
                        max_bytes,
                    } => {
                        let holder = holder.clone();
                        running.spawn(async move {
                            let stream = tokio_stream::wrappers::ReceiverStream::new(chunks);
                            let result = blobs
                                .put_stream_held(stream, max_bytes, holder.as_ref())
                                .await;
                            let failed = result.as_ref().err().map(|error| error.to_string());
                            let _ = done.send(result);
                            match failed {
                                Some(message) => Err(BlobError::Source(message.into())),
                                None => Ok(()),
                            }
                        });
                    }
                }
                // Surface failures early instead of after the whole archive.
                while let Some(finished) = running.try_join_next() {
                    finished.map_err(|e| BlobError::Source(e.to_string().into()))??;
                }
            }
        }
        while let Some(finished) = running.join_next().await {
            finished.map_err(|e| BlobError::Source(e.to_string().into()))??;
        }
        Ok::<(), BlobError>(())
    });

    let reader = tokio::task::spawn_blocking(move || {
        let mut imported = Imported::default();
        // Small contents already sent to the uploaders: a content met again (empty files,
        // licences, `__init__.py`s) is stored once. 32 bytes per distinct content.
        let mut sent: HashSet<Digest> = HashSet::new();
        let mut sink = |entry: Entry<'_>| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            match entry {
                Entry::Directory { path } => imported.entries.push(IndexEntry::directory(path)),
                Entry::Symlink { path, target } => {
                    imported.entries.push(IndexEntry::symlink(path, target));
                }
                Entry::Skipped { reason, .. } => imported.skip(reason.as_str()),
                Entry::File {
                    path,
                    executable,
                    content,
                } => {
                    let blob = upload_member(
                        &runtime,
                        &uploads,
                        &budget,
                        &mut sent,
                        content,
                        limits.max_file_bytes,
                    )?;
                    imported.entries.push(IndexEntry {
                        path,
                        kind: Kind::File,
                        digest: Some(blob.digest),
                        size: blob.size,
                        executable,
                        target: None,
                    });
                }
            }
            Ok(())
        };
        let result = archive::read_archive(spool, &limits, &mut sink);
        drop(uploads);
        result.map(|()| imported)
    });

    let read = reader
        .await
        .map_err(|error| ImportError::Worker(error.to_string()))?;
    let uploaded = uploader
        .await
        .map_err(|error| ImportError::Worker(error.to_string()))?;
    let mut imported = read?;
    uploaded?;
    imported.strip_wrapper();
    imported.drop_escaping_links();
    Ok(imported)
}

/// Reads one member on the blocking thread and hands it to the uploaders; returns its blob
/// (digest and size) once its bytes are all read (small files) or stored (large files).
fn upload_member(
    runtime: &tokio::runtime::Handle,
    uploads: &mpsc::Sender<Upload>,
    budget: &Arc<Semaphore>,
    sent: &mut HashSet<Digest>,
    content: &mut dyn Read,
    max_file_bytes: u64,
) -> Result<Blob, Box<dyn std::error::Error + Send + Sync>> {
    let mut head = Vec::new();
    content.take(SMALL_FILE as u64 + 1).read_to_end(&mut head)?;
    if head.len() <= SMALL_FILE {
        let blob = Blob {
            digest: Digest::of(&head),
            size: head.len() as u64,
        };
        if !sent.insert(blob.digest) {
            return Ok(blob);
        }
        let kib = u32::try_from(head.len() / 1024 + 1).unwrap_or(u32::MAX);
        let permit = runtime.block_on(budget.clone().acquire_many_owned(kib))?;
        let bytes = Bytes::from(head);
        uploads
            .blocking_send(Upload::Small {
                digest: blob.digest,
                bytes,
                _budget: permit,
            })
            .map_err(|_| "the uploaders stopped")?;
        return Ok(blob);
    }
    let (chunks, receiver) = mpsc::channel(4);
    let (done, result) = oneshot::channel();
    uploads
        .blocking_send(Upload::Large {
            chunks: receiver,
            done,
            max_bytes: max_file_bytes,
        })
        .map_err(|_| "the uploaders stopped")?;
    let mut next = Some(Bytes::from(head));
    loop {
        let chunk = match next.take() {
            Some(chunk) => chunk,
            None => {
                let mut buffer = vec![0u8; CHUNK];
                let read = match content.read(&mut buffer) {
                    Ok(read) => read,
                    Err(error) => {
                        // Tell the upload to abandon its staging object, then report.
                        let _ = chunks.blocking_send(Err(std::io::Error::other(error.to_string())));
                        return Err(Box::new(error));
                    }
                };
                if read == 0 {
                    break;
                }
                buffer.truncate(read);
                Bytes::from(buffer)
            }
        };
        if chunks.blocking_send(Ok(chunk)).is_err() {
            break;
        }
    }
    drop(chunks);
    let blob = result
        .blocking_recv()
        .map_err(|_| "the uploader stopped")??;
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::SourcePath;

    fn dir(path: &str) -> IndexEntry {
        IndexEntry::directory(SourcePath::parse(path).expect("path"))
    }

    fn file(path: &str) -> IndexEntry {
        IndexEntry {
            path: SourcePath::parse(path).expect("path"),
            kind: Kind::File,
            digest: Some(Digest::of(path.as_bytes())),
            size: 1,
            executable: false,
            target: None,
        }
    }

    fn paths(imported: &Imported) -> Vec<&str> {
        imported.entries.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn one_wrapping_directory_is_stripped() {
        let mut imported = Imported {
            entries: vec![
                dir("repo-main"),
                file("repo-main/README.md"),
                dir("repo-main/src"),
                file("repo-main/src/a.py"),
            ],
            ..Imported::default()
        };
        imported.strip_wrapper();
        assert!(imported.stripped_wrapper);
        assert_eq!(paths(&imported), ["README.md", "src", "src/a.py"]);
    }

    #[test]
    fn nothing_is_stripped_unless_one_directory_wraps_everything() {
        for entries in [
            vec![file("a/x"), file("b/y")],
            vec![file("README"), file("src/a")],
            vec![file("only")],
            vec![dir("empty")],
            vec![file("a"), file("a/b")],
        ] {
            let mut imported = Imported {
                entries: entries.clone(),
                ..Imported::default()
            };
            imported.strip_wrapper();
            assert!(!imported.stripped_wrapper);
            assert_eq!(imported.entries, entries);
        }
    }
}
