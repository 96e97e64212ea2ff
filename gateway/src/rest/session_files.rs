//! A session's working-directory files (UHP §6): read, write and delete under
//! `/v1/sessions/{id}/files/`, served by the session's node.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::conditional::ReadAnswer;
use crate::http::error::{ApiError, ErrorBody};
use crate::runtime::Runtime;
use crate::runtime::live::{active_session, record};
pub use crate::runtime::nodes::MAX_SESSION_FILE_BYTES;
use axum::extract::FromRef;

/// The routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Runtime: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(read_file, write_file, delete_file))
}

/// `{id}` and `{*path}`.
#[derive(Debug, Deserialize)]
pub struct SessionFilePath {
    id: String,
    path: String,
}

fn file_path(
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
) -> Result<SessionFilePath, ApiError> {
    path.map(|Path(path)| path)
        .map_err(|error| PlinthError::invalid(format!("path: {error}")).into())
}

/// Read a file of the session's working directory. Reads are conditional and ranged like an
/// environment file's (see `conditional`). The node answers a working-directory file whole
/// (it is at most 64 MiB), so its `ETag` is the SHA-256 of the bytes answered: a strong
/// validator that costs one pass over bytes already in memory, where size and modification
/// time would miss a same-size write within the file system's time granularity.
#[utoipa::path(
    get,
    operation_id = "read_session_file",
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to the working directory"),
        ("If-None-Match" = Option<String>, Header, description = "Entity tags (or `*`) the caller holds: 304 when one is the file's (weak comparison)"),
        ("If-Match" = Option<String>, Header, description = "Entity tags (or `*`): 412 precondition_failed unless one is the file's (strong comparison)"),
        ("Range" = Option<String>, Header, description = "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n` (206); several ranges are answered with the whole file (200)"),
        ("If-Range" = Option<String>, Header, description = "An entity tag: the range is answered only while it is the file's; otherwise the whole file (200)"),
    ),
    responses(
        (status = 200, description = "The file's bytes, never to be sniffed (`X-Content-Type-Options: nosniff`); HTML, SVG, JavaScript, XHTML and XML come as `Content-Disposition: attachment`", content_type = "application/octet-stream",
            headers(("ETag" = String, description = "`\"sha256:<hex>\"` of the bytes: a strong validator"), ("Accept-Ranges" = String, description = "`bytes`"))),
        (status = 206, description = "The one range asked for", content_type = "application/octet-stream",
            headers(("Content-Range" = String, description = "`bytes <first>-<last>/<size>`"), ("ETag" = String, description = "The file's entity tag"))),
        (status = 304, description = "Not modified: If-None-Match named the file's tag; no body",
            headers(("ETag" = String, description = "The file's entity tag"))),
        (status = 400, description = "environment_invalid: a bad path, or a directory; an If-Match or If-None-Match that is not a list of quoted entity tags", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 412, description = "precondition_failed: If-Match names none of the file's tags (detail.etag is the current one)", body = ErrorBody),
        (status = 413, description = "file_too_large", body = ErrorBody),
        (status = 416, description = "range_not_satisfiable: the range starts at or past the end of the file", body = ErrorBody,
            headers(("Content-Range" = String, description = "`bytes */<size>`"))),
    ),
    security(("bearer" = []))
)]
async fn read_file(
    State(state): State<Runtime>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    let content = state
        .nodes
        .client(&session.node_address)?
        .read_file(node::ReadFileRequest {
            session_id: session.id.clone(),
            path: path.path.clone(),
        })
        .await?
        .into_inner()
        .content;
    record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::ReadFile,
        &path.path,
        None,
    )
    .await?;
    let size = content.len() as u64;
    let etag = crate::http::conditional::content_etag(&content);
    let range = match crate::http::conditional::weigh_read(&headers, &etag, size) {
        Err(error) => {
            return Ok(crate::http::conditional::precondition_failed_response(
                error.into(),
            ));
        }
        Ok(ReadAnswer::NotModified) => return Ok(crate::http::conditional::not_modified(&etag)),
        Ok(ReadAnswer::Unsatisfiable) => return Ok(crate::http::conditional::unsatisfiable(size)),
        Ok(ReadAnswer::Full) => None,
        Ok(ReadAnswer::Partial(range)) => Some(range),
    };
    let body = match range {
        None => content,
        // Within the file: `weigh_read` bounds a range by its size, a usize here.
        Some(range) => content.slice(range.start as usize..=range.end as usize),
    };
    let mime = mime_guess::from_path(&path.path).first_or_octet_stream();
    let mut response = (
        [(header::CONTENT_TYPE, mime.essence_str().to_owned())],
        body,
    )
        .into_response();
    crate::http::conditional::mark_answer(&mut response, &etag, size, range);
    crate::http::downloads::mark(response.headers_mut(), &path.path);
    Ok(response)
}

/// Write a file of the session's working directory (parents made).
#[utoipa::path(
    put,
    operation_id = "write_session_file",
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Path, description = "Relative to the working directory")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written: {path, size, version}"),
        (status = 400, description = "environment_invalid: a bad path, or a file in the way", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "file_too_large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn write_file(
    State(state): State<Runtime>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    let content = axum::body::to_bytes(body, MAX_SESSION_FILE_BYTES)
        .await
        .map_err(|_| {
            PlinthError::new(
                ErrorCode::FileTooLarge,
                format!("the file is larger than {MAX_SESSION_FILE_BYTES} bytes, or was not received whole"),
            )
            .with_detail(serde_json::json!({ "max_bytes": MAX_SESSION_FILE_BYTES }))
        })?;
    let bytes = content.len();
    let written = state
        .nodes
        .client(&session.node_address)?
        .write_file(state.nodes.carrying(
            node::WriteFileRequest {
                session_id: session.id.clone(),
                path: path.path.clone(),
                content,
            },
            bytes,
        ))
        .await?
        .into_inner();
    let turn = record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::WriteFile,
        &path.path,
        None,
    )
    .await?;
    Ok(Json(serde_json::json!({
        "path": path.path,
        "size": written.size,
        "version": turn.version,
    })))
}

/// Delete a file or directory of the session's working directory.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Path, description = "Relative to the working directory")),
    responses(
        (status = 200, description = "Deleted: {path, deleted, version}"),
        (status = 400, description = "environment_invalid: a bad path", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_file(
    State(state): State<Runtime>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    state
        .nodes
        .client(&session.node_address)?
        .delete_file(node::DeleteFileRequest {
            session_id: session.id.clone(),
            path: path.path.clone(),
        })
        .await?;
    let turn = record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::DeleteFile,
        &path.path,
        None,
    )
    .await?;
    Ok(Json(serde_json::json!({
        "path": path.path,
        "deleted": true,
        "version": turn.version,
    })))
}
