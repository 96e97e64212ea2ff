//! The gRPC face of the source service: requests are checked into domain types on receipt,
//! the index and blob store do the work, and the answers go back out.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use plinth_blobs::{BlobError, BlobStore};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::source::v1 as pb;
use tonic::{Request, Response, Status, Streaming};

use crate::archive::{ArchiveError, Limits};
use crate::gc::Work;
use crate::git::{self, GitError, GitPolicy};
use crate::import::{self, ImportError, Imported};
use crate::links;
use crate::paths::SourcePath;
use crate::persistence::{
    DigestSet, FailedCondition, Index, IndexEntry, IndexError, Kind, Origin, WriteCondition,
};
use crate::tree;

/// Bytes per message when streaming a file out (well under gRPC's 4 MiB default).
const READ_CHUNK: usize = 256 * 1024;

/// Limits on what the source accepts.
#[derive(Debug, Clone, Copy)]
pub struct SourceLimits {
    /// Largest file, bytes actually received or inflated.
    pub max_file_bytes: u64,
    /// Largest import: the archive, and everything it inflates to.
    pub max_import_bytes: u64,
    /// Most members an import may have.
    pub max_import_entries: u64,
}

impl Default for SourceLimits {
    fn default() -> Self {
        SourceLimits {
            max_file_bytes: 64 * 1024 * 1024,
            max_import_bytes: 4 * 1024 * 1024 * 1024,
            max_import_entries: 200_000,
        }
    }
}

/// The `plinth.source.v1.SourceService` implementation.
pub struct Source {
    index: Index,
    blobs: BlobStore,
    spool_dir: PathBuf,
    limits: SourceLimits,
    git: Arc<GitPolicy>,
    /// How long holds against garbage collection live unless renewed.
    hold_ttl: std::time::Duration,
}

impl Source {
    pub fn new(
        index: Index,
        blobs: BlobStore,
        spool_dir: PathBuf,
        limits: SourceLimits,
        git: GitPolicy,
        hold_ttl: std::time::Duration,
    ) -> Self {
        Source {
            index,
            blobs,
            spool_dir,
            limits,
            git: Arc::new(git),
            hold_ttl,
        }
    }

    /// Work that holds what it writes until it is named (see `gc`).
    fn work(&self) -> Work {
        Work::start(&self.index, self.hold_ttl)
    }

    fn archive_limits(&self) -> Limits {
        Limits {
            max_entries: self.limits.max_import_entries,
            max_total_bytes: self.limits.max_import_bytes,
            max_file_bytes: self.limits.max_file_bytes,
        }
    }
}

fn parse_path(path: &str) -> Result<SourcePath, PlinthError> {
    SourcePath::parse(path).map_err(|error| PlinthError::invalid(error.to_string()))
}

/// Entries a page of a tree holds when the caller names no limit.
const DEFAULT_TREE_PAGE: u32 = 100;
/// Most entries a page of a tree holds.
const MAX_TREE_PAGE: u32 = 1000;

/// Which page of a tree to answer: entries in byte order of their paths (not the database's
/// collation, so the order and the cursor agree on every backend), after the path the cursor
/// names. The cursor is that path, marked and wrapped so clients treat it as opaque.
struct TreePage {
    limit: usize,
    after: Option<String>,
}

impl TreePage {
    /// Checks a request as the catalog checks its lists: a limit of 0 means the default, more
    /// than the maximum or a cursor this list did not hand out is `environment_invalid`.
    fn new(limit: u32, after: &str) -> Result<Self, PlinthError> {
        use base64::Engine;
        let limit = match limit {
            0 => DEFAULT_TREE_PAGE,
            n if n > MAX_TREE_PAGE => {
                return Err(PlinthError::invalid(format!(
                    "limit: at most {MAX_TREE_PAGE} items a page; follow `next` for the rest"
                ))
                .with_detail(serde_json::json!({ "max": MAX_TREE_PAGE })));
            }
            n => n,
        };
        let refused = || {
            PlinthError::invalid(
                "after: not a cursor this list handed out; pass the `next` of the previous page",
            )
        };
        let after = match after {
            "" => None,
            text => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(text)
                    .map_err(|_| refused())?;
                let text = String::from_utf8(bytes).map_err(|_| refused())?;
                let path = text.strip_prefix("path:").ok_or_else(refused)?;
                if path.is_empty() {
                    return Err(refused());
                }
                Some(path.to_owned())
            }
        };
        Ok(TreePage {
            limit: limit as usize,
            after,
        })
    }

    /// This page of `entries` (sorted in byte order of their paths) and the cursor of the
    /// next page (none on the last).
    fn slice<'a>(&self, entries: &'a [IndexEntry]) -> (&'a [IndexEntry], Option<String>) {
        use base64::Engine;
        let start = match &self.after {
            None => 0,
            Some(after) => {
                entries.partition_point(|entry| entry.path.as_str().as_bytes() <= after.as_bytes())
            }
        };
        let rest = &entries[start..];
        if rest.len() > self.limit {
            let page = &rest[..self.limit];
            let next = page.last().map(|last| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(format!("path:{}", last.path.as_str()))
            });
            (page, next)
        } else {
            (rest, None)
        }
    }
}

fn index_error(error: IndexError) -> PlinthError {
    match error {
        IndexError::NotFound(path) => PlinthError::new(
            ErrorCode::EnvironmentNotFound,
            format!("{path} does not exist in the environment's source"),
        ),
        IndexError::Conflict { path, reason } => {
            PlinthError::new(ErrorCode::Conflict, format!("{path}: {reason}"))
        }
        IndexError::Link { path, reason } => PlinthError::invalid(format!("{path}: {reason}")),
        IndexError::QuotaExceeded { limit, used, .. } => {
            plinth_kit::quota::exceeded(plinth_kit::quota::Quota::StoredBytes, limit, used)
        }
        IndexError::OtherScope { environment } => PlinthError::new(
            ErrorCode::EnvironmentNotFound,
            format!("environment {environment} was not found"),
        ),
        lapsed @ IndexError::HoldsLapsed => {
            PlinthError::new(ErrorCode::Unavailable, lapsed.to_string())
        }
        IndexError::PreconditionFailed {
            path,
            current,
            failed,
        } => precondition_failed(&path, current.as_ref(), failed),
        other => PlinthError::internal(&other),
    }
}

/// `precondition_failed`, naming the file's current entity tag (the gateway's `ETag` is the
/// digest in quotes) so the caller can decide without another read.
fn precondition_failed(
    path: &str,
    current: Option<&plinth_blobs::Digest>,
    failed: FailedCondition,
) -> PlinthError {
    let etag = current.map(|digest| format!("\"{digest}\""));
    let message = match (failed, &etag) {
        (FailedCondition::Match, Some(etag)) => format!(
            "{path}: the file changed since you read it: its ETag is now {etag}; read it again, then retry with that If-Match; nothing was written"
        ),
        (FailedCondition::Match, None) => format!(
            "{path}: the file changed since you read it: there is no file there now; leave out If-Match to create it; nothing was written"
        ),
        (FailedCondition::NoneMatch, Some(etag)) => format!(
            "{path}: a file is already there (its ETag is {etag}) and If-None-Match forbids replacing it; leave out If-None-Match to replace it; nothing was written"
        ),
        (FailedCondition::NoneMatch, None) => {
            format!("{path}: the write's If-None-Match does not hold; nothing was written")
        }
    };
    PlinthError::new(ErrorCode::PreconditionFailed, message)
        .with_detail(serde_json::json!({ "etag": etag }))
}

impl From<pb::DigestCondition> for DigestSet {
    fn from(condition: pb::DigestCondition) -> Self {
        DigestSet {
            any: condition.any,
            digests: condition.digests,
        }
    }
}

impl From<pb::WritePrecondition> for WriteCondition {
    fn from(precondition: pb::WritePrecondition) -> Self {
        WriteCondition {
            if_match: precondition.if_match.map(DigestSet::from),
            if_none_match: precondition.if_none_match.map(DigestSet::from),
        }
    }
}

impl Source {
    /// Records the scope a change names as its source's (see `Index::bind_scope`); a change
    /// that names none (a caller from before scopes were sent) changes nothing in the ledger
    /// of a source not yet bound.
    async fn bind(&self, environment: &str, scope: &str) -> Result<(), PlinthError> {
        if scope.is_empty() {
            return Ok(());
        }
        self.index
            .bind_scope(environment, scope)
            .await
            .map_err(index_error)
    }
}

fn too_large(max_bytes: u64, what: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::FileTooLarge,
        format!("{what} exceeds the limit of {max_bytes} bytes; nothing was stored"),
    )
    .with_detail(serde_json::json!({ "max_bytes": max_bytes }))
}

fn blob_error(error: BlobError) -> PlinthError {
    match error {
        BlobError::TooLarge { max_bytes } => too_large(max_bytes, "the file"),
        BlobError::Source(cause) => PlinthError::invalid(format!(
            "the upload ended before the whole body arrived: {cause}"
        )),
        other => other.to_plinth(),
    }
}

/// How long a caller is told to wait before retrying an import whose repository's server did
/// not answer.
const REMOTE_RETRY_AFTER_MS: u64 = 30_000;

fn import_error(error: ImportError) -> PlinthError {
    match error {
        ImportError::ArchiveTooLarge { max } => too_large(max, "the archive"),
        ImportError::Archive(ArchiveError::TooLarge { max }) => {
            too_large(max, "the archive's contents")
        }
        ImportError::Archive(ArchiveError::FileTooLarge { path, max }) => PlinthError::new(
            ErrorCode::FileTooLarge,
            format!("{path} exceeds the per-file limit of {max} bytes; nothing was imported"),
        )
        .with_detail(serde_json::json!({ "max_bytes": max, "path": path })),
        ImportError::Archive(ArchiveError::Io(error)) => PlinthError::internal(&error),
        ImportError::Archive(ArchiveError::Sink(cause)) => PlinthError::internal(&*cause),
        ImportError::Archive(refused) => {
            PlinthError::invalid(format!("archive refused, nothing was imported: {refused}"))
        }
        ImportError::Upload(message) => PlinthError::invalid(format!(
            "the upload ended before the whole body arrived: {message}"
        )),
        ImportError::Git(GitError::TooLarge { max }) => PlinthError::new(
            ErrorCode::FileTooLarge,
            format!(
                "the git fetch passed the limit of {max} bytes (source.git_max_fetch_bytes) and was stopped; nothing was imported"
            ),
        )
        .with_detail(serde_json::json!({ "max_bytes": max })),
        ImportError::Git(GitError::Unreachable(why)) => PlinthError::new(
            ErrorCode::RemoteUnreachable,
            format!(
                "the repository's server could not be reached ({why}); nothing was imported. \
                 Check the URL's host and port, or retry later: the fault is the server's or the \
                 network's, not the request's"
            ),
        )
        .with_detail(serde_json::json!({ plinth_kit::error::RETRY_AFTER_MS: REMOTE_RETRY_AFTER_MS })),
        ImportError::Git(timed_out @ GitError::TimedOut { seconds }) => PlinthError::new(
            ErrorCode::RemoteTimeout,
            format!(
                "{timed_out}. Retry later, or import an archive of the repository instead; an \
                 operator may raise source.git_fetch_timeout_seconds"
            ),
        )
        .with_detail(serde_json::json!({
            "timeout_seconds": seconds,
            plinth_kit::error::RETRY_AFTER_MS: REMOTE_RETRY_AFTER_MS,
        })),
        ImportError::Git(refused) => PlinthError::invalid(format!("git import refused: {refused}")),
        ImportError::Blob(error) => blob_error(error),
        other => PlinthError::internal(&other),
    }
}

fn entry_to_proto(entry: &IndexEntry, size: u64) -> pb::Entry {
    pb::Entry {
        path: entry.path.to_string(),
        kind: match entry.kind {
            Kind::File => pb::EntryKind::File,
            Kind::Directory => pb::EntryKind::Directory,
            Kind::Symlink => pb::EntryKind::Symlink,
        }
        .into(),
        size,
        executable: entry.executable,
        digest: entry
            .digest
            .map(|digest| digest.to_string())
            .unwrap_or_default(),
        target: entry.target.clone().unwrap_or_default(),
    }
}

impl From<Origin> for pb::Origin {
    fn from(origin: Origin) -> Self {
        pb::Origin {
            commit: origin.commit,
            r#ref: origin.reference,
            describe: origin.describe,
            dirty: origin.dirty,
            history_incomplete: origin.history_incomplete,
            recorded_at: origin.recorded_at,
            commits: origin.commits,
        }
    }
}

/// The longest description or ref a pushed origin may name (git's own are far shorter).
const MAX_ORIGIN_TEXT: usize = 1024;

/// The origin an archive import's header names (a push of a git checkout), checked: what the
/// caller may say of it (`commit`, `ref`, `describe`, `dirty`, `commits`); the rest is the
/// service's own.
fn pushed_origin(origin: pb::Origin) -> Result<Origin, PlinthError> {
    let commit = origin.commit.to_ascii_lowercase();
    if !matches!(commit.len(), 40 | 64) || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PlinthError::invalid(format!(
            "origin: the commit must be a full commit id (40 or 64 hex digits), not {:?}",
            origin.commit
        )));
    }
    let text = |what: &str, value: &str, empty_allowed: bool| {
        if value.is_empty() && !empty_allowed {
            return Err(PlinthError::invalid(format!("origin: {what} is empty")));
        }
        if value.len() > MAX_ORIGIN_TEXT || value.chars().any(|c| c.is_control()) {
            return Err(PlinthError::invalid(format!(
                "origin: {what} must be at most {MAX_ORIGIN_TEXT} bytes without control characters"
            )));
        }
        Ok(())
    };
    text("describe", &origin.describe, false)?;
    text("ref", &origin.r#ref, true)?;
    Ok(Origin {
        commit,
        reference: origin.r#ref,
        describe: origin.describe.trim().to_owned(),
        dirty: origin.dirty,
        history_incomplete: false,
        recorded_at: 0,
        commits: origin.commits,
    })
}

/// What a file write or an import fills: refused while one of them is short of room (see
/// [`plinth_kit::storage::keep_room`]), so deletes and collection can still run.
const NEW_CONTENT: &[plinth_kit::storage::Store] = &[
    plinth_kit::storage::Store::Blobs,
    plinth_kit::storage::Store::Database,
    plinth_kit::storage::Store::Spool,
];

impl Source {
    /// A blob's bytes, read whole (a tree), verified against its digest.
    async fn blob_bytes(&self, digest: &plinth_blobs::Digest) -> Result<Bytes, PlinthError> {
        self.blobs
            .get(digest)
            .await
            .map_err(|error| error.to_plinth())?
            .into_bytes()
            .await
            .map_err(|error| PlinthError::internal(&error))
    }

    /// The entries of a snapshot (`tree`: a build's source tree), read from the blob store
    /// (verified against its digest).
    async fn snapshot_entries(&self, tree: &str) -> Result<Vec<IndexEntry>, PlinthError> {
        let digest: plinth_blobs::Digest = tree
            .parse()
            .map_err(|_| PlinthError::invalid(format!("tree: {tree:?} is not a sha256 digest")))?;
        let bytes = self.blob_bytes(&digest).await?;
        tree::decode(&bytes).map_err(|error| {
            PlinthError::new(
                ErrorCode::Internal,
                format!("the snapshot {tree} is not a source tree: {error}"),
            )
        })
    }

    /// The file or directory `path` names. UHP §3 refuses a path naming anything else, so a
    /// link is never followed here: a path that is a link, or goes through one, is
    /// `environment_invalid` (builds and sessions keep the link and see what it points at).
    async fn regular_entry(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<IndexEntry, PlinthError> {
        match self
            .index
            .get(environment, path)
            .await
            .map_err(index_error)?
        {
            Some(entry) if entry.kind == Kind::Symlink => Err(PlinthError::invalid(format!(
                "{path} is a symlink: {}",
                links::NOT_SERVED
            ))),
            Some(entry) => Ok(entry),
            None => match self.link_on_the_way(environment, path).await? {
                Some(link) => Err(through_link(path, &link)),
                None => Err(index_error(IndexError::NotFound(path.to_string()))),
            },
        }
    }

    /// The link among `path`'s ancestors, if one is in the way: no entry is ever beneath a
    /// link, so a path through one names nothing, and saying which link is in the way is
    /// the better answer.
    async fn link_on_the_way(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<Option<SourcePath>, PlinthError> {
        for ancestor in path.ancestors() {
            match self
                .index
                .get(environment, &ancestor)
                .await
                .map_err(index_error)?
            {
                Some(entry) if entry.kind == Kind::Symlink => return Ok(Some(ancestor)),
                Some(entry) if entry.kind == Kind::Directory => {}
                _ => break,
            }
        }
        Ok(None)
    }
}

/// The files API's refusal of a path through `link`.
fn through_link(path: &SourcePath, link: &SourcePath) -> PlinthError {
    PlinthError::invalid(format!(
        "{path} goes through the symlink {link}: {}",
        links::NOT_SERVED
    ))
}

/// The bytes of a client stream after its header, as a byte stream.
fn chunks_after_header<T, F>(
    stream: Streaming<T>,
    chunk_of: F,
) -> impl Stream<Item = Result<Bytes, Status>> + Send
where
    T: Send + 'static,
    F: Fn(T) -> Option<Bytes> + Send + 'static,
{
    stream.filter_map(move |message| {
        let item = match message {
            Ok(message) => chunk_of(message).map(Ok),
            Err(status) => Some(Err(status)),
        };
        std::future::ready(item)
    })
}

type ReadFileStream = Pin<Box<dyn Stream<Item = Result<pb::ReadFileResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::source_service_server::SourceService for Source {
    #[tracing::instrument(name = "source.list_tree", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn list_tree(
        &self,
        request: Request<pb::ListTreeRequest>,
    ) -> Result<Response<pb::ListTreeResponse>, Status> {
        let request = request.into_inner();
        let page = TreePage::new(request.limit, &request.after)?;
        let mut entries = if request.tree.is_empty() {
            self.index
                .list(&request.environment_id)
                .await
                .map_err(index_error)?
        } else {
            self.snapshot_entries(&request.tree).await?
        };
        if !request.links {
            entries.retain(|entry| entry.kind != Kind::Symlink);
        }
        entries.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
        // A directory's size is what every file beneath it holds, so the whole index is read
        // to size the page's directories; the answer is what stays bounded.
        let mut directory_sizes: HashMap<&str, u64> = HashMap::new();
        for entry in entries.iter().filter(|entry| entry.kind == Kind::File) {
            for (index, _) in entry.path.as_str().match_indices('/') {
                *directory_sizes
                    .entry(&entry.path.as_str()[..index])
                    .or_default() += entry.size;
            }
        }
        let (on_page, next) = page.slice(&entries);
        let entries = on_page
            .iter()
            .map(|entry| {
                let size = match entry.kind {
                    Kind::File => entry.size,
                    Kind::Symlink => 0,
                    Kind::Directory => directory_sizes
                        .get(entry.path.as_str())
                        .copied()
                        .unwrap_or(0),
                };
                entry_to_proto(entry, size)
            })
            .collect();
        Ok(Response::new(pb::ListTreeResponse {
            entries,
            has_more: next.is_some(),
            next: next.unwrap_or_default(),
        }))
    }

    type ReadFileStream = ReadFileStream;

    #[tracing::instrument(name = "source.read_file", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn read_file(
        &self,
        request: Request<pb::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let request = request.into_inner();
        let path = parse_path(&request.path)?;
        let entry = self.regular_entry(&request.environment_id, &path).await?;
        let digest = match (entry.kind, entry.digest) {
            (Kind::File, Some(digest)) => digest,
            _ => {
                return Err(PlinthError::new(
                    ErrorCode::Conflict,
                    format!("{path} is a directory; list it with GET …/files"),
                )
                .into());
            }
        };
        let blob = self
            .blobs
            .get(&digest)
            .await
            .map_err(|error| error.to_plinth())?;
        let header = pb::ReadFileResponse {
            entry: Some(entry_to_proto(&entry, entry.size)),
            chunk: bytes::Bytes::new(),
        };
        let body = blob.into_stream().flat_map(|chunk| {
            let messages: Vec<Result<pb::ReadFileResponse, Status>> = match chunk {
                Ok(bytes) => (0..bytes.len())
                    .step_by(READ_CHUNK)
                    .map(|start| {
                        Ok(pb::ReadFileResponse {
                            entry: None,
                            chunk: bytes.slice(start..(start + READ_CHUNK).min(bytes.len())),
                        })
                    })
                    .collect(),
                Err(error) => vec![Err(PlinthError::internal(&error).into())],
            };
            futures::stream::iter(messages)
        });
        let stream = futures::stream::once(async move { Ok(header) }).chain(body);
        Ok(Response::new(Box::pin(stream)))
    }

    #[tracing::instrument(name = "source.write_file", skip_all, fields(environment = tracing::field::Empty))]
    async fn write_file(
        &self,
        request: Request<Streaming<pb::WriteFileRequest>>,
    ) -> Result<Response<pb::Entry>, Status> {
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(pb::WriteFileRequest {
                message: Some(pb::write_file_request::Message::Header(header)),
            }) => header,
            _ => return Err(PlinthError::invalid("a write starts with its header").into()),
        };
        let path = parse_path(&header.path)?;
        tracing::Span::current().record("environment", header.environment_id.as_str());
        plinth_kit::storage::keep_room(NEW_CONTENT)?;
        self.bind(&header.environment_id, &header.scope).await?;
        let condition = header
            .precondition
            .map(WriteCondition::from)
            .unwrap_or_default();
        if condition != WriteCondition::default() {
            // Refused before a byte of the body is taken, when it already does not hold; the
            // check that decides is the one in the write's transaction below.
            let existing = self
                .index
                .get(&header.environment_id, &path)
                .await
                .map_err(index_error)?;
            let current = existing
                .as_ref()
                .filter(|entry| entry.kind == Kind::File)
                .and_then(|entry| entry.digest.as_ref());
            if let Err(failed) = condition.check(current) {
                return Err(precondition_failed(path.as_str(), current, failed).into());
            }
        }
        let chunks = chunks_after_header(stream, |message: pb::WriteFileRequest| {
            match message.message {
                Some(pb::write_file_request::Message::Chunk(chunk)) => Some(chunk),
                _ => None,
            }
        });
        let max = self.limits.max_file_bytes;
        let work = self.work();
        let blob = self
            .blobs
            .put_stream_held(chunks, max, &work)
            .await
            .map_err(blob_error)?;
        let entry = self
            .index
            .write_file_checked(
                &header.environment_id,
                &path,
                blob.digest,
                blob.size,
                header.executable,
                work.fence(),
                &condition,
            )
            .await
            .map_err(index_error)?;
        work.finish().await;
        Ok(Response::new(entry_to_proto(&entry, entry.size)))
    }

    #[tracing::instrument(name = "source.make_directory", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn make_directory(
        &self,
        request: Request<pb::MakeDirectoryRequest>,
    ) -> Result<Response<pb::Entry>, Status> {
        let request = request.into_inner();
        let path = parse_path(&request.path)?;
        self.bind(&request.environment_id, &request.scope).await?;
        let entry = self
            .index
            .make_directory(&request.environment_id, &path)
            .await
            .map_err(index_error)?;
        Ok(Response::new(entry_to_proto(&entry, 0)))
    }

    #[tracing::instrument(name = "source.delete", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let request = request.into_inner();
        let path = parse_path(&request.path)?;
        self.bind(&request.environment_id, &request.scope).await?;
        let (files, directories) = match self.index.delete(&request.environment_id, &path).await {
            Ok(counts) => counts,
            Err(IndexError::NotFound(what)) => {
                return Err(
                    match self.link_on_the_way(&request.environment_id, &path).await? {
                        Some(link) => through_link(&path, &link),
                        None => index_error(IndexError::NotFound(what)),
                    }
                    .into(),
                );
            }
            Err(error) => return Err(index_error(error).into()),
        };
        Ok(Response::new(pb::DeleteResponse { files, directories }))
    }

    #[tracing::instrument(name = "source.import", skip_all, fields(environment = tracing::field::Empty))]
    async fn import(
        &self,
        request: Request<Streaming<pb::ImportRequest>>,
    ) -> Result<Response<pb::ImportReport>, Status> {
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(pb::ImportRequest {
                message: Some(pb::import_request::Message::Header(header)),
            }) => header,
            _ => return Err(PlinthError::invalid("an import starts with its header").into()),
        };
        tracing::Span::current().record("environment", header.environment_id.as_str());
        plinth_kit::storage::keep_room(NEW_CONTENT)?;
        let pushed = match (&header.git, header.origin.clone()) {
            (Some(_), Some(_)) => {
                return Err(PlinthError::invalid(
                    "a git import finds its origin itself; an origin is named only with an archive",
                )
                .into());
            }
            (None, Some(origin)) => Some(pushed_origin(origin)?),
            (_, None) => None,
        };
        self.bind(&header.environment_id, &header.scope).await?;
        let work = self.work();
        let mut imported: Imported = match &header.git {
            Some(source) => git::import(
                &self.blobs,
                &self.spool_dir,
                self.archive_limits(),
                &self.git,
                &source.url,
                &source.r#ref,
                &work,
            )
            .await
            .map_err(import_error)?,
            None => {
                let chunks =
                    chunks_after_header(stream, |message: pb::ImportRequest| {
                        match message.message {
                            Some(pb::import_request::Message::Chunk(chunk)) => Some(chunk),
                            _ => None,
                        }
                    });
                import::import_archive(
                    &self.blobs,
                    &self.spool_dir,
                    self.archive_limits(),
                    chunks,
                    Arc::new(work.clone()),
                )
                .await
                .map_err(import_error)?
            }
        };
        let mut origin = imported.origin.take().or(pushed);
        if let Some(origin) = &mut origin {
            origin.recorded_at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| {
                    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
                });
        }
        match &origin {
            Some(origin) => {
                self.index
                    .apply_git_import_held(
                        &header.environment_id,
                        header.replace,
                        &imported.entries,
                        work.fence(),
                        origin,
                    )
                    .await
            }
            None => {
                self.index
                    .apply_import_held(
                        &header.environment_id,
                        header.replace,
                        &imported.entries,
                        work.fence(),
                    )
                    .await
            }
        }
        .map_err(index_error)?;
        work.finish().await;
        let (files, directories, bytes) = imported.counts();
        let symlinks = imported.links();
        let skipped = imported.skipped.values().sum();
        tracing::info!(
            files,
            directories,
            bytes,
            symlinks,
            skipped,
            warnings = imported.warnings.len(),
            "import landed"
        );
        Ok(Response::new(pb::ImportReport {
            files,
            directories,
            bytes,
            skipped,
            skipped_by_reason: imported.skipped.into_iter().collect(),
            stripped_wrapper: imported.stripped_wrapper,
            symlinks,
            origin: origin.map(pb::Origin::from),
            warnings: imported.warnings,
        }))
    }

    #[tracing::instrument(name = "source.snapshot", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<pb::SnapshotResponse>, Status> {
        let entries = self
            .index
            .list(&request.get_ref().environment_id)
            .await
            .map_err(index_error)?;
        let encoded = tree::encode(&entries).map_err(|error| PlinthError::internal(&error))?;
        // The tree and every file it names are held until the build that names the tree is
        // queued (the caller's next step): the files may leave the index meanwhile. The holds
        // lapse by themselves.
        let work = self.work();
        let files: Vec<plinth_blobs::Digest> =
            entries.iter().filter_map(|entry| entry.digest).collect();
        work.hold_blobs(&files)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        let blob = self
            .blobs
            .put_bytes_held(encoded.into(), &work)
            .await
            .map_err(|error| error.to_plinth())?;
        work.leave();
        let files = entries.iter().filter(|entry| entry.kind == Kind::File);
        Ok(Response::new(pb::SnapshotResponse {
            tree_digest: blob.digest.to_string(),
            files: files.clone().count() as u64,
            bytes: files.map(|entry| entry.size).sum(),
        }))
    }

    #[tracing::instrument(name = "source.stats", skip_all)]
    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let stats = self
            .index
            .stats(&request.get_ref().environment_ids)
            .await
            .map_err(index_error)?;
        Ok(Response::new(pb::StatsResponse {
            stats: stats
                .into_iter()
                .map(|(id, stats)| {
                    (
                        id,
                        pb::FileStats {
                            count: stats.files,
                            bytes: stats.bytes,
                        },
                    )
                })
                .collect(),
        }))
    }

    #[tracing::instrument(name = "source.drop_environment", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn drop_environment(
        &self,
        request: Request<pb::DropEnvironmentRequest>,
    ) -> Result<Response<pb::DropEnvironmentResponse>, Status> {
        let request = request.into_inner();
        self.bind(&request.environment_id, &request.scope).await?;
        self.index
            .drop_environment(&request.environment_id)
            .await
            .map_err(index_error)?;
        Ok(Response::new(pb::DropEnvironmentResponse {}))
    }

    #[tracing::instrument(name = "source.record_layer", skip_all, fields(environment = %request.get_ref().environment_id, version = request.get_ref().version))]
    async fn record_layer(
        &self,
        request: Request<pb::RecordLayerRequest>,
    ) -> Result<Response<pb::RecordLayerResponse>, Status> {
        let request = request.into_inner();
        if request.scope.is_empty() {
            return Err(PlinthError::invalid("scope: required").into());
        }
        let digest: plinth_blobs::Digest = request.layer_tree.parse().map_err(|_| {
            PlinthError::invalid(format!(
                "layer_tree: {:?} is not a sha256 digest",
                request.layer_tree
            ))
        })?;
        // The tree is read from the blob store (verified) once per record; its file blobs,
        // each once, are what the layer holds.
        let bytes = self.blob_bytes(&digest).await?;
        let tree = plinth_blobs::tree::Tree::decode(&bytes).map_err(|error| {
            PlinthError::invalid(format!("layer_tree {}: {error}", request.layer_tree))
        })?;
        let mut blobs = std::collections::BTreeMap::new();
        for entry in &tree.entries {
            if let (Some(file), Some(size)) = (entry.file_digest(), entry.size) {
                blobs.insert(file.to_string(), size);
            }
        }
        let recorded = self
            .index
            .record_layer(
                &request.scope,
                &request.environment_id,
                request.version,
                request.attempt,
                &request.layer_tree,
                &blobs,
            )
            .await
            .map_err(index_error)?;
        let stored_bytes = self
            .index
            .stored_bytes(&request.scope)
            .await
            .map_err(index_error)?;
        Ok(Response::new(pb::RecordLayerResponse {
            stored_bytes,
            recorded,
        }))
    }

    #[tracing::instrument(name = "source.forget_layer", skip_all, fields(environment = %request.get_ref().environment_id, version = request.get_ref().version))]
    async fn forget_layer(
        &self,
        request: Request<pb::ForgetLayerRequest>,
    ) -> Result<Response<pb::ForgetLayerResponse>, Status> {
        let request = request.into_inner();
        let forgotten = self
            .index
            .forget_layer(&request.environment_id, request.version, request.attempt)
            .await
            .map_err(index_error)?;
        Ok(Response::new(pb::ForgetLayerResponse { forgotten }))
    }

    #[tracing::instrument(name = "source.get_origin", skip_all, fields(environment = %request.get_ref().environment_id))]
    async fn get_origin(
        &self,
        request: Request<pb::GetOriginRequest>,
    ) -> Result<Response<pb::GetOriginResponse>, Status> {
        let origin = self
            .index
            .origin(&request.get_ref().environment_id)
            .await
            .map_err(index_error)?;
        Ok(Response::new(pb::GetOriginResponse {
            origin: origin.map(pb::Origin::from),
        }))
    }

    #[tracing::instrument(name = "source.usage", skip_all)]
    async fn usage(
        &self,
        request: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        let scope = request.into_inner().scope;
        let stored_bytes = self.index.stored_bytes(&scope).await.map_err(index_error)?;
        Ok(Response::new(pb::UsageResponse {
            stored_bytes,
            limit: self.index.stored_bytes_quota(&scope),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the gateway reads off the wire: the error as a client of the REST API gets it.
    fn as_received(error: ImportError) -> PlinthError {
        PlinthError::from_status(&import_error(error).into())
    }

    #[test]
    fn a_fetch_past_its_cap_reaches_the_api_as_file_too_large_with_the_cap() {
        let received = as_received(ImportError::Git(GitError::TooLarge { max: 65_536 }));
        assert_eq!(received.code, ErrorCode::FileTooLarge);
        assert_eq!(received.code.http_status(), 413);
        assert_eq!(
            received.detail,
            Some(serde_json::json!({ "max_bytes": 65_536 }))
        );
        assert!(
            received.message.contains("source.git_max_fetch_bytes"),
            "{}",
            received.message
        );
    }

    #[test]
    fn a_redirect_reaches_the_api_as_a_refusal_that_asks_for_the_final_url() {
        let received = as_received(ImportError::Git(GitError::Redirected { status: 301 }));
        assert_eq!(received.code, ErrorCode::EnvironmentInvalid);
        assert!(
            received.message.contains("redirect (HTTP 301)")
                && received.message.contains("final URL"),
            "{}",
            received.message
        );
    }
}
