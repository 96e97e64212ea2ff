//! `/v1/environments/{id}/files`, `/directories` and `/import` (UHP §3, §3.1) over the
//! source service. Every call first asks the catalog whether the environment exists in the
//! caller's scope; bodies stream through in both directions, so memory stays bounded
//! whatever the file size.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as catalog;
use plinth_proto::source::v1 as pb;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::conditional::{self, ReadAnswer};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::json::{self, JsonBody};
use crate::http::paging::Page;
use crate::rest::environments::EnvironmentIdParam;
use crate::runtime::Services;
use axum::extract::FromRef;

/// Largest chunk sent to the source in one gRPC message.
const CHUNK: usize = 1024 * 1024;

/// The file routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(list_files))
        .routes(routes!(read_file, write_file, delete_path))
        .routes(routes!(make_directory))
        .routes(routes!(import))
}

/// One file or directory of a source.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileEntry {
    /// Relative to the environment's root.
    #[schema(example = "scripts/run.py")]
    pub path: String,
    /// `file` or `directory`; `symlink` only in a tree asked for with `links=true` (a link
    /// whose target stays inside the root: builds and sessions see what it points at, and
    /// the files API refuses to read it or a path through it).
    #[serde(rename = "type")]
    #[schema(example = "file")]
    pub kind: &'static str,
    /// A file's bytes; a directory's: the bytes of every file beneath it.
    pub size: u64,
    /// Whether a file is executable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executable: Option<bool>,
    /// A file's content digest, `sha256:<64 hex>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// A symlink's target, relative to the link's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "../docs/README.md")]
    pub target: Option<String>,
}

impl TryFrom<pb::Entry> for FileEntry {
    type Error = plinth_proto::UnknownValue;

    fn try_from(entry: pb::Entry) -> Result<Self, Self::Error> {
        let kind = pb::EntryKind::from_wire(entry.kind)?;
        let file = kind == pb::EntryKind::File;
        let symlink = kind == pb::EntryKind::Symlink;
        Ok(FileEntry {
            path: entry.path,
            kind: kind.label(),
            size: entry.size,
            executable: file.then_some(entry.executable),
            digest: file.then_some(entry.digest),
            target: symlink.then_some(entry.target),
        })
    }
}

/// `GET /v1/environments/{id}/files`.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileTree {
    /// Always `list`.
    pub object: &'static str,
    /// Files and directories (and symlinks, with `links=true`), sorted by path (byte order).
    pub data: Vec<FileEntry>,
    /// Whether more entries follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// `DELETE /v1/environments/{id}/files/{path}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedPath {
    /// What was removed.
    pub path: String,
    /// Always true.
    pub deleted: bool,
    /// Files removed.
    pub files: u64,
    /// Directories removed.
    pub directories: u64,
}

/// `POST /v1/environments/{id}/directories`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a JSON object with path")]
pub struct MakeDirectory {
    /// The directory to make, with its parents.
    #[schema(example = "assets/brand")]
    pub path: String,
}

/// `GET …/files` query: a page, and whether links are listed.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TreeQuery {
    /// At most this many entries: default 100, from 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// The `next` of the previous page; left out for the first page. Opaque: a value this
    /// list did not hand out is `400 environment_invalid`.
    #[param(max_length = 256, min_length = 1)]
    pub after: Option<String>,
    /// List the source's symlinks too (`type: symlink`, with `target`). Left out, the tree
    /// is its files and directories, as UHP §3 describes it: links are kept in builds and
    /// sessions, and the files API serves neither them nor a path through them.
    #[param(default = false)]
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub links: Option<bool>,
}

/// `PUT …/files/{path}` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WriteQuery {
    /// Sets the executable bit; left out, an existing file keeps its bit and a new one is
    /// not executable.
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub executable: Option<bool>,
}

/// `POST …/import` query, for archive bodies. The values' patterns are in the document's
/// rules (`openapi::server_rules`).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// Clear the source first.
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub replace: Option<bool>,
    /// An archive of a git checkout (what `plinth push` sends from one): its commit's full id.
    /// With `describe`, it is recorded as a git import's origin is, and builds give installers
    /// the version it describes (setuptools-scm, hatch-vcs). Not with a JSON body.
    pub commit: Option<String>,
    /// With `commit`: the checkout's branch (empty or left out when detached).
    #[serde(rename = "ref")]
    #[param(rename = "ref")]
    pub reference: Option<String>,
    /// With `commit`: `git describe --tags --always --match '*[0-9]*'` of the commit.
    pub describe: Option<String>,
    /// With `commit`: whether the checkout had uncommitted changes to tracked files.
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub dirty: Option<bool>,
    /// With `commit`: the commits reaching it, `git rev-list --count`.
    pub commits: Option<u64>,
}

impl ImportQuery {
    /// The origin the query names, or `None`; a part of one without `commit` and `describe`
    /// is refused.
    fn origin(&self) -> Result<Option<pb::Origin>, PlinthError> {
        let named = self.commit.is_some()
            || self.reference.is_some()
            || self.describe.is_some()
            || self.dirty.is_some()
            || self.commits.is_some();
        match (&self.commit, &self.describe) {
            (Some(commit), Some(describe)) => Ok(Some(pb::Origin {
                commit: commit.clone(),
                r#ref: self.reference.clone().unwrap_or_default(),
                describe: describe.clone(),
                dirty: self.dirty.unwrap_or(false),
                commits: self.commits.unwrap_or(0),
                ..pb::Origin::default()
            })),
            _ if named => Err(PlinthError::invalid(
                "query: a checkout's origin names both commit and describe (ref, dirty and commits with them)",
            )),
            _ => Ok(None),
        }
    }
}

/// `POST …/import` with a JSON body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a JSON object with git and replace")]
pub struct GitImport {
    /// The repository.
    pub git: GitSource,
    /// Clear the source first.
    #[serde(default)]
    pub replace: bool,
}

/// A git repository to import.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a JSON object with url and ref")]
pub struct GitSource {
    /// `https://…` (other schemes only where configuration allows).
    #[schema(example = "https://github.com/example/content-studio")]
    pub url: String,
    /// Branch, tag or commit; the default branch when left out.
    #[serde(default, rename = "ref")]
    pub reference: Option<String>,
}

/// What an import landed.
#[derive(Debug, Serialize, ToSchema)]
pub struct ImportReport {
    /// Files written.
    pub files: u64,
    /// Directories made.
    pub directories: u64,
    /// Bytes of the files written.
    pub bytes: u64,
    /// Members dropped (links, devices, unsafe paths, submodules).
    pub skipped: u64,
    /// Members dropped, by reason: `symlink`, `hard_link`, `device`, `fifo`, `unsafe_path`,
    /// `submodule`, `other`.
    pub skipped_by_reason: std::collections::BTreeMap<String, u64>,
    /// Whether a single wrapping directory was stripped.
    pub stripped_wrapper: bool,
    /// Symlinks kept: their targets stay inside the root (links that could leave it are in
    /// `skipped`). Left out when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub symlinks: u64,
    /// A git import: the commit's full id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// A git import: the ref asked for (empty: the default branch).
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// A git import: `git describe --tags --always --match '*[0-9]*'` of the commit (`v1.2.3`,
    /// `v1.2.3-4-gabc1234`, or the abbreviated commit when no tag with a digit reaches it).
    /// Builds give installers a version from it (`SETUPTOOLS_SCM_PRETEND_VERSION`). An archive
    /// that named its commit (`plinth push` of a checkout) answers `commit`, `ref` and
    /// `describe` as it named them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub describe: Option<String>,
    /// An archive that named its commit: whether the checkout had uncommitted changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty: Option<bool>,
    /// What the caller should know although the import landed, one sentence each: a git
    /// import whose history or tags could not be fetched (its `describe` is then the commit
    /// alone, and the version builds derive from it not the project's). Left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The environment exists in the caller's scope, or the request ends here.
async fn check_environment(state: &Services, caller: &Caller, id: &str) -> Result<(), ApiError> {
    state
        .catalog()
        .get_environment(catalog::GetEnvironmentRequest {
            scope: caller.scope.clone(),
            id: id.to_owned(),
        })
        .await?;
    Ok(())
}

/// A request body as a stream of chunks no larger than [`CHUNK`]. A body that fails midway
/// ends the stream with an error instead of ending it cleanly, so a cut-off upload is never
/// mistaken for a complete one.
fn body_chunks(body: Body) -> impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static {
    body.into_data_stream().flat_map(|frame| {
        let pieces: Vec<Result<Bytes, axum::Error>> = match frame {
            Ok(bytes) => (0..bytes.len())
                .step_by(CHUNK)
                .map(|start| Ok(bytes.slice(start..(start + CHUNK).min(bytes.len()))))
                .collect(),
            Err(error) => vec![Err(error)],
        };
        futures::stream::iter(pieces)
    })
}

/// Sends `header` then the body's chunks on a client stream. If the body fails, the call is
/// abandoned (cancelled on the wire) rather than ended, so the source stores nothing.
async fn stream_to_source<M, T, Fut>(
    header: M,
    body: Body,
    chunk: fn(Bytes) -> M,
    call: impl FnOnce(tokio_stream::wrappers::ReceiverStream<M>) -> Fut,
) -> Result<T, ApiError>
where
    M: Send + 'static,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let (messages, receiver) = tokio::sync::mpsc::channel::<M>(4);
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let forwarder = plinth_kit::tasks::spawn(async move {
        if messages.send(header).await.is_err() {
            return;
        }
        let mut body = std::pin::pin!(body_chunks(body));
        let error = loop {
            match body.next().await {
                Some(Ok(bytes)) => {
                    if messages.send(chunk(bytes)).await.is_err() {
                        return;
                    }
                }
                Some(Err(error)) => break error,
                None => return,
            }
        };
        let _ = failed_tx.send(error.to_string());
        // Dropping `messages` now would end the stream and look like a complete body;
        // holding it until this task is aborted keeps the call open.
        let _held = messages;
        std::future::pending::<()>().await;
    });
    let outcome = tokio::select! {
        result = call(tokio_stream::wrappers::ReceiverStream::new(receiver)) => result.map(tonic::Response::into_inner).map_err(ApiError::from),
        Ok(reason) = failed_rx => Err(PlinthError::invalid(format!(
            "the request body ended before it was complete: {reason}; nothing was stored"
        )).into()),
    };
    forwarder.abort();
    outcome
}

/// The tree of an environment's source: every file and directory, with sizes; its symlinks
/// too with `links=true`.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "The environment's id"), TreeQuery),
    responses(
        (status = 200, description = "One page of the files and directories, sorted by path", body = FileTree),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_files(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    query: Result<Query<TreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<FileTree>, ApiError> {
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let page = Page::new(query.limit, query.after)?;
    check_environment(&state, &caller, &id).await?;
    // The source pages the tree itself, so neither its answer nor this one grows with the
    // number of files.
    let tree = state
        .source()
        .list_tree(pb::ListTreeRequest {
            environment_id: id,
            limit: page.limit,
            after: page.after,
            links: query.links.unwrap_or(false),
            tree: String::new(),
        })
        .await?
        .into_inner();
    Ok(Json(FileTree::from_page(tree)?))
}

impl FileTree {
    /// One page of a tree as the source service listed it.
    pub(crate) fn from_page(tree: pb::ListTreeResponse) -> Result<Self, ApiError> {
        Ok(FileTree {
            object: "list",
            data: tree
                .entries
                .into_iter()
                .map(FileEntry::try_from)
                .collect::<Result<_, _>>()?,
            has_more: tree.has_more,
            next: tree.has_more.then_some(tree.next),
        })
    }
}

/// The `{id}` and `{path}` of a file route.
#[derive(Debug, Deserialize)]
pub struct FilePath {
    id: String,
    path: String,
}

fn file_path(
    request_path: Result<Path<FilePath>, axum::extract::rejection::PathRejection>,
) -> Result<FilePath, ApiError> {
    match request_path {
        Ok(Path(path)) => Ok(path),
        Err(_) => Err(PlinthError::invalid("path: not valid UTF-8 after percent-decoding").into()),
    }
}

/// One file's bytes exactly as stored, with a content type guessed from its name. Reads are
/// conditional and ranged (see `conditional`): `ETag` is the content digest in quotes. A
/// symlink, or a path through one, is refused: UHP §3 serves regular files alone here.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/files/{*path}",
    tag = "files",
    params(
        ("id" = String, Path, description = "The environment's id"),
        ("path" = String, Path, description = "The file, relative to the root"),
        ("If-None-Match" = Option<String>, Header, description = "Entity tags (or `*`) the caller holds: 304 when one is the file's (weak comparison)"),
        ("If-Match" = Option<String>, Header, description = "Entity tags (or `*`): 412 precondition_failed unless one is the file's (strong comparison)"),
        ("Range" = Option<String>, Header, description = "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n` (206); several ranges are answered with the whole file (200)"),
        ("If-Range" = Option<String>, Header, description = "An entity tag: the range is answered only while it is the file's; otherwise the whole file (200)"),
    ),
    responses(
        (status = 200, description = "The file's bytes, never to be sniffed (`X-Content-Type-Options: nosniff`); HTML, SVG, JavaScript, XHTML and XML come as `Content-Disposition: attachment`", content_type = "application/octet-stream", body = Vec<u8>,
            headers(("ETag" = String, description = "The content digest in quotes, `\"sha256:<hex>\"`: a strong validator"), ("Accept-Ranges" = String, description = "`bytes`"))),
        (status = 206, description = "The one range asked for", content_type = "application/octet-stream", body = Vec<u8>,
            headers(("Content-Range" = String, description = "`bytes <first>-<last>/<size>`"), ("ETag" = String, description = "The file's entity tag"))),
        (status = 304, description = "Not modified: If-None-Match named the file's tag; no body",
            headers(("ETag" = String, description = "The file's entity tag"))),
        (status = 409, description = "conflict: the path is a directory (list it with GET …/files)", body = ErrorBody),
        (status = 400, description = "environment_invalid: a path that escapes the root, or is or goes through a symlink (links are kept in builds and sessions but not served by the files API); an If-Match or If-None-Match that is not a list of quoted entity tags", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or file", body = ErrorBody),
        (status = 412, description = "precondition_failed: If-Match names none of the file's tags (detail.etag is the current one)", body = ErrorBody,
            headers(("ETag" = String, description = "The file's entity tag"))),
        (status = 416, description = "range_not_satisfiable: the range starts at or past the end of the file", body = ErrorBody,
            headers(("Content-Range" = String, description = "`bytes */<size>`"))),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn read_file(
    State(state): State<Services>,
    caller: Caller,
    request_path: Result<Path<FilePath>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let FilePath { id, path } = file_path(request_path)?;
    check_environment(&state, &caller, &id).await?;
    let mut stream = state
        .source()
        .read_file(pb::ReadFileRequest {
            environment_id: id,
            path: path.clone(),
        })
        .await?
        .into_inner();
    let first = stream.message().await?.ok_or_else(|| {
        PlinthError::new(
            plinth_kit::ErrorCode::Internal,
            "the source answered nothing",
        )
    })?;
    let entry = first.entry.unwrap_or_default();
    let etag = conditional::etag(&entry.digest);
    // Answers that carry no bytes end here, and dropping the stream cancels the read.
    let range = match conditional::weigh_read(&headers, &etag, entry.size) {
        Err(error) => return Ok(conditional::precondition_failed_response(error.into())),
        Ok(ReadAnswer::NotModified) => return Ok(conditional::not_modified(&etag)),
        Ok(ReadAnswer::Unsatisfiable) => return Ok(conditional::unsatisfiable(entry.size)),
        Ok(ReadAnswer::Full) => None,
        Ok(ReadAnswer::Partial(range)) => Some(range),
    };
    let content_type = mime_guess::from_path(&path)
        .first_raw()
        .unwrap_or("application/octet-stream");
    let first_chunk = first.chunk;
    // The stream is read through its status once the file's last byte has come, so the read
    // ends `OK` (a client that leaves earlier cancels it).
    let mut left = entry.size.saturating_sub(first_chunk.len() as u64);
    if left == 0 {
        plinth_kit::streams::finish(&mut stream).await;
    }
    let rest = plinth_kit::streams::through_end(stream, move |message| {
        left = left.saturating_sub(message.chunk.len() as u64);
        left == 0
    })
    .map(|message| match message {
        Ok(message) => Ok(message.chunk),
        Err(status) => Err(std::io::Error::other(status.message().to_owned())),
    });
    let body =
        futures::stream::once(async move { Ok::<_, std::io::Error>(first_chunk) }).chain(rest);
    let mut response = match range {
        None => Body::from_stream(body).into_response(),
        Some(range) => Body::from_stream(conditional::slice(body, range)).into_response(),
    };
    conditional::mark_answer(&mut response, &etag, entry.size, range);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    crate::http::downloads::mark(headers, &path);
    Ok(response)
}

/// Writes one file: the body is its bytes. Parent directories are made. `If-Match` and
/// `If-None-Match` make the write conditional; the source checks them in the transaction
/// that writes, so a write between the caller's read and this one is never overwritten.
#[utoipa::path(
    put,
    path = "/v1/environments/{id}/files/{*path}",
    tag = "files",
    params(
        ("id" = String, Path, description = "The environment's id"),
        ("path" = String, Path, description = "The file, relative to the root"),
        WriteQuery,
        ("If-Match" = Option<String>, Header, description = "The file's ETag as read (or a list, or `*` for any existing file): written only if the file is still that one; 412 precondition_failed otherwise, or when there is no file"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: create only, 412 precondition_failed when a file is there; or entity tags the file must not have"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's bytes, stored exactly"),
    responses(
        (status = 200, description = "Written", body = FileEntry,
            headers(("ETag" = String, description = "The new content's entity tag, `\"sha256:<hex>\"`"))),
        (status = 409, description = "conflict: a directory is at the path, or a file where one of its directories would be; nothing was written", body = ErrorBody),
        (status = 400, description = "environment_invalid: a path that escapes the root, or a path that is or goes through a symlink; an If-Match or If-None-Match that is not a list of quoted entity tags", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 412, description = "precondition_failed: the file changed since it was read (If-Match), or exists (If-None-Match: *); nothing was written; detail.etag (and the ETag header) is the file's current tag, null when there is none", body = ErrorBody,
            headers(("ETag" = String, description = "The file's current entity tag, when there is a file"))),
        (status = 413, description = "file_too_large: detail.max_bytes states the limit; nothing was stored", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the file would take the scope past its stored-bytes quota (detail: quota, limit, used); nothing was stored. Also rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn write_file(
    State(state): State<Services>,
    caller: Caller,
    request_path: Result<Path<FilePath>, axum::extract::rejection::PathRejection>,
    query: Result<Query<WriteQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let FilePath { id, path } = file_path(request_path)?;
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let precondition = conditional::write_precondition(request.headers())?;
    check_environment(&state, &caller, &id).await?;
    let header = pb::WriteFileRequest {
        message: Some(pb::write_file_request::Message::Header(
            pb::WriteFileHeader {
                environment_id: id,
                path,
                executable: query.executable,
                scope: caller.scope.clone(),
                precondition,
            },
        )),
    };
    let mut source = state.source();
    let written = stream_to_source(
        header,
        request.into_body(),
        |bytes| pb::WriteFileRequest {
            message: Some(pb::write_file_request::Message::Chunk(bytes)),
        },
        |messages| source.write_file(messages),
    )
    .await;
    let entry = match written {
        Ok(entry) => entry,
        Err(error) => return Ok(conditional::precondition_failed_response(error)),
    };
    let etag = HeaderValue::from_str(&conditional::etag(&entry.digest)).ok();
    let mut response = Json(FileEntry::try_from(entry)?).into_response();
    if let Some(etag) = etag {
        response.headers_mut().insert(header::ETAG, etag);
    }
    Ok(response)
}

/// Removes a file, or a directory and everything beneath it; a symlink's path removes the
/// link (never what it points at).
#[utoipa::path(
    delete,
    path = "/v1/environments/{id}/files/{*path}",
    tag = "files",
    params(("id" = String, Path, description = "The environment's id"), ("path" = String, Path, description = "A file or directory, relative to the root")),
    responses(
        (status = 200, description = "Removed", body = DeletedPath),
        (status = 400, description = "environment_invalid: a path that escapes the root, or goes through a symlink", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or path", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_path(
    State(state): State<Services>,
    caller: Caller,
    request_path: Result<Path<FilePath>, axum::extract::rejection::PathRejection>,
) -> Result<Json<DeletedPath>, ApiError> {
    let FilePath { id, path } = file_path(request_path)?;
    check_environment(&state, &caller, &id).await?;
    let removed = state
        .source()
        .delete(pb::DeleteRequest {
            environment_id: id,
            path: path.clone(),
            scope: caller.scope.clone(),
        })
        .await?
        .into_inner();
    Ok(Json(DeletedPath {
        path,
        deleted: true,
        files: removed.files,
        directories: removed.directories,
    }))
}

/// Makes an empty directory, with its parents.
#[utoipa::path(
    post,
    path = "/v1/environments/{id}/directories",
    tag = "files",
    params(("id" = String, Path, description = "The environment's id")),
    request_body = MakeDirectory,
    responses(
        (status = 201, description = "Made (or already there)", body = FileEntry),
        (status = 400, description = "environment_invalid: a path that escapes the root, or is or goes through a symlink", body = ErrorBody),
        (status = 409, description = "conflict: a file is at the path or at one of its parents; nothing was made", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn make_directory(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    JsonBody(body): JsonBody<MakeDirectory>,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    check_environment(&state, &caller, &id).await?;
    let entry = state
        .source()
        .make_directory(pb::MakeDirectoryRequest {
            environment_id: id,
            path: body.path,
            scope: caller.scope.clone(),
        })
        .await?
        .into_inner();
    Ok((StatusCode::CREATED, Json(FileEntry::try_from(entry)?)))
}

/// Imports a whole project: a zip or tar (plain, gzip, zstd, bzip2, xz; recognised by its
/// bytes) as the body, or, with `Content-Type: application/json`, a git repository. An
/// archive of a git checkout may name where it came from (`commit`, `describe`, `ref`,
/// `dirty`, `commits`), which builds then use as they use a git import's origin.
#[utoipa::path(
    post,
    path = "/v1/environments/{id}/import",
    tag = "files",
    params(("id" = String, Path, description = "The environment's id"), ImportQuery),
    request_body(content = GitImport, description = "An archive (any content type but application/json), or this JSON naming a git repository"),
    responses(
        (status = 200, description = "What landed", body = ImportReport),
        (status = 400, description = "environment_invalid: not an archive (a body that starts with `{` says to send `Content-Type: application/json`), an ambiguous archive (duplicate names, zip records that disagree, a member beneath a symlink), too many entries, a git URL that is not allowed or whose host is not public, a git ref the repository does not have or a URL that is no repository, a git server that redirected (give the final URL), a short commit id that matches no single commit (give the full 40-character id), a checkout's origin in the query that lacks commit or describe, names a commit that is not a full id, or comes with a JSON body", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 409, description = "conflict: without replace, the archive or repository has a file where the source has a directory, or the reverse; nothing was imported", body = ErrorBody),
        (status = 413, description = "file_too_large: the archive, its contents, one member or a git fetch (source.git_max_fetch_bytes) passed a limit (detail.max_bytes); nothing was imported", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the import would take the scope past its stored-bytes quota (detail: quota, limit, used); nothing was imported. Also rate_limited, with Retry-After", body = ErrorBody),
        (status = 502, description = "remote_unreachable: the git repository's server could not be reached (its host does not resolve, it refused or dropped the connection, TLS failed, or it answered a 5xx); nothing was imported, and a retry after Retry-After seconds may pass", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 504, description = "remote_timeout: the git repository's server did not finish answering within source.git_fetch_timeout_seconds (detail.timeout_seconds); the fetch was stopped and nothing was imported; retry after Retry-After seconds, or import an archive", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
    security(("bearer" = []))
)]
async fn import(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    query: Result<Query<ImportQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Result<Json<ImportReport>, ApiError> {
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let is_json = json::is_json(request.headers());
    check_environment(&state, &caller, &id).await?;
    let mut source = state.source();
    let report = if is_json {
        if query.origin()?.is_some() {
            return Err(PlinthError::invalid(
                "query: a git import finds its commit itself; commit and describe go with an archive",
            )
            .into());
        }
        let bytes = json::read(request.into_body()).await?;
        let body: GitImport = json::parse(&bytes)?;
        let header = pb::ImportRequest {
            message: Some(pb::import_request::Message::Header(pb::ImportHeader {
                environment_id: id,
                replace: body.replace || query.replace.unwrap_or(false),
                git: Some(pb::GitSource {
                    url: body.git.url,
                    r#ref: body.git.reference.unwrap_or_default(),
                }),
                scope: caller.scope.clone(),
                origin: None,
            })),
        };
        source
            .import(futures::stream::iter([header]))
            .await?
            .into_inner()
    } else {
        let header = pb::ImportRequest {
            message: Some(pb::import_request::Message::Header(pb::ImportHeader {
                environment_id: id,
                replace: query.replace.unwrap_or(false),
                git: None,
                scope: caller.scope.clone(),
                origin: query.origin()?,
            })),
        };
        stream_to_source(
            header,
            request.into_body(),
            |bytes| pb::ImportRequest {
                message: Some(pb::import_request::Message::Chunk(bytes)),
            },
            |messages| source.import(messages),
        )
        .await?
    };
    let origin = report.origin;
    // A git import's origin is never dirty: only a pushed checkout's says whether it was.
    let pushed = origin.is_some() && !is_json;
    Ok(Json(ImportReport {
        files: report.files,
        directories: report.directories,
        bytes: report.bytes,
        skipped: report.skipped,
        skipped_by_reason: report.skipped_by_reason.into_iter().collect(),
        stripped_wrapper: report.stripped_wrapper,
        symlinks: report.symlinks,
        commit: origin.as_ref().map(|origin| origin.commit.clone()),
        reference: origin.as_ref().map(|origin| origin.r#ref.clone()),
        dirty: origin
            .as_ref()
            .filter(|_| pushed)
            .map(|origin| origin.dirty),
        describe: origin.map(|origin| origin.describe),
        warnings: report.warnings,
    }))
}
